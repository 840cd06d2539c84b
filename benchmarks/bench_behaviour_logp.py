"""Benchmark: the default Navigation update with the behaviour log-probs recomputed by a forward pass
(``loss.behaviour_logp: recompute``) vs taken from the sampler at the rollout temperature
(``loss.behaviour_logp: rollout``; docs/objectives.md).

Builds the trainer of ``configs/navigation.yaml`` (overrides accepted), runs one iteration to get a
real batch of rollouts, then times ``Trainer.update`` on that batch alternately with each setting
(two optimizer steps over the length chunks and the KL reference pass in both; the recompute pass
in the first only): a warm-up call each, then the median of ``--reps`` rounds
(``bench_common.alternating_medians``). Prints both and their ratio.

  python benchmarks/bench_behaviour_logp.py
  python benchmarks/bench_behaviour_logp.py --reps 5 rollout.tasks_per_iter=4
"""

from __future__ import annotations

import argparse
import sys

from bench_common import alternating_medians, machine, navigation_update_batch


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("overrides", nargs="*", help="config overrides key=value")
  args = ap.parse_args(argv)
  trainer, groups = navigation_update_batch(args.overrides, "bench_bl_")

  def update_with(mode: str):
    def run() -> None:
      trainer.cfg.loss.behaviour_logp = mode
      trainer.update(groups)  # returns host floats: the step has finished
    return run

  t = alternating_medians({m: update_with(m) for m in ("recompute", "rollout")}, args.reps)
  print(machine())
  print(f"{sum(len(x.token_ids) for g in groups for x in g)} tokens in {sum(len(g) for g in groups)} rollouts")
  for mode, sec in t.items():
    print(f"behaviour_logp={mode:9s}: median {sec:.2f} s per update")
  print(f"ratio rollout / recompute: {t['rollout'] / t['recompute']:.2f}x")


if __name__ == "__main__":
  sys.exit(main())
