"""GRPO vs RTI on Navigation from the tiny base policy (the project's main job).

    python experiments/run.py --exp=navigation                 # the default run (one seed)
    python experiments/run.py --exp=navigation --seeds 0 1 2  # the README's 3-seed table
    python experiments/run.py --exp=navigation --quick         # a smoke run (minutes)
    python experiments/run.py --exp=navigation train.iterations=30 rollout.group_size=4   # overrides

For each seed: GRPO and RTI are trained from the same base policy with the same budget
and seed; base, GRPO and RTI are then evaluated on the held-out test split (4 samples
per task); a Table-1-style table (p@1, avg p@k, avg pk; overall and on the tasks that
need disambiguation) is printed and written, with per-iteration plots (paper Fig. 4,
5a, 5b), into the run directory. The test split is only ever evaluated: it picks no
checkpoint, stops nothing and tunes nothing.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

import numpy as np

from rti_jax import experiment, reporting

#: the --quick profile: every stage of the default run (both methods, an intervention that replaces a
#: group, periodic and test evaluations) at the smallest size. Groups of 2 make every sampler call 8
#: rows (rollouts, evaluations and the intervention share their programs) and fail entirely more
#: often; one length chunk compiles one update program per method. Both cut the programs compiled,
#: which are most of its time (docs/benchmarks.md).
QUICK = [
    "env.num_train=32", "env.num_test=16", "rollout.tasks_per_iter=4", "rollout.group_size=2",
    "train.iterations=2", "train.eval_every=2", "train.eval_tasks=8", "train.val_tasks=8", "train.eval_samples=2",
    "train.checkpoint_every=2", "optim.length_chunks=1",
]
METHODS = ("grpo", "rti")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = experiment.common_parser("run.py --exp=navigation", __doc__, "runs/<name>-<time>")
  p.add_argument("--methods", nargs="+", default=list(METHODS), choices=["grpo", "rti"])
  return experiment.split_overrides(p, argv)


def summary_rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
  """Table-1 rows (percent, mean over seeds): p@1, avg p@k, avg pk overall and on the disambiguation split;
  "re-search only": the tasks needing disambiguation whose first results do not list the right place
  (``tasks.listed_alternative``), so only a re-search solves them."""
  cols = ["method", "p@1", "avg p@k", "avg pk", "disamb p@1", "disamb avg p@k", "re-search only p@1", "other p@1"]
  rows = []
  for method in results["methods"]:
    vals = []
    for part, key in (("all", "p@1"), ("all", "avg p@k"), ("all", "avg pk"), ("disambiguation", "p@1"),
                      ("disambiguation", "avg p@k"), ("research_only", "p@1"), ("not_disambiguation", "p@1")):
      xs = [r[method][part][key] for r in results["runs"].values() if part in r[method]]
      vals.append(100 * float(np.mean(xs)) if xs else float("nan"))
    rows.append([method, *vals])
  return cols, rows


def val_rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
  """The last periodic evaluation of each trained method (the validation split when
  ``train.val_tasks`` > 0), mean over seeds: what the hyperparameters were chosen on."""
  cols = ["method", "p@1", "avg p@k", "disamb p@1", "other p@1", "tasks"]
  rows = []
  for method in results["methods"][1:]:
    evs = [r[f"{method}_records"][-1]["eval"] for r in results["runs"].values()
           if r.get(f"{method}_records") and "eval" in r[f"{method}_records"][-1]]
    if not evs:
      continue

    def mean(part: str, key: str) -> float:
      xs = [e[part][key] for e in evs if part in e]
      return 100 * float(np.mean(xs)) if xs else float("nan")

    rows.append([method, mean("all", "p@1"), mean("all", "avg p@k"), mean("disambiguation", "p@1"),
                 mean("not_disambiguation", "p@1"), evs[0]["num_tasks"]])
  return cols, rows


def main(argv: Sequence[str] | None = None) -> int:
  args, unknown = parse_args(argv)
  prepared = experiment.prepare_run(args, unknown, QUICK)
  if prepared is None:
    return 2
  overrides, out = prepared
  variants = {m: [f"loss.method={m}"] for m in args.methods}
  results = experiment.run(args.config, overrides, args.seeds, variants, out, progress=not args.no_progress,
                reuse=args.reuse, jobs=args.jobs)
  cols, rows = summary_rows(results)
  table = reporting.print_table(f"Navigation, held-out test split ({len(args.seeds)} seed(s), %)", cols, rows)
  experiment.report(results, out, table, cols, rows, val_rows(results),
         "Last periodic evaluation (validation split if train.val_tasks > 0; %)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
