"""Tabular model of the whole RTI method: ``python experiments/tabular.py --out runs/tabular``.

Trains, from the same tabular base policy, seeds and budget (``rti_jax.theory.tabular``):
GRPO; RTI with a non-leaking oracle Corrector; RTI with a leaking Corrector and its Table-3
ablations (w/o Post-Check, w/o PPL Gating, w/o Reweight); and the Section 5.4 sweep
delta in {0, 3, 5, 20, inf}. Prints a Table-3-style table (Pass@1..4, Pass^1..4, x100) and
the delta sweep, checks the orderings the paper reports, and writes ``results.json`` and
``tabular_ablation.png``, ``tabular_delta_sweep.png`` (Fig. 3 style), ``tabular_dynamics.png``
(Fig. 4/5a style: group success before/after intervention, accepted-intervention PPL).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import sys
import time
from typing import Any, Mapping

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from rti_jax import reporting  # noqa: E402
from rti_jax.theory import tabular as TB  # noqa: E402


@dataclasses.dataclass(frozen=True)
class TabularConfig:
  """world, train: see ``rti_jax.theory.tabular``; deltas: the gate sweep; last: iterations averaged."""

  world: TB.TabularWorld = TB.TabularWorld()
  train: TB.TrainConfig = TB.TrainConfig()
  deltas: tuple[float, ...] = (0.0, 3.0, 5.0, 20.0, math.inf)
  last: int = 10


def orderings(s: Mapping[str, Mapping[str, float]], delta_names: Mapping[float, str]) -> dict[str, bool]:
  """The qualitative claims, on the final seed-mean Pass@1 of each variant (``s[name]['pass@1']``)."""
  p = {name: v["pass@1"] for name, v in s.items()}
  d = {delta: p[name] for delta, name in delta_names.items()}
  out = {
      "RTI (oracle) > GRPO": p["RTI (oracle, no leaks)"] > p["GRPO"],
      "RTI > GRPO": p["RTI"] > p["GRPO"],
      "RTI w/o Post-Check < RTI": p["RTI w/o Post-Check"] < p["RTI"],
      "RTI w/o PPL Gating < RTI": p["RTI w/o PPL Gating"] < p["RTI"],
      "RTI w/o Reweight < RTI": p["RTI w/o Reweight"] < p["RTI"],
  }
  if {0.0, 3.0, 5.0, 20.0, math.inf} <= set(d):
    out.update({
        "delta 0 < 3 < 5": d[0.0] < d[3.0] < d[5.0],
        "delta 20 < 5 and inf < 5": d[20.0] < d[5.0] and d[math.inf] < d[5.0],
    })
  return out


def run(config: TabularConfig, out_dir: str | pathlib.Path) -> dict[str, Any]:
  """Trains every variant, prints the tables, writes JSON and PNGs to ``out_dir``; returns the results."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  start = time.time()
  ablation = TB.ablation_variants()
  sweep = TB.delta_variants(config.deltas)
  hist = TB.train_variants(ablation + sweep, config.world, config.train)
  wall = time.time() - start
  summaries = {name: TB.summarize(h, config.last) for name, h in hist.items()}
  delta_names = {v.delta: v.name for v in sweep}

  ks = TB.PAPER_KS
  rows = [[v.name] + [100 * summaries[v.name][f"pass@{k}"] for k in ks] + [100 * summaries[v.name][f"pass^{k}"] for k in ks]
          + [summaries[v.name]["total_accepted"], summaries[v.name]["total_leaks_accepted"]] for v in ablation]
  print(f"Tabular RTI: {config.world.num_tasks} tasks, horizon {config.world.horizon}, G={config.train.group_size}, "
        f"{config.train.iterations} iterations, {config.train.n_seeds} seeds (mean of the last {config.last} iterations)")
  reporting.print_table("Table 3 layout (exact Pass@k / Pass^k x100; accepted / leaked interventions per run)",
                        ["Method"] + [f"pass@{k}" for k in ks] + [f"pass^{k}" for k in ks] + ["accepted", "leaks"], rows)
  srows = [[f"{v.delta:g}", 100 * summaries[v.name]["pass@1"], 100 * summaries[v.name]["pass@4"],
            100 * summaries[v.name]["avg p@k"], 100 * summaries[v.name]["avg pk"], summaries[v.name]["total_accepted"],
            summaries[v.name]["total_gate_rejected"], summaries[v.name]["total_leaks_accepted"]] for v in sweep]
  reporting.print_table("PPL-gate sweep (Section 5.4)",
                        ["delta", "pass@1", "pass@4", "avg p@k", "avg pk", "accepted", "gate-rejected", "leaks"], srows)
  identical = None
  if 0.0 in delta_names:
    identical = all(np.array_equal(hist["GRPO"][k], hist[delta_names[0.0]][k]) for k in TB.POLICY_METRICS)
    print(f"delta = 0 reproduces GRPO exactly ({', '.join(TB.POLICY_METRICS)}; every seed and iteration): {identical}")
  checks = orderings(summaries, delta_names)
  reporting.print_table("Orderings", ["claim", "holds"], [[k, "yes" if v else "NO"] for k, v in checks.items()])

  curves = {name: {k: h[k].mean(axis=0) for k in ("pass@1", "pass@4", "pass^4", "group_success_pre",
                                                   "group_success_post", "accepted_ppl", "accepted", "leak_mass")}
            for name, h in hist.items()}
  _plots(out, curves, [v.name for v in ablation], sweep)
  results = dict(config=dataclasses.asdict(config), summaries=summaries, orderings=checks, delta0_equals_grpo=identical,
                 curves=curves, train_wall_s=wall, wall_s=time.time() - start)
  reporting.write_json(out / "results.json", results)
  results["history"] = hist  # per-seed arrays, returned to callers but not written to JSON
  print(f"wrote {out / 'results.json'} (training {wall:.1f} s incl. compilation, total {results['wall_s']:.1f} s)")
  return results


def _plots(out: pathlib.Path, curves: Mapping[str, Mapping[str, np.ndarray]], ablation: list[str],
           sweep: list[TB.Variant]) -> None:
  it = lambda name: np.arange(1, len(curves[name]["pass@1"]) + 1)
  reporting.plot_curves(out / "tabular_ablation.png", {n: (it(n), curves[n]["pass@1"]) for n in ablation},
                        title="Tabular RTI: ablations (exact Pass@1)", xlabel="iteration", ylabel="Pass@1")
  reporting.plot_curves(out / "tabular_delta_sweep.png",
                        {f"delta={v.delta:g}": (it(v.name), curves[v.name]["pass@4"]) for v in sweep},
                        title="Tabular RTI: PPL-gate threshold (Fig. 3 style)", xlabel="iteration", ylabel="Pass@4")
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for i, name in enumerate(("GRPO", "RTI")):
    axes[0].plot(it(name), curves[name]["group_success_pre"], color=f"C{i}", label=f"{name}: before intervention")
    if name != "GRPO":
      axes[0].plot(it(name), curves[name]["group_success_post"], "--", color=f"C{i}", label=f"{name}: after intervention")
    axes[0].plot(it(name), curves[name]["pass@4"], ":", color=f"C{i}", label=f"{name}: eval Pass@4")
  axes[0].set_title("Training groups with a success (Fig. 4 style)")
  axes[0].set_xlabel("iteration")
  axes[0].legend(fontsize=7)
  ppl = np.where(curves["RTI"]["accepted"] > 0, curves["RTI"]["accepted_ppl"], np.nan)
  axes[1].plot(it("RTI"), ppl)
  axes[1].set_title("RTI: mean PPL of accepted interventions (Fig. 5a style)")
  axes[1].set_xlabel("iteration")
  for ax in axes:
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(out / "tabular_dynamics.png", dpi=120)
  plt.close(fig)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=None, help="run directory (default runs/tabular-<timestamp>)")
  parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 16)")
  parser.add_argument("--seed", type=int, default=0, help="base PRNG seed of training")
  parser.add_argument("--iterations", type=int, default=None, help="training iterations (default 150)")
  args = parser.parse_args(argv)
  overrides: dict[str, Any] = {"seed": args.seed}
  for flag, field in (("seeds", "n_seeds"), ("iterations", "iterations")):
    value = getattr(args, flag)
    if value is not None:
      if value < 1:
        parser.error(f"--{flag}: expected a positive int, got {value}")
      overrides[field] = value
  config = TabularConfig(train=dataclasses.replace(TB.TrainConfig(), **overrides))
  out = pathlib.Path(args.out) if args.out else reporting.make_run_dir(ROOT / "runs", "tabular")
  run(config, out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
