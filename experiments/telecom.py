"""GRPO vs RTI on tau2-Telecom from the tiny Telecom base policy.

    python experiments/run.py --exp=telecom                   # one seed (configs/telecom.yaml)
    python experiments/run.py --exp=telecom --seeds 0 1 2    # the README's 3-seed gap
    python experiments/run.py --exp=telecom --quick --policy policies/<dir>   # a smoke run
    python experiments/run.py --exp=telecom train.iterations=20 rollout.group_size=8   # overrides

The base policy is built by ``experiments/telecom_sft.py`` (``policies/telecom_base``) and sees
the condensed policy (``env.telecom.policy_text: condensed``; what was condensed:
``rti_jax/envs/telecom/condensed.py``). For each seed, GRPO and RTI (rule-based Validator and
Verifier, the policy as its own Corrector) are trained from that policy on the train split
(the last ``train.val_tasks`` train tasks, also held out of the base policy's SFT, are the
validation split) with the same budget and seed; base, GRPO and RTI are then evaluated on the
40 test tasks with ``train.eval_samples`` (4) samples each. Output as Navigation's: a table of
p@1 / avg p@k / avg pk overall and per issue type, the per-seed RTI - GRPO gap,
``results.json``, ``table.md`` and the plots of ``rti_jax.experiment.plot`` (Fig. 4, 5a, 5b). The test
split is only ever evaluated.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys
from typing import Any, Sequence

import numpy as np

from rti_jax import experiment
from rti_jax.config import load_config

QUICK = [
    "rollout.tasks_per_iter=2", "rollout.group_size=2", "rollout.max_new_tokens=48", "env.max_turns=4",
    "train.iterations=1", "train.eval_every=1", "train.val_tasks=2", "train.eval_samples=2",
    "train.checkpoint_every=1",
]
QUICK_TEST_TASKS = 3
METHODS = ("grpo", "rti")
#: (column, subset key of Trainer.evaluate) for the per-issue columns
SUBSET_COLUMNS = (("service p@1", "service_issue"), ("data p@1", "mobile_data_issue"), ("mms p@1", "mms_issue"),
                  ("hard persona p@1", "hard_persona"))


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = experiment.common_parser("run.py --exp=telecom", __doc__, "runs/<name>-<time>")
  p.set_defaults(config="telecom")
  p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
  p.add_argument("--policy", default=None, help="the base policy dir (overrides policy.path)")
  p.add_argument("--test-tasks", type=int, default=None,
                 help=f"evaluate only the first N test tasks (default all 40; {QUICK_TEST_TASKS} with --quick)")
  return experiment.split_overrides(p, argv)


def make_source(cfg: Any, test_tasks: int | None) -> Any:
  """The Telecom task source of ``cfg`` (``env.telecom.policy_text`` picks the policy text), with the
  test split cut to its first ``test_tasks`` when given."""
  from rti_jax.envs.telecom.source import telecom_source

  return experiment.cut_test(telecom_source(cfg), test_tasks)


def run(cfg_name: str, overrides: Sequence[str], seeds: Sequence[int], methods: Sequence[str], out: pathlib.Path,
        test_tasks: int | None = None, progress: bool = True, reuse: Sequence[str | pathlib.Path] = (),
        jobs: int | None = None) -> dict[str, Any]:
  """Trains each method from the same base policy, budget and seed; evaluates base and each
  on the test split (``rti_jax.experiment.run`` with the Telecom source). ``runs[seed][method]`` is the
  final evaluation, ``runs[seed][method + "_records"]`` the per-iteration metrics (the layout
  ``rti_jax.experiment.plot`` reads)."""
  base_cfg = load_config(cfg_name, list(overrides))
  if base_cfg.env.name != "telecom":
    raise SystemExit(f"--config {cfg_name}: expected env.name telecom, got {base_cfg.env.name!r}")
  variants = {m: [f"loss.method={m}"] for m in methods}
  return experiment.run(cfg_name, overrides, seeds, variants, out, progress=progress,
                        source=functools.partial(make_source, test_tasks=test_tasks), reuse=reuse, jobs=jobs)


def summary_rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
  """Rows (percent, mean over seeds): p@1, avg p@k, avg pk overall, and p@1 per issue type and on
  the Hard persona."""
  cols = ["method", "p@1", "avg p@k", "avg pk", *[c for c, _ in SUBSET_COLUMNS]]
  parts = [("all", "p@1"), ("all", "avg p@k"), ("all", "avg pk"), *[(k, "p@1") for _, k in SUBSET_COLUMNS]]
  rows = []
  for method in results["methods"]:
    vals = []
    for part, key in parts:
      xs = [r[method][part][key] for r in results["runs"].values() if part in r[method]]
      vals.append(100 * float(np.mean(xs)) if xs else float("nan"))
    rows.append([method, *vals])
  return cols, rows


def main(argv: Sequence[str] | None = None) -> int:
  args, unknown = parse_args(argv)
  if args.policy is not None:
    if not pathlib.Path(args.policy).is_dir():
      print(f"--policy: {args.policy} is not a directory (build one with --exp=telecom_sft)", file=sys.stderr)
      return 2
    args.overrides = [*args.overrides, f"policy.path={args.policy}"]
  prepared = experiment.prepare_run(args, unknown, QUICK)
  if prepared is None:
    return 2
  overrides, out = prepared
  if not experiment.policy_dir_exists(args.config, overrides, "; build the base policy first: python "
                                     "experiments/run.py --exp=telecom_sft --policy-dir {path}"):
    return 2
  test_tasks = args.test_tasks if args.test_tasks is not None else (QUICK_TEST_TASKS if args.quick else None)
  results = run(args.config, overrides, args.seeds, args.methods, out, test_tasks, progress=not args.no_progress,
                reuse=args.reuse, jobs=args.jobs)
  experiment.print_and_report(results, out, "Telecom", *summary_rows(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
