"""Benchmark: the default Navigation update with glibc's default allocator settings vs the settings
of ``rti_jax/host_malloc.py`` (freed buffers kept in the process).

Each setting runs in its own process (glibc reads the variables at start-up): the trainer of
``configs/navigation.yaml`` (overrides accepted) runs one iteration to get a real batch of 64
rollouts, then ``Trainer.update`` on that batch ``--reps`` times. Prints, per setting, the median
update time, the page faults and system time of those updates, and the process's peak resident size;
then the time ratio.

  python benchmarks/bench_host_malloc.py
  python benchmarks/bench_host_malloc.py --reps 5 optim.trained_positions=true
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def child(reps: int, overrides: list[str]) -> dict:
  """One process's measurement (run with ``--child``)."""
  from bench_common import navigation_update_batch

  trainer, groups = navigation_update_batch(overrides, "bench_malloc_")
  trainer.update(groups)  # compiled by now; this call settles the heap as a long run's would
  times, r0 = [], resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(reps):
    start = time.perf_counter()
    trainer.update(groups)
    times.append(time.perf_counter() - start)
  r1 = resource.getrusage(resource.RUSAGE_SELF)
  return {"median_s": statistics.median(times), "faults": r1.ru_minflt - r0.ru_minflt,
          "system_s": r1.ru_stime - r0.ru_stime, "max_rss_gb": r1.ru_maxrss / 2**20}


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("overrides", nargs="*", help="config overrides key=value")
  args = ap.parse_args(argv)
  if args.child:
    print(json.dumps(child(args.reps, args.overrides)))
    return
  from rti_jax import host_malloc

  base = {k: v for k, v in os.environ.items() if k not in host_malloc.USER_VARIABLES}
  rows = {}
  for name, extra in (("glibc defaults", {}), ("host_malloc settings", host_malloc.SETTINGS)):
    out = subprocess.run([sys.executable, __file__, "--child", "--reps", str(args.reps), *args.overrides],
                         env={**base, **extra}, capture_output=True, text=True, check=True)
    rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    r = rows[name]
    print(f"{name:<21}: median {r['median_s']:.2f} s per update; over {args.reps} updates {r['faults']:,} page faults, "
          f"{r['system_s']:.1f} s system time; peak resident {r['max_rss_gb']:.2f} GiB", flush=True)
  a, b = rows["glibc defaults"], rows["host_malloc settings"]
  print(f"ratio settings / defaults: {b['median_s'] / a['median_s']:.2f}x per update, "
        f"{b['faults'] / max(a['faults'], 1):.3f}x page faults")


if __name__ == "__main__":
  main()
