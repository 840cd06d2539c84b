"""Rule-based Validator and Verifier for tau2-Telecom (App. A.1 tau2 hard rules, no LLM).

The defaults for a tiny CPU policy that cannot act as a judge. They read the same
inputs as the LLM roles (``StepContext``; evidence = ``TelecomEnv.reward_evidence()``)
and return the same judgements.

Validator (reward-oriented, Sec. 4.1: flags only derailing steps), on the draft u^_k:
  * ``USER_SIDE_DEVICE_ACTION``: a tool call to a user-device tool (the agent must guide
    the user instead; App. D.1);
  * ``FABRICATED_ARGUMENTS``: an agent-tool argument (id, phone number, name, amount) that
    no user or tool message has shown;
  * ``POINTLESS_REPEAT``: an agent call identical to an earlier successful one (a write,
    or a lookup with nothing changed since), the same message again with nothing changed,
    asking the user to repeat an undirected toggle they already ran (it undoes it), or a
    device check they already ran with nothing changed since;
  * ``FALSE_CLAIM``: the reply claims a lookup ("I've checked your account") or an agent
    action ("I've enabled roaming") without the matching successful call, or states a
    backend id or a usage figure no message has shown;
  * ``PREMATURE_TERMINATION``: ``###STOP###``, a transfer call or a transfer message while
    a required action (reward-side) is not done yet;
  * ``GOAL_DRIFT``: an account-changing call the task does not need (a plan change, a
    suspension, ...), or a device request that works against the fix (an undirected
    toggle of a setting the task does not need, turning a setting the wrong way).
  ``ARGUMENT_MISMATCH`` (rule 8 of the prompt) is also checked: a required account-changing
  call with other argument values than the reward side fixes.
  Its ``suggest_next`` names only things visible to the policy: tool names (they are in
  the system prompt) and argument values that the conversation (or, for device settings,
  the policy text) shows; an id not shown yet becomes "look the customer up first".

Verifier (integrity, App. A.1 / D.2), on the correction u~_k (its ``<think>`` block too:
those tokens are trained on); rejects:
  * ``leak``: wording that refers to a hidden reference, supervisor or feedback;
  * ``leaked_value``: a name, a backend id (customer / line / bill / plan), a phone number,
    a usage figure, an amount or any other value that no user or tool message has shown
    (App. D.2: "John", "L1002", "15.1 GB" the user never said);
  * ``hallucinated_tool_result``: the reply writes a tool response or the user's report
    itself, or claims a lookup or an agent action that did not happen;
  * ``malformed_reply``: no usable message or tool call (empty, or a malformed call block);
  * ``not_improved``: the reply itself breaks a Validator hard rule (checked only when the
    reply is otherwise clean).

How "done" is read from the history: an agent action is done when an assistant call with
that name and those arguments (free text such as a transfer summary aside) got a non-error
tool response; a user action is done when a
user message reports running that device tool (``I ran <tool>: <output>``, the scripted
user's format) with an output that mentions each of its argument values.

Measured with ``firing_rates`` (``main()`` prints the table): the Validator flags 0 of the 905
steps of the gold agent on all 114 tasks (device actions asked for by tool name, and in plain
words); on the 74 train tasks it flags every do-nothing episode (PREMATURE_TERMINATION), 2146
of 2220 steps of an agent that chats to the turn limit (POINTLESS_REPEAT from its second
message on), and each of the 269 device calls of an agent that runs the device tools itself
(USER_SIDE_DEVICE_ACTION; 66 / 74 episodes, the other 8 tasks need no device action). Used as
corrections, the Validator's hints for those 269 steps all pass the Verifier and repair all 74
episodes. The Verifier rejects 16 of the 905 gold steps: refuel offers quoting a price that no
lookup has shown (the gold script does not look the plan up).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any, Sequence

from rti_jax.envs.tool_calls import ToolCall, parse_assistant_turn
from rti_jax.intervention.judges import StepContext, ValidatorJudgement, VerifierJudgement
from rti_jax.intervention.rules_navigation import past_calls

USER_SIDE_DEVICE_ACTION = "USER_SIDE_DEVICE_ACTION"
FABRICATED_ARGUMENTS = "FABRICATED_ARGUMENTS"
POINTLESS_REPEAT = "POINTLESS_REPEAT"
FALSE_CLAIM = "FALSE_CLAIM"
PREMATURE_TERMINATION = "PREMATURE_TERMINATION"
GOAL_DRIFT = "GOAL_DRIFT"
ARGUMENT_MISMATCH = "ARGUMENT_MISMATCH"
RULES = (USER_SIDE_DEVICE_ACTION, FABRICATED_ARGUMENTS, POINTLESS_REPEAT, FALSE_CLAIM, PREMATURE_TERMINATION,
         GOAL_DRIFT, ARGUMENT_MISMATCH)

AGENT_STOP = "###STOP###"
TRANSFER_TOOL = "transfer_to_human_agents"
#: agent tools that change the account (everything else is a lookup)
AGENT_WRITE_TOOLS = frozenset({"enable_roaming", "disable_roaming", "refuel_data", "change_plan", "suspend_line",
                               "resume_line", "send_payment_request", TRANSFER_TOOL})
#: free-text arguments (not values to be found in the history)
FREE_TEXT_ARGS = frozenset({"summary", "reason"})
#: toggle -> the direction that fixes the telecom faults (turning it the other way breaks a setting)
FIX_DIRECTION = {"toggle_airplane_mode": "off", "toggle_data": "on", "toggle_roaming": "on",
                 "toggle_data_saver_mode": "off", "toggle_wifi_calling": "off"}
#: device writes that can work against the fix when the task does not need them
RISKY_DEVICE_WRITES = frozenset({"toggle_airplane_mode", "toggle_data", "toggle_roaming", "toggle_data_saver_mode",
                                 "toggle_wifi", "toggle_wifi_calling", "connect_vpn", "set_apn_settings",
                                 "set_network_mode_preference"})
#: device writes whose repetition undoes the first run
UNDOING_REPEATS = frozenset({"toggle_airplane_mode", "toggle_data", "toggle_roaming", "toggle_data_saver_mode",
                             "toggle_wifi", "toggle_wifi_calling"})

_LEAK_RE = re.compile(
  r"\b(ground[\s_-]?truth|gold (?:answer|actions?|path|solution)|reference (?:solution|answer|actions?|trajectory|path)|"
  r"(?:the|a) reference\b|standard answer|answer key|labels?\b|evaluation criteria|required actions|expected actions|"
  r"prior draft|previous version|calibrat\w*|supervisor|feedback|hidden (?:answer|solution|information|state)|"
  r"seeing the solution|privileged)",
  re.IGNORECASE,
)
_ID_RE = re.compile(r"\b[A-Z]{1,3}\d{3,}\b")
_PHONE_RE = re.compile(r"(?<!\d)(?<!\d\.)(?:\+?1[\s.-]?)?\(?\d{3}\)?[\s.-]?\d{3}[\s.-]?\d{4}(?!\d|\.\d)")
_FIGURE_RE = re.compile(
  r"(?:\$\s?\d[\d,]*(?:\.\d+)?)|(?<![\w.])\d+(?:\.\d+)?\s?(?:(?:GB|MB|KB|gigabytes?|megabytes?|Mbps|dollars?|USD)\b|Mbit/s|%)"
  r"|(?<![\w.-])\d+\.\d+(?![\w.])|\b\d{4}-\d{2}-\d{2}\b",
  re.IGNORECASE,
)
_NUMBER_RE = re.compile(r"\d[\d,]*(?:\.\d+)?")
_CAP_WORD_RE = re.compile(r"(?<![\w'’-])([A-Z][a-z]{2,})\b")
_USER_RAN_RE = re.compile(r"\bI ran (\w+):\s*(.*?)(?=\s*\bI ran \w+:|$)", re.DOTALL)
_SENTENCE_RE = re.compile(r"(?:[^.!?\n]|\.(?=\d))+[.!?]*")
_USAGE_RE = re.compile(r"\b(?:used|usage|consumed|remaining|left|limit|allowance)\b", re.IGNORECASE)
_TRANSFER_RE = re.compile(r"transferr?(?:ed|ing)? (?:you )?to (?:a )?human|you are being transferred", re.IGNORECASE)
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
#: capitalised words that are never a leaked name
_COMMON_CAPS = frozenset({"The", "This", "That", "These", "Those", "Then", "There", "Please", "Once", "After", "Before",
                          "Since", "Also", "Let", "Now", "Next", "First", "Sure", "Okay", "Thanks", "Thank", "Great",
                          "However", "Yes", "Your", "You", "Our", "What", "When", "Which", "Could", "Would", "Can",
                          "Settings", "Mobile", "Data", "Saver", "Airplane", "Calling", "Roaming", "Network",
                          "Internet", "Android", "Apple", "Messages", "Messaging"})


# --- reading the history --------------------------------------------------------------------------


def norm_value(value: Any) -> str:
  """A comparable form of an argument value: numbers as floats, phone numbers as digits,
  strings lower-cased and stripped."""
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, (int, float)):
    return repr(float(value))
  s = str(value).strip().lower()
  if _PHONE_RE.fullmatch(s):
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
  return {re.sub(r"\D", "", m.group(0))[-10:] for m in _PHONE_RE.finditer(text)}


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
      for match in _USER_RAN_RE.finditer(str(m.get("content", ""))):
        out.append((i, UserRun(match.group(1), match.group(2))))
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
    return any(r.ok and r.call.name == action.name and _args_match(r.call.arguments, action.arguments) for r in agents)
  for _, run in users:
    if run.name == action.name and not run.output.lower().startswith("error"):
      if all(str(v).lower() in run.output.lower() for v in action.arguments.values()):
        return True
  return False


def _device_tools(evidence: dict[str, Any]) -> frozenset[str]:
  from rti_jax.envs.telecom import device_tools as dt

  return frozenset(evidence.get("user_side_tools") or dt.DEVICE_TOOLS)


def _device_writes() -> frozenset[str]:
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


@functools.lru_cache(maxsize=1)
def backend_names() -> frozenset[str]:
  """Every word (>= 3 letters) of a customer's name in the agent DB: never to be said
  before the user or a lookup has shown it."""
  from rti_jax.envs.telecom import state as st

  words = set()
  for c in st.load_db().get("customers", []):
    words.update(w for w in re.findall(r"[A-Za-z]{3,}", str(c.get("full_name", ""))))
  return frozenset(words)


def _state_changed_since(index: int, agents: Sequence[AgentRun], users: Sequence[tuple[int, UserRun]]) -> bool:
  """Whether an account-changing call or a device write happened after message ``index``."""
  writes = _device_writes()
  return (any(r.index > index and r.ok and r.call.name in AGENT_WRITE_TOOLS for r in agents)
          or any(i > index and u.name in writes for i, u in users))


def _norm_text(text: str) -> str:
  return " ".join(text.lower().split())


# --- Validator -----------------------------------------------------------------------------------


class TelecomRuleValidator:
  """Rule-based Validator (see module docstring).

  policy: the system text the policy sees (default: the full telecom policy); device
    settings it names (e.g. ``4g_5g_preferred``) may appear in a ``suggest_next``.
  """

  def __init__(self, policy: str | None = None) -> None:
    self.policy = default_policy_text() if policy is None else policy

  def validate(self, ctxs: Sequence[StepContext]) -> list[ValidatorJudgement]:
    return [self.judge(c) for c in ctxs]

  def judge(self, ctx: StepContext) -> ValidatorJudgement:
    errors = self.errors(ctx)
    if not errors:
      return ValidatorJudgement(is_valid=True, diagnosis="No hard rule is violated.")
    return ValidatorJudgement(
      is_valid=False,
      error_types=tuple(dict.fromkeys(e[0] for e in errors)),
      diagnosis=" ".join(e[1] for e in errors),
      suggest_next=errors[0][2],
    )

  def errors(self, ctx: StepContext) -> list[tuple[str, str, str]]:
    """``(rule, diagnosis, suggestion)`` for every hard rule the draft breaks."""
    turn = parse_assistant_turn(ctx.draft)
    seen = conversation_text(ctx)
    agents = agent_runs(ctx.history)
    users = user_runs(ctx.history)
    required = required_actions(ctx.evidence)
    pending = [a for a in required if not is_done(a, agents, users)]
    device = _device_tools(ctx.evidence)
    errors: list[tuple[str, str, str]] = []

    device_calls = [c for c in turn.tool_calls if c.name in device]
    agent_calls = [c for c in turn.tool_calls if c.name not in device]
    for call in device_calls:
      errors.append((USER_SIDE_DEVICE_ACTION,
                     f"{call.name} is a tool on the user's phone; the agent cannot call it.",
                     f"Do not call {call.name} yourself: ask the user to run {self._device_phrase(call.name, call.arguments, seen)} "
                     f"on their phone and tell you the result."))

    for call in agent_calls:
      bad = self._fabricated(call, seen)
      if bad:
        errors.append((FABRICATED_ARGUMENTS,
                       f"{call.name} uses {', '.join(f'{k}={v!r}' for k, v in bad)}, which no user or tool message has shown.",
                       self._lookup_hint(call.name, seen)))

    errors.extend(self._repeats(ctx, turn, agent_calls, agents, users))
    errors.extend(self._false_claims(turn.content, seen, agents))

    ends = (AGENT_STOP in turn.content or any(c.name == TRANSFER_TOOL for c in agent_calls)
            or (not turn.tool_calls and bool(_TRANSFER_RE.search(turn.content))))
    still = [a for a in pending if a.name != TRANSFER_TOOL or not any(c.name == TRANSFER_TOOL for c in agent_calls)]
    if ends and still:
      errors.append((PREMATURE_TERMINATION,
                     f"The reply ends the conversation while {len(still)} step(s) needed to resolve the issue are not done.",
                     "Do not end the conversation yet: " + self._action_hint(still[0], seen) + "."))

    errors.extend(self._drift(turn, agent_calls, required, pending, users, seen))
    return errors

  # --- rules -------------------------------------------------------------------------------

  @staticmethod
  def _fabricated(call: ToolCall, seen: str) -> list[tuple[str, Any]]:
    low = seen.lower()
    phones = phones_in(seen)
    numbers = numbers_in(seen)
    bad = []
    for k, v in call.arguments.items():
      if k in FREE_TEXT_ARGS:
        continue
      if isinstance(v, bool) or v is None:
        bad.append((k, v))
      elif isinstance(v, (int, float)):
        if float(v) not in numbers:
          bad.append((k, v))
      elif not isinstance(v, str) or not v.strip():
        bad.append((k, v))
      elif _PHONE_RE.fullmatch(v.strip()):
        if norm_value(v) not in phones:
          bad.append((k, v))
      elif v.strip().lower() not in low:
        bad.append((k, v))
    return bad

  @staticmethod
  def _repeats(ctx: StepContext, turn: Any, agent_calls: Sequence[ToolCall], agents: Sequence[AgentRun],
               users: Sequence[tuple[int, UserRun]]) -> list[tuple[str, str, str]]:
    out = []
    for call in agent_calls:
      key = call_key(call.name, call.arguments)
      prior = [r for r in agents if r.ok and call_key(r.call.name, r.call.arguments) == key]
      if prior and (call.name in AGENT_WRITE_TOOLS or not _state_changed_since(prior[-1].index, agents, users)):
        out.append((POINTLESS_REPEAT, f"{call.name} with these arguments already succeeded; calling it again changes nothing.",
                    f"Use the result of the earlier {call.name} call and move on to the next step."))
    if not turn.tool_calls and turn.content:
      same = [i for i, m in enumerate(ctx.history)
              if m.get("role") == "assistant" and _norm_text(parse_assistant_turn(str(m.get("content", ""))).content)
              == _norm_text(turn.content) and not parse_assistant_turn(str(m.get("content", ""))).tool_calls]
      if same and not _state_changed_since(same[-1], agents, users):
        out.append((POINTLESS_REPEAT, "The reply repeats an earlier message word for word and nothing has changed since.",
                    "Respond to what the user said last instead of repeating yourself."))
      last_run = {u.name: i for i, u in users}
      writes = _device_writes()
      for req in device_requests(turn.content):
        if req.tool not in last_run:
          continue
        if req.tool in UNDOING_REPEATS and req.direction is None:
          out.append((POINTLESS_REPEAT, f"The user already ran {req.tool}; running it again undoes it.",
                      f"Ask the user to check the current state (e.g. check_network_status) instead of running "
                      f"{req.tool} again."))
          break
        if req.tool not in writes and not _state_changed_since(last_run[req.tool], agents, users):
          out.append((POINTLESS_REPEAT, f"The user already ran {req.tool} and nothing has changed since; its result "
                                        f"is in the conversation.",
                      f"Use the {req.tool} result the user reported and move on to the next step."))
          break
    return out

  @staticmethod
  def _false_claims(content: str, seen: str, agents: Sequence[AgentRun]) -> list[tuple[str, str, str]]:
    return [(FALSE_CLAIM, d, s) for d, s in claim_problems(content, seen, agents)]

  def _drift(self, turn: Any, agent_calls: Sequence[ToolCall], required: Sequence[Required],
             pending: Sequence[Required], users: Sequence[tuple[int, UserRun]], seen: str) -> list[tuple[str, str, str]]:
    out = []
    req_agent = [a for a in required if a.side == "agent"]
    req_user_names = {a.name for a in required if a.side == "user"}
    for call in agent_calls:
      if call.name not in AGENT_WRITE_TOOLS or call.name == TRANSFER_TOOL:
        continue
      same_name = [a for a in req_agent if a.name == call.name]
      if not same_name:
        nxt = pending[0] if pending else None
        hint = ("Keep to the user's issue: " + self._action_hint(nxt, seen) + ".") if nxt else (
          "Keep to the user's issue and ask the user to check whether it is fixed.")
        out.append((GOAL_DRIFT, f"{call.name} changes the account in a way the user's issue does not call for.", hint))
      elif not any(_args_match(call.arguments, a.arguments) for a in same_name):
        want = next(a for a in same_name)
        out.append((ARGUMENT_MISMATCH, f"{call.name} is called with other values than the issue needs.",
                    "Call " + self._agent_phrase(want, seen) + " instead."))
    if not turn.tool_calls and turn.content:
      for req in device_requests(turn.content):
        if req.tool not in RISKY_DEVICE_WRITES:
          continue
        fix = FIX_DIRECTION.get(req.tool)
        wrong_way = fix is not None and req.direction is not None and req.direction != fix
        unneeded = req.tool not in req_user_names and req.direction is None
        if req.tool == "set_network_mode_preference":
          wanted = [a.arguments.get("mode") for a in required if a.name == req.tool]
          unneeded = req.arguments.get("mode") not in wanted and req.arguments.get("mode") != "4g_5g_preferred"
        if wrong_way or unneeded:
          what = f"turning {req.direction} {req.tool.removeprefix('toggle_')}" if wrong_way else f"running {req.tool}"
          nxt = pending[0] if pending else None
          out.append((GOAL_DRIFT, f"Asking the user for {what} works against fixing the issue.",
                      ("Instead, " + self._action_hint(nxt, seen) + ".") if nxt else
                      "Ask the user to check whether the issue is fixed instead."))
          break
    return out

  # --- visible-only hints ----------------------------------------------------------------------

  def _device_phrase(self, name: str, arguments: dict[str, Any], seen: str) -> str:
    """``name(k="v", ...)`` with only the arguments the device tool takes whose values the
    conversation or the policy text shows."""
    from rti_jax.envs.telecom import device_tools as dt

    params = dt.DEVICE_TOOLS[name].params if name in dt.DEVICE_TOOLS else ()
    vocab = (seen + "\n" + self.policy).lower()
    shown = {k: v for k, v in arguments.items() if k in params and isinstance(v, str) and v.lower() in vocab}
    return f"{name}(" + ", ".join(f'{k}="{v}"' for k, v in shown.items()) + ")"

  def _agent_phrase(self, action: Required, seen: str) -> str:
    shown = {k: v for k, v in action.arguments.items() if k not in FREE_TEXT_ARGS and _visible_value(v, seen)}
    hidden = [k for k in action.arguments if k not in FREE_TEXT_ARGS and k not in shown]
    args = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    text = f"{action.name}({args})"
    return text + (f" (find {', '.join(hidden)} from the conversation or a lookup)" if hidden else "")

  def _action_hint(self, action: Required, seen: str) -> str:
    if action.side == "user":
      return f"ask the user to run {self._device_phrase(action.name, action.arguments, seen)} on their phone"
    if action.name == TRANSFER_TOOL:
      return f"call {TRANSFER_TOOL} with a summary of the issue, then tell the user they are being transferred"
    hidden = [k for k, v in action.arguments.items() if k not in FREE_TEXT_ARGS and not _visible_value(v, seen)]
    if any(k.endswith("_id") for k in hidden):
      hint = self._lookup_hint(action.name, seen).rstrip(".")
      return hint[0].lower() + hint[1:]
    return f"call {self._agent_phrase(action, seen)}"

  @staticmethod
  def _lookup_hint(name: str, seen: str) -> str:
    """What to do instead of guessing an argument of ``name`` (visible-only)."""
    if name == "get_customer_by_phone":
      return ("Use the phone number exactly as the user gave it." if phones_in(seen) else
              "Ask the user for their phone number before looking the customer up.")
    if name not in AGENT_WRITE_TOOLS:
      return f"Call {name} only with values the user or an earlier tool result has given."
    if phones_in(seen):
      return (f"Look the customer up with get_customer_by_phone using the phone number the user gave, "
              f"then call {name} with ids from that result.")
    return f"Ask the user for their phone number and look the customer up before calling {name}."


def _visible_value(value: Any, seen: str) -> bool:
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return float(value) in numbers_in(seen)
  s = str(value).strip()
  if _PHONE_RE.fullmatch(s):
    return norm_value(s) in phones_in(seen)
  return bool(s) and s.lower() in seen.lower()


def _args_match(got: dict[str, Any], want: dict[str, Any]) -> bool:
  """Equal on every argument the reward side fixes (free text excepted)."""
  return all(k in FREE_TEXT_ARGS or (k in got and norm_value(got[k]) == norm_value(v)) for k, v in want.items())


def claim_problems(content: str, seen: str, agents: Sequence[AgentRun]) -> list[tuple[str, str]]:
  """``(diagnosis, suggestion)`` for each claim in ``content`` that the history does not back:
  a lookup or an agent action that did not succeed, a backend id or a usage figure that no
  user or tool message shows."""
  ok_tools = {r.call.name for r in agents if r.ok}
  lookups = {n for n in ok_tools if n not in AGENT_WRITE_TOOLS}
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
      figures = [f.group(0) for f in _FIGURE_RE.finditer(sentence) if not _figure_visible(f.group(0), seen)]
      if figures:
        out.append((f"The reply states {', '.join(figures)}, which no tool result has shown.",
                    "Check the line's data usage with get_data_usage before quoting figures."))
  ids = sorted({i for i in _ID_RE.findall(content or "") if i.lower() not in seen.lower()})
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
  for m in _FIGURE_RE.finditer(text):
    fig = m.group(0).replace(",", "")
    num = _NUMBER_RE.search(fig)
    if num is None or re.fullmatch(r"\d{4}-\d{2}-\d{2}", fig):
      continue
    unit = "usd" if fig.lstrip().startswith("$") else _UNITS.get(fig[num.end():].strip().lower(), "")
    out.add((float(num.group(0)), unit))
  return out


def _figure_visible(figure: str, seen: str) -> bool:
  nums = numbers_in(figure)
  return bool(nums) and nums <= numbers_in(seen)


# --- Verifier ------------------------------------------------------------------------------------


class TelecomRuleVerifier:
  """Rule-based Verifier (see module docstring).

  policy: the system text the policy sees (default: the full telecom policy); words it
    contains are vocabulary, never a leaked name.
  check_rules: also reject a correction that itself breaks a Validator hard rule
    (``not_improved``: not consistent with the gold requirement, Sec. 4.1 (i)).
  """

  def __init__(self, policy: str | None = None, check_rules: bool = True) -> None:
    self.policy = default_policy_text() if policy is None else policy
    self.check_rules = check_rules
    self._validator = TelecomRuleValidator(self.policy)
    self._policy_words = frozenset(re.findall(r"[a-z]+", self.policy.lower()))
    self._policy_figures = frozenset(figures_in(self.policy))

  def verify(self, ctxs: Sequence[StepContext], corrected: Sequence[str]) -> list[VerifierJudgement]:
    return [self.judge(c, u) for c, u in zip(ctxs, corrected)]

  def judge(self, ctx: StepContext, corrected: str) -> VerifierJudgement:
    reasons: list[str] = []
    notes: list[str] = []
    text = corrected if isinstance(corrected, str) else ""
    turn = parse_assistant_turn(text)
    if turn.errors or not (turn.tool_calls or turn.content.strip()):
      reasons.append("malformed_reply")
      notes.append("the reply has no usable message or tool call." if not turn.errors else
                   f"the reply has a malformed tool call ({turn.errors[0]}).")
    m = _LEAK_RE.search(text)
    if m:
      reasons.append("leak")
      notes.append(f"mentions {m.group(0)!r}, which is not part of the visible conversation.")
    values = self.leaked_values(ctx, text)
    if values:
      reasons.append("leaked_value")
      notes.append("states " + ", ".join(repr(v) for v in values) + ", which the user and the tools never showed.")
    fabricated = self.fabricated_results(ctx, text)
    if fabricated:
      reasons.append("hallucinated_tool_result")
      notes.append(" ".join(fabricated))
    if self.check_rules and not reasons:
      still = self._validator.judge(dataclasses.replace(ctx, draft=text))
      if not still.is_valid:
        reasons.append("not_improved")
        notes.append(f"the reply still breaks a hard rule ({', '.join(still.error_types)}).")
    if reasons:
      return VerifierJudgement(ok=False, reasons=tuple(reasons), diagnosis=" ".join(notes))
    return VerifierJudgement(ok=True, diagnosis="Derivable from the visible conversation; no leak, no fabricated result.")

  def leaked_values(self, ctx: StepContext, text: str) -> list[str]:
    """Values in ``text`` (reasoning, content and call arguments) that no user or tool
    message shows: ids, phone numbers, figures, names."""
    seen = conversation_text(ctx)
    low = seen.lower()
    out: list[str] = []
    out += [i for i in _ID_RE.findall(text) if i.lower() not in low]
    phones = phones_in(seen)
    out += [p.group(0) for p in _PHONE_RE.finditer(text) if norm_value(p.group(0)) not in phones]
    # A figure is visible when a user or tool message shows its number (coarse: tool outputs are
    # JSON, so units are not matched), or the tool list or the policy, which the policy sees, shows
    # the same figure with its unit ("at most 2 GB").
    tools = json.dumps(list(ctx.tools), ensure_ascii=False)
    prose = figures_in(tools) | self._policy_figures
    for f in _FIGURE_RE.finditer(_PHONE_RE.sub(" ", text)):
      if not _figure_visible(f.group(0), seen) and not (figures_in(f.group(0)) <= prose):
        out.append(f.group(0))
    vocab_words = self._policy_words | set(re.findall(r"[a-z]+", (seen + "\n" + tools).lower()))
    hidden_names = backend_names() | _names_in_evidence(ctx.evidence)
    seen_words = set(re.findall(r"[a-z]+", low))
    out += [w for w in re.findall(r"[A-Za-z]{3,}", text) if w in hidden_names and w.lower() not in seen_words]
    for m in _CAP_WORD_RE.finditer(text):
      word = m.group(1)
      before = text[: m.start()].rstrip()
      sentence_start = not before or before[-1] in ".!?:>\n-—\"'(" or before.endswith("---")
      if not sentence_start and word not in _COMMON_CAPS and word.lower() not in vocab_words:
        out.append(word)
    return list(dict.fromkeys(out))

  def fabricated_results(self, ctx: StepContext, text: str) -> list[str]:
    """Why ``text`` writes or claims results that did not happen (empty when it does not)."""
    out = []
    if "<tool_response>" in text or re.search(r"^\s*(?:tool|user)\s*:", text, re.IGNORECASE | re.MULTILINE):
      out.append("writes a tool response or a user turn itself.")
    if _USER_RAN_RE.search(text):
      out.append("reports a device tool run in the user's words.")
    visible = parse_assistant_turn(text).content
    for diagnosis, _ in claim_problems(visible, conversation_text(ctx), agent_runs(ctx.history)):
      out.append(diagnosis)
    return out


def _names_in_evidence(evidence: dict[str, Any]) -> frozenset[str]:
  """Name words from the privileged ``known_info`` / ``ticket`` ("You are John Smith ...")."""
  words = set()
  for key in ("known_info", "ticket"):
    m = re.search(r"(?:You are|Customer name:)\s+([A-Z][\w.'-]*(?:\s+[A-Z][\w.'-]*)*)", str(evidence.get(key, "")))
    if m:
      words.update(w for w in re.findall(r"[A-Za-z]{3,}", m.group(1)))
  return frozenset(words)


# --- measuring the Validator on scripted agents -----------------------------------------------------


def naive_device_turns(task: Any) -> list[str]:
  """The gold replay (``scripted_agents.gold_agent_turns``, named style) with every device
  request turned into the agent's own tool call: the App. D.1 failure, at every device step."""
  from rti_jax.envs.telecom.scripted_agents import gold_agent_turns, tool_call_text

  out = []
  for turn in gold_agent_turns(task):
    m = re.fullmatch(r"Please run (\w+)\((.*?)\) on your phone and tell me the result\.", turn)
    out.append(tool_call_text(m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))) if m else turn)
  return out


def firing_rates(make_agent: Any, tasks: Sequence[Any], validator: TelecomRuleValidator | None = None) -> dict[str, Any]:
  """Runs ``make_agent(task)`` on every task in a ``TelecomEnv`` and judges each of its steps.

  Returns ``{"tasks", "steps", "flagged", "episodes_flagged", "mean_reward", "by_rule"}``
  (``by_rule``: flagged steps per error type).
  """
  from rti_jax.envs.telecom.env import TelecomEnv

  validator = validator or TelecomRuleValidator()
  env = TelecomEnv()
  steps = flagged = episodes = 0
  reward = 0.0
  by_rule: dict[str, int] = {}
  for task in tasks:
    env.reset(task)
    agent = make_agent(task)
    hit = False
    while True:
      msgs = env.transcript.messages
      draft = agent.act(msgs)
      ctx = StepContext(msgs[1]["content"], tuple(m for m in msgs if m["role"] != "system"), draft,
                        tuple(env.tool_schemas()), env.reward_evidence(), "telecom")
      j = validator.judge(ctx)
      steps += 1
      if not j.is_valid:
        flagged += 1
        hit = True
        for e in j.error_types:
          by_rule[e] = by_rule.get(e, 0) + 1
      result = env.step(draft)
      if result.done:
        reward += result.reward
        break
    episodes += hit
  return {"tasks": len(tasks), "steps": steps, "flagged": flagged, "episodes_flagged": episodes,
          "mean_reward": reward / max(len(tasks), 1), "by_rule": dict(sorted(by_rule.items()))}


def main() -> None:
  """``python -c "from rti_jax.intervention.rules_telecom import main; main()"``: how often the Validator fires on the gold
  agent (all 114 tasks, both request styles) and on failing agents (the 74 train tasks)."""
  from rti_jax.envs.telecom import DescribedGoldAgent, DoNothingAgent, GoldAgent, ScriptAgent, load_split

  base, train = load_split("base"), load_split("train")
  rows = [("gold, by tool name (base)", GoldAgent, base), ("gold, in plain words (base)", DescribedGoldAgent, base),
          ("do-nothing, stops at once (train)", lambda t: DoNothingAgent(t), train),
          ("do-nothing, chats to the limit (train)", lambda t: DoNothingAgent(t, stop=False), train),
          ("naive, runs device tools itself (train)", lambda t: ScriptAgent(naive_device_turns(t)), train)]
  print(f"{'agent':42s} {'reward':>6s} {'steps':>6s} {'flagged':>8s} {'episodes':>9s}  by rule")
  for name, make, tasks in rows:
    r = firing_rates(make, tasks)
    print(f"{name:42s} {r['mean_reward']:6.3f} {r['steps']:6d} {r['flagged'] / r['steps']:8.3f} "
          f"{r['episodes_flagged']:4d}/{r['tasks']:<4d}  {r['by_rule']}")


if __name__ == "__main__":
  main()
