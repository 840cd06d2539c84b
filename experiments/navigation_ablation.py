"""RTI's ablations on Navigation (paper Sec. 5.3, Table 3).

    python experiments/run.py --exp=navigation_ablation                 # one seed, the config's budget
    python experiments/run.py --exp=navigation_ablation --seeds 0 1 2
    python experiments/run.py --exp=navigation_ablation --quick         # a smoke run on this CPU
    python experiments/run.py --exp=navigation_ablation train.iterations=30   # overrides

GRPO, RTI w/o Post-Check (``intervention.verifier=off``), RTI w/o PPL Gating
(``intervention.delta=inf``), RTI w/o Reweight (``intervention.reweight=false``) and RTI are
trained from the same base policy, with the same budget and seed; the base policy and every
variant are then evaluated on the held-out test split. The table has Table 3's layout:
pass@1..4 and pass^1..4 (percent, mean over seeds; a k above ``train.eval_samples`` is
shown as nan). The run dir gets ``results.json``, ``table.md``, ``ablation.png`` (pass@k and
pass^k against k per variant) and the per-iteration plots of ``rti_jax.experiment.plot``.

Table 3 measures what each check stops, so the experiment runs the paper's Corrector by default
(``--corrector paper``: App. A.1's inputs, the evidence l among them, told to conceal it);
``--corrector feedback`` is the tiny config's own message (visible values only, the one its policy
was fine-tuned on). ``--hidden-city-share S`` adds hidden-city tasks to train and test
(docs/navigation.md): there a correction that names the city from l succeeds but cannot be
learned, and only the Verifier stands between it and the update. It defaults to the config's
``env.navigation.hidden_city_share``: 0.3 in ``navigation_qwen3_8b``, 0 in the tiny config, whose default
policy was never trained on the system message that offers ``ask_user`` and fails most ordinary
tasks under it (docs/research_log.md); with the tiny config, pair the share with the policy built
for it: ``--hidden-city-share 0.3 policy.path=policies/navigation_hidden``. Both come before the command line's ``key=value``
overrides, which win; the choices are recorded in ``results.json`` (``corrector``,
``hidden_city_share``) and in the table's title.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any, Sequence

import numpy as np

from experiments import navigation as nav_exp
from rti_jax import experiment, reporting
from rti_jax.config import load_config
from rti_jax.intervention.prompting import CORRECTORS

#: label -> overrides on top of the shared base config (same policy, budget and seed).
VARIANTS: dict[str, list[str]] = {
    "grpo": ["loss.method=grpo"],
    # quoted: YAML would read a bare off as the boolean False
    "rti_no_postcheck": ["loss.method=rti", "intervention.verifier='off'"],
    "rti_no_ppl_gate": ["loss.method=rti", "intervention.delta=inf"],
    "rti_no_reweight": ["loss.method=rti", "intervention.reweight=false"],
    "rti": ["loss.method=rti"],
}
#: Table 3's row names.
NAMES = {"base": "Base policy", "grpo": "GRPO", "rti_no_postcheck": "RTI w/o Post-Check",
         "rti_no_ppl_gate": "RTI w/o PPL Gating", "rti_no_reweight": "RTI w/o Reweight", "rti": "RTI"}
KS = (1, 2, 3, 4)

#: the --quick profile: navigation's smoke profile, with 4 samples per test task (pass@1..4, pass^1..4).
QUICK = [*nav_exp.QUICK, "train.eval_samples=4"]

def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = experiment.common_parser("run.py --exp=navigation_ablation", __doc__, "runs/<name>-ablation-<time>")
  p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
  add_setting_options(p)
  args, unknown = experiment.split_overrides(p, argv)
  args.overrides[:0] = table3_setting(args)
  return args, unknown


def add_setting_options(p: argparse.ArgumentParser, hidden_city_share: bool = True) -> None:
  """``--corrector`` (default: the paper's) and, for Navigation, ``--hidden-city-share``: the options
  of the Table-3 setting, shared by this experiment, the Telecom ablation and the delta sweep."""
  p.add_argument("--corrector", default="paper", choices=CORRECTORS,
                 help="the Corrector of every RTI run (default: paper, App. A.1's; feedback: the tiny "
                      "config's visible-only message)")
  if hidden_city_share:
    p.add_argument("--hidden-city-share", type=float, default=None,
                   help="share of hidden-city tasks in train and test (default: the config's env.navigation.hidden_city_share)")


def table3_setting(args: argparse.Namespace) -> list[str]:
  """The overrides ``add_setting_options``' options stand for (placed before the user's own)."""
  out = [f"intervention.corrector={args.corrector}"]
  if getattr(args, "hidden_city_share", None) is not None:
    out.append(f"env.navigation.hidden_city_share={args.hidden_city_share}")
  return out


def table3_rows(results: dict[str, Any], part: str = "all") -> tuple[list[str], list[list[Any]]]:
  """Table 3 rows (percent, mean over seeds): pass@1..4 then pass^1..4 of each method on ``part``."""
  cols = ["method", *[f"pass@{k}" for k in KS], *[f"pass^{k}" for k in KS]]
  rows = []
  for method in results["methods"]:
    vals = []
    for key in [*[f"pass@{k}" for k in KS], *[f"pass^{k}" for k in KS]]:
      xs = [r[method][part][key] for r in results["runs"].values() if part in r[method] and key in r[method][part]]
      vals.append(100 * float(np.mean(xs)) if xs else float("nan"))
    rows.append([NAMES.get(method, method), *vals])
  return cols, rows


def per_seed_rows(results: dict[str, Any], key: str = "pass@1") -> tuple[list[str], list[list[Any]]]:
  """``key`` (percent) of each method per seed, then the mean and the spread (max - min) over seeds."""
  seeds = list(results["runs"])
  cols = ["method", *[f"seed {s}" for s in seeds], "mean", "max - min"]
  rows = []
  for method in results["methods"]:
    xs = [100 * float(results["runs"][s][method]["all"][key]) for s in seeds]
    rows.append([NAMES.get(method, method), *xs, float(np.mean(xs)), max(xs) - min(xs)])
  return cols, rows


#: (column, record key) of the intervention counters, summed over a training's iterations.
COUNTERS = (("groups triggered", "rti/groups_triggered"), ("steps flagged", "rti/steps_flagged"),
            ("malformed", "rti/corrector_malformed"), ("over context", "rti/corrections_over_context"),
            ("corrections", "rti/corrections_generated"),
            ("Verifier rejected", "rti/verifier_rejected"), ("PPL rejected", "rti/ppl_rejected"),
            ("applied", "rti/corrections_applied"), ("groups replaced", "rti/groups_replaced"))
CLIPS = (("clip frac intervened", "clip_frac_intervened"), ("clip frac on-policy", "clip_frac_on_policy"))


def counter_rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
  """Per trained variant, mean over seeds: the intervention counters summed over the iterations,
  the Verifier's rejections per reason, and the mean clip fractions on intervened and on-policy tokens."""
  trained = [m for m in results["methods"] if m != "base"]
  recs = {m: [r.get(f"{m}_records") or [] for r in results["runs"].values()] for m in trained}
  reasons = sorted({k for m in trained for rs in recs[m] for rec in rs for k in rec
                    if k.startswith("rti/verifier_rejected/")})
  cols = ["method", *[c for c, _ in COUNTERS], *[k.rsplit("/", 1)[1] for k in reasons], *[c for c, _ in CLIPS]]
  rows = []
  for m in trained:
    sums = [float(np.mean([sum(rec.get(key, 0) for rec in rs) for rs in recs[m]])) for _, key in COUNTERS]
    why = [float(np.mean([sum(rec.get(key, 0) for rec in rs) for rs in recs[m]])) for key in reasons]
    clips = []
    for _, key in CLIPS:
      xs = [rec[key] for rs in recs[m] for rec in rs if isinstance(rec.get(key), (int, float)) and np.isfinite(rec[key])]
      clips.append(float(np.mean(xs)) if xs else float("nan"))
    rows.append([NAMES.get(m, m), *sums, *why, *clips])
  return cols, rows


def plot_ablation(cols: Sequence[str], rows: Sequence[Sequence[Any]], out: pathlib.Path) -> str:
  """``ablation.png``: pass@k (left) and pass^k (right) against k, one line per method."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for row in rows:
    at = [row[1 + i] for i in range(len(KS))]
    hat = [row[1 + len(KS) + i] for i in range(len(KS))]
    axes[0].plot(KS, at, marker="o", label=row[0])
    axes[1].plot(KS, hat, marker="o", label=row[0])
  axes[0].set(title="pass@k (Table 3)", xlabel="k", ylabel="%", xticks=KS)
  axes[1].set(title="pass^k (Table 3)", xlabel="k", ylabel="%", xticks=KS)
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / "ablation.png", dpi=120)
  plt.close(fig)
  return "ablation.png"


def report(results: dict[str, Any], out: pathlib.Path, title: str) -> None:
  """Prints and writes an ablation's tables (Table 3's layout, the disambiguation tasks' when the
  evaluations have them, the counters), ``results.json``, ``ablation.png`` and the training plots."""
  cols, rows = table3_rows(results)
  tables = [reporting.print_table(title, cols, rows)]
  if any("disambiguation" in r[results["methods"][-1]] for r in results["runs"].values()):
    dcols, drows = table3_rows(results, "disambiguation")
    tables.append(reporting.print_table("... on the tasks that need disambiguation (%)", dcols, drows))
    results["table_disambiguation"] = {"columns": dcols, "rows": drows}
  results["table"] = {"columns": cols, "rows": rows}
  scols, srows = per_seed_rows(results)
  tables.append(reporting.print_table("pass@1 per seed (%)", scols, srows))
  results["table_per_seed"] = {"columns": scols, "rows": srows}
  ccols, crows = counter_rows(results)
  tables.append(reporting.print_table("Intervention counters per training (sum over iterations, mean over seeds) "
                                      "and mean clip fractions", ccols, crows, floatfmt="{:.3g}"))
  results["counters"] = {"columns": ccols, "rows": crows}
  experiment.write_results(results, out, tables)
  pngs = [plot_ablation(cols, rows, out), *experiment.plot(results, out)]
  print(f"run dir: {out}  (results.json, table.md, {', '.join(pngs)}, seed*/<variant>/metrics.jsonl)")
  print(f"wall time: {results['wall_s'] / 60:.1f} min")


def main(argv: Sequence[str] | None = None) -> int:
  args, unknown = parse_args(argv)
  prepared = experiment.prepare_run(args, unknown, QUICK, "-ablation")
  if prepared is None:
    return 2
  overrides, out = prepared
  variants = {v: VARIANTS[v] for v in args.variants}
  cfg = load_config(args.config, overrides)
  results = experiment.run(args.config, overrides, args.seeds, variants, out, progress=not args.no_progress,
                        reuse=args.reuse, jobs=args.jobs)
  results["corrector"], results["hidden_city_share"] = cfg.intervention.corrector, cfg.env.navigation.hidden_city_share
  report(results, out, f"Navigation ablation, held-out test split ({len(args.seeds)} seed(s), %; Table 3 layout; "
                       f"{cfg.intervention.corrector} Corrector, hidden-city share {cfg.env.navigation.hidden_city_share:g})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
