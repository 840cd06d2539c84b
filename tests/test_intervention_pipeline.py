"""Algorithm 1 with a scripted policy on a miniature Navigation env: trigger, Verifier, PPL gate,
cached log-probs, reweighting and the RTIBatch that rti_loss reads."""

from __future__ import annotations

import math
import zlib

import jax.numpy as jnp
import numpy as np
import pytest

from rti_jax.intervention import (
  InterventionConfig,
  InterventionRoles,
  JudgeLLM,
  LLMValidator,
  NavigationRuleValidator,
  NavigationRuleVerifier,
  PolicyCorrector,
  intervene_groups,
)
from rti_jax.objectives import assemble_batch
from rti_jax.policy.tokenizer import byte_tokenizer
from rti_jax.generation.base import SamplingParams
from rti_jax.objectives import LossConfig, calibration_weights, loss_from_batch
from rti_jax.rollout import ChatFormatter, RolloutConfig, rollout_groups
from intervention_doubles import (
  FEEDBACK_MARKER,
  NAV_TOOLS,
  PAPER_CORRECTION_MARKER,
  MiniNavEnv,
  MiniNavScript,
  ScriptedPolicy,
  VALIDATOR_MARKER,
  is_correction_prompt,
  mini_nav_tasks,
  scripted_logp,
)

ROLL, CAL = -1.0, -0.2  # scripted log-prob bases under p_roll and p_cal


@pytest.fixture(scope="module")
def tok():
  return byte_tokenizer()


@pytest.fixture(scope="module")
def fmt(tok):
  return ChatFormatter(tok, NAV_TOOLS)


def _run(tok, fmt, correction="region", group_size=2, verifier=True, policy=None, behaviour_temperature=1.0, **cfg):
  policy = policy or ScriptedPolicy(tok, MiniNavScript(correction), scripted_logp(ROLL, CAL))
  rc = RolloutConfig(group_size=group_size, behaviour_temperature=behaviour_temperature)
  tasks = mini_nav_tasks()
  groups = rollout_groups(tasks, MiniNavEnv, policy, fmt, rc, task_id=lambda t: t.task_id)
  n_calls = len(policy.calls)
  roles = InterventionRoles(
    NavigationRuleValidator(),
    PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id),
    NavigationRuleVerifier(),
  )
  config = InterventionConfig(verifier_enabled=verifier, **cfg)
  new, stats = intervene_groups(groups, tasks, MiniNavEnv, policy, fmt, roles, config, rc, task_id=lambda t: t.task_id)
  return groups, new, stats, policy.calls[n_calls:]


def _expected_logp(ids, base):
  ids = np.asarray(ids)
  return base - 0.01 * (ids % 7)


def test_only_the_all_fail_group_is_intervened(tok, fmt):
  groups, new, stats, calls = _run(tok, fmt)
  assert [max(t.reward for t in g) for g in groups] == [1.0, 0.0]
  assert stats.groups_total == 2 and stats.groups_triggered == 1
  # every prompt of the intervention phase belongs to the ambiguous task
  assert calls and all("Yixing Temple" in c for c in calls)
  assert new[0] == groups[0]  # the group with a success is untouched
  assert new[1][0].intervened and new[1][0].reward == 1.0 and new[1][1] is groups[1][1]
  assert stats.trajectories_intervened == 1 and stats.trajectories_success == 1 and stats.groups_replaced == 1
  assert stats.trajectories_with_accepted == 1 and stats.corrections_applied == 1


def test_accepted_correction_replaces_the_draft_and_caches_logps(tok, fmt):
  _, new, stats, _ = _run(tok, fmt)
  traj = new[1][0]
  turn = next(t for t in traj.turns if t.intervened)
  assert '"region": "Taipei"' in turn.text and "Beijing" not in turn.text
  a = traj.arrays()
  span = slice(turn.start, turn.end)
  assert a["intervened_mask"][span].all() and a["intervened_mask"].sum() == turn.end - turn.start
  ids = a["token_ids"][span]
  np.testing.assert_allclose(a["roll_logp"][span], _expected_logp(ids, ROLL), atol=1e-6)
  np.testing.assert_allclose(a["cal_logp"][span], _expected_logp(ids, CAL), atol=1e-6)
  np.testing.assert_allclose(a["behaviour_logp"][span], a["roll_logp"][span])  # old logp = pi_roll
  ppl = math.exp(-np.mean(_expected_logp(ids, ROLL).astype(np.float64)))
  assert stats.mean_accepted_ppl == pytest.approx(ppl, rel=1e-5)
  # the episode continued from the correction: the next search result is the Taipei temple
  assert "121.5409,25.0533" in traj.messages[traj.messages.index({"role": "assistant", "content": turn.text}) + 1]["content"]


def test_behaviour_logp_at_the_sampling_temperature(tok, fmt):
  """With ``behaviour_temperature`` = the sampling temperature, every drawn token keeps the log-prob
  it was sampled with, and a Corrector-written token gets pi_roll scored at that temperature,
  while the PPL gate and Eq. 5 keep the temperature-1 pi_roll and pi_cal."""
  t = 0.8  # RolloutConfig's sampling temperature
  policy = ScriptedPolicy(tok, MiniNavScript("region"), scripted_logp(ROLL, CAL))
  groups, new, stats, _ = _run(tok, fmt, policy=policy, behaviour_temperature=t)
  assert stats.corrections_applied == 1 and stats.groups_replaced == 1
  assert policy.score_temperatures.count(t) == 1  # one tempered score: the applied correction
  traj = new[1][0]
  a = traj.arrays()
  turn = next(x for x in traj.turns if x.intervened)
  span = slice(turn.start, turn.end)
  ids = a["token_ids"][span]
  np.testing.assert_allclose(a["behaviour_logp"][span], _expected_logp(ids, ROLL) / t, atol=1e-6)
  np.testing.assert_allclose(a["roll_logp"][span], _expected_logp(ids, ROLL), atol=1e-6)
  np.testing.assert_allclose(a["cal_logp"][span], _expected_logp(ids, CAL), atol=1e-6)
  ppl = math.exp(-np.mean(_expected_logp(ids, ROLL).astype(np.float64)))
  assert stats.mean_accepted_ppl == pytest.approx(ppl, rel=1e-5)
  for tr in [traj, *groups[0], *groups[1]]:  # drawn turns: the sampling log-probs
    a = tr.arrays()
    drawn = a["loss_mask"] & ~a["intervened_mask"]
    assert drawn.sum() > 0
    np.testing.assert_allclose(a["behaviour_logp"][drawn], _expected_logp(a["token_ids"][drawn], ROLL) / t, atol=1e-6)


def test_behaviour_temperature_other_than_the_sampling_one_is_refused():
  with pytest.raises(ValueError, match="behaviour_temperature"):
    RolloutConfig(behaviour_temperature=0.5)  # sampling at 0.8
  with pytest.raises(ValueError, match="top_p"):
    RolloutConfig(sampling=SamplingParams(temperature=0.8, top_p=0.9), behaviour_temperature=0.8)


def test_leaking_correction_is_rejected_by_the_verifier(tok, fmt):
  groups, new, stats, _ = _run(tok, fmt, correction="leak")
  assert stats.verifier_rejected >= 1 and stats.verifier_accepted == 0 and stats.corrections_applied == 0
  assert stats.trajectories_success == 0 and stats.groups_replaced == 0
  assert new[1] == groups[1]  # group left unchanged


def test_leaking_correction_is_admitted_without_post_check(tok, fmt):
  _, new, stats, _ = _run(tok, fmt, correction="leak", verifier=False)
  assert stats.verifier_skipped >= 1 and stats.verifier_rejected == 0 and stats.corrections_applied >= 1
  traj = new[1][0]
  assert traj.intervened and traj.reward == 1.0
  assert any("reference route" in t.text for t in traj.turns if t.intervened)


@pytest.mark.parametrize("delta", [0.0, 2.0, 5.0, math.inf])
def test_ppl_gate_threshold(tok, fmt, delta):
  _, new, stats, _ = _run(tok, fmt, ppl_delta=delta)
  # the correction's PPL under p_roll is exp(1 + 0.01 * mean(id % 7)) ~ 2.8
  ppl = stats.mean_accepted_ppl if stats.corrections_applied else None
  if delta >= 2.9:
    assert stats.corrections_applied == 1 and stats.ppl_rejected == 0 and ppl <= delta
    assert new[1][0].reward == 1.0
  else:
    assert stats.corrections_applied == 0 and stats.ppl_rejected >= 1
    assert math.isnan(stats.mean_accepted_ppl) and new[1][0].reward == 0.0


def test_malformed_correction_is_counted_and_the_draft_kept(tok, fmt):
  _, new, stats, _ = _run(tok, fmt, correction="empty")
  assert stats.corrector_malformed == stats.steps_flagged >= 1
  assert stats.corrections_generated == 0 and stats.corrections_applied == 0


def test_intervention_off_and_several_intervened_rollouts(tok, fmt):
  groups, new, stats, calls = _run(tok, fmt, enabled=False)
  assert stats.groups_triggered == 0 and calls == [] and new == [list(g) for g in groups]
  _, new, stats, _ = _run(tok, fmt, num_intervened_rollouts=3)
  assert stats.trajectories_intervened == 3 and stats.trajectories_success == 3 and stats.groups_replaced == 1
  assert sum(t.intervened for t in new[1]) == 1  # a single failed member is replaced


def _reference_rti_loss(batch, logp, eps_cal=0.2, clip=0.2):
  """numpy Eq. 7 (seq-mean-token-mean), independent of the objectives package."""
  lm = np.asarray(batch.loss_mask, bool)
  iv = np.asarray(batch.intervened_mask, bool) & lm
  w = np.where(iv, np.clip(np.exp(np.asarray(batch.cal_logp) - np.asarray(batch.roll_logp)), 1 - eps_cal, 1 + eps_cal), 1.0)
  ratio = np.exp(np.asarray(logp) - np.asarray(batch.old_logp))
  adv = np.asarray(batch.advantages)[:, None]
  surr = np.minimum(ratio * adv, np.clip(ratio, 1 - clip, 1 + clip) * adv) * w
  per_seq = [surr[b][lm[b]].mean() for b in range(lm.shape[0]) if lm[b].any()]
  return -float(np.mean(per_seq)), w


def test_batch_feeds_rti_loss_with_rho_one_off_intervention(tok, fmt):
  _, new, _, _ = _run(tok, fmt)
  batch = assemble_batch(new)
  B, T = batch.shape
  assert B == 4
  np.testing.assert_allclose(np.asarray(batch.advantages), [0, 0, 1, -1], atol=1e-5)  # Eq. 1 per group
  w = np.asarray(calibration_weights(batch.cal_logp, batch.roll_logp, batch.intervened_mask, eps_cal=0.2))
  iv = np.asarray(batch.intervened_mask, bool)
  assert iv.sum() > 0
  assert (w[~iv] == 1.0).all()  # rho = 1 on every non-intervened token
  np.testing.assert_allclose(w[iv], 1.2, atol=1e-6)  # exp(CAL - ROLL) = exp(0.8) clipped to 1 + eps_cal
  # masks: prompt and tool-response tokens never enter the loss
  ids, lm = np.asarray(batch.input_ids), np.asarray(batch.loss_mask, bool)
  for b in range(B):
    assert "<tool_response>" not in tok.decode(ids[b][lm[b]])
  rng = np.random.default_rng(0)
  logp = np.asarray(batch.old_logp) + np.where(lm, rng.normal(0, 0.3, lm.shape), 0).astype(np.float32)
  loss, metrics = loss_from_batch(jnp.asarray(logp), batch, LossConfig(name="rti"))
  ref, _ = _reference_rti_loss(batch, logp)
  assert float(loss) == pytest.approx(ref, rel=1e-5, abs=1e-6)
  assert float(metrics["intervened_tokens"]) == iv.sum()


def test_reweighting_off_gives_rho_one_everywhere(tok, fmt):
  _, new, _, _ = _run(tok, fmt)
  batch = assemble_batch(new, reweight=False)
  w = np.asarray(calibration_weights(batch.cal_logp, batch.roll_logp, batch.intervened_mask, eps_cal=0.2))
  assert np.asarray(batch.intervened_mask).sum() > 0 and (w == 1.0).all()


def test_malformed_llm_validator_is_counted_and_never_intervenes(tok, fmt):
  """An LLM-backed Validator whose output is not JSON defaults to 'valid' (draft kept)."""
  policy = ScriptedPolicy(tok, MiniNavScript(), scripted_logp(ROLL, CAL))
  judge = ScriptedPolicy(tok, lambda prompt: "I think it is fine, no JSON here.", scripted_logp())
  rc = RolloutConfig(group_size=2)
  tasks = mini_nav_tasks()
  groups = rollout_groups(tasks, MiniNavEnv, policy, fmt, rc, task_id=lambda t: t.task_id)
  judge_fmt = ChatFormatter(tok)
  roles = InterventionRoles(LLMValidator(JudgeLLM(judge, judge_fmt)),
                            PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id), NavigationRuleVerifier())
  new, stats = intervene_groups(groups, tasks, MiniNavEnv, policy, fmt, roles, InterventionConfig(), rc,
                                task_id=lambda t: t.task_id)
  assert stats.steps_total == 3 and stats.validator_malformed == 3 and stats.steps_flagged == 0
  assert stats.corrections_applied == 0 and new[1] == groups[1]
  # the judge saw the Validator prompt with the reward-side route
  assert VALIDATOR_MARKER in judge.calls[0] and "121.5409,25.0533" in judge.calls[0]
  assert not any(FEEDBACK_MARKER in c for c in policy.calls)


def test_config_validation():
  with pytest.raises(ValueError, match="ppl_delta"):
    InterventionConfig(ppl_delta=-1.0)
  with pytest.raises(ValueError, match="num_intervened_rollouts"):
    InterventionConfig(num_intervened_rollouts=0)
  with pytest.raises(ValueError, match="correction_attempts"):
    InterventionConfig(correction_attempts=0)
  with pytest.raises(ValueError, match="corrector"):
    InterventionConfig(corrector="oracle")
  assert InterventionConfig().corrector == "feedback"


def _prompt_logp(prompt, ids):
  """Log-probs that depend on the whole prompt (through its CRC-32) and on each id."""
  base = -0.1 - (zlib.crc32(prompt.encode("utf-8")) % 997) / 1000
  return np.asarray([base - 0.01 * (int(t) % 7) for t in ids], np.float32)


TP_TEMPLE = "121.5409,25.0533"  # the right Yixing Temple: in the evidence, not shown before the re-search
FEEDBACK_TEXT = (  # the feedback-only correction message, byte for byte as the tiny policy was fine-tuned on it
  "A supervisor reviewed your planned next step and found a problem.\n"
  "Problem: direction is called but 1 stop(s) of the request have no matching search result yet.\n"
  "Suggested direction: Search 'Yixing Temple' again with region Taipei before calling direction.\n"
  "Write your next step again, continuing from the conversation above.\n")


@pytest.mark.parametrize("kind", ["paper", "feedback"])
def test_cal_logp_is_scored_under_the_prompt_the_correction_was_sampled_from(tok, fmt, kind):
  """Eq. 5: log pi_cal under the very prompt the Corrector sampled u~_k from; Eq. 3: log pi_roll
  under the rollout context. The double's log-probs differ for every prompt."""
  policy = ScriptedPolicy(tok, MiniNavScript("region"), _prompt_logp)
  rc = RolloutConfig(group_size=2)
  tasks = mini_nav_tasks()
  groups = rollout_groups(tasks, MiniNavEnv, policy, fmt, rc, task_id=lambda t: t.task_id)
  n_calls = len(policy.calls)
  roles = InterventionRoles(NavigationRuleValidator(), PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id),
                            NavigationRuleVerifier())
  new, stats = intervene_groups(groups, tasks, MiniNavEnv, policy, fmt, roles,
                                InterventionConfig(corrector=kind, ppl_delta=math.inf), rc, task_id=lambda t: t.task_id)
  assert stats.corrections_applied == 1 and new[1][0].reward == 1.0
  sampled_from = [c for c in policy.calls[n_calls:] if is_correction_prompt(c)]
  assert len(sampled_from) == 1
  p_cal = sampled_from[0]
  traj = new[1][0]
  turn = next(t for t in traj.turns if t.intervened)
  before = traj.messages[:traj.messages.index({"role": "assistant", "content": turn.text})]
  p_roll = tok.decode(fmt.prompt_ids(before), skip_special_tokens=False)
  assert p_roll in policy.calls[n_calls:]  # the draft of this step was sampled from p_roll
  a = traj.arrays()
  ids = a["token_ids"][turn.start:turn.end]
  np.testing.assert_allclose(a["cal_logp"][turn.start:turn.end], _prompt_logp(p_cal, ids), atol=1e-6)
  np.testing.assert_allclose(a["roll_logp"][turn.start:turn.end], _prompt_logp(p_roll, ids), atol=1e-6)
  assert not np.allclose(_prompt_logp(p_cal, ids), _prompt_logp(p_roll, ids))
  message = p_cal.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
  if kind == "feedback":
    assert message == FEEDBACK_TEXT and TP_TEMPLE not in p_cal
  else:
    assert message.startswith(PAPER_CORRECTION_MARKER) and FEEDBACK_MARKER not in p_cal
    assert TP_TEMPLE in message and TP_TEMPLE not in p_roll  # the evidence l is in p_cal only
    assert "116.3971,39.9169" in message  # the draft: the direction call with the Beijing temple
    assert "direction is called but 1 stop(s)" in message  # the diagnosis
    assert "Search 'Yixing Temple' again with region Taipei before calling direction." in message  # suggest_next
    assert "Keep the notes and the review secret." in message  # the concealment rule


def test_paper_corrector_leaks_are_stopped_by_the_verifier_and_counted(tok, fmt):
  """A correction that states a hidden coordinate it read in the paper Corrector's prompt is
  rejected as not derivable; without the Post-Check it would enter the group."""
  policy = ScriptedPolicy(tok, MiniNavScript("echo"), scripted_logp(ROLL, CAL))
  rc = RolloutConfig(group_size=2)
  tasks = mini_nav_tasks()
  groups = rollout_groups(tasks, MiniNavEnv, policy, fmt, rc, task_id=lambda t: t.task_id)
  roles = InterventionRoles(NavigationRuleValidator(), PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id),
                            NavigationRuleVerifier())
  new, stats = intervene_groups(groups, tasks, MiniNavEnv, policy, fmt, roles, InterventionConfig(corrector="paper"),
                                rc, task_id=lambda t: t.task_id)
  assert stats.verifier_rejected >= 1 and stats.verifier_accepted == 0 and stats.corrections_applied == 0
  assert stats.verifier_reasons.get("not_derivable", 0) == stats.verifier_rejected
  assert new[1] == groups[1]
  _, new, stats, _ = _run(tok, fmt, correction="echo", verifier=False, corrector="paper")
  assert stats.corrections_applied == 1 and new[1][0].reward == 1.0
  assert any(TP_TEMPLE in t.text for t in new[1][0].turns if t.intervened)


class _LeakFirst:
  """Corrects with a leak on its first ``n_leaks`` correction prompts, then by re-searching with
  the hinted region; records the seeds it was sampled with."""

  def __init__(self, n_leaks):
    self.leak, self.region, self.n_leaks, self.seen = MiniNavScript("leak"), MiniNavScript("region"), n_leaks, 0

  def __call__(self, prompt):
    if FEEDBACK_MARKER not in prompt.rsplit("<|im_start|>user\n", 1)[-1]:
      return self.region(prompt)
    self.seen += 1
    return (self.leak if self.seen <= self.n_leaks else self.region)(prompt)


class _SeedRecorder(ScriptedPolicy):
  def __init__(self, *a, **k):
    super().__init__(*a, **k)
    self.seeds = []

  def generate(self, prompts, params, seed):
    self.seeds.append(seed)
    return super().generate(prompts, params, seed)


@pytest.mark.parametrize("attempts, n_leaks, repaired", [(1, 1, False), (2, 1, True), (3, 2, True), (2, 2, False)])
def test_correction_attempts_redraw_a_rejected_correction(tok, fmt, attempts, n_leaks, repaired):
  script = _LeakFirst(n_leaks)
  policy = _SeedRecorder(tok, script, scripted_logp(ROLL, CAL))
  rc = RolloutConfig(group_size=2)
  tasks = mini_nav_tasks()
  groups = rollout_groups(tasks, MiniNavEnv, policy, fmt, rc, task_id=lambda t: t.task_id)
  roles = InterventionRoles(NavigationRuleValidator(), PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id),
                            NavigationRuleVerifier())
  n_gen = len(policy.seeds)
  new, stats = intervene_groups(groups, tasks, MiniNavEnv, policy, fmt, roles,
                                InterventionConfig(correction_attempts=attempts), rc, task_id=lambda t: t.task_id)
  # the first flagged step (the wrong direction call) is where the leaks land
  used = min(attempts, n_leaks + 1)
  assert stats.verifier_rejected >= min(attempts, n_leaks)
  assert stats.verifier_reasons.get("not_derivable", 0) + stats.verifier_reasons.get("leak", 0) >= min(attempts, n_leaks)
  assert stats.correction_retries >= used - 1
  assert (new[1][0].reward == 1.0) == repaired and (stats.groups_replaced == 1) == repaired
  if repaired:
    turn = next(t for t in new[1][0].turns if t.intervened)
    assert '"region": "Taipei"' in turn.text
  # each redraw samples with a new seed
  seeds = policy.seeds[n_gen:]
  assert len(seeds) == len(set(seeds))
  d = stats.as_dict()
  assert d["rti/correction_retries"] == stats.correction_retries
  assert sum(v for k, v in d.items() if k.startswith("rti/verifier_rejected/")) >= stats.verifier_rejected


def test_stats_merge_sums_verifier_reasons():
  from rti_jax.intervention import InterventionStats

  a = InterventionStats(verifier_rejected=3, verifier_reasons={"leak": 2, "not_derivable": 1})
  b = InterventionStats(verifier_rejected=2, verifier_reasons={"leak": 1, "not_improved": 1}, correction_retries=4)
  m = a.merge(b)
  assert m.verifier_rejected == 5 and m.correction_retries == 4
  assert m.verifier_reasons == {"leak": 3, "not_derivable": 1, "not_improved": 1}
  assert a.verifier_reasons == {"leak": 2, "not_derivable": 1}  # inputs untouched
  assert "leak 3" in m.format_table()


def test_correction_prompt_over_the_context_budget_keeps_the_draft(tok, fmt):
  groups, _, _, _ = _run(tok, fmt)
  flagged_turn = groups[1][0].turns[1]  # the direction call with the Beijing temple
  max_new = RolloutConfig().sampling.max_new_tokens
  budget = flagged_turn.start + max_new + 10  # p_roll fits, p_roll + feedback does not
  policy = ScriptedPolicy(tok, MiniNavScript(), scripted_logp(ROLL, CAL))
  rc = RolloutConfig(group_size=2, max_context_tokens=budget)
  tasks = mini_nav_tasks()
  groups = rollout_groups(tasks, MiniNavEnv, policy, fmt, rc, task_id=lambda t: t.task_id)
  roles = InterventionRoles(NavigationRuleValidator(), PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id),
                            NavigationRuleVerifier())
  new, stats = intervene_groups(groups, tasks, MiniNavEnv, policy, fmt, roles, InterventionConfig(), rc,
                                task_id=lambda t: t.task_id)
  assert stats.corrections_over_context == stats.steps_flagged >= 1 and stats.corrections_applied == 0
  assert not any(FEEDBACK_MARKER in c for c in policy.calls)  # nothing over budget reached the backend


def test_judge_prompt_over_budget_is_not_sent(tok):
  judge = ScriptedPolicy(tok, lambda p: '{"is_valid": false}', scripted_logp())
  llm = JudgeLLM(judge, ChatFormatter(tok), SamplingParams(max_new_tokens=32, temperature=0.0), max_context_tokens=80)
  assert llm.ask(["short", "x" * 500]) == ['{"is_valid": false}', None]  # None: the role skips the step
  assert len(judge.calls) == 1


class _LuckyEnv(MiniNavEnv):
  """MiniNavEnv whose episodes all succeed once ``lucky`` is set (after the on-policy phase)."""

  lucky = False

  def step(self, assistant_text):
    result = super().step(assistant_text)
    if result.done and _LuckyEnv.lucky:
      result.reward = self.transcript.reward = 1.0
    return result


@pytest.mark.parametrize("delta, replaced", [(0.0, False), (math.inf, True)])
def test_success_without_an_applied_correction_is_not_an_intervened_trajectory(tok, fmt, delta, replaced):
  """delta = 0 gates out every correction: a rollout that still succeeds is a plain re-sample and
  must not enter the group (so delta = 0 trains exactly like GRPO)."""
  policy = ScriptedPolicy(tok, MiniNavScript("region"), scripted_logp(ROLL, CAL))
  rc = RolloutConfig(group_size=2)
  tasks = mini_nav_tasks()
  _LuckyEnv.lucky = False
  groups = rollout_groups(tasks, _LuckyEnv, policy, fmt, rc, task_id=lambda t: t.task_id)
  assert max(t.reward for t in groups[1]) == 0.0
  _LuckyEnv.lucky = True
  try:
    roles = InterventionRoles(NavigationRuleValidator(), PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id),
                              NavigationRuleVerifier())
    new, stats = intervene_groups(groups, tasks, _LuckyEnv, policy, fmt, roles, InterventionConfig(ppl_delta=delta),
                                  rc, task_id=lambda t: t.task_id)
  finally:
    _LuckyEnv.lucky = False
  assert stats.trajectories_success == 1
  assert (new[1][0] is not groups[1][0]) == replaced
  assert stats.groups_replaced == int(replaced)
  assert stats.trajectories_success_unintervened == int(not replaced)


@pytest.mark.parametrize("old_logp_temperature", [None, 0.5])
def test_the_pipeline_records_pi_cal_as_behaviour_at_the_ratio_temperature(tok, fmt, old_logp_temperature):
  """intervened_old_logp="cal": a Corrector-written token's behaviour log-prob is pi_cal scored under
  p_cal at the sampling temperature (0.8 here) or at ``old_logp_temperature``; the gate and Eq. 5 keep
  the temperature-1 scores, and drawn tokens keep their sampling log-probs."""
  t = 0.8
  policy = ScriptedPolicy(tok, MiniNavScript("region"), scripted_logp(ROLL, CAL))
  groups, new, stats, _ = _run(tok, fmt, policy=policy, behaviour_temperature=t, intervened_old_logp="cal",
                               old_logp_temperature=old_logp_temperature)
  assert stats.corrections_applied == 1
  want_t = old_logp_temperature or t
  assert policy.score_temperatures.count(want_t) == 1
  a = new[1][0].arrays()
  turn = next(x for x in new[1][0].turns if x.intervened)
  span = slice(turn.start, turn.end)
  ids = a["token_ids"][span]
  np.testing.assert_allclose(a["behaviour_logp"][span], _expected_logp(ids, CAL) / want_t, atol=1e-6)
  np.testing.assert_allclose(a["cal_logp"][span], _expected_logp(ids, CAL), atol=1e-6)
  np.testing.assert_allclose(a["roll_logp"][span], _expected_logp(ids, ROLL), atol=1e-6)
  drawn = a["loss_mask"] & ~a["intervened_mask"]
  np.testing.assert_allclose(a["behaviour_logp"][drawn], _expected_logp(a["token_ids"][drawn], ROLL) / t, atol=1e-6)


def test_intervened_old_logp_is_pi_roll_or_pi_cal_on_corrected_tokens_only(tok, fmt):
  _, new, _, _ = _run(tok, fmt)
  roll, cal = assemble_batch(new), assemble_batch(new, intervened_old_logp="cal")
  iv = np.asarray(roll.intervened_mask, bool)
  assert iv.sum() > 0
  np.testing.assert_array_equal(np.asarray(roll.old_logp)[iv], np.asarray(roll.roll_logp)[iv])  # ROLL
  np.testing.assert_array_equal(np.asarray(cal.old_logp)[iv], np.asarray(cal.cal_logp)[iv])  # CAL
  assert not np.allclose(np.asarray(roll.old_logp)[iv], np.asarray(cal.old_logp)[iv])
  np.testing.assert_array_equal(np.asarray(roll.old_logp)[~iv], np.asarray(cal.old_logp)[~iv])
  # Under pi_cal the first step's ratio on the corrected tokens is exp(ROLL - CAL): outside the clip.
  _, metrics = loss_from_batch(jnp.asarray(roll.old_logp), cal, LossConfig(name="rti"))
  assert float(metrics["clip_frac_intervened"]) == 1.0 and float(metrics["clip_frac_on_policy"]) == 0.0
  with pytest.raises(ValueError, match="intervened_old_logp"):
    assemble_batch(new, intervened_old_logp="behaviour")


@pytest.mark.parametrize("mode", ["roll", "cal"])
def test_a_recompute_pass_keeps_the_recorded_pi_cal_of_corrected_tokens(tok, fmt, mode):
  """loss.behaviour_logp=recompute recomputes every trained token's behaviour log-prob under the
  rollout context, except, with intervened_old_logp=cal, the corrected tokens' pi_cal (their context
  p_cal is not in the batch; the recorded value is of the same parameters)."""
  import types

  from rti_jax.trainer import Trainer

  _, new, _, _ = _run(tok, fmt, intervened_old_logp=mode)
  batch = assemble_batch(new)
  stub = types.SimpleNamespace(cfg=types.SimpleNamespace(loss=types.SimpleNamespace(intervened_old_logp=mode)),
                               _logp_fn=lambda params, ids, mask, positions: np.full(ids.shape, -9.0, np.float32))
  out = Trainer._recompute_behaviour(stub, batch, None)
  old, iv = np.asarray(out.old_logp), np.asarray(batch.intervened_mask, bool)
  trained = np.asarray(batch.loss_mask, bool)
  assert iv.sum() > 0 and (trained & ~iv).sum() > 0
  assert (old[trained & ~iv] == -9.0).all()
  if mode == "cal":
    np.testing.assert_array_equal(old[iv], np.asarray(batch.cal_logp)[iv])  # recorded pi_cal (temperature 1 here)
  else:
    assert (old[iv] == -9.0).all()
