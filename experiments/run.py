"""Runs one experiment: ``python experiments/run.py --exp=NAME [options of that experiment]``.

Each experiment is a module in this folder with ``main(argv) -> int | None``;
the options after ``--exp`` are passed to it unchanged (``--help`` lists them).
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

# --exp name -> (module in experiments/, one-line description)
EXPERIMENTS: dict[str, tuple[str, str]] = {}


def _register_available() -> None:
  candidates = {
      "navigation": ("navigation", "GRPO vs RTI on Navigation from the tiny base policy (the main job)"),
      "navigation_sft": ("navigation_sft", "build the tiny base policy by SFT on scripted trajectories"),
      "navigation_ablation": ("navigation_ablation", "RTI ablations (Table 3)"),
      "navigation_baselines": ("navigation_baselines", "baselines (Table 1)"),
      "delta_sweep": ("delta_sweep", "PPL-gate threshold sweep (Fig. 3)"),
      "theorem": ("theorem", "numerical check of Theorem 1 (Appendix B)"),
      "tabular": ("tabular", "fast tabular model of the whole method"),
      "telecom": ("telecom", "GRPO vs RTI on tau2-Telecom"),
      "telecom_sft": ("telecom_sft", "build the tiny Telecom base policy by SFT on scripted trajectories"),
      "decision_probe": ("decision_probe", "Navigation diagnostic: the decisive step's probability per RL iteration"),
  }
  for name, (module, desc) in candidates.items():
    if (HERE / f"{module}.py").exists():
      EXPERIMENTS[name] = (module, desc)


def main(argv: list[str] | None = None) -> int:
  _register_available()
  parser = argparse.ArgumentParser(description=__doc__, add_help=False)
  parser.add_argument("--exp", required=False, help="experiment name")
  args, rest = parser.parse_known_args(argv)
  if args.exp is None or args.exp not in EXPERIMENTS:
    lines = "\n".join(f"  {n:<22} {d}" for n, (_, d) in sorted(EXPERIMENTS.items()))
    msg = f"unknown experiment {args.exp!r}" if args.exp else "--exp is required"
    print(f"{msg}; available experiments:\n{lines}", file=sys.stderr)
    return 2
  for path in (str(ROOT), str(HERE)):
    if path not in sys.path:
      sys.path.insert(0, path)
  module = importlib.import_module(EXPERIMENTS[args.exp][0])
  result = module.main(rest)
  return int(result or 0)


if __name__ == "__main__":
  sys.exit(main())
