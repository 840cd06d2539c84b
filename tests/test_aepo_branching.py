"""AEPO's entropy-balanced branching rollout (rti_jax/aepo_rollout.py) on a toy multi-turn env.

The policy is the bigram stand-in (``BigramBackend``) over the byte tokenizer; step entropies
are scripted where a test needs to control them. Checked: exactly G members per group,
branched members share their parent's prefix token-for-token, the budget split against a
numpy re-derivation, the consecutive branch penalty lowers branching, branching off equals
``rollout_groups``, and zero / malformed entropies do not crash.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rti_jax import aepo_rollout, baselines
from rti_jax.aepo_rollout import BranchingConfig, aepo_rollout_groups, global_rollout_count
from rti_jax.config import ConfigError, load_config
from rti_jax.envs.base import StepResult
from rti_jax.generation.base import Completion, SamplingParams
from rti_jax.policy.tokenizer import byte_tokenizer
from rti_jax.rollout import ChatFormatter, RolloutConfig, rollout_groups
from rti_jax.shapes import UPDATE_BUCKETS, bucket_length
from intervention_doubles import BigramBackend
from trainer_fixtures import LengthRewardEnv


class ToolEchoEnv(LengthRewardEnv):
  """``max_turns`` turns; every turn but the last is answered by a tool observation; reward by parity."""

  max_turns = 4

  def reset(self, task):
    self._n = 0
    return super().reset(task)

  def step(self, assistant_text):
    self._n += 1
    if self._n >= self.max_turns:
      return super().step(assistant_text)
    self._t.num_turns += 1
    return StepResult(messages=[{"role": "tool", "content": f"obs {self._n} of {len(assistant_text)}"}], done=False)


@pytest.fixture(scope="module")
def tok():
  return byte_tokenizer()


@pytest.fixture(scope="module")
def fmt(tok):
  return ChatFormatter(tok, None)


@pytest.fixture(scope="module")
def backend(tok):
  return BigramBackend(vocab_size=len(tok), seed=3, scale=1.0)


def _config(group_size=4, seed=0):
  return RolloutConfig(group_size=group_size, sampling=SamplingParams(max_new_tokens=5, temperature=1.0),
                       max_context_tokens=512, seed=seed)


def scripted_entropy(tok, root: float, tool: float):
  """Step entropy ``root`` for a first turn and ``tool`` for a turn after a tool observation."""
  tool_id = tok.convert_tokens_to_ids("<tool_response>")

  def fn(contexts, completions):
    return np.asarray([tool if tool_id in ctx else root for ctx in contexts], np.float64)

  return fn


def _run(tok, fmt, backend, branching, *, group_size=4, seed=0, root=0.0, tool=2.0, entropy_fn=None, tasks=(0, 1, 2)):
  return aepo_rollout_groups(list(tasks), ToolEchoEnv, backend, fmt, _config(group_size, seed), branching,
                             entropy_fn or scripted_entropy(tok, root, tool), task_id=str, seed=seed)


def _np_global_count(g, h_root, h_tool, beta):
  share = 1.0 / (1.0 + np.exp(-beta * (np.asarray(h_root) - np.asarray(h_tool))))
  return np.clip(np.floor(g * share + 0.5), 1, g).astype(int)


# --- structure -----------------------------------------------------------------------------


@pytest.mark.parametrize("group_size", [1, 2, 5, 8])
def test_every_group_has_exactly_group_size_members(tok, fmt, backend, group_size):
  branching = BranchingConfig(alloc_beta=1.0, branch_beta=1.0, penalty=0.3)
  groups, stats = _run(tok, fmt, backend, branching, group_size=group_size, root=0.0, tool=1.5)
  assert [len(g) for g in groups] == [group_size] * 3
  assert [{t.task_id for t in g} for g in groups] == [{"0"}, {"1"}, {"2"}]
  assert stats.global_rollouts + stats.branches == 3 * group_size
  assert stats.global_rollouts == stats.planned_global + stats.fill_rollouts
  assert all(t.done for g in groups for t in g)
  if group_size > 1:
    assert stats.branches > 0  # dH = 1.5 > 0 with p = 1 at the first candidate


def test_branched_members_share_the_parents_prefix_token_for_token(tok, fmt, backend):
  branching = BranchingConfig(alloc_beta=1.0, branch_beta=1.0, penalty=0.0)
  groups, stats = _run(tok, fmt, backend, branching, group_size=8, root=0.0, tool=3.0)
  assert stats.branches >= 3
  seen_fork_turns = set()
  for g in groups:
    for t in g:
      if "aepo_parent" not in t.info:
        continue
      parent, k = g[t.info["aepo_parent"]], t.info["aepo_fork_turn"]
      assert parent is not t and k >= 1
      start = t.turns[k].start  # the first token the branch sampled itself
      assert start == parent.turns[k].start
      for field in ("token_ids", "loss_mask", "behaviour_logp", "roll_logp", "cal_logp", "intervened_mask"):
        assert getattr(t, field)[:start] == getattr(parent, field)[:start], field
      assert t.messages[:len(t.messages) - 2 * (t.num_turns - k) + 1] == \
          parent.messages[:len(t.messages) - 2 * (t.num_turns - k) + 1]
      assert [r.text for r in t.turns[:k]] == [r.text for r in parent.turns[:k]]
      # behaviour log-probs of the branch's own tokens are the sampling policy's (bigram, temperature 1)
      own = [i for i in range(start, len(t.token_ids)) if t.loss_mask[i]]
      ref = [backend._logp(t.token_ids[i - 1])[t.token_ids[i]] for i in own]
      np.testing.assert_allclose([t.behaviour_logp[i] for i in own], ref, rtol=1e-5, atol=1e-5)
      seen_fork_turns.add(k)
  assert seen_fork_turns <= {1, 2, 3}


# --- budget allocation ---------------------------------------------------------------------


def test_global_count_matches_a_numpy_rederivation():
  rng = np.random.default_rng(0)
  g = rng.integers(1, 17, size=400)
  h_root, h_tool = rng.gamma(2.0, 1.0, size=400), rng.gamma(2.0, 1.0, size=400)
  beta = rng.choice([0.0, 0.5, 1.0, 4.0], size=400)
  got = [global_rollout_count(int(a), b, c, d) for a, b, c, d in zip(g, h_root, h_tool, beta)]
  np.testing.assert_array_equal(got, _np_global_count(g, h_root, h_tool, beta))
  assert global_rollout_count(8, 2.0, None, 3.0) == 4  # no tool turn: zero gap -> G / 2
  assert global_rollout_count(8, float("nan"), 1.0, 3.0) == 4
  assert global_rollout_count(8, 0.0, 100.0, 1.0) == 1 and global_rollout_count(8, 100.0, 0.0, 1.0) == 8


@pytest.mark.parametrize("root,tool,beta", [(0.0, 1.0, 1.0), (1.0, 0.2, 2.0), (0.5, 0.5, 1.0), (3.0, 0.0, 0.3)])
def test_rollout_plans_the_numpy_global_count(tok, fmt, backend, root, tool, beta):
  branching = BranchingConfig(alloc_beta=beta, branch_beta=1.0, penalty=0.5)
  groups, stats = _run(tok, fmt, backend, branching, group_size=8, root=root, tool=tool)
  m = int(_np_global_count(8, root, tool, beta))
  assert stats.planned_global == 3 * m
  for g in groups:
    globals_ = [t for t in g if "aepo_parent" not in t.info]
    assert len(globals_) >= m and len(g) == 8


# --- consecutive branch penalty -------------------------------------------------------------


def _consecutive_forks(group):
  """Forks at turn t of a lineage that also forked at turn t - 1 (brute force over the group)."""
  count = 0
  for t in group:
    if "aepo_parent" not in t.info:
      continue
    p, k = group[t.info["aepo_parent"]], t.info["aepo_fork_turn"]
    parent_forked_before = p.info.get("aepo_fork_turn") == k - 1 or any(
        s.info.get("aepo_parent") == group.index(p) and s.info["aepo_fork_turn"] == k - 1 for s in group)
    count += bool(parent_forked_before)
  return count


def test_consecutive_branch_penalty_lowers_branching(tok, fmt, backend):
  totals = {}
  for penalty in (0.0, 0.6, 1.0):
    branching = BranchingConfig(alloc_beta=1.0, branch_beta=0.3, penalty=penalty)  # p = 0.6 before the penalty
    branches = consecutive = 0
    for seed in range(12):
      groups, stats = _run(tok, fmt, backend, branching, group_size=16, seed=seed, root=0.0, tool=2.0,
                           tasks=(0, 1))
      branches += stats.branches
      consecutive += sum(_consecutive_forks(g) for g in groups)
      assert [len(g) for g in groups] == [16, 16]
    totals[penalty] = (branches, consecutive)
  assert totals[0.0][1] > totals[0.6][1] > totals[1.0][1] == 0, totals
  assert totals[0.0][0] > totals[0.6][0] > totals[1.0][0] > 0, totals


def test_branch_probability_formula():
  assert aepo_rollout.branch_probability(0.5, 0, 1.0, 0.5) == pytest.approx(0.5)
  assert aepo_rollout.branch_probability(0.5, 2, 1.0, 0.5) == pytest.approx(0.125)
  assert aepo_rollout.branch_probability(9.0, 1, 1.0, 0.2) == pytest.approx(0.8)
  assert aepo_rollout.branch_probability(-1.0, 0, 1.0, 0.0) == 0.0


# --- switches and robustness ----------------------------------------------------------------


def test_branching_off_equals_plain_rollout_groups(tok, fmt, backend):
  groups, stats = _run(tok, fmt, backend, None, group_size=4, seed=7)
  plain = rollout_groups([0, 1, 2], ToolEchoEnv, backend, fmt, _config(4, 7), task_id=str, seed=7)
  assert [[dataclasses.asdict(t) for t in g] for g in groups] == [[dataclasses.asdict(t) for t in g] for g in plain]
  assert stats.branches == 0 and stats.global_rollouts == 12


def test_zero_entropy_gives_only_global_rollouts(tok, fmt, backend):
  groups, stats = _run(tok, fmt, backend, BranchingConfig(), group_size=4, root=0.0, tool=0.0)
  assert stats.branches == 0 and stats.fork_candidates == 0
  assert stats.planned_global == 3 * 2 and stats.fill_rollouts == 3 * 2
  assert [len(g) for g in groups] == [4, 4, 4]


def test_malformed_entropies_and_empty_turns_do_not_crash(tok, fmt, backend):
  def nan_fn(contexts, completions):
    return np.asarray([np.nan if i % 2 else np.inf for i in range(len(contexts))])

  groups, stats = _run(tok, fmt, backend, BranchingConfig(), group_size=4, entropy_fn=nan_fn)
  assert [len(g) for g in groups] == [4, 4, 4] and stats.branches == 0

  class EmptyBackend:
    """Returns an empty, length-cut completion for every prompt."""

    def generate(self, prompts, params, seed):
      return [Completion(np.zeros(0, np.int32), np.zeros(0, np.float32), "length") for _ in prompts]

  groups, stats = aepo_rollout_groups([0, 1], ToolEchoEnv, EmptyBackend(), fmt, _config(3), BranchingConfig(),
                                      aepo_rollout.surprisal_entropy(4), task_id=str)
  assert [len(g) for g in groups] == [3, 3] and stats.branches == 0

  with pytest.raises(RuntimeError, match="entropy_fn: expected"):
    _run(tok, fmt, backend, BranchingConfig(), entropy_fn=lambda c, x: np.zeros(1))


def test_surprisal_entropy_is_the_mean_negative_logprob_of_the_first_tokens():
  comps = [Completion(np.arange(3), np.asarray([-1.0, -2.0, -6.0], np.float32), "stop"),
           Completion(np.zeros(0, np.int32), np.zeros(0, np.float32), "length")]
  np.testing.assert_allclose(aepo_rollout.surprisal_entropy(2)([[1], [2]], comps), [1.5, 0.0])
  with pytest.raises(ValueError, match="num_tokens"):
    aepo_rollout.surprisal_entropy(0)


def test_exact_turn_entropy_reads_the_completion_positions():
  """A fake entropy_fn returning each position's token id shows which positions are averaged."""
  calls = []

  def fake(params, ids, mask):
    calls.append(ids.shape)
    return np.asarray(ids, np.float64) * np.asarray(mask)

  fn = baselines.make_turn_entropy_fn(fake, lambda: None, pad_id=0, num_tokens=2)
  comps = [Completion(np.asarray([10, 20, 30]), np.zeros(3, np.float32), "stop"),
           Completion(np.asarray([7]), np.zeros(1, np.float32), "length"),
           Completion(np.zeros(0, np.int32), np.zeros(0, np.float32), "length")]
  got = fn([[1, 2, 3], [4] * 200, [5]], comps)
  np.testing.assert_allclose(got, [15.0, 7.0, 0.0])
  assert calls == [(4, 256)]  # batch and length padded to powers of two
  # with the trainer's per-octave rule: 2,100 tokens pad to 2,560 (a quarter of 2,048 a step), not 2,176
  per_octave = baselines.make_turn_entropy_fn(fake, lambda: None, pad_id=0, num_tokens=2,
                                              buckets={**UPDATE_BUCKETS, "per_octave": 4})
  np.testing.assert_allclose(per_octave([[4] * 2099], comps[1:2]), [7.0])
  assert calls[-1] == (1, 2560) and bucket_length(2100, **UPDATE_BUCKETS) == 2176


def test_branching_config_rejects_bad_knobs():
  with pytest.raises(ValueError, match="penalty"):
    BranchingConfig(penalty=1.5)
  with pytest.raises(ValueError, match="alloc_beta"):
    BranchingConfig(alloc_beta=-1.0)
  for override, key in (("baselines.aepo_branch_penalty=2.0", "aepo_branch_penalty"),
                        ("baselines.aepo_entropy=magic", "aepo_entropy"),
                        ("baselines.aepo_entropy_tokens=0", "aepo_entropy_tokens"),
                        ("baselines.aepo_branch_beta=-1", "aepo_branch_beta"),
                        ("baselines.aepo_branch_threshold=inf", "aepo_branch_threshold")):
    with pytest.raises(ConfigError, match=key):
      load_config("navigation", [override])
  assert load_config("navigation", []).baselines.aepo_branching is True


# --- trainer wiring ---------------------------------------------------------------------------


@pytest.mark.slow
def test_trainer_aepo_rolls_out_with_branching_and_counts_it(toy_policy, tmp_path):
  from rti_jax.envs.source import TaskSource
  from rti_jax.trainer import Trainer

  path = toy_policy

  class TwoTurnEnv(ToolEchoEnv):
    max_turns = 2

  source = TaskSource(train=list(range(4)), test=[100], env_factory=TwoTurnEnv, task_id=str, subsets={},
                      domain="navigation")

  def cfg(*extra):
    return load_config("navigation", [
        f"policy.path={path}", "loss.method=aepo", "rollout.tasks_per_iter=2", "rollout.group_size=4",
        "rollout.max_new_tokens=3", "rollout.max_context=128", "train.iterations=1", "train.eval_every=100",
        "baselines.aepo_branch_beta=1e9", "baselines.aepo_branch_penalty=0", "train.val_tasks=0", *extra])

  trainer = Trainer(cfg(), tmp_path / "run", source=source, progress=False)
  seen = []
  real = trainer.backend.generate
  trainer.backend.generate = lambda prompts, params, seed: (seen.append(len(prompts)), real(prompts, params, seed))[1]
  rec = trainer.train()[0]
  assert np.isfinite(rec["loss"])
  assert rec["aepo/global_rollouts"] + rec["aepo/branches"] == 2 * 4
  assert rec["aepo/global_rollouts"] == rec["aepo/planned_global"] + rec["aepo/fill_rollouts"]
  assert rec["aepo/replay_mismatch"] == 0
  assert seen[0] == 2  # the pre-monitoring probes: one per task, batched
  # a random policy's step entropies barely differ: any dH > 0 forks (branch_beta = 1e9), budget allowing
  assert rec["aepo/branches"] == min(rec["aepo/fork_candidates"], 8 - rec["aepo/planned_global"])
  off = Trainer(cfg("baselines.aepo_branching=false"), tmp_path / "off", source=source, progress=False)
  assert off.hooks.branching is None and trainer.hooks.branching.penalty == 0.0
