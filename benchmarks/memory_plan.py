"""Per-device memory of the RTI train step and the sampler's prefill / decode step, without a GPU.

Builds a Qwen3 model abstractly (``nnx.eval_shape``: no weights are allocated), lowers and compiles
the jitted programs for a forced mesh of 8 CPU devices from ``jax.ShapeDtypeStruct`` inputs that
carry their shardings, and prints each compiled executable's memory analysis per device
(arguments, outputs, aliased, temporaries, total = arguments + outputs - aliased + temporaries).

Programs:
  train_step  the trainer's update (``rti_jax.sharding.make_train_step``'s body, state donated):
              forward with per-layer remat (layers scanned), log-probs a vocabulary chunk at a time, the RTI loss
              (Eq. 7), backward, micro-batches from ``--tokens-per-device`` summed in a scan,
              global-norm clip + AdamW; fp32 master weights and moments, bf16 matmuls;
              ``--trained-width W``: the log-probs at W trained positions per row
              (``optim.trained_positions``: the last layer and the LM head there alone).
  prefill     the sampler's prompt pass into an empty KV cache (bf16 decode copy of the weights,
              ``DECODE_AXIS_RULES``), last-position logits.
  decode      one decode step: one token per row against the full cache (cache donated).
  ref_logp    (on request) the KL reference pass of ``loss.beta > 0``, over one update's rows.

Usage (the paper's setting: 32 tasks x G = 8 rows of 8,192 tokens per update, decode batch 64 with
an 8k cache)::

  python benchmarks/memory_plan.py --size qwen3-8b --mesh fsdp=8
  python benchmarks/memory_plan.py --size qwen3-8b --mesh fsdp=4,tensor=2
  python benchmarks/memory_plan.py --size qwen3-1.7b --mesh fsdp=8
  python benchmarks/memory_plan.py --size qwen3-8b --config retail_qwen3_8b --decode-batch 32   # its shapes

Ends with one line per figure: ``memory_plan <size> <mesh> <program> per-device total GiB: <x>``.
The CPU compiler's plan is an upper bound for attention: XLA's attention materialises the scores
of one layer (in causal query blocks), which cuDNN's fused kernel on a GPU does not.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench_common import parse_mesh  # noqa: E402
from models.config import QwenConfig  # noqa: E402
from models.qwen import CACHE, LayerCache, causal_padding_mask, positions_from_mask  # noqa: E402
from models.weights import abstract_model  # noqa: E402
from rti_jax import sharding as S  # noqa: E402
from rti_jax.objectives import LossConfig, RTIBatch, next_token_logprobs  # noqa: E402
from rti_jax.step_fns import MemoryModel, jit_step_functions  # noqa: E402

GIB = 1 << 30

# Qwen3 dense shapes (the HF config.json of each checkpoint).
SIZES = {
    "qwen3-8b": QwenConfig(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                           num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1e6,
                           max_position_embeddings=40960, dtype="bfloat16"),
    "qwen3-1.7b": QwenConfig(model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                             num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, rope_theta=1e6,
                             tie_word_embeddings=True, max_position_embeddings=40960, dtype="bfloat16"),
}


def abstract(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


def with_shardings(tree, shardings):
  return jax.tree.map(lambda x, s: abstract(x.shape, x.dtype, s), tree, shardings)


def report(compiled) -> dict[str, float]:
  m = compiled.memory_analysis()
  out = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
         "aliased": m.alias_size_in_bytes, "temporaries": m.temp_size_in_bytes}
  out["total"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
  return {k: v / GIB for k, v in out.items()}


def train_step_program(config: QwenConfig, mesh, args):
  """The train step lowered on abstract inputs; returns the compiled executable and notes."""
  model = abstract_model(config, jnp.bfloat16, jnp.float32)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  fallbacks: list[str] = []
  p_sh = S.param_shardings(params, mesh, fallbacks=fallbacks)
  replicated = NamedSharding(mesh, PartitionSpec())
  r_sh = jax.tree.map(lambda _: replicated, rest)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6, weight_decay=0.1))
  opt_shape = jax.eval_shape(tx.init, params)
  o_sh = S._opt_state_shardings(opt_shape, params, p_sh, mesh)
  state_sh = S.TrainState(p_sh, r_sh, o_sh)
  b_sh = S.batch_sharding(mesh)
  logits_sh = NamedSharding(mesh, S.logical_to_spec(("batch", "seq", "act_vocab"), mesh=mesh))
  memory = MemoryModel.of(model, next_token_logprobs, remat=args.remat, vocab_chunk=args.vocab_chunk,
                          tokens_per_device=args.tokens_per_device, scan_layers=args.scan_layers)
  step, _, _ = jit_step_functions(graphdef, tx, mesh, LossConfig(name="rti"), next_token_logprobs, 1, True,
                                  state_sh, b_sh, logits_sh, p_sh, replicated, memory=memory)
  state = S.TrainState(with_shardings(params, p_sh), with_shardings(rest, r_sh), with_shardings(opt_shape, o_sh))
  b, t = args.rows, args.seq
  f32 = lambda: abstract((b, t), jnp.float32, b_sh)  # noqa: E731
  batch = RTIBatch(input_ids=abstract((b, t), jnp.int32, b_sh), attention_mask=abstract((b, t), jnp.int32, b_sh),
                   loss_mask=f32(), old_logp=f32(), advantages=abstract((b,), jnp.float32, b_sh),
                   roll_logp=f32(), cal_logp=f32(), intervened_mask=f32(),
                   trained_positions=abstract((b, args.trained_width), jnp.int32, b_sh) if args.trained_width else None)
  dp = S._axes_size(mesh, b_sh.spec[0])
  k = memory.count(b, t, dp)
  notes = [f"{k} micro-batches of {b // k} rows ({b // k // dp} per device) x {t} tokens",
           f"replicated fallbacks: {len(fallbacks)}"]
  if args.trained_width:
    notes.append(f"log-probs at {args.trained_width} trained positions per row")
  return step.lower(state, batch).compile(), notes


def ref_logp_program(config: QwenConfig, mesh, args):
  """The KL reference pass (``loss.beta > 0``): ``rti_jax.step_fns.forward_logp`` over one update's
  rows under the fp32 reference parameters (a second parameter copy beside the train state)."""
  from rti_jax.step_fns import forward_logp as _forward_logp

  model = abstract_model(config, jnp.bfloat16, jnp.float32)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  p_sh = S.param_shardings(params, mesh)
  b_sh = S.batch_sharding(mesh)
  replicated = NamedSharding(mesh, PartitionSpec())
  b, t = args.rows, args.seq
  ids = abstract((b, t), jnp.int32, b_sh)
  k = MemoryModel(tokens_per_device=args.tokens_per_device).count(b, t, S._axes_size(mesh, b_sh.spec[0]))
  lowered = _forward_logp.lower(graphdef, with_shardings(params, p_sh),
                                with_shardings(rest, jax.tree.map(lambda _: replicated, rest)), ids, ids,
                                args.vocab_chunk, k, args.scan_layers)
  return lowered.compile(), [f"{b} rows x {t} tokens in {k} micro-batches"]


def decode_state(config: QwenConfig, mesh):
  model = abstract_model(config, jnp.bfloat16, jnp.bfloat16)
  graphdef, state = nnx.split(model)
  sh = S.param_shardings(state, mesh, rules=S.DECODE_AXIS_RULES)
  return graphdef, with_shardings(state, sh)


def cache_sharding(config: QwenConfig, mesh, batch: int, length: int) -> NamedSharding:
  shape = (batch, config.num_kv_heads, length, config.head_dim)
  return NamedSharding(mesh, S.logical_to_spec(CACHE, mesh=mesh, shape=shape, rules=S.DECODE_AXIS_RULES))


def prefill_program(config: QwenConfig, mesh, args):
  graphdef, state = decode_state(config, mesh)
  b, p, s = args.decode_batch, args.cache - args.max_new_tokens, args.cache
  b_sh = S.batch_sharding(mesh, rules=S.DECODE_AXIS_RULES)
  c_sh = cache_sharding(config, mesh, b, s)

  def prefill(state, ids, mask):
    with S.activation_sharding(mesh, S.DECODE_AXIS_RULES):
      model = nnx.merge(graphdef, state)
      cache = model.init_cache(b, s)
      full = jnp.concatenate([causal_padding_mask(mask), jnp.zeros((b, p, s - p), bool)], axis=-1)
      h, cache = model.forward(ids, positions_from_mask(mask), full, cache, 0, causal=True)
      return model.logits(h[:, -1]), cache

  out_sh = (NamedSharding(mesh, S.logical_to_spec(("batch", "act_vocab"), mesh=mesh, rules=S.DECODE_AXIS_RULES)),
            [LayerCache(c_sh, c_sh)] * config.num_layers)
  fn = jax.jit(prefill, out_shardings=out_sh)
  ids = abstract((b, p), jnp.int32, b_sh)
  return fn.lower(state, ids, abstract((b, p), jnp.int32, b_sh)).compile(), [f"batch {b}, prompt {p}, cache {s}"]


def decode_program(config: QwenConfig, mesh, args):
  graphdef, state = decode_state(config, mesh)
  b, s = args.decode_batch, args.cache
  b_sh = S.batch_sharding(mesh, rules=S.DECODE_AXIS_RULES)
  c_sh = cache_sharding(config, mesh, b, s)
  replicated = NamedSharding(mesh, PartitionSpec())

  def decode(state, cache, tok, positions, keys, index):
    with S.activation_sharding(mesh, S.DECODE_AXIS_RULES):
      model = nnx.merge(graphdef, state)
      h, cache = model.forward(tok[:, None], positions[:, None], keys[:, None, :], cache, index)
      return model.logits(h[:, 0]), cache

  cache = [LayerCache(abstract((b, config.num_kv_heads, s, config.head_dim), jnp.bfloat16, c_sh),
                      abstract((b, config.num_kv_heads, s, config.head_dim), jnp.bfloat16, c_sh))
           for _ in range(config.num_layers)]
  fn = jax.jit(decode, donate_argnums=(1,))
  compiled = fn.lower(state, cache, abstract((b,), jnp.int32, b_sh), abstract((b,), jnp.int32, b_sh),
                      abstract((b, s), jnp.bool_, b_sh), abstract((), jnp.int32, replicated)).compile()
  return compiled, [f"batch {b}, cache {s}"]


PROGRAMS = {"train_step": train_step_program, "prefill": prefill_program, "decode": decode_program,
            "ref_logp": ref_logp_program}


def from_config(name: str) -> argparse.Namespace:
  """The shapes and memory model of config ``name`` as defaults of the options."""
  from rti_jax.config import load_config

  cfg = load_config(name, ["policy.path=unused"])
  r, o = cfg.rollout, cfg.optim
  return argparse.Namespace(rows=r.tasks_per_iter * r.group_size, seq=r.max_context, cache=r.max_context,
                            max_new_tokens=r.max_new_tokens, remat=o.remat, vocab_chunk=o.vocab_chunk or 0,
                            scan_layers=o.scan_layers, tokens_per_device=o.tokens_per_device or r.max_context)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--size", nargs="+", default=["qwen3-8b", "qwen3-1.7b"], choices=sorted(SIZES))
  ap.add_argument("--mesh", default="fsdp=8", help="e.g. fsdp=8 or fsdp=4,tensor=2 (8 devices)")
  ap.add_argument("--programs", default="train_step,prefill,decode",
                  help=f"comma-separated, of {sorted(PROGRAMS)} (ref_logp: the KL reference pass, loss.beta > 0)")
  ap.add_argument("--rows", type=int, default=256, help="rows per update (tasks x G: 32 x 8)")
  ap.add_argument("--seq", type=int, default=8192, help="tokens per row")
  ap.add_argument("--remat", default="full", choices=["none", "full", "dots"])
  ap.add_argument("--vocab-chunk", type=int, default=16384)
  ap.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=True,
                  help="the layers as one scan (--no-scan-layers: a Python loop of remat layers)")
  ap.add_argument("--tokens-per-device", type=int, default=8192)
  ap.add_argument("--trained-width", type=int, default=0,
                  help="optim.trained_positions: the last layer and the LM head at this many positions per row "
                       "(objectives.trained_width: a multiple of seq / 8); 0: every position")
  ap.add_argument("--decode-batch", type=int, default=64)
  ap.add_argument("--cache", type=int, default=8192)
  ap.add_argument("--max-new-tokens", type=int, default=1024, help="prefill prompt = cache - this")
  ap.add_argument("--layers", type=int, default=0, help="override the layer count (a quick check)")
  ap.add_argument("--config", default=None,
                  help="take the update's rows (tasks x G), row length and cache (rollout.max_context), the turn "
                       "budget (rollout.max_new_tokens) and the memory model (optim.*) from a config, e.g. "
                       "retail_qwen3_8b; explicit options given after it still win")
  args = ap.parse_args()
  if args.config:
    args = ap.parse_args(namespace=from_config(args.config))
  sizes = parse_mesh(args.mesh)
  mesh = S.make_mesh(sizes["data"], sizes["fsdp"], sizes["tensor"])
  mesh_name = ",".join(f"{k}={v}" for k, v in sizes.items() if v > 1) or "1"
  print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}; mesh {dict(mesh.shape)}; jax {jax.__version__}")
  print(f"train: {args.rows} rows x {args.seq} tokens (trained width {args.trained_width or 'all'}), remat {args.remat}, vocab chunk {args.vocab_chunk}, "
        f"tokens/device {args.tokens_per_device}, scan layers {args.scan_layers}; sampler: batch {args.decode_batch}, cache {args.cache}")
  lines = []
  for size in args.size:
    config = SIZES[size]
    if args.layers:
      config = dataclasses.replace(config, num_layers=args.layers)
    for name in args.programs.split(","):
      t0 = time.perf_counter()
      compiled, notes = PROGRAMS[name](config, mesh, args)
      r = report(compiled)
      print(f"{size} {mesh_name} {name}: " + ", ".join(f"{k} {v:.2f} GiB" for k, v in r.items())
            + f" ({'; '.join(notes)}; compiled in {time.perf_counter() - t0:.0f} s)", flush=True)
      lines.append(f"memory_plan {size} {mesh_name} {name} per-device total GiB: {r['total']:.2f}")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
