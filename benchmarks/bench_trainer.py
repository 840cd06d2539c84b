"""Cost of one Algorithm-1 iteration of a config (default: Navigation), by stage.

    python benchmarks/bench_trainer.py [--iterations 2] [--methods rti grpo] [key=value ...]
    python benchmarks/bench_trainer.py --config retail --methods grpo --iterations 6 --eval-tasks 0 \
        policy.path=policies/retail_base optim.length_buckets_per_octave=4

Trains ``--iterations`` iterations of each method from the configured policy (default: the
shipped tiny policy) in a temporary run dir and prints, per iteration, the seconds spent in
rollouts, intervention and the jitted update, the tokens processed, the update's batch shapes new
to the process (each a compilation), and the evaluation cost of 30 test tasks x 4 samples. The
first iteration includes jit compilation; read the later ones.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench_common import load_average, machine  # noqa: E402

from rti_jax.config import load_config  # noqa: E402
from rti_jax.reporting import print_table  # noqa: E402
from rti_jax.trainer import Trainer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="navigation", help="a config under configs/ (or a path)")
  p.add_argument("--iterations", type=int, default=2)
  p.add_argument("--methods", nargs="+", default=["rti", "grpo"])
  p.add_argument("--eval-tasks", type=int, default=30)
  args, overrides = p.parse_known_args(argv)
  print(f"# machine: {machine()}", flush=True)
  rows = []
  for method in args.methods:
    cfg = load_config(args.config, [f"loss.method={method}", f"train.iterations={args.iterations}", *overrides])
    with tempfile.TemporaryDirectory() as tmp:
      trainer = Trainer(cfg, tmp, progress=False)
      for r in trainer.train():
        rows.append([method, r["iteration"], r["time/rollout_s"], r["time/intervention_s"], r["time/update_s"],
                     r["time/iteration_s"], r["tokens"], r["tokens_per_s"], r["update/new_shapes"]])
      if args.eval_tasks:
        t0 = time.perf_counter()
        trainer.evaluate(trainer.source.test[: args.eval_tasks], 4, seed=0)
        rows.append([method, f"eval {args.eval_tasks}x4", "", "", "", time.perf_counter() - t0, "", "", ""])
  print_table(f"One iteration of the {args.config} config (seconds)",
              ["method", "iteration", "rollout", "intervention", "update", "total", "tokens", "tokens/s",
               "new shapes"], rows, floatfmt="{:.1f}")
  print(f"# load avg at the end: {load_average():.2f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
