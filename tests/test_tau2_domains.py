"""The tau2 Retail and Airline domains run by tau2's own code (``rti_jax.envs.tau2``): registry and
options, gold replays scored 1.0 by tau2's evaluator, the do-nothing baseline as tau2 scores it,
the fast reward against tau2's evaluator, malformed and mistyped calls, the scripted user, the
generated training split, the rule roles and the stats command. The checks over every task are
marked slow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("tau2", reason='tau2-bench is not installed (the tau2 extra: pip install -e ".[tau2]")')

from rti_jax.config import ConfigError, load_config  # noqa: E402
from rti_jax.envs import registry  # noqa: E402
from rti_jax.envs.source import TaskSource  # noqa: E402
from rti_jax.envs.tau2 import bridge  # noqa: E402
from rti_jax.envs.tau2.agents import DoNothingAgent, GoldAgent, run_episode, tool_call_text  # noqa: E402
from rti_jax.envs.tau2.env import Tau2Env  # noqa: E402
from rti_jax.envs.tau2.generate import generated_tasks, overlap  # noqa: E402
from rti_jax.envs.tau2.rules import Tau2RuleValidator, Tau2RuleVerifier  # noqa: E402
from rti_jax.envs.tau2.tasks import find_task, tau2_tasks  # noqa: E402
from rti_jax.intervention.judges import StepContext  # noqa: E402

# Retail 0: an exchange; 3: a transfer; 39: a gold call that fails on purpose; 40: facts to tell.
RETAIL_SAMPLE = ("0", "3", "39", "40", "76")
AIRLINE_SAMPLE = ("0", "7", "8", "13", "14")


@pytest.fixture(scope="module")
def retail_env() -> Tau2Env:
  return Tau2Env("retail")


@pytest.fixture(scope="module")
def airline_env() -> Tau2Env:
  return Tau2Env("airline")


def _ctx(env: Tau2Env, draft: str) -> StepContext:
  history = tuple(m for m in env.transcript.messages if m["role"] != "system")
  return StepContext(user_query=history[0]["content"], history=history, draft=draft, tools=tuple(env.tool_schemas()),
                     evidence=env.reward_evidence(), domain=env.domain)


# --------------------------------------------------------------------------- registry and options


def test_registry_knows_both_domains_and_builds_a_task_source():
  assert {"retail", "airline"} <= set(registry.names())
  for name in ("retail", "airline"):
    spec = registry.get(name)
    assert spec.prompts.rules == f"tau2_domain_{name}"
    assert spec.default_options().policy_text == "condensed"
  source = registry.task_source(load_config(None, ["env.name=retail", "policy.path=x"]))
  assert isinstance(source, TaskSource) and source.domain == "retail" and source.success_threshold == 1.0
  assert len(source.test) == 114 and 0 < len(source.train) <= 600
  assert {source.task_id(t) for t in source.train}.isdisjoint(source.task_id(t) for t in source.test)
  assert source.subsets["exchange"](find_task("retail", "0"))
  env = source.env_factory()
  assert env.reset(source.test[0])[0]["role"] == "system"
  split = registry.task_source(load_config(None, ["env.name=airline", "policy.path=x", "env.airline.splits=tau2"]))
  assert (len(split.train), len(split.test)) == (30, 20)


def test_options_errors_name_the_field():
  with pytest.raises(ConfigError, match=r"env\.retail\.policy_text"):
    load_config(None, ["env.name=retail", "policy.path=x", "env.retail.policy_text=short"])
  with pytest.raises(ConfigError, match=r"env\.airline\.user_url"):
    load_config(None, ["env.name=airline", "policy.path=x", "env.airline.user=llm"])
  with pytest.raises(ConfigError, match=r"env\.retail\.reward"):
    load_config(None, ["env.name=airline", "policy.path=x", "env.retail.reward=tau2"])  # another env's section
  with pytest.raises(ConfigError, match=r"env\.airline\.validator_rules"):
    load_config(None, ["env.name=airline", "policy.path=x", "env.airline.validator_rules=all"])
  with pytest.raises(ValueError, match="rules"):
    Tau2RuleValidator(rules="all")


def test_registration_imports_no_tau2_and_a_missing_tau2_names_the_install_command():
  code = (
      "import sys\n"
      "import rti_jax.envs.tau2.registration\n"
      "assert 'tau2' not in sys.modules, 'registration imported tau2'\n"
      "class Block:\n"
      "  def find_spec(self, name, path=None, target=None):\n"
      "    if name == 'tau2' or name.startswith('tau2.'): raise ImportError('No module named tau2')\n"
      "sys.meta_path.insert(0, Block())\n"
      "from rti_jax.envs.tau2 import bridge\n"
      "try:\n"
      "  bridge.tau2_modules()\n"
      "except ImportError as e:\n"
      "  print(e)\n")
  out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert 'pip install -e ".[tau2]" -c constraints.txt -c constraints-tau2.txt' in out.stdout


# --------------------------------------------------------------------------- rewards


@pytest.mark.parametrize("domain,ids", [("retail", RETAIL_SAMPLE), ("airline", AIRLINE_SAMPLE)])
def test_gold_replay_scores_one_with_taus_evaluator(domain, ids):
  env = Tau2Env(domain, reward="tau2")
  for task_id in ids:
    task = find_task(domain, task_id)
    transcript = run_episode(env, GoldAgent(task), task)
    assert transcript.reward == 1.0, (task_id, transcript.info["evaluation"])
    assert transcript.info["evaluation"]["method"] == "tau2"
    assert transcript.info["termination"] in ("user_stop", "transfer")
    assert transcript.info["tool_errors"] == 0  # the gold calls that fail on purpose are left out


def test_gold_calls_that_fail_on_purpose_are_left_out_of_the_evidence(retail_env):
  task = find_task("retail", "39")
  assert task.failing, "retail 39 has a gold call that fails on purpose"
  retail_env.reset(task)
  ev = retail_env.reward_evidence()
  assert len(ev["agent_actions"]) == len(task.gold_actions) - len(task.failing)
  assert sum(a["fails_on_purpose"] for a in ev["evaluation_criteria"]["actions"]) == len(task.failing)
  assert set(ev) >= {"completion_note", "agent_actions", "communicate_info", "evaluation_criteria"}


@pytest.mark.parametrize("domain,ids", [("retail", RETAIL_SAMPLE), ("airline", AIRLINE_SAMPLE)])
def test_do_nothing_gets_what_tau2_gives_it(domain, ids):
  env = Tau2Env(domain, reward="fast")
  ev_mod = bridge.tau2_modules()["evaluator"]
  for task_id in ids:
    task = find_task(domain, task_id)
    transcript = run_episode(env, DoNothingAgent(), task)
    sim = bridge.simulation_run(task.task, env.tau2_messages, "agent_stop")
    expected = ev_mod.evaluate_simulation(simulation=sim, task=task.task, evaluation_type=ev_mod.EvaluationType.ALL,
                                          solo_mode=False, domain=domain).reward
    assert transcript.reward == expected, task_id
    assert transcript.info["termination"] == "agent_stop"


def test_fast_reward_equals_taus_on_right_and_wrong_episodes(retail_env):
  for task_id in ("0", "40"):
    task = find_task("retail", task_id)
    for agent in (GoldAgent(task), DoNothingAgent(stop=False)):
      run_episode(retail_env, agent, task)
      assert retail_env.score("fast").reward == retail_env.score("tau2").reward
  # a wrong write: the database no longer matches, by both measures
  task = find_task("retail", "0")
  retail_env.reset(task)
  retail_env.step(tool_call_text("exchange_delivered_order_items", {
      "order_id": "#W2378156", "item_ids": ["1151293680"], "new_item_ids": ["7706410293"],
      "payment_method_id": "credit_card_9513926"}))
  result = retail_env.step("Your exchange is done. ###STOP###")
  assert result.done and result.reward == 0.0
  assert retail_env.score("tau2").reward == 0.0 and retail_env.result.db_match is False


def test_fast_reward_tells_an_int_from_a_float_as_tau2_does(airline_env):
  task = find_task("airline", "12")
  (name, args), = task.write_actions
  for total, expected in ((args["total_baggages"], 1.0), (float(args["total_baggages"]), 0.0)):
    airline_env.reset(task)
    airline_env.step(tool_call_text(name, {**args, "total_baggages": total}))
    result = airline_env.step("Your bags are added. ###STOP###")
    assert result.reward == airline_env.score("tau2").reward == expected


def test_turn_limit_scores_zero():
  env = Tau2Env("airline", max_turns=2)
  task = find_task("airline", "3")
  env.reset(task)
  assert not env.step("Hello, how can I help?").done
  result = env.step("Still here.")
  assert result.done and result.reward == 0.0 and env.transcript.info["termination"] == "max_turns"
  assert env.score("tau2").reward == 0.0


# --------------------------------------------------------------------------- model output


def test_malformed_calls_and_wrong_argument_types_are_counted_not_raised(retail_env):
  retail_env.reset(find_task("retail", "0"))
  turns = [
      "<tool_call>{not json</tool_call>",
      "<tool_call>[1, 2]</tool_call>",
      tool_call_text("no_such_tool", {}),
      tool_call_text("get_order_details", {"order_id": 2378156}),
      tool_call_text("get_order_details", {}),
      tool_call_text("get_order_details", {"order_id": "#W2378156", "extra": 1}),
      tool_call_text("exchange_delivered_order_items", {"order_id": "#W2378156", "item_ids": "1151293680",
                                                         "new_item_ids": 7, "payment_method_id": None}),
      tool_call_text("calculate", {"expression": "9**9**9**9"}),
      '<tool_call>{"name": "calculate", "arguments": "[1]"}</tool_call>',
      "",
  ]
  for text in turns:
    result = retail_env.step(text)
    assert not result.done
    assert all(m["role"] == "tool" and m["content"].startswith("Error") for m in result.messages), (text, result.messages)
  info = retail_env.transcript.info
  assert info["malformed"] == 4  # two bad blocks, arguments that are a JSON array, the empty turn
  assert info["unknown_tools"] == 1
  assert info["bad_arguments"] == 4
  assert info["guarded_calls"] == 1
  assert info["tool_errors"] == 6 and info["write_calls"] == 0
  # the episode goes on and still scores as tau2 does
  result = retail_env.step("###STOP###")
  assert result.done and result.reward == retail_env.score("tau2").reward == 0.0


def test_tool_replies_are_compact_for_the_policy_and_exact_in_the_log(retail_env):
  retail_env.reset(find_task("retail", "0"))
  shown = retail_env.step(tool_call_text("get_order_details", {"order_id": "#W2378156"})).messages[0]["content"]
  logged = retail_env.tau2_messages[-1].content
  assert json.loads(logged)["order_id"] == json.loads(shown)["order_id"] == "#W2378156"
  assert len(shown) < len(logged) and ": " not in shown and "null" not in shown


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_condensed_system_prompt_lists_every_tool_in_a_third_of_the_text(domain):
  condensed, full = Tau2Env(domain), Tau2Env(domain, policy_text="full")
  short, long = condensed.reset(tau2_tasks(domain)[0])[0]["content"], full.reset(tau2_tasks(domain)[0])[0]["content"]
  assert len(short) * 2.5 < len(long)
  for schema in full.tool_schemas():
    assert f"\n{schema['function']['name']}(" in short
  assert {s["function"]["name"] for s in condensed.tool_schemas()} == {s["function"]["name"] for s in full.tool_schemas()}
  bare = Tau2Env(domain, tools_in_prompt=False).reset(tau2_tasks(domain)[0])[0]["content"]
  assert "<tools>" not in bare and "<tools>" in short


# --------------------------------------------------------------------------- the scripted user


def test_scripted_user_answers_confirms_refuses_and_stops(retail_env):
  retail_env.reset(find_task("retail", "0"))
  reply = retail_env.step("Could you tell me your name and zip code?").messages[0]["content"]
  assert "Yusuf Rossi" in reply and "19122" in reply
  assert "don't remember" in retail_env.step("What is your email address?").messages[0]["content"]
  wrong = ("I can exchange keyboard 1151293680 for 9690244451 and thermostat 4983901480 for 7747408585 in order "
           "#W2378156, paying with credit_card_9513926. Shall I proceed?")
  assert retail_env.step(wrong).messages[0]["content"].startswith("No")
  right = ("I can exchange keyboard 1151293680 for 7706410293 and thermostat 4983901480 for 7747408585 in order "
           "#W2378156, paying with credit_card_9513926. Shall I proceed?")
  assert retail_env.step(right).messages[0]["content"].startswith("Yes")
  # nothing done yet: wrapping up makes the user ask again, not leave
  result = retail_env.step("Is there anything else I can help you with?")
  assert not result.done and "not everything" in result.messages[0]["content"]


def test_scripted_user_stops_on_a_refusal_task_and_transfers():
  env = Tau2Env("airline")
  env.reset(find_task("airline", "0"))  # cancellation the policy does not allow
  env.step("What is your user id?")
  result = env.step("I'm sorry, this reservation cannot be cancelled under our policy.")
  assert result.done and env.transcript.info["termination"] == "user_stop" and result.reward == 1.0
  env.reset(find_task("airline", "0"))
  result = env.step("YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.")
  assert result.done and env.transcript.info["termination"] == "transfer"


def test_the_llm_user_needs_a_url():
  """(the LLM user itself: tests/test_tau2_llm_user.py, against a stand-in server)"""
  with pytest.raises(ValueError, match="user_url"):
    Tau2Env("airline", user="llm")


# --------------------------------------------------------------------------- generated training tasks


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_generated_tasks_are_disjoint_and_their_gold_scores_one(domain):
  tasks = generated_tasks(domain)
  assert len(tasks) >= 300
  assert not overlap(domain, tasks)
  kinds = {k for t in tasks for k in t.request_types}
  assert "refusal" in kinds and len(kinds) >= 5
  env = Tau2Env(domain, reward="tau2")
  for task in tasks[:4]:
    assert run_episode(env, GoldAgent(task), task).reward == 1.0, task.task_id
  assert generated_tasks(domain, 10) == tasks[:10]  # deterministic, cached


# --------------------------------------------------------------------------- rule roles


def test_rule_validator_flags_drafts_off_the_gold_path(retail_env):
  task = find_task("retail", "0")
  retail_env.reset(task)
  validator, _ = registry.rule_roles("retail")
  assert isinstance(validator, Tau2RuleValidator)
  gold = tool_call_text(*task.write_actions[0])
  wrong = tool_call_text("exchange_delivered_order_items", {
      "order_id": "#W2378156", "item_ids": ["1151293680"], "new_item_ids": ["9690244451"],
      "payment_method_id": "credit_card_9513926"})
  judged = validator.validate([_ctx(retail_env, d) for d in (gold, wrong, "Done! ###STOP###", "Let me look.")])
  assert [j.is_valid for j in judged] == [True, False, False, True]
  assert judged[1].error_types == ("off_path_write",) and "7706410293" in judged[1].suggest_next
  assert "7706410293" not in judged[1].visible_suggest_next
  assert judged[2].error_types == ("premature_end",)
  # once the gold write is done, ending is fine
  retail_env.step(gold)
  assert validator.validate([_ctx(retail_env, "All done. ###STOP###")])[0].is_valid


def _steps_validators():
  opts = registry.options_of(load_config(None, ["env.name=airline", "policy.path=x",
                                                "env.airline.validator_rules=steps"]))
  return registry.rule_roles("airline")[0], registry.rule_roles("airline", opts)[0]


def test_the_steps_rules_flag_made_up_ids_and_an_early_claim_of_done(airline_env):
  """``validator_rules=steps`` also flags a call with an id no user message or tool reply shows
  (cut, run on, or made up; the right id is fine in any case) and a message saying the request is
  done before any write; the default rules flag neither (the episode goes on)."""
  from rti_jax.policy.sft_example import assistant_indices, play, step_context

  outcome, steps = _steps_validators()
  assert (outcome.rules, steps.rules) == ("outcome", "steps")
  task = next(t for t in generated_tasks("airline", 600) if t.task_id == "airline-gen-0562")
  gold = play(airline_env, GoldAgent(task), task)
  turns = assistant_indices(gold)
  look = next(i for i in turns if "get_reservation_details" in gold[i]["content"])
  assert "VJ03FR" in gold[look]["content"] and "VJ03FR" in gold[1]["content"]  # the user wrote it

  def judge(validator, i, draft):
    return validator.judge(step_context(gold[:i], draft, airline_env, "airline"))

  drafts = [tool_call_text("get_reservation_details", {"reservation_id": rid})
            for rid in ("VJ03FR", "vj03fr", "VJ03", "VJ03FRX", "VJ0Daiki")]
  assert [judge(steps, look, d).is_valid for d in drafts] == [True, True, False, False, False]
  assert all(judge(outcome, look, d).is_valid for d in drafts)
  cut = judge(steps, look, drafts[2])
  assert cut.error_types == ("fabricated_id",) and "'VJ03'" in cut.diagnosis and "'VJ03'" in cut.visible_suggest_next
  huge = judge(steps, look, tool_call_text("get_reservation_details", {"reservation_id": "Z" * 100_000}))
  assert huge.error_types == ("fabricated_id",) and len(huge.diagnosis) + len(huge.visible_suggest_next) < 1000
  write = next(i for i in turns if "update_reservation_flights" in gold[i]["content"])
  done = "Everything you asked for is done. Is there anything else I can help you with?"
  before = judge(steps, write - 2, done)  # at the confirmation: nothing written yet
  assert before.error_types == ("false_completion",) and judge(outcome, write - 2, done).is_valid
  assert "update_reservation_flights" in before.suggest_next
  assert "update_reservation_flights" not in before.visible_suggest_next and "VJ03FR" not in before.visible_suggest_next
  assert judge(steps, write - 2, "To confirm, I will update the reservation. Shall I proceed (yes/no)?").is_valid
  assert judge(steps, write + 2, done).is_valid  # after the write it is true
  transfer = tool_call_text("transfer_to_human_agents", {"summary": "x"})
  assert judge(steps, write - 2, transfer).error_types == ("premature_end",) == judge(outcome, write - 2,
                                                                                        transfer).error_types


@pytest.mark.slow
@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_the_steps_rules_pass_every_gold_step_of_generated_tasks(domain):
  """Every assistant turn of the gold replays of 40 generated tasks passes the steps rules (tau2's own
  tasks: ``test_every_tau2_task_gold_pass_do_nothing_rate_and_steps_rules``)."""
  validator = Tau2RuleValidator(rules="steps")
  env = Tau2Env(domain, reward="fast")
  flagged, judged = [], 0
  for task in generated_tasks(domain, 40):
    transcript = run_episode(env, GoldAgent(task), task)
    assert transcript.reward == 1.0, task.task_id
    got, n = _steps_flagged(validator, env, domain, transcript.messages)
    flagged += [(task.task_id, *f) for f in got]
    judged += n
  assert flagged == [] and judged > 200


def _steps_flagged(validator, env, domain, messages) -> tuple[list[tuple[int, str]], int]:
  """(turn index, diagnosis) of every assistant turn of ``messages`` the validator flags, and the
  number of turns judged."""
  from rti_jax.policy.sft_example import assistant_indices, step_context

  turns = assistant_indices(messages)
  flagged = []
  for i in turns:
    verdict = validator.judge(step_context(messages[:i], messages[i]["content"], env, domain))
    if not verdict.is_valid:
      flagged.append((i, verdict.diagnosis))
  return flagged, len(turns)


def test_rule_verifier_rejects_unseen_privileged_values(retail_env):
  retail_env.reset(find_task("retail", "0"))
  retail_env.step(tool_call_text("get_order_details", {"order_id": "#W2378156"}))
  _, verifier = registry.rule_roles("retail")
  assert isinstance(verifier, Tau2RuleVerifier)
  ctx = _ctx(retail_env, "draft")
  judged = verifier.verify([ctx] * 4, [
      "Shall I exchange it for item 7706410293?",  # a gold new item id, not shown yet
      "Shall I exchange it for item 7706-410-293?",  # the same, respelled
      tool_call_text("get_product_details", {"product_id": "1656367028"}),  # shown in the order details
      "According to the gold actions, I should exchange it.",
  ])
  assert judged[0].reasons == ("leaked_value",) and judged[1].reasons == ("leaked_value",)
  assert judged[2].ok
  assert "leak" in judged[3].reasons


# --------------------------------------------------------------------------- the stats command


def test_stats_command_prints_tasks_and_gold_pass(capsys):
  from rti_jax.envs.tau2.__main__ import main

  assert main(["stats", "--domain", "retail", "--sample", "2", "--reward", "fast"]) == 0
  out = capsys.readouterr().out
  assert "tasks" in out and "gold pass" in out
  rows = [r for r in (line.split() for line in out.splitlines()) if r[:1] in (["train"], ["test"]) and r[1].isdigit()]
  assert [r[0] for r in rows] == ["train", "test"] and all(float(r[2]) == 1.0 for r in rows)


def test_the_registry_stats_score_the_gold_replays_by_taus_evaluator(monkeypatch):
  """``python -m rti_jax.envs stats --env retail`` builds its tasks with ``env.retail.reward=tau2``
  (the registration's ``stats_overrides``); an override on the command line still wins."""
  from rti_jax.envs import __main__ as envs_main

  seen = []

  def source(cfg):
    seen.append(registry.options_of(cfg).reward)
    raise ValueError("no tasks needed")

  monkeypatch.setattr(registry, "task_source", source)
  for overrides in ([], ["env.airline.reward=fast"]):
    with pytest.raises(ValueError, match="no tasks needed"):
      envs_main.compute_stats("airline", overrides)
  assert seen == ["tau2", "fast"]
  assert registry.get("retail").stats_overrides == ("env.retail.reward=tau2",)


# --------------------------------------------------------------------------- every task (slow)


@pytest.mark.slow
@pytest.mark.parametrize("domain,do_nothing", [("retail", 7 / 114), ("airline", 19 / 50)])
def test_every_tau2_task_gold_pass_do_nothing_rate_and_steps_rules(domain, do_nothing):
  """Every task: gold agents pass and do-nothing agents pass as often as tau2's own runs say
  (FINDINGS), by the fast reward; every twelfth task's two episodes also by tau2's evaluator, which
  must agree. Every assistant turn of the gold replays passes the steps rules (a brute-force check
  that they flag only what leads nowhere). (``python -m rti_jax.envs stats --env DOMAIN`` scores
  every task by tau2's evaluator.)"""
  env = Tau2Env(domain, reward="fast")
  validator = Tau2RuleValidator(rules="steps")
  tasks = tau2_tasks(domain)
  gold, nothing, flagged, judged = [], [], [], 0
  for i, task in enumerate(tasks):
    for agent, out in ((GoldAgent(task), gold), (DoNothingAgent(), nothing)):
      transcript = run_episode(env, agent, task)
      out.append(transcript.reward)
      if i % 12 == 0:
        assert env.score("tau2").reward == out[-1], (task.task_id, type(agent).__name__)
      if out is gold:
        got, n = _steps_flagged(validator, env, domain, transcript.messages)
        flagged += [(task.task_id, *f) for f in got]
        judged += n
  assert [t.task_id for t, r in zip(tasks, gold) if r != 1.0] == []
  assert sum(nothing) / len(tasks) == pytest.approx(do_nothing)
  assert flagged == [] and judged > 4 * len(tasks)


def test_an_episode_that_writes_nothing_leaves_the_next_one_the_same_database(retail_env):
  """A new episode starts on the last one's database as it is when nothing was written to it, and
  put back record by record when something was; rewards are the same as on a fresh copy (the fast
  reward then uses the initial database's hash)."""
  tasks = [find_task("retail", i) for i in RETAIL_SAMPLE[:3]]
  env = Tau2Env("retail", reward="fast")
  env.reset(tasks[0])
  first = env._env
  assert run_episode(env, DoNothingAgent(), tasks[1]).reward == run_episode(retail_env, DoNothingAgent(), tasks[1]).reward
  assert env._env is first and env._untouched
  assert env.score("tau2").reward == env.score("fast").reward
  assert run_episode(env, GoldAgent(tasks[2]), tasks[2]).reward == 1.0 and not env._untouched
  assert bridge.new_environment("retail").get_db_hash() != env._env.get_db_hash()
  for task in tasks:
    assert run_episode(env, DoNothingAgent(), task).reward == env.score("tau2").reward
    assert env._env.tools.db == bridge.new_environment("retail").tools.db
    assert env._env.get_db_hash() == bridge.initial_db_hash("retail")


@pytest.mark.parametrize("domain,ids", [("retail", RETAIL_SAMPLE), ("airline", AIRLINE_SAMPLE)])
def test_a_written_database_put_back_equals_a_freshly_parsed_one(domain, ids, monkeypatch):
  """``restore_db`` after each task's gold calls (records changed, added, removed, reordered) gives
  a database equal to a fresh parse: as objects, as tau2's JSON dump (key order included) and by
  tau2's hash; gold replays that start on recycled databases leave the same hashes as fresh ones."""
  fresh = bridge.new_environment(domain)
  env = bridge.new_environment(domain)
  msg = bridge.tau2_modules()["message"]
  db = env.tools.db
  table = next(iter(db.__dict__))
  extra = next(iter(db.__dict__[table]))
  changed = 0
  for task_id in ids:
    task = find_task(domain, task_id).task
    for i, a in enumerate(task.evaluation_criteria.actions or []):
      env.get_response(msg.ToolCall(id=f"g{i}", name=a.name, arguments=dict(a.arguments), requestor=a.requestor))
    changed += env.get_db_hash() != fresh.get_db_hash()
    records = db.__dict__[table]
    records["added-by-the-test"] = records.pop(extra)  # one record gone, one new, the order changed
    assert bridge.restore_db(domain, db) >= 2
    assert db == fresh.tools.db and list(db.__dict__[table]) == list(fresh.tools.db.__dict__[table])
    assert db.model_dump_json() == fresh.tools.db.model_dump_json()
    assert env.get_db_hash() == bridge.initial_db_hash(domain)
    assert bridge.restore_db(domain, db) == 0
  assert changed >= 2  # the sample's gold calls write
  with pytest.raises(TypeError, match="database"):
    bridge.restore_db(domain, object())

  monkeypatch.setattr(bridge, "GOLD_DB_CACHE", 2)
  tasks = tau2_tasks(domain)[:6]
  reused = []
  real_restore = bridge.restore_db
  monkeypatch.setattr(bridge, "restore_db", lambda d, db: reused.append(d) or real_restore(d, db))

  def hashes(recycle: bool) -> list[str]:
    out = []
    for t in tasks:
      if not recycle:
        bridge._SPARE[domain].clear()
      bridge.forget_gold(domain, t.task.id)
      bridge.gold_replay(domain, t.task)
      out.append(bridge.gold_hash(domain, t.task))
    return out

  by_fresh = hashes(recycle=False)
  assert reused == []
  recycled = hashes(recycle=True)
  assert len(reused) >= 3  # the later replays started on databases the cache let go
  assert recycled == by_fresh


# --------------------------------------------------------------------------- the evaluator's environments


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_the_evaluator_builds_environments_equal_to_tau2s_own(domain, monkeypatch):
  """Inside ``parsed_database`` tau2's registry builds the domain's environments over the database
  parsed once (or a spare one put back); they equal the ones tau2 reads from its files, and episodes
  score the same with and without it."""
  from tau2.registry import registry as tau2_registry

  own = tau2_registry.get_env_constructor(domain)
  with bridge.parsed_database(domain):
    assert tau2_registry.get_env_constructor(domain) is not own
    ours = tau2_registry.get_env_constructor(domain)()
  assert tau2_registry.get_env_constructor(domain) is own
  assert all(db is not ours.tools.db for db in bridge._SPARE[domain])  # still held here: not reused
  ref = own()
  assert ours.tools.db == ref.tools.db and ours.tools.db is not ref.tools.db
  assert ours.get_db_hash() == ref.get_db_hash() and ours.get_policy() == ref.get_policy()

  env = Tau2Env(domain, reward="tau2")
  tasks = tau2_tasks(domain)[:2]
  bridge._SPARE[domain].clear()
  episodes = [run_episode(env, agent, t) for t in tasks for agent in (GoldAgent(t), DoNothingAgent())]
  assert len(bridge._SPARE[domain]) >= 2  # the evaluator's databases serve the next ones
  monkeypatch.setattr(bridge, "parsed_database", lambda d: __import__("contextlib").nullcontext())
  again = [run_episode(env, agent, t) for t in tasks for agent in (GoldAgent(t), DoNothingAgent())]
  assert [e.reward for e in episodes] == [e.reward for e in again]
  assert [e.reward for e in episodes][::2] == [1.0] * len(tasks)
