"""The PPL-gate threshold sweep on Navigation (paper Sec. 5.4, Figure 3).

    python experiments/run.py --exp=delta_sweep                     # delta in {0, 3, 5, 20, inf}, one seed
    python experiments/run.py --exp=delta_sweep --deltas 0 5 inf --seeds 0 1
    python experiments/run.py --exp=delta_sweep --quick             # a smoke run on this CPU

RTI is trained once per threshold delta of Eq. 4 (``intervention.delta``) from the same base
policy, budget and seed, plus a GRPO reference run (``--no-grpo`` skips it). Figure 3 plots
Pass@4 during training for each delta: ``fig3_delta_pass4.png`` does that from the periodic
evaluations (``train.eval_every``, on the validation split of ``train.val_tasks`` train tasks,
or the first ``train.eval_tasks`` test tasks when there is none; the largest
k <= ``train.eval_samples`` when that is below 4), and its right panel shows how
many corrections the gate admitted per iteration. The table gives each delta's final
held-out pass@k / pass^k and its intervention counters.

delta = 0 rejects every correction; since only a rollout with an applied correction may
replace a group member, that run trains exactly like GRPO. The run checks this: with the GRPO
reference present, ``delta0_equals_grpo`` in ``results.json`` is True iff every per-iteration
training metric (wall-time keys and the ``rti/*`` intervention counters excluded) is equal.

The sweep runs in the Table-3 experiment's setting (``--corrector``, default the paper's, and
``--hidden-city-share``, as in ``--exp=navigation_ablation``), so that its GRPO and delta = inf
runs are that experiment's GRPO and w/o PPL Gating and ``--reuse`` can take them from there.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from typing import Any, Sequence

import numpy as np

from experiments import navigation as nav_exp
from experiments import navigation_ablation
from rti_jax import experiment, reporting
from rti_jax.config import load_config

DELTAS = (0.0, 3.0, 5.0, 20.0, math.inf)
#: per-iteration loss metrics left out of the comparison: the calibration weight (reported only with
#: intervened tokens), and the per-kind token counts and clip fractions, which GRPO runs made by
#: earlier versions (reusable through ``--reuse``) do not report.
RTI_ONLY_METRICS = ("cal_weight_mean", "intervened_tokens", "on_policy_tokens", "clip_frac_intervened",
                    "clip_frac_on_policy")


def delta_label(delta: float) -> str:
  """``delta_0``, ``delta_5``, ``delta_2.5``, ``delta_inf`` (run-dir names)."""
  if math.isinf(delta):
    return "delta_inf"
  return f"delta_{int(delta)}" if float(delta).is_integer() else f"delta_{delta:g}"


def parse_delta(text: str) -> float:
  """A threshold from the command line: a number >= 0 or ``inf``."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"--deltas: expected numbers >= 0 or 'inf', got {text!r}") from None
  if not value >= 0:
    raise argparse.ArgumentTypeError(f"--deltas: expected numbers >= 0 or 'inf', got {text!r}")
  return value

#: the --quick profile: navigation's smoke profile, with 4 samples per test task (pass@1..4, pass^1..4).
QUICK = [*nav_exp.QUICK, "train.eval_samples=4", "train.eval_every=1"]  # a Fig. 3 point per iteration

def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = experiment.common_parser("run.py --exp=delta_sweep", __doc__, "runs/<name>-delta-<time>")
  p.add_argument("--deltas", nargs="+", default=[str(d) for d in DELTAS],
                 help="PPL-gate thresholds (numbers >= 0 or inf)")
  p.add_argument("--no-grpo", action="store_true", help="skip the GRPO reference run")
  navigation_ablation.add_setting_options(p)
  args, unknown = experiment.split_overrides(p, argv)
  args.overrides[:0] = navigation_ablation.table3_setting(args)
  return args, unknown


def sweep_variants(deltas: Sequence[float], with_grpo: bool = True) -> dict[str, list[str]]:
  """label -> overrides: one RTI run per delta (and GRPO first when ``with_grpo``)."""
  variants: dict[str, list[str]] = {"grpo": ["loss.method=grpo"]} if with_grpo else {}
  for d in deltas:
    variants[delta_label(d)] = ["loss.method=rti", f"intervention.delta={'inf' if math.isinf(d) else d}"]
  return variants


def comparable(record: dict[str, Any]) -> dict[str, Any]:
  """A training record without wall-time keys, ``rti/*`` counters and RTI-only loss metrics."""
  from rti_jax.trainer import TIMING_KEYS

  out = {}
  for k, v in record.items():
    if k in TIMING_KEYS or k.startswith("rti/") or k in RTI_ONLY_METRICS:
      continue
    out[k] = {kk: vv for kk, vv in v.items() if kk not in TIMING_KEYS} if isinstance(v, dict) else v
  return out


def record_differences(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> list[str]:
  """``"iteration i: key"`` for every comparable metric that differs between runs a and b
  (a length mismatch is reported too); empty when the runs trained identically."""
  diffs = [] if len(a) == len(b) else [f"length: {len(a)} vs {len(b)} records"]
  for ra, rb in zip(a, b):
    ca, cb = comparable(ra), comparable(rb)
    for k in sorted(set(ca) | set(cb)):
      if ca.get(k) != cb.get(k):
        diffs.append(f"iteration {ra.get('iteration')}: {k}")
  return diffs


def pass_key(samples: int) -> str:
  """Figure 3's metric: pass@4, or pass@samples when fewer than 4 samples are drawn."""
  return f"pass@{min(4, samples)}"


def sweep_rows(results: dict[str, Any], key: str) -> tuple[list[str], list[list[Any]]]:
  """Per method (mean over seeds): final held-out p@1, ``key``, pass^k and the intervention counters."""
  cols = ["method", "p@1", key, key.replace("@", "^"), "avg p@k", "avg pk", "groups triggered", "corr. applied",
          "PPL-rejected", "groups replaced"]
  rows = []
  for method in results["methods"]:
    vals = []
    for k in ("p@1", key, key.replace("@", "^"), "avg p@k", "avg pk"):
      xs = [r[method]["all"][k] for r in results["runs"].values() if k in r[method]["all"]]
      vals.append(100 * float(np.mean(xs)) if xs else float("nan"))
    for c in ("rti/groups_triggered", "rti/corrections_applied", "rti/ppl_rejected", "rti/groups_replaced"):
      tot = [sum(x.get(c, 0) for x in r.get(f"{method}_records", [])) for r in results["runs"].values()]
      vals.append(float(np.mean(tot)) if method != "base" else float("nan"))
    rows.append([method, *vals])
  return cols, rows


def plot_fig3(results: dict[str, Any], key: str, out: pathlib.Path) -> str:
  """``fig3_delta_pass4.png``: held-out ``key`` per iteration per delta (left; mean over seeds) and
  corrections admitted by the gate per iteration (right)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for method in results["methods"][1:]:
    curves: dict[int, list[float]] = {}
    applied: dict[int, list[float]] = {}
    for r in results["runs"].values():
      for x in r.get(f"{method}_records", []):
        applied.setdefault(x["iteration"], []).append(x.get("rti/corrections_applied", 0))
        if "eval" in x and key in x["eval"]["all"]:
          curves.setdefault(x["iteration"], []).append(x["eval"]["all"][key])
    style = "--" if method == "grpo" else "-"
    if curves:
      its = sorted(curves)
      axes[0].plot(its, [100 * np.mean(curves[i]) for i in its], style, marker="o", label=method)
    its = sorted(applied)
    axes[1].plot(its, [np.mean(applied[i]) for i in its], style, marker=".", label=method)
  axes[0].set(title=f"Effect of delta on held-out {key} (Fig. 3)", xlabel="iteration", ylabel=f"{key} (%)")
  axes[1].set(title="Corrections admitted by the PPL gate", xlabel="iteration", ylabel="per iteration")
  for ax in axes:
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / "fig3_delta_pass4.png", dpi=120)
  plt.close(fig)
  return "fig3_delta_pass4.png"


def main(argv: Sequence[str] | None = None) -> int:
  args, unknown = parse_args(argv)
  try:
    args.deltas = [parse_delta(d) for d in args.deltas]
  except argparse.ArgumentTypeError as e:
    print(e, file=sys.stderr)
    return 2
  prepared = experiment.prepare_run(args, unknown, QUICK, "-delta")
  if prepared is None:
    return 2
  overrides, out = prepared
  base = load_config(args.config, overrides)
  variants = sweep_variants(args.deltas, with_grpo=not args.no_grpo)
  results = experiment.run(args.config, overrides, args.seeds, variants, out, progress=not args.no_progress,
                        reuse=args.reuse, jobs=args.jobs)
  key = pass_key(base.train.eval_samples)
  cols, rows = sweep_rows(results, key)
  tables = [reporting.print_table(f"Delta sweep, held-out test split ({len(args.seeds)} seed(s); % and counts "
                                  f"summed over training; {base.intervention.corrector} Corrector, hidden-city share "
                                  f"{base.env.navigation.hidden_city_share:g})", cols, rows)]
  results["table"] = {"columns": cols, "rows": rows}
  results["corrector"], results["hidden_city_share"] = base.intervention.corrector, base.env.navigation.hidden_city_share
  zero = delta_label(0.0)
  if "grpo" in variants and zero in variants:
    diffs = {s: record_differences(r[f"{zero}_records"], r["grpo_records"]) for s, r in results["runs"].items()}
    results["delta0_equals_grpo"] = not any(diffs.values())
    results["delta0_differences"] = diffs
    line = f"delta = 0 trains exactly like GRPO: {results['delta0_equals_grpo']}"
    if not results["delta0_equals_grpo"]:
      line += f" (differences: {diffs})"
    print(line)
    tables.append(line)
  experiment.write_results(results, out, tables)
  pngs = [plot_fig3(results, key, out), *experiment.plot(results, out)]
  print(f"run dir: {out}  (results.json, table.md, {', '.join(pngs)}, seed*/<variant>/metrics.jsonl)")
  print(f"wall time: {results['wall_s'] / 60:.1f} min")
  return 0


if __name__ == "__main__":
  sys.exit(main())
