"""End to end: ``telecom_sft --quick`` builds a policy that ``telecom --quick`` trains with GRPO
and RTI and evaluates, writing the table, the JSON and the plots (a smoke test: the quick policy
is random-ish, so only the plumbing and the files are checked)."""

from __future__ import annotations

import json

import pytest

from experiments import telecom, telecom_sft
from rti_jax.envs.telecom.checklist_agent import ChecklistAgent
from rti_jax.envs.telecom.tasks import rl_train_split
from rti_jax.policy import telecom_sft_data as td
from rti_jax.policy.sft_data import play, split_train


@pytest.mark.slow
def test_quick_build_then_quick_grpo_vs_rti(tmp_path):
  build = tmp_path / "build"
  policy = tmp_path / "policy"
  assert telecom_sft.main(["--quick", "--out", str(build), "--policy-dir", str(policy), "eval.tasks=1"]) == 0
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "build.json"):
    assert (policy / name).exists(), name
  metrics = json.loads((build / "metrics.json").read_text())
  # one "trusting" example (the D.1 mistake) per quick SFT task whose checklist episode reaches the phone
  sft_tasks = split_train(rl_train_split(), 10)[0][:12]
  decisive = sum(td.decisive_index(play(td.make_env(seed=r), ChecklistAgent(), t)) is not None
                 for r in range(metrics["phrasings"]) for t in sft_tasks)
  assert 0 < decisive <= 12 * metrics["phrasings"]
  assert metrics["data"]["kinds"]["trusting"] == decisive and metrics["system_prompt"]["condensed_tokens"] > 0
  assert set(metrics["eval"]["sampled"]["first_device_step"]) == {"mistake", "asked", "malformed", "none"}
  # 9 of the 10 held-out tasks reach the phone (one is a suspended line whose contract ended)
  assert metrics["decision"]["tasks"] == 9 and 0.0 <= metrics["decision"]["p_right_first_token"] <= 1.0
  assert (build / "loss.png").exists()

  out = tmp_path / "run"
  rc = telecom.main(["--quick", "--policy", str(policy), "--out", str(out), "--no-progress", "--test-tasks", "1",
                     "env.max_turns=2", "rollout.max_new_tokens=16"])
  assert rc == 0
  results = json.loads((out / "results.json").read_text())
  assert results["methods"] == ["base", "grpo", "rti"]
  run = results["runs"]["0"]
  assert run["base"]["num_tasks"] == 1 and {"grpo", "rti"} <= set(run)
  assert results["per_seed"]["columns"][-1] == "RTI - GRPO"
  for name in ("table.md", "fig4_success.png", "fig5a_ppl.png", "fig5b_turns.png", "config.yaml"):
    assert (out / name).exists(), name
  rti = [json.loads(line) for line in (out / "seed0" / "rti" / "metrics.jsonl").read_text().splitlines()]
  assert rti and "rti/groups_triggered" in rti[-1]


def test_missing_policy_is_a_clear_error(tmp_path, capsys):
  assert telecom.main(["--quick", "--policy", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
  assert "not a directory" in capsys.readouterr().err
