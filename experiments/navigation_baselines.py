"""The RL baselines on Navigation (paper Sec. 5.1-5.2, Table 1's Navigation columns).

    python experiments/run.py --exp=navigation_baselines                  # one seed, the config's budget
    python experiments/run.py --exp=navigation_baselines --seeds 0 1 2
    python experiments/run.py --exp=navigation_baselines --quick          # a smoke run on this CPU
    python experiments/run.py --exp=navigation_baselines --teacher policies/navigation_teacher

GRPO, GSPO, AEPO, OPD, LUFFY and RTI are trained from the same base policy, budget and seed
and evaluated with the base policy on the held-out test split; Table 1's columns (p@1,
avg p@k, avg pk) are printed, overall and on the tasks that need disambiguation.

Each baseline follows its paper (see ``rti_jax/objectives/baselines.py`` and ``rti_jax/baselines.py``):

* GSPO: sequence-level, length-normalised ratio and sequence-level clipping (3e-4 / 4e-4).
* AEPO: the entropy-balanced branching rollout (``rti_jax/aepo_rollout.py``,
  ``baselines.aepo_branching``, on by default) and the policy update (entropy-aware advantages
  from the sampling policy's per-token entropy, gradient-preserving upper clip, token-mean
  aggregation).
* OPD: slime's on-policy distillation, ``A_t = A - coef * (log pi_student - log pi_teacher)``
  on the student's own rollouts. The teacher is a checkpoint sharing the policy's tokenizer
  (``--teacher``, default ``policies/navigation_teacher``, shipped), made offline by the SFT
  script from the default base policy with the decisive re-search trained on every
  disambiguation task (its card has the exact command)::

      python experiments/run.py --exp=navigation_sft init=policies/navigation_base data.check_line=true \\
          data.complete_share=0 data.resolve_share=1.0 train.epochs=1 train.warmup_epochs=0 train.lr=1e-3 \\
          --policy-dir policies/navigation_teacher --out runs/navigation_teacher

  Without a teacher the OPD row is skipped (named in the table and in ``results.json``).
* LUFFY: the scripted oracle's trajectories are the off-policy demonstrations (the paper uses
  a larger model; offline, the oracle is the stronger policy we have). One replaces one failed
  member of each all-fail group (RTI paper App. C.3; ``baselines.luffy_when=always`` mixes
  one into every group, as the LUFFY paper does); its tokens are trained with LUFFY's shaped,
  unclipped off-policy term; token-mean aggregation.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any, Sequence

from experiments import navigation as nav_exp
from rti_jax import experiment, reporting

DEFAULT_TEACHER = pathlib.Path(__file__).resolve().parents[1] / "policies" / "navigation_teacher"
METHODS = ("grpo", "gspo", "aepo", "opd", "luffy", "rti")
NAMES = {"base": "Base policy", "grpo": "GRPO", "gspo": "GSPO", "aepo": "AEPO", "opd": "OPD", "luffy": "LUFFY",
         "rti": "RTI"}

#: the --quick profile: navigation's smoke profile, with 4 samples per test task (pass@1..4, pass^1..4).
QUICK = [*nav_exp.QUICK, "train.eval_samples=4"]

def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = experiment.common_parser("run.py --exp=navigation_baselines", __doc__, "runs/<name>-baselines-<time>")
  p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
  p.add_argument("--teacher", default=str(DEFAULT_TEACHER), help="OPD teacher checkpoint (shares the tokenizer)")
  return experiment.split_overrides(p, argv)


def baseline_variants(methods: Sequence[str], teacher: str | None) -> tuple[dict[str, list[str]], dict[str, str]]:
  """label -> overrides for each method, and label -> reason for each method left out."""
  from rti_jax.baselines import method_variants

  return method_variants(methods, teacher, "make one as policies/navigation_teacher/README.md says "
                                           "(navigation_sft init=policies/navigation_base data.resolve_share=1.0 ...)")


def table1_rows(results: dict[str, Any], skipped: dict[str, str]) -> tuple[list[str], list[list[Any]]]:
  """``navigation.summary_rows`` with Table 1's method names, plus a nan row per skipped method."""
  cols, rows = nav_exp.summary_rows(results)
  out = [[NAMES.get(r[0], r[0]), *r[1:]] for r in rows]
  for m in skipped:
    out.append([f"{NAMES[m]} (skipped)", *[float("nan")] * (len(cols) - 1)])
  return cols, out


def plot_bars(cols: Sequence[str], rows: Sequence[Sequence[Any]], out: pathlib.Path) -> str:
  """``baselines.png``: p@1, avg p@k and avg pk per method (Table 1 as bars)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  metrics = list(cols[1:4])
  x = np.arange(len(rows))
  fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4))
  w = 0.8 / len(metrics)
  for j, m in enumerate(metrics):
    ax.bar(x + (j - (len(metrics) - 1) / 2) * w, [r[1 + j] for r in rows], w, label=m)
  ax.set_xticks(x, [r[0] for r in rows], rotation=20, fontsize=8)
  ax.set(title="Navigation, held-out test split (Table 1)", ylabel="%")
  ax.grid(alpha=0.3, axis="y")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out / "baselines.png", dpi=120)
  plt.close(fig)
  return "baselines.png"


def main(argv: Sequence[str] | None = None) -> int:
  args, unknown = parse_args(argv)
  prepared = experiment.prepare_run(args, unknown, QUICK, "-baselines")
  if prepared is None:
    return 2
  overrides, out = prepared
  variants, skipped = baseline_variants(args.methods, args.teacher)
  for m, why in skipped.items():
    print(f"{NAMES[m]} skipped: {why}", file=sys.stderr)
  if not variants:
    print("no method left to train", file=sys.stderr)
    return 2
  results = experiment.run(args.config, overrides, args.seeds, variants, out, progress=not args.no_progress,
                        reuse=args.reuse, jobs=args.jobs)
  results["skipped"] = skipped
  cols, rows = table1_rows(results, skipped)
  table = reporting.print_table(f"Navigation baselines, held-out test split ({len(args.seeds)} seed(s), %; "
                                "Table 1 columns)", cols, rows)
  results["table"] = {"columns": cols, "rows": rows}
  experiment.write_results(results, out, [table])
  pngs = [plot_bars(cols, rows, out), *experiment.plot(results, out)]
  print(f"run dir: {out}  (results.json, table.md, {', '.join(pngs)}, seed*/<method>/metrics.jsonl)")
  print(f"wall time: {results['wall_s'] / 60:.1f} min")
  return 0


if __name__ == "__main__":
  sys.exit(main())
