"""GRPO vs RTI (and any other method) on any registered environment.

    python experiments/run.py --exp=compare --env retail --seeds 0 1 2
    python experiments/run.py --exp=compare --env navigation --methods grpo rti gspo
    python experiments/run.py --exp=compare --env telecom --quick          # a smoke run
    python experiments/run.py --exp=compare --env retail --methods grpo gspo aepo luffy rti opd --teacher DIR

The config is ``configs/<env>.yaml`` when there is one, else the schema's defaults with
``env.name=<env>`` (give ``policy.path=...``); ``--config`` picks another. For each seed every
method is trained from the same base policy, budget and seed; base and each method are then
evaluated on the environment's test split. The table's columns are p@1, avg p@k and avg pk
overall (each method with its paper's settings: ``baselines.method_variants``; OPD needs
``--teacher``), then p@1 on each of the environment's report subsets (``TaskSource.subsets``), then the
intervention statistics of Table 6 summed over the run and the training time. ``results.json``,
``table.md`` and the plots go to the run directory, as for every experiment. The test split is
only ever evaluated.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any, Sequence

import numpy as np

from rti_jax import experiment, objectives
from rti_jax.config import CONFIG_DIR
from rti_jax.envs import registry

QUICK = [
    "rollout.tasks_per_iter=2", "rollout.group_size=2", "train.iterations=1", "train.eval_every=1",
    "train.val_tasks=2", "train.eval_samples=2", "train.checkpoint_every=1", "env.max_turns=4",
]
QUICK_TEST_TASKS = 3
DEFAULT_METHODS = ("grpo", "rti")

#: (column, the Table 6 counter summed over a method's iterations)
TABLE6 = (("triggered", "rti/groups_triggered"), ("flagged", "rti/steps_flagged"),
          ("applied", "rti/corrections_applied"), ("verifier rej", "rti/verifier_rejected"),
          ("ppl rej", "rti/ppl_rejected"), ("replaced", "rti/groups_replaced"))


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = experiment.common_parser("run.py --exp=compare", __doc__, "runs/<name>-<time>")
  p.set_defaults(config=None)
  p.add_argument("--env", required=True, help="a registered environment (python -m rti_jax.envs list)")
  p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=list(objectives.LOSSES),
                 help="methods to train (loss.method values); default: grpo rti")
  p.add_argument("--teacher", default=None, help="OPD's teacher checkpoint (shares the policy's tokenizer); "
                 "without one the opd method is skipped")
  p.add_argument("--test-tasks", type=int, default=None,
                 help=f"evaluate only the first N test tasks (default all; {QUICK_TEST_TASKS} with --quick)")
  return experiment.split_overrides(p, argv)


def config_for(env: str, config: str | None) -> tuple[str | None, list[str]]:
  """The config to start from and the override that selects ``env``: ``--config`` if given, else
  ``configs/<env>.yaml`` if it exists, else the schema's defaults."""
  if config is not None:
    return config, [f"env.name={env}"]
  if (CONFIG_DIR / f"{env}.yaml").exists():
    return env, [f"env.name={env}"]
  return None, [f"env.name={env}", f"name={env}"]


def subset_names(results: dict[str, Any]) -> list[str]:
  """The report subsets found in the evaluations (``Trainer.evaluate`` writes ``num_<name>``
  beside each), in first-seen order."""
  names: dict[str, None] = {}
  for per_seed in results["runs"].values():
    for method in results["methods"]:
      for key in per_seed.get(method, {}):
        if key.startswith("num_") and key != "num_tasks":
          names.setdefault(key[4:], None)
  return list(names)


def summary_rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
  """One row per method (percent, mean over seeds): p@1, avg p@k, avg pk, p@1 per subset, the Table 6
  counters summed over iterations and seeds, the training minutes (mean over seeds), and, when the
  environment checks its rewards against a reference evaluator (``reward_audit/*``), the episodes
  checked in training and evaluation with the disagreements."""
  subsets = subset_names(results)
  audited = audit_totals(results)
  cols = ["method", "p@1", "avg p@k", "avg pk", *[f"{s} p@1" for s in subsets], *[c for c, _ in TABLE6],
          "train min", *(["reward checks (off)"] if audited else [])]
  rows = []
  for method in results["methods"]:
    runs = [r for r in results["runs"].values() if method in r]
    vals: list[Any] = []
    for part, key in [("all", "p@1"), ("all", "avg p@k"), ("all", "avg pk"), *[(s, "p@1") for s in subsets]]:
      xs = [r[method][part][key] for r in runs if part in r[method]]
      vals.append(100 * float(np.mean(xs)) if xs else float("nan"))
    records = [x for r in runs for x in r.get(f"{method}_records", [])]
    for _, key in TABLE6:
      vals.append(int(sum(x.get(key, 0) for x in records)) if method != "base" else "-")
    times = [r[f"{method}_train_s"] for r in runs if r.get(f"{method}_train_s") is not None]
    vals.append(float(np.mean(times)) / 60 if times else "-")
    if audited:
      checked, off = audited.get(method, (0, 0))
      vals.append(f"{checked} ({off})")
    rows.append([method, *vals])
  return cols, rows


def audit_totals(results: dict[str, Any]) -> dict[str, tuple[int, int]]:
  """method -> (episodes whose reward was also checked by the reference evaluator, disagreements),
  over its training records and evaluations, all seeds; ``{}`` when nothing was checked."""
  out: dict[str, tuple[int, int]] = {}
  for method in results["methods"]:
    found = [*[x for r in results["runs"].values() for x in r.get(f"{method}_records", [])],
             *[r[method] for r in results["runs"].values() if method in r]]
    checked = sum(int(x.get("reward_audit/checked", 0)) for x in found)
    if checked:
      out[method] = (checked, sum(int(x.get("reward_audit/mismatched", 0)) for x in found))
  return out


def main(argv: Sequence[str] | None = None) -> int:
  args, unknown = parse_args(argv)
  try:
    registry.get(args.env)
  except ValueError as e:
    print(f"--env: {e}", file=sys.stderr)
    return 2
  args.config, select = config_for(args.env, args.config)
  args.overrides = [*select, *args.overrides]
  prepared = experiment.prepare_run(args, unknown, QUICK)
  if prepared is None:
    return 2
  overrides, out = prepared
  if not experiment.policy_dir_exists(args.config, overrides, " (a local HF checkpoint; set policy.path=...)"):
    return 2
  test_tasks = args.test_tasks if args.test_tasks is not None else (QUICK_TEST_TASKS if args.quick else None)
  from rti_jax.baselines import method_variants

  variants, skipped = method_variants(args.methods, args.teacher, "pass --teacher DIR")
  for m, why in skipped.items():
    print(f"compare: {m} left out: {why}", file=sys.stderr)
  if not variants:
    return 2

  source = functools.partial(experiment.registry_source, test_tasks=test_tasks)
  results = experiment.run(args.config, overrides, args.seeds, variants, out, progress=not args.no_progress,
                           source=source, reuse=args.reuse, jobs=args.jobs)
  results["env"] = args.env
  if skipped:
    results["skipped"] = skipped
  experiment.print_and_report(results, out, args.env, *summary_rows(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
