"""Measuring the tiny policy's behaviour with the real sampler, rollout engine and
intervention pipeline (no scripted shortcuts).

* ``rollout_behaviour``: pass rates (mean reward), pass@k and the share of all-fail
  groups, separately for tasks that need disambiguation and those that do not.
* ``intervention_behaviour``: on tasks that need disambiguation, intervened rollouts
  (Algorithm 1 lines 9-23) with the rule-based Validator/Verifier and the policy as its
  own Corrector (self-intervention): how often the policy follows the feedback (a
  ``poi_search`` of the suggested name with the suggested region), the Verifier and PPL
  gate (Eq. 3-4) outcomes, the mean PPL_roll of applied corrections, and the success rate.
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

import numpy as np

from rti_jax.envs.navigation import NavigationEnv, NavTask, World
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.generation.base import SamplingParams
from rti_jax.intervention import (InterventionConfig, InterventionRoles, InterventionStats, NavigationRuleValidator,
                                  NavigationRuleVerifier, PolicyCorrector, run_intervened_rollouts)
from rti_jax.rollout import ChatFormatter, RolloutConfig, rollout_groups

_SUGGEST_RE = re.compile(r"Search '(?P<names>.+?)' again with region (?P<region>[A-Za-z]+)")


def load_policy(path: str | os.PathLike) -> tuple[Any, Any, ChatFormatter]:
  """(Flax model, tokenizer, formatter) of a policy checkpoint directory.

  The Navigation system prompt lists the tools itself, so the formatter gets no schemas.
  """
  from transformers import AutoTokenizer

  from models.weights import from_pretrained

  model, _ = from_pretrained(os.fspath(path))
  tok = AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True)
  return model, tok, ChatFormatter(tok)


def rollout_config(group_size: int, temperature: float, max_new_tokens: int = 192, max_context_tokens: int = 2048,
                   seed: int = 0) -> RolloutConfig:
  """Rollout settings sized for the tiny policy (episodes of about 1k tokens)."""
  return RolloutConfig(group_size=group_size, max_context_tokens=max_context_tokens, seed=seed,
                       sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature))


def _pass_at_k(rewards: np.ndarray, k: int) -> float:
  """Unbiased pass@k (Chen et al. estimator) averaged over rows of ``rewards: [N, G]``."""
  n = rewards.shape[1]
  out = []
  for row in rewards:
    c = int((row > 0).sum())
    if n - c < k:
      out.append(1.0)
    else:
      out.append(1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1))))
  return float(np.mean(out)) if out else float("nan")


def rollout_behaviour(backend: Any, formatter: ChatFormatter, world: World, tasks: Sequence[NavTask],
                      group_size: int, temperature: float, seed: int = 0) -> dict[str, Any]:
  """Rewards of ``group_size`` rollouts per task, summarised by task kind.

  Returns ``{"all" | "disambiguation" | "plain": {"tasks", "pass_rate", "pass_at_k",
  "all_fail_groups", "truncated"}, "rewards": [N][G]}``.
  """
  cfg = rollout_config(group_size, temperature, seed=seed)
  groups = rollout_groups(list(tasks), lambda: NavigationEnv(world), backend, formatter, cfg,
                          task_id=lambda t: t.task_id, seed=seed)
  rewards = np.asarray([[t.reward for t in g] for g in groups], np.float32)
  truncated = np.asarray([[t.truncated for t in g] for g in groups], bool)
  out: dict[str, Any] = {"rewards": rewards.tolist(), "group_size": group_size, "temperature": temperature}
  need = np.asarray([t.needs_disambiguation for t in tasks], bool)
  for name, sel in (("all", np.ones_like(need)), ("disambiguation", need), ("plain", ~need)):
    r = rewards[sel]
    out[name] = {
      "tasks": int(sel.sum()),
      "pass_rate": float(r.mean()) if r.size else float("nan"),
      "pass_at_k": _pass_at_k(r, group_size) if r.size else float("nan"),
      "all_fail_groups": float((r.max(axis=1) <= 0).mean()) if r.size else float("nan"),
      "truncated": float(truncated[sel].mean()) if r.size else float("nan"),
    }
  return out


class _Recorder:
  """Wraps a Validator and a Corrector, keeping judgements and corrections in call order."""

  def __init__(self, validator: Any, corrector: Any, formatter: ChatFormatter) -> None:
    self.validator, self.corrector, self.formatter = validator, corrector, formatter
    self.flagged: list[Any] = []
    self.pairs: list[tuple[Any, str | None]] = []

  def validate(self, ctxs: Sequence[Any]) -> list[Any]:
    return self.validator.validate(ctxs)

  def correct(self, ctxs: Sequence[Any], judgements: Sequence[Any], cal_prompts: Sequence[Sequence[int]],
              seed: int) -> list[Any]:
    out = self.corrector.correct(ctxs, judgements, cal_prompts, seed)
    for j, c in zip(judgements, out):
      text = None if c.token_ids is None else self.formatter.decode(list(c.token_ids))
      self.pairs.append((j, text))
    return out


def follows_suggestion(suggest_next: str, correction: str | None) -> bool | None:
  """Whether ``correction`` searches every name of a "Search 'X' again with region Y"
  suggestion with that region; None for other suggestions."""
  m = _SUGGEST_RE.search(suggest_next or "")
  if m is None:
    return None
  if correction is None:
    return False
  names = [n.strip() for n in m["names"].split("', '")]
  calls = {(c.arguments.get("address"), c.arguments.get("region"))
           for c in parse_assistant_turn(correction).tool_calls if c.name == "poi_search"}
  return all((n, m["region"]) in calls for n in names)


def intervention_behaviour(backend: Any, formatter: ChatFormatter, world: World, tasks: Sequence[NavTask],
                           temperature: float = 1.0, ppl_delta: float = 5.0, seed: int = 0,
                           corrector: str = "feedback") -> dict[str, Any]:
  """One self-intervened rollout per task (rule-based Validator and Verifier, the policy as
  Corrector under the ``corrector`` message, ``InterventionConfig.corrector``); see the module
  docstring for the returned figures."""
  cfg = rollout_config(1, temperature, seed=seed)
  rec = _Recorder(NavigationRuleValidator(),
                  PolicyCorrector(backend, cfg.sampling, formatter.end_of_turn_id), formatter)
  roles = InterventionRoles(validator=rec, corrector=rec, verifier=NavigationRuleVerifier())
  stats = InterventionStats(groups_total=len(tasks), groups_triggered=len(tasks))
  runs = run_intervened_rollouts(list(tasks), lambda: NavigationEnv(world), backend, formatter, roles,
                                 InterventionConfig(ppl_delta=ppl_delta, corrector=corrector), cfg, stats,
                                 task_id=lambda t: t.task_id, seed=seed)
  trajs = [t for r in runs for t in r]
  stats.trajectories_intervened = len(trajs)
  stats.trajectories_with_accepted = sum(any(t.intervened_mask) for t in trajs)
  stats.trajectories_success = sum(t.reward >= 1.0 for t in trajs)
  follow = [follows_suggestion(j.feedback_suggestion, text) for j, text in rec.pairs]  # the hint p_cal shows
  research = [f for f in follow if f is not None]
  return {
    "tasks": len(tasks),
    "corrector": corrector,
    "steps_flagged": stats.steps_flagged,
    "corrections": len(rec.pairs),
    "research_suggestions": len(research),
    "follows_research_suggestion": float(np.mean(research)) if research else float("nan"),
    "verifier_accepted": stats.verifier_accepted,
    "verifier_rejected": stats.verifier_rejected,
    "ppl_rejected": stats.ppl_rejected,
    "corrections_applied": stats.corrections_applied,
    "mean_applied_ppl": stats.mean_accepted_ppl if stats.corrections_applied else float("nan"),
    "success_rate": stats.trajectories_success / max(1, len(trajs)),
    "stats": stats.as_dict(prefix=""),
    "examples": [{"suggest_next": j.feedback_suggestion, "correction": text} for j, text in rec.pairs[:3]],
  }


def rule_intervention_check(backend: Any, formatter: ChatFormatter, tasks: Sequence[Any], env_factory: Any,
                            domain: str, seed: int, max_new_tokens: int = 96,
                            max_context_tokens: int = 4096, options: Any = None) -> dict[str, Any]:
  """One self-intervened rollout per task of any registered ``domain`` (Algorithm 1 lines 9-23: the
  domain's rule-based Validator and Verifier, built with its config section ``options`` (default: the
  section's defaults), the policy as Corrector at T = 1, PPL gate delta 5): corrections applied, their
  mean PPL_roll, and the success rate."""
  from rti_jax.intervention.pipeline import rule_roles

  cfg = rollout_config(1, 1.0, max_new_tokens=max_new_tokens, max_context_tokens=max_context_tokens, seed=seed)
  validator, verifier = rule_roles(domain, options)
  roles = InterventionRoles(validator, PolicyCorrector(backend, cfg.sampling, formatter.end_of_turn_id), verifier)
  stats = InterventionStats(groups_total=len(tasks), groups_triggered=len(tasks))
  runs = run_intervened_rollouts(list(tasks), env_factory, backend, formatter, roles, InterventionConfig(domain=domain),
                                 cfg, stats, task_id=lambda t: t.task_id, seed=seed)
  trajs = [t for r in runs for t in r]
  return {
    "tasks": len(tasks), "steps_flagged": stats.steps_flagged, "corrections_applied": stats.corrections_applied,
    "verifier_rejected": stats.verifier_rejected, "ppl_rejected": stats.ppl_rejected,
    "mean_applied_ppl": stats.mean_accepted_ppl if stats.corrections_applied else float("nan"),
    "success_rate": sum(t.reward >= 1.0 for t in trajs) / max(1, len(trajs)),
    "stats": stats.as_dict(prefix=""),
  }


def decisive_turn_probabilities(model: Any, formatter: ChatFormatter, cases: Sequence[tuple[str, Sequence[Any], int]],
                                wrong_token: str = "<tool_call>") -> dict[str, Any]:
  """Teacher-forced, at the decisive turn of each case ``(task_id, messages, d)`` (``messages[d]`` is
  the right assistant turn; the context is everything before it): the probability of the right turn's
  first token, of ``wrong_token`` in its place (the mistake's first token), and the right turn's PPL
  (its mean per-token NLL, to compare with the PPL gate); means over the cases, and ``per_task``
  ``[p_right, p_wrong]``. One batched scoring call."""
  from models.sampler import Sampler
  from rti_jax.policy.sft_example import encode_messages

  if not cases:
    return {"tasks": 0}
  wrong_id = formatter.tokenizer.convert_tokens_to_ids(wrong_token)
  prompts, turns = [], []
  for _, messages, d in cases:
    ids, _ = encode_messages(formatter, list(messages[:d + 1]))
    start = len(ids) - len(formatter.encode_assistant(messages[d]["content"]))
    prompts.append(ids[:start])
    turns.append(ids[start:])
  scored = Sampler(model).score(prompts + prompts, turns + [[wrong_id]] * len(prompts))
  right, wrong = scored[:len(prompts)], scored[len(prompts):]
  p_right = [float(np.exp(lp[0])) for lp in right]
  p_wrong = [float(np.exp(lp[0])) for lp in wrong]
  nll = [float(-np.mean(lp)) for lp in right]
  return {"tasks": len(cases), "p_right_first_token": float(np.mean(p_right)), "p_tool_call": float(np.mean(p_wrong)),
          "right_turn_ppl": float(np.exp(np.mean(nll))),
          "per_task": {c[0]: [pr, pw] for c, pr, pw in zip(cases, p_right, p_wrong)}}
