"""Reading a tau2-Telecom conversation for the rule-based Validator and Verifier.

Comparable argument values, what the user and the tools have shown so far, the agent's and
the user's tool runs, the reward-side actions and whether each is done, the device actions a
message asks the user for, and the claims a reply makes that the history does not back.

How "done" is read from the history: an agent action is done when an assistant call with
that name and those arguments (free text such as a transfer summary aside) got a non-error
tool response; a user action is done when a user message reports running that device tool
(``I ran <tool>: <output>``, the scripted user's format) with an output that mentions each of
its argument values.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Sequence

from rti_jax.envs.tool_calls import ToolCall, parse_assistant_turn
from rti_jax.intervention.judges import StepContext
from rti_jax.intervention.rules_navigation import past_calls

AGENT_STOP = "###STOP###"
TRANSFER_TOOL = "transfer_to_human_agents"
#: agent tools that change the account (everything else is a lookup)
AGENT_WRITE_TOOLS = frozenset({"enable_roaming", "disable_roaming", "refuel_data", "change_plan", "suspend_line",
                               "resume_line", "send_payment_request", TRANSFER_TOOL})
#: free-text arguments (not values to be found in the history)
FREE_TEXT_ARGS = frozenset({"summary", "reason"})

ID_RE = re.compile(r"\b[A-Z]{1,3}\d{3,}\b")
PHONE_RE = re.compile(r"(?<!\d)(?<!\d\.)(?:\+?1[\s.-]?)?\(?\d{3}\)?[\s.-]?\d{3}[\s.-]?\d{4}(?!\d|\.\d)")
FIGURE_RE = re.compile(
  r"(?:\$\s?\d[\d,]*(?:\.\d+)?)|(?<![\w.])\d+(?:\.\d+)?\s?(?:(?:GB|MB|KB|gigabytes?|megabytes?|Mbps|dollars?|USD)\b|Mbit/s|%)"
  r"|(?<![\w.-])\d+\.\d+(?![\w.])|\b\d{4}-\d{2}-\d{2}\b",
  re.IGNORECASE,
)
_NUMBER_RE = re.compile(r"\d[\d,]*(?:\.\d+)?")
#: the head of a user's report ``I ran <tool>: <output>`` (``user_reports`` reads the outputs)
USER_RAN_HEAD_RE = re.compile(r"\bI ran (\w+):")
_USER_RAN_RE = re.compile(r"\bI ran (\w+):\s*")
_SENTENCE_RE = re.compile(r"(?:[^.!?\n]|\.(?=\d))+[.!?]*")
_USAGE_RE = re.compile(r"\b(?:used|usage|consumed|remaining|left|limit|allowance)\b", re.IGNORECASE)
_SELF = r"\b(?:i|we)(?:'ve|’ve| have| just| already| successfully)*\s+"
_RETRIEVAL_RE = re.compile(
  _SELF + r"(?:checked|looked up|looked into|reviewed|verified|confirmed|pulled up|found|located|accessed)\b"
  r"[^.!?]{0,60}\b(account|line|plan|bill|billing|usage|records?|roaming|details|profile|status)\b",
  re.IGNORECASE,
)
#: (claim pattern, agent tools any of which must have succeeded)
_ACTION_CLAIMS: tuple[tuple[re.Pattern[str], frozenset[str]], ...] = tuple(
  (re.compile(_SELF + pattern, re.IGNORECASE), frozenset(tools)) for pattern, tools in (
    (r"(?:enabled|activated|turned on|switched on)\b[^.!?]{0,30}roaming", ("enable_roaming",)),
    (r"(?:disabled|deactivated|turned off)\b[^.!?]{0,30}roaming", ("disable_roaming",)),
    (r"(?:refuel\w*|added|topped up|credited)\b[^.!?]{0,30}(?:data|gb)", ("refuel_data",)),
    (r"(?:resumed|reactivated|restored|unsuspended)\b[^.!?]{0,30}line", ("resume_line",)),
    (r"suspended\b[^.!?]{0,30}line", ("suspend_line",)),
    (r"(?:sent|issued|created)\b[^.!?]{0,30}payment request", ("send_payment_request",)),
    (r"(?:changed|switched|upgraded|moved)\b[^.!?]{0,30}plan", ("change_plan",)),
    (r"transferred\b", (TRANSFER_TOOL,)),
  ))
_LOOKUPS_FOR = {"bill": ("get_bills_for_customer", "get_details_by_id"), "billing": ("get_bills_for_customer",
                "get_details_by_id"), "usage": ("get_data_usage", "get_details_by_id")}


def as_float(value: int | float) -> float:
  """``float(value)``, with an int too large for a float (a 400-digit JSON integer) as +-inf
  instead of an ``OverflowError``."""
  try:
    return float(value)
  except OverflowError:
    return math.inf if value > 0 else -math.inf


def user_reports(text: str) -> list[tuple[str, str]]:
  """``(tool, output)`` of each ``I ran <tool>: <output>`` in ``text``; an output runs to the next
  report (the spaces before it excluded) or to the end.

  The matches of ``\\bI ran (\\w+):\\s*(.*?)(?=\\s*\\bI ran \\w+:|$)`` (DOTALL, ``finditer``) in
  one pass; that regex rescans a run of spaces from each of its characters (quadratic time).
  """
  out = []
  n = len(text)
  last_end = n - 1 if text.endswith("\n") else n  # "$" also matches before a final newline
  m = _USER_RAN_RE.search(text)
  while m is not None:
    body = m.end()
    end = last_end if body <= last_end else n
    nxt = USER_RAN_HEAD_RE.search(text, body)
    if nxt is not None:
      at = nxt.start()
      while at > body and text[at - 1].isspace():
        at -= 1
      end = min(end, at)
    out.append((m.group(1), text[body:end]))
    m = _USER_RAN_RE.search(text, end)
  return out


def norm_value(value: Any) -> str:
  """A comparable form of an argument value: numbers as floats, phone numbers as digits,
  strings lower-cased and stripped."""
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, (int, float)):
    return repr(as_float(value))
  s = str(value).strip().lower()
  if PHONE_RE.fullmatch(s):
    return re.sub(r"\D", "", s)[-10:]
  try:
    return repr(float(s))
  except ValueError:
    return s


def call_key(name: str, arguments: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
  """``(name, sorted normalised arguments)``: equal for the same call written differently."""
  return name, tuple(sorted((k, norm_value(v)) for k, v in arguments.items()))


def conversation_text(ctx: StepContext) -> str:
  """What the user and the tools have shown so far (the user query and every user / tool
  message); the assistant's own words are not evidence."""
  parts = [ctx.user_query] + [str(m.get("content", "")) for m in ctx.history if m.get("role") != "assistant"]
  return "\n".join(parts)


def numbers_in(text: str) -> set[float]:
  """Every number written in ``text`` (``1,200.50`` -> 1200.5)."""
  out = set()
  for m in _NUMBER_RE.finditer(text):
    try:
      out.add(float(m.group(0).replace(",", "")))
    except ValueError:
      continue
  return out


def phones_in(text: str) -> set[str]:
  """Every phone number in ``text`` as its last 10 digits."""
  return {re.sub(r"\D", "", m.group(0))[-10:] for m in PHONE_RE.finditer(text)}


@dataclasses.dataclass(frozen=True)
class UserRun:
  """A device tool the user reports having run, with its reported output."""

  name: str
  output: str


def user_runs(history: Sequence[dict[str, Any]]) -> list[tuple[int, UserRun]]:
  """``(message index, run)`` for every ``I ran <tool>: <output>`` in the user messages."""
  out = []
  for i, m in enumerate(history):
    if m.get("role") == "user":
      for name, output in user_reports(str(m.get("content", ""))):
        out.append((i, UserRun(name, output)))
  return out


@dataclasses.dataclass(frozen=True)
class AgentRun:
  """An agent tool call of the history, its response, and where the call was made."""

  index: int
  call: ToolCall
  result: str

  @property
  def ok(self) -> bool:
    return bool(self.result) and not self.result.lstrip().lower().startswith("error")


def agent_runs(history: Sequence[dict[str, Any]]) -> list[AgentRun]:
  """Every assistant tool call of ``history`` with its tool response and message index."""
  at: list[int] = []
  for i, m in enumerate(history):
    if m.get("role") == "assistant":
      at.extend([i] * len(parse_assistant_turn(str(m.get("content", ""))).tool_calls))
  return [AgentRun(i, p.call, p.result) for i, p in zip(at, past_calls(history))]


@dataclasses.dataclass(frozen=True)
class Required:
  """A reward-side action: ``side`` "agent" or "user", its name and arguments."""

  side: str
  name: str
  arguments: dict[str, Any]


def required_actions(evidence: dict[str, Any]) -> list[Required]:
  """The task's gold actions from ``reward_evidence()`` (``agent_actions``, ``user_actions``)."""
  out = []
  for side, key in (("agent", "agent_actions"), ("user", "user_actions")):
    for a in evidence.get(key) or []:
      if isinstance(a, dict) and isinstance(a.get("name"), str):
        out.append(Required(side, a["name"], dict(a.get("arguments") or {})))
  return out


def is_done(action: Required, agents: Sequence[AgentRun], users: Sequence[tuple[int, UserRun]]) -> bool:
  """Whether ``action`` shows in the history (see the module docstring)."""
  if action.side == "agent":
    return any(r.ok and r.call.name == action.name and args_match(r.call.arguments, action.arguments) for r in agents)
  for _, run in users:
    if run.name == action.name and not run.output.lower().startswith("error"):
      if all(str(v).lower() in run.output.lower() for v in action.arguments.values()):
        return True
  return False


def user_side_tools(evidence: dict[str, Any]) -> frozenset[str]:
  from rti_jax.envs.telecom import device_tools as dt

  return frozenset(evidence.get("user_side_tools") or dt.DEVICE_TOOLS)


def device_write_tools() -> frozenset[str]:
  from rti_jax.envs.telecom import device_tools as dt

  return frozenset(n for n, t in dt.DEVICE_TOOLS.items() if t.writes)


@functools.lru_cache(maxsize=1)
def _default_phone() -> Any:
  from rti_jax.envs.telecom import state as st

  return st.fresh_state().phone


def device_requests(text: str) -> list[Any]:
  """Device actions ``text`` asks the user for, as the scripted user reads them
  (``user_sim.find_requests``: by tool name or in plain words, with a direction)."""
  from rti_jax.envs.telecom.user_sim import find_requests

  return find_requests(text, _default_phone())[0]


@functools.lru_cache(maxsize=1)
def default_policy_text() -> str:
  from rti_jax.envs.telecom.env import policy_text

  return policy_text()


def state_changed_since(index: int, agents: Sequence[AgentRun], users: Sequence[tuple[int, UserRun]]) -> bool:
  """Whether an account-changing call or a device write happened after message ``index``."""
  writes = device_write_tools()
  return (any(r.index > index and r.ok and r.call.name in AGENT_WRITE_TOOLS for r in agents)
          or any(i > index and u.name in writes for i, u in users))


def norm_text(text: str) -> str:
  return " ".join(text.lower().split())


def visible_value(value: Any, seen: str) -> bool:
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return as_float(value) in numbers_in(seen)
  s = str(value).strip()
  if PHONE_RE.fullmatch(s):
    return norm_value(s) in phones_in(seen)
  return bool(s) and s.lower() in seen.lower()


def args_match(got: dict[str, Any], want: dict[str, Any]) -> bool:
  """Equal on every argument the reward side fixes (free text excepted)."""
  return all(k in FREE_TEXT_ARGS or (k in got and norm_value(got[k]) == norm_value(v)) for k, v in want.items())


def claim_problems(content: str, seen: str, agents: Sequence[AgentRun]) -> list[tuple[str, str]]:
  """``(diagnosis, suggestion)`` for each claim in ``content`` that the history does not back:
  a lookup or an agent action that did not succeed, a backend id or a usage figure that no
  user or tool message shows."""
  ok_tools = {r.call.name for r in agents if r.ok}
  lookups = {n for n in ok_tools if n not in AGENT_WRITE_TOOLS}
  seen_numbers: set[float] | None = None  # read once, when a figure needs it
  out = []
  for sentence in _SENTENCE_RE.findall(content or ""):
    m = _RETRIEVAL_RE.search(sentence)
    if m:
      need = _LOOKUPS_FOR.get(m.group(1).lower())
      if not (lookups & set(need) if need else lookups):
        out.append((f"The reply says {m.group(0).strip()!r} but no lookup in the history backs it.",
                    "Only state what a tool result has shown; look the information up first."))
    for pattern, tools in _ACTION_CLAIMS:
      m = pattern.search(sentence)
      if m and not (ok_tools & tools):
        out.append((f"The reply says {m.group(0).strip()!r} but no successful {'/'.join(sorted(tools))} call was made.",
                    f"Call {sorted(tools)[0]} first (if the issue needs it) and only then report it."))
    if _USAGE_RE.search(sentence):
      seen_numbers = numbers_in(seen) if seen_numbers is None else seen_numbers
      figures = [f.group(0) for f in FIGURE_RE.finditer(sentence) if not figure_visible(f.group(0), seen_numbers)]
      if figures:
        out.append((f"The reply states {', '.join(figures)}, which no tool result has shown.",
                    "Check the line's data usage with get_data_usage before quoting figures."))
  low = seen.lower()
  ids = sorted({i for i in ID_RE.findall(content or "") if i.lower() not in low})
  if ids:
    out.append((f"The reply names {', '.join(ids)}, which no tool result has shown.",
                "Only refer to ids that a lookup has returned."))
  return out


_UNITS = {"gb": "gb", "gigabyte": "gb", "gigabytes": "gb", "mb": "mb", "megabyte": "mb", "megabytes": "mb", "kb": "kb",
          "mbps": "mbps", "mbit/s": "mbps", "%": "%", "dollar": "usd", "dollars": "usd", "usd": "usd"}


def figures_in(text: str) -> set[tuple[float, str]]:
  """``(number, unit)`` of every figure in ``text`` ("$4.00" -> (4.0, "usd"), "2GB" -> (2.0, "gb"));
  a bare decimal has unit ""."""
  out = set()
  for m in FIGURE_RE.finditer(text):
    fig = m.group(0).replace(",", "")
    num = _NUMBER_RE.search(fig)
    if num is None or re.fullmatch(r"\d{4}-\d{2}-\d{2}", fig):
      continue
    unit = "usd" if fig.lstrip().startswith("$") else _UNITS.get(fig[num.end():].strip().lower(), "")
    out.add((float(num.group(0)), unit))
  return out


def figure_visible(figure: str, seen_numbers: set[float]) -> bool:
  """Every number of ``figure`` is among ``seen_numbers`` (``numbers_in`` of what was shown)."""
  nums = numbers_in(figure)
  return bool(nums) and nums <= seen_numbers
