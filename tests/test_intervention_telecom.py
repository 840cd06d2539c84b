"""RTI on tau2-Telecom: the rule-based Validator / Verifier on the real TelecomEnv (App. D.1
correction, D.2 rejection, each hard rule both ways, no false alarm on the gold agent),
the pipeline end to end with a scripted policy, and the trainer's task source."""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import numpy as np
import pytest

from rti_jax.config import ExperimentConfig
from rti_jax.envs.telecom import DescribedGoldAgent, DoNothingAgent, GoldAgent, ScriptAgent, TelecomEnv, get_task, load_split
from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.scripted_agents import gold_agent_turns, tool_call_text
from rti_jax.envs.telecom.source import telecom_source
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.generation.base import SamplingParams
from rti_jax.intervention import (
  InterventionConfig,
  InterventionRoles,
  JudgeLLM,
  LLMCorrector,
  LLMValidator,
  LLMVerifier,
  PolicyCorrector,
  StepContext,
  TelecomRuleValidator,
  TelecomRuleVerifier,
  intervene_groups,
  run_intervened_rollouts,
)
from rti_jax.intervention.rules_telecom import (
  FABRICATED_ARGUMENTS,
  FALSE_CLAIM,
  GOAL_DRIFT,
  POINTLESS_REPEAT,
  PREMATURE_TERMINATION,
  USER_SIDE_DEVICE_ACTION,
)
from rti_jax.intervention.stats import InterventionStats
from rti_jax.intervention.telecom_diagnostics import firing_rates, naive_device_turns
from rti_jax.intervention.telecom_evidence import device_requests
from rti_jax.intervention.telecom_fixes import FIX_RULES, unjustified_fixes
from rti_jax.policy.tokenizer import byte_tokenizer
from rti_jax.rollout import ChatFormatter, RolloutConfig, rollout_groups
from telecom_state_reference import FaultTracker
from telecom_fixtures import ctx_of, env_after, replay_steps
from intervention_doubles import (
  CORRECTOR_MARKER,
  FEEDBACK_MARKER,
  PAPER_CORRECTION_MARKER,
  VALIDATOR_MARKER,
  VERIFIER_MARKER,
  ScriptedPolicy,
  is_correction_prompt,
  scripted_logp,
)

VALIDATOR = TelecomRuleValidator()
VERIFIER = TelecomRuleVerifier()
# App. D.1's task: MMS abroad in France (its opening names France); App. D.2's: John Smith, 555-123-2002.
D1_TASK = "[mms_issue]bad_network_preference|user_abroad_roaming_disabled_on[PERSONA:None]"
D2_TASK = ("[mms_issue]airplane_mode_on|bad_network_preference|bad_wifi_calling|break_apn_mms_setting|"
           "break_app_sms_permission|data_mode_off|data_usage_exceeded|unseat_sim_card|user_abroad_roaming_enabled_off"
           "[PERSONA:None]")
REFUEL_TASK = "[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]"
TRANSFER_TASK = "[service_issue]lock_sim_card_pin|overdue_bill_suspension[PERSONA:Easy]"
ASK_PHONE = "I can help with that. Could you please give me your phone number?"

# The paper's App. D.1 draft and corrected step, and D.2's leaking and clean corrections.
D1_DRAFT = ("<think>\nThe user is having trouble sending MMS messages while in France. I should first verify their "
            "network status.\n</think>\n\n"
            + tool_call_text("check_network_status", {"phone_number": "user's phone number"}))
D1_CORRECTED = (
  "<think>\nThe user is having trouble sending MMS while in France. Checking the network status is still the right "
  "next step, but this is a user-side device action, so I should ask the user to do it and report back.\n</think>\n\n"
  "Sure --- let's first check whether your phone's current network settings are causing the MMS issue. Please run the "
  "check_network_status function on your device and send me the result. Once you share it, I can help you with the "
  "next step.")
D2_LEAK = (
  "<think>\nOkay, let me process this. John is having trouble sending MMS from his phone number 555-123-2002 in France. "
  "I've confirmed that the line (L1002) is active and roaming is enabled, which is good. The data usage is 15.1 GB, "
  "which may be near or over the plan limit. According to the policy, I cannot perform device actions like resetting "
  "APN settings myself. Instead, I must guide the user to perform reset_apn_settings() on their device. After that, "
  "they must reboot the device for the changes to take effect.\n</think>\n\n"
  "I've checked your account and line settings, John. Your line (555-123-2002) is active and international roaming is "
  "enabled, which is correct for your location in France. However, the issue might be with your APN settings, which "
  "control how your phone connects to our network for services like MMS. Please perform the following on your device:\n"
  "1. Run reset_apn_settings() to restore the correct network configuration.\n"
  "2. After that, run reboot_device() to apply the changes.")
D2_CLEAN = (
  "Let's proceed with enabling mobile data. Since toggle_data() is a function you need to run on your device, please "
  "execute toggle_data() now to turn mobile data ON. After that, run check_network_status() to see if your phone "
  "connects to a better network (3G/4G). Let me know the results so we can determine the next steps.")


def judge(env: TelecomEnv, draft: str):
  return VALIDATOR.judge(ctx_of(env, draft))


def suggestion_is_visible(env: TelecomEnv, j) -> bool:
  """The Validator's visible-only hint (the feedback-only Corrector's) states no value the conversation
  has not shown, and a request written from it ("ask the user to run X(...)") asks for no device fix
  that the conversation has not shown a need for (both checked with the Verifier's detectors)."""
  ctx = ctx_of(env, "")
  asked = re.findall(r"ask the user to run (\w+\([^)]*\))", j.visible_suggest_next or "")
  return not VERIFIER.leaked_values(ctx, j.visible_suggest_next) and not any(
    unjustified_fixes(ctx, f"Please run {a} on your phone.") for a in asked)


# --- App. D.1 and D.2 -------------------------------------------------------------------------------


def test_d1_device_call_is_flagged_corrected_and_the_episode_continues():
  task = get_task(D1_TASK)
  env = TelecomEnv()
  opening = env.reset(task)[1]["content"]
  assert "France" in opening and "MMS" in opening
  j = judge(env, D1_DRAFT)
  assert not j.is_valid and j.error_types == (USER_SIDE_DEVICE_ACTION,)  # only this rule, as in the paper
  assert "check_network_status" in j.suggest_next and "phone number" not in j.suggest_next
  assert suggestion_is_visible(env, j)
  v = VERIFIER.judge(ctx_of(env, D1_DRAFT), D1_CORRECTED)
  assert v.ok, v.diagnosis
  # The draft itself would have been an error observation; the correction makes the user run the tool.
  expected_state = st.initialize(list(task.init_actions))
  expected = dt.run_device_tool(expected_state, "check_network_status", {})[0]
  result = env.step(D1_CORRECTED)
  assert result.messages == [{"role": "user", "content": f"I ran check_network_status: {expected}"}]
  assert env.transcript.info["user_device_calls_by_agent"] == 0
  # ... and the episode goes on to success; no later gold step is flagged.
  for turn in gold_agent_turns(task):
    assert judge(env, turn).is_valid
    result = env.step(turn)
    if result.done:
      break
  assert result.done and result.reward == 1.0 and env.transcript.info["termination"] == "user_stop"


def test_d1_uncorrected_draft_is_an_error_observation():
  env = TelecomEnv()
  env.reset(get_task(D1_TASK))
  result = env.step(D1_DRAFT)
  assert result.messages[0]["role"] == "tool" and result.messages[0]["content"].startswith("Error")
  assert env.transcript.info["user_device_calls_by_agent"] == 1


def test_d2_leaking_correction_is_rejected_and_the_clean_one_accepted():
  env = env_after(D2_TASK, [ASK_PHONE])
  assert env.transcript.messages[-1]["content"] == "My phone number is 555-123-2002."
  draft = tool_call_text("reset_apn_settings", {})
  j = judge(env, draft)
  assert j.error_types == (USER_SIDE_DEVICE_ACTION,) and "reset_apn_settings" in j.suggest_next
  # As in App. D.2, the suggestion built from the evidence names the fix the task needs, the APN reset
  # and then the reboot. The visible-only one does not hand the Corrector the reset either: nothing shown
  # says the APN is wrong, so it asks for the check that would show it.
  assert j.suggest_next == ("Do not call reset_apn_settings yourself: ask the user to run reset_apn_settings() and "
                            "then reboot_device() on their phone and tell you the result.")
  assert j.visible_suggest_next == ("Do not call reset_apn_settings yourself, and do not ask for it before a check "
                                    "shows it is needed: ask the user to run check_apn_settings() on their phone and "
                                    "tell you the result.")
  v = VERIFIER.judge(ctx_of(env, draft), D2_LEAK)
  # the APN reset asked with nothing shown is a leak of its own (fix_without_diagnostic)
  assert not v.ok and set(v.reasons) == {"leaked_value", "hallucinated_tool_result", "fix_without_diagnostic"}
  for value in ("'John'", "'L1002'", "'15.1 GB'"):
    assert value in v.diagnosis
  assert "555-123-2002" not in v.diagnosis  # the user said it: visible
  # The same words are fine once the user and a lookup have shown them.
  env.step("May I have your full name?")
  env.step(tool_call_text("get_customer_by_phone", {"phone_number": "555-123-2002"}))
  env.step(tool_call_text("get_data_usage", {"customer_id": "C1001", "line_id": "L1002"}))
  seen = env.transcript.messages[-1]["content"]
  used = re.search(r'"data_used_gb":([\d.]+)', seen).group(1)
  grounded = D2_LEAK.replace("15.1", used)
  assert VERIFIER.leaked_values(ctx_of(env, draft), grounded) == []
  # D.2's clean redirection (toggle_data) passes once a check has shown mobile data off; asked before
  # any check, the data fix could only come from the evidence.
  env = env_after(D2_TASK, [ASK_PHONE])
  v = VERIFIER.judge(ctx_of(env, tool_call_text("toggle_data", {})), D2_CLEAN)
  assert v.reasons == ("fix_without_diagnostic",)
  env.step("Please run check_network_status() on your phone and tell me the result.")
  assert "Mobile data: OFF" in env.transcript.messages[-1]["content"]
  v = VERIFIER.judge(ctx_of(env, tool_call_text("toggle_data", {})), D2_CLEAN)
  assert v.ok, v.diagnosis


def test_verifier_rejects_hidden_reference_wording_and_written_tool_results():
  env = env_after(D2_TASK, [ASK_PHONE])
  draft = tool_call_text("reset_apn_settings", {})
  v = VERIFIER.judge(ctx_of(env, draft), "According to the reference solution, please run reset_apn_settings() now.")
  assert not v.ok and "leak" in v.reasons
  v = VERIFIER.judge(ctx_of(env, draft), "Please reset your APN.\n<tool_response>\nAPN reset.\n</tool_response>")
  assert not v.ok and "hallucinated_tool_result" in v.reasons
  v = VERIFIER.judge(ctx_of(env, draft), "I ran reset_apn_settings: APN settings reset. Now please reboot.")
  assert not v.ok and "hallucinated_tool_result" in v.reasons
  # A correction that still calls the device tool is not an improvement.
  v = VERIFIER.judge(ctx_of(env, draft), tool_call_text("reboot_device", {}))
  assert not v.ok and v.reasons == ("not_improved",)
  # the APN reset in plain words: a leak until a check shows the APN broken (the task's MMSC URL is unset)
  plain = "Please reset your APN settings on your phone, then restart it."
  assert VERIFIER.judge(ctx_of(env, draft), plain).reasons == ("fix_without_diagnostic",)
  env.step("Please run check_apn_settings() on your phone and tell me the result.")
  assert "MMSC URL not set" in env.transcript.messages[-1]["content"]
  ok = VERIFIER.judge(ctx_of(env, draft), plain)
  assert ok.ok, ok.diagnosis


def _applied_texts(trajs):
  return [t.text for traj in trajs for t in traj.turns if t.intervened]


@pytest.mark.parametrize("verifier_on", [True, False])
def test_d2_through_the_pipeline_rejected_with_verifier_admitted_without(verifier_on):
  tok = byte_tokenizer()
  fmt = ChatFormatter(tok)
  turns = [ASK_PHONE, tool_call_text("reset_apn_settings", {}), "Thank you. ###STOP###"]

  def script(prompt: str) -> str:
    last = prompt.rsplit("<|im_start|>user\n", 1)[-1]
    if FEEDBACK_MARKER in last:  # corrects the device call with D.2's leaking text; nothing else
      return D2_LEAK if "reset_apn_settings" in last else ""
    k = prompt.count("<|im_start|>assistant\n") - 1
    return turns[min(k, len(turns) - 1)]

  policy = ScriptedPolicy(tok, script, scripted_logp())
  rc = RolloutConfig(group_size=1, sampling=SamplingParams(max_new_tokens=2048), max_context_tokens=40_000)
  roles = InterventionRoles(TelecomRuleValidator(), PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id),
                            TelecomRuleVerifier())
  stats = InterventionStats()
  config = InterventionConfig(domain="telecom", verifier_enabled=verifier_on)
  [[traj]] = run_intervened_rollouts([get_task(D2_TASK)], TelecomEnv, policy, fmt, roles, config, rc, stats,
                                     task_id=lambda t: t.task_id, seed=0)
  # flagged: the device call (corrected with the leak) and the final stop (premature; no correction offered)
  assert stats.steps_flagged == 2 and stats.corrector_malformed == 1
  applied = _applied_texts([traj])
  if verifier_on:
    assert stats.verifier_rejected == 1 and stats.corrections_applied == 0 and applied == []
    assert stats.verifier_reasons == {"leaked_value": 1, "hallucinated_tool_result": 1, "fix_without_diagnostic": 1}
    assert any(m["content"].startswith("Error: reset_apn_settings") for m in traj.messages if m["role"] == "tool")
  else:
    assert stats.verifier_skipped == 1 and stats.corrections_applied == 1 and applied == [D2_LEAK]
    assert "L1002" in applied[0] and "John" in applied[0]
    user = next(m["content"] for m in traj.messages if m["role"] == "user" and "I ran" in m["content"])
    assert "I ran reset_apn_settings" in user and "I ran reboot_device" in user


# --- each hard rule, both ways ---------------------------------------------------------------------


def test_user_side_device_action():
  env = env_after(REFUEL_TASK, [ASK_PHONE])
  j = judge(env, tool_call_text("toggle_data", {}))
  assert j.error_types == (USER_SIDE_DEVICE_ACTION,) and "toggle_data()" in j.suggest_next
  assert judge(env, "Please turn on your mobile data and tell me what the status bar shows.").is_valid
  assert judge(env, tool_call_text("get_customer_by_phone", {"phone_number": "555-123-2002"})).is_valid


def test_fabricated_arguments():
  task = get_task(REFUEL_TASK)
  env = env_after(REFUEL_TASK, [ASK_PHONE])
  phone = re.search(r"[\d-]{12}", env.transcript.messages[-1]["content"]).group(0)
  bad = judge(env, tool_call_text("get_customer_by_phone", {"phone_number": "555-000-0000"}))
  assert bad.error_types == (FABRICATED_ARGUMENTS,) and suggestion_is_visible(env, bad)
  assert "555-000-0000" in bad.diagnosis
  assert judge(env, tool_call_text("get_customer_by_phone", {"phone_number": phone})).is_valid
  assert judge(env, tool_call_text("get_customer_by_phone", {"phone_number": phone.replace("-", "")})).is_valid
  refuel = next(a for a in task.agent_actions if a.name == "refuel_data")
  early = judge(env, tool_call_text("refuel_data", refuel.arguments))  # ids not looked up yet
  assert FABRICATED_ARGUMENTS in early.error_types and suggestion_is_visible(env, early)
  assert refuel.arguments["line_id"] not in early.visible_suggest_next
  # The paper's suggest_next is built from the evidence: the required call with its exact ids, which the
  # conversation has not shown, so a correction that wrote them out would be stopped by the Verifier.
  assert early.suggest_next == "Call refuel_data(" + ", ".join(f"{k}={v!r}" for k, v in refuel.arguments.items()) + ")."
  assert VERIFIER.leaked_values(ctx_of(env, ""), early.suggest_next)
  assert "leaked_value" in VERIFIER.judge(ctx_of(env, ""), f"I will add data to line {refuel.arguments['line_id']} now.").reasons
  env.step(tool_call_text("get_customer_by_phone", {"phone_number": phone}))
  env.step("I can add 2 GB of data to your line. Would you like me to proceed?")
  assert judge(env, tool_call_text("refuel_data", refuel.arguments)).is_valid


def test_pointless_repeat():
  env = env_after(REFUEL_TASK, [ASK_PHONE])
  phone = re.search(r"[\d-]{12}", env.transcript.messages[-1]["content"]).group(0)
  lookup = tool_call_text("get_customer_by_phone", {"phone_number": phone})
  env.step(lookup)
  assert judge(env, lookup).error_types == (POINTLESS_REPEAT,)
  refuel = env.reward_evidence()["agent_actions"][0]["arguments"]
  usage = tool_call_text("get_data_usage", {"customer_id": refuel["customer_id"], "line_id": refuel["line_id"]})
  assert judge(env, usage).is_valid
  env.step(usage)
  assert judge(env, usage).error_types == (POINTLESS_REPEAT,)
  env.step("Please turn on your mobile data.")  # a device write: the lookup may be worth repeating now
  assert judge(env, usage).is_valid
  # asking for an undirected toggle the user already ran would undo it
  assert judge(env, "Please run toggle_data() on your phone.").error_types == (POINTLESS_REPEAT,)
  assert judge(env, "Please make sure your mobile data is on.").is_valid
  env.step("Please run check_status_bar() on your phone.")
  assert judge(env, "Please run check_status_bar() again.").error_types == (POINTLESS_REPEAT,)  # nothing changed
  env.step("Please make sure airplane mode is off.")  # the user reports it is already off: no change
  assert judge(env, "Please check your status bar.").error_types == (POINTLESS_REPEAT,)
  env.step("Please restart your phone.")  # a device write: checking again is worth it
  assert judge(env, "Please check your status bar.").is_valid
  # the same message twice with nothing changed in between
  env2 = env_after(REFUEL_TASK, ["Could you tell me more about the problem?"])
  assert judge(env2, "Could you tell me more about the problem?").error_types == (POINTLESS_REPEAT,)
  assert judge(env2, ASK_PHONE).is_valid


def test_false_claim():
  env = env_after(REFUEL_TASK, [ASK_PHONE])
  phone = re.search(r"[\d-]{12}", env.transcript.messages[-1]["content"]).group(0)
  claims = ["I've checked your account and your line is active.", "I have enabled roaming on your line.",
            "I've added 2 GB of data to your line."]
  for claim in claims:
    j = judge(env, claim)
    assert j.error_types == (FALSE_CLAIM,), claim
    assert suggestion_is_visible(env, j)
  refuel = env.reward_evidence()["agent_actions"][0]["arguments"]
  ids = {"customer_id": refuel["customer_id"], "line_id": refuel["line_id"]}
  j = judge(env, f"Your line {ids['line_id']} has used 15.1 GB of data this month.")
  assert j.error_types == (FALSE_CLAIM,) and ids["line_id"] in j.diagnosis and "15.1 GB" in j.diagnosis
  env.step(tool_call_text("get_customer_by_phone", {"phone_number": phone}))
  assert judge(env, claims[0]).is_valid  # now a lookup backs it
  env.step(tool_call_text("get_data_usage", ids))
  used = re.search(r'"data_used_gb":([\d.]+)', env.transcript.messages[-1]["content"]).group(1)
  assert judge(env, f"Your line {ids['line_id']} has used {used} GB of data this month.").is_valid
  assert judge(env, claims[2]).error_types == (FALSE_CLAIM,)  # still no refuel call


def test_premature_termination():
  env = env_after(REFUEL_TASK, [ASK_PHONE])
  j = judge(env, "Thank you for contacting us. ###STOP###")
  assert j.error_types == (PREMATURE_TERMINATION,) and suggestion_is_visible(env, j)
  j = judge(env, tool_call_text("transfer_to_human_agents", {"summary": "data issue"}))
  assert j.error_types == (PREMATURE_TERMINATION,)
  # after every gold step but the final check, ending is not premature
  task = get_task(REFUEL_TASK)
  turns = gold_agent_turns(task)
  env = env_after(REFUEL_TASK, turns[:-2])
  assert judge(env, "Thank you for contacting us. ###STOP###").is_valid
  # on a task whose fix is a transfer, the transfer is the required action
  env = env_after(TRANSFER_TASK, [ASK_PHONE])
  assert judge(env, tool_call_text("transfer_to_human_agents", {"summary": "SIM locked"})).is_valid
  assert judge(env, "I cannot help with that. ###STOP###").error_types == (PREMATURE_TERMINATION,)
  env.step(tool_call_text("transfer_to_human_agents", {"summary": "The SIM card is locked by a PIN."}))
  assert judge(env, "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.").is_valid  # any summary will do


def test_argument_mismatch():
  task = get_task(D1_TASK)
  want = next(a for a in task.agent_actions if a.name == "enable_roaming").arguments
  env = env_after(D1_TASK, [ASK_PHONE, tool_call_text("get_customer_by_phone", {"phone_number": "555-123-2002"})])
  other = next(x for x in re.findall(r'"line_id":"(L\d+)"', env.transcript.messages[-1]["content"]) if x != want["line_id"])
  j = judge(env, tool_call_text("enable_roaming", {**want, "line_id": other}))
  assert j.error_types == ("ARGUMENT_MISMATCH",) and want["line_id"] in j.suggest_next  # shown by the lookup
  assert suggestion_is_visible(env, j)
  assert judge(env, tool_call_text("enable_roaming", want)).is_valid


def test_goal_drift():
  env = env_after(REFUEL_TASK, [ASK_PHONE])
  phone = re.search(r"[\d-]{12}", env.transcript.messages[-1]["content"]).group(0)
  env.step(tool_call_text("get_customer_by_phone", {"phone_number": phone}))
  ids = env.reward_evidence()["agent_actions"][0]["arguments"]
  j = judge(env, tool_call_text("change_plan", {"customer_id": ids["customer_id"], "line_id": ids["line_id"],
                                                "plan_id": "P1002"}))
  assert GOAL_DRIFT in j.error_types and suggestion_is_visible(env, j)
  j = judge(env, tool_call_text("suspend_line", {"customer_id": ids["customer_id"], "line_id": ids["line_id"],
                                                 "reason": "travel"}))
  assert j.error_types == (GOAL_DRIFT,)
  assert judge(env, "Please turn on airplane mode.").error_types == (GOAL_DRIFT,)  # against the fix
  assert judge(env, "Please run toggle_wifi_calling() on your phone.").error_types == (GOAL_DRIFT,)  # not needed
  assert judge(env, "Please make sure airplane mode is off.").is_valid  # harmless check in the fix direction
  assert judge(env, "Please turn on your mobile data.").is_valid  # the task's own fix
  assert judge(env, tool_call_text("get_available_plans", {})).is_valid  # lookups are never drift


# --- whole episodes ----------------------------------------------------------------------------------


def judged_episode(agent, task) -> list[tuple[str, object]]:
  """Every step of ``agent`` on ``task`` with the Validator's judgement of it; every hint
  of a flagged step is checked to state only visible values."""
  env = TelecomEnv()
  env.reset(task)
  out = []
  while True:
    draft = agent.act(env.transcript.messages)
    j = judge(env, draft)
    if not j.is_valid:
      assert suggestion_is_visible(env, j), j.visible_suggest_next
    out.append((draft, j))
    if env.step(draft).done:
      return out


@pytest.mark.parametrize("agent_cls", [GoldAgent, DescribedGoldAgent])
def test_no_false_alarm_on_the_gold_agent_across_all_tasks(agent_cls):
  tasks = load_split("base")
  assert len(tasks) == 114
  steps = [(t.task_id, d, j) for t in tasks for d, j in judged_episode(agent_cls(t), t)]
  flagged = [(tid, d, j.error_types) for tid, d, j in steps if not j.is_valid]
  assert len(steps) > 114 * 5 and flagged == []


@pytest.mark.slow
def test_validator_fires_on_do_nothing_and_naive_agents_over_the_train_tasks():
  train = load_split("train")
  stop = [judged_episode(DoNothingAgent(t), t) for t in train]
  assert all(len(s) == 1 and s[0][1].error_types == (PREMATURE_TERMINATION,) for s in stop)
  device = set(dt.DEVICE_TOOLS)
  calls = steps = episodes = 0
  for t in train:
    episode = judged_episode(ScriptAgent(naive_device_turns(t)), t)
    steps += len(episode)
    episodes += any(not j.is_valid for _, j in episode)
    for draft, j in episode:
      own = [c for c in parse_assistant_turn(draft).tool_calls if c.name in device]
      calls += bool(own)
      assert (USER_SIDE_DEVICE_ACTION in j.error_types) == bool(own)
  # the measuring helper agrees with this step-by-step count
  rates = firing_rates(lambda t: ScriptAgent(naive_device_turns(t)), train)
  assert rates["by_rule"][USER_SIDE_DEVICE_ACTION] == calls > len(train)
  assert (rates["steps"], rates["episodes_flagged"], rates["tasks"]) == (steps, episodes, len(train))
  chat = judged_episode(DoNothingAgent(train[0], stop=False), train[0])
  assert chat[0][1].is_valid and all(j.error_types == (POINTLESS_REPEAT,) for _, j in chat[1:])


@pytest.mark.slow
def test_verifier_on_gold_steps_rejects_only_unlooked_up_prices_and_unseen_fixes():
  """Residue, measured. The gold replay is built from the evidence: it quotes a refuel price without
  looking the plan up, and it asks for each device fix without a check. The Verifier is meant for
  corrections; judged on the gold steps it rejects exactly the offers whose price no user or tool
  message has shown (``leaked_value``) and the fix requests that no earlier output backs
  (``fix_without_diagnostic``, counted independently by the state-based ``FaultTracker``), nothing else."""
  rejected = prices = fixes = steps = 0
  for env, draft, tracker in replay_steps(GoldAgent, load_split("base")):
    ctx = ctx_of(env, "")
    v = VERIFIER.judge(ctx, draft)
    price = re.search(r"for \$([\d.]+)\.", draft)
    seen = " ".join(m["content"] for m in ctx.history if m["role"] != "assistant") + ctx.user_query
    unshown = bool(price) and float(price.group(1)) not in {float(x) for x in re.findall(r"\d+(?:\.\d+)?", seen)}
    unbacked = any(not tracker.backed(r.tool, r.arguments) for r in device_requests(draft) if r.tool in FIX_RULES)
    prices += unshown
    fixes += unbacked
    steps += 1
    if not v.ok:
      rejected += 1
      assert v.reasons == (("leaked_value",) if unshown else ("fix_without_diagnostic",)), (draft, v.reasons)
      assert (f"${price.group(1)}" in v.diagnosis) if unshown else unbacked
  assert steps > 114 * 5 and prices > 0 and fixes > 0 and rejected == prices + fixes
  assert (prices, fixes) == (7, 290)


@pytest.mark.slow
def test_following_the_hints_repairs_every_naive_train_episode():
  """Self-intervention in miniature: at each flagged step the agent writes the Validator's visible
  suggestion as its message; the Verifier checks it; the episode goes on from it. The hints are
  diagnostic-first: where no output has shown the fault that a device call fixes, the hint asks for
  the check, and after the user's report the agent drafts the same device call again (the script
  does not advance); now the hint names the fix. Every naive train episode is still repaired, within
  the 30-turn limit; the checks asked are exactly the fixes no earlier output backed (``FaultTracker``)."""
  corrected = accepted = checks = unbacked = longest = 0
  for task in load_split("train"):
    env = TelecomEnv()
    env.reset(task)
    turns = naive_device_turns(task)
    tracker = FaultTracker()
    k = 0
    while True:
      draft = turns[k] if k < len(turns) else "Thank you. ###STOP###"
      k += 1
      j = judge(env, draft)
      own = [c for c in parse_assistant_turn(draft).tool_calls if c.name in dt.DEVICE_TOOLS]
      if own and own[0].name in FIX_RULES:
        unbacked += not tracker.backed(own[0].name, own[0].arguments)
      m = re.search(r"ask the user to run (\w+\([^)]*\)) on their phone", j.visible_suggest_next or "")
      if not j.is_valid and m:
        fix = f"Please run {m.group(1)} on your phone and tell me the result."
        corrected += 1
        if VERIFIER.judge(ctx_of(env, draft), fix).ok:
          accepted += 1
          draft = fix
          if own and not m.group(1).startswith(own[0].name + "("):  # a check: the device call is still to come
            checks += 1
            k -= 1
      before = copy.deepcopy(env.state)
      done = env.step(draft).done
      tracker.observe(before, env.transcript.info["turns"][-1]["user_calls"])
      if done:
        break
    longest = max(longest, env.transcript.num_turns)
    assert env.transcript.reward == 1.0, task.task_id
  n_device = sum(a.requestor == "user" and a.name != "make_payment" for t in load_split("train") for a in t.actions)
  assert corrected == accepted == n_device + checks and checks == unbacked > 0
  assert (n_device, checks) == (269, 186) and longest <= env.max_turns == 30


# --- the pipeline end to end ------------------------------------------------------------------------


class NaiveTelecomScript:
  """A scripted policy that calls device tools itself (the gold replay with each device request
  turned into a tool call); under a correction prompt (either kind) it follows the Validator's
  suggestion ("ask the user to run X(...) on their phone"), its first device action. A check that a
  correction asked for does not use up a turn of the script: after the user's report it drafts the
  same device call again."""

  CHECK = re.compile(r"<\|im_start\|>assistant\nPlease run check_\w+\([^)]*\) on your phone and tell me the result\.")

  def __init__(self, task) -> None:
    self.turns = naive_device_turns(task)

  def __call__(self, prompt: str) -> str:
    last = prompt.rsplit("<|im_start|>user\n", 1)[-1]
    if is_correction_prompt(prompt):
      m = re.search(r"ask the user to run (\w+\([^)]*\))(?: and then \w+\([^)]*\))? on their phone", last)
      return f"Please run {m.group(1)} on your phone and tell me the result." if m else ""
    k = prompt.count("<|im_start|>assistant\n") - 1 - len(self.CHECK.findall(prompt))
    return self.turns[k] if k < len(self.turns) else "Thank you. ###STOP###"


@pytest.mark.parametrize("kind", ["feedback", "paper"])
def test_intervene_groups_end_to_end_on_telecom(kind):
  """The feedback Corrector follows the visible hints, diagnostic-first, and repairs the group; the
  paper Corrector copies the fix that ``suggest_next`` names from the evidence, before any check has
  shown the fault, and the Verifier rejects every such correction (``fix_without_diagnostic``)."""
  task = get_task("[mobile_data_issue]airplane_mode_on|data_mode_off[PERSONA:None]")
  tok = byte_tokenizer()
  fmt = ChatFormatter(tok)
  policy = ScriptedPolicy(tok, NaiveTelecomScript(task), scripted_logp())
  rc = RolloutConfig(group_size=2, max_context_tokens=40_000)
  groups = rollout_groups([task], TelecomEnv, policy, fmt, rc, task_id=lambda t: t.task_id)
  assert [t.reward for t in groups[0]] == [0.0, 0.0]
  roles = InterventionRoles(TelecomRuleValidator(), PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id),
                            TelecomRuleVerifier())
  n_calls = len(policy.calls)
  new, stats = intervene_groups(groups, [task], TelecomEnv, policy, fmt, roles,
                                InterventionConfig(domain="telecom", corrector=kind), rc, task_id=lambda t: t.task_id)
  asked = [c.rsplit("<|im_start|>user\n", 1)[1] for c in policy.calls[n_calls:] if is_correction_prompt(c)]
  assert asked and all((PAPER_CORRECTION_MARKER if kind == "paper" else FEEDBACK_MARKER) in m for m in asked)
  # Only the paper Corrector's message holds the evidence (the speed assertion) and the telecom rule.
  assert all(("assert_internet_speed" in m) == ("Tools of the user's phone are the user's to run" in m) == (kind == "paper")
             for m in asked)
  fixes = [a.name for a in task.actions if a.requestor == "user"]
  assert fixes == ["toggle_airplane_mode", "toggle_data"]
  if kind == "paper":
    # flagged: both device calls and the early stop; each correction asks for a fix nothing has shown
    assert stats.groups_triggered == 1 and stats.steps_flagged == 3 == stats.verifier_rejected
    assert stats.verifier_reasons == {"fix_without_diagnostic": 3}
    assert stats.corrections_applied == 0 and stats.groups_replaced == 0 and new[0] == groups[0]
    return
  # Nothing shows airplane mode at first: the hint asks for the status bar; its report shows airplane mode
  # on, and the airplane fix's own output (a status bar with a signal) then shows data disabled.
  assert stats.groups_triggered == 1 and stats.steps_flagged == len(fixes) + 1 == stats.verifier_accepted
  assert stats.corrections_applied == len(fixes) + 1 and stats.groups_replaced == 1 and stats.verifier_rejected == 0
  winner = new[0][0]
  assert winner.intervened and winner.reward == 1.0 and new[0][1] is groups[0][1]
  texts = [t.text for t in winner.turns if t.intervened]
  assert [re.search(r"run (\w+)", x).group(1) for x in texts] == ["check_status_bar"] + fixes
  a = winner.arrays()
  assert a["intervened_mask"].sum() == sum(t.end - t.start for t in winner.turns if t.intervened)
  assert np.all(a["cal_logp"][a["intervened_mask"] == 1] > a["roll_logp"][a["intervened_mask"] == 1])


D1_VALIDATOR_JSON = ('{"is_valid": false, "error_types": ["user_side_device_action"], "diagnosis": "The call to '
                     'check_network_status is invalid because it corresponds to a user-side device action rather than an '
                     'agent-executable tool call.", "suggest_next": "ask user to call the check_network_status function"}')
D1_CORRECTOR_JSON = json.dumps({"reasoning": D1_CORRECTED.split("<think>\n")[1].split("\n</think>")[0], "tool_calls": [],
                                "content": D1_CORRECTED.split("</think>\n\n")[1]})


def _judge_script(prompt: str) -> str:
  """A judge model answering the App. A.1 tau2 templates as the paper's App. D.1 reports."""
  if VALIDATOR_MARKER in prompt:
    current = prompt.split("## Proposed step", 1)[1].split("## What the task still needs", 1)[0]
    flagged = "tool_call" in current and "check_network_status" in current
    return D1_VALIDATOR_JSON if flagged else '{"is_valid": true, "error_types": [], "diagnosis": "ok", "suggest_next": ""}'
  if CORRECTOR_MARKER in prompt:
    return "<think>\nThe draft calls a device tool.\n</think>\n" + D1_CORRECTOR_JSON
  if VERIFIER_MARKER in prompt:
    return '{"ok": true, "reasons": [], "diagnosis": "leakage: none; hallucinated_tool_result: none"}'
  return ""


def test_llm_roles_with_the_tau2_templates_on_telecom():
  task = get_task(D1_TASK)
  tok = byte_tokenizer()
  fmt = ChatFormatter(tok)
  turns = [D1_DRAFT] + gold_agent_turns(task)
  policy = ScriptedPolicy(tok, lambda p: turns[min(p.count("<|im_start|>assistant\n") - 1, len(turns) - 1)],
                          scripted_logp())
  judge_model = ScriptedPolicy(tok, _judge_script, scripted_logp())
  llm = JudgeLLM(judge_model, fmt, SamplingParams(max_new_tokens=2048, temperature=0.0))
  roles = InterventionRoles(LLMValidator(llm), LLMCorrector(llm), LLMVerifier(llm))
  rc = RolloutConfig(group_size=1, sampling=SamplingParams(max_new_tokens=2048), max_context_tokens=60_000)
  stats = InterventionStats()
  [[traj]] = run_intervened_rollouts([task], TelecomEnv, policy, fmt, roles, InterventionConfig(domain="telecom"), rc,
                                     stats, task_id=lambda t: t.task_id, seed=0)
  assert stats.steps_flagged == 1 and stats.verifier_accepted == 1 and stats.corrections_applied == 1
  assert stats.validator_malformed == stats.corrector_malformed == stats.verifier_malformed == 0
  [fixed] = [t.text for t in traj.turns if t.intervened]
  assert fixed == D1_CORRECTED  # the Corrector JSON written back in the agent format
  assert traj.messages[traj.messages.index({"role": "assistant", "content": fixed}) + 1]["content"].startswith(
    "I ran check_network_status:")
  assert traj.reward == 1.0
  prompts = [c for c in judge_model.calls if VALIDATOR_MARKER in c]
  assert prompts and all("USER_SIDE_DEVICE_ACTION" in c and "toggle_airplane_mode" in c for c in prompts)


# --- the trainer's task source ----------------------------------------------------------------------


def test_telecom_source():
  cfg = ExperimentConfig()
  cfg.env.name, cfg.env.max_turns, cfg.env.seed = "telecom", 30, 3
  src = telecom_source(cfg)
  assert (len(src.train), len(src.test)) == (74, 40) and src.domain == "telecom" and src.tool_schemas is None
  assert not {src.task_id(t) for t in src.train} & {src.task_id(t) for t in src.test}
  env = src.env_factory()
  assert isinstance(env, TelecomEnv) and env.max_turns == 30 and env.seed == 3
  assert env is not src.env_factory()
  counts = {k: sum(map(pred, src.train)) for k, pred in src.subsets.items()}
  assert counts["mms_issue"] + counts["mobile_data_issue"] + counts["service_issue"] == 74
  assert counts["hard_persona"] == sum(t.task_id.endswith("[PERSONA:Hard]") for t in src.train)
  short = telecom_source(cfg, policy="Help the user.").env_factory()
  assert short.reset(src.train[0])[0]["content"].startswith("Help the user.")
  cfg.env.max_turns = 31
  with pytest.raises(ValueError, match="max_turns"):
    telecom_source(cfg)
  cfg.env.max_turns = 30
  with pytest.raises(ValueError, match="policy"):
    telecom_source(cfg, policy="  ")


def test_bad_input_never_crashes():
  env = env_after(REFUEL_TASK, [ASK_PHONE])
  ctx = ctx_of(env, "")
  odd = ["", "<tool_call>{not json</tool_call>", tool_call_text("refuel_data", {"line_id": {"x": [1]}, "gb_amount": None}),
         tool_call_text("no_such_tool", {"a": 1}), "###STOP###" * 3, "I ran toggle_data: " * 50]
  for draft in odd:
    j = VALIDATOR.judge(StepContext(ctx.user_query, ctx.history, draft, ctx.tools, {}, "telecom"))
    assert isinstance(j.is_valid, bool)
    v = VERIFIER.judge(StepContext(ctx.user_query, ctx.history, "", ctx.tools, {}, "telecom"), draft)
    assert isinstance(v.ok, bool)
  bad = VALIDATOR.judge(dataclasses.replace(ctx, draft=odd[2]))
  assert FABRICATED_ARGUMENTS in bad.error_types
  for reply in (None, "", "<think>\nhmm\n</think>", "<tool_call>{not json</tool_call>"):
    v = VERIFIER.judge(ctx, reply)  # type: ignore[arg-type]
    assert not v.ok and "malformed_reply" in v.reasons
