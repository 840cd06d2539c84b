"""Benchmark: the default Navigation update with the behaviour log-probs recomputed by a forward pass
(``loss.behaviour_logp: recompute``) vs taken from the sampler at the rollout temperature
(``loss.behaviour_logp: rollout``; docs/objectives.md).

Builds the trainer of ``configs/navigation.yaml`` (overrides accepted), runs one iteration to get a
real batch of rollouts, then times ``Trainer.update`` on that batch alternately with each setting
(two optimizer steps over the length chunks and the KL reference pass in both; the recompute pass
in the first only). The first call of each setting is reported apart (it may compile); the rest
are the median of ``--reps`` calls. Prints both and their ratio.

  python benchmarks/bench_behaviour_logp.py
  python benchmarks/bench_behaviour_logp.py --reps 5 rollout.tasks_per_iter=4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench_common import navigation_update_batch


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("overrides", nargs="*", help="config overrides key=value")
  args = ap.parse_args(argv)
  trainer, groups = navigation_update_batch(args.overrides, "bench_bl_")
  modes = ("recompute", "rollout")
  times: dict[str, list[float]] = {m: [] for m in modes}
  for _ in range(args.reps + 1):
    for mode in modes:
      trainer.cfg.loss.behaviour_logp = mode
      t0 = time.perf_counter()
      trainer.update(groups)
      times[mode].append(time.perf_counter() - t0)
  print(f"{sum(len(t.token_ids) for g in groups for t in g)} tokens in {sum(len(g) for g in groups)} rollouts")
  for mode in modes:
    print(f"behaviour_logp={mode:9s}: first call {times[mode][0]:.2f} s, then median "
          f"{statistics.median(times[mode][1:]):.2f} s per update")
  print(f"ratio rollout / recompute: "
        f"{statistics.median(times['rollout'][1:]) / statistics.median(times['recompute'][1:]):.2f}x")


if __name__ == "__main__":
  sys.exit(main())
