"""Teaching a policy to play its own Validator and Verifier (self-intervention, Sec. 4.1), and
measuring how well it does.

The questions are the ones the judges meet in training: every step of intervened rollouts of the
policy itself (Algorithm 1 lines 9-23, the policy as Corrector, rule roles deciding), on tasks of one
split. Each is recorded as a ``JudgeStep``: the role's prompt (``intervention.prompting``, the
environment's ``JudgePrompts``) and the environment's rule oracle's verdict, which reads the evidence
l exactly. Train-split steps become SFT examples (prompt -> the oracle's verdict as the role's JSON),
test-split steps measure agreement (``agreement``).

* Answers: the Validator's JSON carries the oracle's ``is_valid``, ``error_types``, ``diagnosis`` and a
  ``suggest_next`` that is the oracle's visible-only suggestion (``suggestion="visible"``, what the
  feedback-only Corrector message shows: an LLM Validator writes one suggestion and the message shows
  it as written) or the one built from l (``"evidence"``, for the paper's Corrector, which must
  conceal it). The Verifier's carries ``ok``, ``reasons`` and ``diagnosis``.
* The chat is the judges' own (``judge_formatter``: the policy's tokenizer, no tools), laid out as
  ``JudgeLLM.ask`` lays out its question, so the trained tokens are exactly the ones a judge writes.
* ``frequent_pretokens``: the pre-tokens that the judges' prompts and answers repeat (the templates'
  wording, the oracles' phrases); making each one token (``tokenizer.add_whole_pretokens``) shortens
  a prompt that a tiny tokenizer spells letter by letter to fit the policy's context.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any, Callable, Sequence

import numpy as np

from rti_jax.intervention.judges import (StepContext, ValidatorJudgement, VerifierJudgement, parse_validator,
                                         parse_verifier)
from rti_jax.intervention.prompting import validator_prompt, verifier_prompt
from rti_jax.policy.sft_example import SFTExample
from rti_jax.rollout import ChatFormatter

ROLES = ("validator", "verifier")
SUGGESTIONS = ("visible", "evidence")


@dataclasses.dataclass(frozen=True)
class JudgeStep:
  """One question to a judge with the rule oracle's answer.

  role: "validator" (``corrected`` is None) or "verifier" (``corrected``: the rewrite under review).
  truth: the oracle's ``ValidatorJudgement`` / ``VerifierJudgement``.
  """

  role: str
  ctx: StepContext
  truth: Any
  corrected: str | None = None

  def prompt(self) -> str:
    return validator_prompt(self.ctx) if self.role == "validator" else verifier_prompt(self.ctx, self.corrected or "")


class RecordingRoles:
  """A Validator and a Verifier that answer with ``validator`` / ``verifier`` (the rule oracles)
  and keep every question with its answer in ``steps``, in call order; with a ``corrector``, also
  every correction prompt p_cal with the ids the Corrector sampled from it (``corrections``)."""

  def __init__(self, validator: Any, verifier: Any, corrector: Any = None) -> None:
    self.validator, self.verifier, self.corrector = validator, verifier, corrector
    self.steps: list[JudgeStep] = []
    self.corrections: list[tuple[list[int], list[int]]] = []

  def correct(self, ctxs: Sequence[StepContext], judgements: Sequence[Any], cal_prompts: Sequence[Sequence[int]],
              seed: int) -> list[Any]:
    out = self.corrector.correct(ctxs, judgements, cal_prompts, seed)
    self.corrections += [(list(map(int, p)), list(c.token_ids)) for p, c in zip(cal_prompts, out) if c.token_ids]
    return out

  def validate(self, ctxs: Sequence[StepContext]) -> list[ValidatorJudgement]:
    out = self.validator.validate(ctxs)
    self.steps += [JudgeStep("validator", c, j) for c, j in zip(ctxs, out)]
    return out

  def verify(self, ctxs: Sequence[StepContext], corrected: Sequence[str]) -> list[VerifierJudgement]:
    out = self.verifier.verify(ctxs, corrected)
    self.steps += [JudgeStep("verifier", c, j, u) for c, u, j in zip(ctxs, corrected, out)]
    return out


def record_steps(tasks: Sequence[Any], env_factory: Callable[[], Any], backend: Any, formatter: ChatFormatter,
                 rule_roles: tuple[Any, Any], intervention_config: Any, rollout_config: Any, *,
                 task_id: Callable[[Any], str], seed: int, corrector_temperature: float | None = None,
                 corrections: list[tuple[list[int], list[int]]] | None = None) -> list[JudgeStep]:
  """The judges' questions of one intervened rollout per task (``run_intervened_rollouts``: the
  policy drafts every step and rewrites flagged ones; ``rule_roles`` decide), with their answers.

  corrector_temperature: the Corrector samples at this temperature (default: the rollout's).
  corrections: where given, gets every (correction prompt p_cal, sampled correction ids).
  """
  from rti_jax.intervention import InterventionRoles, InterventionStats, PolicyCorrector, run_intervened_rollouts

  sampling = rollout_config.sampling if corrector_temperature is None else dataclasses.replace(
    rollout_config.sampling, temperature=corrector_temperature)
  rec = RecordingRoles(*rule_roles, corrector=PolicyCorrector(backend, sampling, formatter.end_of_turn_id))
  roles = InterventionRoles(validator=rec, verifier=rec, corrector=rec)
  cfg = dataclasses.replace(intervention_config, num_intervened_rollouts=1)
  run_intervened_rollouts(list(tasks), env_factory, backend, formatter, roles, cfg, rollout_config,
                          InterventionStats(), task_id=task_id, seed=seed)
  if corrections is not None:
    corrections += rec.corrections
  return rec.steps


def validator_answer(truth: ValidatorJudgement, suggestion: str = "visible") -> str:
  """The oracle's verdict as the Validator's JSON (module docstring)."""
  if suggestion not in SUGGESTIONS:
    raise ValueError(f"suggestion: expected one of {SUGGESTIONS}, got {suggestion!r}")
  hint = "" if truth.is_valid else (truth.feedback_suggestion if suggestion == "visible" else truth.suggest_next)
  return json.dumps({"is_valid": truth.is_valid, "error_types": list(truth.error_types), "diagnosis": truth.diagnosis,
                     "suggest_next": hint}, ensure_ascii=False)


def verifier_answer(truth: VerifierJudgement) -> str:
  """The oracle's verdict as the Verifier's JSON."""
  return json.dumps({"ok": truth.ok, "reasons": list(truth.reasons), "diagnosis": truth.diagnosis}, ensure_ascii=False)


def answer(step: JudgeStep, suggestion: str = "visible") -> str:
  return validator_answer(step.truth, suggestion) if step.role == "validator" else verifier_answer(step.truth)


def judge_formatter(policy_formatter: ChatFormatter) -> ChatFormatter:
  """The judges' chat for a policy (``pipeline.make_roles`` under self-intervention): its
  tokenizer and turn end, no tools."""
  return ChatFormatter(policy_formatter.tokenizer, end_of_turn=policy_formatter.end_of_turn)


def example(fmt: ChatFormatter, step: JudgeStep, suggestion: str = "visible", max_len: int | None = None
            ) -> SFTExample | None:
  """The judge's question (one user turn, as ``JudgeLLM.ask`` sends it) -> the oracle's answer,
  trained on the answer only; None when longer than ``max_len`` tokens."""
  prompt = fmt.prompt_ids([{"role": "user", "content": step.prompt()}])
  turn = fmt.encode_assistant(answer(step, suggestion))
  if max_len is not None and len(prompt) + len(turn) > max_len:
    return None
  return SFTExample("judge", step.role, tuple(prompt + turn), tuple([False] * len(prompt) + [True] * len(turn)))


def verdict(step: JudgeStep) -> bool:
  """True where the oracle objects: the Validator flags the step, the Verifier rejects the rewrite."""
  return not step.truth.is_valid if step.role == "validator" else not step.truth.ok


def balanced(steps: Sequence[JudgeStep], rng: np.random.Generator, accept_per_objection: float = 1.0
             ) -> list[JudgeStep]:
  """Per role every step the oracle objects to, and at most ``accept_per_objection`` times as many
  of the others (drawn at random: most drafts are fine), in the order given."""
  keep: list[int] = []
  for role in ROLES:
    idx = [i for i, s in enumerate(steps) if s.role == role]
    objected = [i for i in idx if verdict(steps[i])]
    fine = [i for i in idx if not verdict(steps[i])]
    n = min(len(fine), int(round(accept_per_objection * max(len(objected), 1))))
    keep += objected + [fine[int(j)] for j in rng.choice(len(fine), size=n, replace=False)] if fine else objected
  return [steps[i] for i in sorted(keep)]


def frequent_pretokens(tokenizer: Any, texts: Sequence[str], min_share: float, min_pieces: int = 2) -> list[str]:
  """The pre-tokens (as raw text) found in at least ``min_share`` of ``texts`` that ``tokenizer``
  splits into at least ``min_pieces`` tokens, most widespread first."""
  pre, model = tokenizer.backend_tokenizer.pre_tokenizer, tokenizer.backend_tokenizer.model
  seen: collections.Counter[str] = collections.Counter()
  form: dict[str, str] = {}
  for text in texts:
    here = {}
    for p, (a, b) in pre.pre_tokenize_str(text):
      here.setdefault(p, text[a:b])
    seen.update(here.keys())
    for p, raw in here.items():
      form.setdefault(p, raw)
  floor = min_share * len(texts)
  return [form[p] for p, n in seen.most_common() if n >= floor and len(model.tokenize(p)) >= min_pieces]


def grow_tokenizer(tok: Any, candidates: Sequence[str], agent_texts: Sequence[str], max_rounds: int = 50
                   ) -> tuple[Any, list[str], dict[int, list[int]]]:
  """``tok`` with each of ``candidates`` (raw texts, one pre-token each) made one token, leaving the
  encoding of every pre-token of ``agent_texts`` (what the policy reads and writes as the agent:
  system prompt, requests, tool results, its turns) exactly as it was; (the new tokenizer, the
  candidates kept, {new id: the old ids of its pieces}, the rows ``sft.grow_vocabulary`` starts it
  from). A candidate whose merges would change an agent pre-token's pieces is dropped."""
  from rti_jax.policy.tokenizer import add_whole_pretokens

  pre, model = tok.backend_tokenizer.pre_tokenizer, tok.backend_tokenizer.model
  agent = {p for text in agent_texts for p, _ in pre.pre_tokenize_str(text)}
  before = {p: [t.value for t in model.tokenize(p)] for p in agent}
  vocab = tok.get_vocab()

  def pieces(text: str) -> list[list[str]]:
    return [[t.value for t in model.tokenize(p)] for p, _ in pre.pre_tokenize_str(text)]

  def merged(text: str) -> set[str]:
    """The strings the left-to-right merges of ``text``'s pieces make."""
    return {"".join(ps[:k]) for ps in pieces(text) for k in range(2, len(ps) + 1)}

  kept = list(dict.fromkeys(candidates))
  for _ in range(max_rounds):
    new, _ = add_whole_pretokens(tok, kept)
    m = new.backend_tokenizer.model
    bad: set[str] = set()
    for p in agent:
      got = [t.value for t in m.tokenize(p)]
      if got != before[p]:
        bad |= set(got) - set(before[p])
    if not bad:
      like = {new.convert_tokens_to_ids("".join(ps[:k])): [vocab[x] for x in ps[:k]]
              for text in kept for ps in pieces(text) for k in range(2, len(ps) + 1) if "".join(ps[:k]) not in vocab}
      return new, kept, like
    left = [c for c in kept if not merged(c) & bad]
    if len(left) == len(kept):
      raise RuntimeError(f"grow_tokenizer: agent pre-tokens change through tokens {sorted(bad)[:5]} no candidate makes")
    kept = left
  raise RuntimeError(f"grow_tokenizer: agent pre-tokens still change after {max_rounds} rounds")


def _rates(pairs: Sequence[tuple[bool, bool]]) -> dict[str, float | int]:
  """Precision and recall of the positive class over (truth, predicted) pairs."""
  tp = sum(t and p for t, p in pairs)
  fp = sum(p and not t for t, p in pairs)
  fn = sum(t and not p for t, p in pairs)
  return {"positives": tp + fn, "predicted": tp + fp, "precision": tp / (tp + fp) if tp + fp else float("nan"),
          "recall": tp / (tp + fn) if tp + fn else float("nan")}


def parse_answer(step: JudgeStep, text: str | None) -> Any:
  """The judge's answer text as the pipeline reads it (None: not asked, over its context)."""
  if text is None:
    return None
  return parse_validator(text) if step.role == "validator" else parse_verifier(text)


def agreement(steps: Sequence[JudgeStep], texts: Sequence[str | None]) -> dict[str, Any]:
  """How the judge's answers ``texts`` agree with the oracles on ``steps``, per role.

  validator: precision / recall of "invalid", and of each error type the oracle names;
  verifier: of "reject", and per reason. An answer that does not parse counts as the pipeline's
  fallback (keep the draft / reject) and in ``malformed``; a question over the judge's context
  counts in ``over_context`` and is left out of the rates.
  """
  out: dict[str, Any] = {}
  for role in ROLES:
    rows = [(s, parse_answer(s, t)) for s, t in zip(steps, texts) if s.role == role]
    asked = [(s, a) for s, a in rows if a is not None]
    res: dict[str, Any] = {"questions": len(rows), "over_context": len(rows) - len(asked),
                           "malformed": sum(a.malformed for _, a in asked),
                           "malformed_rate": sum(a.malformed for _, a in asked) / len(asked) if asked else float("nan")}
    if role == "validator":
      res["invalid"] = _rates([(not s.truth.is_valid, not a.is_valid) for s, a in asked])
      kinds = sorted({k for s, _ in asked for k in s.truth.error_types})
      res["by_type"] = {k: _rates([(k in s.truth.error_types, (not a.is_valid) and k in a.error_types) for s, a in asked])
                        for k in kinds}
    else:
      res["reject"] = _rates([(not s.truth.ok, not a.ok) for s, a in asked])
      kinds = sorted({k for s, _ in asked for k in s.truth.reasons})
      res["by_reason"] = {k: _rates([(k in s.truth.reasons, (not a.ok) and k in a.reasons) for s, a in asked])
                          for k in kinds}
    res["accuracy"] = (sum(verdict(s) == (not a.is_valid if role == "validator" else not a.ok) for s, a in asked)
                       / len(asked) if asked else float("nan"))
    out[role] = res
  return out
