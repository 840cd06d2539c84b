"""Rule-based Validator and Verifier for the tau2 domains (Retail, Airline): no LLM.

They read what the LLM roles read (``StepContext``; evidence = ``Tau2Env.reward_evidence()``).

Validator (reward-oriented: it flags only a draft that leaves every path to the gold outcome; the
reward is the final database and the facts told):
  * ``off_path_write``: a write call (a tool in the evidence's ``write_tools``) whose name and
    arguments match no gold write still to do (nor a gold call that fails on purpose, which changes
    nothing): tau2's tools keep its change, so the database can no longer equal the gold one;
  * ``premature_end``: the draft ends the episode (``###STOP###``, a transfer call, or the transfer
    message) while gold writes remain, or transfers when the task does not;
  * ``missing_information``: the draft ends the episode before the agent told the user a fact
    the task's ``communicate_info`` requires.
  With ``rules="steps"`` (``env.<domain>.validator_rules``) it also flags steps that keep the
  episode going but cannot lead anywhere, as a small policy's failures mostly do:
  * ``fabricated_id``: a call argument naming an id (a key ``*_id``, ``*_ids`` or
    ``*_number``) that no user message or tool reply has shown and no gold call uses (a
    miscopied reservation or item id: the look-up fails, or the write changes the wrong record);
  * ``false_completion``: a message saying the request is done (``is done``, ``has been
    cancelled``, ...) while gold writes remain and no write has succeeded yet.
  Gold replays pass both (tested on every tau2 task and a sample of the generated ones).
  Its ``suggest_next`` names the next gold write with its arguments (privileged); its
  ``visible_suggest_next`` says what to re-check without naming any value.

Verifier (integrity), on the correction; rejects:
  * ``leak``: wording that refers to a hidden reference or feedback;
  * ``leaked_value``: a privileged value, in any spelling (``intervention.leaks``), anywhere in the
    reply or its call arguments. Privileged values = the evidence's (the gold calls' ids, names,
    dates, options and amounts; the facts to tell) minus what the visible conversation (user
    query, history, tool schemas) or the domain's policy texts already show;
  * ``hallucinated_tool_result``: the reply writes a tool response itself;
  * ``malformed_reply``: no usable message or call (empty, or a malformed call block).

Which gold writes are done is read from the history: each assistant turn's calls and the tool
replies that follow it (a reply starting with ``Error`` failed).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Sequence

from rti_jax.envs.tool_calls import ToolCall, parse_assistant_turn
from rti_jax.intervention.judges import (
  StepContext,
  ValidatorJudgement,
  VerifierJudgement,
)
from rti_jax.intervention.leaks import (
  LeakScanner,
  Privileged,
  leaves,
  number_of,
  numbers_in,
)

OFF_PATH_WRITE = "off_path_write"
PREMATURE_END = "premature_end"
MISSING_INFORMATION = "missing_information"
FABRICATED_ID = "fabricated_id"
FALSE_COMPLETION = "false_completion"
RULES = (OFF_PATH_WRITE, PREMATURE_END, MISSING_INFORMATION, FABRICATED_ID, FALSE_COMPLETION)
#: ``Tau2RuleValidator(rules=...)``: outcome = only steps that leave every path to the gold outcome;
#: steps = those and the steps that lead nowhere (``fabricated_id``, ``false_completion``)
VALIDATOR_RULES = ("outcome", "steps")
_ID_KEY_RE = re.compile(r"(?:^|_)(?:id|ids|number)$")
_WORD_RE = re.compile(r"[\w#][\w#@.\-]*\w|\w")  # an id as it stands in text: #W2378156, credit_card_7815826, HAT242
_DONE_RE = re.compile(
    r"\b(?:is|are|has been|have been|was|were)\s+(?:all\s+|now\s+)?(?:done|completed?|cancell?ed|updated|processed|"
    r"booked|modified|exchanged|returned|changed|taken care of)\b", re.IGNORECASE)
STOP = "###STOP###"
_TRANSFER_TEXT_RE = re.compile(r"YOU ARE BEING TRANSFERRED|being transferred to a human", re.IGNORECASE)
_LEAK_RE = re.compile(
    r"\b(ground[\s_-]?truth|gold (?:answer|actions?|calls?|path|solution)|reference (?:solution|answer|actions?|calls?)|"
    r"answer key|evaluation criteria|required actions|expected actions|prior draft|previous version|"
    r"calibrat\w*|supervisor|feedback|hidden (?:answer|solution|information|state)|privileged)\b", re.IGNORECASE)
#: argument keys whose values are free text or labels, not values a correction could leak
_FREE_KEYS = frozenset({"summary", "expression", "requestor", "name", "fails_on_purpose"})


def _canonical(value: Any) -> Any:
  """A JSON value with every list of scalars sorted (tau2 stores item lists sorted)."""
  if isinstance(value, dict):
    return {k: _canonical(v) for k, v in value.items()}
  if isinstance(value, list):
    items = [_canonical(v) for v in value]
    if all(not isinstance(v, (dict, list)) for v in items):
      return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    return items
  return value


def same_call(a_name: str, a_args: Any, b_name: str, b_args: Any) -> bool:
  """Two calls are the same: same tool and arguments (lists of scalars in any order)."""
  return a_name == b_name and _canonical(a_args) == _canonical(b_args)


def history_calls(history: Sequence[dict[str, Any]]) -> list[tuple[ToolCall, bool]]:
  """Every call of the history's assistant turns with whether its tool reply succeeded."""
  out: list[tuple[ToolCall, bool]] = []
  msgs = list(history)
  for i, m in enumerate(msgs):
    if m.get("role") != "assistant":
      continue
    turn = parse_assistant_turn(str(m.get("content") or ""))
    if not turn.tool_calls:
      continue
    replies = []
    for r in msgs[i + 1:]:
      if r.get("role") != "tool":
        break
      replies.append(str(r.get("content") or ""))
    replies = replies[len(turn.errors):]  # the parse errors' replies come first
    for j, call in enumerate(turn.tool_calls):
      ok = j < len(replies) and not replies[j].lstrip().startswith("Error")
      out.append((call, ok))
  return out


def remaining_writes(evidence: dict[str, Any], history: Sequence[dict[str, Any]],
                     calls: Sequence[tuple[ToolCall, bool]] | None = None) -> list[dict[str, Any]]:
  """The evidence's gold writes that no successful call of the history has made yet (``calls``: the
  history's ``history_calls`` when the caller has them already)."""
  done = [c for c, ok in (history_calls(history) if calls is None else calls) if ok]
  left = []
  for w in evidence.get("write_actions", []) or []:
    hit = next((i for i, c in enumerate(done) if same_call(c.name, c.arguments, w.get("name"), w.get("arguments"))), None)
    if hit is None:
      left.append(w)
    else:
      done.pop(hit)
  return left


def _told(evidence: dict[str, Any], texts: Sequence[str]) -> list[str]:
  """The ``communicate_info`` facts no text shows (tau2's rule: a substring, commas dropped)."""
  said = [t.lower().replace(",", "") for t in texts]
  return [c for c in evidence.get("communicate_info", []) or [] if not any(str(c).lower() in t for t in said)]


def _call_text(w: dict[str, Any]) -> str:
  return f"{w.get('name')}({json.dumps(w.get('arguments', {}), ensure_ascii=False, sort_keys=True)})"


def unseen_ids(history: Sequence[dict[str, Any]], calls: Sequence[ToolCall],
               known: Sequence[str] = ()) -> list[tuple[str, str, str]]:
  """``(tool, key, value)`` of every id-like argument of ``calls`` (a key ``*_id``, ``*_ids`` or
  ``*_number``; string values, list items included) that no user message or tool reply of
  ``history`` shows and that is not one of ``known`` (case-insensitive; an id is shown as a whole
  word, so a cut or run-on copy of a shown id is not)."""
  texts = [str(m.get("content") or "").lower() for m in history if m.get("role") in ("user", "tool")]
  words = {w for text in [*texts, *(str(k).lower() for k in known)] for w in _WORD_RE.findall(text)}
  out = []
  for call in calls:
    args = call.arguments if isinstance(call.arguments, dict) else {}
    for key, leaf in leaves(args):
      if key is None or not _ID_KEY_RE.search(key) or not isinstance(leaf, str):
        continue
      value = leaf.strip().lower()
      whole = _WORD_RE.fullmatch(value) is not None
      if not value or not (value in words if whole else any(value in text for text in texts)):
        out.append((call.name, key, leaf))
  return out


class Tau2RuleValidator:
  """The rule Validator of the tau2 domains (see the module docstring); ``rules`` is one of
  ``VALIDATOR_RULES``."""

  def __init__(self, rules: str = "outcome"):
    if rules not in VALIDATOR_RULES:
      raise ValueError(f"rules: expected one of {list(VALIDATOR_RULES)}, got {rules!r}")
    self.rules = rules

  def validate(self, ctxs: Sequence[StepContext]) -> list[ValidatorJudgement]:
    return [self.judge(c) for c in ctxs]

  def judge(self, ctx: StepContext) -> ValidatorJudgement:
    ev = ctx.evidence or {}
    draft = parse_assistant_turn(ctx.draft or "")
    calls = history_calls(ctx.history)
    left = remaining_writes(ev, ctx.history, calls)
    writes = set(ev.get("write_tools", []) or [])
    gold = ev.get("evaluation_criteria", {}).get("actions", []) or []
    errors: list[str] = []
    notes: list[str] = []
    for call in draft.tool_calls:
      if call.name not in writes:
        continue
      if any(same_call(call.name, call.arguments, w.get("name"), w.get("arguments")) for w in left):
        continue
      if any(g.get("fails_on_purpose") and same_call(call.name, call.arguments, g.get("name"), g.get("arguments"))
             for g in gold):
        continue
      errors.append(OFF_PATH_WRITE)
      notes.append(f"the write {call.name} with these arguments is not one the task needs (it would stay in the "
                   "database)")
      break
    transfer_needed = any(a.get("name") == "transfer_to_human_agents" for a in ev.get("agent_actions", []) or [])
    transfers = any(c.name == "transfer_to_human_agents" for c in draft.tool_calls) or (
        not draft.tool_calls and bool(_TRANSFER_TEXT_RE.search(draft.content)))
    ends = transfers or (not draft.tool_calls and STOP in draft.content)
    if ends and (left or (transfers and not transfer_needed)):
      errors.append(PREMATURE_END)
      notes.append("it ends the conversation while the user's request is not complete"
                   if left else "it transfers the user although the request can be handled")
    if ends and not left:
      texts = [str(m.get("content") or "") for m in ctx.history if m.get("role") == "assistant"] + [draft.content]
      untold = _told(ev, texts)
      if untold:
        errors.append(MISSING_INFORMATION)
        notes.append("it ends before the user was told what they asked")
    step_hint: str | None = None  # the visible hint of a step rule
    if self.rules == "steps" and not errors:
      gold_values = [str(leaf) for a in gold for _, leaf in leaves(a.get("arguments", {}))]
      unseen = unseen_ids(ctx.history, draft.tool_calls, gold_values)
      if unseen:
        name, key, value = unseen[0]
        value = value if len(value) <= 40 else value[:40] + "..."  # a runaway literal stays out of the prompts
        errors.append(FABRICATED_ID)
        notes.append(f"the {key} {value!r} of {name} appears in no user message or tool reply")
        step_hint = (f"The {key} {value!r} appears nowhere in the conversation: copy every id exactly as the user "
                     "or a tool reply wrote it, or look it up first.")
      elif (left and not draft.tool_calls and _DONE_RE.search(draft.content)
            and not any(ok and c.name in writes for c, ok in calls)):
        errors.append(FALSE_COMPLETION)
        notes.append("it says the request is done although nothing has been changed yet")
        step_hint = ("Nothing has been changed yet: do not say it is done; propose the change the user asked for, "
                     "with its exact details, and ask for their yes.")
    if not errors:
      return ValidatorJudgement(is_valid=True)
    hint = []
    if left:
      hint.append(f"the next change the task needs is {_call_text(left[0])}")
    untold = _told(ev, [str(m.get("content") or "") for m in ctx.history if m.get("role") == "assistant"])
    if untold:
      hint.append(f"the user must be told: {', '.join(map(str, untold))}")
    if not hint:
      hint.append("no further change is needed: tell the user the outcome and close the conversation")
    visible = ("Do not make that change: re-read the user's request and the details the tools returned, and "
               "propose only the change the user asked for, with the exact ids, after the user's explicit yes."
               if OFF_PATH_WRITE in errors else step_hint or
               "Do not end the conversation yet: check what the user asked for that is not done or not answered.")
    return ValidatorJudgement(is_valid=False, error_types=tuple(dict.fromkeys(errors)), diagnosis="; ".join(notes),
                              suggest_next="; ".join(hint), visible_suggest_next=visible)


@functools.lru_cache(maxsize=8)
def _policy_texts(domain: str) -> str:
  """The domain's policy texts the policy model may see (empty when tau2 is missing)."""
  try:
    from rti_jax.envs.tau2 import bridge
    from rti_jax.envs.tau2.condensed import condensed_policy

    return condensed_policy(domain) + "\n" + bridge.policy_text(domain)
  except (ImportError, ValueError):
    return ""


def tau2_privileged(evidence: dict[str, Any]) -> Privileged:
  """The values of tau2 evidence: every string and number of the gold calls' arguments (ids,
  names, dates, options, amounts) and the facts to tell the user."""
  out = Privileged()
  for action in evidence.get("agent_actions", []) or []:
    for key, leaf in leaves(action.get("arguments", {})):
      if key in _FREE_KEYS:
        continue
      if isinstance(leaf, str):
        out.add_string(leaf, f"the gold value {leaf!r} ({key})")
      else:
        out.add_number(number_of(leaf), f"the gold number {leaf!r} ({key})")
  for fact in evidence.get("communicate_info", []) or []:
    out.add_string(fact, f"the fact to tell {fact!r}")
    for value, _ in numbers_in(str(fact)):
      out.add_number(value, f"the fact to tell {fact!r}")
  return out


class Tau2RuleVerifier:
  """The rule Verifier of the tau2 domains (see the module docstring)."""

  def verify(self, ctxs: Sequence[StepContext], corrected: Sequence[str]) -> list[VerifierJudgement]:
    return [self.judge(c, u) for c, u in zip(ctxs, corrected)]

  def judge(self, ctx: StepContext, corrected: str) -> VerifierJudgement:
    corrected = corrected if isinstance(corrected, str) else ""
    reasons: list[str] = []
    notes: list[str] = []
    m = _LEAK_RE.search(corrected)
    if m:
      reasons.append("leak")
      notes.append(f"mentions {m.group(0)!r}, which is not part of the visible conversation")
    if "<tool_response>" in corrected:
      reasons.append("hallucinated_tool_result")
      notes.append("writes a tool response itself")
    turn = parse_assistant_turn(corrected)
    if turn.errors or not (turn.tool_calls or turn.content.strip()):
      reasons.append("malformed_reply")
      notes.append("has no usable message or tool call")
    visible = [ctx.user_query, json.dumps(list(ctx.tools), ensure_ascii=False, default=str),
               _policy_texts(str(ctx.evidence.get("domain", ctx.domain)))]
    visible += [str(msg.get("content") or "") for msg in ctx.history]
    privileged = tau2_privileged(ctx.evidence or {}).minus_visible(visible)
    shown = (v for text in visible for v, _ in numbers_in(text))
    leaks = LeakScanner(privileged, shown).scan(corrected, [c.arguments for c in turn.tool_calls])
    if leaks:
      reasons.append("leaked_value")
      notes.append("writes " + ", ".join(str(x) for x in leaks[:5]) + ", which the conversation has not shown")
    if reasons:
      return VerifierJudgement(ok=False, reasons=tuple(reasons), diagnosis="; ".join(notes))
    return VerifierJudgement(ok=True)
