"""Runs one experiment: ``python experiments/run.py --exp=NAME [options of that experiment]``.

``--help`` without ``--exp`` (or no ``--exp`` at all) lists the experiments; ``--exp=NAME --help``
lists that experiment's options. Each experiment is a module of the ``experiments`` package with
``main(argv) -> int | None``; the options after ``--exp`` are passed to it unchanged.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
from typing import Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script, the repository root is not on the path
  sys.path.insert(0, str(ROOT))

#: --exp name -> (module, one-line description)
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "navigation": ("experiments.navigation", "GRPO vs RTI on Navigation from the tiny base policy (the main job)"),
    "navigation_ablation": ("experiments.navigation_ablation", "RTI ablations (Table 3)"),
    "navigation_baselines": ("experiments.navigation_baselines", "baselines (Table 1)"),
    "delta_sweep": ("experiments.delta_sweep", "PPL-gate threshold sweep (Fig. 3)"),
    "theorem": ("experiments.theorem", "numerical check of Theorem 1 (Appendix B)"),
    "tabular": ("experiments.tabular", "fast tabular model of the whole method"),
    "telecom": ("experiments.telecom", "GRPO vs RTI on tau2-Telecom"),
    "telecom_ablation": ("experiments.telecom_ablation", "RTI ablations on tau2-Telecom (Table 3)"),
    "navigation_sft": ("experiments.navigation_sft",
                       "build the tiny Navigation base policy by SFT (configs/sft_navigation.yaml; --chain)"),
    "telecom_sft": ("experiments.telecom_sft", "build the tiny Telecom base policy by SFT (configs/sft_telecom.yaml)"),
    "decision_probe": ("experiments.diagnostics.decision_probe",
                       "diagnostic: the decisive step's probability per RL iteration (Navigation)"),
    "name_copy_check": ("experiments.diagnostics.name_copy_check",
                        "diagnostic: does a Navigation policy copy names and coordinates (teacher-forced)"),
    "name_drill": ("experiments.diagnostics.name_drill",
                   "diagnostic: can a fresh tiny model learn to read stop names out of a request"),
}


def listing() -> str:
  """The experiments, one per line."""
  return "experiments:\n" + "\n".join(f"  {n:<22} {d}" for n, (_, d) in EXPERIMENTS.items())


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="run.py", usage="%(prog)s --exp=NAME [options of NAME]",
                                   description=__doc__.split("\n")[0], epilog=listing(), add_help=False,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--exp", help="experiment name (listed below)")
  parser.add_argument("-h", "--help", action="store_true", help="without --exp: this list; with it: its options")
  args, rest = parser.parse_known_args(None if argv is None else list(argv))
  if args.exp is None:
    if args.help:
      parser.print_help()
      return 0
    print(f"--exp is required\n{parser.format_help()}", file=sys.stderr)
    return 2
  if args.exp not in EXPERIMENTS:
    print(f"unknown experiment {args.exp!r}\n{listing()}", file=sys.stderr)
    return 2
  module = importlib.import_module(EXPERIMENTS[args.exp][0])
  result = module.main((["--help"] if args.help else []) + rest)
  return int(result or 0)


if __name__ == "__main__":
  sys.exit(main())
