"""``--exp=navigation_sft``: the whole build writes a loadable checkpoint, its resolved config and the
run files; the lineage of the shipped policies matches their build.json."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from experiments import navigation_sft
from rti_jax.policy import build_config, lineage
from rti_jax.policy.tokenizer import CHAT_TEMPLATE

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def quick_build(tmp_path_factory):
  """One quick build (its run directory), shared by the tests that read it or continue from it."""
  out = tmp_path_factory.mktemp("navigation_sft") / "run"
  assert navigation_sft.main(["--quick", "--no-eval", "--out", str(out), "train.epochs=0.1",
                              "name_drills.examples=40", "data.check_line=true"]) == 0
  return out


@pytest.mark.slow
def test_quick_build_writes_checkpoint_metrics_and_plot(quick_build):
  out = quick_build
  metrics = json.loads((out / "metrics.json").read_text())
  assert (out / "loss.png").stat().st_size > 1000
  assert metrics["sft"]["steps"] == len(metrics["sft"]["losses"]) >= 2
  assert all(np.isfinite(metrics["sft"]["losses"]))
  assert metrics["data"]["kinds"]["plain"] + metrics["data"]["kinds"]["trusting"] == 16
  assert metrics["data"]["kinds"]["name_swap"] == 50 and metrics["name_drills"]["steps"] >= 1
  assert metrics["data"]["kinds"]["swap_episode"] == 100  # the quick profile: a twentieth of 2000
  assert metrics["data"]["kinds"]["swap_resolve_ctx"] == 40  # of 800
  assert metrics["name_drills"]["examples"] == 40
  assert metrics["data"]["kinds"]["check_drill"] == 150 and metrics["check_line"] is True  # of 3000
  build = json.loads((out / "policy" / "build.json").read_text())
  assert build["check_line"] is True and build["quick"] is True
  assert build["overrides"] == ["train.epochs=0.1", "name_drills.examples=40", "data.check_line=true"]
  # the record is the resolved config: the same overrides give the same config again
  assert build["config"] == build_config.to_dict(build_config.load_navigation(None, build["overrides"], quick=True))
  assert build["config"]["train"]["epochs"] == 0.1 and build["config"]["model"]["hidden"] == 32
  from rti_jax.envs import navigation as nav

  train = nav.load_benchmark("tiny").train
  assert metrics["holdout_tasks"] == [t.task_id for t in train[-40:]] and metrics["sft_tasks"] == 16
  policy = out / "policy"
  from transformers import AutoModelForCausalLM, AutoTokenizer

  tok = AutoTokenizer.from_pretrained(str(policy), local_files_only=True)
  assert tok.chat_template == CHAT_TEMPLATE
  hf = AutoModelForCausalLM.from_pretrained(str(policy), local_files_only=True)
  assert hf.config.model_type == "qwen3" and hf.config.vocab_size >= len(tok)


@pytest.mark.slow
def test_init_continues_from_a_policy_dir_with_its_tokenizer_and_config(quick_build, tmp_path):
  from safetensors.numpy import load_file

  first, second = quick_build, tmp_path / "b"
  assert navigation_sft.main(["--quick", "--no-eval", "--out", str(second), "train.epochs=0.05", "train.lr=1e-3",
                              f"init={first / 'policy'}", "data.check_line=false"]) == 0
  metrics = json.loads((second / "metrics.json").read_text())
  assert metrics["init"] == str(first / "policy") and metrics["name_drills"] is None and metrics["check_line"] is False
  assert json.loads((second / "policy" / "build.json").read_text())["check_line"] is False
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert (first / "policy" / name).read_text() == (second / "policy" / name).read_text(), name
  assert json.loads((first / "policy" / "config.json").read_text()) == json.loads((second / "policy" / "config.json").read_text())
  a, b = load_file(str(first / "policy" / "model.safetensors")), load_file(str(second / "policy" / "model.safetensors"))
  assert a.keys() == b.keys() and any(not np.array_equal(a[k], b[k]) for k in a)  # it trained further
  card = (second / "policy" / "README.md").read_text()
  assert "Continued from the policy in" in card and "stage 0:" not in card
  with pytest.raises(SystemExit, match="init"):
    navigation_sft.main(["--quick", "--no-eval", "--out", str(tmp_path / "c"), f"init={tmp_path / 'none'}"])


def test_unknown_option_key_or_value_is_rejected_naming_it():
  with pytest.raises(SystemExit):
    navigation_sft.main(["--no-such-option"])
  with pytest.raises(SystemExit, match="data.no_such_key"):
    navigation_sft.main(["--quick", "--no-eval", "data.no_such_key=1"])
  with pytest.raises(SystemExit, match="train.lr"):
    navigation_sft.main(["--quick", "--no-eval", "train.lr=fast"])
  with pytest.raises(SystemExit, match="tokenizer.pattern"):
    navigation_sft.main(["--quick", "--no-eval", "tokenizer.pattern=letters"])
  with pytest.raises(SystemExit, match="train.epochs: expected a finite number"):
    navigation_sft.main(["--quick", "--no-eval", "train.epochs=inf"])
  # an override is taken literally: no OmegaConf interpolation from the environment
  assert build_config.load_navigation(overrides=["init=${oc.env:HOME}"]).init == "${oc.env:HOME}"


def test_eval_only_needs_a_built_policy(tmp_path):
  with pytest.raises(SystemExit, match="metrics.json not found"):
    navigation_sft.main(["--quick", "--eval-only", "--out", str(tmp_path / "none")])


def test_holdout_keeps_the_last_train_tasks_out_of_sft():
  tasks = list(range(10))
  assert navigation_sft.split_train(tasks, 3) == ([0, 1, 2, 3, 4, 5, 6], [7, 8, 9])
  assert navigation_sft.split_train(tasks, 0) == (tasks, [])
  for bad in (-1, 10):
    with pytest.raises(SystemExit, match="data.holdout"):
      navigation_sft.split_train(tasks, bad)


def test_every_build_config_loads_and_is_the_schema_defaults_and_quick_is_a_profile():
  """Every configs/sft_*.yaml loads with its builder's schema and writes out the dataclass defaults
  (the builds' defaults before any override); --quick only adds overrides that a later one wins over."""
  loaders = {"sft_navigation": (build_config.load_navigation, build_config.NavigationSFTConfig),
             "sft_telecom": (build_config.load_telecom, build_config.TelecomSFTConfig),
             "sft_tau2": (build_config.load_tau2, build_config.Tau2SFTConfig)}
  files = sorted(p.stem for p in (ROOT / "configs").glob("sft_*.yaml"))
  assert files == sorted(loaders)
  for name in files:
    load, schema = loaders[name]
    assert load(name) == load(str(ROOT / "configs" / f"{name}.yaml")) == schema(), name
  quick = build_config.load_navigation(quick=True, overrides=["model.hidden=48"])
  assert quick.model.hidden == 48 and quick.model.layers == 2 and quick.data.max_tasks == 16
  assert build_config.load_telecom(quick=True).data.phrasings == 1


def test_chain_recipe_matches_the_shipped_builds():
  """Each stage of policies/LINEAGE.yaml continues the previous stage's output, and each shipped
  policy's build.json holds exactly its stage's resolved config: ``--chain`` rebuilds the shipped
  Navigation policies from scratch with their recipes."""
  stages = lineage.load_lineage()
  shipped = {s.path for s in stages.values() if s.shipped}
  assert shipped == {"policies/navigation_base", "policies/navigation_teacher", "policies/navigation_hidden",
                     "policies/telecom_base", "policies/navigation_judge", "policies/telecom_judge",
                     "policies/retail_base", "policies/airline_base"}
  for stage in stages.values():
    # shipped: in the repository; not shipped: no longer under policies/ (a local runs/ copy may remain)
    assert (ROOT / stage.path).is_dir() if stage.shipped else not (
      stage.path.startswith("policies/") and (ROOT / stage.path).is_dir()), stage.name
    if stage.shipped and stage.builder == "judge_sft":  # its command line's flags, on top of another stage's policy
      build = json.loads((ROOT / stage.path / "build.json").read_text())
      assert build["builder"] == "judge_sft" and build["args"]["quick"] is False, stage.name
      assert build["init"] == stages[stage.init].path and build["overrides"] == list(stage.overrides), stage.name
    elif stage.shipped:
      build = json.loads((ROOT / stage.path / "build.json").read_text())
      prev = stages[stage.init].path if stage.init else None
      load = {"navigation_sft": build_config.load_navigation, "telecom_sft": build_config.load_telecom,
              "tau2_sft": build_config.load_tau2}[stage.builder]
      assert build["builder"] == stage.builder and build["quick"] is False, stage.name
      assert build["overrides"] == lineage.stage_overrides(stage, prev), stage.name
      assert build["config"] == build_config.to_dict(load(build["config_file"], build["overrides"])), stage.name
      assert build["config"].get("init") == prev, stage.name  # the previous stage's output
  assert [s.name for s in lineage.chain(stages, "b11")] == ["b7", "b9", "b10", "b11"]
  assert lineage.chain(stages, "b7")[0].init is None

  runs = navigation_sft.chain_runs("/tmp/chain", "teacher", ["seed=3"], ["--quick"])
  argvs = [argv for _, argv in runs]
  assert [a[a.index("--out") + 1] for a in argvs] == ["/tmp/chain/" + n for n in ("b7", "b9", "b10", "b11", "teacher")]
  assert not any(o.startswith("init=") for o in argvs[0]) and all(a[0] == "--quick" and a[-1] == "seed=3" for a in argvs)
  for prev, argv in zip(argvs, argvs[1:]):
    assert f"init={prev[prev.index('--policy-dir') + 1]}" in argv
  with pytest.raises(SystemExit, match="--chain sets"):
    navigation_sft.main(["--chain", "/tmp/chain", "init=x"])
  with pytest.raises(SystemExit, match="not navigation_sft"):
    navigation_sft.main(["--chain", "/tmp/chain", "--chain-to", "telecom_g3f"])
  with pytest.raises(SystemExit, match="expected one of"):
    navigation_sft.main(["--chain", "/tmp/chain", "--chain-to", "b12"])


def test_lineage_rejects_an_init_that_is_not_an_earlier_stage(tmp_path):
  bad = tmp_path / "lineage.yaml"
  bad.write_text("stages:\n  a:\n    builder: navigation_sft\n    path: p/a\n    init: b\n    overrides: []\n")
  with pytest.raises(ValueError, match="stages.a.init"):
    lineage.load_lineage(bad)
  bad.write_text("stages:\n  a:\n    builder: navigation_sft\n    path: p/a\n    overrides: [init=x]\n")
  with pytest.raises(ValueError, match="stages.a.overrides"):
    lineage.load_lineage(bad)
