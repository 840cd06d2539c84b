"""Run by tests/test_sharding.py in a subprocess: 8 forced CPU devices, sharded vs single-device step.

Prints one JSON object: for each mesh shape, the max abs difference to the single-device step
of the loss, the grads and the new params after two steps, plus the parameter shardings.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from rti_jax import sharding as S  # noqa: E402
from rti_jax.objectives import LossConfig, RTIBatch  # noqa: E402

V, D, B, T = 32, 16, 8, 12


class TinyLM(nnx.Module):
  """Embedding + tanh + dense LM head; logits = model(input_ids, attention_mask) [B, T, V]."""

  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(V, D, rngs=rngs, embedding_init=nnx.with_metadata(
        nnx.initializers.normal(0.5), logical_axes=("vocab", "embed")))
    self.mix = nnx.Linear(D, D, rngs=rngs, kernel_init=nnx.with_metadata(
        nnx.initializers.lecun_normal(), logical_axes=("embed", "mlp")))
    self.head = nnx.Linear(D, V, rngs=rngs, kernel_init=nnx.with_metadata(
        nnx.initializers.lecun_normal(), logical_axes=("embed", "vocab")))

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    h = self.embed(input_ids) * attention_mask[..., None].astype(jnp.float32)
    h = h + jnp.tanh(self.mix(h))
    return self.head(h)


def make_batch(seed: int) -> RTIBatch:
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, V, (B, T)).astype(np.int32)
  attn = np.ones((B, T), np.int32)
  attn[1, 9:] = 0
  loss_mask = np.zeros((B, T), np.float32)
  loss_mask[:, 4:] = 1
  loss_mask[1, 9:] = 0
  loss_mask[5] = 0  # one row with nothing to train
  interv = np.zeros((B, T), np.float32)
  interv[3, 5:9] = 1
  old = (rng.normal(size=(B, T)) * 0.3 - 3.4).astype(np.float32)
  return RTIBatch(
      input_ids=ids, attention_mask=attn, loss_mask=loss_mask, old_logp=old,
      advantages=rng.normal(size=B).astype(np.float32),
      roll_logp=(old + 0.1).astype(np.float32),
      cal_logp=(old + rng.normal(size=(B, T)) * 0.5).astype(np.float32),
      intervened_mask=interv, ref_logp=(old - 0.05).astype(np.float32))


def run(mesh_shape: tuple[int, int, int], devices: list, micro_batches: int = 1) -> dict:
  mesh = S.make_mesh(*mesh_shape, devices=devices)
  cfg = LossConfig(name="rti", beta=0.01)
  ts = S.make_train_step(TinyLM(nnx.Rngs(0)), optax.adamw(1e-2, weight_decay=0.1), mesh, cfg,
                         micro_batches=micro_batches)
  state = ts.state
  losses, grads = [], []
  for seed in (1, 2):
    state, out = ts.step(state, ts.shard_batch(make_batch(seed)))
    losses.append(float(out.loss))
    grads.append(jax.tree.map(np.asarray, out.grads))
  params = jax.tree.map(np.asarray, state.params)
  specs = {jax.tree_util.keystr(p): str(x.sharding.spec)
           for p, x in jax.tree_util.tree_leaves_with_path(state.params)}
  opt_specs = sorted({str(x.sharding.spec) for x in jax.tree.leaves(state.opt_state)})
  return dict(losses=losses, grads=grads, params=params, specs=specs, opt_specs=opt_specs,
              fallbacks=list(ts.fallbacks))


def max_diff(a, b) -> float:
  return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main() -> None:
  devices = jax.devices()
  assert len(devices) == 8, f"expected 8 forced CPU devices, got {len(devices)}"
  ref = run((1, 1, 1), devices[:1])
  # "DxFxT" or "DxFxT-mbK" (K micro-batches)
  names = sys.argv[1:] or ["8x1x1", "2x2x2"]
  report = {"reference_losses": ref["losses"], "meshes": {}}
  for name in names:
    mesh_part, _, mb = name.partition("-mb")
    shape = tuple(int(v) for v in mesh_part.split("x"))
    got = run(shape, devices, int(mb) if mb else 1)
    report["meshes"][name] = {
        "loss_diff": max(abs(a - b) for a, b in zip(got["losses"], ref["losses"])),
        "grad_diff": max(max_diff(g, r) for g, r in zip(got["grads"], ref["grads"])),
        "param_diff": max_diff(got["params"], ref["params"]),
        "param_moved": max_diff(got["params"], jax.tree.map(
            np.asarray, nnx.split(TinyLM(nnx.Rngs(0)), nnx.Param, ...)[1])),
        "specs": got["specs"], "opt_specs": got["opt_specs"], "fallbacks": got["fallbacks"],
        "losses": got["losses"],
    }
  ts = S.make_train_step(TinyLM(nnx.Rngs(0)), optax.sgd(0.1), S.make_mesh(8, 1, 1), LossConfig())
  small = jax.tree.map(lambda x: x[:6], make_batch(0))
  try:
    ts.shard_batch(small)
    report["indivisible_error"] = ""
  except ValueError as e:
    report["indivisible_error"] = str(e)
  print(json.dumps(report))


if __name__ == "__main__":
  main()
