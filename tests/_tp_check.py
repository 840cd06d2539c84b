"""Run by tests/test_tensor_parallel.py in a subprocess: 8 forced CPU devices, tiny Qwen3 and Qwen3-MoE.

For each mesh ``DxFxT`` (data x fsdp x tensor) given on the command line, against the same model
on one device: the RTI train step's loss, gradients and updated parameters (two steps, AdamW),
and the sampler's greedy tokens, their log-probs and teacher-forced scores (plain and
prefix-cache paths). Prints one JSON object (the last stdout line).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import jax.extend  # noqa: E402
from flax import nnx  # noqa: E402

from models.config import QwenConfig  # noqa: E402
from models.qwen import Qwen  # noqa: E402
from models import sampler as sampler_lib  # noqa: E402
from models.qwen import LayerCache  # noqa: E402
from models.sampler import Sampler  # noqa: E402
from rti_jax import sharding as S  # noqa: E402
from rti_jax.objectives import LossConfig, RTIBatch  # noqa: E402

V, B, T = 128, 8, 16
# Adam divides each gradient component by its own magnitude: with eps 1e-8 a component of size 1e-9
# (a weight that barely matters) moves by about lr with the sign of its rounding error, so two
# meshes' sums in different orders give updates lr apart. eps = 1e-3 keeps such components' updates
# proportional to them (lr * g / eps) and leaves the others' (|g| >> eps) at Adam's lr * g / |g|.
ADAM_EPS = 1e-3
PROMPTS = [[5, 6, 7], [1], [9, 8, 7, 6, 5, 4], [3, 3], [100, 2, 50], [7], [11, 12, 13, 14], [60, 61]]


def tiny_config(family: str) -> QwenConfig:
  """2 layers, hidden 64, 4 heads of 16, 2 kv heads; the MoE: 4 experts, top-2, in both layers."""
  moe = family == "qwen3_moe"
  return QwenConfig(model_type=family, vocab_size=V, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256,
                    num_experts=4 if moe else 0, num_experts_per_tok=2 if moe else 0,
                    moe_intermediate_size=32 if moe else 0, norm_topk_prob=moe)


def tiny_model(family: str, dtype=jnp.float32) -> Qwen:
  """Random weights wide enough that greedy decoding has clear argmax margins (norm scales 1 +- 0.2)."""
  model = Qwen(tiny_config(family), dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  state = nnx.state(model, nnx.Param)

  def draw(path, x):
    noise = rng.normal(size=x.shape).astype(np.float32)
    is_norm = any(getattr(k, "key", None) in ("input_norm", "post_attn_norm", "norm", "q_norm", "k_norm")
                  for k in path)
    return jnp.asarray(1.0 + 0.2 * noise if is_norm else 0.25 * noise)

  nnx.update(model, jax.tree_util.tree_map_with_path(draw, state))
  return model


def make_batch(seed: int) -> RTIBatch:
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, V, (B, T)).astype(np.int32)
  attn = np.ones((B, T), np.int32)
  attn[1, 11:] = 0
  attn[6, 13:] = 0
  loss_mask = np.zeros((B, T), np.float32)
  loss_mask[:, 5:] = 1
  loss_mask *= attn
  interv = np.zeros((B, T), np.float32)
  interv[3, 6:10] = 1
  old = (rng.normal(size=(B, T)) * 0.3 - 4.5).astype(np.float32)
  return RTIBatch(input_ids=ids, attention_mask=attn, loss_mask=loss_mask, old_logp=old,
                  advantages=rng.normal(size=B).astype(np.float32), roll_logp=(old + 0.1).astype(np.float32),
                  cal_logp=(old + rng.normal(size=(B, T)) * 0.5).astype(np.float32),
                  intervened_mask=interv, ref_logp=(old - 0.05).astype(np.float32))


def count_constraints(jaxpr) -> int:
  """sharding_constraint equations in a jaxpr, nested jaxprs (scan, while, jvp) included."""
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == "sharding_constraint"
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      n += count_constraints(sub)
  return n


def decode_cache(sampler: Sampler) -> list:
  """The KV cache [B, Kv, S, D] per layer after a two-token decode from 8 one-token prompts."""
  c, b = sampler.config, len(PROMPTS)
  cache = [LayerCache(jnp.zeros((b, c.num_kv_heads, 16, c.head_dim)), jnp.zeros((b, c.num_kv_heads, 16, c.head_dim)))
           for _ in range(c.num_layers)]
  fill = lambda v, dt: jnp.full((b,), v, dt)  # noqa: E731
  out = sampler_lib._generate_cached_jit(
      sampler.graphdef, sampler.state, cache, jnp.asarray([[p[0]] for p in PROMPTS], jnp.int32),
      fill(1, jnp.int32), fill(0, jnp.int32), fill(True, bool), jax.random.key(0), jnp.int32(2),
      fill(0.0, jnp.float32), fill(0, jnp.int32), fill(1.0, jnp.float32), jnp.full((8,), -1, jnp.int32),
      jnp.int32(0), num_new=2, mesh=sampler.mesh)
  return out[-1]


def run(family: str, shape: tuple[int, int, int], devices: list, reference: bool = False) -> dict:
  """One mesh's train steps, sampler and decode copies; ``reference`` (one device): only what the
  meshes are compared against (no KV-cache layout, no bf16 copy)."""
  mesh = S.make_mesh(*shape, devices=devices)
  ts = S.make_train_step(tiny_model(family), optax.adamw(1e-2, eps=ADAM_EPS, weight_decay=0.1), mesh,
                         LossConfig(name="rti", beta=0.01))
  state = ts.state
  batch = ts.shard_batch(make_batch(1))
  constraints = count_constraints(jax.make_jaxpr(ts.step)(state, batch).jaxpr)
  losses, grads = [], []
  for seed in (1, 2):
    state, out = ts.step(state, ts.shard_batch(make_batch(seed)))
    losses.append(float(out.loss))
    grads.append(jax.tree.map(np.asarray, out.grads))
  specs = {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p[:-1]): str(x.sharding.spec)
           for p, x in jax.tree_util.tree_leaves_with_path(state.params)}

  # The sampler: a copy of the trained policy in the decode layout, refreshed on the devices.
  sampler = Sampler(ts.merge(ts.state), mesh=mesh)
  with jax.transfer_guard("disallow"):
    sampler.sync_weights(ts.merge(state))
  decode_specs = {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p[:-1]): str(x.sharding.spec)
                  for p, x in jax.tree_util.tree_leaves_with_path(sampler.state)}
  gen = sampler.generate(PROMPTS, key=jax.random.key(0), max_new_tokens=8, temperature=0.0)
  scores = sampler.score(PROMPTS, [list(t) for t in gen.tokens])
  cached = Sampler(ts.merge(state), mesh=mesh, prefix_cache_bytes=1 << 22)
  turn1 = cached.generate(PROMPTS, key=jax.random.key(0), max_new_tokens=4, temperature=0.0)
  follow = [p + list(t) + [2, 3] for p, t in zip(PROMPTS, turn1.tokens)]  # hits the stored prefixes
  turn2 = cached.generate(follow, key=jax.random.key(0), max_new_tokens=4, temperature=0.0)
  out = dict(
      losses=losses, grads=grads, params=jax.tree.map(np.asarray, state.params), specs=specs,
      fallbacks=list(ts.fallbacks), constraints=constraints, decode_specs=decode_specs,
      tokens=[t.tolist() for t in gen.tokens], logprobs=[lp.tolist() for lp in gen.logprobs],
      scores=[s.tolist() for s in scores], cached_tokens=[t.tolist() for t in turn1.tokens + turn2.tokens],
      cached_logprobs=[lp.tolist() for lp in turn1.logprobs + turn2.logprobs])
  if reference:
    out["initial"] = jax.tree.map(np.asarray, nnx.state(tiny_model(family), nnx.Param))
    return out
  k = decode_cache(sampler)[0].k
  out["cache_spec"] = str(jax.sharding.PartitionSpec(*k.sharding.spec, *[None] * (k.ndim - len(k.sharding.spec))))
  # A bf16 policy with fp32 master weights on the mesh: the sampler decodes from a bf16 copy.
  bf16 = S.make_train_step(tiny_model(family, jnp.bfloat16), optax.sgd(0.1), mesh, LossConfig(name="rti"))
  bf16_copy = Sampler(bf16.merge(bf16.state), mesh=mesh).state
  out.update(bf16_copy_dtypes=sorted({str(x.dtype) for x in jax.tree.leaves(bf16_copy)}),
             bf16_master_dtypes=sorted({str(x.dtype) for x in jax.tree.leaves(bf16.state.params)}),
             bf16_copy_specs=sorted({str(x.sharding.spec) for x in jax.tree.leaves(bf16_copy)}))
  return out


def max_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def flat_diff(a: list, b: list) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)), initial=0.0)) for x, y in zip(a, b))


def main() -> None:
  devices = jax.devices()
  assert len(devices) == 8, f"expected 8 forced CPU devices, got {len(devices)}"
  # FAMILY:MESH,MESH,... per argument (default: both families on all three meshes)
  cases = dict((a.split(":")[0], a.split(":")[1].split(",")) for a in sys.argv[1:]) or {
      family: ["1x8x1", "1x4x2", "2x2x2"] for family in ("qwen3", "qwen3_moe")}
  report: dict = {}
  for family, names in cases.items():
    t0 = time.perf_counter()
    ref = run(family, (1, 1, 1), devices[:1], reference=True)
    fam = {"reference_losses": ref["losses"], "reference_tokens": ref["tokens"], "meshes": {},
           "param_moved": max_diff(ref["params"], ref["initial"]), "seconds": {"1x1x1": time.perf_counter() - t0}}
    for name in names:
      t0 = time.perf_counter()
      got = run(family, tuple(int(v) for v in name.split("x")), devices)
      fam["seconds"][name] = time.perf_counter() - t0
      fam["meshes"][name] = {
          "loss_diff": max(abs(a - b) for a, b in zip(got["losses"], ref["losses"])),
          "grad_diff": max(max_diff(g, r) for g, r in zip(got["grads"], ref["grads"])),
          "param_diff": max_diff(got["params"], ref["params"]),
          "tokens_equal": got["tokens"] == ref["tokens"],
          "logprob_diff": flat_diff(got["logprobs"], ref["logprobs"]),
          "score_diff": flat_diff(got["scores"], ref["scores"]),
          "cached_tokens_equal": got["cached_tokens"] == ref["cached_tokens"],
          "cached_logprob_diff": flat_diff(got["cached_logprobs"], ref["cached_logprobs"]),
          "bf16_copy_dtypes": got["bf16_copy_dtypes"], "bf16_master_dtypes": got["bf16_master_dtypes"],
          "bf16_copy_specs": got["bf16_copy_specs"],
          "constraints": got["constraints"], "specs": got["specs"], "decode_specs": got["decode_specs"],
          "cache_spec": got["cache_spec"],
          "fallbacks": got["fallbacks"], "losses": got["losses"],
      }
    fam["reference_constraints"] = ref["constraints"]
    fam["reference_score_consistency"] = flat_diff(ref["scores"], ref["logprobs"])
    report[family] = fam
  print(json.dumps(report))


if __name__ == "__main__":
  main()
