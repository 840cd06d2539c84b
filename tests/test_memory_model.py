"""The train step's memory model against its plain counterparts on a tiny Qwen3.

Vocabulary-chunked token log-probs vs the full-logits path, the ``jax.nn.dot_product_attention``
pass vs the einsum attention of the cached path, per-layer remat vs none, and the sharded step
with micro-batches from a tokens-per-device budget vs one batch (value and gradient each).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.config import QwenConfig
from models.qwen import Qwen
from models.vocab_logprobs import hidden_token_logprobs, num_vocab_chunks
from rti_jax.objectives import next_token_logprobs

T = 160  # above the 128-row causal block, so the blocked attention path runs


def tiny(tie: bool = False, seed: int = 0) -> Qwen:
  cfg = QwenConfig(model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=tie)
  return Qwen(cfg, rngs=nnx.Rngs(seed))


def batch(t: int = T) -> tuple[jax.Array, jax.Array]:
  ids = jax.random.randint(jax.random.key(1), (3, t), 0, 96)
  lengths = jnp.array([t, t - 37, 5])
  return ids, (jnp.arange(t)[None] < lengths[:, None]).astype(jnp.int32)


def max_diff(a, b) -> float:
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def max_abs(a) -> float:
  return max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(a))


def test_num_vocab_chunks_divides_the_vocabulary() -> None:
  assert num_vocab_chunks(96, 20) == 6  # 16 ids each (96 / 5 is not whole)
  assert num_vocab_chunks(96, 96) == 1
  assert num_vocab_chunks(151936, 16384) == 16  # Qwen3's vocabulary: 9,496 ids a chunk
  with pytest.raises(ValueError, match="vocab chunk"):
    num_vocab_chunks(96, 0)


def test_hidden_token_logprobs_match_a_numpy_log_softmax() -> None:
  rng = np.random.default_rng(0)
  h = rng.normal(size=(2, 5, 8)).astype(np.float32)
  w = rng.normal(size=(8, 12)).astype(np.float32)
  y = rng.integers(0, 12, size=(2, 5))
  logits = h.astype(np.float64) @ w
  ref = np.take_along_axis(logits, y[..., None], -1)[..., 0] - np.log(np.exp(logits).sum(-1))
  for chunk in (12, 5, 1):
    got = hidden_token_logprobs(jnp.asarray(h), jnp.asarray(w), jnp.asarray(y), chunk=chunk)
    np.testing.assert_allclose(np.asarray(got), ref, atol=2e-6)
    tied = hidden_token_logprobs(jnp.asarray(h), jnp.asarray(w.T), jnp.asarray(y), chunk=chunk, vocab_major=True)
    np.testing.assert_allclose(np.asarray(tied), ref, atol=2e-6)


@pytest.mark.slow
@pytest.mark.parametrize("tie", [False, True])
def test_vocab_chunked_logprobs_equal_the_full_logits_path(tie: bool) -> None:
  graphdef, params, rest = nnx.split(tiny(tie), nnx.Param, ...)
  ids, mask = batch(48)  # one attention block: the chunks are over the vocabulary
  weights = jax.random.normal(jax.random.key(2), ids.shape) * mask

  def full(p):
    return next_token_logprobs(nnx.merge(graphdef, p, rest)(ids, mask), ids)

  def chunked(p, remat="none"):
    return nnx.merge(graphdef, p, rest).token_logprobs(ids, mask, vocab_chunk=20, remat=remat, right_padded=True)

  real = np.asarray(mask, bool)
  a, b = np.asarray(jax.jit(full)(params)), np.asarray(jax.jit(chunked)(params))  # jitted: no op-by-op dispatch
  assert np.all(b[:, 0] == 0.0)
  assert np.max(np.abs(a[real] - b[real])) <= 2e-6
  g_full = jax.jit(jax.grad(lambda p: jnp.sum(full(p) * weights)))(params)
  for remat in ("none", "full", "dots"):
    g = jax.jit(jax.grad(lambda p, r=remat: jnp.sum(chunked(p, r) * weights)))(params)
    assert max_diff(g, g_full) <= 1e-6 * max_abs(g_full), remat


def test_uncached_attention_equals_the_einsum_attention_of_the_cached_path() -> None:
  model = tiny()
  ids, mask = batch()
  from models.qwen import causal_padding_mask, positions_from_mask

  @nnx.jit  # jitted: no op-by-op dispatch
  def both(model, ids, mask):
    new = model.hidden_states(ids, mask)  # jax.nn.dot_product_attention, causal blocks
    cache = model.init_cache(ids.shape[0], ids.shape[1])
    ref, _ = model.forward(ids, positions_from_mask(mask), causal_padding_mask(mask), cache, 0)  # einsums
    return new, ref

  real = np.asarray(mask, bool)
  h_new, h_ref = both(model, ids, mask)
  assert np.max(np.abs(np.asarray(h_new)[real] - np.asarray(h_ref)[real])) <= 1e-5
  short, ref = both(model, ids[:, :40], mask[:, :40])  # one block
  assert np.max(np.abs(np.asarray(short) - np.asarray(ref))[real[:, :40]]) <= 1e-5


@pytest.mark.parametrize("moe", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_hidden_states_at_query_positions_equal_the_full_pass_there(moe: bool) -> None:
  """``query_index`` (the last layer at a few positions only, as scoring uses it) gives the full
  pass's hidden states at those positions, repeated and clamped ones included, with the earlier
  layers unrolled or scanned."""
  extra = dict(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16) if moe else {}
  cfg = QwenConfig(**{**dict(model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=48,
                             num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8), **extra})
  model = Qwen(cfg, rngs=nnx.Rngs(4))
  ids, mask = batch()
  index = jnp.array([[0, 5, 159, 159], [100, 101, 122, 3], [0, 1, 4, 4]], jnp.int32)

  @nnx.jit
  def both(model, ids, mask, index):
    full = model.hidden_states(ids, mask, right_padded=True)
    return (jnp.take_along_axis(full, index[..., None], axis=1),
            model.hidden_states(ids, mask, right_padded=True, query_index=index),
            model.hidden_states(ids, mask, right_padded=True, query_index=index, scan=True))

  want, got, got_scan = (np.asarray(a) for a in both(model, ids, mask, index))
  assert got.shape == (3, 4, 32) and np.abs(want).max() > 0.1
  real = np.take_along_axis(np.asarray(mask, bool), np.asarray(index), axis=1)  # queries at real tokens
  assert np.abs(got - want)[real].max() <= 1e-5 and np.abs(got_scan - want)[real].max() <= 1e-5
  with pytest.raises(ValueError, match="query_index"):
    model.forward(ids, ids, jnp.ones((3, 160, 160), bool), model.init_cache(3, 160), 0, query_index=index)


def test_remat_rejects_an_unknown_policy() -> None:
  ids, mask = batch(8)
  with pytest.raises(ValueError, match="remat"):
    tiny().hidden_states(ids, mask, remat="everything")


def rti_batch(rows: int = 4, t: int = 24):
  """A right-padded RTI batch for the tiny Qwen3 (rows of different lengths, response from token 5)."""
  from rti_jax.objectives import RTIBatch

  rng = np.random.default_rng(0)
  lengths = np.resize(np.array([t, t - 5, 11, t - 2, 9, t, 14, 20]), rows)
  real = (np.arange(t)[None] < lengths[:, None])
  loss_mask = (real & (np.arange(t)[None] >= 5)).astype(np.float32)
  inter = np.zeros((rows, t), np.float32)
  inter[1, 6:9] = 1
  old = (-2.0 + 0.3 * rng.normal(size=(rows, t))).astype(np.float32)
  return RTIBatch(input_ids=rng.integers(0, 96, (rows, t)).astype(np.int32), attention_mask=real.astype(np.int32),
                  loss_mask=loss_mask, old_logp=old, advantages=rng.normal(size=rows).astype(np.float32),
                  roll_logp=old, cal_logp=(old + 0.2 * rng.normal(size=(rows, t))).astype(np.float32),
                  intervened_mask=inter)


def test_micro_batch_count_from_the_tokens_per_device_budget() -> None:
  from rti_jax.step_fns import MemoryModel

  m = MemoryModel(tokens_per_device=8192)
  assert m.count(256, 8192, 8) == 32  # one 8k row per device per micro-batch
  assert m.count(256, 2048, 8) == 8  # four rows each
  assert m.count(24, 2048, 8) == 1  # three rows each fit at once
  assert m.count(40, 2048, 8) == 5  # five rows each: equal micro-batches of at most four -> five of one
  assert MemoryModel(tokens_per_device=100).count(16, 8192, 4) == 4  # at least one row
  assert MemoryModel(micro_batches=3).count(12, 8, 1) == 3


@pytest.mark.slow
@pytest.mark.parametrize("budget", [24, 48])
def test_step_with_the_memory_model_equals_the_plain_step(budget: int) -> None:
  """remat full + vocab chunks + micro-batches from a token budget (donated state), with the layers
  scanned for one budget, vs the plain step: same loss, gradients and AdamW update."""
  import optax

  from rti_jax import sharding as S
  from rti_jax.objectives import LossConfig

  mesh = S.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  batch = rti_batch()
  # eps 1e-3: with 1e-8 a gradient component near 0 is divided by its own rounding error (see
  # docs/sharding.md), and two summation orders then move that weight differently by up to lr.
  tx = optax.adamw(1e-2, eps=1e-3, weight_decay=0.1)
  plain = S.make_train_step(tiny(seed=3), tx, mesh, LossConfig(name="rti"))
  s_plain, o_plain = plain.step(plain.state, plain.shard_batch(batch))
  lean = S.make_train_step(tiny(seed=3), tx, mesh, LossConfig(name="rti"), remat="full", vocab_chunk=20,
                           tokens_per_device=budget, donate=True, scan_layers=budget == 48)
  s_lean, o_lean = lean.step(lean.state, lean.shard_batch(batch))
  assert abs(float(o_lean.loss) - float(o_plain.loss)) <= 1e-6 * max(1.0, abs(float(o_plain.loss)))
  assert max_diff(o_lean.grads, o_plain.grads) <= 1e-5 * max_abs(o_plain.grads)
  assert max_diff(s_lean.params, s_plain.params) <= 1e-5  # AdamW moves each weight by about lr = 1e-2
  assert max_diff(s_plain.params, plain.state.params) > 1e-3  # the step moved the weights
  assert set(o_lean.metrics) == set(o_plain.metrics)  # the whole batch's metrics, not a micro-batch mean
  for key, value in o_plain.metrics.items():
    assert float(o_lean.metrics[key]) == pytest.approx(float(value), rel=1e-5, abs=1e-7), key


def test_memory_model_rejects_bad_settings() -> None:
  import optax

  from rti_jax import sharding as S
  from rti_jax.objectives import LossConfig

  mesh = S.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  with pytest.raises(ValueError, match="tokens_per_device"):
    S.make_train_step(tiny(), optax.sgd(0.1), mesh, LossConfig(), tokens_per_device=0)
  with pytest.raises(ValueError, match="tokens_per_device and micro_batches"):
    S.make_train_step(tiny(), optax.sgd(0.1), mesh, LossConfig(), tokens_per_device=64, micro_batches=2)
  with pytest.raises(ValueError, match="remat"):
    S.make_train_step(tiny(), optax.sgd(0.1), mesh, LossConfig(), remat="all")


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_layers_equal_the_layer_loop(remat: str) -> None:
  """The layers as one scan over a stacked view: same log-probs and gradients, same parameter tree."""
  model = tiny()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  ids, mask = batch()
  weights = jax.random.normal(jax.random.key(2), ids.shape) * mask

  def f(p, scan):
    net = nnx.merge(graphdef, p, rest)
    return jnp.sum(net.token_logprobs(ids, mask, vocab_chunk=48, remat=remat, scan=scan) * weights)

  vg = jax.jit(jax.value_and_grad(f), static_argnums=1)  # jitted: no op-by-op dispatch
  v_loop, g_loop = vg(params, False)
  v_scan, g_scan = vg(params, True)
  assert abs(float(v_scan) - float(v_loop)) <= 1e-6 * abs(float(v_loop))
  assert jax.tree.structure(g_scan) == jax.tree.structure(params)
  assert max_diff(g_scan, g_loop) <= 1e-6 * max_abs(g_loop)


def test_optim_memory_keys_are_validated() -> None:
  from rti_jax.config import ConfigError, load_config

  cfg = load_config("configs/navigation.yaml", ["optim.remat=full", "optim.tokens_per_device=4096",
                                                 "optim.vocab_chunk=16384", "optim.scan_layers=true"])
  assert (cfg.optim.remat, cfg.optim.tokens_per_device, cfg.optim.vocab_chunk, cfg.optim.scan_layers) == (
    "full", 4096, 16384, True)
  assert load_config("configs/navigation.yaml").optim.tokens_per_device is None  # the default path
  for bad in ("optim.remat=all", "optim.tokens_per_device=0", "optim.vocab_chunk=-1"):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
      load_config("configs/navigation.yaml", [bad])


def _plan(*args: str) -> dict[str, float]:
  """Runs benchmarks/memory_plan.py (8 forced CPU devices, in a subprocess); its figures by program."""
  import os
  import pathlib
  import subprocess
  import sys

  root = pathlib.Path(__file__).resolve().parent.parent
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(root))
  proc = subprocess.run([sys.executable, str(root / "benchmarks" / "memory_plan.py"), "--size", "qwen3-1.7b",
                         "--layers", "2", "--rows", "16", "--seq", "1024", "--cache", "1024", "--max-new-tokens",
                         "256", "--decode-batch", "16", *args], capture_output=True, text=True, env=env, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = {}
  for line in proc.stdout.splitlines():
    if line.startswith("memory_plan "):
      head, value = line.split(" per-device total GiB: ")
      out[head.split()[-1]] = float(value)
      assert head.split()[1:3] == ["qwen3-1.7b", "fsdp=8"]
  return out


@pytest.mark.slow
def test_memory_plan_prints_every_program_and_remat_cuts_the_step() -> None:
  lean = _plan("--tokens-per-device", "1024")
  assert set(lean) == {"train_step", "prefill", "decode"}
  # the weights alone: 2 layers + the 151,936 x 2,048 tied embedding, fp32 state + Adam, split 8 ways
  assert all(v > 0.05 for v in lean.values())
  full = _plan("--tokens-per-device", "8192", "--remat", "none", "--programs", "train_step")
  assert lean["train_step"] < full["train_step"]


@pytest.mark.slow
@pytest.mark.parametrize("chunks", [1, 2])
def test_trainer_with_the_memory_model_equals_the_default_trainer(toy_policy, tmp_path, chunks: int) -> None:
  """Two trainer iterations with remat, scanned layers, vocab chunks and a 16-token budget per device
  (micro-batches of one row, donated state; with length chunks, the running gradient sum) give the
  default trainer's rollouts, metrics and parameters up to fp32 summation order."""
  from rti_jax.envs.source import TaskSource
  from rti_jax.trainer import TIMING_KEYS, Trainer
  from rti_jax.config import load_config
  from trainer_fixtures import LengthRewardEnv

  def cfg(*extra):
    return load_config("navigation", [
      f"policy.path={toy_policy}", "loss.method=grpo", "rollout.tasks_per_iter=2", "rollout.group_size=4",
      "rollout.max_new_tokens=6", "rollout.max_context=128", "train.iterations=2", "train.checkpoint_every=10",
      "optim.lr=0.01", "train.eval_every=100", "train.val_tasks=0", f"optim.length_chunks={chunks}", *extra])

  source = lambda: TaskSource(train=list(range(12)), test=list(range(100, 104)), env_factory=LengthRewardEnv,  # noqa: E731
                              task_id=str, subsets={}, domain="navigation")
  runs = []
  for extra in ((), ("optim.remat=full", "optim.scan_layers=true", "optim.vocab_chunk=7", "optim.tokens_per_device=16")):
    tr = Trainer(cfg(*extra), tmp_path / f"r{len(extra)}", source=source(), progress=False)
    runs.append((tr.train(), jax.tree.leaves(tr.state.params), tr.train_step))
  (plain, p_plain, _), (lean, p_lean, step) = runs
  assert step.step is not runs[0][2].step  # its own jitted step (donating)
  for a, b in zip(plain, lean):
    assert a["tokens"] == b["tokens"] and a["reward_mean"] == b["reward_mean"]  # the same rollouts
    for key in ("loss", "grad_norm", "num_tokens"):
      assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert set(a) - set(TIMING_KEYS) == set(b) - set(TIMING_KEYS)
  diff = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(p_plain, p_lean))
  assert diff <= 0.1 * 0.01  # a tenth of one Adam step at lr 0.01 (see tests/test_trainer.py)


def test_micro_batch_metrics_combine_as_the_length_chunks_do() -> None:
  from rti_jax.objectives import combine_chunk_metrics
  from rti_jax.step_fns import combine_micro_metrics

  chunks = [{"num_tokens": 10.0, "intervened_tokens": 2.0, "on_policy_tokens": 8.0, "clip_frac": 0.1,
             "cal_weight_mean": 0.5, "clip_frac_on_policy": 0.25},
            {"num_tokens": 30.0, "intervened_tokens": 0.0, "on_policy_tokens": 30.0, "clip_frac": 0.3,
             "cal_weight_mean": 0.9, "clip_frac_on_policy": 0.05}]
  stacked = {k: jnp.asarray([c[k] for c in chunks], jnp.float32) for k in chunks[0]}
  got = combine_micro_metrics(stacked)
  want = combine_chunk_metrics(chunks)
  assert want["clip_frac"] == pytest.approx(0.25) and want["cal_weight_mean"] == pytest.approx(0.5)
  for key, value in want.items():
    assert float(got[key]) == pytest.approx(value, rel=1e-6), key


@pytest.mark.slow
def test_memory_model_step_on_meshes_equals_the_one_device_plain_step() -> None:
  """tests/_memory_model_check.py: 16 rows on (fsdp=8) and (data=2, fsdp=2, tensor=2), one row per
  device per micro-batch (2 and 4 micro-batches), against the plain step on one device."""
  import json
  import os
  import pathlib
  import subprocess
  import sys

  here = pathlib.Path(__file__).resolve().parent
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(here.parent))
  proc = subprocess.run([sys.executable, str(here / "_memory_model_check.py")], capture_output=True, text=True,
                        env=env, cwd=here.parent, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert {m: r["micro_batches"] for m, r in report.items()} == {"fsdp8": 2, "dp2fsdp2tp2": 4}
  for mesh, r in report.items():
    assert r["loss"] <= 1e-6 and r["grads_rel"] <= 1e-5 and r["params"] <= 1e-5, mesh
    assert r["moved"] > 1e-3 and r["num_tokens"][0] == r["num_tokens"][1], mesh


def test_reference_logprobs_in_micro_batches_equal_one_pass() -> None:
  """The KL reference pass (``rti_jax.step_fns.forward_logp``) with vocab chunks, scanned layers and
  rows taken 2 and 4 at a time equals the full-logits pass over all rows."""
  from rti_jax.step_fns import forward_logp as _forward_logp

  graphdef, params, rest = nnx.split(tiny(), nnx.Param, ...)
  b = rti_batch(rows=8, t=24)
  ids, mask = jnp.asarray(b.input_ids), jnp.asarray(b.attention_mask)
  real = np.asarray(b.attention_mask, bool)
  ref = np.asarray(_forward_logp(graphdef, params, rest, ids, mask))
  for k in (2, 4):
    got = np.asarray(_forward_logp(graphdef, params, rest, ids, mask, 20, k, True))
    assert np.max(np.abs(got - ref)[real]) <= 2e-6, k
