"""Rollout-Time Intervention: Algorithm 1 lines 3-31 (Sec. 4.1-4.2).

Per task: G on-policy episodes (``rollout.rollout_groups``). Only if the whole group
failed (no reward reaches the environment's success threshold, line 5) is an intervened rollout run (lines 9-23): at every
step k the policy drafts u^_k; the Validator judges it; if invalid, the Corrector
writes u~_k; the Verifier checks it (unless "w/o Post-Check"); u~_k is rescored under
the rollout prompt p_roll and kept iff ``PPL_roll(u~_k) <= delta`` (Eq. 3-4). An
accepted u~_k replaces u^_k and the episode continues from it, with log pi_roll
(p_roll) and log pi_cal cached for Eq. 5-6; a rejected one is discarded and the draft kept.
If the intervened rollout reaches reward 1 it replaces one failed member of the group
(line 25); otherwise the group is unchanged (line 29).

The correction prompt p_cal is p_roll plus one user message (``InterventionConfig.corrector``):
``paper``, App. A.1's Corrector inputs (the draft, the Validator's diagnosis and ``suggest_next``,
the evidence l and the rule to conceal it; the history and the tools are p_roll's own), or
``feedback``, the diagnosis and a visible-only suggestion. The Corrector samples u~_k from p_cal,
log pi_cal is scored under that same p_cal (Eq. 5) and log pi_roll under p_roll (Eq. 3).

``objectives.assemble_batch`` then turns groups into an ``objectives.RTIBatch`` that ``rti_loss`` /
``loss_from_batch`` read directly. For intervened tokens ``old_logp`` is log pi_roll
(the current policy on the rollout context, which is what the GRPO ratio of Eq. 2
compares against); with reweighting off (rho = 1) ``cal_logp`` is set equal to
``roll_logp`` so every weight is exactly 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

from rti_jax.envs import registry
from rti_jax.envs.base import Environment
from rti_jax.generation.base import GenerationBackend
from rti_jax.intervention.judges import (
  Correction,
  Corrector,
  StepContext,
  Validator,
  ValidatorJudgement,
  Verifier,
)
from rti_jax.intervention.prompting import CORRECTORS, correction_message
from rti_jax.intervention.stats import InterventionStats
from rti_jax.objectives import ppl_gate, sequence_perplexity
from rti_jax.rollout import ChatFormatter, Episode, RolloutConfig, Trajectory, generate_turns, sampling_with_stops


@dataclasses.dataclass(frozen=True)
class InterventionConfig:
  """Switches for the paper's ablations and sweeps (Sec. 5.3-5.5).

  enabled: False = plain GRPO rollouts (no intervention at all).
  verifier_enabled: False = "RTI w/o Post-Check" (every correction goes to the gate).
  ppl_delta: the gate threshold delta of Eq. 4 (paper: 5); ``math.inf`` = "w/o PPL Gating",
    0 rejects every correction.
  reweight: False = "RTI w/o Reweight" (rho_cal = 1 on every token).
  num_intervened_rollouts: intervened rollouts per all-fail group (Algorithm 1: 1).
  correction_attempts: Corrector samples tried per flagged step (Algorithm 1: 1). A sample
    that is malformed, unchanged, rejected by the Verifier or by the PPL gate is redrawn
    (a new seed) until one passes both checks or the attempts run out (then the draft is
    kept). Every attempt still passes the same Verifier and gate, so the accepted u~_k
    obeys the same integrity and PPL bounds; only the chance of repairing a step grows.
  success_reward: the environment's success threshold (``TaskSource.success_threshold``): a group
    none of whose rollouts reaches it is all-fail, and an intervened rollout must reach it to enter.
  domain: the registered environment (``rti_jax.envs.registry``) whose judge prompts the roles use.
  corrector: the correction message appended to p_roll (``prompting.correction_message``):
    "paper" (App. A.1's Corrector inputs, evidence l included and to be concealed) or
    "feedback" (the Validator's diagnosis and visible-only suggestion, no evidence).
  intervened_old_logp: the behaviour log-prob recorded for a Corrector-written token: "roll" (pi_roll,
    its probability in the rollout context it stands in) or "cal" (pi_cal, the distribution it was
    drawn from); at ``old_logp_temperature`` (None: the rollout's behaviour temperature).
  """

  enabled: bool = True
  verifier_enabled: bool = True
  ppl_delta: float = 5.0
  reweight: bool = True
  num_intervened_rollouts: int = 1
  correction_attempts: int = 1
  success_reward: float = 1.0
  domain: str = "navigation"
  corrector: str = "feedback"
  intervened_old_logp: str = "roll"
  old_logp_temperature: float | None = None

  def __post_init__(self) -> None:
    if self.intervened_old_logp not in ("roll", "cal"):
      raise ValueError(f"intervened_old_logp: expected 'roll' or 'cal', got {self.intervened_old_logp!r}")
    if self.corrector not in CORRECTORS:
      raise ValueError(f"corrector: expected one of {CORRECTORS}, got {self.corrector!r}")
    if not 0.0 < self.success_reward < float("inf"):
      raise ValueError(f"success_reward: expected a finite reward > 0, got {self.success_reward}")
    if not (self.ppl_delta >= 0):
      raise ValueError(f"ppl_delta: expected >= 0 (inf turns the gate off), got {self.ppl_delta}")
    if self.num_intervened_rollouts < 1:
      raise ValueError(f"num_intervened_rollouts: expected >= 1, got {self.num_intervened_rollouts}")
    if self.correction_attempts < 1:
      raise ValueError(f"correction_attempts: expected >= 1, got {self.correction_attempts}")


@dataclasses.dataclass
class InterventionRoles:
  """The three MAS roles; ``verifier`` may be None only when the config turns it off."""

  validator: Validator
  corrector: Corrector
  verifier: Verifier | None


def make_roles(
  kind: str,
  policy: GenerationBackend,
  policy_formatter: ChatFormatter,
  sampling: Any,
  *,
  judge: GenerationBackend | None = None,
  judge_formatter: ChatFormatter | None = None,
  judge_sampling: Any = None,
  judge_max_context_tokens: int | None = None,
  corrector: str = "policy",
  domain: str = "navigation",
  rule_options: Any = None,
  validator: str | None = None,
  verifier: str | None = None,
) -> InterventionRoles:
  """Builds the MAS roles (the one path the trainer and the experiments use).

  kind: "rules" (the environment's rule-based Validator/Verifier, the default for a tiny policy)
    or "llm" (App. A.1 prompts, in this project's wording); ``validator`` / ``verifier`` choose
    each role on its own ("rules" | "llm"; the verifier also "off": None). An LLM judge is the
    policy itself (self-intervention, the paper's default) unless ``judge`` / ``judge_formatter``
    name a separate endpoint (the stronger intervening model of Sec. 5.5). Its prompt is one user
    message in a chat without tools (never the agent's tool block), answered greedily within
    ``judge_sampling`` (default: 1024 new tokens) and ``judge_max_context_tokens`` (prompt +
    answer; a longer prompt is not sent and the step is skipped, counted as over context).
  corrector: who writes u~_k: "policy" (the policy samples it from the correction prompt,
    whose message ``InterventionConfig.corrector`` picks), "intervener" (the separate ``judge``
    model samples it from that same prompt) or "llm" (the judge writes the App. A.1 Corrector
    JSON from its own prompt).
  sampling: the policy's ``SamplingParams`` for the PolicyCorrector.
  domain: the registered environment whose rule-based roles ``kind="rules"`` builds.
  rule_options: that environment's config section (``env.<domain>``; None: its defaults).
  """
  from rti_jax.intervention.judges import JudgeLLM, LLMCorrector, LLMValidator, LLMVerifier, PolicyCorrector

  if kind not in ("rules", "llm"):
    raise ValueError(f"kind: expected 'rules' or 'llm', got {kind!r}")
  validator, verifier = validator or kind, verifier or kind
  if validator not in ("rules", "llm"):
    raise ValueError(f"validator: expected 'rules' or 'llm', got {validator!r}")
  if verifier not in ("rules", "llm", "off"):
    raise ValueError(f"verifier: expected 'rules', 'llm' or 'off', got {verifier!r}")
  if corrector not in ("policy", "intervener", "llm"):
    raise ValueError(f"corrector: expected 'policy', 'intervener' or 'llm', got {corrector!r}")
  if (judge is None) != (judge_formatter is None):
    raise ValueError("judge / judge_formatter: expected both (a separate endpoint) or neither (self-intervention)")
  if corrector == "intervener" and judge is None:
    raise ValueError("corrector='intervener': needs a separate judge endpoint (judge / judge_formatter)")
  llm = JudgeLLM(
    judge if judge is not None else policy,
    judge_formatter if judge_formatter is not None else ChatFormatter(policy_formatter.tokenizer,
                                                                      end_of_turn=policy_formatter.end_of_turn),
    judge_sampling,
    judge_max_context_tokens,
  )
  corr: Corrector = (LLMCorrector(llm) if corrector == "llm" else
                      PolicyCorrector(judge if corrector == "intervener" else policy, sampling,
                                      policy_formatter.end_of_turn_id))
  rules = rule_roles(domain, rule_options) if "rules" in (validator, verifier) else (None, None)
  return InterventionRoles(
    validator=LLMValidator(llm) if validator == "llm" else rules[0],
    corrector=corr,
    verifier={"llm": LLMVerifier(llm), "rules": rules[1], "off": None}[verifier],
  )


class JudgeOutputError(RuntimeError):
  """An LLM judge's answers were mostly unusable in an iteration (``check_malformed``)."""


def check_malformed(stats: InterventionStats, roles: Sequence[str], max_rate: float, min_answers: int = 8) -> None:
  """Raises ``JudgeOutputError`` when one of ``roles`` ("validator", "corrector", "verifier") gave
  malformed answers to more than ``max_rate`` of at least ``min_answers`` questions this iteration:
  a malformed Validator answer keeps the draft, so judges that write nothing usable would quietly
  turn RTI into GRPO."""
  for role, (bad, n) in stats.malformed_rates().items():
    if role in roles and n >= min_answers and bad > max_rate * n:
      raise JudgeOutputError(
        f"intervention.max_malformed_rate: the {role}'s answers were malformed in {bad} of {n} cases this "
        f"iteration ({100 * bad / n:.0f}% > {100 * max_rate:.0f}%); the judge model is not writing the JSON its "
        f"prompt asks for (a thinking model cut by intervention.judge_max_new_tokens, or a model too small to "
        f"judge: use rule judges). The iteration was not trained on.")


def rule_roles(domain: str, options: Any = None) -> tuple[Validator, Verifier]:
  """The rule-based (Validator, Verifier) that environment ``domain`` registers
  (``rti_jax.envs.registry``), built with its config section ``options`` (default: the section's
  defaults): the defaults for a policy too small to judge."""
  return registry.rule_roles(domain, options)


def count_turns(stats: InterventionStats, kind: str, traj: Trajectory) -> None:
  """Adds ``traj``'s tool calls and assistant characters to ``stats``' ``<kind>_*`` counters."""
  from rti_jax.envs.tool_calls import parse_assistant_turn

  texts = [str(m.get("content") or "") for m in traj.messages if m.get("role") == "assistant"]
  setattr(stats, f"{kind}_trajectories", getattr(stats, f"{kind}_trajectories") + 1)
  setattr(stats, f"{kind}_tool_calls",
          getattr(stats, f"{kind}_tool_calls") + sum(len(parse_assistant_turn(t).tool_calls) for t in texts))
  setattr(stats, f"{kind}_chars", getattr(stats, f"{kind}_chars") + sum(len(t) for t in texts))


def group_all_failed(group: Sequence[Trajectory], success_reward: float = 1.0) -> bool:
  """Algorithm 1 line 5, negated: no rollout of the group succeeds (every reward is below the
  environment's success threshold; with binary rewards, every reward is 0)."""
  return bool(group) and max(t.reward for t in group) < success_reward


def step_context(ep: Episode, draft: str, domain: str) -> StepContext:
  """The roles' view of the current step: history without the system prompt, the env's
  tool schemas and its reward-side evidence."""
  msgs = ep.traj.messages
  history = tuple(m for m in msgs if m.get("role") != "system")
  user = next((m.get("content", "") for m in msgs if m.get("role") == "user"), "")
  return StepContext(
    user_query=str(user),
    history=history,
    draft=draft,
    tools=tuple(ep.env.tool_schemas()),
    evidence=dict(ep.env.reward_evidence()),
    domain=domain,
  )


def perplexities(logps: Sequence[np.ndarray]) -> np.ndarray:
  """``[n]`` PPL_roll of each response (Eq. 3) via ``objectives.sequence_perplexity``."""
  if not logps:
    return np.zeros((0,), np.float32)
  t = max(1, max(len(x) for x in logps))
  arr = np.zeros((len(logps), t), np.float32)
  mask = np.zeros((len(logps), t), np.int32)
  for i, x in enumerate(logps):
    arr[i, : len(x)] = x
    mask[i, : len(x)] = 1
  return np.asarray(sequence_perplexity(jnp.asarray(arr), jnp.asarray(mask)))


def _correction_ids(c: Correction, formatter: ChatFormatter) -> list[int] | None:
  if c.text is None and c.token_ids is None:
    return None
  if c.token_ids is not None:
    return [int(t) for t in c.token_ids]
  return formatter.encode_assistant(c.text or "")


def _correct_verify_gate(
  flagged: Sequence[int],
  ctxs: Sequence[StepContext],
  judgements: Sequence[ValidatorJudgement],
  drafts: Sequence[Any],
  p_roll: dict[int, list[int]],
  p_cal: dict[int, list[int]],
  backend: GenerationBackend,
  formatter: ChatFormatter,
  roles: InterventionRoles,
  config: InterventionConfig,
  rollout_config: RolloutConfig,
  stats: InterventionStats,
  seed: int,
) -> dict[int, tuple[list[int], np.ndarray, np.ndarray]]:
  """One Corrector sample per flagged step, then the Verifier and the PPL gate (Eq. 3-4).

  Returns {step index: (u~_k token ids, log pi_roll, log pi_cal)} for corrections that
  passed both checks.
  """
  corrections = roles.corrector.correct([ctxs[i] for i in flagged], [judgements[i] for i in flagged],
                                        [p_cal[i] for i in flagged], seed)
  if len(corrections) != len(flagged):
    raise RuntimeError(f"corrector: expected {len(flagged)} corrections, got {len(corrections)}")
  cand: dict[int, list[int]] = {}
  for i, c in zip(flagged, corrections):
    ids = _correction_ids(c, formatter)
    if ids is None or len(ids) <= 1:
      stats.corrector_malformed += 1
      continue
    if ids == drafts[i].token_ids.tolist():  # not a correction: keep the draft as drawn
      stats.corrections_unchanged += 1
      continue
    if len(ids) > rollout_config.sampling.max_new_tokens:  # longer than a turn may be: no room to score it
      stats.corrections_over_context += 1
      continue
    stats.corrections_generated += 1
    cand[i] = ids

  # Verifier (Integrity-Constrained Intervention Verifier), unless "w/o Post-Check".
  order = sorted(cand)
  if config.verifier_enabled:
    if roles.verifier is None:
      raise ValueError("roles.verifier: expected a Verifier because config.verifier_enabled is True, got None")
    verdicts = roles.verifier.verify([ctxs[i] for i in order], [formatter.decode(cand[i]) for i in order])
    passed = []
    for i, v in zip(order, verdicts):
      stats.verifier_malformed += int(v.malformed)
      stats.verifier_over_context += int(getattr(v, "over_context", False))
      if v.ok:
        stats.verifier_accepted += 1
        passed.append(i)
      else:
        stats.verifier_rejected += 1
        for r in v.reasons or ("unspecified",):
          stats.verifier_reasons[r] = stats.verifier_reasons.get(r, 0) + 1
  else:
    stats.verifier_skipped += len(order)
    passed = order

  # PPL gate (Eq. 3-4) on log pi_roll; cache log pi_cal for Eq. 5-6.
  accepted: dict[int, tuple[list[int], np.ndarray, np.ndarray]] = {}
  if passed:
    roll = backend.score([p_roll[i] for i in passed], [cand[i] for i in passed])
    cal = backend.score([p_cal[i] for i in passed], [cand[i] for i in passed])
    ppl = perplexities(roll)
    keep = np.asarray(ppl_gate(jnp.asarray(ppl), config.ppl_delta))
    for k, i in enumerate(passed):
      if keep[k]:
        accepted[i] = (cand[i], np.asarray(roll[k], np.float32), np.asarray(cal[k], np.float32))
        stats.corrections_applied += 1
        stats.accepted_ppl_sum += float(ppl[k])
      else:
        stats.ppl_rejected += 1
  return accepted


def intervened_step(
  live: Sequence[Episode],
  drafts: Sequence[Any],
  backend: GenerationBackend,
  formatter: ChatFormatter,
  roles: InterventionRoles,
  config: InterventionConfig,
  rollout_config: RolloutConfig,
  stats: InterventionStats,
  seed: int,
) -> None:
  """One step k of all live intervened episodes (Algorithm 1 lines 10-23), batched."""
  draft_texts = [formatter.decode(d.token_ids.tolist()) for d in drafts]
  ctxs = [step_context(ep, txt, config.domain) for ep, txt in zip(live, draft_texts)]
  stats.steps_total += len(live)
  judgements = roles.validator.validate(ctxs)
  stats.validator_malformed += sum(j.malformed for j in judgements)
  stats.validator_over_context += sum(getattr(j, "over_context", False) for j in judgements)
  flagged = [i for i, j in enumerate(judgements) if not j.is_valid]
  stats.steps_flagged += len(flagged)

  # Corrector: u~_k from the correction prompt p_cal (p_roll + the configured correction message).
  p_roll = {i: live[i].context() for i in flagged}
  p_cal = {i: formatter.with_extra_user_message(p_roll[i], correction_message(config.corrector, ctxs[i], judgements[i]))
           for i in flagged}
  too_long = [i for i in flagged if len(p_cal[i]) > rollout_config.max_prompt_tokens]
  stats.corrections_over_context += len(too_long)  # no room for a correction: keep the draft
  pending = [i for i in flagged if i not in too_long]
  accepted: dict[int, tuple[list[int], np.ndarray, np.ndarray]] = {}
  for attempt in range(config.correction_attempts):
    if not pending:
      break
    stats.correction_retries += len(pending) if attempt else 0
    accepted.update(_correct_verify_gate(
      pending, ctxs, judgements, drafts, p_roll, p_cal, backend, formatter, roles, config, rollout_config, stats,
      seed + 7_919 * attempt,
    ))
    pending = [i for i in pending if i not in accepted]

  # The behaviour log-prob of a Corrector-written token is pi_roll's (or pi_cal's, with
  # intervened_old_logp="cal"); at a behaviour temperature other than 1, scored again at it under
  # that context (the gate and Eq. 5 keep the temperature-1 scores).
  cal_context = config.intervened_old_logp == "cal"
  behaviour = {i: (cal_lp if cal_context else roll_lp) for i, (_, roll_lp, cal_lp) in accepted.items()}
  t_b = config.old_logp_temperature or rollout_config.behaviour_temperature
  if accepted and t_b != 1.0:
    order = sorted(accepted)
    context = p_cal if cal_context else p_roll
    tempered = backend.score([context[i] for i in order], [accepted[i][0] for i in order], temperature=t_b)
    behaviour = {i: np.asarray(lp, np.float32) for i, lp in zip(order, tempered)}
  for i, (ep, d) in enumerate(zip(live, drafts)):
    if i in accepted:
      ids, roll_lp, cal_lp = accepted[i]
      ep.apply_turn(
        formatter, ids, behaviour[i].tolist(), "stop", rollout_config.max_prompt_tokens,
        roll_logp=roll_lp.tolist(), cal_logp=cal_lp.tolist(),
      )
    else:
      ep.apply_turn(formatter, d.token_ids.tolist(), rollout_config.behaviour_logprobs(d).tolist(), d.finish_reason,
                    rollout_config.max_prompt_tokens)


def run_intervened_rollouts(
  tasks: Sequence[Any],
  env_factory: Callable[[], Environment],
  backend: GenerationBackend,
  formatter: ChatFormatter,
  roles: InterventionRoles,
  config: InterventionConfig,
  rollout_config: RolloutConfig,
  stats: InterventionStats,
  *,
  task_id: Callable[[Any], str],
  seed: int,
) -> list[list[Trajectory]]:
  """``config.num_intervened_rollouts`` intervened rollouts per task, batched across tasks."""
  per_task = [
    [
      Episode(env_factory(), task, task_id(task), formatter, rollout_config.max_prompt_tokens)
      for _ in range(config.num_intervened_rollouts)
    ]
    for task in tasks
  ]
  episodes = [e for g in per_task for e in g]
  params = sampling_with_stops(rollout_config.sampling, formatter)
  turn = 0
  while True:
    live = [e for e in episodes if e.live]
    if not live:
      break
    step_seed = seed + 1_000_003 * turn
    drafts = generate_turns(live, backend, params, step_seed)
    intervened_step(live, drafts, backend, formatter, roles, config, rollout_config, stats, step_seed + 17)
    turn += 1
  for e in episodes:
    e.traj.intervened = True
  return [[e.traj for e in g] for g in per_task]


def intervene_groups(
  groups: Sequence[Sequence[Trajectory]],
  tasks: Sequence[Any],
  env_factory: Callable[[], Environment],
  backend: GenerationBackend,
  formatter: ChatFormatter,
  roles: InterventionRoles,
  config: InterventionConfig,
  rollout_config: RolloutConfig,
  *,
  task_id: Callable[[Any], str] = lambda t: str(getattr(t, "task_id", t)),
  seed: int = 0,
) -> tuple[list[list[Trajectory]], InterventionStats]:
  """Algorithm 1 lines 5-31 for every group: intervene only where the whole group failed.

  groups[n]: the G on-policy trajectories of tasks[n]. Returns the (possibly updated)
  groups and this iteration's Table-6 statistics. A successful intervened trajectory
  replaces the group's first member (all members failed, so any one is "a failed member").
  """
  if len(groups) != len(tasks):
    raise ValueError(f"tasks: expected {len(groups)} (one per group), got {len(tasks)}")
  stats = InterventionStats(groups_total=len(groups))
  out = [list(g) for g in groups]
  if not config.enabled:
    return out, stats
  failed = [n for n, g in enumerate(groups) if group_all_failed(g, config.success_reward)]
  stats.groups_triggered = len(failed)
  if not failed:
    return out, stats
  runs = run_intervened_rollouts(
    [tasks[n] for n in failed], env_factory, backend, formatter, roles, config, rollout_config, stats,
    task_id=task_id, seed=seed,
  )
  for n, trajs in zip(failed, runs):
    for t in groups[n]:
      count_turns(stats, "original", t)
    for t in trajs:
      if any(t.intervened_mask):
        count_turns(stats, "corrected", t)
    stats.trajectories_intervened += len(trajs)
    stats.trajectories_with_accepted += sum(any(t.intervened_mask) for t in trajs)
    # Only a rollout that carries at least one accepted correction is an *intervened* trajectory:
    # one whose every draft was kept is a plain on-policy re-sample, and admitting it would give
    # the method extra samples that GRPO does not get (and delta = 0 would no longer equal GRPO).
    successes = [t for t in trajs if t.reward >= config.success_reward]
    winners = [t for t in successes if any(t.intervened_mask)]
    stats.trajectories_success += len(successes)
    stats.trajectories_success_unintervened += len(successes) - len(winners)
    if winners:
      out[n][0] = winners[0]
      stats.groups_replaced += 1
  return out, stats
