"""Multi-turn Telecom rollouts with and without the sampler's prefix cache (same process).

    python benchmarks/bench_prefix_cache.py --policy policies/telecom_base --tasks 8 --samples 4

Rolls out ``--samples`` episodes on each of the first ``--tasks`` Telecom test tasks (T = 1, the
condensed policy prompt, 96 new tokens per turn), first with every turn's context prefilled whole
(``prefix_cache_bytes=0``), then with the prefix cache; each setting runs ``--repeats`` times
(the first includes compiles; the cache starts empty each time). Prints wall times, their ratio, prefilled tokens, the cache's
counters, and the pass rate of each run (equal up to sampling: the cached path's logits differ in
float rounding, so a seed can draw other ids).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import numpy as np  # noqa: E402

from bench_common import load_average, machine  # noqa: E402

from rti_jax.envs.telecom.tasks import load_split  # noqa: E402
from rti_jax.generation.jax_backend import JaxBackend  # noqa: E402
from rti_jax.policy import evaluate as ev  # noqa: E402
from rti_jax.policy.tokenizer import PAD_TOKEN  # noqa: E402


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--policy", default=str(ROOT / "policies" / "telecom_base"))
  p.add_argument("--tasks", type=int, default=8)
  p.add_argument("--samples", type=int, default=4)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--max-turns", type=int, default=24)
  p.add_argument("--cache-mb", type=int, default=2048)
  args = p.parse_args()
  from telecom_sft import telecom_behaviour

  model, tok, fmt = ev.load_policy(args.policy)
  print(f"# machine: {machine()}", flush=True)
  tasks = load_split("test")[:args.tasks]
  rows = []
  for label, mb in (("whole prefill", 0), ("prefix cache", args.cache_mb)):
    backend = JaxBackend(model, max_cache_len=4096, pad_id=tok.convert_tokens_to_ids(PAD_TOKEN),
                         prefix_cache_bytes=mb << 20)
    for rep in range(args.repeats):
      if mb:
        backend.sampler.prefix_cache.clear()  # as after a weight update: nothing from the last run is reused
      t0 = time.perf_counter()
      out = telecom_behaviour(backend, fmt, tasks, args.samples, args.max_turns, seed=0)
      wall = time.perf_counter() - t0
      stats = backend.sampler.prefix_cache.stats() if mb else {}
      rows.append((label, rep, wall, out["pass_rate"], out["mean_turns"], stats))
      print(f"{label:14s} run {rep}: {wall:7.1f} s  pass rate {out['pass_rate']:.3f}  "
            f"mean turns {out['mean_turns']:.1f}  load avg {load_average():.2f}  {stats}", flush=True)
  plain = [r[2] for r in rows if r[0] == "whole prefill"][-1]
  cached = [r[2] for r in rows if r[0] == "prefix cache"][-1]
  print(f"\n{args.tasks} tasks x {args.samples} samples, last run of each: whole prefill {plain:.1f} s, "
        f"prefix cache {cached:.1f} s, speed-up x{plain / cached:.2f}")
  print("pass rates:", np.round([r[3] for r in rows], 3).tolist())


if __name__ == "__main__":
  main()
