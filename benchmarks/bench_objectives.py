"""Benchmark: the jitted RTI loss + gradient step (Eq. 7) at realistic batch sizes.

Times ``jax.jit(jax.value_and_grad(rti_loss))`` with respect to ``logp`` [B, T]; the model
and its vocab-sized logits are excluded (this measures the objective only). Prints one line
per size with the median time and tokens/s, plus the machine. Usage:

  python benchmarks/bench_objectives.py                      # 64x1024 and 256x4096
  python benchmarks/bench_objectives.py --sizes 8x512 --iters 50 --loss grpo
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench_common import load_average, machine

from rti_jax import objectives as O


def make_inputs(b: int, t: int, seed: int = 0) -> dict[str, jax.Array]:
  rng = np.random.default_rng(seed)
  old = (rng.normal(size=(b, t)) * 0.5 - 2.0).astype(np.float32)
  lp = (old + rng.normal(size=(b, t)) * 0.2).astype(np.float32)
  lengths = rng.integers(t // 4, t + 1, size=b)
  mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
  inter = np.zeros((b, t), np.float32)
  inter[::8, : t // 8] = 1  # one intervened response per group of 8, its first eighth corrected
  return dict(logp=jnp.asarray(lp), old_logp=jnp.asarray(old),
              advantages=jnp.asarray(rng.normal(size=b).astype(np.float32)),
              loss_mask=jnp.asarray(mask),
              cal_logp=jnp.asarray(old + 0.1), roll_logp=jnp.asarray(old),
              intervened_mask=jnp.asarray(inter), ref_logp=jnp.asarray(old - 0.05))


def build(loss: str):
  if loss == "rti":
    def f(lp, x):
      return O.rti_loss(lp, x["old_logp"], x["advantages"], x["loss_mask"], x["cal_logp"],
                        x["roll_logp"], x["intervened_mask"], ref_logp=x["ref_logp"], beta=0.01)
  else:
    def f(lp, x):
      return O.grpo_loss(lp, x["old_logp"], x["advantages"], x["loss_mask"],
                         ref_logp=x["ref_logp"], beta=0.01)
  return jax.jit(jax.value_and_grad(f))


def bench(b: int, t: int, iters: int, loss: str) -> tuple[float, float]:
  x = make_inputs(b, t)
  step = build(loss)
  lp = x.pop("logp")
  jax.block_until_ready(step(lp, x))  # compile + warm-up
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(step(lp, x))
    times.append(time.perf_counter() - t0)
  med = statistics.median(times)
  return med, b * t / med


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", nargs="+", default=["64x1024", "256x4096"], help="BxT pairs")
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--loss", choices=["rti", "grpo"], default="rti")
  args = ap.parse_args()
  print(f"# machine: {machine()}")
  print(f"# {args.loss}_loss value_and_grad wrt logp, jitted, median of {args.iters} runs (beta=0.01 KL on)")
  for size in args.sizes:
    b, t = (int(v) for v in size.split("x"))
    med, tps = bench(b, t, args.iters, args.loss)
    print(f"{args.loss} B x T = {b} x {t}: {med * 1e3:9.2f} ms/step  {tps / 1e6:8.2f} M tokens/s  "
          f"(load avg {load_average():.2f})")


if __name__ == "__main__":
  main()
