"""Programmatic reward for tau2-Telecom, as tau2-bench defines it for this domain.

reward = prod over the task's ``reward_basis`` of its component, each 0 or 1:

* ENV_ASSERTION: every env assertion of the task holds on the final state;
* ACTION: every expected action appears among the episode's tool calls, as
  tau2-bench matches them: by name, whoever made the call and whether or not it
  failed, with equal values for the compared arguments (``compare_args`` None: the
  arguments the call passed; ``[]``: the name only).

The reward is 0 when the episode did not end by an agent stop, a user stop or a
transfer (e.g. it hit the turn limit). ``tests/test_tau2_parity.py`` checks these
rewards against tau2-bench's own evaluator.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.state import TelecomState
from rti_jax.envs.telecom.tasks import Action, EnvAssertion, TelecomTask

#: episode endings that are scored; anything else (the turn limit) scores 0
SCORED_TERMINATIONS = ("agent_stop", "user_stop", "transfer")


@dataclasses.dataclass(frozen=True)
class ToolCallRecord:
  """One tool call made during an episode, by "assistant" or "user"."""

  requestor: str
  name: str
  arguments: dict[str, Any]
  ok: bool
  output: str = ""


def assert_service_status(state: TelecomState, expected_status: str) -> bool:
  return state.phone.network_connection_status == expected_status


def assert_mobile_data_status(state: TelecomState, expected_status: bool) -> bool:
  return st.mobile_data_working(state) == expected_status


def assert_internet_speed(state: TelecomState, expected_speed: float, expected_desc: str | None = None) -> bool:
  """The speed test reaches ``expected_speed`` Mbit/s (no connection: 0) and, when given,
  carries the label ``expected_desc`` (any case)."""
  mbps, label = dt.internet_speed(state)
  fast = (mbps or 0.0) >= expected_speed
  return fast if expected_desc is None else fast and label == expected_desc.lower()


def assert_internet_not_excellent(state: TelecomState) -> bool:
  return dt.internet_speed(state)[1] != "excellent"


def assert_airplane_mode_status(state: TelecomState, expected_status: bool) -> bool:
  return state.phone.airplane_mode == expected_status


def assert_mobile_roaming_status(state: TelecomState, expected_status: bool) -> bool:
  return state.phone.roaming_enabled == expected_status


def assert_mobile_data_saver_mode_status(state: TelecomState, expected_status: bool) -> bool:
  return state.phone.data_saver_mode == expected_status


def assert_mobile_data_usage_exceeded(state: TelecomState, expected_status: bool) -> bool:
  return state.surroundings.data_exhausted == expected_status


def assert_can_send_mms(state: TelecomState, expected_status: bool) -> bool:
  return dt.can_send_mms_now(state) == expected_status


def assert_data_refueling_amount(state: TelecomState, customer_id: str, line_id: str,
                                 expected_amount: float) -> bool:
  line = st.find_record(state.db, "lines", "line_id", line_id)
  customer = st.find_record(state.db, "customers", "customer_id", customer_id)
  if line is None or customer is None or line_id not in customer["line_ids"]:
    return False
  return abs(line["data_refueling_gb"] - expected_amount) < 1e-6


def assert_no_overdue_bill(state: TelecomState, overdue_bill_id: str) -> bool:
  """True when bill ``overdue_bill_id`` does not exist or is Paid (a payment request alone,
  Awaiting Payment, does not pay it)."""
  bill = st.find_record(state.db, "bills", "bill_id", overdue_bill_id)
  return bill is None or bill["status"] == "Paid"


def assert_line_status(state: TelecomState, customer_id: str, line_id: str, expected_status: str) -> bool:
  line = st.find_record(state.db, "lines", "line_id", line_id)
  customer = st.find_record(state.db, "customers", "customer_id", customer_id)
  if line is None or customer is None or line_id not in customer["line_ids"]:
    return False
  return line["status"] == expected_status


ASSERTIONS: dict[tuple[str, str], Callable[..., bool]] = {
    ("user", "assert_service_status"): assert_service_status,
    ("user", "assert_mobile_data_status"): assert_mobile_data_status,
    ("user", "assert_internet_speed"): assert_internet_speed,
    ("user", "assert_can_send_mms"): assert_can_send_mms,
    ("user", "assert_internet_not_excellent"): assert_internet_not_excellent,
    ("user", "assert_airplane_mode_status"): assert_airplane_mode_status,
    ("user", "assert_mobile_roaming_status"): assert_mobile_roaming_status,
    ("user", "assert_mobile_data_saver_mode_status"): assert_mobile_data_saver_mode_status,
    ("user", "assert_mobile_data_usage_exceeded"): assert_mobile_data_usage_exceeded,
    ("assistant", "assert_line_status"): assert_line_status,
    ("assistant", "assert_data_refueling_amount"): assert_data_refueling_amount,
    ("assistant", "assert_no_overdue_bill"): assert_no_overdue_bill,
}


def check_assertion(state: TelecomState, assertion: EnvAssertion) -> bool:
  fn = ASSERTIONS.get((assertion.env_type, assertion.func_name))
  if fn is None:
    raise ValueError(f"env assertion {assertion.env_type}:{assertion.func_name} is unknown; "
                     f"expected one of {sorted(n for _, n in ASSERTIONS)}")
  return fn(state, **assertion.arguments) == assertion.assert_value


def action_matches(expected: Action, call: ToolCallRecord) -> bool:
  """tau2-bench's rule: the same name (any requestor, failed calls included) and, over the
  compared keys (``compare_args``, or the keys the call passed when None), equal values;
  a key present on one side only makes them differ."""
  if call.name != expected.name:
    return False
  keys = call.arguments.keys() if expected.compare_args is None else expected.compare_args
  got = {k: v for k, v in call.arguments.items() if k in keys}
  want = {k: v for k, v in expected.arguments.items() if k in keys}
  return got == want


@dataclasses.dataclass(frozen=True)
class RewardInfo:
  reward: float
  assertions: tuple[tuple[str, bool], ...]
  actions: tuple[tuple[str, bool], ...]
  termination: str

  def to_dict(self) -> dict[str, Any]:
    return {"reward": self.reward, "termination": self.termination,
            "assertions": [list(a) for a in self.assertions], "actions": [list(a) for a in self.actions]}


def evaluate(task: TelecomTask, state: TelecomState, calls: list[ToolCallRecord],
             termination: str) -> RewardInfo:
  """The episode's reward and the per-check results behind it."""
  assertion_results = tuple((f"{a.func_name}({_fmt(a.arguments)})", check_assertion(state, a))
                            for a in task.env_assertions)
  action_results = tuple((f"{a.requestor}:{a.name}", any(action_matches(a, c) for c in calls))
                         for a in task.actions)
  reward = 1.0
  if "ENV_ASSERTION" in task.reward_basis:
    reward *= float(all(ok for _, ok in assertion_results))
  if "ACTION" in task.reward_basis:
    reward *= float(all(ok for _, ok in action_results))
  if termination not in SCORED_TERMINATIONS:
    reward = 0.0
  return RewardInfo(reward=reward, assertions=assertion_results, actions=action_results,
                    termination=termination)


def _fmt(args: dict[str, Any]) -> str:
  return ", ".join(f"{k}={v!r}" for k, v in args.items())
