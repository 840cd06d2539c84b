"""Numerical check of Theorem 1 (Appendix B): ``python experiments/theorem.py --out runs/theorem``.

On the softmax-bandit objective of ``rti_jax.theory.theorem`` (L, sigma, J* known), runs the
mixed update ``lam x intervened + (1 - lam) x on-policy`` with ``alpha = c / sqrt(K)`` (Eq. 9)
for K over three decades and several lam, and reports:

1. ``min_k E||grad J(theta_k)||^2`` against the Eq. 10 bound, with each assumption measured
   ((8) alignment, (13) cumulative intervened second moment, (14) on-policy second moment, L);
2. the log-log slope of the measured minimum and of the bound against K (Theorem 1: -1/2);
3. the Eq. 23 surcharge ``L/2 lam D_cal^2`` over lam x eps_cal, analytic and in the bound;
4. the theorem under the method's own update (``rti_jax.theory.theorem_method``): groups from the
   current policy on a hard bandit, an intervened pull in every all-fail group, ``rti_loss`` with E
   epochs and one step size alpha, with intervention on and off from the same seeds: the trigger
   rate, the realised lam, the clip fraction, ``min_k E||grad J||^2`` and the final J, the measured
   constants, Eq. 20 / Eq. 10 evaluated with them, and each assumption that does not hold.

Writes ``results.json``, ``theorem_k_sweep.png``, ``theorem_surcharge.png`` and
``theorem_method.png`` to the run directory and prints the tables. ``--quick`` runs a smaller
grid (for smoke tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from rti_jax import reporting  # noqa: E402
from rti_jax.theory import theorem as T  # noqa: E402
from rti_jax.theory import theorem_method as TM  # noqa: E402


@dataclasses.dataclass(frozen=True)
class TheoremConfig:
  """Grid of the experiment. iters: the K values; lams: mixing ratios of the K sweep;
  surcharge_lams x surcharge_eps_cals: the Eq. 23 grid (run at K = surcharge_iters);
  method_*: the method's-update check on ``theorem_method.HARD_BANDIT`` (every alpha x epochs,
  intervention on and off from the same seeds, K = method_iters, method_seeds seeds)."""

  iters: tuple[int, ...] = (100, 300, 1000, 3000, 10000, 30000, 100000)
  lams: tuple[float, ...] = (0.0, 0.1, 0.2)
  surcharge_lams: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.4)
  surcharge_eps_cals: tuple[float, ...] = (0.1, 0.2, 0.3)
  surcharge_iters: int = 3000
  n_seeds: int = 64
  seed: int = 0
  eps_clip: float = 0.2
  eps_cal: float = 0.2
  eta: float = 2.0
  group_size: int = 8
  slope_from: int = 1000
  method_iters: int = 800
  method_alphas: tuple[float, ...] = (0.1, 0.3)
  method_epochs: tuple[int, ...] = (1, 4)
  method_seeds: int = 64
  method_adv_stds: tuple[str, ...] = ("population", "none")


QUICK = TheoremConfig(iters=(100, 1000, 10000), lams=(0.0, 0.1), surcharge_lams=(0.0, 0.2),
                      surcharge_eps_cals=(0.1, 0.3), surcharge_iters=300, n_seeds=16, slope_from=100,
                      method_iters=300, method_alphas=(0.3,), method_seeds=16, method_adv_stds=("population",))


def run(config: TheoremConfig, out_dir: str | pathlib.Path) -> dict[str, Any]:
  """Runs the grid, prints the tables, writes JSON and PNGs to ``out_dir``; returns the results."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  start = time.time()
  problem = T.BanditProblem()
  j_star, theta_star = T.optimum(problem.success_prob, problem.mu)
  constants = dict(
      smooth_l=T.smoothness_constant(problem.success_prob, problem.mu),
      smooth_l_numeric=T.numeric_smoothness(problem.success_prob, problem.mu, num_samples=3000),
      sigma=T.gradient_bound(problem.mu), radius=T.invariant_radius(problem.mu), j_star=j_star,
      theta_star=theta_star.tolist(), j0=T.objective_np(problem.theta0, problem.success_prob, problem.mu),
      problem=dataclasses.asdict(problem))

  sweeps: dict[str, list[dict[str, Any]]] = {}
  rows = []
  for lam in config.lams:
    upd = T.UpdateConfig(lam=lam, eps_clip=config.eps_clip, eps_cal=config.eps_cal, eta=config.eta,
                         group_size=config.group_size)
    res = T.sweep_iterations(problem, upd, config.iters, n_seeds=config.n_seeds, seed=config.seed)
    sweeps[f"{lam:g}"] = res
    for r in res:
      rows.append([f"{lam:g}", r["num_iters"], f"{r['alpha']:.2e}", f"{r['min_grad_sq']:.3e}", f"{r['bound']:.3e}",
                   f"{r['bound'] / r['min_grad_sq']:.0f}", f"{r['align_const']:.3f}", f"{r['cal_sq_sum']:.3f}",
                   f"{r['dcal_sq']:.2f}", f"{r['grpo_second_ratio']:.3f}", f"{r['max_segment_l']:.2f}",
                   "yes" if r["under_bound"] else "NO",
                   "".join("y" if r[f] else "n" for f in ("holds_8", "holds_13", "holds_14", "within_ball"))])
  print(f"Theorem 1 on the softmax bandit: L={constants['smooth_l']:.3f} (numeric sup "
        f"{constants['smooth_l_numeric']:.3f}), sigma={constants['sigma']:.3f}, J*={j_star:.4f}, "
        f"J(theta0)={constants['j0']:.4f}, eps_clip={config.eps_clip}, eps_cal={config.eps_cal}, eta={config.eta}")
  reporting.print_table(
      "min_k E||grad J||^2 vs Eq. 10 (assumptions: (8) align >= 1-eps_clip, (13) sum||d_cal||^2 <= D^2, "
      "(14) ratio <= 1, ball)",
      ["lam", "K", "alpha", "min E|gJ|^2", "Eq.10 bound", "margin", "align(8)", "sum|dcal|^2", "D_cal^2",
       "(14) ratio", "L seen", "under", "8/13/14/ball"], rows)

  slopes = {}
  slope_rows = []
  for lam, res in sweeps.items():
    ks = [r["num_iters"] for r in res if r["num_iters"] >= config.slope_from]
    mins = [r["min_grad_sq"] for r in res if r["num_iters"] >= config.slope_from]
    bounds = [r["bound"] for r in res if r["num_iters"] >= config.slope_from]
    slopes[lam] = dict(measured=T.loglog_slope(ks, mins), bound=T.loglog_slope(ks, bounds),
                       k_min=min(ks), k_max=max(ks))
    slope_rows.append([lam, f"{min(ks)}-{max(ks)}", slopes[lam]["measured"], slopes[lam]["bound"]])
  reporting.print_table("log-log slope against K (Theorem 1: -1/2)", ["lam", "K range", "measured", "bound"],
                        slope_rows, floatfmt="{:.3f}")

  sur_rows = []
  surcharge = []
  for eps_cal in config.surcharge_eps_cals:
    for lam in config.surcharge_lams:
      upd = T.UpdateConfig(lam=lam, eps_clip=config.eps_clip, eps_cal=eps_cal, eta=config.eta,
                           group_size=config.group_size)
      r = T.simulate(problem, upd, config.surcharge_iters, n_seeds=config.n_seeds, seed=config.seed)
      realised = T.intervention_surcharge(r["smooth_l"], lam, r["cal_sq_sum"])
      surcharge.append(dict(lam=lam, eps_cal=eps_cal, surcharge=r["surcharge"], realised_surcharge=realised,
                            bound=r["bound"], min_grad_sq=r["min_grad_sq"], gap=r["j_star"] - r["j0"],
                            align_const=r["align_const"], holds_8=r["holds_8"]))
      sur_rows.append([eps_cal, lam, f"{r['surcharge']:.4f}", f"{realised:.4f}", f"{r['bound']:.4f}",
                       f"{r['min_grad_sq']:.3e}", f"{r['align_const']:.3f}"])
  reporting.print_table(f"Eq. 23 surcharge L/2 lam D_cal^2 (K={config.surcharge_iters}; realised uses the measured "
                        "sum_k ||dtheta_cal||^2)",
                        ["eps_cal", "lam", "L/2 lam D^2", "realised", "Eq.10 bound", "min E|gJ|^2", "align(8)"],
                        sur_rows)

  _plots(out, config, sweeps, surcharge)
  method = run_method(config, out)
  results = dict(config=dataclasses.asdict(config), constants=constants, sweeps=sweeps, slopes=slopes,
                 surcharge=surcharge, method=method, wall_s=time.time() - start)
  reporting.write_json(out / "results.json", results)
  print(f"wrote {out / 'results.json'} ({results['wall_s']:.1f} s)")
  return results


def _plots(out: pathlib.Path, config: TheoremConfig, sweeps: dict[str, list[dict[str, Any]]],
           surcharge: list[dict[str, Any]]) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  for i, (lam, res) in enumerate(sweeps.items()):
    ks = [r["num_iters"] for r in res]
    ax.plot(ks, [r["min_grad_sq"] for r in res], "o-", color=f"C{i}", label=f"measured, lam={lam}")
    ax.plot(ks, [r["bound"] for r in res], "--", color=f"C{i}", label=f"Eq. 10 bound, lam={lam}")
  k0 = np.array([config.iters[0], config.iters[-1]], np.float64)
  ref = sweeps[next(iter(sweeps))][-1]["min_grad_sq"] * np.sqrt(config.iters[-1] / k0)
  ax.plot(k0, ref, ":", color="gray", label="slope -1/2")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("K (iterations), alpha = c / sqrt(K)")
  ax.set_ylabel("min_k E||grad J(theta_k)||^2")
  ax.set_title("Theorem 1: stationarity vs K")
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / "theorem_k_sweep.png", dpi=120)
  plt.close(fig)

  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for eps in sorted({s["eps_cal"] for s in surcharge}):
    pts = [s for s in surcharge if s["eps_cal"] == eps]
    axes[0].plot([s["lam"] for s in pts], [s["surcharge"] for s in pts], "o-", label=f"eps_cal={eps:g}")
    axes[1].plot([s["lam"] for s in pts], [s["bound"] for s in pts], "o-", label=f"eps_cal={eps:g}")
  axes[0].set_title("Eq. 23: L/2 lam D_cal^2")
  axes[1].set_title(f"Eq. 10 bound at K={config.surcharge_iters}")
  for ax in axes:
    ax.set_xlabel("lam")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out / "theorem_surcharge.png", dpi=120)
  plt.close(fig)


def run_method(config: TheoremConfig, out: pathlib.Path) -> dict[str, Any]:
  """The check under the method's update: prints its tables and notes, writes theorem_method.png."""
  problem = TM.HARD_BANDIT
  runs = []
  grid = [(std, alpha, epochs, intervene) for std in config.method_adv_stds for alpha in config.method_alphas
          for epochs in config.method_epochs for intervene in (True, False)]
  for std, alpha, epochs, intervene in grid:
    cfg = TM.MethodConfig(alpha=alpha, epochs=epochs, group_size=config.group_size, eps_clip=config.eps_clip,
                          eps_cal=config.eps_cal, eta=config.eta, intervene=intervene, adv_std=std)
    per_iter = TM.simulate_method(problem, cfg, config.method_iters, n_seeds=config.method_seeds, seed=config.seed)
    summary = TM.summarise_method(per_iter, problem, cfg)
    summary["adv_std"] = std
    summary["curves"] = {k: per_iter[k].tolist() for k in ("triggered", "value", "grad_sq", "clip")}
    runs.append(summary)
  first = runs[0]
  z = np.exp(np.asarray(problem.theta0) - max(problem.theta0))
  fail0 = float((1.0 - (z / z.sum()) @ np.asarray(problem.success_prob)) ** config.group_size)
  print(f"\nTheorem 1 under the method's update: p={problem.success_prob}, mu={problem.mu}, "
        f"theta0={problem.theta0}, G={config.group_size}, K={config.method_iters}, seeds={config.method_seeds}, "
        f"L={first['smooth_l']:.4f}, J*={first['j_star']:.4f}, J(theta0)={first['j0']:.4f}, "
        f"(1 - pi_0 . p)^G = {fail0:.3f}")

  def tag(r: dict[str, Any]) -> list[Any]:
    return [r["adv_std"], f"{r['alpha']:g}", r["epochs"], "on" if r["intervene"] else "off"]

  reporting.print_table(
      "method's update: trigger rate (first / last 5% of iterations, whole run, exact (1-pi.p)^G), realised lam, "
      "clip fraction (ratio outside 1+-eps_clip / clip binding), min_k E||grad J||^2, final J",
      ["adv std", "alpha", "E", "RTI", "trig start", "trig end", "trig run", "exact", "lam", "clip %", "bind %",
       "min E|gJ|^2", "final E|gJ|^2", "final J"],
      [tag(r) + [f"{r['trigger_start']:.3f}", f"{r['trigger_end']:.3f}", f"{r['trigger_rate']:.3f}",
                 f"{r['exact_trigger_rate']:.3f}", f"{r['lam']:.4f}", f"{100 * r['clip_frac']:.2f}",
                 f"{100 * r['bind_frac']:.2f}", f"{r['min_grad_sq']:.2e}", f"{r['final_grad_sq']:.2e}",
                 f"{r['final_value']:.4f}"] for r in runs])
  reporting.print_table(
      "method's update: measured constants and the bound (align: sum-form / smallest block of K/10; "
      "D_cal^2 = sum_k E||dtheta_cal||^2 = sum_k E||c_k||^2 / lam^2; nominal 4 eta^2 eps_cal^2 sigma^2; "
      "sigma from (14); Eq. 20 at this alpha; Eq. 10 at alpha*)",
      ["adv std", "alpha", "E", "RTI", "align", "align blk", "sum|c|^2", "D_cal^2", "nominal", "sigma", "L/2 lam D^2",
       "Eq.20", "Eq.10", "alpha*", "min<=Eq.20", "(8)/(13)"],
      [tag(r) + [f"{r['align_sum']:.3f}", f"{r['align_window_min']:.3f}", f"{r['cal_sq_sum']:.3g}",
                 f"{r['dcal_sq']:.3g}", f"{r['dcal_sq_nominal']:.3g}", f"{r['sigma']:.3f}", f"{r['surcharge']:.3g}",
                 f"{r['bound_eq20']:.3g}", f"{r['bound_eq10']:.3g}", f"{r['alpha_star']:.3g}",
                 "yes" if r["under_eq20"] else "NO",
                 "".join("y" if r[f] else "n" for f in ("holds_8", "holds_13"))] for r in runs])
  effect = []
  for on, off in zip(runs[0::2], runs[1::2]):
    effect.append(dict(adv_std=on["adv_std"], alpha=on["alpha"], epochs=on["epochs"], lam=on["lam"],
                       final_on=on["final_value"], final_off=off["final_value"], min_on=on["min_grad_sq"],
                       min_off=off["min_grad_sq"],
                       eq20_on=on["bound_eq20"], eq20_off=off["bound_eq20"]))
  reporting.print_table(
      "effect of lam (intervention on vs off, same seeds, alpha, E)",
      ["adv std", "alpha", "E", "lam", "final J on", "final J off", "min E|gJ|^2 on", "off", "Eq.20 on", "off"],
      [[e["adv_std"], f"{e['alpha']:g}", e["epochs"], f"{e['lam']:.4f}", f"{e['final_on']:.4f}",
        f"{e['final_off']:.4f}", f"{e['min_on']:.2e}", f"{e['min_off']:.2e}", f"{e['eq20_on']:.3g}",
        f"{e['eq20_off']:.3g}"] for e in effect])
  print("Where Theorem 1's assumptions do not hold under this update:")
  for r in runs:
    print(f"  adv_std={r['adv_std']} alpha={r['alpha']:g} E={r['epochs']} RTI {'on' if r['intervene'] else 'off'}:")
    for note in r["notes"]:
      print(f"    - {note}")
  _method_plot(out, runs)
  return dict(problem=dataclasses.asdict(problem), all_fail_at_theta0=fail0, runs=runs, effect=effect)


def _method_plot(out: pathlib.Path, runs: list[dict[str, Any]]) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(15, 5.6))
  combos = sorted({(r["adv_std"], r["alpha"], r["epochs"]) for r in runs})
  for r in runs:
    color = f"C{combos.index((r['adv_std'], r['alpha'], r['epochs'])) % 10}"
    style = "-" if r["intervene"] else "--"
    label = f"{r['adv_std']} alpha={r['alpha']:g} E={r['epochs']} RTI {'on' if r['intervene'] else 'off'}"
    trig = np.asarray(r["curves"]["triggered"])
    width = max(1, trig.size // 40)
    smooth = np.convolve(trig, np.ones(width) / width, mode="valid")
    axes[0].plot(np.arange(smooth.size) + width // 2, smooth, style, color=color, label=label)
    axes[1].plot(r["curves"]["value"], style, color=color, label=label)
    axes[2].plot(r["curves"]["grad_sq"], style, color=color, label=label)
  axes[1].axhline(runs[0]["j_star"], color="gray", lw=0.8, ls=":", label="J*")
  axes[0].set_title("all-fail (trigger) rate per iteration")
  axes[1].set_title("E J(theta_k)")
  axes[2].set_title("E||grad J(theta_k)||^2")
  axes[2].set_yscale("log")
  for ax in axes:
    ax.set_xlabel("iteration k")
    ax.grid(alpha=0.3)
  handles, labels = axes[1].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7)
  fig.suptitle("Theorem 1 under the method's update (solid: intervention on, dashed: off)")
  fig.tight_layout(rect=(0.0, 0.02 + 0.028 * ((len(labels) + 3) // 4), 1.0, 1.0))
  fig.savefig(out / "theorem_method.png", dpi=120)
  plt.close(fig)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=None, help="run directory (default runs/theorem-<timestamp>)")
  parser.add_argument("--quick", action="store_true", help="small grid (seconds)")
  parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 64, quick 16)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  config = QUICK if args.quick else TheoremConfig()
  overrides: dict[str, Any] = {"seed": args.seed}
  if args.seeds is not None:
    if args.seeds < 1:
      parser.error(f"--seeds: expected a positive int, got {args.seeds}")
    overrides["n_seeds"] = args.seeds
  config = dataclasses.replace(config, **overrides)
  out = pathlib.Path(args.out) if args.out else reporting.make_run_dir(ROOT / "runs", "theorem")
  run(config, out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
