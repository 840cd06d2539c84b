"""The Navigation ablation, delta-sweep and baseline experiments.

* delta = 0 trains exactly like GRPO (same seed -> identical per-iteration metrics) on a toy
  environment with non-zero rewards and all-fail groups, where interventions really run and are
  all rejected by the gate; delta = inf on the same seed admits them and trains differently.
* Each experiment's quick path runs once through its ``main`` with a tiny random policy and
  writes its table, JSON and PNG.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from experiments import delta_sweep, navigation_ablation, navigation_baselines
from experiments.diagnostics import decision_probe
from rti_jax import experiment, reporting
from rti_jax.config import load_config, to_yaml
from rti_jax.envs.source import TaskSource
from rti_jax.intervention.judges import Correction, ValidatorJudgement, VerifierJudgement
from rti_jax.intervention.pipeline import InterventionRoles
from rti_jax.trainer import TIMING_KEYS, Trainer
from trainer_fixtures import LengthRewardEnv


# --- delta = 0 equals GRPO -------------------------------------------------------------------


class Mod4Env(LengthRewardEnv):
  """One turn; reward 1 iff the reply's length is a multiple of 4 (so about a third of G=4 groups all fail)."""

  modulus = 4


class FlagEverything:
  def validate(self, ctxs):
    return [ValidatorJudgement(is_valid=False, error_types=("toy",), diagnosis="try again") for _ in ctxs]


class WriteLeft:
  """A toy Corrector whose correction always solves the task ("left": 4 characters)."""

  def correct(self, ctxs, judgements, cal_prompts, seed):
    return [Correction(text="left") for _ in cal_prompts]


class AcceptEverything:
  def verify(self, ctxs, texts):
    return [VerifierJudgement(ok=True) for _ in texts]


def _toy_run(policy: str, run_dir, *extra: str) -> list[dict]:
  cfg = load_config("navigation", [
      f"policy.path={policy}", "rollout.tasks_per_iter=4", "rollout.group_size=4", "rollout.max_new_tokens=6",
      "rollout.max_context=512", "train.iterations=3", "train.checkpoint_every=3", "train.eval_every=100",
      "optim.lr=0.01", "train.val_tasks=0", *extra])
  source = TaskSource(train=list(range(12)), test=list(range(100, 102)), env_factory=Mod4Env, task_id=str,
                      subsets={}, domain="navigation")
  trainer = Trainer(cfg, run_dir, source=source, progress=False)
  # Every draft is flagged, corrected to a solution and passed by the Verifier: only the PPL gate decides.
  trainer.roles = InterventionRoles(FlagEverything(), WriteLeft(), AcceptEverything())
  return trainer.train()


@pytest.mark.slow
def test_delta_zero_trains_exactly_like_grpo(toy_policy, tmp_path):
  grpo = _toy_run(toy_policy, tmp_path / "grpo", "loss.method=grpo")
  zero = _toy_run(toy_policy, tmp_path / "zero", "loss.method=rti", "intervention.delta=0")
  # The comparison is not vacuous: rewards vary, groups failed, corrections were written and gated.
  assert 0 < np.mean([r["reward_mean"] for r in grpo]) < 1 and all(r["grad_norm"] > 0 for r in grpo)
  assert sum(r["rti/groups_triggered"] for r in zero) > 0
  assert sum(r["rti/ppl_rejected"] for r in zero) > 0
  assert sum(r["rti/corrections_applied"] for r in zero) == 0 and sum(r["rti/groups_replaced"] for r in zero) == 0
  assert delta_sweep.record_differences(zero, grpo) == []
  assert [r["loss"] for r in zero] == [r["loss"] for r in grpo]
  # With the gate open the same seed admits corrections, replaces members and trains differently.
  inf = _toy_run(toy_policy, tmp_path / "inf", "loss.method=rti", "intervention.delta=inf")
  assert sum(r["rti/corrections_applied"] for r in inf) > 0 and sum(r["rti/groups_replaced"] for r in inf) > 0
  diffs = delta_sweep.record_differences(inf, grpo)
  assert any("grad_norm" in d for d in diffs) and any("reward_mean_after_intervention" in d for d in diffs)


def test_record_differences_ignores_only_timing_and_intervention_counters():
  a = [{"iteration": 1, "loss": 0.5, "time/update_s": 1.0, "rti/groups_triggered": 2, "cal_weight_mean": 1.0,
        "eval": {"all": {"p@1": 0.5}, "num_tasks": 2}}]
  b = [{"iteration": 1, "loss": 0.5, "time/update_s": 9.0, "rti/groups_triggered": 0,
        "eval": {"all": {"p@1": 0.5}, "num_tasks": 2}}]
  assert delta_sweep.record_differences(a, b) == []
  assert delta_sweep.record_differences(a, [{**b[0], "loss": 0.6}]) == ["iteration 1: loss"]
  assert delta_sweep.record_differences(a, [{**b[0], "eval": {"all": {"p@1": 0.0}}}]) == ["iteration 1: eval"]
  assert delta_sweep.record_differences(a, b + b)[0].startswith("length")


def test_sweep_variants_and_labels():
  v = delta_sweep.sweep_variants([0.0, 3.0, 2.5, math.inf])
  assert list(v) == ["grpo", "delta_0", "delta_3", "delta_2.5", "delta_inf"]
  assert v["delta_inf"] == ["loss.method=rti", "intervention.delta=inf"]
  for overrides in v.values():  # every variant is a valid config
    cfg = load_config("navigation", ["policy.path=x", *overrides])
    assert cfg.loss.method in ("grpo", "rti")
  assert math.isinf(load_config("navigation", ["policy.path=x", *v["delta_inf"]]).intervention.delta)
  assert delta_sweep.pass_key(2) == "pass@2" and delta_sweep.pass_key(8) == "pass@4"
  assert delta_sweep.main(["--deltas", "0", "-1"]) == 2  # a bad threshold is a clear error, not a crash


def test_ablation_variants_switch_exactly_one_component_each():
  base = load_config("navigation", ["policy.path=x"])
  cfgs = {k: load_config("navigation", ["policy.path=x", *v]) for k, v in navigation_ablation.VARIANTS.items()}
  assert cfgs["grpo"].loss.method == "grpo"
  assert cfgs["rti"].intervention == base.intervention and cfgs["rti"].loss.method == "rti"
  assert cfgs["rti_no_postcheck"].intervention.verifier == "off"
  assert math.isinf(cfgs["rti_no_ppl_gate"].intervention.delta)
  assert cfgs["rti_no_reweight"].intervention.reweight is False
  for k in ("rti_no_postcheck", "rti_no_ppl_gate", "rti_no_reweight"):
    changed = [f for f in ("verifier", "delta", "reweight")
               if getattr(cfgs[k].intervention, f) != getattr(base.intervention, f)]
    assert len(changed) == 1, (k, changed)


# --- quick paths -----------------------------------------------------------------------------


def _tiny(policy: str) -> list[str]:
  return [f"policy.path={policy}", "env.num_train=4", "env.num_test=2", "env.max_turns=2", "rollout.tasks_per_iter=2",
          "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.max_context=1024", "train.iterations=1", "train.eval_every=1",
          "train.eval_tasks=1", "train.eval_samples=2", "train.checkpoint_every=1", "train.val_tasks=0"]


def _results(out) -> dict:
  return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def ablation_out(nav_policy, tmp_path_factory):
  """A quick ablation run's directory (shared by the Table 3 and ``--reuse`` tests)."""
  out = tmp_path_factory.mktemp("ablation")
  assert navigation_ablation.main(["--quick", "--no-progress", "--out", str(out), *_tiny(nav_policy)]) == 0
  return out


@pytest.mark.slow
def test_ablation_quick_writes_table3(ablation_out):
  out = ablation_out
  res = _results(out)
  names = [r[0] for r in res["table"]["rows"]]
  assert names == ["Base policy", "GRPO", "RTI w/o Post-Check", "RTI w/o PPL Gating", "RTI w/o Reweight", "RTI"]
  assert res["table"]["columns"][1:] == [f"pass@{k}" for k in (1, 2, 3, 4)] + [f"pass^{k}" for k in (1, 2, 3, 4)]
  for row in res["table"]["rows"]:  # 2 samples per task: pass@1,2 and pass^1,2 are measured, k = 3, 4 are not
    assert all(0 <= x <= 100 for x in row[1:3] + row[5:7]) and row[3:5] == ["nan", "nan"]  # JSON's nan
  runs = res["runs"]["0"]
  assert (out / "ablation.png").stat().st_size > 0
  assert "RTI w/o PPL Gating" in (out / "table.md").read_text()
  assert set(runs) >= {"base", "grpo", "rti", "rti_no_postcheck", "rti_no_ppl_gate", "rti_no_reweight"}
  assert "reused" not in runs


@pytest.mark.slow
def test_reuse_takes_equal_trainings_from_earlier_runs_and_checks_the_base(ablation_out, nav_policy, tmp_path):
  """The delta sweep's GRPO and delta = inf are the ablation's GRPO and w/o PPL Gating (same resolved config and
  seed): with ``--reuse`` they are taken from there; delta = 3 is trained. A reused run whose stored base
  evaluation differs from this run's is refused."""
  out = tmp_path / "delta"
  argv = ["--quick", "--no-progress", "--out", str(out), "--deltas", "3", "inf", "--reuse", str(ablation_out),
          *_tiny(nav_policy)]
  assert delta_sweep.main(argv) == 0
  res, old = _results(out), _results(ablation_out)
  runs, old_runs = res["runs"]["0"], old["runs"]["0"]
  assert runs["reused"] == {"grpo": str(ablation_out), "delta_inf": str(ablation_out)}
  assert runs["grpo"] == old_runs["grpo"] and runs["delta_inf"] == old_runs["rti_no_ppl_gate"]
  assert runs["base"] == old_runs["base"] and runs["delta_3"]["num_tasks"] == runs["base"]["num_tasks"]
  assert (out / "seed0" / "grpo" / "metrics.jsonl").read_text() == \
      (ablation_out / "seed0" / "grpo" / "metrics.jsonl").read_text()
  assert (out / "seed0" / "grpo" / "REUSED_FROM").read_text().strip() == str(ablation_out)
  assert not (out / "seed0" / "delta_3" / "REUSED_FROM").exists()
  # Other code, data or policy behind the stored runs: the base evaluations differ, so nothing is reused.
  tampered = tmp_path / "tampered"
  shutil.copytree(ablation_out, tampered)
  old_runs["base"]["successes"] = [[1 - x for x in row] for row in old_runs["base"]["successes"]]
  (tampered / "results.json").write_text(json.dumps(old))
  for t in tampered.glob("seed*/*/training.json"):
    stored = json.loads(t.read_text())
    stored["base"] = [[1 - x for x in row] for row in stored["base"]]
    t.write_text(json.dumps(stored))
  with pytest.raises(ValueError, match="base evaluation of seed 0 differs"):
    delta_sweep.main(["--quick", "--no-progress", "--out", str(tmp_path / "delta2"), "--deltas", "inf",
                      "--reuse", str(tampered), *_tiny(nav_policy)])
  # The same trainings side by side in two worker processes: the same records and evaluations.
  side = tmp_path / "side_by_side"
  assert delta_sweep.main(["--quick", "--no-progress", "--out", str(side), "--deltas", "3", "--jobs", "2",
                           *_tiny(nav_policy)]) == 0
  par = _results(side)["runs"]["0"]
  assert "reused" not in par
  for label in ("base", "grpo", "delta_3"):
    assert par[label] == runs[label], label
  strip = lambda d: [{k: v for k, v in r.items() if k not in TIMING_KEYS}  # noqa: E731
                     for r in reporting.read_jsonl(d / "metrics.jsonl")]
  assert strip(side / "seed0" / "grpo") == strip(ablation_out / "seed0" / "grpo")
  assert strip(side / "seed0" / "delta_3") == strip(out / "seed0" / "delta_3")
  assert all((side / "seed0" / label / "training.json").exists() for label in ("grpo", "delta_3"))
  with pytest.raises(ValueError, match="no finished training"):
    delta_sweep.main(["--quick", "--no-progress", "--out", str(tmp_path / "x"), "--reuse", str(tmp_path / "none"),
                      *_tiny(nav_policy)])


@pytest.mark.slow
def test_a_run_stopped_part_way_keeps_its_finished_trainings_for_reuse(ablation_out, tmp_path):
  """Each training's training.json is written when it finishes: a run killed before its results.json
  still offers those trainings to --reuse, with the evaluations its results.json would have held."""
  old = _results(ablation_out)
  stopped = tmp_path / "stopped"
  shutil.copytree(ablation_out, stopped)
  (stopped / "results.json").unlink()
  shutil.rmtree(stopped / "seed0" / "rti")  # the training it was on when it stopped
  found = experiment.reusable_runs([stopped])
  assert len(found) == len(old["variants"]) - 1
  for label, extra in old["variants"].items():
    key = to_yaml(load_config(str(ablation_out / "config.yaml"), [*extra, "train.seed=0"]))
    if label == "rti":
      assert key not in found
      continue
    hit = found[key]
    assert hit["eval"] == old["runs"]["0"][label] and hit["base"] == old["runs"]["0"]["base"]["successes"]
    assert hit["records"] == reporting.read_jsonl(ablation_out / "seed0" / label / "metrics.jsonl")
  # A training.json cut by a kill before the atomic writes existed is named, not skipped.
  (stopped / "seed0" / "grpo" / "training.json").write_text('{"config": "loss')
  with pytest.raises(ValueError, match="unreadable seed0/grpo/training.json"):
    experiment.reusable_runs([stopped])


@pytest.mark.slow
def test_delta_sweep_quick_writes_fig3_and_checks_delta0(nav_policy, tmp_path):
  out = tmp_path / "delta"
  argv = ["--quick", "--no-progress", "--out", str(out), "--deltas", "0", "inf", *_tiny(nav_policy)]
  assert delta_sweep.main(argv) == 0
  res = _results(out)
  assert [r[0] for r in res["table"]["rows"]] == ["base", "grpo", "delta_0", "delta_inf"]
  assert res["delta0_equals_grpo"] is True
  assert (out / "fig3_delta_pass4.png").stat().st_size > 0


@pytest.mark.slow
def test_baselines_quick_prints_table1_rows_for_every_method(nav_policy, nav_teacher, tmp_path, capsys):
  out = tmp_path / "baselines"
  argv = ["--quick", "--no-progress", "--out", str(out), "--teacher", nav_teacher,
          *_tiny(nav_policy)]
  assert navigation_baselines.main(argv) == 0
  res = _results(out)
  assert [r[0] for r in res["table"]["rows"]] == ["Base policy", "GRPO", "GSPO", "AEPO", "OPD", "LUFFY", "RTI"]
  assert res["table"]["columns"][:4] == ["method", "p@1", "avg p@k", "avg pk"]
  printed = capsys.readouterr().out
  assert all(name in printed for name in ("GSPO", "AEPO", "OPD", "LUFFY"))
  assert (out / "baselines.png").stat().st_size > 0 and res["skipped"] == {}
  # Without a teacher the OPD row is named as skipped, not silently dropped.
  variants, skipped = navigation_baselines.baseline_variants(["grpo", "opd"], str(tmp_path / "none"))
  assert list(variants) == ["grpo"] and "navigation_sft" in skipped["opd"]


@pytest.mark.slow
def test_decision_probe_quick_writes_its_figures(nav_policy, tmp_path, capsys):
  out = tmp_path / "probe"
  argv = ["--quick", "--no-progress", "--out", str(out), *_tiny(nav_policy), "env.num_train=12",
          "train.val_tasks=6"]
  assert decision_probe.main(argv) == 0
  rows = [json.loads(line) for line in (out / "probe.jsonl").read_text().splitlines()]
  assert [r["iteration"] for r in rows] == [0, 1]  # before training, then after each iteration
  for r in rows:
    probs = [r[k] for k in ("p_research", "p_trust", "p_plan_plain") if np.isfinite(r[k])]
    assert probs and all(0.0 <= p <= 1.0 for p in probs)
    assert r["plain_logp"] < 0
  res = _results(out)
  assert res["validation"]["num_tasks"] == 6 and len(res["probe"]) == 2
  assert (out / "probe.png").stat().st_size > 0
  assert "Decision probe" in capsys.readouterr().out
  # The probe reads validation tasks only: without a validation split it refuses to run.
  assert decision_probe.main(["--quick", "--no-progress", "--out", str(tmp_path / "none"),
                              *_tiny(nav_policy)]) == 2
  # A policy built with the check line (build.json) is probed after the line, and on the line itself.
  checked = tmp_path / "checked_policy"
  shutil.copytree(nav_policy, checked)
  (checked / "build.json").write_text('{"check_line": true}')
  out = tmp_path / "probe_checked"
  argv = ["--quick", "--no-progress", "--out", str(out), *_tiny(str(checked)), "env.num_train=12", "train.val_tasks=6"]
  assert decision_probe.main(argv) == 0
  rows = [json.loads(line) for line in (out / "probe.jsonl").read_text().splitlines()]
  assert all(0.0 <= r["p_check_odd"] <= 1.0 and 0.0 <= r["p_check_all_plain"] <= 1.0 for r in rows)
  assert "p_check_odd" in (out / "table.md").read_text()


def test_intervention_variants_resolve_like_the_runs_they_can_reuse():
  """``--exp=intervention_variants``' variants resolve to the configs of ``--exp=navigation --methods rti``
  with the same overrides, so ``--reuse`` takes those trainings over."""
  from experiments import intervention_variants as iv

  v = iv.variant_overrides(["rti", "rti_teacher", "rti_cal"], "policies/navigation_teacher")
  nav = to_yaml(load_config("navigation", ["loss.method=rti", "train.seed=1"]))
  assert to_yaml(load_config("navigation", [*v["rti"], "train.seed=1"])) == nav
  teacher = load_config("navigation", [*v["rti_teacher"], "train.seed=1"])
  assert teacher.intervention.intervener_path == "policies/navigation_teacher"
  assert load_config("navigation", v["rti_cal"]).loss.intervened_old_logp == "cal"
  both = iv.variant_overrides(["grpo", "rti_self"], "unused")
  assert to_yaml(load_config("navigation", [*both["grpo"], "train.seed=1"])) == to_yaml(
    load_config("navigation", ["loss.method=grpo", "train.seed=1"]))
  self_judged = load_config("navigation", both["rti_self"])
  assert (self_judged.intervention.validator, self_judged.intervention.verifier) == ("llm", "llm")
