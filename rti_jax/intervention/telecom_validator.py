"""Rule-based Validator for tau2-Telecom: the tau2 hard rules of the Validator prompt, no LLM.

The default for a small policy that cannot act as a judge. It reads the same inputs as the
LLM Validator (``StepContext``; evidence = ``TelecomEnv.reward_evidence()``) and returns the
same judgement. Reward-oriented (Sec. 4.1: flags only derailing steps), on the draft u^_k:
  * ``USER_SIDE_DEVICE_ACTION``: a tool call to a user-device tool (the agent must guide
    the user instead; App. D.1);
  * ``FABRICATED_ARGUMENTS``: an agent-tool argument (id, phone number, name, amount) that
    no user or tool message has shown;
  * ``POINTLESS_REPEAT``: an agent call identical to an earlier successful one (a write,
    or a lookup with nothing changed since), the same message again with nothing changed,
    asking the user to repeat an undirected toggle they already ran (it undoes it), or a
    device check they already ran with nothing changed since (and no device change asked
    before it in the same message);
  * ``FALSE_CLAIM``: the reply claims a lookup ("I've checked your account") or an agent
    action ("I've enabled roaming") without the matching successful call, or states a
    backend id or a usage figure no message has shown;
  * ``PREMATURE_TERMINATION``: ``###STOP###``, a transfer call or a transfer message while
    a required action (reward-side) is not done yet;
  * ``GOAL_DRIFT``: an account-changing call the task does not need (a plan change, a
    suspension, ...), or a device request that works against the fix (an undirected
    toggle of a setting the task does not need, turning a setting the wrong way);
  * ``ARGUMENT_MISMATCH`` (rule 8 of the prompt): a required account-changing call with
    other argument values than the reward side fixes.
Its ``suggest_next`` is built from the evidence, as the paper's Validator writes it: the required
actions with their exact arguments (the line id, the refuel amount, the APN reset or the device
setting that fixes the fault), so only the paper's Corrector, told to conceal it, reads it. Its
``visible_suggest_next`` (the feedback-only Corrector's) names only things visible to the policy:
tool names (they are in the system prompt) and argument values that the conversation (or, for
device settings, the policy text) shows; an id not shown yet becomes "look the customer up first",
and a device fix that no visible output justifies yet (``telecom_fixes.FIX_RULES``) becomes the
check that would show its setting ("ask the user to run check_status_bar()"): once the user's
report shows the fault, the hint names the fix.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from rti_jax.envs.tool_calls import ToolCall, parse_assistant_turn
from rti_jax.intervention.judges import StepContext, ValidatorJudgement
from rti_jax.intervention.telecom_evidence import (
  AGENT_STOP,
  AGENT_WRITE_TOOLS,
  FREE_TEXT_ARGS,
  PHONE_RE,
  TRANSFER_TOOL,
  AgentRun,
  Required,
  UserRun,
  agent_runs,
  args_match,
  as_float,
  call_key,
  claim_problems,
  conversation_text,
  default_policy_text,
  device_requests,
  device_write_tools,
  is_done,
  norm_text,
  norm_value,
  numbers_in,
  phones_in,
  required_actions,
  state_changed_since,
  user_runs,
  user_side_tools,
  visible_value,
)
from rti_jax.intervention.telecom_fixes import (
  FIX_DIRECTION,
  FIX_RULES,
  Reading,
  judge_fix,
  last_readings,
  readings_in,
  visible_texts,
)

#: setting -> its last reading in the visible conversation (``telecom_fixes.last_readings``)
Shown = dict[str, Reading]
#: what a diagnostic-first hint reads: the readings, the agent's and the user's tool runs
Visible = tuple[Shown, Sequence[AgentRun], Sequence[tuple[int, UserRun]]]

USER_SIDE_DEVICE_ACTION = "USER_SIDE_DEVICE_ACTION"
FABRICATED_ARGUMENTS = "FABRICATED_ARGUMENTS"
POINTLESS_REPEAT = "POINTLESS_REPEAT"
FALSE_CLAIM = "FALSE_CLAIM"
PREMATURE_TERMINATION = "PREMATURE_TERMINATION"
GOAL_DRIFT = "GOAL_DRIFT"
ARGUMENT_MISMATCH = "ARGUMENT_MISMATCH"
RULES = (USER_SIDE_DEVICE_ACTION, FABRICATED_ARGUMENTS, POINTLESS_REPEAT, FALSE_CLAIM, PREMATURE_TERMINATION,
         GOAL_DRIFT, ARGUMENT_MISMATCH)

#: device writes that can work against the fix when the task does not need them
RISKY_DEVICE_WRITES = frozenset({"toggle_airplane_mode", "toggle_data", "toggle_roaming", "toggle_data_saver_mode",
                                 "toggle_wifi", "toggle_wifi_calling", "connect_vpn", "set_apn_settings",
                                 "set_network_mode_preference"})
#: device writes whose repetition undoes the first run
UNDOING_REPEATS = frozenset({"toggle_airplane_mode", "toggle_data", "toggle_roaming", "toggle_data_saver_mode",
                             "toggle_wifi", "toggle_wifi_calling"})

_TRANSFER_RE = re.compile(r"transferr?(?:ed|ing)? (?:you )?to (?:a )?human|you are being transferred", re.IGNORECASE)


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
      suggest_next=errors[0][3],
      visible_suggest_next=errors[0][2],
    )

  def errors(self, ctx: StepContext) -> list[tuple[str, str, str, str]]:
    """``(rule, diagnosis, visible-only suggestion, suggestion from the evidence)`` for every hard
    rule the draft breaks."""
    turn = parse_assistant_turn(ctx.draft)
    seen = conversation_text(ctx)
    agents = agent_runs(ctx.history)
    users = user_runs(ctx.history)
    required = required_actions(ctx.evidence)
    pending = [a for a in required if not is_done(a, agents, users)]
    device = user_side_tools(ctx.evidence)
    shown = last_readings(readings_in(visible_texts(ctx)))
    visible_state = (shown, agents, users)
    errors: list[tuple[str, str, str, str]] = []

    device_calls = [c for c in turn.tool_calls if c.name in device]
    agent_calls = [c for c in turn.tool_calls if c.name not in device]
    for call in device_calls:
      ask = "Do not call {} yourself{}: ask the user to run {} on their phone and tell you the result."
      step = self._visible_step(call.name, call.arguments, seen, shown, agents, users)
      if step is None:
        visible = (f"Do not call {call.name} yourself, and do not ask for it: the user's last report shows "
                   f"{FIX_RULES[call.name].words} already fine. Respond to what the user reported instead.")
      else:
        visible = ask.format(call.name, "" if step.startswith(call.name + "(") else
                             ", and do not ask for it before a check shows it is needed", step)
      errors.append((USER_SIDE_DEVICE_ACTION,
                     f"{call.name} is a tool on the user's phone; the agent cannot call it.",
                     visible, ask.format(call.name, "", self._device_fix(call, pending))))

    for call in agent_calls:
      bad = self._fabricated(call, seen)
      if bad:
        hint = self._lookup_hint(call.name, seen)
        errors.append((FABRICATED_ARGUMENTS,
                       f"{call.name} uses {', '.join(f'{k}={v!r}' for k, v in bad)}, which no user or tool message has shown.",
                       hint, self._lookup_fix(call.name, hint, required)))

    errors.extend((*e, e[2]) for e in self._repeats(ctx, turn, agent_calls, agents, users))
    errors.extend((*e, e[2]) for e in self._false_claims(turn.content, seen, agents))

    ends = (AGENT_STOP in turn.content or any(c.name == TRANSFER_TOOL for c in agent_calls)
            or (not turn.tool_calls and bool(_TRANSFER_RE.search(turn.content))))
    still = [a for a in pending if a.name != TRANSFER_TOOL or not any(c.name == TRANSFER_TOOL for c in agent_calls)]
    if ends and still:
      errors.append((PREMATURE_TERMINATION,
                     f"The reply ends the conversation while {len(still)} step(s) needed to resolve the issue are not done.",
                     "Do not end the conversation yet: " + self._action_hint(still[0], seen, shown=visible_state) + ".",
                     "Do not end the conversation yet: " + self._action_hint(still[0], seen, reveal=True) + "."))

    errors.extend(self._drift(turn, agent_calls, required, pending, users, seen, visible_state))
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
        if as_float(v) not in numbers:
          bad.append((k, v))
      elif not isinstance(v, str) or not v.strip():
        bad.append((k, v))
      elif PHONE_RE.fullmatch(v.strip()):
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
      if prior and (call.name in AGENT_WRITE_TOOLS or not state_changed_since(prior[-1].index, agents, users)):
        out.append((POINTLESS_REPEAT, f"{call.name} with these arguments already succeeded; calling it again changes nothing.",
                    f"Use the result of the earlier {call.name} call and move on to the next step."))
    if not turn.tool_calls and turn.content:
      same = [i for i, m in enumerate(ctx.history)
              if m.get("role") == "assistant" and norm_text(parse_assistant_turn(str(m.get("content", ""))).content)
              == norm_text(turn.content) and not parse_assistant_turn(str(m.get("content", ""))).tool_calls]
      if same and not state_changed_since(same[-1], agents, users):
        out.append((POINTLESS_REPEAT, "The reply repeats an earlier message word for word and nothing has changed since.",
                    "Respond to what the user said last instead of repeating yourself."))
      last_run = {u.name: i for i, u in users}
      writes = device_write_tools()
      asked_write = False  # a check asked after a device write of the same message reads a new state
      for req in device_requests(turn.content):
        if req.tool in last_run:
          if req.tool in UNDOING_REPEATS and req.direction is None:
            out.append((POINTLESS_REPEAT, f"The user already ran {req.tool}; running it again undoes it.",
                        f"Ask the user to check the current state (e.g. check_network_status) instead of running "
                        f"{req.tool} again."))
            break
          if req.tool not in writes and not asked_write and not state_changed_since(last_run[req.tool], agents, users):
            out.append((POINTLESS_REPEAT, f"The user already ran {req.tool} and nothing has changed since; its result "
                                          f"is in the conversation.",
                        f"Use the {req.tool} result the user reported and move on to the next step."))
            break
        asked_write = asked_write or req.tool in writes
    return out

  @staticmethod
  def _false_claims(content: str, seen: str, agents: Sequence[AgentRun]) -> list[tuple[str, str, str]]:
    return [(FALSE_CLAIM, d, s) for d, s in claim_problems(content, seen, agents)]

  def _drift(self, turn: Any, agent_calls: Sequence[ToolCall], required: Sequence[Required],
             pending: Sequence[Required], users: Sequence[tuple[int, UserRun]], seen: str, shown: Visible
             ) -> list[tuple[str, str, str, str]]:
    out = []
    req_agent = [a for a in required if a.side == "agent"]
    req_user_names = {a.name for a in required if a.side == "user"}
    for call in agent_calls:
      if call.name not in AGENT_WRITE_TOOLS or call.name == TRANSFER_TOOL:
        continue
      same_name = [a for a in req_agent if a.name == call.name]
      if not same_name:
        nxt = pending[0] if pending else None
        hints = [("Keep to the user's issue: " + self._action_hint(nxt, seen, reveal, shown) + ".") if nxt else (
          "Keep to the user's issue and ask the user to check whether it is fixed.") for reveal in (False, True)]
        out.append((GOAL_DRIFT, f"{call.name} changes the account in a way the user's issue does not call for.", *hints))
      elif not any(args_match(call.arguments, a.arguments) for a in same_name):
        want = next(a for a in same_name)
        out.append((ARGUMENT_MISMATCH, f"{call.name} is called with other values than the issue needs.",
                    "Call " + self._agent_phrase(want, seen) + " instead.",
                    "Call " + self._agent_phrase(want, seen, reveal=True) + " instead."))
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
                      *[("Instead, " + self._action_hint(nxt, seen, reveal, shown) + ".") if nxt else
                        "Ask the user to check whether the issue is fixed instead." for reveal in (False, True)]))
          break
    return out

  # --- visible-only hints ----------------------------------------------------------------------

  def _device_phrase(self, name: str, arguments: dict[str, Any], seen: str, reveal: bool = False) -> str:
    """``name(k="v", ...)`` with only the arguments the device tool takes whose values the
    conversation or the policy text shows (all of them with ``reveal``)."""
    from rti_jax.envs.telecom import device_tools as dt

    params = dt.DEVICE_TOOLS[name].params if name in dt.DEVICE_TOOLS else ()
    vocab = (seen + "\n" + self.policy).lower()
    shown = {k: v for k, v in arguments.items()
             if k in params and isinstance(v, str) and (reveal or v.lower() in vocab)}
    return f"{name}(" + ", ".join(f'{k}="{v}"' for k, v in shown.items()) + ")"

  def _device_fix(self, call: ToolCall, pending: Sequence[Required]) -> str:
    """The device actions the evidence still requires (the one the draft tried first, and the one
    after it), with their exact arguments; else the draft's call (the paper's ``suggest_next``)."""
    todo = [a for a in pending if a.side == "user"]
    at = next((i for i, a in enumerate(todo) if a.name == call.name), 0)
    fix = [self._device_phrase(a.name, a.arguments, "", reveal=True) for a in todo[at:at + 2]]
    return " and then ".join(fix) if fix else self._device_phrase(call.name, call.arguments, "", reveal=True)

  @staticmethod
  def _lookup_fix(name: str, hint: str, required: Sequence[Required]) -> str:
    """A guessed argument, repaired from the evidence: the required call of that tool with its exact
    arguments, else the visible hint and the ids the required calls use (the paper's ``suggest_next``)."""
    same = [a for a in required if a.side == "agent" and a.name == name]
    if same:
      return "Call " + TelecomRuleValidator._plain_phrase(same[0]) + "."
    ids = {k: v for a in required if a.side == "agent" for k, v in a.arguments.items() if k.endswith("_id")}
    return hint + (" The ids the issue needs: " + ", ".join(f"{k}={v!r}" for k, v in ids.items()) + "." if ids else "")

  @staticmethod
  def _plain_phrase(action: Required) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in action.arguments.items() if k not in FREE_TEXT_ARGS)
    return f"{action.name}({args})"

  def _agent_phrase(self, action: Required, seen: str, reveal: bool = False) -> str:
    if reveal:
      return self._plain_phrase(action)
    shown = {k: v for k, v in action.arguments.items() if k not in FREE_TEXT_ARGS and visible_value(v, seen)}
    hidden = [k for k in action.arguments if k not in FREE_TEXT_ARGS and k not in shown]
    args = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    text = f"{action.name}({args})"
    return text + (f" (find {', '.join(hidden)} from the conversation or a lookup)" if hidden else "")

  def _visible_step(self, name: str, arguments: dict[str, Any], seen: str, shown: Shown,
                    agents: Sequence[AgentRun], users: Sequence[tuple[int, UserRun]]) -> str | None:
    """The device step a visible hint may ask for: ``name(...)`` when it needs no diagnostic or the
    visible conversation shows the fault it fixes; else the check that shows that setting
    (``FixRule.diagnostic``); None when the last report already showed the setting fine and
    nothing has changed since (asking for that check again would be a pointless repeat)."""
    if judge_fix(name, arguments, None, shown) is None:
      return self._device_phrase(name, arguments, seen)
    rule = FIX_RULES[name]
    last = shown.get(rule.setting_key(arguments))
    if last is not None and not state_changed_since(last.message - 1, agents, users):
      return None
    return self._device_phrase(rule.diagnostic, {k: arguments[k] for k in rule.diagnostic_args if k in arguments}, seen)

  def _action_hint(self, action: Required, seen: str, reveal: bool = False,
                   shown: Visible | None = None) -> str:
    """The next required action as a hint; for a user-side fix without ``reveal`` (and with ``shown``:
    the visible readings, agent and user runs), diagnostic-first (``_visible_step``)."""
    if action.side == "user":
      if reveal or shown is None:
        return f"ask the user to run {self._device_phrase(action.name, action.arguments, seen, reveal)} on their phone"
      step = self._visible_step(action.name, action.arguments, seen, *shown)
      if step is None:
        return (f"ask the user what else they see on their phone (their last report shows "
                f"{FIX_RULES[action.name].words} fine)")
      return f"ask the user to run {step} on their phone"
    if action.name == TRANSFER_TOOL:
      return f"call {TRANSFER_TOOL} with a summary of the issue, then tell the user they are being transferred"
    if reveal:
      return f"call {self._plain_phrase(action)}"
    hidden = [k for k, v in action.arguments.items() if k not in FREE_TEXT_ARGS and not visible_value(v, seen)]
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
