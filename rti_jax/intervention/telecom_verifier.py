"""Rule-based Verifier for tau2-Telecom: the integrity checks of App. A.1 / D.2, no LLM.

On the correction u~_k (its ``<think>`` block too: those tokens are trained on); rejects:
  * ``leak``: wording that refers to a hidden reference, supervisor or feedback;
  * ``leaked_value``: a name, a backend id (customer / line / bill / plan), a phone number,
    a usage figure, an amount or any other value that no user or tool message has shown
    (App. D.2: "John", "L1002", "15.1 GB" the user never said). Two layers: the value shapes
    below (any id, phone number or figure the conversation has not shown), and the privileged
    values themselves (``privileged.telecom_privileged``: the evidence, the task's initial state
    and the backend records, minus what the conversation or the policy shows), found
    in any spelling (``leaks``: "john", "l-1002", "555.123.2002", "fifteen point one", the
    e-mail, the card digits, the street address) in the reply and in every call argument;
  * ``hallucinated_tool_result``: the reply writes a tool response or the user's report
    itself, or claims a lookup or an agent action that did not happen;
  * ``fix_without_diagnostic``: the reply asks the user for a device fix (by tool name or in plain
    words, in its content or its reasoning, or as its own device call) that no visible output
    justifies: no check the user reported has shown the setting it changes in the faulty state,
    or the last one showed it fine (``telecom_fixes.FIX_RULES``). Which fix a task needs is
    written in the evidence (its gold ``user_actions``, its initial state); a correction that
    names it unseen carries the evidence into the trajectory. ``reboot_device`` needs no check;
  * ``malformed_reply``: no usable message or tool call (empty, or a malformed call block);
  * ``not_improved``: the reply itself breaks a Validator hard rule (checked only when the
    reply is otherwise clean).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any, Sequence

from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.intervention.judges import StepContext, VerifierJudgement
from rti_jax.intervention.leaks import LeakScanner, Privileged, numbers_in as all_numbers_in
from rti_jax.intervention.privileged import telecom_privileged
from rti_jax.intervention.telecom_evidence import (
  FIGURE_RE,
  ID_RE,
  PHONE_RE,
  USER_RAN_HEAD_RE,
  agent_runs,
  claim_problems,
  conversation_text,
  default_policy_text,
  figure_visible,
  figures_in,
  norm_value,
  numbers_in,
  phones_in,
)
from rti_jax.intervention.telecom_fixes import unjustified_fixes
from rti_jax.intervention.telecom_validator import TelecomRuleValidator

_LEAK_RE = re.compile(
  r"\b(ground[\s_-]?truth|gold (?:answer|actions?|path|solution)|reference (?:solution|answer|actions?|trajectory|path)|"
  r"(?:the|a) reference\b|standard answer|answer key|labels?\b|evaluation criteria|required actions|expected actions|"
  r"prior draft|previous version|calibrat\w*|supervisor|feedback|hidden (?:answer|solution|information|state)|"
  r"seeing the solution|privileged)",
  re.IGNORECASE,
)
_CAP_WORD_RE = re.compile(r"(?<![\w'’-])([A-Z][a-z]{2,})\b")
#: capitalised words that are never a leaked name
_COMMON_CAPS = frozenset({"The", "This", "That", "These", "Those", "Then", "There", "Please", "Once", "After", "Before",
                          "Since", "Also", "Let", "Now", "Next", "First", "Sure", "Okay", "Thanks", "Thank", "Great",
                          "However", "Yes", "Your", "You", "Our", "What", "When", "Which", "Could", "Would", "Can",
                          "Settings", "Mobile", "Data", "Saver", "Airplane", "Calling", "Roaming", "Network",
                          "Internet", "Android", "Apple", "Messages", "Messaging"})


#: letters and the separators a spelled-out word may put between them ("j Ohn", "Jo-hn")
_FRAGMENT_RE = re.compile(r"[A-Za-z]+")
_GAP_RE = re.compile(r"[\s_.\-\u200b]{1,2}")


def _spells_a_seen_word(text: str, start: int, end: int, seen_words: set[str]) -> bool:
  """Whether the letters ``text[start:end]``, joined with the letter fragments written next to them
  across short separators, spell a word the conversation shows ("j Ohn" for a shown "John").
  At most 8 fragments on each side, read from bounded slices next to the word: the check runs for
  every capitalised word of a reply, so its cost must not grow with the reply's length."""
  left, i = [], start
  while len(left) < 8:
    gap = re.search(r"[\s_.\-\u200b]{1,2}$", text[max(0, i - 2):i])
    frag = gap and re.search(r"[A-Za-z]+$", text[max(0, i - len(gap.group(0)) - 16):i - len(gap.group(0))])
    if not frag:
      break
    left.insert(0, frag.group(0))
    i -= len(gap.group(0)) + len(frag.group(0))
  right, j = [], end
  while len(right) < 8:
    gap = _GAP_RE.match(text, j)
    frag = gap and _FRAGMENT_RE.match(text, gap.end())
    if not frag:
      break
    right.append(frag.group(0))
    j = frag.end()
  word = text[start:end]
  return any("".join(left[a:] + [word] + right[:b]).lower() in seen_words
             for a in range(len(left) + 1) for b in range(len(right) + 1) if a < len(left) or b > 0)


@functools.lru_cache(maxsize=1)
def backend_names() -> frozenset[str]:
  """Every word (>= 3 letters) of a customer's name in the agent DB: never to be said
  before the user or a lookup has shown it."""
  from rti_jax.envs.telecom import state as st

  words = set()
  for c in st.load_db().get("customers", []):
    words.update(w for w in re.findall(r"[A-Za-z]{3,}", str(c.get("full_name", ""))))
  return frozenset(words)


class TelecomRuleVerifier:
  """Rule-based Verifier (see module docstring).

  policy: the system text the policy sees (default: the full telecom policy); words it
    contains are vocabulary, never a leaked name.
  check_rules: also reject a correction that itself breaks a Validator hard rule
    (``not_improved``: not consistent with the gold requirement, Sec. 4.1 (i)).
  check_fixes: reject a device fix that no visible output has shown a need for
    (``fix_without_diagnostic``); False gives the Verifier without that rule.
  """

  def __init__(self, policy: str | None = None, check_rules: bool = True, check_fixes: bool = True) -> None:
    self.policy = default_policy_text() if policy is None else policy
    self.check_rules = check_rules
    self.check_fixes = check_fixes
    self._validator = TelecomRuleValidator(self.policy)
    self._policy_words = frozenset(re.findall(r"[a-z]+", self.policy.lower()))
    self._policy_figures = frozenset(figures_in(self.policy))
    self._policy_numbers = frozenset(abs(v) for v, _ in all_numbers_in(self.policy))
    self._cut_by_policy: dict[tuple[frozenset[Any], frozenset[Any]], Privileged] = {}

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
    unjustified = unjustified_fixes(ctx, text) if self.check_fixes else []
    if unjustified:
      reasons.append("fix_without_diagnostic")
      notes.append("The reply " + "; it ".join(u.why for u in unjustified) + ".")
    if self.check_rules and not reasons:
      still = self._validator.judge(dataclasses.replace(ctx, draft=text))
      if not still.is_valid:
        reasons.append("not_improved")
        notes.append(f"the reply still breaks a hard rule ({', '.join(still.error_types)}).")
    if reasons:
      return VerifierJudgement(ok=False, reasons=tuple(reasons), diagnosis=" ".join(notes))
    return VerifierJudgement(ok=True, diagnosis="Derivable from the visible conversation; no leak, no fabricated result, "
                                                "no fix the conversation has not shown a need for.")

  def leaked_values(self, ctx: StepContext, text: str) -> list[str]:
    """Values in ``text`` (reasoning, content and call arguments) that no user or tool
    message shows: ids, phone numbers, figures, names."""
    seen = conversation_text(ctx)
    low = seen.lower()
    out: list[str] = []
    out += [i for i in ID_RE.findall(text) if i.lower() not in low]
    phones = phones_in(seen)
    out += [p.group(0) for p in PHONE_RE.finditer(text) if norm_value(p.group(0)) not in phones]
    # A figure is visible when a user or tool message shows its number (coarse: tool outputs are
    # JSON, so units are not matched), or the tool list or the policy, which the policy sees, shows
    # the same figure with its unit ("at most 2 GB").
    tools = json.dumps(list(ctx.tools), ensure_ascii=False)
    prose = figures_in(tools) | self._policy_figures
    seen_numbers = numbers_in(seen)
    for f in FIGURE_RE.finditer(PHONE_RE.sub(" ", text)):
      if not figure_visible(f.group(0), seen_numbers) and not (figures_in(f.group(0)) <= prose):
        out.append(f.group(0))
    vocab_words = self._policy_words | set(re.findall(r"[a-z]+", (seen + "\n" + tools).lower()))
    hidden_names = backend_names() | _names_in_evidence(ctx.evidence)
    seen_words = set(re.findall(r"[a-z]+", low))
    out += [w for w in re.findall(r"[A-Za-z]{3,}", text) if w in hidden_names and w.lower() not in seen_words]
    for m in _CAP_WORD_RE.finditer(text):
      word = m.group(1)
      before = m.start()  # text[:before].rstrip(), without copying the text before every word
      while before > 0 and text[before - 1].isspace():
        before -= 1
      sentence_start = before == 0 or text[before - 1] in ".!?:>\n-—\"'(" or text.endswith("---", 0, before)
      if (not sentence_start and word not in _COMMON_CAPS and word.lower() not in vocab_words
          and not _spells_a_seen_word(text, m.start(1), m.end(1), seen_words)):
        out.append(word)
    for leak in self.privileged_leaks(ctx, text):
      written = leak.written.strip()
      if not any(written in o for o in out):
        out.append(written)
    return list(dict.fromkeys(out))

  def privileged(self, ctx: StepContext) -> Privileged:
    """The privileged values of ``ctx`` that neither the conversation nor the policy shows (the tool
    schemas' example ids, "an id like 'C1001'", show no customer's id)."""
    every = telecom_privileged(ctx.evidence)
    key = (frozenset(every.strings), frozenset(every.numbers))
    cut = self._cut_by_policy.get(key)
    if cut is None:
      if len(self._cut_by_policy) > 256:
        self._cut_by_policy.clear()
      cut = self._cut_by_policy[key] = every.minus_visible([self.policy])
    return cut.minus_visible([conversation_text(ctx)])

  def privileged_leaks(self, ctx: StepContext, text: str) -> list[Any]:
    """``leaks.Leak`` of each privileged value ``text`` holds (the reply and its decoded call arguments)."""
    shown = [v for v, _ in all_numbers_in(conversation_text(ctx))] + list(self._policy_numbers)
    scanner = LeakScanner(self.privileged(ctx), shown)
    return scanner.scan(text, [c.arguments for c in parse_assistant_turn(text).tool_calls])

  def fabricated_results(self, ctx: StepContext, text: str) -> list[str]:
    """Why ``text`` writes or claims results that did not happen (empty when it does not)."""
    out = []
    if "<tool_response>" in text or re.search(r"^\s*(?:tool|user)\s*:", text, re.IGNORECASE | re.MULTILINE):
      out.append("writes a tool response or a user turn itself.")
    if USER_RAN_HEAD_RE.search(text):
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
