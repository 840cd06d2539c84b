"""The multi-seed experiment runner that the experiments share.

``run`` trains each variant (a label and its config overrides) from the same base policy, budget
and seed, evaluates the base policy and every variant on the held-out test split, and returns one
results dict; ``report`` writes it as tables (stdout and ``table.md``), ``results.json`` and the
per-iteration plots (paper Fig. 4, 5a, 5b) into the run directory. ``common_parser`` /
``split_overrides`` / ``prepare_run`` give every experiment the same command line (``--config``,
``--seeds``, ``--quick``, ``--out``, ``--reuse`` and ``key=value`` overrides anywhere). The test
split is only ever evaluated: it picks no checkpoint, stops nothing and tunes nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import pathlib
import pickle
import shutil
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from rti_jax import distributed, reporting
from rti_jax.config import current_yaml, load_config, to_yaml


def common_parser(prog: str, description: str | None, default_out: str, reuse: bool = True) -> argparse.ArgumentParser:
  """The options every Navigation experiment shares (each adds its own)."""
  p = argparse.ArgumentParser(prog=prog, description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="navigation", help="a config name under configs/ or a YAML path")
  p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds (table = mean over seeds)")
  p.add_argument("--quick", action="store_true", help="a small smoke profile (CI)")
  p.add_argument("--out", default=None, help=f"run directory (default: {default_out})")
  p.add_argument("--no-progress", action="store_true", help="hide progress bars")
  if reuse:  # experiments that train through ``run``
    p.add_argument("--reuse", nargs="+", default=[], metavar="DIR",
                   help="earlier run directories: a training whose resolved config (seed included) equals one "
                        "finished there is taken from there instead of run again (checked: same base evaluation)")
    p.add_argument("--jobs", type=int, default=None,
                   help="trainings run side by side, one process each (default 1, or RTI_JAX_JOBS): for hosts with "
                        "more cores than one training uses; the results do not depend on it")
  p.add_argument("overrides", nargs="*", help="config overrides key=value (anywhere on the line)")
  return p


def prepare_run(args: argparse.Namespace, unknown: Sequence[str], quick: Sequence[str], suffix: str = ""
                ) -> tuple[list[str], pathlib.Path] | None:
  """Config overrides (quick profile first) and the run directory; None (after a message) on unknown options."""
  bad = [u for u in unknown if u.startswith("--")]
  if bad:
    print(f"unknown options: {bad}; see --help", file=sys.stderr)
    return None
  overrides = (list(quick) if args.quick else []) + list(args.overrides) + list(unknown)
  cfg = load_config(args.config, overrides)
  distributed.initialize(cfg.mesh)  # multi-host: before any device is touched, and before the run dir is named
  name = cfg.name + suffix + ("-quick" if args.quick else "")
  out = pathlib.Path(args.out) if args.out else reporting.make_run_dir("runs", name)
  out.mkdir(parents=True, exist_ok=True)
  return overrides, out


def policy_dir_exists(cfg_name: str, overrides: Sequence[str], hint: str = "") -> bool:
  """Whether the config's ``policy.path`` is a directory; if not, says so on stderr (``hint``, with
  ``{path}`` filled in, follows the message)."""
  path = load_config(cfg_name, list(overrides)).policy.path
  if pathlib.Path(path).is_dir():
    return True
  print(f"policy.path: {path} is not a directory" + hint.replace("{path}", str(path)), file=sys.stderr)
  return False


def split_overrides(parser: argparse.ArgumentParser, argv: Sequence[str] | None
                    ) -> tuple[argparse.Namespace, list[str]]:
  """Parses options, taking every ``key=value`` word as a config override wherever it stands
  (so ``--seeds 0 1 train.iterations=3`` does not read the override as a seed)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  overrides = [a for a in argv if "=" in a and not a.startswith("-")]
  args, unknown = parser.parse_known_args([a for a in argv if a not in overrides])
  args.overrides = list(args.overrides) + overrides
  return args, unknown


@dataclasses.dataclass(frozen=True)
class _Training:
  """One training of ``run``: what a worker process needs to do it on its own."""

  cfg_name: str
  overrides: tuple[str, ...]
  label: str
  seed: int
  run_dir: pathlib.Path
  progress: bool
  source: Callable[[Any], Any] | None
  with_base: bool  # also evaluate the base policy of this seed (one training per seed does)
  bar_line: int | None = None


def _train(job: _Training) -> dict[str, Any]:
  """Trains one variant and evaluates it (and the base policy when ``with_base``) on the test split."""
  from rti_jax.trainer import Trainer

  cfg = load_config(job.cfg_name, list(job.overrides))
  trainer = Trainer(cfg, job.run_dir, source=None if job.source is None else job.source(cfg), progress=job.progress)
  trainer.bar_line = job.bar_line
  test = trainer.source.test
  out: dict[str, Any] = {}
  if job.with_base:  # the base policy, evaluated once per seed with the same sampler
    out["base"] = trainer.evaluate(test, cfg.train.eval_samples, seed=10_000 + job.seed, desc="eval base")
  t0 = time.perf_counter()
  out["records"] = trainer.train(eval_tasks=trainer.monitor_tasks())
  out["train_s"] = time.perf_counter() - t0
  out["eval"] = trainer.evaluate(test, cfg.train.eval_samples, seed=10_000 + job.seed, desc=f"eval {job.label}")
  trainer.export(job.run_dir / "policy")
  return out


def default_jobs() -> int:
  """Trainings run side by side by default: ``RTI_JAX_JOBS`` when set, else 1 (one training's update
  already keeps two CPU cores busy: two side by side on two cores took longer than one after the
  other, docs/benchmarks.md); always 1 under multi-host."""
  if distributed.process_count() > 1:
    return 1
  env = os.environ.get("RTI_JAX_JOBS")
  return max(1, int(env)) if env else 1


def _end_with_parent() -> None:
  """A worker process is sent SIGTERM when the run that started it dies (Linux), so no training
  goes on alone after its run was stopped."""
  try:
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not Linux: the worker ends when its task does
    pass


def _picklable(obj: Any) -> bool:
  try:
    pickle.dumps(obj)
    return True
  except Exception:  # a closure or lambda: the trainings run in this process
    return False


def run(cfg_name: str, overrides: Sequence[str], seeds: Sequence[int], variants: dict[str, Sequence[str]],
        out: pathlib.Path, progress: bool = True, source: Callable[[Any], Any] | None = None,
        reuse: Sequence[str | pathlib.Path] = (), jobs: int | None = None) -> dict[str, Any]:
  """Trains each variant from the same base policy, budget and seed; evaluates base and every variant.

  variants: label -> extra config overrides (e.g. ``{"grpo": ["loss.method=grpo"], "rti": [...]}``).
  source: cfg -> the ``TaskSource`` to train and evaluate on (None: the trainer's own, from ``env.name``).
  reuse: earlier run directories (see ``reusable_runs``): a variant whose resolved config (seed
    included) equals a training finished there is taken from there (its evaluation, per-iteration
    metrics and training time; ``metrics.jsonl`` is copied). The base policy is still evaluated here,
    and must give exactly the base evaluation stored with the reused run (else ValueError: the run
    was made by other code, data or policy).
  jobs: trainings run side by side, each in a process of its own (None: ``default_jobs()``). Every
    training is seeded on its own, so the results are those of one after the other, record for
    record; only the wall time changes. With 1 (or a multi-host run, or a
    ``source`` that cannot be sent to another process) they run here, one after the other.
  Returns the results dict: ``runs[seed][label]`` is the final held-out evaluation,
  ``runs[seed][label + "_records"]`` the per-iteration metrics, ``runs[seed]["reused"]`` label ->
  the directory a reused training came from.
  """
  results: dict[str, Any] = {"seeds": list(seeds), "methods": ["base", *variants], "variants": dict(variants),
                             "runs": {}}
  base_cfg = load_config(cfg_name, list(overrides))
  if distributed.is_writer():  # multi-host: process 0 writes every file
    (out / "config.yaml").write_text(to_yaml(base_cfg))
  done = reusable_runs(reuse)
  t_all = time.perf_counter()
  per_seed: dict[int, dict[str, Any]] = {seed: {} for seed in seeds}
  reused: dict[int, dict[str, dict[str, Any]]] = {seed: {} for seed in seeds}
  cfgs: dict[tuple[int, str], Any] = {}
  todo: list[_Training] = []
  for seed in seeds:
    for label, extra in variants.items():
      over = (*overrides, *extra, f"train.seed={seed}")
      cfg = cfgs[seed, label] = load_config(cfg_name, list(over))
      run_dir = out / f"seed{seed}" / label
      hit = done.get(to_yaml(cfg))
      if hit is not None:
        reused[seed][label] = hit
        per_seed[seed][label], per_seed[seed][f"{label}_records"] = hit["eval"], hit["records"]
        per_seed[seed][f"{label}_train_s"] = hit["train_s"]
        run_dir.mkdir(parents=True, exist_ok=True)
        if distributed.is_writer():
          shutil.copyfile(hit["metrics"], run_dir / "metrics.jsonl")
          (run_dir / "REUSED_FROM").write_text(f"{hit['dir']}\n")
          _write_training(run_dir, cfg, hit["eval"], hit["train_s"], hit["base"])
        continue
      first = not any(j.seed == seed for j in todo)
      todo.append(_Training(cfg_name, over, label, seed, run_dir, progress, source, with_base=first))
  jobs = min(default_jobs() if jobs is None else jobs, len(todo))
  parallel = jobs > 1 and distributed.process_count() == 1 and _picklable(source)
  written: set[tuple[int, str]] = set()

  def finished(job: _Training, got: dict[str, Any]) -> None:
    seed_runs = per_seed[job.seed]
    if "base" in got:
      seed_runs["base"] = got["base"]
    seed_runs[job.label], seed_runs[f"{job.label}_records"] = got["eval"], got["records"]
    seed_runs[f"{job.label}_train_s"] = got["train_s"]
    if "base" not in seed_runs or not distributed.is_writer():
      return
    for j in todo:  # training.json as soon as the training and its seed's base evaluation are known
      if j.seed == job.seed and j.label in seed_runs and (j.seed, j.label) not in written:
        written.add((j.seed, j.label))
        _write_training(j.run_dir, cfgs[j.seed, j.label], seed_runs[j.label], seed_runs[f"{j.label}_train_s"],
                        seed_runs["base"]["successes"])

  if parallel:
    todo = [dataclasses.replace(j, bar_line=i % jobs) for i, j in enumerate(todo)]
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_end_with_parent) as pool:
      futures = {pool.submit(_train, j): j for j in todo}
      for fut in concurrent.futures.as_completed(futures):
        finished(futures[fut], fut.result())
  else:
    for job in todo:
      finished(job, _train(job))
  for seed in seeds:
    if "base" not in per_seed[seed]:  # every variant was reused: evaluate the base policy for the check
      from rti_jax.trainer import Trainer

      cfg = cfgs[seed, next(iter(variants))]
      trainer = Trainer(cfg, out / f"seed{seed}" / "base", source=None if source is None else source(cfg),
                        progress=progress)
      per_seed[seed]["base"] = trainer.evaluate(trainer.source.test, cfg.train.eval_samples, seed=10_000 + seed,
                                                desc="eval base")
    for label, hit in reused[seed].items():
      if hit["base"] != per_seed[seed]["base"]["successes"]:
        raise ValueError(f"--reuse {hit['dir']}: its base evaluation of seed {seed} differs from this run's, so "
                         f"its {label!r} training was made by other code, data or policy; run without --reuse")
    if reused[seed]:
      per_seed[seed]["reused"] = {label: hit["dir"] for label, hit in reused[seed].items()}
    results["runs"][str(seed)] = _ordered(per_seed[seed], variants)
  results["wall_s"] = time.perf_counter() - t_all
  return results


def _ordered(seed_runs: dict[str, Any], variants: dict[str, Sequence[str]]) -> dict[str, Any]:
  """A seed's entries in the order one-after-the-other running gives (base first, then each variant)."""
  keys = ["base"] + [k for label in variants for k in (f"{label}_train_s", label, f"{label}_records")] + ["reused"]
  return {k: seed_runs[k] for k in keys if k in seed_runs}


#: Written beside a finished training's metrics.jsonl: its resolved config, held-out evaluation, training
#: time and the base policy's per-task successes of its seed (what ``--reuse`` needs, before the whole
#: run has finished).
TRAINING_FILE = "training.json"


def _write_training(run_dir: pathlib.Path, cfg: Any, evaluation: dict[str, Any], train_s: float | None,
                    base: Any) -> None:
  reporting.write_json(run_dir / TRAINING_FILE, {"config": to_yaml(cfg), "eval": evaluation, "train_s": train_s,
                                                 "base": base})


def reusable_runs(dirs: Sequence[str | pathlib.Path]) -> dict[str, dict[str, Any]]:
  """Finished trainings of earlier run directories, keyed by their resolved config (``to_yaml``, seed
  included): each maps to ``{"eval", "records", "train_s", "metrics", "base", "dir"}`` (``base``: the
  base policy's per-task successes of that seed). A training counts once its ``training.json`` is
  written, so a run stopped part-way keeps the trainings it finished; a directory of an older layout
  is read from its ``results.json``. A directory with neither raises ValueError; the first directory
  wins when two hold the same training."""
  found: dict[str, dict[str, Any]] = {}
  for d in map(pathlib.Path, dirs):
    path = d / "results.json"
    trainings = sorted(d.glob(f"seed*/*/{TRAINING_FILE}"))
    if not trainings and not path.exists():
      raise ValueError(f"--reuse {d}: no finished training (no results.json, no seed*/<variant>/{TRAINING_FILE})")
    for t in trainings:
      metrics = t.parent / "metrics.jsonl"
      try:
        stored = json.loads(t.read_text())
        key, hit = current_yaml(stored["config"]), {"eval": stored["eval"], "train_s": stored["train_s"],
                                                    "base": stored["base"]}
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--reuse {d}: unreadable {t.relative_to(d)} ({e})") from e
      if metrics.exists():
        found.setdefault(key, {**hit, "records": reporting.read_jsonl(metrics), "metrics": metrics, "dir": str(d)})
    if trainings or not path.exists():
      continue
    stored = json.loads(path.read_text())
    for seed, per_seed in stored.get("runs", {}).items():
      for label, extra in stored.get("variants", {}).items():
        metrics = d / f"seed{seed}" / label / "metrics.jsonl"
        if label not in per_seed or "base" not in per_seed or not metrics.exists():
          continue
        cfg = load_config(str(d / "config.yaml"), [*extra, f"train.seed={seed}"])
        found.setdefault(to_yaml(cfg), {
            "eval": per_seed[label], "records": reporting.read_jsonl(metrics),
            "train_s": per_seed.get(f"{label}_train_s"), "metrics": metrics,
            "base": per_seed["base"]["successes"], "dir": str(d)})
  return found


def write_results(results: dict[str, Any], out: pathlib.Path, tables: Sequence[str]) -> None:
  """results.json (without per-iteration records, which live in metrics.jsonl) and table.md."""
  stored = {k: v for k, v in results.items() if k != "runs"}
  stored["runs"] = {s: {k: v for k, v in r.items() if not k.endswith("_records")} for s, r in results["runs"].items()}
  reporting.write_json(out / "results.json", stored)
  if distributed.is_writer():
    (out / "table.md").write_text("\n\n".join(tables) + "\n")


def seed_rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
  cols = ["seed", *[f"{m} p@1" for m in results["methods"]], "RTI - GRPO"]
  rows = []
  for seed, r in results["runs"].items():
    p = [100 * r[m]["all"]["p@1"] for m in results["methods"]]
    gap = 100 * (r["rti"]["all"]["p@1"] - r["grpo"]["all"]["p@1"]) if "rti" in r and "grpo" in r else float("nan")
    rows.append([seed, *p, gap])
  return cols, rows


def plot(results: dict[str, Any], out: pathlib.Path) -> list[str]:
  """Fig. 4 (rollout success before/after intervention, eval Pass@4), Fig. 5a (PPL), Fig. 5b (turns)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  written = []
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for seed, r in results["runs"].items():
    for method in results["methods"][1:]:
      recs = r.get(f"{method}_records", [])
      its = [x["iteration"] for x in recs]
      axes[0].plot(its, [x["reward_mean"] for x in recs], label=f"{method} s{seed} rollout")
      if any(x.get("rti/groups_triggered", 0) for x in recs):
        axes[0].plot(its, [x["reward_mean_after_intervention"] for x in recs], "--",
                     label=f"{method} s{seed} after intervention")
      ev = [(x["iteration"], x["eval"]["all"].get("pass@4", x["eval"]["all"].get("avg p@k"))) for x in recs if "eval" in x]
      if ev:
        axes[1].plot(*zip(*ev), marker="o", label=f"{method} s{seed}")
  axes[0].set(title="Rollout success per iteration (Fig. 4)", xlabel="iteration", ylabel="mean reward")
  axes[1].set(title="Pass@4 per iteration (validation split, or test monitoring)", xlabel="iteration", ylabel="pass@4")
  for ax in axes:
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / "fig4_success.png", dpi=120)
  plt.close(fig)
  written.append("fig4_success.png")

  fig, ax = plt.subplots(figsize=(6, 4))
  for seed, r in results["runs"].items():
    for method in results["methods"][1:]:
      recs = r.get(f"{method}_records", [])
      pts = [(x["iteration"], x["rti/mean_accepted_ppl"]) for x in recs
             if isinstance(x.get("rti/mean_accepted_ppl"), (int, float)) and np.isfinite(x["rti/mean_accepted_ppl"])]
      if pts:
        ax.plot(*zip(*pts), marker="o", label=f"{method} seed {seed}")
  ax.set(title="Mean PPL of accepted interventions (Fig. 5a)", xlabel="iteration", ylabel="PPL_roll")
  ax.grid(alpha=0.3)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=7)
  else:
    ax.text(0.5, 0.5, "no accepted interventions", ha="center", va="center", transform=ax.transAxes)
  fig.tight_layout()
  fig.savefig(out / "fig5a_ppl.png", dpi=120)
  plt.close(fig)
  written.append("fig5a_ppl.png")

  methods = results["methods"][1:]
  fig, axes = plt.subplots(1, len(methods), figsize=(5.5 * len(methods), 4), squeeze=False)
  first = next(iter(results["runs"].values()))
  for ax, method in zip(axes[0], methods):
    recs = first.get(f"{method}_records", [])
    if recs:
      hist = np.asarray([x["turn_hist"] for x in recs], float)
      hist = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
      im = ax.imshow(hist.T, aspect="auto", origin="lower", cmap="viridis",
                     extent=(0.5, len(recs) + 0.5, -0.5, hist.shape[1] - 0.5))
      fig.colorbar(im, ax=ax, label="share of rollouts")
    ax.set(title=f"Turn counts per iteration, {method} (Fig. 5b)", xlabel="iteration", ylabel="turns")
  fig.tight_layout()
  fig.savefig(out / "fig5b_turns.png", dpi=120)
  plt.close(fig)
  written.append("fig5b_turns.png")
  return written


def val_rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
  """The last periodic evaluation of each trained method (the validation split when
  ``train.val_tasks`` > 0), mean over seeds: p@1, avg p@k and the task count."""
  cols = ["method", "p@1", "avg p@k", "tasks"]
  rows = []
  for method in results["methods"][1:]:
    evs = [r[f"{method}_records"][-1]["eval"] for r in results["runs"].values()
           if r.get(f"{method}_records") and "eval" in r[f"{method}_records"][-1]]
    if evs:
      rows.append([method, 100 * float(np.mean([e["all"]["p@1"] for e in evs])),
                   100 * float(np.mean([e["all"]["avg p@k"] for e in evs])), evs[0]["num_tasks"]])
  return cols, rows


def cut_test(source: Any, test_tasks: int | None) -> Any:
  """``source`` with its test split cut to the first ``test_tasks`` (None: unchanged); a count
  outside 1..len(test) is a ``SystemExit`` naming ``--test-tasks``."""
  if test_tasks is None:
    return source
  if not 1 <= test_tasks <= len(source.test):
    raise SystemExit(f"--test-tasks must be in 1..{len(source.test)}, got {test_tasks}")
  return dataclasses.replace(source, test=list(source.test)[:test_tasks])


def registry_source(cfg: Any, test_tasks: int | None = None) -> Any:
  """The registered environment's task source of ``cfg`` (``env.name``), its test split cut to its
  first ``test_tasks`` when given (a top-level function, so a worker process can be sent it)."""
  from rti_jax.envs import registry

  return cut_test(registry.task_source(cfg), test_tasks)


def summed_stats(records: Sequence[dict[str, Any]]) -> Any:
  """One ``InterventionStats``: the ``rti/*`` counters of ``records`` (metrics lines) summed."""
  from rti_jax.intervention.stats import InterventionStats

  names = [f.name for f in dataclasses.fields(InterventionStats) if f.name != "verifier_reasons"]
  total = InterventionStats()
  for r in records:
    reasons = {k.split("/", 2)[2]: int(v) for k, v in r.items() if k.startswith("rti/verifier_rejected/")}
    total = total.merge(InterventionStats(**{n: r.get(f"rti/{n}", 0) or 0 for n in names}, verifier_reasons=reasons))
  return total


def table6_rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
  """Table 6 for every variant that intervened (``rti/groups_triggered`` > 0): per statistic,
  ``count / denominator (share)`` or a mean, summed over the iterations and seeds of each."""
  import math

  methods = [m for m in results["methods"] if m != "base"]
  stats = {m: summed_stats([r for run in results["runs"].values() for r in run.get(f"{m}_records", [])])
           for m in methods}
  shown = [m for m in methods if stats[m].groups_triggered > 0]
  if not shown:
    return [], []
  rows: list[list[Any]] = []
  for i, (name, *_rest) in enumerate(stats[shown[0]].table()):
    rows.append([name] + [(lambda c, d, x: f"{int(c)} / {int(d)}" + ("" if math.isnan(x) else f" ({100 * x:.1f}%)"))(
        *stats[m].table()[i][1:]) for m in shown])
  reasons = sorted({k for m in shown for k in stats[m].verifier_reasons})
  for k in reasons:
    rows.append([f"  rejected: {k}"] + [stats[m].verifier_reasons.get(k, 0) for m in shown])
  for i, (name, *_rest) in enumerate(stats[shown[0]].averages()):
    rows.append([name] + [(lambda c, d, x: "-" if math.isnan(x) else f"{x:.1f}")(*stats[m].averages()[i][1:])
                          for m in shown])
  rows.append(["mean PPL of applied corrections"] + [
      "-" if math.isnan(stats[m].mean_accepted_ppl) else f"{stats[m].mean_accepted_ppl:.3f}" for m in shown])
  return ["statistic", *shown], rows


def print_and_report(results: dict[str, Any], out: pathlib.Path, title: str, cols: Sequence[str],
                     rows: Sequence[Any]) -> None:
  """Prints the main table, ``"<title>, test split (N tasks, S seed(s), %)"``, then ``report``s it
  with the validation table."""
  n_test = next(iter(results["runs"].values()))["base"]["num_tasks"]
  table = reporting.print_table(f"{title}, test split ({n_test} tasks, {len(results['seeds'])} seed(s), %)", cols, rows)
  report(results, out, table, cols, rows, val_rows(results), "Last periodic evaluation (validation split; %)")


def report(results: dict[str, Any], out: pathlib.Path, table: str, cols: Sequence[str], rows: Sequence[Any],
           val: tuple[list[str], list[list[Any]]], val_title: str) -> None:
  """After the main table (already printed): the per-seed and validation tables, results.json,
  table.md, the plots, and the run directory and wall time on stdout."""
  scols, srows = seed_rows(results)
  tables = [table, reporting.print_table("Per seed (p@1, %)", scols, srows)]
  vcols, vrows = val
  if vrows:
    tables.append(reporting.print_table(val_title, vcols, vrows))
    results["validation"] = {"columns": vcols, "rows": vrows}
  tcols, trows = table6_rows(results)
  if trows:
    tables.append(reporting.print_table("Intervention statistics (Table 6; summed over iterations and seeds)",
                                        tcols, trows))
    results["table6"] = {"columns": tcols, "rows": trows}
  results["table"] = {"columns": list(cols), "rows": list(rows)}
  results["per_seed"] = {"columns": scols, "rows": srows}
  write_results(results, out, tables)
  if not distributed.is_writer():  # multi-host: plots and the summary come from process 0
    return
  pngs = plot(results, out)
  print(f"run dir: {out}  (results.json, table.md, {', '.join(pngs)}, seed*/<method>/metrics.jsonl)")
  print(f"wall time: {results['wall_s'] / 60:.1f} min")
