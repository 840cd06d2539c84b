"""Benchmark: the default Navigation update with the log-probs at the trained positions alone vs at
every position (``optim.trained_positions``).

Builds the trainer of ``configs/navigation.yaml`` (overrides accepted), runs one iteration to get a
real batch of rollouts (multi-turn episodes: system prompt, tool results and assistant turns), then
times ``Trainer.update`` on that batch alternately with the setting on and off (two optimizer steps
over four length chunks, the recomputed behaviour log-probs and the KL reference pass). The first
call of each setting compiles and is reported apart; the rest are the median of ``--reps`` calls.
Prints the trained share of the tokens, the width of the positions per chunk and the time ratio.

  python benchmarks/bench_trained_positions.py
  python benchmarks/bench_trained_positions.py --reps 5 rollout.tasks_per_iter=4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from bench_common import navigation_update_batch

from rti_jax import objectives


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("overrides", nargs="*", help="config overrides key=value")
  args = ap.parse_args(argv)
  trainer, groups = navigation_update_batch(args.overrides, "bench_tp_")
  trained = sum(int(np.sum(t.arrays()["loss_mask"])) for g in groups for t in g)
  total = sum(len(t.token_ids) for g in groups for t in g)
  widths = []
  listing = objectives.with_trained_positions

  def spy(batch):
    out = listing(batch)
    widths.append((batch.input_ids.shape[1], out.trained_positions.shape[1]))
    return out

  objectives.with_trained_positions = spy
  times: dict[bool, list[float]] = {True: [], False: []}
  for _ in range(args.reps + 1):
    for flag in (True, False):
      trainer.cfg.optim.trained_positions = flag
      t0 = time.perf_counter()
      trainer.update(groups)
      times[flag].append(time.perf_counter() - t0)
  objectives.with_trained_positions = listing
  print(f"{total} tokens in {sum(len(g) for g in groups)} rollouts, {trained} trained ({trained / total:.0%})")
  print("chunks (T, W):", sorted(set(widths)))
  for flag in (True, False):
    print(f"trained_positions={str(flag).lower():5s}: first call {times[flag][0]:.2f} s, "
          f"then median {statistics.median(times[flag][1:]):.2f} s per update")
  print(f"ratio on / off: {statistics.median(times[True][1:]) / statistics.median(times[False][1:]):.2f}x")


if __name__ == "__main__":
  sys.exit(main())
