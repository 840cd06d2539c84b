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
  head, full ``T x T`` attention as the model computes it) over time, against ``--peak`` TFLOP/s.

The first call of each holds the compile and is reported apart; the figure is the median of
``--iters`` more calls. Usage:

  python benchmarks/bench_scale.py --size tiny --iters 1          # a smoke run on any machine
  python benchmarks/bench_scale.py --size qwen3-1.7b               # on a GPU
  python benchmarks/bench_scale.py --size qwen3-8b --train-batch 4 --train-len 1024
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
  ap.add_argument("--peak", type=float, default=790.0,
                  help="bf16 matmul TFLOP/s taken as 100%% (790: what a large bf16 matrix product reaches on an H200)")
  ap.add_argument("--bandwidth", type=float, default=4.3,
                  help="device copy bandwidth in TB/s taken as 100%% (4.3: an H200's measured copy bandwidth)")
  ap.add_argument("--json", default=None, help="also append the results as one JSON line to this file")
  args = ap.parse_args()

  cfg = config_of(args.size)
  dev = jax.devices()[0]
  t0 = time.perf_counter()
  pdt = jnp.dtype(args.param_dtype)
  model = Qwen(cfg, dtype=jnp.bfloat16, param_dtype=pdt, rngs=nnx.Rngs(0))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  jax.block_until_ready(nnx.state(model))
  print(f"# {args.size}: {n_params / 1e9:.3f} B parameters ({args.param_dtype}; bf16 matmuls), init {time.perf_counter() - t0:.1f} s; "
        f"device {dev.device_kind} ({dev.platform}), jax {jax.__version__}", flush=True)
  rng = np.random.default_rng(0)
  res: dict = {"size": args.size, "params": n_params, "param_dtype": args.param_dtype,
               "device": dev.device_kind, "jax": jax.__version__}
  param_bytes = pdt.itemsize * n_params

  if "generate" in args.parts or "score" in args.parts:
    sampler = Sampler(model, max_cache_len=args.prompt + args.new, max_attention_bytes=1 << 36)
    prompts = [rng.integers(3, cfg.vocab_size, args.prompt).tolist() for _ in range(args.gen_batch)]
    if "generate" in args.parts:
      key = jax.random.key(0)
      first, med = timed(lambda: sampler.generate(prompts, key=key, max_new_tokens=args.new), args.iters)
      toks = args.gen_batch * args.new
      bw = param_bytes * args.new / med / 1e12
      res["generate"] = dict(batch=args.gen_batch, prompt=args.prompt, new=args.new, first_s=first,
                             s=med, tokens_per_s=toks / med, weight_read_tb_s=bw)
      print(f"generate B={args.gen_batch} prompt={args.prompt} new={args.new}: first {first:.1f} s, "
            f"then {med:.2f} s ({toks / med:,.0f} new tokens/s; weights read at {bw:.2f} TB/s = "
            f"{100 * bw / args.bandwidth:.0f}% of {args.bandwidth} TB/s, prefill included)", flush=True)
    if "score" in args.parts:
      responses = [rng.integers(3, cfg.vocab_size, args.new).tolist() for _ in range(args.gen_batch)]
      first, med = timed(lambda: sampler.score(prompts, responses), args.iters)
      toks = args.gen_batch * (args.prompt + args.new)
      res["score"] = dict(batch=args.gen_batch, length=args.prompt + args.new, first_s=first, s=med,
                          tokens_per_s=toks / med)
      print(f"score B={args.gen_batch} T={args.prompt + args.new}: first {first:.1f} s, then {med:.3f} s "
            f"({toks / med:,.0f} tokens/s forward)", flush=True)
    del sampler

  if "update" in args.parts:
    b, t = args.train_batch, args.train_len
    step = sharding.make_train_step(model, optax.adamw(1e-6, weight_decay=0.1), sharding.make_mesh(),
                                    LossConfig(), donate=True)
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
    res["update"] = dict(batch=b, length=t, first_s=first, s=med, tokens_per_s=toks / med,
                         model_tflop_s=tflops, mfu=tflops / args.peak)
    print(f"update B={b} T={t}: first {first:.1f} s, then {med:.3f} s/step ({toks / med:,.0f} tokens/s, "
          f"{tflops:.0f} model TFLOP/s = {100 * tflops / args.peak:.0f}% of {args.peak:.0f})", flush=True)
  try:
    stats = dev.memory_stats() or {}
    res["peak_bytes"] = stats.get("peak_bytes_in_use")
    if res["peak_bytes"]:
      print(f"peak device memory {res['peak_bytes'] / 2**30:.1f} GiB", flush=True)
  except Exception:  # noqa: BLE001 - memory_stats is optional per backend
    pass
  if args.json:
    with open(args.json, "a") as f:
      f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
  main()
