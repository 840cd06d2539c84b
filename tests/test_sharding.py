"""Tests for rti_jax.sharding: the rule table, the mesh builder and the sharded train step.

The multi-device check runs ``tests/_sharded_step_check.py`` in a subprocess so that
``--xla_force_host_platform_device_count=8`` is set before jax is imported there.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rti_jax import sharding as S
from rti_jax.objectives import LossConfig, RTIBatch, loss_from_batch, next_token_logprobs

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def sharded_report() -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)  # this tree's rti_jax
  proc = subprocess.run([sys.executable, str(HERE / "_sharded_step_check.py"), "8x1x1", "2x2x2", "2x2x2-mb2"],
                        capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["8x1x1", "2x2x2", "2x2x2-mb2"])
def test_sharded_step_equals_single_device_step(sharded_report: dict, mesh: str) -> None:
  got = sharded_report["meshes"][mesh]
  assert got["loss_diff"] <= 1e-5
  assert got["grad_diff"] <= 1e-5
  assert got["param_diff"] <= 1e-5
  # the step really updated the parameters (so equal params are not vacuous)
  assert got["param_moved"] > 1e-3
  assert np.isfinite(got["losses"]).all()


@pytest.mark.slow
def test_sharded_step_really_shards_parameters(sharded_report: dict) -> None:
  specs = sharded_report["meshes"]["2x2x2"]["specs"]
  assert specs["['head']['kernel'].value"] == str(P("fsdp", "tensor"))
  assert specs["['embed']['embedding'].value"] == str(P("tensor", "fsdp"))
  # Adam moments follow the parameter shardings
  assert str(P("fsdp", "tensor")) in sharded_report["meshes"]["2x2x2"]["opt_specs"]
  assert sharded_report["meshes"]["2x2x2"]["fallbacks"] == []


def test_physical_axis_names_appear_only_in_the_rule_table() -> None:
  src = (HERE.parent / "models" / "axes.py").read_text()
  for other in ("rti_jax/sharding.py", "rti_jax/step_fns.py"):  # the mesh and the step name none
    text = (HERE.parent / other).read_text()
    assert not any(n in text for n in ('"data"', '"fsdp"', '"tensor"', "'data'", "'fsdp'", "'tensor'")), other
  table_start = src.index("LOGICAL_AXIS_RULES: Mapping")
  table_end = src.index('"""Logical axis name', table_start)
  outside = src[:table_start] + src[table_end:]
  # MESH_AXES defines the names once; besides it and the table no code names "tensor"/"fsdp".
  outside = outside.replace('MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")', "")
  for name in ('"data"', '"fsdp"', '"tensor"', "'data'", "'fsdp'", "'tensor'"):
    assert name not in outside, name


class _FakeMesh:
  """Only ``.shape`` is read by logical_to_spec; lets us test 8-way rules on one device."""

  def __init__(self, **shape: int):
    self.shape = shape


def test_logical_to_spec_maps_through_table() -> None:
  mesh = _FakeMesh(data=2, fsdp=2, tensor=2)
  assert S.logical_to_spec(("embed", "vocab"), mesh=mesh, shape=(16, 32)) == P(("fsdp",), ("tensor",))
  assert S.logical_to_spec(("batch", "seq"), mesh=mesh, shape=(8, 5)) == P(("data", "fsdp"), None)
  # size-1 mesh axes are dropped
  mesh1 = _FakeMesh(data=8, fsdp=1, tensor=1)
  assert S.logical_to_spec(("embed", "vocab"), mesh=mesh1, shape=(16, 32)) == P(None, None)
  assert S.logical_to_spec(("batch",), mesh=mesh1) == P(("data",))


def test_logical_to_spec_replicates_non_divisible_dims_and_counts_them() -> None:
  mesh = _FakeMesh(data=1, fsdp=2, tensor=4)
  notes: list[str] = []
  spec = S.logical_to_spec(("embed", "vocab"), mesh=mesh, shape=(16, 30), fallbacks=notes, name="w")
  assert spec == P(("fsdp",), None)
  assert len(notes) == 1 and "w dim 1" in notes[0] and "30" in notes[0]
  # the same mesh axis twice in one spec is not allowed: the second use is replicated
  notes.clear()
  assert S.logical_to_spec(("vocab", "mlp"), mesh=mesh, shape=(8, 8), fallbacks=notes) == P(("tensor",), None)
  assert len(notes) == 1


def test_logical_to_spec_errors_name_the_problem() -> None:
  with pytest.raises(ValueError, match="logical axis 'bogus'"):
    S.logical_to_spec(("bogus",))
  with pytest.raises(ValueError, match="expected 2 logical axes"):
    S.logical_to_spec(("embed",), shape=(3, 4))


def test_make_mesh_validates_sizes() -> None:
  n = len(jax.devices())
  with pytest.raises(ValueError, match="data\\*fsdp\\*tensor"):
    S.make_mesh(n + 1, 1, 1)
  with pytest.raises(ValueError, match="tensor"):
    S.make_mesh(1, 1, 0)
  mesh = S.make_mesh(n, 1, 1)
  assert dict(mesh.shape) == {"data": n, "fsdp": 1, "tensor": 1}


class _TinyLM(nnx.Module):

  def __init__(self, rngs: nnx.Rngs, vocab: int = 11, dim: int = 6, param_dtype=np.float32):
    self.embed = nnx.Embed(vocab, dim, param_dtype=param_dtype, rngs=rngs)
    self.head = nnx.Linear(dim, vocab, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, input_ids, attention_mask):
    return self.head(self.embed(input_ids))


# One Adam step moves each parameter by at most about the learning rate whatever the gradient's
# scale, so gradients equal up to summation order give parameters equal up to a small fraction of
# the learning rate (not up to a fraction of the parameter's own size).
ADAM_LR = 1e-2
ADAM_STEP_ATOL = 1e-3 * ADAM_LR


def _batch(b: int = 4, t: int = 7, vocab: int = 11) -> RTIBatch:
  rng = np.random.default_rng(0)
  mask = np.zeros((b, t), np.float32)
  mask[:, 3:] = 1
  return RTIBatch(input_ids=rng.integers(0, vocab, (b, t)).astype(np.int32),
                  attention_mask=np.ones((b, t), np.int32), loss_mask=mask,
                  old_logp=np.full((b, t), -2.4, np.float32),
                  advantages=np.array([1.0, -1.0, 0.5, -0.5], np.float32))


def test_train_step_matches_hand_written_value_and_grad_and_sgd_update() -> None:
  """Single-device step == jax.value_and_grad of the loss written out directly + one SGD update."""
  model = _TinyLM(nnx.Rngs(3))
  cfg = LossConfig(name="grpo")
  lr = 0.1
  ts = S.make_train_step(model, optax.sgd(lr), S.make_mesh(1, 1, 1, devices=jax.devices()[:1]), cfg)
  batch = _batch()
  new_state, out = ts.step(ts.state, ts.shard_batch(batch))

  graphdef, params = nnx.split(_TinyLM(nnx.Rngs(3)), nnx.Param)

  def direct(p):
    logits = nnx.merge(graphdef, p)(batch.input_ids, batch.attention_mask)
    return loss_from_batch(next_token_logprobs(logits, batch.input_ids), batch, cfg)[0]

  loss, grads = jax.value_and_grad(direct)(params)
  np.testing.assert_allclose(float(out.loss), float(loss), rtol=1e-6)
  for g_step, g_ref in zip(jax.tree.leaves(out.grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(np.asarray(g_step), np.asarray(g_ref), rtol=1e-5, atol=1e-7)
  flat = np.concatenate([np.asarray(g, np.float64).ravel() for g in jax.tree.leaves(grads)])
  np.testing.assert_allclose(float(out.metrics["grad_norm"]), np.linalg.norm(flat), rtol=1e-5)
  for p_new, p_old, g in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(params), jax.tree.leaves(grads)):
    np.testing.assert_allclose(np.asarray(p_new), np.asarray(p_old) - lr * np.asarray(g), rtol=1e-5, atol=1e-7)
  assert float(np.abs(np.asarray(jax.tree.leaves(grads)[0])).max()) > 0


@pytest.mark.parametrize("k", [4])  # one row per micro-batch, one of them empty
def test_micro_batched_step_equals_full_batch_step(k: int) -> None:
  """Summed numerators / denominators over micro-batches reproduce the full-batch step."""
  mesh = S.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  cfg = LossConfig(name="rti")
  batch = _batch()
  rng = np.random.default_rng(5)
  inter = np.zeros(batch.shape, np.float32)
  inter[2, 4:6] = 1
  lm = np.asarray(batch.loss_mask).copy()
  lm[1] = 0  # an empty row inside one micro-batch
  batch = RTIBatch(batch.input_ids, batch.attention_mask, lm, batch.old_logp, batch.advantages,
                   roll_logp=batch.old_logp, cal_logp=(batch.old_logp + rng.normal(size=batch.shape) * 0.3).astype(np.float32),
                   intervened_mask=inter)
  outs = []
  for mb in (1, k):
    ts = S.make_train_step(_TinyLM(nnx.Rngs(3)), optax.adam(ADAM_LR), mesh, cfg, micro_batches=mb)
    state, out = ts.step(ts.state, ts.shard_batch(batch))
    outs.append((out, state))
  (full, s_full), (micro, s_micro) = outs
  np.testing.assert_allclose(float(micro.loss), float(full.loss), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(micro.grads), jax.tree.leaves(full.grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)
  for a, b in zip(jax.tree.leaves(s_micro.params), jax.tree.leaves(s_full.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=ADAM_STEP_ATOL)


def test_grads_of_row_chunks_then_apply_equal_the_step() -> None:
  """Numerator gradients of two row halves, summed, then ``apply``: the same step as ``step`` on the whole batch."""
  mesh = S.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  batch = _batch()
  half = lambda rows: jax.tree.map(lambda x: None if x is None else np.asarray(x)[rows], batch)  # noqa: E731
  ts = S.make_train_step(_TinyLM(nnx.Rngs(3)), optax.adam(ADAM_LR), mesh, LossConfig(name="rti"))
  s_full, full = ts.step(ts.state, ts.shard_batch(batch))
  parts = [ts.grads(ts.state, ts.shard_batch(half(r))) for r in (slice(0, 2), slice(2, 4))]
  g = jax.tree.map(lambda a, b: a + b, parts[0][0], parts[1][0])
  s_split, split = ts.apply(ts.state, g, parts[0][1] + parts[1][1], parts[0][2] + parts[1][2])
  np.testing.assert_allclose(float(split.loss), float(full.loss), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(s_split.params), jax.tree.leaves(s_full.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=ADAM_STEP_ATOL)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_bf16_step_keeps_state_dtypes_and_compiles_once(micro_batches: int) -> None:
  """bf16 parameters: the step's output state has the input's dtypes, so step 2 reuses step 1's
  executable and the donated buffers (an fp32 loss scale would promote the gradients and the Adam
  moments of bf16 parameters to fp32 after the first step, and step 2 would compile again)."""
  import jax.numpy as jnp

  model = _TinyLM(nnx.Rngs(3), param_dtype=jnp.bfloat16)
  ts = S.make_train_step(model, optax.adamw(1e-2, weight_decay=0.1),
                         S.make_mesh(1, 1, 1, devices=jax.devices()[:1]), LossConfig(),
                         micro_batches=micro_batches, donate=True)
  before = [x.dtype for x in jax.tree.leaves(ts.state)]
  assert jnp.bfloat16 in before
  batch = ts.shard_batch(_batch())
  state, out = ts.step(ts.state, batch)
  assert [x.dtype for x in jax.tree.leaves(state)] == before
  assert {g.dtype for g in jax.tree.leaves(out.grads)} == {jnp.dtype(jnp.bfloat16)}
  state, out = ts.step(state, batch)
  assert ts.step._cache_size() == 1
  assert np.isfinite(float(out.loss))


def test_tx_key_shares_compiled_steps_across_trainers() -> None:
  """Same model graph, mesh, loss and ``tx_key``: the second call reuses the first call's jitted step (no new
  compile) and, from its own initial state, gives exactly the step of an unshared build. A different
  loss or key gets its own functions."""
  mesh = S.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  batch = _batch()
  key = ("adam", 1e-2)
  first = S.make_train_step(_TinyLM(nnx.Rngs(3)), optax.adam(1e-2), mesh, LossConfig(name="rti"), tx_key=key)
  first.step(first.state, first.shard_batch(batch))
  compiled = first.step._cache_size()
  second = S.make_train_step(_TinyLM(nnx.Rngs(4)), optax.adam(1e-2), mesh, LossConfig(name="rti"), tx_key=key)
  assert second.step is first.step and second.grads is first.grads and second.apply is first.apply
  shared_state, shared = second.step(second.state, second.shard_batch(batch))
  assert first.step._cache_size() == compiled
  alone = S.make_train_step(_TinyLM(nnx.Rngs(4)), optax.adam(1e-2), mesh, LossConfig(name="rti"))
  assert alone.step is not first.step
  alone_state, want = alone.step(alone.state, alone.shard_batch(batch))
  assert float(shared.loss) == float(want.loss)
  for a, b in zip(jax.tree.leaves(shared_state.params), jax.tree.leaves(alone_state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  other_loss = S.make_train_step(_TinyLM(nnx.Rngs(4)), optax.adam(1e-2), mesh, LossConfig(name="grpo"), tx_key=key)
  other_key = S.make_train_step(_TinyLM(nnx.Rngs(4)), optax.adam(1e-3), mesh, LossConfig(name="rti"),
                                tx_key=("adam", 1e-3))
  assert other_loss.step is not first.step and other_key.step is not first.step


def test_micro_batches_must_divide_the_batch() -> None:
  with pytest.raises(ValueError, match="micro_batches"):
    S.make_train_step(_TinyLM(nnx.Rngs(0)), optax.sgd(0.1), S.make_mesh(1, 1, 1, devices=jax.devices()[:1]),
                      LossConfig(), micro_batches=0)
  ts = S.make_train_step(_TinyLM(nnx.Rngs(0)), optax.sgd(0.1),
                         S.make_mesh(1, 1, 1, devices=jax.devices()[:1]), LossConfig(), micro_batches=3)
  with pytest.raises(ValueError, match="micro_batches 3, got B=4"):
    ts.shard_batch(_batch())


@pytest.mark.slow
def test_shard_batch_rejects_indivisible_batch(sharded_report: dict) -> None:
  assert "divisible by the data-parallel degree 8 x micro_batches 1, got B=6" in sharded_report["indivisible_error"]


def test_train_step_rejects_bad_logits_shape() -> None:

  class Bad(nnx.Module):

    def __init__(self, rngs):
      self.w = nnx.Param(np.ones((3,), np.float32))

    def __call__(self, input_ids, attention_mask):
      return self.w[None, :] * np.ones((input_ids.shape[0], 3), np.float32)

  ts = S.make_train_step(Bad(nnx.Rngs(0)), optax.sgd(0.1),
                         S.make_mesh(1, 1, 1, devices=jax.devices()[:1]), LossConfig())
  with pytest.raises(ValueError, match="expected logits \\[B, T, V\\]"):
    ts.step(ts.state, ts.shard_batch(_batch()))
