"""Self-intervention plumbing: the trainer builds its roles through ``pipeline.make_roles`` (LLM
judges on the policy's own backend, in a chat without the agent's tools, within a context budget and
an answer budget), counts malformed and over-budget judge answers per role, and stops a run whose
judges write mostly unusable answers before it trains on the iteration."""

from __future__ import annotations

import pytest

from rti_jax import reporting
from rti_jax.config import ConfigError, load_config
from rti_jax.envs.base import StepResult
from rti_jax.envs.source import TaskSource
from rti_jax.intervention import pipeline
from rti_jax.intervention.judges import JudgeLLM, LLMValidator, LLMVerifier, StepContext
from rti_jax.intervention.stats import InterventionStats
from rti_jax.trainer import Trainer
from trainer_fixtures import LengthRewardEnv

TOOLS = [{"type": "function", "function": {"name": "route_planner", "description": "Plans a route.",
                                           "parameters": {"type": "object", "properties": {}}}}]


class NeverEnv(LengthRewardEnv):
  """Every reply fails: every group is all-fail, so every iteration intervenes."""

  def step(self, assistant_text):
    self._t.num_turns += 1
    self._t.reward, self._t.done = 0.0, True
    return StepResult(messages=[], done=True, reward=0.0)

  def tool_schemas(self):
    return TOOLS


def _source() -> TaskSource:
  return TaskSource(train=list(range(8)), test=[100, 101], env_factory=NeverEnv, task_id=str, subsets={},
                    domain="navigation", tool_schemas=TOOLS)


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
  """A random toy Qwen3 whose context holds a judge prompt (about 1,300 ids with the toy tokenizer)."""
  from models.chat import build_tiny_tokenizer
  from trainer_fixtures import WORDS, write_random_qwen

  path = tmp_path_factory.mktemp("judge_policy")
  tok = build_tiny_tokenizer(WORDS, path)
  return write_random_qwen(path, len(tok), seed=0, layers=1, heads=2, kv_heads=1, head_dim=8, max_positions=2048)


def _cfg(policy: str, *extra: str):
  return load_config("navigation", [
      f"policy.path={policy}", "loss.method=rti", "rollout.tasks_per_iter=2", "rollout.group_size=2",
      "rollout.max_new_tokens=6", "rollout.max_context=2048", "train.iterations=2", "train.checkpoint_every=1",
      "train.eval_every=100", "train.val_tasks=0", "intervention.validator=llm", "intervention.verifier=llm",
      "intervention.judge_max_new_tokens=12", *extra])


def test_the_trainer_judges_with_the_policy_in_a_chat_without_tools(policy, tmp_path):
  """One iteration with the policy as its own Validator (real forward passes): the judge chat has no
  tools although the agent's has, the answer budget is the config's, and the random policy's answers
  are counted as malformed (the drafts kept), not taken as verdicts."""
  trainer = Trainer(_cfg(policy, "intervention.max_malformed_rate=1.0"), tmp_path, source=_source(),
                    progress=False)
  roles = trainer.roles
  assert isinstance(roles.validator, LLMValidator) and isinstance(roles.verifier, LLMVerifier)
  judge = roles.validator.llm
  assert judge.backend is trainer.backend and trainer.formatter.tool_schemas and not judge.formatter.tool_schemas
  assert judge.params.max_new_tokens == 12 and judge.max_context_tokens == 2048
  prompt = judge.formatter.prompt_ids([{"role": "user", "content": "judge this"}])
  assert "route_planner" not in trainer.tokenizer.decode(prompt)
  record = trainer.iterate()
  assert record["rti/groups_triggered"] == 2 and record["rti/steps_total"] == 2  # one intervened rollout a group
  assert record["rti/validator_malformed"] == 2 and record["rti/validator_malformed_rate"] == 1.0
  assert record["rti/steps_flagged"] == 0  # a malformed answer keeps the draft


def test_judges_that_write_nothing_usable_stop_the_run_before_the_update(policy, tmp_path):
  trainer = Trainer(_cfg(policy, "rollout.tasks_per_iter=8"), tmp_path, source=_source(), progress=False)
  with pytest.raises(pipeline.JudgeOutputError, match=r"^intervention\.max_malformed_rate: the validator's answers "
                                                      r"were malformed in 8 of 8 cases"):
    trainer.train()
  assert not (tmp_path / "metrics.jsonl").exists() or reporting.read_jsonl(tmp_path / "metrics.jsonl") == []
  assert trainer.iteration == 0


class _Echo:
  """A backend double whose answers are fixed texts (the budget check happens before it is asked)."""

  def __init__(self):
    self.asked = 0

  def generate(self, prompts, params, seed):
    raise AssertionError("an over-budget prompt must not be sent")


def test_a_judge_prompt_over_the_budget_is_skipped_and_counted(policy, tmp_path):
  trainer = Trainer(_cfg(policy, "intervention.max_malformed_rate=1.0"), tmp_path, source=_source(),
                    progress=False)
  fmt = trainer.roles.validator.llm.formatter
  llm = JudgeLLM(_Echo(), fmt, max_context_tokens=20)
  ctx = StepContext(user_query="go north", history=(), draft="go " * 50, tools=(), evidence={}, domain="navigation")
  assert llm.ask(["go " * 50]) == [None]
  (v,) = LLMValidator(llm).validate([ctx])
  assert v.is_valid and v.over_context and not v.malformed
  (r,) = LLMVerifier(llm).verify([ctx], ["go north"])
  assert not r.ok and r.reasons == ("over_context",) and r.over_context
  stats = InterventionStats(steps_total=10, validator_over_context=10, validator_malformed=0)
  assert stats.malformed_rates()["validator"] == (0, 0)  # skipped steps are not answers
  pipeline.check_malformed(stats, ["validator"], 0.5)  # nothing to judge: no error


@pytest.mark.parametrize("overrides,key", [
    (["intervention.judge_max_new_tokens=0"], "intervention.judge_max_new_tokens"),
    (["intervention.judge_max_context=-1"], "intervention.judge_max_context"),
    (["intervention.judge_max_context=4096"], "intervention.judge_max_context"),  # over the sampler's 2048
    (["intervention.judge_max_new_tokens=2048"], "intervention.judge_max_new_tokens"),  # no room for a prompt
    (["intervention.max_malformed_rate=1.5"], "intervention.max_malformed_rate"),
])
def test_judge_budgets_are_checked_by_key(overrides, key):
  with pytest.raises(ConfigError, match=rf"^{key}:"):
    _cfg("x", *overrides)


def _traj(texts):
  from rti_jax.rollout import Trajectory

  msgs = [{"role": "user", "content": "go"}] + [{"role": "assistant", "content": t} for t in texts]
  return Trajectory(task_id="0", token_ids=[], loss_mask=[], behaviour_logp=[], roll_logp=[], cal_logp=[],
                    intervened_mask=[], prompt_len=0, messages=msgs)


def test_table6_counts_tool_calls_and_characters_per_trajectory():
  call = '<tool_call>\n{"name": "route_planner", "arguments": {"a": 1}}\n</tool_call>'
  stats = InterventionStats()
  pipeline.count_turns(stats, "corrected", _traj([call + call, "done"]))
  pipeline.count_turns(stats, "original", _traj(["hm"]))
  pipeline.count_turns(stats, "original", _traj([call, "<tool_call>{broken</tool_call>"]))
  assert (stats.corrected_trajectories, stats.corrected_tool_calls, stats.corrected_chars) == (1, 2, 2 * len(call) + 4)
  assert (stats.original_trajectories, stats.original_tool_calls) == (2, 1)
  avg = {name: mean for name, _, _, mean in stats.averages()}
  assert avg["tool calls per corrected trajectory"] == 2.0 and avg["tool calls per original trajectory"] == 0.5


def test_table6_in_the_report_sums_iterations_and_seeds():
  from rti_jax.experiment import table6_rows

  def rec(**kw):
    return {f"rti/{k}": v for k, v in kw.items()}

  results = {"methods": ["base", "grpo", "rti"], "runs": {
      "0": {"grpo_records": [rec(groups_total=8, groups_triggered=0)],
            "rti_records": [rec(groups_total=8, groups_triggered=2, steps_total=10, steps_flagged=4,
                                verifier_accepted=3, verifier_rejected=1, corrected_trajectories=1,
                                corrected_tool_calls=3, original_trajectories=16, original_tool_calls=16,
                                **{"verifier_rejected/leak": 1})]},
      "1": {"grpo_records": [], "rti_records": [rec(groups_total=8, groups_triggered=6, steps_total=30,
                                                    steps_flagged=6, corrections_applied=2, accepted_ppl_sum=5.0)]}}}
  cols, rows = table6_rows(results)
  assert cols == ["statistic", "rti"]  # GRPO never intervened
  table = {r[0]: r[1] for r in rows}
  assert table["groups with intervention triggered"] == "8 / 16 (50.0%)"
  assert table["steps flagged invalid by the Validator"] == "10 / 40 (25.0%)"
  assert table["  rejected: leak"] == 1
  assert table["tool calls per corrected trajectory"] == "3.0" and table["tool calls per original trajectory"] == "1.0"
  assert table["mean PPL of applied corrections"] == "2.500"


def test_another_local_policy_can_play_the_roles_and_write_the_corrections(policy, tmp_path):
  """``intervention.intervener_path``: a second checkpoint sampled in-process judges and corrects
  through the same path (Fig. 6's stronger intervener); the policy still rolls out."""
  import shutil

  from models.weights import from_pretrained
  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.intervention.judges import PolicyCorrector
  from trainer_fixtures import write_random_qwen

  other = tmp_path / "intervener"
  shutil.copytree(policy, other)
  write_random_qwen(other, from_pretrained(policy)[1].vocab_size, seed=1, layers=1, heads=2, kv_heads=1, head_dim=8,
                    max_positions=2048)
  trainer = Trainer(_cfg(policy, f"intervention.intervener_path={other}", "intervention.max_malformed_rate=1.0"),
                    tmp_path / "run", source=_source(), progress=False)
  judge = trainer.roles.validator.llm.backend
  assert isinstance(judge, JaxBackend) and judge is not trainer.backend
  assert isinstance(trainer.roles.corrector, PolicyCorrector) and trainer.roles.corrector.backend is judge
  record = trainer.iterate()
  assert record["rti/steps_total"] == 2
  with pytest.raises(ConfigError, match=r"^intervention\.intervener_path"):
    _cfg(policy, f"intervention.intervener_path={tmp_path / 'missing'}")
