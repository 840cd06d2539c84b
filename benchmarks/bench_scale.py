"""Benchmark: the policy's three costs at Qwen3 sizes on one accelerator (random weights).

For a Qwen3 shape (``--size``), with randomly initialised parameters (no checkpoint is
needed, so it runs where no model hub can be reached), times on the default JAX device:

* ``generate``: ``models.Sampler.generate`` (one prefill plus the compiled decode loop), batch
  ``--gen-batch``, random prompts of ``--prompt`` tokens, exactly ``--new`` new tokens per row;
  reported as generated tokens/s and as weight-read bandwidth (decode reads every parameter once
  per step, so ``param bytes x steps / time`` against the chip's copy bandwidth says how close
  the loop is to being bound by memory);
* ``score``: ``Sampler.score`` of ``--new``-token responses (the PPL gate, Eq. 3, and pi_cal /
  pi_roll, Eq. 5);
* ``update``: one jitted ``sharding.make_train_step`` step (forward, Eq. 7 loss, backward, AdamW;
  the state is donated) on ``--train-batch x --train-len`` tokens; reported as tokens/s and as
  model FLOP utilisation: ``(6 N + 12 L H d T) tokens`` (matmul parameters N including the LM
  head, full ``T x T`` attention as the model computes it) over time.

MFU is model FLOP/s over the devices' peak: the vendor's dense bf16 figure for the device kind
(``SPEC_PEAK_TFLOPS``: no sparsity; an H200 SXM's is 989 TFLOP/s), or ``--peak`` where the kind
is not listed or another reference is wanted. With several devices the model is initialised
directly on a ``--mesh`` (default: every device on ``fsdp``; parameters by
``rti_jax.sharding``, no unsharded copy), the sampler decodes from its resharded bf16 copy and
the update runs sharded; FLOPs are then divided by ``devices x peak``.

The first call of each holds the compile and is reported apart; the figure is the median of
``--iters`` more calls. The results go to ``--json`` (default ``bench_scale_<size>.json``). Usage:

  python benchmarks/bench_scale.py --size tiny --iters 1          # a smoke run on any machine
  python benchmarks/bench_scale.py --size qwen3-1.7b               # on a GPU
  python benchmarks/bench_scale.py --size qwen3-8b --param-dtype float32 --parts update   # on 8 GPUs
  python benchmarks/bench_scale.py --size qwen3-8b --mesh fsdp=4,tensor=2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_common import parse_mesh  # noqa: E402
from models.config import QwenConfig  # noqa: E402
from models.qwen import Qwen  # noqa: E402
from models.sampler import Sampler  # noqa: E402
from rti_jax import sharding  # noqa: E402
from rti_jax.objectives import LossConfig, RTIBatch  # noqa: E402

# The published Qwen3 shapes (config.json of each release); "tiny" is for smoke runs.
SIZES = {
  "tiny": dict(vocab_size=1024, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
               num_kv_heads=2, head_dim=32, tie_word_embeddings=True),
  "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                     num_heads=16, num_kv_heads=8, head_dim=128, tie_word_embeddings=True),
  "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=28,
                     num_heads=16, num_kv_heads=8, head_dim=128, tie_word_embeddings=True),
  "qwen3-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36,
                   num_heads=32, num_kv_heads=8, head_dim=128, tie_word_embeddings=True),
  "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
                   num_heads=32, num_kv_heads=8, head_dim=128, tie_word_embeddings=False),
}


# Dense bf16 tensor throughput per device (TFLOP/s, no sparsity) from the vendors' datasheets,
# matched against ``jax.Device.device_kind`` in this order (the first substring found wins).
SPEC_PEAK_TFLOPS = (
  ("H200 NVL", 835.0), ("H200", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0),
  ("GH200", 989.0), ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0), ("A10", 125.0), ("L4", 121.0),
  ("TPU v6 lite", 918.0), ("TPU v5 lite", 197.0), ("TPU v5", 459.0), ("TPU v4", 275.0),
)


def spec_peak(device_kind: str) -> float | None:
  """The datasheet's dense bf16 TFLOP/s of a device kind, or None if it is not listed."""
  return next((tf for name, tf in SPEC_PEAK_TFLOPS if name in device_kind), None)


def init_model(cfg: QwenConfig, param_dtype, mesh) -> Qwen:
  """Random parameters, created on ``mesh`` by ``rti_jax.sharding``'s layout (one device: as is)."""
  make = lambda: Qwen(cfg, dtype=jnp.bfloat16, param_dtype=param_dtype, rngs=nnx.Rngs(0))  # noqa: E731
  if mesh.size == 1:
    return make()
  graphdef, params, rest = nnx.split(nnx.eval_shape(make), nnx.Param, ...)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  shardings = (sharding.param_shardings(params, mesh), jax.tree.map(lambda _: replicated, rest))
  params, rest = jax.jit(lambda: nnx.split(make(), nnx.Param, ...)[1:], out_shardings=shardings)()
  return nnx.merge(graphdef, params, rest)


def config_of(size: str) -> QwenConfig:
  return QwenConfig(model_type="qwen3", rope_theta=1_000_000.0, max_position_embeddings=40960,
                    dtype="bfloat16", **SIZES[size])


def matmul_params(c: QwenConfig) -> int:
  """Parameters that take part in matmuls per token (all but the embedding gather)."""
  attn = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
  mlp = 3 * c.hidden_size * c.intermediate_size
  return c.num_layers * (attn + mlp) + c.hidden_size * c.vocab_size


def timed(fn, iters: int) -> tuple[float, float]:
  """(first call s, median of ``iters`` more calls s); fn must block until its result is ready."""
  t0 = time.perf_counter()
  fn()
  first = time.perf_counter() - t0
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return first, statistics.median(times)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
  ap.add_argument("--parts", nargs="+", choices=("generate", "score", "update"),
                  default=["generate", "score", "update"])
  ap.add_argument("--gen-batch", type=int, default=64)
  ap.add_argument("--prompt", type=int, default=512)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--train-batch", type=int, default=8)
  ap.add_argument("--train-len", type=int, default=1024)
  ap.add_argument("--iters", type=int, default=3)
  ap.add_argument("--param-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                  help="parameters (and Adam moments); matmuls run in bf16 either way. float32 = "
                       "master weights, as policy.param_dtype in the paper-scale config")
  ap.add_argument("--mesh", default=None, help="data/fsdp/tensor sizes, e.g. fsdp=4,tensor=2 (default: fsdp = all devices)")
  ap.add_argument("--peak", type=float, default=None,
                  help="per-device TFLOP/s taken as 100%% (default: the device kind's datasheet dense bf16 figure)")
  ap.add_argument("--remat", default="none", choices=["none", "full", "dots"], help="the update's layer remat")
  ap.add_argument("--vocab-chunk", type=int, default=None, help="the update's log-probs this many vocabulary ids at a time")
  ap.add_argument("--bandwidth", type=float, default=4.3,
                  help="device copy bandwidth in TB/s taken as 100%% (4.3: an H200's measured copy bandwidth)")
  ap.add_argument("--json", default=None, help="write the results here (default bench_scale_<size>.json)")
  args = ap.parse_args()

  cfg = config_of(args.size)
  dev = jax.devices()[0]
  n_dev = jax.device_count()
  sizes = parse_mesh(args.mesh) if args.mesh else {"data": 1, "fsdp": n_dev, "tensor": 1}
  mesh = sharding.make_mesh(sizes["data"], sizes["fsdp"], sizes["tensor"])
  peak = args.peak if args.peak is not None else spec_peak(dev.device_kind)
  peak_note = (f"--peak {peak:g} TFLOP/s per device" if args.peak is not None else
               f"{dev.device_kind} datasheet dense bf16 peak {peak:.0f} TFLOP/s per device" if peak else
               f"no listed peak for {dev.device_kind!r} (give --peak)")
  t0 = time.perf_counter()
  pdt = jnp.dtype(args.param_dtype)
  model = init_model(cfg, pdt, mesh)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  jax.block_until_ready(nnx.state(model))
  print(f"# {args.size}: {n_params / 1e9:.3f} B parameters ({args.param_dtype}; bf16 matmuls), init {time.perf_counter() - t0:.1f} s; "
        f"{n_dev} x {dev.device_kind} ({dev.platform}), mesh {dict(mesh.shape)}, jax {jax.__version__}; MFU against {peak_note}",
        flush=True)
  rng = np.random.default_rng(0)
  res: dict = {"size": args.size, "params": n_params, "param_dtype": args.param_dtype,
               "device": dev.device_kind, "devices": n_dev, "mesh": dict(mesh.shape), "jax": jax.__version__,
               "peak_tflops_per_device": peak, "peak_source": "--peak" if args.peak is not None else "datasheet"}
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  res["sharded_params"] = sum(len(x.sharding.device_set) > 1 and not x.sharding.is_fully_replicated for x in leaves)
  res["param_tensors"] = len(leaves)
  param_bytes = pdt.itemsize * n_params
  mfu = lambda flops_per_s: None if not peak else flops_per_s / 1e12 / (n_dev * peak)  # noqa: E731
  mfu_text = lambda x: "" if x is None else f", MFU {100 * x:.1f}%"  # noqa: E731
  attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim  # attention FLOPs per token per context token (fwd)

  if "generate" in args.parts or "score" in args.parts:
    sampler = Sampler(model, max_cache_len=args.prompt + args.new, max_attention_bytes=1 << 36)
    prompts = [rng.integers(3, cfg.vocab_size, args.prompt).tolist() for _ in range(args.gen_batch)]
    if "generate" in args.parts:
      key = jax.random.key(0)
      first, med = timed(lambda: sampler.generate(prompts, key=key, max_new_tokens=args.new), args.iters)
      toks = args.gen_batch * args.new
      bw = param_bytes * args.new / med / 1e12
      total = args.prompt + args.new
      flops = args.gen_batch * (total * 2 * matmul_params(cfg) + attn * total * total / 2)
      u = mfu(flops / med)
      res["generate"] = dict(batch=args.gen_batch, prompt=args.prompt, new=args.new, first_s=first,
                             s=med, tokens_per_s=toks / med, weight_read_tb_s=bw, mfu=u)
      print(f"generate B={args.gen_batch} prompt={args.prompt} new={args.new}: first {first:.1f} s, "
            f"then {med:.2f} s ({toks / med:,.0f} new tokens/s; weights read at {bw:.2f} TB/s = "
            f"{100 * bw / args.bandwidth:.0f}% of {args.bandwidth} TB/s per device, prefill included{mfu_text(u)})",
            flush=True)
    if "score" in args.parts:
      responses = [rng.integers(3, cfg.vocab_size, args.new).tolist() for _ in range(args.gen_batch)]
      first, med = timed(lambda: sampler.score(prompts, responses), args.iters)
      toks = args.gen_batch * (args.prompt + args.new)
      total = args.prompt + args.new
      flops = args.gen_batch * (total * 2 * (matmul_params(cfg) - cfg.hidden_size * cfg.vocab_size)
                                + args.new * 2 * cfg.hidden_size * cfg.vocab_size + attn * total * total / 2)
      u = mfu(flops / med)
      res["score"] = dict(batch=args.gen_batch, length=total, first_s=first, s=med,
                          tokens_per_s=toks / med, mfu=u)
      print(f"score B={args.gen_batch} T={total}: first {first:.1f} s, then {med:.3f} s "
            f"({toks / med:,.0f} tokens/s forward{mfu_text(u)}; the LM head on the {args.new} response positions)",
            flush=True)
    del sampler

  if "update" in args.parts:
    b, t = args.train_batch, args.train_len
    step = sharding.make_train_step(model, optax.adamw(1e-6, weight_decay=0.1), mesh, LossConfig(), donate=True,
                                    remat=args.remat, vocab_chunk=args.vocab_chunk)
    del model
    ids = jnp.asarray(rng.integers(3, cfg.vocab_size, (b, t)), jnp.int32)
    mask = jnp.asarray(np.arange(t)[None, :] >= t // 4, jnp.float32) * jnp.ones((b, 1), jnp.float32)
    batch = step.shard_batch(RTIBatch(input_ids=ids, attention_mask=jnp.ones((b, t), jnp.int32),
                                      loss_mask=mask, old_logp=jnp.full((b, t), -12.0, jnp.float32),
                                      advantages=jnp.asarray(rng.normal(size=b), jnp.float32)))
    box = {"state": step.state}

    def one() -> None:
      box["state"], out = step.step(box["state"], batch)
      jax.block_until_ready(out.loss)

    first, med = timed(one, args.iters)
    toks = b * t
    flops = toks * (6 * matmul_params(cfg) + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * t)
    tflops = flops / med / 1e12
    u = mfu(flops / med)
    res["update"] = dict(batch=b, length=t, first_s=first, s=med, tokens_per_s=toks / med,
                         model_tflop_s=tflops, mfu=u, remat=args.remat, vocab_chunk=args.vocab_chunk)
    print(f"update B={b} T={t}: first {first:.1f} s, then {med:.3f} s/step ({toks / med:,.0f} tokens/s, "
          f"{tflops:.1f} model TFLOP/s over {n_dev} device(s){mfu_text(u)})", flush=True)
  try:
    stats = dev.memory_stats() or {}
    res["peak_bytes"] = stats.get("peak_bytes_in_use")
    if res["peak_bytes"]:
      print(f"peak device memory {res['peak_bytes'] / 2**30:.1f} GiB", flush=True)
  except Exception:  # noqa: BLE001 - memory_stats is optional per backend
    pass
  path = args.json or f"bench_scale_{args.size}.json"
  with open(path, "w") as f:
    json.dump(res, f, indent=1)
  print(f"results: {path}")


if __name__ == "__main__":
  main()
