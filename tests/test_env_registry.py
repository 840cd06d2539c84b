"""The environment registry: built-in environments find themselves, a new one plugs in as one file
(``tests/toy_calculator.py``) with its own typed config section, and the trainer, the pipeline and
the compare experiment run it end to end with nothing central naming it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rti_jax.config import ConfigError, load_config
from rti_jax.envs import registry
from rti_jax.intervention.judges import Correction
from toy_calculator import CalculatorEnv, CalcValidator, CalcVerifier, make_tasks, register


@pytest.fixture
def calculator():
  spec = register()
  yield spec
  registry.unregister(spec.name)


def gold_text(name, arguments):
  return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# --- the registry and the config ---------------------------------------------------------------


def test_builtin_environments_register_themselves_without_a_central_list():
  out = subprocess.run([sys.executable, "-c", "from rti_jax.envs import registry; print(registry.names())"],
                       capture_output=True, text=True, check=True)
  names = eval(out.stdout)  # noqa: S307 (our own print of a list of names)
  assert {"navigation", "telecom"} <= set(names)


def test_unknown_env_name_is_a_config_error_listing_the_registered_ones():
  with pytest.raises(ConfigError, match=r"^env.name: unknown environment 'chess'; registered: \[.*'navigation'"):
    load_config(None, ["env.name=chess", "policy.path=x"])


def test_a_spec_registers_once_unless_replaced(calculator):
  with pytest.raises(ValueError, match="registered already"):
    registry.register(registry.EnvSpec("calculator", source=calculator.source))
  with pytest.raises(ValueError, match="name: expected an identifier"):
    registry.EnvSpec("two words", source=calculator.source)
  with pytest.raises(ValueError, match="options: expected a dataclass"):
    registry.EnvSpec("calc2", source=calculator.source, options=dict)


def test_the_environments_section_is_typed_and_checked_and_other_sections_stay_default(calculator):
  cfg = load_config(None, ["env.name=calculator", "policy.path=x", "env.calculator.num_train=5"])
  assert cfg.env.calculator.num_train == 5 and registry.options_of(cfg).num_train == 5
  assert len(registry.task_source(cfg).train) == 5
  with pytest.raises(ConfigError, match=r"^env.calculator.num_train"):
    load_config(None, ["env.name=calculator", "policy.path=x", "env.calculator.num_train=0"])
  with pytest.raises(ConfigError, match=r"^env.calculator.num_train"):  # OmegaConf's type check
    load_config(None, ["env.name=calculator", "policy.path=x", "env.calculator.num_train=many"])
  with pytest.raises(ConfigError, match=r"^env.calculator.num_train: an option of env 'calculator'"):
    load_config("navigation", ["env.calculator.num_train=5"])
  with pytest.raises(ConfigError, match=r"^env.navigation.hidden_city_share: an option of env 'navigation'"):
    load_config(None, ["env.name=calculator", "policy.path=x", "env.navigation.hidden_city_share=0.5"])


def test_an_environment_without_rule_roles_or_demonstrator_is_named_when_they_are_asked_for(calculator):
  registry.register(registry.EnvSpec("bare", source=calculator.source))
  try:
    with pytest.raises(ValueError, match="env 'bare' registers no rule-based roles"):
      registry.rule_roles("bare")
    with pytest.raises(ValueError, match=r"env 'bare' registers no demonstrator.*'navigation'"):
      registry.demonstrator("bare")
  finally:
    registry.unregister("bare")


# --- the toy environment and its rule roles ----------------------------------------------------------


def test_gold_calls_succeed_and_a_wrong_answer_earns_a_fractional_reward():
  task = make_tasks(1, offset=3)[0]
  env = CalculatorEnv()
  env.reset(task)
  results = [env.step(gold_text(n, a)) for n, a in task.gold]
  assert [r.done for r in results] == [False, False, True] and results[-1].reward == 1.0
  env.reset(task)
  assert env.step(gold_text("answer", {"value": -1})).reward == 0.25
  env.reset(task)
  bad = env.step(gold_text("convert", {"value": "three", "unit": "km"}))  # a counted error, not a crash
  assert not bad.done and "error" in bad.messages[0]["content"]


def test_rule_roles_flag_the_off_path_step_and_reject_the_leaked_answer():
  from rti_jax.intervention.pipeline import step_context
  from rti_jax.rollout import Episode

  task = make_tasks(1)[0]
  env = CalculatorEnv()
  env.reset(task)
  ep = type("Ep", (), {"traj": type("T", (), {"messages": env.transcript.messages})(), "env": env})()
  ctx = step_context(ep, gold_text("answer", task.gold[-1][1]), "calculator")
  judged = CalcValidator().validate([ctx, step_context(ep, gold_text(*task.gold[0]), "calculator")])
  assert [j.is_valid for j in judged] == [False, True] and "convert" in judged[0].suggest_next
  verdicts = CalcVerifier().verify([ctx, ctx], [gold_text("answer", task.gold[-1][1]), gold_text(*task.gold[0])])
  assert [(v.ok, v.reasons) for v in verdicts] == [(False, ("leaked_value",)), (True, ())]
  assert Episode  # the pipeline's own episode type is what the trainer passes


# --- end to end: rollout + intervention + update through the trainer ---------------------------------


class OracleCorrector:
  """Writes the next gold call: every intervened episode then succeeds, so groups are replaced."""

  def correct(self, ctxs, judgements, prompts, seed):
    from toy_calculator import _next_gold

    return [Correction(gold_text(g["name"], g["arguments"])) for g in map(_next_gold, ctxs)]


def _cfg(policy, *extra):
  return load_config(None, [
      "env.name=calculator", f"policy.path={policy}", "env.max_turns=4", "rollout.tasks_per_iter=2",
      "rollout.group_size=2", "rollout.max_new_tokens=96", "rollout.max_context=1024", "train.iterations=1",
      "train.eval_every=100", "optim.lr=0.01", "intervention.delta=inf", *extra])


def test_rti_on_the_toy_environment_replaces_failed_groups_and_updates(calculator, toy_policy, tmp_path):
  from rti_jax.trainer import Trainer

  tr = Trainer(_cfg(toy_policy, "loss.method=rti"), tmp_path / "rti", progress=False)
  assert tr.source.domain == "calculator" and isinstance(tr.roles.validator, CalcValidator)
  tr.roles.corrector = OracleCorrector()
  rec = tr.iterate()
  assert rec["all_fail_group_frac"] == 1.0 and rec["rti/groups_triggered"] == 2  # a random policy fails all
  assert rec["rti/steps_flagged"] >= 6 and rec["rti/corrections_applied"] == rec["rti/verifier_accepted"] >= 6
  assert rec["rti/groups_replaced"] == 2 and rec["all_fail_group_frac_after"] == 0.0
  assert rec["intervened_tokens"] > 0 and rec["grad_norm"] > 0


def test_grpo_on_an_environment_without_rule_roles_builds_none(calculator, toy_policy, tmp_path):
  from rti_jax.trainer import Trainer

  registry.register(registry.EnvSpec("calculator", source=calculator.source, options=calculator.options), replace=True)
  tr = Trainer(_cfg(toy_policy, "loss.method=grpo"), tmp_path / "grpo", progress=False)
  assert tr.roles is None
  rec = tr.iterate()
  assert rec["rti/groups_triggered"] == 0 and rec["reward_mean"] < 1.0
  with pytest.raises(ValueError, match="registers no rule-based roles"):
    Trainer(_cfg(toy_policy, "loss.method=rti"), tmp_path / "rti", progress=False)


@pytest.mark.slow
def test_compare_experiment_reports_the_environments_own_subsets(calculator, toy_policy, tmp_path):
  from experiments import compare

  out = tmp_path / "cmp"
  assert compare.main(["--env", "calculator", "--quick", "--no-progress", "--out", str(out), "--test-tasks", "4",
                       f"policy.path={toy_policy}", "rollout.max_new_tokens=8", "rollout.max_context=512",
                       "env.calculator.num_train=8"]) == 0
  results = json.loads((out / "results.json").read_text())
  cols = results["table"]["columns"]
  assert cols[:4] == ["method", "p@1", "avg p@k", "avg pk"] and "kilometres p@1" in cols
  assert [r[0] for r in results["table"]["rows"]] == ["base", "grpo", "rti"]
  assert "Navigation" not in (out / "table.md").read_text() and "calculator" in (out / "table.md").read_text()


def test_stats_command_replays_the_gold_agent_per_split(capsys):
  from rti_jax.envs.__main__ import compute_stats, main

  stats = compute_stats("navigation", ["env.num_train=30", "env.num_test=10", "train.val_tasks=0"])
  assert {k: (s["tasks"], s["gold pass"]) for k, s in stats["splits"].items()} == {"train": (30, 1.0), "test": (10, 1.0)}
  assert main(["list"]) == 0 and "telecom" in capsys.readouterr().out
  assert main(["stats", "--env", "chess"]) == 2 and "unknown environment 'chess'" in capsys.readouterr().err


def _imported_modules(path):
  import ast

  tree = ast.parse(path.read_text())
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      out.add(node.module)
  return out


def test_models_import_nothing_from_the_library_and_the_registry_only_the_env_interface():
  import pathlib

  root = pathlib.Path(__file__).resolve().parents[1]
  for path in sorted((root / "models").rglob("*.py")):
    assert not {m for m in _imported_modules(path) if m.split(".")[0] == "rti_jax"}, path
  registry_imports = {m for m in _imported_modules(root / "rti_jax/envs/registry.py") if m.startswith("rti_jax")}
  # the package (scanned for registration modules) and the TaskSource, which imports only the Environment interface
  assert registry_imports == {"rti_jax.envs", "rti_jax.envs.source"}
  assert {m for m in _imported_modules(root / "rti_jax/envs/source.py") if m.startswith("rti_jax")} == {"rti_jax.envs.base"}


def test_success_is_the_environments_threshold_not_a_positive_reward():
  from rti_jax.envs.source import TaskSource
  from rti_jax.intervention.pipeline import InterventionConfig, group_all_failed

  group = [type("T", (), {"reward": r})() for r in (0.25, 0.5)]
  assert group_all_failed(group) and not group_all_failed(group, success_reward=0.5)
  assert not group_all_failed([type("T", (), {"reward": r})() for r in (1.0, 0.0)])
  with pytest.raises(ValueError, match="success_threshold"):
    TaskSource([], [], None, str, {}, "x", success_threshold=0.0)
  with pytest.raises(ValueError, match="success_reward"):
    InterventionConfig(success_reward=float("inf"))
