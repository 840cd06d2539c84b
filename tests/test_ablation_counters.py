"""The ablations' counter table (experiments/navigation_ablation.counter_rows, shared by the Telecom
ablation) against sums written out by hand, and the Telecom ablation's options."""

from __future__ import annotations

import math

import pytest

from experiments import navigation_ablation as nav_ab
from experiments import telecom_ablation as tel_ab


def _rec(triggered, rejected, leak, clip_i, clip_o):
  return {"rti/groups_triggered": triggered, "rti/steps_flagged": 3 * triggered, "rti/corrector_malformed": 1,
          "rti/corrections_over_context": triggered % 2, "rti/corrections_generated": 2 * triggered,
          "rti/verifier_rejected": rejected, "rti/verifier_rejected/leaked_value": leak, "rti/ppl_rejected": 1,
          "rti/corrections_applied": triggered - rejected, "rti/groups_replaced": 1,
          "clip_frac_intervened": clip_i, "clip_frac_on_policy": clip_o}


def test_counters_sum_over_iterations_and_average_over_seeds():
  results = {"methods": ["base", "grpo", "rti"], "runs": {
      0: {"base": {}, "grpo_records": [{"clip_frac_on_policy": 0.1, "clip_frac_intervened": float("nan")}],
          "rti_records": [_rec(3, 1, 1, 0.2, 0.0), _rec(5, 2, 0, 0.4, 0.1)]},
      1: {"base": {}, "grpo_records": [{"clip_frac_on_policy": 0.3, "clip_frac_intervened": float("nan")}],
          "rti_records": [_rec(1, 0, 0, 0.0, 0.2)]},
  }}
  cols, rows = nav_ab.counter_rows(results)
  assert cols == ["method", "groups triggered", "steps flagged", "malformed", "over context", "corrections",
                  "Verifier rejected", "PPL rejected", "applied",
                  "groups replaced", "leaked_value", "clip frac intervened", "clip frac on-policy"]
  grpo, rti = rows
  # seed 0: 3 + 5 = 8 triggered; seed 1: 1 -> mean 4.5; rejections 3 and 0 -> 1.5; leaks 1 and 0 -> 0.5
  # flagged 9 + 15 and 3 -> 13.5; malformed 2 and 1 -> 1.5; over context 1 + 1 and 1 -> 1.5
  assert rti[:11] == ["RTI", 4.5, 13.5, 1.5, 1.5, 9.0, 1.5, 1.5, 3.0, 1.5, 0.5]
  assert rti[11] == pytest.approx((0.2 + 0.4 + 0.0) / 3) and rti[12] == pytest.approx((0.0 + 0.1 + 0.2) / 3)
  assert grpo[1:11] == [0.0] * 10 and math.isnan(grpo[11]) and grpo[12] == pytest.approx(0.2)


def test_per_seed_table_lists_each_seeds_pass_at_1_with_mean_and_spread():
  results = {"methods": ["base", "rti"], "runs": {
      0: {"base": {"all": {"pass@1": 0.5}}, "rti": {"all": {"pass@1": 0.75}}},
      2: {"base": {"all": {"pass@1": 0.25}}, "rti": {"all": {"pass@1": 0.8}}},
  }}
  cols, rows = nav_ab.per_seed_rows(results)
  assert cols == ["method", "seed 0", "seed 2", "mean", "max - min"]
  assert rows[0] == ["Base policy", 50.0, 25.0, 37.5, 25.0]
  assert rows[1][0] == "RTI" and rows[1][1:] == pytest.approx([75.0, 80.0, 77.5, 5.0])


def test_telecom_ablation_defaults_to_the_telecom_config_and_takes_the_navigation_variants(tmp_path):
  args, unknown = tel_ab.parse_args(["--corrector", "paper", "--test-tasks", "5", "train.iterations=2"])
  assert args.config == "telecom" and args.test_tasks == 5 and not unknown
  assert args.overrides == ["intervention.corrector=paper", "train.iterations=2"]
  assert args.variants == list(nav_ab.VARIANTS)
  assert tel_ab.main(["--config", "navigation", "--out", str(tmp_path / "x")]) == 2  # not a Telecom config
