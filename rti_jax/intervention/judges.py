"""The MAS roles of Sec. 4.1: Validator, Corrector, Verifier (LLM-backed), and their data.

* ``StepContext`` is what every role sees for step k of an intervened rollout: the
  user query, the observable history h_{1:k-1}, the draft u^_k, the tool schemas and
  the reward-side evidence l (privileged).
* LLM-backed roles render the prompt templates in ``prompts/`` (the inputs, rules and JSON
  output of App. A.1, in the project's own words), generate with a ``GenerationBackend``
  (the policy itself by default, i.e. self-intervention, or a separate endpoint, Sec. 5.5)
  and parse JSON tolerantly (``<think>`` blocks, code fences, text around the object).
* A malformed or incomplete judgement gets a conservative default and is flagged
  (``malformed=True``) so ``InterventionStats`` counts it:
    - Validator: ``is_valid=True`` (no intervention; the draft is kept);
    - Corrector: no correction (the draft is kept);
    - Verifier: ``ok=False`` (reject; nothing unverified enters training).
* ``PolicyCorrector`` is the trainer's Corrector: the policy samples its next step directly
  from the correction prompt p_cal (the rollout prompt plus one correction message,
  ``prompting.correction_message``: the paper Corrector's inputs, evidence l included and to
  be concealed, or the feedback-only one), so the corrected step is in the policy's own
  format and log pi_cal is scored under the very prompt it was sampled from (Eq. 5).
* ``LLMCorrector`` (``make_roles(corrector="llm")``) has a judge write App. A.1's JSON from its
  own prompt; that text is re-encoded in the agent format, so its log pi_cal is the policy's
  under p_cal, not the judge's probability of its JSON.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Protocol, Sequence

import numpy as np

from rti_jax.envs.tool_calls import MAX_JSON_DEPTH, json_nesting_depths, loads_json, strip_reasoning
from rti_jax.generation.base import GenerationBackend, SamplingParams
from rti_jax.intervention.prompting import (_as_str, corrector_prompt, feedback_message,  # noqa: F401
                                            history_json, load_template, paper_correction_message, render,
                                            tools_json, validator_prompt, verifier_prompt)

Message = dict[str, Any]



# --- data -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepContext:
  """The inputs of every role at step k (Sec. 4.1).

  user_query: the task's user question x.
  history: observable history h_{1:k-1} as chat messages (system prompt excluded).
  draft: the policy's draft u^_k (assistant text).
  tools: the agent's tool schemas T.
  evidence: reward-side evidence l (privileged; only Validator/Corrector prompts see it).
  domain: the registered environment name (``rti_jax.envs.registry``): its judge prompts.
  """

  user_query: str
  history: tuple[Message, ...]
  draft: str
  tools: tuple[dict[str, Any], ...]
  evidence: dict[str, Any]
  domain: str


@dataclasses.dataclass(frozen=True)
class ValidatorJudgement:
  """``{is_valid, error_types, diagnosis, suggest_next}`` (Validator output).

  suggest_next: the direction of repair, built from the reward-side evidence l as the paper's
    Validator builds it (it may name privileged values: the right city of a stop, a line id, the
    fix); the paper's Corrector reads it together with l and must conceal both.
  visible_suggest_next: the same direction restricted to what the conversation shows (the rule
    Validators write both), for the feedback-only Corrector; None when the Validator wrote only
    one suggestion (an LLM Validator), which is then used as it is (``feedback_suggestion``).
  """

  is_valid: bool
  error_types: tuple[str, ...] = ()
  diagnosis: str = ""
  suggest_next: str = ""
  malformed: bool = False
  visible_suggest_next: str | None = None
  over_context: bool = False  # the judge's prompt did not fit its context budget: not asked, draft kept

  @property
  def feedback_suggestion(self) -> str:
    """The suggestion the feedback-only Corrector is shown (visible-only where the Validator wrote one)."""
    return self.suggest_next if self.visible_suggest_next is None else self.visible_suggest_next


@dataclasses.dataclass(frozen=True)
class Correction:
  """A corrected step u~_k. ``text`` is agent-format text; ``token_ids`` are set when
  the policy sampled it directly (PolicyCorrector). ``text is None`` = no correction."""

  text: str | None
  token_ids: tuple[int, ...] | None = None
  malformed: bool = False


@dataclasses.dataclass(frozen=True)
class VerifierJudgement:
  """``{ok, reasons, diagnosis}`` (Verifier output)."""

  ok: bool
  reasons: tuple[str, ...] = ()
  diagnosis: str = ""
  malformed: bool = False
  over_context: bool = False  # the judge's prompt did not fit its context budget: not asked, rejected


class Validator(Protocol):
  def validate(self, ctxs: Sequence[StepContext]) -> list[ValidatorJudgement]: ...


class Corrector(Protocol):
  def correct(
    self,
    ctxs: Sequence[StepContext],
    judgements: Sequence[ValidatorJudgement],
    cal_prompts: Sequence[Sequence[int]],
    seed: int,
  ) -> list[Correction]: ...


class Verifier(Protocol):
  def verify(self, ctxs: Sequence[StepContext], corrected: Sequence[str]) -> list[VerifierJudgement]: ...


# --- tolerant JSON ------------------------------------------------------------------------

_FENCE_RE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
# Where a JSON object can start: "{", JSON whitespace, then a key or "}" (json fails on anything else).
_OBJECT_START_RE = re.compile(r'\{[ \t\n\r]*["}]')
#: Characters the object search may spend on failed starts, per character of its text; past
#: that it stops retrying starts inside a failed candidate, so adversarial text stays linear.
RESCAN_FACTOR = 8


def _int_or_float(literal: str) -> int | float:
  """A JSON integer literal; one past Python's int-string limit reads as a float (inf)."""
  try:
    return int(literal)
  except ValueError:
    return float(literal)


_DECODER = json.JSONDecoder(parse_int=_int_or_float)


def _first_object(text: str) -> dict[str, Any] | None:
  """The JSON object at the first ``{`` of ``text`` that starts one (at most
  ``MAX_JSON_DEPTH`` deep), or None.

  Linear time: the depth check scans each bracket once per reading of the quotes, and failed
  starts may rescan at most ``RESCAN_FACTOR`` characters per character of ``text``; after
  that, only starts past the last failure are tried (so on such text an object inside a
  failed candidate may be missed).
  """
  budget = RESCAN_FACTOR * len(text) + 4096
  resume = 0
  deepest: dict[int, int | None] | None = None
  if text.count("{") + text.count("[") > MAX_JSON_DEPTH:
    deepest = {}
  for m in _OBJECT_START_RE.finditer(text):
    start = m.start()
    if start < resume:
      continue
    too_deep = None
    if deepest is not None:
      if start not in deepest:
        found, scanned = json_nesting_depths(text, MAX_JSON_DEPTH, start)
        deepest.update(found)
        budget -= scanned - start
      too_deep = deepest[start]
    if too_deep is not None:
      end = too_deep
      budget -= 1
    else:
      try:
        obj, end = _DECODER.raw_decode(text, start)
      except json.JSONDecodeError as e:
        end = e.pos
      except (ValueError, RecursionError):
        end = len(text)
      else:
        if isinstance(obj, dict):
          return obj
      budget -= max(end - start, 1)
    if budget < 0:
      resume = end
  return None


def parse_json_object(text: str) -> dict[str, Any] | None:
  """The first JSON object in ``text``, or None; never raises, linear time.

  Tolerates ``<think>`` blocks, code fences, text before/after the object and
  Python-style ``True``/``False``/``None`` literals. Prefers a fenced block. An object
  nested deeper than ``MAX_JSON_DEPTH`` levels is not read; an integer literal too long
  for ``int`` reads as a float.
  """
  if not isinstance(text, str):
    return None
  body = strip_reasoning(text)  # closed blocks, and reasoning the generation prompt opened (Thinking-2507)
  if "<think>" in body and "</think>" not in body:
    body = body.split("<think>", 1)[0] or body.split("<think>", 1)[1]
  candidates = [m.group(1) for m in _FENCE_RE.finditer(body)] + [body]
  for cand in candidates:
    for variant in (cand, _pythonish_to_json(cand)):
      obj = _first_object(variant)
      if obj is not None:
        return obj
  return None


def _pythonish_to_json(s: str) -> str:
  return re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", re.sub(r"\bNone\b", "null", s)))


def as_bool(value: Any) -> bool | None:
  """``true/false`` in the usual spellings, else None."""
  if isinstance(value, bool):
    return value
  if isinstance(value, (int, float)) and value in (0, 1):
    return bool(value)
  if isinstance(value, str):
    v = value.strip().lower()
    if v in ("true", "yes", "valid", "ok", "1"):
      return True
    if v in ("false", "no", "invalid", "0"):
      return False
  return None


def _as_str_tuple(value: Any) -> tuple[str, ...]:
  if value is None:
    return ()
  if isinstance(value, str):
    return (value,) if value.strip() else ()
  if isinstance(value, (list, tuple)):
    return tuple(str(v) for v in value if str(v).strip())
  return (str(value),)




def parse_validator(text: str) -> ValidatorJudgement:
  """Validator JSON -> judgement; malformed or missing ``is_valid`` -> valid (draft kept)."""
  obj = parse_json_object(text)
  valid = as_bool(obj.get("is_valid")) if obj else None
  if obj is None or valid is None:
    return ValidatorJudgement(is_valid=True, diagnosis="unparseable validator output", malformed=True)
  return ValidatorJudgement(
    is_valid=valid,
    error_types=_as_str_tuple(obj.get("error_types")),
    diagnosis=_as_str(obj.get("diagnosis")),
    suggest_next=_as_str(obj.get("suggest_next")),
  )


def parse_verifier(text: str) -> VerifierJudgement:
  """Verifier JSON -> judgement; malformed or missing ``ok`` -> reject."""
  obj = parse_json_object(text)
  ok = as_bool(obj.get("ok")) if obj else None
  if obj is None or ok is None:
    return VerifierJudgement(ok=False, reasons=("malformed_judgement",), malformed=True)
  return VerifierJudgement(ok=ok, reasons=_as_str_tuple(obj.get("reasons")), diagnosis=_as_str(obj.get("diagnosis")))


def parse_corrector(text: str) -> tuple[str, list[dict[str, Any]], str] | None:
  """Corrector JSON -> ``(reasoning, tool_calls, content)``; None when unusable.

  Unusable: no object, no tool call and no content, or a tool call without a name.
  ``arguments`` given as a JSON string are decoded.
  """
  obj = parse_json_object(text)
  if obj is None:
    return None
  reasoning = _as_str(obj.get("reasoning"))
  content = _as_str(obj.get("content"))
  raw_calls = obj.get("tool_calls") or []
  if isinstance(raw_calls, dict):
    raw_calls = [raw_calls]
  if not isinstance(raw_calls, list):
    return None
  calls = []
  for c in raw_calls:
    if not isinstance(c, dict):
      return None
    fn = c.get("function") if isinstance(c.get("function"), dict) else c
    name = fn.get("name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
      args, error = loads_json(args, "arguments") if args.strip() else ({}, "")
      if error:
        return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
      return None
    calls.append({"name": name, "arguments": args})
  if not calls and not content.strip():
    return None
  return reasoning, calls, content


# --- LLM-backed roles -------------------------------------------------------------------------


#: What a role answers for a step whose judge prompt does not fit the judge's context budget.
OVER_CONTEXT_VALIDATION = ValidatorJudgement(is_valid=True, diagnosis="judge prompt over the context budget",
                                             over_context=True)
OVER_CONTEXT_VERDICT = VerifierJudgement(ok=False, reasons=("over_context",),
                                         diagnosis="judge prompt over the context budget", over_context=True)


class JudgeLLM:
  """Asks a chat model: each prompt is one user message; greedy by default.

  backend: the policy's backend (self-intervention) or a separate endpoint.
  formatter: a ``rollout.ChatFormatter`` for that model's tokenizer (no tools).
  max_context_tokens: prompt + answer budget of the judge model; a prompt longer than this minus
    the answer budget (``params.max_new_tokens``) is not sent: its answer is None, and the role
    skips the step (the Validator keeps the draft, the Verifier rejects), counted as over context.
  """

  def __init__(
    self,
    backend: GenerationBackend,
    formatter: Any,
    params: SamplingParams | None = None,
    max_context_tokens: int | None = None,
  ) -> None:
    self.backend = backend
    self.formatter = formatter
    base = params or SamplingParams(max_new_tokens=1024, temperature=0.0)
    stops = tuple(dict.fromkeys(tuple(base.stop_token_ids) + tuple(formatter.stop_token_ids)))
    self.params = dataclasses.replace(base, stop_token_ids=stops)
    self.max_context_tokens = max_context_tokens

  def ask(self, prompts: Sequence[str], seed: int = 0) -> list[str | None]:
    """One answer per prompt (None for a prompt over the budget)."""
    if not prompts:
      return []
    ids = [self.formatter.prompt_ids([{"role": "user", "content": p}]) for p in prompts]
    limit = None if self.max_context_tokens is None else self.max_context_tokens - self.params.max_new_tokens
    send = [i for i, x in enumerate(ids) if limit is None or len(x) <= limit]
    out: list[str | None] = [None] * len(prompts)
    if send:
      comps = self.backend.generate([ids[i] for i in send], self.params, seed)
      for i, c in zip(send, comps):
        out[i] = self.formatter.decode(c.token_ids.tolist())
    return out


class LLMValidator:
  """Validator served by an LLM with its App. A.1-style prompt."""

  def __init__(self, llm: JudgeLLM) -> None:
    self.llm = llm

  def validate(self, ctxs: Sequence[StepContext]) -> list[ValidatorJudgement]:
    return [OVER_CONTEXT_VALIDATION if t is None else parse_validator(t)
            for t in self.llm.ask([validator_prompt(c) for c in ctxs])]


class LLMCorrector:
  """Corrector served by an LLM with its App. A.1-style prompt; its JSON is written in agent format."""

  def __init__(self, llm: JudgeLLM) -> None:
    self.llm = llm

  def correct(
    self,
    ctxs: Sequence[StepContext],
    judgements: Sequence[ValidatorJudgement],
    cal_prompts: Sequence[Sequence[int]],
    seed: int,
  ) -> list[Correction]:
    from rti_jax.rollout import ChatFormatter

    texts = self.llm.ask([corrector_prompt(c, j) for c, j in zip(ctxs, judgements)], seed)
    out = []
    for t in texts:
      parsed = None if t is None else parse_corrector(t)
      if parsed is None:
        out.append(Correction(text=None, malformed=True))
      else:
        out.append(Correction(text=ChatFormatter.assistant_text(*parsed)))
    return out


class LLMVerifier:
  """Verifier served by an LLM with its App. A.1-style prompt."""

  def __init__(self, llm: JudgeLLM) -> None:
    self.llm = llm

  def verify(self, ctxs: Sequence[StepContext], corrected: Sequence[str]) -> list[VerifierJudgement]:
    return [OVER_CONTEXT_VERDICT if t is None else parse_verifier(t)
            for t in self.llm.ask([verifier_prompt(c, u) for c, u in zip(ctxs, corrected)])]


class PolicyCorrector:
  """Self-intervention Corrector: the policy samples u~_k from the correction prompt p_cal
  (``cal_prompts``, built by the pipeline per ``InterventionConfig.corrector``).

  The sample is already in the agent format (it is the policy's own next turn), so
  its ids are kept as they are; an empty sample or one cut by the length limit is
  no correction (``malformed``).
  """

  def __init__(self, backend: GenerationBackend, params: SamplingParams, end_of_turn_id: int) -> None:
    self.backend = backend
    stops = tuple(dict.fromkeys(tuple(params.stop_token_ids) + (int(end_of_turn_id),)))
    self.params = dataclasses.replace(params, stop_token_ids=stops)
    self.end_of_turn_id = int(end_of_turn_id)

  def correct(
    self,
    ctxs: Sequence[StepContext],
    judgements: Sequence[ValidatorJudgement],
    cal_prompts: Sequence[Sequence[int]],
    seed: int,
  ) -> list[Correction]:
    if not cal_prompts:
      return []
    comps = self.backend.generate([list(p) for p in cal_prompts], self.params, seed)
    out = []
    for c in comps:
      ids = np.asarray(c.token_ids).tolist()
      if c.finish_reason != "stop" or len(ids) <= 1:
        out.append(Correction(text=None, malformed=True))
      else:
        out.append(Correction(text="", token_ids=tuple(int(t) for t in ids)))
    return out
