"""Benchmark: one jitted, mesh-sharded RTI update of the shipped tiny policy by sequence length.

Times ``sharding.make_train_step(...).step`` (forward, Eq. 7 loss, backward, Adam) on random
token batches of ``[B, T]`` for the tiny Navigation policy, first call (with compile) and the
median of the next ``--iters`` calls, and prints the cost ratio of each length to the shortest.
This is the trainer's update stage without rollouts: it shows how the cost of an iteration
scales with episode length (every episode starts with the 174-token system prompt). Usage:

  python benchmarks/bench_update.py                       # B = 64, T in 512 768 1024 1536
  python benchmarks/bench_update.py --lengths 512 1024 --iters 3
  python benchmarks/bench_update.py --lengths 1024 --causal-blocks 1   # full T x T attention (no block skipping)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import models.qwen  # noqa: E402
from bench_common import load_average, machine  # noqa: E402
from rti_jax import sharding  # noqa: E402
from rti_jax.objectives import LossConfig, RTIBatch  # noqa: E402
from rti_jax.policy import evaluate  # noqa: E402


def batch(b: int, t: int, seed: int = 0) -> RTIBatch:
  rng = np.random.default_rng(seed)
  ids = jnp.asarray(rng.integers(3, 2000, (b, t)), jnp.int32)
  mask = jnp.asarray(np.arange(t)[None, :] >= t // 2, jnp.float32) * jnp.ones((b, 1), jnp.float32)
  return RTIBatch(input_ids=ids, attention_mask=jnp.ones((b, t), jnp.int32), loss_mask=mask,
                  old_logp=jnp.full((b, t), -3.0, jnp.float32),
                  advantages=jnp.asarray(rng.normal(size=b), jnp.float32))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--policy", default=os.path.join(ROOT, "policies", "navigation_base"))
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--lengths", type=int, nargs="+", default=[512, 768, 1024, 1536])
  ap.add_argument("--iters", type=int, default=3)
  ap.add_argument("--causal-blocks", type=int, default=None,
                  help="causal query blocks of uncached passes (models.qwen._CAUSAL_BLOCKS; 1 = full attention)")
  args = ap.parse_args()
  if args.causal_blocks is not None:
    models.qwen._CAUSAL_BLOCKS = args.causal_blocks
  model, _, _ = evaluate.load_policy(args.policy)
  step = sharding.make_train_step(model, optax.adam(1e-4), sharding.make_mesh(), LossConfig())
  state = step.state
  print(f"# machine: {machine()}")
  print(f"# one RTI update step of {args.policy} (forward + loss + backward + Adam), B = {args.batch}, "
        f"causal blocks <= {models.qwen._CAUSAL_BLOCKS}")
  first_med = None
  for t in args.lengths:
    x = step.shard_batch(batch(args.batch, t))
    t0 = time.perf_counter()
    state, out = step.step(state, x)
    jax.block_until_ready(out.loss)
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.iters):
      t0 = time.perf_counter()
      state, out = step.step(state, x)
      jax.block_until_ready(out.loss)
      times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    first_med = first_med or med
    print(f"T = {t:5d}: first call {first:6.2f} s, then {med:6.2f} s/step "
          f"({args.batch * t / med / 1e3:6.1f} k tokens/s, {med / first_med:4.1f}x T = {args.lengths[0]}; "
          f"load avg {load_average():.2f})", flush=True)


if __name__ == "__main__":
  main()
