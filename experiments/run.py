"""Runs one experiment: ``python experiments/run.py --exp=NAME [options of that experiment]``.

``--help`` without ``--exp`` (or no ``--exp`` at all) lists the experiments; ``--exp=NAME --help``
lists that experiment's options. Each experiment is a module of the ``experiments`` package with
``main(argv) -> int | None``; the options after ``--exp`` are passed to it unchanged.

Compiled XLA programs are kept between runs in JAX's persistent compilation cache, so a second run
of the same shapes (another seed, the next experiment, the same command again) loads them instead
of compiling: ``--compile-cache DIR`` puts it elsewhere (default ``$RTI_JAX_COMPILE_CACHE``, else
``~/.cache/rti_jax/xla``), ``--compile-cache off`` runs without it. Programs that compile in under
half a second are not kept. A ``JAX_COMPILATION_CACHE_DIR`` set in the environment wins.

With ``RTI_JAX_HOST_MALLOC=keep`` on the CPU backend the command starts itself again once with glibc
allocator settings that keep freed buffers in the process (``rti_jax/host_malloc.py``: faster
updates, more memory, slower compilation).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import sys
from typing import Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script, the repository root is not on the path
  sys.path.insert(0, str(ROOT))

#: --exp name -> (module, one-line description)
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "compare": ("experiments.compare", "GRPO vs RTI (and --methods) on any registered environment (--env NAME)"),
    "navigation": ("experiments.navigation", "GRPO vs RTI on Navigation from the tiny base policy (the main job)"),
    "navigation_ablation": ("experiments.navigation_ablation", "RTI ablations (Table 3)"),
    "navigation_baselines": ("experiments.navigation_baselines", "baselines (Table 1)"),
    "delta_sweep": ("experiments.delta_sweep", "PPL-gate threshold sweep (Fig. 3)"),
    "intervention_variants": ("experiments.intervention_variants",
                              "RTI variants: a stronger intervener vs self (Fig. 6), pi_cal vs pi_roll behaviour"),
    "theorem": ("experiments.theorem", "numerical check of Theorem 1 (Appendix B)"),
    "tabular": ("experiments.tabular", "fast tabular model of the whole method"),
    "telecom": ("experiments.telecom", "GRPO vs RTI on tau2-Telecom"),
    "telecom_ablation": ("experiments.telecom_ablation", "RTI ablations on tau2-Telecom (Table 3)"),
    "navigation_sft": ("experiments.navigation_sft",
                       "build the tiny Navigation base policy by SFT (configs/sft_navigation.yaml; --chain)"),
    "telecom_sft": ("experiments.telecom_sft", "build the tiny Telecom base policy by SFT (configs/sft_telecom.yaml)"),
    "tau2_sft": ("experiments.tau2_sft",
                 "build a tiny tau2-Retail or tau2-Airline base policy by SFT (--env; configs/sft_tau2.yaml)"),
    "judge_sft": ("experiments.judge_sft",
                  "teach a policy to be its own Validator and Verifier by SFT on the rule oracles; their agreement"),
    "decision_probe": ("experiments.diagnostics.decision_probe",
                       "diagnostic: the decisive step's probability per RL iteration (Navigation)"),
    "name_copy_check": ("experiments.diagnostics.name_copy_check",
                        "diagnostic: does a Navigation policy copy names and coordinates (teacher-forced)"),
    "hidden_city_corrections": ("experiments.diagnostics.hidden_city_corrections",
                                "diagnostic: what applied corrections do on Navigation's hidden-city tasks"),
    "name_drill": ("experiments.diagnostics.name_drill",
                   "diagnostic: can a fresh tiny model learn to read stop names out of a request"),
    "copy_errors": ("experiments.diagnostics.copy_errors",
                    "diagnostic: where a tiny tau2 policy's copies go wrong (teacher-forced, held-out drills)"),
}


def listing() -> str:
  """The experiments, one per line."""
  return "experiments:\n" + "\n".join(f"  {n:<22} {d}" for n, (_, d) in EXPERIMENTS.items())


def default_compile_cache() -> str:
  return os.environ.get("RTI_JAX_COMPILE_CACHE") or str(pathlib.Path.home() / ".cache" / "rti_jax" / "xla")


def use_compile_cache(where: str, min_compile_s: float = 0.5) -> str | None:
  """Turns JAX's persistent compilation cache on at ``where`` for programs that take at least
  ``min_compile_s`` to compile (``off``: leaves it off); the directory in use, or None."""
  import jax

  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]  # jax has read it already
  if where == "off":
    return None
  pathlib.Path(where).mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", where)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
  # the worker processes of side-by-side trainings (rti_jax.experiment.run) read it from the environment
  os.environ["JAX_COMPILATION_CACHE_DIR"] = where
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(float(min_compile_s))
  return where


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="run.py", usage="%(prog)s --exp=NAME [options of NAME]",
                                   description=__doc__.split("\n")[0], epilog=listing(), add_help=False,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--exp", help="experiment name (listed below)")
  parser.add_argument("-h", "--help", action="store_true", help="without --exp: this list; with it: its options")
  parser.add_argument("--compile-cache", default=None, metavar="DIR|off",
                      help="JAX's persistent compilation cache (default: $RTI_JAX_COMPILE_CACHE, else "
                           "~/.cache/rti_jax/xla; off: none)")
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
  if not args.help:
    use_compile_cache(args.compile_cache or default_compile_cache())
  module = importlib.import_module(EXPERIMENTS[args.exp][0])
  from rti_jax.generation.http_json import BackendUnavailableError, ServerProtocolError

  try:
    result = module.main((["--help"] if args.help else []) + rest)
  except (BackendUnavailableError, ServerProtocolError) as e:
    # A server the run depends on (generation, a judge, the user simulator) is gone or broken: the
    # iteration it was in never reached an update, and each training keeps its last checkpoint.
    print(f"run.py --exp={args.exp}: stopped: {e}\nNothing of the unfinished iteration was kept; once the server "
          "is back, the same command with --out <the run directory> resumes every training from its last "
          "checkpoint.", file=sys.stderr)
    return 1
  return int(result or 0)


if __name__ == "__main__":
  from rti_jax import host_malloc

  host_malloc.reexec_with_settings()  # RTI_JAX_HOST_MALLOC=keep: glibc keeps freed buffers (rti_jax/host_malloc.py)
  sys.exit(main())
