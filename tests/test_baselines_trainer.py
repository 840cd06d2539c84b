"""Trainer-side support of the baselines (rti_jax/baselines.py) against independent references.

AEPO's entropy and OPD's teacher log-probs are checked against transformers (torch) forward
passes of the same checkpoints; LUFFY's demonstrations against the SFT data path's layout of
the same oracle conversation (``sft_data.encode_messages``) and torch log-probs. The trainer
hooks are checked on the batch the jitted step really receives.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen3ForCausalLM

from models.chat import build_tiny_tokenizer
from rti_jax import baselines
from rti_jax.config import ConfigError, load_config
from rti_jax.envs import navigation
from rti_jax.rollout import Trajectory
from trainer_fixtures import write_random_qwen


@pytest.fixture(scope="module")
def dirs(nav_policy, nav_teacher, tmp_path_factory):
  """A tiny random Navigation policy, a teacher with the same tokenizer (both from tests/conftest.py),
  and one with another tokenizer."""
  root = tmp_path_factory.mktemp("baselines")
  tok = build_tiny_tokenizer(["go", "left", "right"], root / "other")
  return {"policy": nav_policy, "teacher": nav_teacher, "other": write_random_qwen(root / "other", len(tok), 3)}


def _torch_logits(path: str, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  model = Qwen3ForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask)).logits.numpy()


def _np_entropy(logits: np.ndarray) -> np.ndarray:
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  ent = -(np.exp(logp) * logp).sum(-1)
  return np.concatenate([np.zeros_like(ent[:, :1]), ent[:, :-1]], axis=1)


def _np_next_logp(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  got = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], axis=-1)[..., 0]
  return np.concatenate([np.zeros_like(got[:, :1]), got], axis=1)


def _nav_cfg(policy: str, method: str, *extra: str):
  return load_config("navigation", [
      f"policy.path={policy}", f"loss.method={method}", "rollout.tasks_per_iter=2", "rollout.group_size=2",
      "rollout.max_new_tokens=8", "train.iterations=1", "env.num_train=8", "env.num_test=4", "env.max_turns=2",
      "optim.length_chunks=1", "optim.epochs=1", "train.val_tasks=0", *extra])  # one step on the whole batch: the spy sees it


# --- AEPO: entropy -------------------------------------------------------------------------


def test_token_entropy_matches_numpy_and_is_aligned_with_next_token_logprobs():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 7)).astype(np.float32) * 3
  got = np.asarray(baselines.token_entropy(logits))
  np.testing.assert_allclose(got, _np_entropy(logits), rtol=1e-5, atol=1e-5)
  assert got.shape == (3, 5) and np.all(got[:, 0] == 0)
  assert np.all(got[:, 1:] > 0) and np.all(got <= np.log(7) + 1e-5)  # bounded by the uniform entropy
  with pytest.raises(ValueError, match="logits"):
    baselines.token_entropy(np.zeros((3, 5), np.float32))


def _capture_batches(trainer):
  """Records every batch the trainer hands to its jitted step (a frozen dataclass: swapped copy)."""
  import dataclasses

  seen = []
  real = trainer.train_step.step

  def spy(state, batch):
    seen.append(batch)
    return real(state, batch)

  trainer.train_step = dataclasses.replace(trainer.train_step, step=spy)
  return seen


@pytest.mark.slow
def test_aepo_trainer_feeds_the_sampling_policy_entropy_to_the_loss(dirs, tmp_path):
  from rti_jax.trainer import Trainer

  trainer = Trainer(_nav_cfg(dirs["policy"], "aepo", "loss.aggregation=token-mean"), tmp_path / "aepo",
                    progress=False)
  seen = _capture_batches(trainer)
  raw = []
  entropy_fn = trainer.hooks.entropy_fn
  trainer.hooks.entropy_fn = lambda *a: raw.append(np.asarray(entropy_fn(*a))) or raw[-1]
  rec = trainer.train()[0]
  assert len(seen) == 1 and len(raw) == 1 and np.isfinite(rec["loss"])
  batch = seen[0]
  assert batch.entropy is not None and batch.teacher_logp is None
  ids, mask = np.asarray(batch.input_ids), np.asarray(batch.attention_mask)
  ent = _np_entropy(_torch_logits(dirs["policy"], ids, mask)) * mask  # the parameters that drew the rollouts
  np.testing.assert_allclose(raw[0], ent, rtol=2e-4, atol=2e-4)
  trained = np.asarray(batch.loss_mask) != 0
  assert ent[trained].min() > 0
  # the loss sees them standardised over the minibatch's trained tokens (Bessel std), 0 elsewhere
  r = raw[0].astype(np.float64)
  want = np.where(trained, (r - r[trained].mean()) / r[trained].std(ddof=1), 0.0)
  np.testing.assert_allclose(np.asarray(batch.entropy), want, rtol=1e-5, atol=1e-5)


# --- OPD: teacher log-probs ----------------------------------------------------------------


@pytest.mark.slow
def test_opd_trainer_feeds_teacher_logprobs_of_the_student_tokens(dirs, tmp_path):
  from rti_jax.trainer import Trainer

  cfg = _nav_cfg(dirs["policy"], "opd", f"baselines.teacher_path={dirs['teacher']}")
  trainer = Trainer(cfg, tmp_path / "opd", progress=False)
  seen = _capture_batches(trainer)
  rec = trainer.train()[0]
  assert np.isfinite(rec["loss"]) and rec["grad_norm"] > 0  # the teacher term moves the student
  batch = seen[0]
  ids, mask = np.asarray(batch.input_ids), np.asarray(batch.attention_mask)
  ref = _np_next_logp(_torch_logits(dirs["teacher"], ids, mask), ids) * mask
  np.testing.assert_allclose(np.asarray(batch.teacher_logp), ref, rtol=2e-4, atol=2e-4)
  lm = np.asarray(batch.loss_mask) != 0
  # teacher != student: the OPD advantage is not the task advantage
  assert np.abs(np.asarray(batch.teacher_logp)[lm] - np.asarray(batch.old_logp)[lm]).max() > 0.1


def test_opd_teacher_must_exist_and_share_the_tokenizer(dirs, tmp_path):
  with pytest.raises(ConfigError, match="baselines.teacher_path"):
    _nav_cfg(dirs["policy"], "opd")
  from transformers import AutoTokenizer

  tok = AutoTokenizer.from_pretrained(dirs["policy"])
  with pytest.raises(ValueError, match="baselines.teacher_path.*tokenizer"):
    baselines.load_teacher(dirs["other"], tok, len(tok))
  with pytest.raises(ValueError, match="baselines.teacher_path.*config.json"):
    baselines.load_teacher(tmp_path / "missing", tok, len(tok))


# --- LUFFY: oracle demonstrations ----------------------------------------------------------


@pytest.fixture(scope="module")
def nav_stack(dirs):
  from models import from_pretrained
  from transformers import AutoTokenizer

  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.rollout import ChatFormatter

  model, _ = from_pretrained(dirs["policy"])
  tok = AutoTokenizer.from_pretrained(dirs["policy"])
  bench = navigation.load_benchmark("tiny", num_train=8, num_test=4, seed=0, max_turns=6)
  backend = JaxBackend(model, max_cache_len=2048, pad_id=int(tok.pad_token_id or 0))
  return bench, ChatFormatter(tok), backend


def test_demonstrations_are_laid_out_like_the_sft_data_and_marked_off_policy(dirs, nav_stack):
  from rti_jax.policy.sft_data import encode_messages, play

  bench, fmt, backend = nav_stack
  tasks = bench.train[:3]
  env_factory = lambda: navigation.NavigationEnv(bench.world)  # noqa: E731
  demos = baselines.demonstration_trajectories(tasks, env_factory, navigation.OracleAgent, backend, fmt, 2048 - 96,
                                               task_id=lambda t: t.task_id)
  for task, demo in zip(tasks, demos):
    assert demo is not None and demo.reward == 1.0 and demo.info["off_policy"]
    ref_ids, ref_mask = encode_messages(fmt, play(env_factory(), navigation.OracleAgent(task), task))
    assert demo.token_ids == ref_ids and demo.loss_mask == ref_mask
    assert demo.intervened_mask == demo.loss_mask  # every trained token is off-policy
    ids = np.asarray([demo.token_ids])
    ref_lp = _np_next_logp(_torch_logits(dirs["policy"], ids, np.ones_like(ids)), ids)[0]
    lm = np.asarray(demo.loss_mask)
    np.testing.assert_allclose(np.asarray(demo.behaviour_logp)[lm], ref_lp[lm], rtol=2e-4, atol=2e-4)
    assert np.all(np.asarray(demo.behaviour_logp)[~lm] == 0)
  # with the rollouts' behaviour log-probs at temperature 0.8, the demonstrations' are too
  (hot,) = baselines.demonstration_trajectories(tasks[:1], env_factory, navigation.OracleAgent, backend, fmt,
                                                2048 - 96, task_id=lambda t: t.task_id, behaviour_temperature=0.8)
  ids = np.asarray([hot.token_ids])
  ref_lp = _np_next_logp(_torch_logits(dirs["policy"], ids, np.ones_like(ids)) / 0.8, ids)[0]
  lm = np.asarray(hot.loss_mask)
  np.testing.assert_allclose(np.asarray(hot.behaviour_logp)[lm], ref_lp[lm], rtol=2e-4, atol=2e-4)


def _traj(reward: float, tag: str) -> Trajectory:
  return Trajectory(task_id=tag, token_ids=[1], loss_mask=[False], behaviour_logp=[0.0], roll_logp=[0.0],
                    cal_logp=[0.0], intervened_mask=[False], prompt_len=1, messages=[], reward=reward)


def test_mix_replaces_one_member_of_all_fail_groups_and_counts_bad_demonstrations(nav_stack):
  bench, fmt, backend = nav_stack
  tasks = bench.train[:3]
  env_factory = lambda: navigation.NavigationEnv(bench.world)  # noqa: E731
  groups = [[_traj(0.0, f"{n}.{i}") for i in range(3)] for n in range(3)]
  groups[1][0].reward = 1.0  # group 1 has a success: not all-fail
  kw = dict(task_id=lambda t: t.task_id)
  mixed, stats = baselines.mix_demonstrations(groups, tasks, env_factory, navigation.OracleAgent, backend, fmt,
                                              1900, **kw)
  assert stats.as_dict() == {"luffy/groups_eligible": 2, "luffy/groups_mixed": 2, "luffy/demos_failed": 0,
                             "luffy/demos_error": 0, "luffy/demo_tokens": stats.demo_tokens}
  assert stats.demo_tokens == sum(sum(g[-1].loss_mask) for g in (mixed[0], mixed[2]))
  for n in (0, 2):
    assert mixed[n][:2] == groups[n][:2] and mixed[n][-1].info.get("off_policy") and mixed[n][-1].reward == 1.0
  assert mixed[1] == groups[1]
  always, st = baselines.mix_demonstrations(groups, tasks, env_factory, navigation.OracleAgent, backend, fmt, 1900,
                                            when="always", **kw)
  assert st.groups_mixed == 3 and always[1][-1].info.get("off_policy") and always[1][0].reward == 1.0

  class Broken:
    def __init__(self, task):
      self.task = task

    def act(self, messages):
      if self.task is tasks[0]:
        raise RuntimeError("demonstrator bug")
      return "I give up."  # the env ends the episode unsolved

  kept, bad = baselines.mix_demonstrations(groups, tasks, env_factory, Broken, backend, fmt, 1900, **kw)
  assert (bad.demos_error, bad.demos_failed, bad.groups_mixed) == (1, 1, 0)
  assert kept == [list(g) for g in groups]
  with pytest.raises(ValueError, match="when"):
    baselines.mix_demonstrations(groups, tasks, env_factory, Broken, backend, fmt, 1900, when="sometimes", **kw)
  with pytest.raises(ValueError, match="registers no demonstrator"):
    baselines.demonstrator_for("telecom")


def test_luffy_demonstrations_follow_the_policy_format(tmp_path):
  from rti_jax.envs import navigation as nav
  from rti_jax.policy.check_line import policy_check_line
  from rti_jax.policy.sft_data import play

  bench = nav.load_benchmark("tiny")
  task = next(t for t in bench.train if t.needs_disambiguation)
  env = nav.NavigationEnv(bench.world)
  turns = {}
  for check in (False, True):
    agent = baselines.demonstrator_for("navigation", check_line=check)(task)
    turns[check] = [m["content"] for m in play(env, agent, task) if m["role"] == "assistant"]
  assert turns[True][1] == turns[True][1].split("\n", 1)[0] + "\n" + turns[False][1]
  assert turns[True][1].startswith("Check: ") and turns[True][2:] == turns[False][2:]
  # the policy dir says which format it writes (build.json); none = no check line; a bad file is named
  assert policy_check_line(tmp_path) is False
  (tmp_path / "build.json").write_text('{"check_line": true}')
  assert policy_check_line(tmp_path) is True
  (tmp_path / "build.json").write_text("[1, 2")
  with pytest.raises(ValueError, match="build.json"):
    policy_check_line(tmp_path)


@pytest.mark.slow
def test_luffy_trainer_trains_on_oracle_tokens_marked_off_policy(dirs, tmp_path):
  from rti_jax.trainer import Trainer

  trainer = Trainer(_nav_cfg(dirs["policy"], "luffy", "loss.aggregation=token-mean", "env.max_turns=6"),
                    tmp_path / "luffy", progress=False)
  seen = _capture_batches(trainer)
  rec = trainer.train()[0]
  # A random policy fails every task: each group gets one oracle demonstration (the last row).
  assert rec["reward_mean"] == 0.0 and rec["luffy/groups_mixed"] == 2 and rec["reward_mean_after_intervention"] == 0.5
  assert rec["rti/groups_triggered"] == 0  # no RTI intervention for LUFFY
  batch = seen[0]
  iv = np.asarray(batch.intervened_mask) != 0
  assert iv[[1, 3]].any(axis=1).all() and not iv[[0, 2]].any()
  assert iv.sum() == rec["luffy/demo_tokens"]
  adv = np.asarray(batch.advantages)
  assert adv[1] > 0 > adv[0] and rec["grad_norm"] > 0
