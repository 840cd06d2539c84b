"""Programmatic reward for tau2-Telecom, as tau2-bench defines it for this domain.

reward = prod over the task's ``reward_basis`` of its component, each 0 or 1:

* ENV_ASSERTION: every env assertion of the task holds on the final state;
* ACTION: every expected action appears among the episode's successful tool calls
  by the same requestor with the same name and the compared arguments
  (``compare_args`` None: all arguments; ``[]``: the name only).

The reward is 0 when the episode did not end by an agent stop, a user stop or a
transfer (e.g. it hit the turn limit).
"""

from __future__ import annotations

import dataclasses
import math
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


def assert_internet_speed(state: TelecomState, expected_speed: float, expected_desc: str) -> bool:
  """The speed test reaches ``expected_speed`` Mbit/s and carries the label ``expected_desc``."""
  mbps, label = dt.internet_speed(state)
  return mbps is not None and mbps >= expected_speed and label == expected_desc


def assert_can_send_mms(state: TelecomState, expected_status: bool) -> bool:
  return dt.can_send_mms_now(state) == expected_status


def assert_data_refueling_amount(state: TelecomState, customer_id: str, line_id: str,
                                 expected_amount: float) -> bool:
  line = st.find_record(state.db, "lines", "line_id", line_id)
  customer = st.find_record(state.db, "customers", "customer_id", customer_id)
  if line is None or customer is None or line_id not in customer["line_ids"]:
    return False
  return math.isclose(float(line["data_refueling_gb"]), float(expected_amount), abs_tol=1e-6)


#: bill statuses of a past-due bill that is still unpaid (a payment request alone does not pay it)
UNPAID_PAST_DUE = ("Overdue", "Awaiting Payment")


def assert_no_overdue_bill(state: TelecomState, overdue_bill_id: str) -> bool:
  """True unless bill ``overdue_bill_id`` exists and is still unpaid (Overdue, or
  Awaiting Payment after a payment request the user has not paid)."""
  bill = st.find_record(state.db, "bills", "bill_id", overdue_bill_id)
  return bill is None or bill["status"] not in UNPAID_PAST_DUE


ASSERTIONS: dict[tuple[str, str], Callable[..., bool]] = {
    ("user", "assert_service_status"): assert_service_status,
    ("user", "assert_mobile_data_status"): assert_mobile_data_status,
    ("user", "assert_internet_speed"): assert_internet_speed,
    ("user", "assert_can_send_mms"): assert_can_send_mms,
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
  if not call.ok or call.requestor != expected.requestor or call.name != expected.name:
    return False
  keys = expected.arguments.keys() if expected.compare_args is None else expected.compare_args
  return all(_same(call.arguments.get(k), expected.arguments.get(k)) for k in keys)


def _same(a: Any, b: Any) -> bool:
  if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
    return math.isclose(float(a), float(b), abs_tol=1e-6)
  return a == b


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
