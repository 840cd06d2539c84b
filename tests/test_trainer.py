"""The trainer: Algorithm 1 runs end to end, resumes exactly, and switches methods correctly.

A tiny random Qwen3 policy with a small byte-level BPE tokenizer (``toy_policy`` in
tests/conftest.py) is trained; a toy one-turn environment whose reward depends on the sampled
text gives non-zero advantages, so parameters really move and the resume test can fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from transformers import Qwen3ForCausalLM

from rti_jax import reporting
from rti_jax.config import load_config
from rti_jax.envs.source import TaskSource
from rti_jax.shapes import UPDATE_BUCKETS, bucket_length
from rti_jax.trainer import TIMING_KEYS, Trainer, resolve_mesh_shape
from trainer_fixtures import LengthRewardEnv

LR = 0.01  # the toy runs' learning rate


class ParityEnv(LengthRewardEnv):
  """One turn; reward 1 iff the reply has an even number of characters."""

  modulus = 2


def _toy_source():
  return TaskSource(train=list(range(12)), test=list(range(100, 104)), env_factory=ParityEnv,
                    task_id=str, subsets={"even_task": lambda t: t % 2 == 0}, domain="navigation")


def _cfg(policy, *extra):
  return load_config("navigation", [
      f"policy.path={policy}", "loss.method=grpo", "rollout.tasks_per_iter=2", "rollout.group_size=4",
      "rollout.max_new_tokens=6", "rollout.max_context=128", "train.iterations=3", "train.checkpoint_every=1",
      f"optim.lr={LR}", "train.eval_every=100", "train.val_tasks=0", *extra])


def _strip(records):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


@pytest.mark.slow
def test_killed_and_resumed_run_equals_uninterrupted_run(toy_policy, tmp_path):
  full = Trainer(_cfg(toy_policy), tmp_path / "full", source=_toy_source(), progress=False).train()
  assert len(full) == 3
  # The run really learns something: non-zero advantages, gradients and parameter updates.
  assert all(r["grad_norm"] > 0 for r in full)
  assert len({round(r["grad_norm"], 6) for r in full}) == 3  # on-policy GRPO loss is 0 at ratio 1; grads are not

  first = Trainer(_cfg(toy_policy), tmp_path / "cut", source=_toy_source(), progress=False)
  first.train(stop_after=2)  # "killed" after two iterations (checkpointed every iteration)
  resumed = Trainer(_cfg(toy_policy), tmp_path / "cut", source=_toy_source(), progress=False)
  records = resumed.train()
  assert resumed.iteration == 3
  assert _strip(records) == _strip(full)
  assert _strip(reporting.read_jsonl(tmp_path / "cut" / "metrics.jsonl")) == _strip(full)


@pytest.mark.slow
def test_grpo_never_intervenes_and_metrics_are_complete(toy_policy, tmp_path):
  recs = Trainer(_cfg(toy_policy, "train.iterations=1"), tmp_path / "g", source=_toy_source(),
                 progress=False).train()
  r = recs[0]
  assert r["rti/groups_triggered"] == 0 and r["rti/trajectories_intervened"] == 0
  for key in ("reward_mean", "all_fail_group_frac", "loss", "grad_norm", "clip_frac", "approx_kl_k3",
              "tokens_per_s", "time/iteration_s", "turn_hist", "rti/mean_accepted_ppl"):
    assert key in r, key
  assert 0.0 <= r["all_fail_group_frac"] <= 1.0


@pytest.mark.slow
def test_rti_on_navigation_triggers_intervention_for_all_fail_groups(nav_policy, tmp_path):
  """A random policy fails every Navigation task: every group triggers the intervention pipeline."""
  from transformers import AutoTokenizer

  exp = load_config("navigation", [
      f"policy.path={nav_policy}", "loss.method=rti", "rollout.tasks_per_iter=2", "rollout.group_size=2",
      "rollout.max_new_tokens=8", "train.iterations=1", "env.num_train=8", "env.num_test=4", "env.max_turns=2",
      "train.val_tasks=0"])
  trainer = Trainer(exp, tmp_path / "run", progress=False)
  rec = trainer.train()[0]
  assert rec["reward_mean"] == 0.0 and rec["all_fail_group_frac"] == 1.0
  assert rec["rti/groups_triggered"] == 2 and rec["rti/trajectories_intervened"] == 2
  assert rec["rti/steps_total"] >= 2
  ev = trainer.evaluate(trainer.source.test[:2], samples=2, seed=0)
  assert ev["all"]["p@1"] == 0.0 and np.asarray(ev["successes"]).shape == (2, 2)
  trainer.export(tmp_path / "hf")
  import json

  gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
  stops = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
  assert trainer.formatter.turn_end_ids and set(trainer.formatter.turn_end_ids) <= set(stops)
  reloaded = Qwen3ForCausalLM.from_pretrained(str(tmp_path / "hf"))
  assert reloaded.config.vocab_size == len(AutoTokenizer.from_pretrained(nav_policy))


def test_bucket_length_and_mesh_shape():
  assert [bucket_length(n, **UPDATE_BUCKETS) for n in (1, 128, 129, 193, 257, 500, 513, 600, 1050, 1152)] == [
      128, 128, 192, 256, 384, 512, 640, 640, 1152, 1152]
  assert resolve_mesh_shape(-1, 1, 1, 8) == (8, 1, 1)
  assert resolve_mesh_shape(2, -1, 2, 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="mesh"):
    resolve_mesh_shape(3, -1, 1, 8)
  assert math.isfinite(bucket_length(10_000, **UPDATE_BUCKETS))


@pytest.mark.parametrize("per_octave", [2, 4, 8])
def test_bucket_length_per_octave_is_the_smallest_size_on_its_grid(per_octave):
  """With ``per_octave`` k, a length n above 512 pads to the smallest multiple of
  max(128, 2**floor(log2(n - 1)) / k) that holds it (brute force over every n): never more than
  1/k of padding, and at most k sizes per octave where the step is past 128."""
  rule = {**UPDATE_BUCKETS, "per_octave": per_octave}
  sizes = {}
  for n in range(1, 8193):
    got = bucket_length(n, **rule)
    if n <= 512:
      assert got == bucket_length(n, **UPDATE_BUCKETS)  # unchanged up to linear_above
      continue
    step = max(128, 2 ** math.floor(math.log2(n - 1)) // per_octave)
    assert got == next(m for m in range(step, 2 * n + step, step) if m >= n), n
    assert got - n < step and step <= max(128, n / per_octave), n
    sizes.setdefault(int(math.log2(got - 1)), set()).add(got)
  assert all(len(v) <= max(per_octave, 4) for k, v in sizes.items() if 2 ** k >= 128 * per_octave)
  assert len({bucket_length(n, **rule) for n in range(1025, 4097)}) == 2 * per_octave
  assert len({bucket_length(n, **UPDATE_BUCKETS) for n in range(1025, 4097)}) == 24


def test_length_chunks_sort_cut_and_pad_rows():
  from rti_jax.objectives import RTIBatch
  from rti_jax.objectives import length_chunks

  rng = np.random.default_rng(0)
  lengths = np.asarray([9, 3, 17, 5, 12, 2, 30, 7])
  t = 32
  am = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(1, 50, (8, t)).astype(np.int32) * am
  batch = RTIBatch(input_ids=ids, attention_mask=am, loss_mask=am.astype(np.float32),
                   old_logp=rng.normal(size=(8, t)).astype(np.float32) * am, advantages=np.arange(8, dtype=np.float32))
  bucket = lambda n: -(-n // 4) * 4  # noqa: E731
  chunks = length_chunks(batch, 4, bucket)
  order = np.argsort(lengths, kind="stable")
  assert [c.input_ids.shape for c in chunks] == [(2, bucket(int(lengths[r].max()))) for r in np.split(order, 4)]
  got = np.concatenate([c.advantages for c in chunks])
  np.testing.assert_array_equal(got, order.astype(np.float32))  # each row keeps its advantage
  for c, rows in zip(chunks, np.split(order, 4)):
    w = c.input_ids.shape[1]
    np.testing.assert_array_equal(c.input_ids, ids[rows, :w])
    np.testing.assert_array_equal(c.attention_mask.sum(1), lengths[rows])
  (whole,) = length_chunks(batch, 1, bucket)
  assert whole.input_ids.shape == (8, 32) and np.array_equal(whole.advantages, batch.advantages)
  with pytest.raises(ValueError, match="length_chunks"):
    length_chunks(batch, 3, bucket)


@pytest.mark.slow
def test_length_chunked_update_equals_the_single_batch_update(toy_policy, tmp_path):
  import jax

  runs = {}
  for beta in (0.0, 0.1):  # without and with the KL term (its reference log-probs are taken per chunk)
    for n in (1, 4):
      tr = Trainer(_cfg(toy_policy, "train.iterations=2", f"optim.length_chunks={n}", f"loss.beta={beta}"),
                   tmp_path / f"c{n}b{beta}", source=_toy_source(), progress=False)
      runs[beta, n] = (tr.train(), jax.tree.leaves(tr.state.params))
  # The loss and the gradient norm are sums in a different order: equal up to fp32 rounding.
  r1, k1 = runs[0.0, 1][0], runs[0.1, 1][0]
  assert k1[1]["loss"] != pytest.approx(r1[1]["loss"], rel=1e-6)  # the KL term is really in the loss
  for beta in (0.0, 0.1):
    for a, b in zip(runs[beta, 1][0], runs[beta, 4][0]):
      for key in ("loss", "grad_norm", "clip_frac", "approx_kl_k3", "num_tokens"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (beta, key)
  # Parameters: both runs start from the same weights, so their difference is the difference of the
  # two updates. Adam normalises each element's step to at most about lr per iteration, so equal
  # gradients up to summation order give updates equal up to a small fraction of lr; an element
  # whose gradient is near Adam's epsilon turns the rounding into a larger share of its step, so
  # one element may differ by up to a tenth of a step, the mean by far less. (A relative tolerance
  # on the raw parameters does not hold: a 0.01 parameter can move by 2e-4 of itself.)
  for beta in (0.0, 0.1):
    diff = np.concatenate([np.abs(np.asarray(x) - np.asarray(y)).ravel()
                           for x, y in zip(runs[beta, 1][1], runs[beta, 4][1])])
    assert diff.max() <= 0.1 * LR and diff.mean() <= 1e-4 * LR, (beta, diff.max() / LR, diff.mean() / LR)
  # 3 does not divide the 8 rows: the largest count below it that does (2) is used
  r3 = Trainer(_cfg(toy_policy, "train.iterations=1", "optim.length_chunks=3", "loss.beta=0"), tmp_path / "c3",
               source=_toy_source(), progress=False).train()
  assert r3[0]["grad_norm"] == pytest.approx(r1[0]["grad_norm"], rel=1e-4)


@pytest.mark.slow
def test_validation_split_is_kept_out_of_rollouts_and_monitored(toy_policy, tmp_path):
  """train.val_tasks: the last N train tasks are never rolled out in training; they are the
  periodic evaluation; the test split is untouched by training."""
  seen: list[int] = []

  class Spy(ParityEnv):
    def reset(self, task):
      seen.append(task)
      return super().reset(task)

  src = _toy_source()
  src.env_factory = Spy
  tr = Trainer(_cfg(toy_policy, "train.val_tasks=4", "train.iterations=4", "train.eval_every=2",
                    "train.eval_samples=2"), tmp_path / "v", source=src, progress=False)
  assert tr.val == [8, 9, 10, 11] and list(tr.source.train) == list(range(8))
  assert tr.monitor_tasks() == [8, 9, 10, 11]
  records = tr.train(eval_tasks=tr.monitor_tasks())
  evals = [r for r in records if "eval" in r]
  assert [r["iteration"] for r in evals] == [2, 4] and all(r["eval"]["num_tasks"] == 4 for r in evals)
  rollout_tasks = set(seen[:2 * 4 * 2])  # iterations 1-2 before the first evaluation: 2 tasks x 4 samples each
  assert rollout_tasks and rollout_tasks <= set(range(8))
  assert not set(seen) & set(src.test)
  # 4 iterations x 2 tasks = 8 = one pass over the 8 remaining train tasks, in a seeded order.
  train_seen = [t for t in seen if t < 8]
  assert set(train_seen) == set(range(8))
  # Without a validation split, monitoring falls back to the first train.eval_tasks test tasks.
  plain = Trainer(_cfg(toy_policy, "train.eval_tasks=2"), tmp_path / "p", source=_toy_source(), progress=False)
  assert plain.val == [] and plain.monitor_tasks() == [100, 101]


def test_rl_exclude_keeps_listed_tasks_out_of_rollouts_but_not_out_of_validation(toy_policy, tmp_path):
  """TaskSource.rl_exclude (``env.navigation.rl_exclude_listed``) drops train tasks from RL
  rollouts after the validation split, which it leaves alone; a filter that leaves nothing is named."""
  src = _toy_source()
  src.rl_exclude = lambda t: t % 3 == 0
  tr = Trainer(_cfg(toy_policy, "train.val_tasks=3"), tmp_path / "x", source=src, progress=False)
  assert tr.val == [9, 10, 11] and list(tr.source.train) == [1, 2, 4, 5, 7, 8]
  assert sorted({t for _ in range(4) for t in tr.next_tasks()}) == [1, 2, 4, 5, 7, 8]
  src = _toy_source()
  src.rl_exclude = lambda t: True
  with pytest.raises(ValueError, match="rl_exclude_listed"):
    Trainer(_cfg(toy_policy), tmp_path / "y", source=src, progress=False)


def test_navigation_source_rl_exclude_listed_option():
  from rti_jax.config import ConfigError
  from rti_jax.envs.navigation.source import navigation_source

  assert navigation_source(load_config("navigation")).rl_exclude is None
  src = navigation_source(load_config("navigation", ["env.navigation.rl_exclude_listed=true"]))
  listed = [t for t in src.train if src.rl_exclude(t)]
  assert listed and all(t.needs_disambiguation for t in listed)
  assert src.subsets["listed_alternative"] is not None
  with pytest.raises(ConfigError, match="rl_exclude_listed"):
    load_config("navigation", ["env.name=telecom", "env.navigation.rl_exclude_listed=true"])


def test_policy_chat_template_renders_the_rollouts_and_goes_with_the_export(toy_policy, tmp_path):
  from models.chat import qwen3_chat_template
  from transformers import AutoTokenizer

  trainer = Trainer(_cfg(toy_policy, "train.iterations=1", "policy.chat_template=qwen3_append_only"),
                    tmp_path / "t", source=_toy_source(), progress=False)
  assert trainer.formatter.tokenizer.chat_template == qwen3_chat_template("qwen3_append_only")
  trainer.export(tmp_path / "hf")
  assert AutoTokenizer.from_pretrained(str(tmp_path / "hf")).chat_template == qwen3_chat_template("qwen3_append_only")
