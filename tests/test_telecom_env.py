"""tau2-Telecom episodes: gold replay coverage, do-nothing, reward composition, robustness."""

import collections
import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from rti_jax.envs.base import Environment
from rti_jax.envs.telecom import TRANSFER_MESSAGE, TelecomEnv, get_task, load_tasks
from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.__main__ import main
from rti_jax.envs.telecom.evaluation import ToolCallRecord, assert_no_overdue_bill, evaluate
from rti_jax.envs.telecom.scripted_agents import DescribedGoldAgent, DoNothingAgent, GoldAgent, ScriptAgent, pass_rate, run_episode, tool_call_text

TRANSFER_TASK = "[service_issue]contract_end_suspension|lock_sim_card_pin[PERSONA:Hard]"
DATA_AT_HOME = "[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]"
ALL_IDS = list(load_tasks())


def test_is_an_environment():
  env = TelecomEnv()
  assert isinstance(env, Environment) and env.max_turns == 30
  messages = env.reset(DATA_AT_HOME)
  assert [m["role"] for m in messages] == ["system", "user"]
  assert "Telecom Agent Policy" in messages[0]["content"] and "mobile data" in messages[1]["content"].lower()
  assert '"name":"refuel_data"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
  short = TelecomEnv(policy="Be brief.").reset(DATA_AT_HOME)[0]["content"]
  assert short.startswith("Be brief.") and '"name":"refuel_data"' in short
  names = [s["function"]["name"] for s in env.tool_schemas()]
  assert "refuel_data" in names and "toggle_data" not in names


@pytest.mark.parametrize("seed, agent_cls", [(0, GoldAgent), (1, DescribedGoldAgent)])
def test_gold_replay_scores_one_on_every_base_task(seed, agent_cls):
  """By tool name or in plain words, the scripted user follows every gold path, doing
  exactly the gold device actions plus its goal checks, never asking for clarification."""
  env = TelecomEnv(seed=seed)
  goal_checks = {"run_speed_test", "can_send_mms", "check_status_bar", "check_payment_request"}
  failed = []
  for task in load_tasks().values():
    transcript = run_episode(env, agent_cls(task), task)
    user_calls = collections.Counter(c.name for c in env.tool_calls if c.requestor == "user")
    extra = set(user_calls - collections.Counter(a.name for a in task.user_actions))
    if transcript.reward != 1.0 or extra - goal_checks or transcript.info["unmapped_user_turns"]:
      failed.append(task.task_id)
  assert failed == []
  assert pass_rate(env, agent_cls, list(load_tasks().values())) == 1.0


def test_natural_language_agent_solves_tasks():
  """No tool names: the user maps plain requests, pronouns, offers and payment."""
  env = TelecomEnv()
  data_turns = [
      "Hi! Can I have your phone number, please?",
      tool_call_text("get_customer_by_phone", {"phone_number": "555-123-2002"}),
      "Thanks. Could you look at your status bar and tell me what it shows?",
      "Mobile data looks disabled. Please turn it on.",
      tool_call_text("get_data_usage", {"customer_id": "C1001", "line_id": "L1002"}),
      "You have used 15.1 GB of your 15 GB allowance. I can add 2 GB for $4.00. Would you like that?",
      tool_call_text("refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.0}),
      "Done. Please run a speed test now.",
  ]
  assert run_episode(env, ScriptAgent(data_turns), DATA_AT_HOME).reward == 1.0
  assert env.transcript.info["termination"] == "user_stop" and env.transcript.info["unmapped_user_turns"] == 0
  service_turns = [
      "Hello, what is your phone number?",
      tool_call_text("get_customer_by_phone", {"phone_number": "555-123-2002"}),
      "Please check whether airplane mode is on, and if so switch off airplane mode.",
      tool_call_text("get_bills_for_customer", {"customer_id": "C1001"}),
      tool_call_text("send_payment_request", {"customer_id": "C1001", "bill_id": "B1234321"}),
      "Your line is suspended because of an overdue bill. I've sent a payment request; please check it and pay it.",
      tool_call_text("resume_line", {"customer_id": "C1001", "line_id": "L1002"}),
      "Your line is active again. Please restart your phone.",
  ]
  task = "[service_issue]airplane_mode_on|overdue_bill_suspension[PERSONA:None]"
  assert run_episode(env, ScriptAgent(service_turns), task).reward == 1.0


@pytest.mark.parametrize("stop", [True, False])
def test_do_nothing_scores_zero_on_every_base_task(stop):
  env = TelecomEnv()
  rewards = {tid: run_episode(env, DoNothingAgent(stop=stop), tid).reward for tid in ALL_IDS}
  assert set(rewards.values()) == {0.0}
  assert env.transcript.info["termination"] == ("agent_stop" if stop else "max_turns")


def test_every_gold_action_is_needed():
  """Dropping any one gold action from the replay loses the reward. The exception: a
  reboot that a later reboot or SIM reseat makes redundant (both re-register the phone)."""
  env = TelecomEnv()
  still_solved = []
  for task in load_tasks().values():
    for i, action in enumerate(task.actions):
      shortened = dataclasses.replace(task, actions=task.actions[:i] + task.actions[i + 1:])
      if run_episode(env, GoldAgent(shortened), task).reward == 1.0:
        still_solved.append((task.task_id, action.name, task.actions[i + 1].name if i + 1 < len(task.actions) else None))
  assert {name for _, name, _ in still_solved} == {"reboot_device"}
  for task_id, _, following in still_solved:
    later = [a.name for a in get_task(task_id).actions]
    assert later.count("reboot_device") == 2 or following == "reseat_sim_card", task_id


def test_a_payment_request_alone_does_not_clear_the_overdue_bill():
  task = get_task("[service_issue]airplane_mode_on|overdue_bill_suspension[PERSONA:None]")
  state = st.initialize(list(task.init_actions))
  assert not assert_no_overdue_bill(state, "B1234321")
  st.find_record(state.db, "bills", "bill_id", "B1234321")["status"] = "Awaiting Payment"
  assert not assert_no_overdue_bill(state, "B1234321")
  st.find_record(state.db, "bills", "bill_id", "B1234321")["status"] = "Paid"
  assert assert_no_overdue_bill(state, "B1234321") and assert_no_overdue_bill(state, "B0000")


def test_reward_is_the_product_of_assertions_and_actions():
  """Reference: the product over the basis of all(assertions) and all(actions), by hand."""
  task = get_task(TRANSFER_TASK)  # basis ENV_ASSERTION + ACTION; asserts no_service, expects a transfer
  state = st.initialize(list(task.init_actions))
  transfer = ToolCallRecord("assistant", "transfer_to_human_agents", {"summary": "anything"}, True)
  lookup = ToolCallRecord("assistant", "get_customer_by_id", {"customer_id": "C1001"}, True)
  cases = [([transfer], "transfer", 1.0 * 1.0), ([lookup], "agent_stop", 1.0 * 0.0),
           ([transfer], "max_turns", 0.0),
           # tau2-bench matches an expected action by name (compare_args [] here), whoever made the
           # call and whether or not it failed
           ([ToolCallRecord("user", "transfer_to_human_agents", {"summary": "x"}, True)], "transfer", 1.0),
           ([ToolCallRecord("assistant", "transfer_to_human_agents", {}, False)], "transfer", 1.0),
           ([ToolCallRecord("assistant", "transfer_to_human_agent", {"summary": "x"}, True)], "transfer", 0.0)]
  for calls, termination, expected in cases:
    assert evaluate(task, state, calls, termination).reward == expected, (calls, termination)
  state.phone.sim_card_status = "active"  # now the phone gets service: the assertion fails
  st.find_record(state.db, "lines", "line_id", "L1002")["status"] = "Active"
  st.sync_surroundings(state)
  st.network_search(state)
  info = evaluate(task, state, [transfer], "transfer")
  assert info.reward == 0.0 and info.assertions[0][1] is False and info.actions[0][1] is True


def test_action_check_compares_arguments_unless_told_not_to():
  task = get_task(DATA_AT_HOME)  # basis ENV_ASSERTION only, so actions do not enter the reward
  state = st.initialize(list(task.init_actions))
  refuel = ToolCallRecord("assistant", "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2}, True)
  wrong = ToolCallRecord("assistant", "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 1.0}, True)
  names = dict(evaluate(task, state, [refuel], "agent_stop").actions)
  assert names["assistant:refuel_data"] is True
  assert dict(evaluate(task, state, [wrong], "agent_stop").actions)["assistant:refuel_data"] is False
  # compare_args None compares the arguments the call passed: one left out is not compared, an
  # extra one makes it differ, and values compare with ==
  partial = ToolCallRecord("assistant", "refuel_data", {"gb_amount": 2.0}, False)
  extra = ToolCallRecord("user", "refuel_data", {**refuel.arguments, "note": "x"}, True)
  near = ToolCallRecord("assistant", "refuel_data", {**refuel.arguments, "gb_amount": 2.0000001}, True)
  assert dict(evaluate(task, state, [partial], "agent_stop").actions)["assistant:refuel_data"] is True
  assert dict(evaluate(task, state, [extra], "agent_stop").actions)["assistant:refuel_data"] is False
  assert dict(evaluate(task, state, [near], "agent_stop").actions)["assistant:refuel_data"] is False


def test_agent_call_to_a_device_tool_is_an_error_observation():
  env = TelecomEnv()
  env.reset(DATA_AT_HOME)
  result = env.step(tool_call_text("toggle_data", {}))
  assert not result.done and result.messages[0]["role"] == "tool"
  assert "tool on the user's phone" in result.messages[0]["content"]
  assert result.info["user_device_calls_by_agent"] == 1 and result.info["tool_errors"] == 1
  assert env.state.phone.data_enabled is False  # nothing changed on the phone


def test_case_d1_device_call_and_its_correction():
  """Paper D.1: the policy calls the user-side check_network_status itself (with a
  placeholder argument); the corrected turn asks the user, who runs it and reports."""
  mms_abroad = "[mms_issue]bad_network_preference|user_abroad_roaming_disabled_off[PERSONA:None]"
  env = TelecomEnv()
  assert "France" in env.reset(mms_abroad)[1]["content"]
  bad = env.step('<think>I should first verify their network status.</think>\n'
                 + tool_call_text("check_network_status", {"phone_number": "user's phone number"}))
  assert "tool on the user's phone" in bad.messages[0]["content"] and bad.info["user_device_calls_by_agent"] == 1
  fixed = env.step("Sure, let's first check whether your phone's network settings cause the MMS issue. Please run "
                   "the check_network_status function on your device and send me the result.")
  assert fixed.messages[0]["role"] == "user" and "I ran check_network_status:" in fixed.messages[0]["content"]
  assert "technology 2G" in fixed.messages[0]["content"] and "Data roaming: OFF" in fixed.messages[0]["content"]
  assert [c.name for c in env.tool_calls] == ["check_network_status", "check_network_status"]
  assert [c.requestor for c in env.tool_calls] == ["assistant", "user"]


def test_malformed_output_never_crashes():
  env = TelecomEnv()
  env.reset(DATA_AT_HOME)
  result = env.step("<tool_call>{not json</tool_call>")
  assert result.messages[0]["content"].startswith("Error: tool call is not valid JSON")
  assert result.info["malformed"] == 1
  result = env.step(tool_call_text("refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": "two"}))
  assert "must be a number" in result.messages[0]["content"]
  result = env.step("<think>only thoughts</think>")  # no call and no message
  assert result.messages == [{"role": "tool", "content": "Error: empty turn; call a tool or write a message to the user."}]
  result = env.step(None)  # not even text
  assert result.info["malformed"] == 3 and not result.done
  result = env.step("Blah blah.")  # a message the user cannot map
  assert result.messages[0]["role"] == "user" and result.info["unmapped_user_turns"] == 1


def test_step_needs_an_episode():
  env = TelecomEnv()
  with pytest.raises(RuntimeError, match="call reset"):
    env.step("hello")
  env.reset(DATA_AT_HOME)
  env.step("Bye. ###STOP###")
  with pytest.raises(RuntimeError, match="call reset"):
    env.step("hello again")
  with pytest.raises(KeyError, match="not one of the 114 base tasks"):
    env.reset("[mms_issue]nothing[PERSONA:None]")
  with pytest.raises(ValueError, match="max_turns must be >= 1"):
    TelecomEnv(max_turns=0)


def test_turn_limit_scores_zero_even_when_assertions_hold():
  env = TelecomEnv(max_turns=4)
  env.reset(TRANSFER_TASK)
  env.step(tool_call_text("transfer_to_human_agents", {"summary": "cannot fix"}))
  for _ in range(3):
    result = env.step(tool_call_text("get_customer_by_id", {"customer_id": "C1001"}))
  assert result.done and result.reward == 0.0 and env.transcript.info["termination"] == "max_turns"
  assert env.result.assertions[0][1] is True and env.result.actions[0][1] is True


def test_transfer_then_message_ends_with_reward():
  env = TelecomEnv()
  env.reset(TRANSFER_TASK)
  env.step(tool_call_text("transfer_to_human_agents", {"summary": "SIM locked"}))
  result = env.step(TRANSFER_MESSAGE)
  assert result.done and result.reward == 1.0 and env.transcript.info["termination"] == "transfer"


def test_transcript_keeps_per_turn_records():
  env = TelecomEnv()
  task = get_task(DATA_AT_HOME)
  run_episode(env, GoldAgent(task), task)
  turns = env.transcript.info["turns"]
  assert len(turns) == env.transcript.num_turns
  assert turns[1]["agent_calls"][0]["name"] == "get_customer_by_phone"
  user_calls = [c["name"] for t in turns for c in t["user_calls"]]
  assert "toggle_data" in user_calls and user_calls[-1] == "run_speed_test"
  assert env.transcript.info["evaluation"]["reward"] == 1.0
  # Messages: system, opening user message, then one assistant message per turn plus replies.
  assert sum(m["role"] == "assistant" for m in env.transcript.messages) == env.transcript.num_turns
  json.dumps(env.transcript.info)  # JSON-serialisable for logging


def test_reward_evidence_separates_agent_and_user_actions():
  env = TelecomEnv()
  assert env.reward_evidence() == {}
  env.reset(DATA_AT_HOME)
  ev = env.reward_evidence()
  assert ev["agent_actions"] == [{"name": "refuel_data",
                                  "arguments": {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.0}}]
  assert ev["user_actions"] == [{"name": "toggle_data", "arguments": {}}]
  assert [a["func_name"] for a in ev["env_assertions"]] == [
      "assert_mobile_data_status", "assert_internet_speed", "assert_data_refueling_amount"]
  assert "toggle_data" in ev["user_side_tools"] and "toggle_data" not in ev["agent_side_tools"]
  assert ev["evaluation_criteria"]["reward_basis"] == ["ENV_ASSERTION"]
  assert "speed test is excellent" in ev["completion_note"]
  env.reset(TRANSFER_TASK)
  assert "transfer to a human agent" in env.reward_evidence()["completion_note"]


def test_stats_cli(capsys):
  assert main(["stats", "--seeds", "0", "--json"]) == 0
  stats = json.loads(capsys.readouterr().out)
  base = stats["splits"]["base"]
  assert base["tasks"] == 114 and base["by_issue_type"] == {
      "service_issue": 29, "mobile_data_issue": 36, "mms_issue": 49}
  assert base["covered_tasks"] == 114 and base["gold_replay_pass"] == 1.0
  assert base["do_nothing_stop_pass"] == 0.0 and base["do_nothing_chat_pass"] == 0.0
  assert (stats["splits"]["train"]["tasks"], stats["splits"]["test"]["tasks"]) == (74, 40)
  assert base["described_gold_replay_pass"] == 1.0 and base["gold_failures"] == []


_FRAGMENTS = ["<tool_call>", "</tool_call>", '{"name": "refuel_data", "arguments": {"gb_amount": "x"}}',
              '{"name": "toggle_data"}', "<think>", "turn off airplane mode", "reset_apn_settings(", "pay",
              "###STOP###", "it", "grant_app_permission(app_name=)", "?", "\n", "🙂", "get_details_by_id"]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(turns=hst.lists(hst.lists(hst.one_of(hst.sampled_from(_FRAGMENTS), hst.text(max_size=20)), max_size=6)
                       .map("".join), min_size=1, max_size=8))
def test_arbitrary_assistant_text_never_crashes(turns):
  env = TelecomEnv(max_turns=6)
  env.reset(DATA_AT_HOME)
  for text in turns:
    result = env.step(text)
    assert all(m["role"] in ("tool", "user") and isinstance(m["content"], str) for m in result.messages)
    assert result.reward in (0.0, 1.0)
    if result.done:
      break


def test_tools_through_the_chat_template_leave_the_policy_text_alone():
  from rti_jax.config import load_config
  from rti_jax.envs.registry import task_source
  from rti_jax.envs.telecom.env import system_prompt

  listed = task_source(load_config("telecom"))
  via_template = task_source(load_config("telecom", ["env.tools_in_template=true"]))
  assert listed.tool_schemas is None
  names = [t["function"]["name"] for t in via_template.tool_schemas]
  assert len(names) == 13 and "get_customer_by_phone" in names
  task = listed.train[0]
  with_list = listed.env_factory().reset(task)[0]["content"]
  plain = via_template.env_factory().reset(task)[0]["content"]
  assert "<tools>" in with_list and "<tools>" not in plain and with_list.startswith(plain)
  assert with_list == system_prompt(plain)  # the default layout is the policy text plus the tools list
