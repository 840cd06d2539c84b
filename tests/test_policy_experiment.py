"""``--exp=navigation_sft --quick``: the whole build writes a loadable checkpoint and the run files."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

from rti_jax.policy.tokenizer import CHAT_TEMPLATE

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_quick_build_writes_checkpoint_metrics_and_plot(tmp_path):
  sys.path.insert(0, "experiments")
  import navigation_sft

  out = tmp_path / "run"
  assert navigation_sft.main(["--quick", "--no-eval", "--out", str(out), "--epochs", "0.5",
                               "--name-drill-examples", "40", "--check-line", "1"]) == 0
  metrics = json.loads((out / "metrics.json").read_text())
  assert (out / "loss.png").stat().st_size > 1000
  assert metrics["sft"]["steps"] == len(metrics["sft"]["losses"]) >= 2
  assert all(np.isfinite(metrics["sft"]["losses"]))
  assert metrics["data"]["kinds"]["plain"] + metrics["data"]["kinds"]["trusting"] == 16
  assert metrics["data"]["kinds"]["name_swap"] == 50 and metrics["name_drills"]["steps"] >= 1
  assert metrics["data"]["kinds"]["swap_episode"] == 100  # --swap-episodes 2000 // 20
  assert metrics["data"]["kinds"]["swap_resolve_ctx"] == 40  # --swap-disamb 800 // 20
  assert metrics["name_drills"]["examples"] == 40
  assert metrics["data"]["kinds"]["check_drill"] == 150 and metrics["check_line"] is True  # --check-drills 3000 // 20
  assert json.loads((out / "policy" / "build.json").read_text())["check_line"] is True
  from rti_jax.envs import navigation as nav

  train = nav.load_benchmark("tiny").train
  assert metrics["holdout_tasks"] == [t.task_id for t in train[-40:]] and metrics["sft_tasks"] == 16
  policy = out / "policy"
  from transformers import AutoModelForCausalLM, AutoTokenizer

  tok = AutoTokenizer.from_pretrained(str(policy), local_files_only=True)
  assert tok.chat_template == CHAT_TEMPLATE
  hf = AutoModelForCausalLM.from_pretrained(str(policy), local_files_only=True)
  assert hf.config.model_type == "qwen3" and hf.config.vocab_size >= len(tok)


def test_init_continues_from_a_policy_dir_with_its_tokenizer_and_config(tmp_path):
  sys.path.insert(0, "experiments")
  import navigation_sft
  from safetensors.numpy import load_file

  first, second = tmp_path / "a", tmp_path / "b"
  assert navigation_sft.main(["--quick", "--no-eval", "--out", str(first), "--epochs", "0.2", "--check-line", "0",
                               "--name-drill-examples", "20"]) == 0
  assert json.loads((first / "policy" / "build.json").read_text())["check_line"] is False
  assert navigation_sft.main(["--quick", "--no-eval", "--out", str(second), "--epochs", "0.2", "--lr", "1e-3",
                               "--init", str(first / "policy"), "--check-line", "1"]) == 0
  metrics = json.loads((second / "metrics.json").read_text())
  assert metrics["init"] == str(first / "policy") and metrics["name_drills"] is None and metrics["check_line"] is True
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert (first / "policy" / name).read_text() == (second / "policy" / name).read_text(), name
  assert json.loads((first / "policy" / "config.json").read_text()) == json.loads((second / "policy" / "config.json").read_text())
  a, b = load_file(str(first / "policy" / "model.safetensors")), load_file(str(second / "policy" / "model.safetensors"))
  assert a.keys() == b.keys() and any(not np.array_equal(a[k], b[k]) for k in a)  # it trained further
  card = (second / "policy" / "README.md").read_text()
  assert "Continued from the policy in" in card and "stage 0:" not in card
  with pytest.raises(SystemExit, match="--init"):
    navigation_sft.main(["--quick", "--no-eval", "--out", str(tmp_path / "c"), "--init", str(tmp_path / "none")])


def test_unknown_option_is_rejected():
  sys.path.insert(0, "experiments")
  import navigation_sft

  with pytest.raises(SystemExit):
    navigation_sft.main(["--no-such-option"])


def test_eval_only_needs_a_built_policy(tmp_path):
  sys.path.insert(0, "experiments")
  import navigation_sft

  with pytest.raises(SystemExit, match="metrics.json not found"):
    navigation_sft.main(["--quick", "--eval-only", "--out", str(tmp_path / "none")])


def test_holdout_keeps_the_last_train_tasks_out_of_sft():
  sys.path.insert(0, "experiments")
  import navigation_sft

  tasks = list(range(10))
  assert navigation_sft.split_train(tasks, 3) == ([0, 1, 2, 3, 4, 5, 6], [7, 8, 9])
  assert navigation_sft.split_train(tasks, 0) == (tasks, [])
  for bad in (-1, 10):
    with pytest.raises(SystemExit, match="--holdout"):
      navigation_sft.split_train(tasks, bad)


def test_chain_recipe_matches_the_shipped_builds():
  """``--chain``'s stages are the commands recorded in the shipped policies' build.json, so the
  chain rebuilds the default policy (``policies/navigation_base``, its last stage) from scratch."""
  sys.path.insert(0, "experiments")
  import navigation_sft

  stages = navigation_sft.chain_argv("/tmp/chain", ["--seed", "3"])
  assert [a[a.index("--out") + 1] for a in stages] == ["/tmp/chain/b7", "/tmp/chain/b9", "/tmp/chain/b10", "/tmp/chain/b11"]
  assert "--init" not in stages[0]
  for prev, stage in zip(stages, stages[1:]):
    assert stage[stage.index("--init") + 1] == prev[prev.index("--policy-dir") + 1]
    assert stage[stage.index("--seed") + 1] == "3"

  def options(argv):  # without the paths, which differ
    out, skip = [], False
    for a in argv:
      if skip:
        skip = False
      elif a in ("--init", "--out", "--policy-dir", "--seed"):
        skip = True
      else:
        out.append(a)
    return out

  for (name, _), stage in zip(navigation_sft.CHAIN[1:], stages[1:]):
    shipped = json.loads((ROOT / "policies" / f"navigation_tiny_{name}" / "build.json").read_text())["argv"]
    assert options(stage) == options(shipped), name
  with pytest.raises(SystemExit, match="--chain sets"):
    navigation_sft.main(["--chain", "/tmp/chain", "--init", "x"])
  with pytest.raises(SystemExit, match="needs a directory"):
    navigation_sft.main(["--quick", "--chain"])
