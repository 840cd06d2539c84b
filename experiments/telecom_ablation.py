"""RTI's ablations on tau2-Telecom (paper Sec. 5.3, Table 3's Telecom half).

    python experiments/run.py --exp=telecom_ablation                 # one seed, the config's budget
    python experiments/run.py --exp=telecom_ablation --seeds 0 1 2
    python experiments/run.py --exp=telecom_ablation --quick         # a smoke run on this CPU

The variants of ``--exp=navigation_ablation`` (GRPO, RTI w/o Post-Check, w/o PPL Gating, w/o
Reweight, RTI), trained from the config's Telecom base policy with the same budget and seed and
evaluated on the Telecom test split (``--test-tasks N``: its first N tasks). The run dir gets
``results.json``, ``table.md`` (Table 3's layout, then the intervention counters and clip
fractions per variant), ``ablation.png`` and the per-iteration plots. As in the Navigation
ablation the paper's Corrector is the default (``--corrector paper``: it reads the backend records
and the fix the evidence names, told to conceal both); ``--corrector feedback`` is the tiny
config's own.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys
from typing import Sequence

from experiments import navigation_ablation as nav_ab
from experiments import telecom as tel_exp
from rti_jax import experiment
from rti_jax.config import load_config

#: the --quick profile: Telecom's smoke profile, with 4 samples per test task (pass@1..4, pass^1..4).
QUICK = [*tel_exp.QUICK, "train.eval_samples=4"]


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = experiment.common_parser("run.py --exp=telecom_ablation", __doc__, "runs/<name>-ablation-<time>")
  p.set_defaults(config="telecom")
  p.add_argument("--variants", nargs="+", default=list(nav_ab.VARIANTS), choices=list(nav_ab.VARIANTS))
  nav_ab.add_setting_options(p, hidden_city_share=False)
  p.add_argument("--test-tasks", type=int, default=None,
                 help=f"evaluate only the first N test tasks (default all; {tel_exp.QUICK_TEST_TASKS} with --quick)")
  args, unknown = experiment.split_overrides(p, argv)
  args.overrides[:0] = nav_ab.table3_setting(args)
  return args, unknown


def main(argv: Sequence[str] | None = None) -> int:
  args, unknown = parse_args(argv)
  prepared = experiment.prepare_run(args, unknown, QUICK, "-ablation")
  if prepared is None:
    return 2
  overrides, out = prepared
  cfg = load_config(args.config, overrides)
  if cfg.env.name != "telecom":
    print(f"--config {args.config}: expected env.name telecom, got {cfg.env.name!r}", file=sys.stderr)
    return 2
  if not pathlib.Path(cfg.policy.path).is_dir():
    print(f"policy.path: {cfg.policy.path} is not a directory; build the base policy first: "
          f"python experiments/run.py --exp=telecom_sft --policy-dir {cfg.policy.path}", file=sys.stderr)
    return 2
  test_tasks = args.test_tasks if args.test_tasks is not None else (tel_exp.QUICK_TEST_TASKS if args.quick else None)
  variants = {v: nav_ab.VARIANTS[v] for v in args.variants}
  results = experiment.run(args.config, overrides, args.seeds, variants, out, progress=not args.no_progress,
                           source=functools.partial(tel_exp.make_source, test_tasks=test_tasks), reuse=args.reuse,
                           jobs=args.jobs)
  results["corrector"] = cfg.intervention.corrector
  n_test = next(iter(results["runs"].values()))["base"]["num_tasks"]
  nav_ab.report(results, out, f"Telecom ablation, test split ({n_test} tasks, {len(args.seeds)} seed(s), %; "
                              f"Table 3 layout; {cfg.intervention.corrector} Corrector)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
