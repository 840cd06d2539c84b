"""Benchmark: the decode step's draw, ``jax.random.categorical`` (a Gumbel draw per vocabulary id)
against ``models.sampler.inverse_cdf_draw`` (one uniform per row), alone and inside
``Sampler.generate``.

1. The draw alone: ``--steps`` draws from ``[--rows, V]`` logits in one jitted ``fori_loop``, per step.
2. The sampler: ``Sampler.generate`` of the shipped tiny Navigation policy on ``--rows`` random
   prompts of ``--prompt`` ids, with 8 and with 96 new ids (no stop id, so every step runs); the
   difference over 88 steps is the decode step, the 8-id call the prefill. The sampler's draw is
   swapped for ``categorical`` to time the old step in the same process.

Medians of ``--iters`` calls after a warm-up (compile) call, the two sides in alternation.

  python benchmarks/bench_decode_draw.py
  python benchmarks/bench_decode_draw.py --rows 16 --prompt 900
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import models  # noqa: E402
from bench_common import alternating_medians, machine  # noqa: E402
from models import sampler as sampler_lib  # noqa: E402
from rti_jax.policy import evaluate  # noqa: E402


def gumbel_draw(key: jax.Array, logits: jax.Array) -> jax.Array:
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


DRAWS = {"categorical": gumbel_draw, "inverse_cdf": sampler_lib.inverse_cdf_draw}


def draw_loop(draw, steps: int):
  def run(key, logits):  # logits an argument: a constant would be folded at compile time
    def body(_, carry):
      key, acc = carry
      key, sub = jax.random.split(key)
      # The logits depend on the carry (acc * 0), as a decode step's do: otherwise the softmax and
      # cumulative sum would be hoisted out of the loop.
      return key, acc + draw(sub, logits + acc[:, None].astype(logits.dtype) * 0)

    return jax.lax.fori_loop(0, steps, body, (key, jnp.zeros(logits.shape[0], jnp.int32)))[1]

  return jax.jit(run)


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--policy", default=os.path.join(ROOT, "policies", "navigation_base"))
  ap.add_argument("--rows", type=int, default=64)
  ap.add_argument("--prompt", type=int, default=400)
  ap.add_argument("--steps", type=int, default=96)
  ap.add_argument("--iters", type=int, default=3)
  args = ap.parse_args(argv)
  print(f"# machine: {machine()}")
  model, _, _ = evaluate.load_policy(args.policy)
  v = model.config.vocab_size
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(args.rows, v)), jnp.float32)
  loops = {name: draw_loop(d, args.steps) for name, d in DRAWS.items()}
  key = jax.random.key(0)
  t = alternating_medians({name: (lambda f=f: jax.block_until_ready(f(key, logits))) for name, f in loops.items()},
                          args.iters)
  print(f"draw alone, [{args.rows}, {v}] logits, per step:")
  for name in DRAWS:
    print(f"  {name:12s} {t[name] / args.steps * 1e3:7.3f} ms")
  print(f"  ratio inverse_cdf / categorical: {t['inverse_cdf'] / t['categorical']:.2f}x")

  sampler = models.Sampler(model, max_cache_len=2048)
  rng = np.random.default_rng(1)
  prompts = [rng.integers(3, v, args.prompt).tolist() for _ in range(args.rows)]

  # The sampler's programs are traced with the draw patched in, so each side starts from an empty
  # jit cache and is timed apart (its warm-up call compiles it).
  res = {}
  for name, draw in DRAWS.items():
    sampler_lib._generate_jit.clear_cache()
    res[name] = alternating_medians({f"{name} {n}": _generate(sampler, prompts, draw, n) for n in (8, 96)}, args.iters)
  print(f"Sampler.generate, {args.rows} rows x {args.prompt} prompt ids, temperature 0.8:")
  step = {}
  for name in DRAWS:
    r = res[name]
    step[name] = (r[f"{name} 96"] - r[f"{name} 8"]) / 88
    print(f"  {name:12s} prefill + 8 steps {r[f'{name} 8']:.3f} s, decode step {step[name] * 1e3:.2f} ms")
  print(f"  ratio inverse_cdf / categorical (decode step): {step['inverse_cdf'] / step['categorical']:.2f}x")


def _generate(sampler, prompts, draw, new):
  def run():
    saved = sampler_lib.inverse_cdf_draw
    sampler_lib.inverse_cdf_draw = draw
    try:
      sampler.generate(prompts, key=jax.random.key(2), max_new_tokens=new, temperature=0.8)
    finally:
      sampler_lib.inverse_cdf_draw = saved
  return run


if __name__ == "__main__":
  main()
