"""A device fix asked before the conversation shows its need leaks the evidence (``fix_without_diagnostic``).

For every fix kind: the fix asked with nothing shown, or after a check showed the setting fine, is
rejected; the same fix after the user's report shows the fault is accepted. The Validator's visible
hint asks for the check first and names the fix once the check shows the fault; the evidence-built
``suggest_next`` names the fix at once (the paper's channel, which the Verifier polices). The rule
agrees with a state-based reference (``telecom_state_reference``) on every gold step."""

from __future__ import annotations

import copy
import re

import pytest

from rti_jax.envs.telecom import DescribedGoldAgent, GoldAgent, TelecomEnv, load_split
from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom.scripted_agents import tool_call_text
from rti_jax.intervention import StepContext, TelecomRuleValidator, TelecomRuleVerifier
from rti_jax.intervention.telecom_evidence import device_requests
from rti_jax.intervention.telecom_fixes import FIX_DIRECTION, FIX_RULES, readings_in, unjustified_fixes
from telecom_state_reference import FAULTS, shown_by_state
from telecom_fixtures import ctx_of, env_after, replay_steps

VALIDATOR = TelecomRuleValidator()
VERIFIER = TelecomRuleVerifier()
ASK_PHONE = "I can help with that. Could you please give me your phone number?"
REFUEL_TASK = "[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]"
ROAMING_ON_TASK = "[mms_issue]bad_network_preference|user_abroad_roaming_disabled_on[PERSONA:None]"


def ask(tool_text: str) -> str:
  return f"Please run {tool_text} on your phone and tell me the result."


#: fix -> (the fix in plain words, its call, the check, a task with the fault, a task where the setting is fine)
CASES = {
  "toggle_airplane_mode": ("Please turn off airplane mode.", "toggle_airplane_mode()", "check_status_bar()",
                           "[mobile_data_issue]airplane_mode_on|data_mode_off[PERSONA:None]", REFUEL_TASK),
  "toggle_data": ("Please turn on your mobile data.", "toggle_data()", "check_network_status()", REFUEL_TASK,
                  "[mobile_data_issue]data_saver_mode_on|data_usage_exceeded[PERSONA:Easy]"),
  "toggle_roaming": ("Please turn on data roaming on your phone.", "toggle_roaming()", "check_network_status()",
                     "[mobile_data_issue]data_usage_exceeded|user_abroad_roaming_enabled_off[PERSONA:Easy]",
                     ROAMING_ON_TASK),
  "toggle_data_saver_mode": ("Please turn off Data Saver mode.", "toggle_data_saver_mode()",
                             "check_data_restriction_status()",
                             "[mobile_data_issue]data_saver_mode_on|data_usage_exceeded[PERSONA:Easy]", REFUEL_TASK),
  "toggle_wifi_calling": ("Please turn off Wi-Fi Calling.", "toggle_wifi_calling()", "check_wifi_calling_status()",
                          "[mms_issue]bad_wifi_calling|data_mode_off|data_usage_exceeded[PERSONA:Easy]", REFUEL_TASK),
  "reset_apn_settings": ("Please reset your APN settings to the default.", "reset_apn_settings()",
                         "check_apn_settings()", "[service_issue]airplane_mode_on|break_apn_settings[PERSONA:Hard]",
                         REFUEL_TASK),
  "reseat_sim_card": ("Please take out your SIM card and put it back in.", "reseat_sim_card()", "check_sim_status()",
                      "[service_issue]airplane_mode_on|unseat_sim_card[PERSONA:None]", REFUEL_TASK),
  "grant_app_permission": ("Please grant the messaging app the storage permission.",
                           'grant_app_permission(app_name="messaging", permission="storage")',
                           'check_app_permissions(app_name="messaging")',
                           "[mms_issue]break_app_storage_permission|data_usage_exceeded[PERSONA:Easy]", REFUEL_TASK),
  "set_network_mode_preference": ("Please change your preferred network mode to 4G/5G preferred.",
                                  'set_network_mode_preference(mode="4g_5g_preferred")',
                                  "check_network_mode_preference()", ROAMING_ON_TASK, REFUEL_TASK),
  "disconnect_vpn": ("Please disconnect your VPN.", "disconnect_vpn()", "check_vpn_status()",
                     "[mobile_data_issue]bad_vpn|data_saver_mode_on|user_abroad_roaming_disabled_on[PERSONA:None]",
                     REFUEL_TASK),
}


def test_the_table_covers_every_gold_device_fix_and_names_real_checks():
  gold = {a.name for t in load_split("base") for a in t.actions if a.requestor == "user"}
  assert gold - set(FIX_RULES) == {"reboot_device", "make_payment"}  # a generic step, and the agent's own request
  assert set(CASES) == set(FIX_RULES) - {"set_apn_settings"}  # set_apn_settings: the same rule as the reset
  for rule in FIX_RULES.values():
    assert rule.diagnostic in rule.shown_by and not dt.DEVICE_TOOLS[rule.diagnostic].writes
    assert set(rule.shown_by) <= set(dt.DEVICE_TOOLS) and rule.fix in dt.DEVICE_TOOLS
    assert set(rule.diagnostic_args) <= set(dt.DEVICE_TOOLS[rule.diagnostic].params)
  # toggles: the fault is the state the fix direction changes
  for tool, way in FIX_DIRECTION.items():
    assert FIX_RULES[tool].fault is (way == "off"), tool


@pytest.mark.parametrize("tool", sorted({t for r in FIX_RULES.values() for t in r.shown_by}))
def test_readers_read_what_the_outputs_show(tool):
  """On the initial state of every base task, each device output the table names: the readings the
  text gives equal the state-based reference's (every setting, every value)."""
  for task in load_split("base"):
    env = TelecomEnv()
    env.reset(task)
    state = copy.deepcopy(env.state)
    args = {"app_name": "messaging"} if "app_name" in dt.DEVICE_TOOLS[tool].params else {}
    if tool == "grant_app_permission":
      args["permission"] = "storage"
    if tool == "set_network_mode_preference":
      args["mode"] = "3g_only"
    if tool == "set_apn_settings":
      args["apn_settings"] = {"apn_name": "internet"}
    output, ok = dt.run_device_tool(state, tool, args)
    assert ok, output
    got = {r.setting: r.value for r in readings_in([f"I ran {tool}: {output}"])}
    want = shown_by_state(tool, args, state.phone)
    if tool in ("check_app_permissions", "check_app_status", "grant_app_permission"):
      got = {k: v for k, v in got.items() if k in want}  # the reader lists every permission name
    assert got == want, (task.task_id, output)


def test_readers_read_the_users_already_set_replies():
  env = env_after(REFUEL_TASK, [ASK_PHONE, "Please make sure airplane mode is off."])
  assert env.transcript.messages[-1]["content"] == "Airplane mode is already OFF."
  assert [(r.setting, r.value) for r in readings_in([env.transcript.messages[-1]["content"]])] == [("airplane_mode", False)]
  assert "fix_without_diagnostic" in VERIFIER.judge(ctx_of(env), "Please turn off airplane mode.").reasons


@pytest.mark.parametrize("fix", sorted(CASES))
def test_each_fix_rejected_unseen_or_fine_and_accepted_after_the_fault_is_shown(fix):
  words, call, check, fault_task, fine_task = CASES[fix]
  named = ask(call)
  thinks = f"<think>\nThe user has to run {call} next; first I ask for a check.\n</think>\n\n{ask(check)}"
  env = env_after(fault_task, [ASK_PHONE])
  ctx = ctx_of(env)
  for text in (words, named, thinks):
    v = VERIFIER.judge(ctx, text)
    assert v.reasons == ("fix_without_diagnostic",), (text, v.reasons)
    assert fix in v.diagnosis and "nothing the user reported" in v.diagnosis
  assert VERIFIER.judge(ctx, ask(check)).ok  # the check itself is always fine
  # the Validator's hints on the draft that calls the fix itself
  j = VALIDATOR.judge(ctx_of(env, tool_call_text(fix, _args(call))))
  assert f"ask the user to run {check} on their phone" in j.visible_suggest_next, j.visible_suggest_next
  assert fix + "(" in j.suggest_next  # the evidence-built hint names the fix ...
  assert "fix_without_diagnostic" in VERIFIER.judge(ctx, _written(j.suggest_next)).reasons  # ... and is policed
  assert VERIFIER.judge(ctx, _written(j.visible_suggest_next)).ok
  # after the check shows the fault: accepted, and the visible hint names the fix
  env.step(ask(check))
  ctx = ctx_of(env)
  for text in (words, named):
    v = VERIFIER.judge(ctx, text)
    assert v.ok, (text, v.diagnosis)
  j = VALIDATOR.judge(ctx_of(env, tool_call_text(fix, _args(call))))
  assert j.visible_suggest_next.startswith(f"Do not call {fix} yourself: ask the user to run {fix}(")
  assert VERIFIER.judge(ctx, _written(j.visible_suggest_next)).ok
  # after a check shows the setting fine: rejected, and the visible hint does not ask the check again
  env = env_after(fine_task, [ASK_PHONE, ask(check)])
  v = VERIFIER.judge(ctx_of(env), words)
  assert v.reasons == ("fix_without_diagnostic",) and "already fine" in v.diagnosis, v.diagnosis
  j = VALIDATOR.judge(ctx_of(env, tool_call_text(fix, _args(call))))
  assert "already fine" in j.visible_suggest_next and "ask the user to run" not in j.visible_suggest_next


def _args(call: str) -> dict[str, str]:
  return dict(re.findall(r'(\w+)="([^"]*)"', call))


def _written(hint: str) -> str:
  """The message a Corrector writes from a hint: its first "ask the user to run X(...)"."""
  m = re.search(r"ask the user to run (\w+\([^)]*\))", hint)
  assert m, hint
  return ask(m.group(1))


def test_the_rule_can_be_switched_off():
  env = env_after(REFUEL_TASK, [ASK_PHONE])
  assert VERIFIER.judge(ctx_of(env), "Please turn on your mobile data.").reasons == ("fix_without_diagnostic",)
  assert TelecomRuleVerifier(check_fixes=False).judge(ctx_of(env), "Please turn on your mobile data.").ok


def test_a_toggle_asked_the_other_way_is_not_this_rule():
  env = env_after(REFUEL_TASK, [ASK_PHONE])
  v = VERIFIER.judge(ctx_of(env), "Please turn on airplane mode.")
  assert "fix_without_diagnostic" not in v.reasons and v.reasons == ("not_improved",)  # GOAL_DRIFT's to judge
  assert VERIFIER.judge(ctx_of(env), "Please restart your phone.").ok  # a generic step


def test_d2_pair_adapted():
  """App. D.2's two corrections. The leaking one (APN reset and reboot, nothing shown) is rejected,
  now also for the fix; the clean one (toggle_data) is accepted once a check shows data off."""
  d2 = ("[mms_issue]airplane_mode_on|bad_network_preference|bad_wifi_calling|break_apn_mms_setting|"
        "break_app_sms_permission|data_mode_off|data_usage_exceeded|unseat_sim_card|user_abroad_roaming_enabled_off"
        "[PERSONA:None]")
  apn = "Please run reset_apn_settings() to restore the configuration, then run reboot_device() to apply it."
  clean = ("Let's proceed with enabling mobile data. Since toggle_data() is a function you need to run on your device, "
           "please execute toggle_data() now to turn mobile data ON. After that, run check_network_status() to see if "
           "your phone connects to a better network (3G/4G). Let me know the results so we can determine the next steps.")
  env = env_after(d2, [ASK_PHONE])
  v = VERIFIER.judge(ctx_of(env), apn)
  assert v.reasons == ("fix_without_diagnostic",) and "reset_apn_settings" in v.diagnosis
  assert "reboot_device" not in v.diagnosis  # the reboot needs no check
  assert VERIFIER.judge(ctx_of(env), clean).reasons == ("fix_without_diagnostic",)
  env.step(ask("check_network_status()"))
  assert "Mobile data: OFF" in env.transcript.messages[-1]["content"]
  v = VERIFIER.judge(ctx_of(env), clean)
  assert v.ok, v.diagnosis
  assert VERIFIER.judge(ctx_of(env), apn).reasons == ("fix_without_diagnostic",)  # the APN is still unseen
  env.step(ask("check_apn_settings()"))
  assert VERIFIER.judge(ctx_of(env), apn).ok


def test_a_later_report_overrides_an_earlier_one():
  env = env_after(REFUEL_TASK, [ASK_PHONE, ask("check_network_status()")])
  assert VERIFIER.judge(ctx_of(env), "Please turn on your mobile data.").ok
  env.step("Please turn on your mobile data.")
  assert "Mobile data is now ON" in env.transcript.messages[-1]["content"]
  v = VERIFIER.judge(ctx_of(env), "Please turn on your mobile data.")
  assert v.reasons == ("fix_without_diagnostic",) and "already fine" in v.diagnosis
  # the assistant's own words are not evidence
  ctx = ctx_of(env_after(REFUEL_TASK, [ASK_PHONE]))
  said = ({"role": "assistant", "content": "I ran check_network_status: Mobile data: OFF."},
          {"role": "user", "content": "Okay."})
  ctx = StepContext(ctx.user_query, ctx.history + said, "", ctx.tools, ctx.evidence, "telecom")
  assert VERIFIER.judge(ctx, "Please turn on your mobile data.").reasons == ("fix_without_diagnostic",)


@pytest.mark.parametrize("agent_cls", [GoldAgent, DescribedGoldAgent])
def test_rule_agrees_with_the_state_reference_on_every_gold_step(agent_cls):
  """The gold replay asks for fixes straight from the evidence (no checks): on every step of the 114
  tasks, the Verifier flags a fix exactly when the state-based reference finds no output that showed
  its fault."""
  flagged = expected = fixes = 0
  for env, draft, tracker in replay_steps(agent_cls, load_split("base")):
    asked = [r for r in device_requests(draft) if r.tool in FAULTS]
    unbacked = any(not tracker.backed(r.tool, r.arguments) for r in asked)
    got = [u.fix for u in unjustified_fixes(ctx_of(env), draft)]
    assert bool(got) == unbacked, (env.transcript.task_id, draft, got)
    fixes += len(asked)
    expected += unbacked
    flagged += bool(got)
  # most gold fixes come unseen; the rest are shown by an earlier fix's output (a status bar)
  assert flagged == expected == 290 and fixes == 355


def test_readers_are_linear_on_long_reports():
  import time

  def seconds(n: int) -> float:
    text = ("Status bar: Signal | Data Enabled | APN settings: APN name x, MMSC URL " + "y" * 50 + " ") * n
    t = time.process_time()  # this process's CPU: other processes on the cores do not count
    readings_in([text, "messaging permissions granted: " + "a, " * (n * 20)])
    return time.process_time() - t

  small, large = min(seconds(100) for _ in range(3)), min(seconds(800) for _ in range(3))
  assert large < 2.0 and large < 24 * max(small, 1e-2), (small, large)


def test_the_fix_rule_is_a_config_switch_of_the_rule_roles():
  from rti_jax.config import ConfigError, load_config
  from rti_jax.envs.telecom.registration import TelecomOptions
  from rti_jax.intervention import pipeline

  assert load_config("telecom").env.telecom.fix_rule is True
  assert load_config("telecom", ["env.telecom.fix_rule=false"]).env.telecom.fix_rule is False
  with pytest.raises(ConfigError, match="env.telecom.fix_rule"):
    load_config("navigation", ["env.telecom.fix_rule=false"])
  env = env_after("[service_issue]airplane_mode_on|unseat_sim_card[PERSONA:None]", [])
  draft = "Please take out your SIM card and put it back in."
  on = pipeline.rule_roles("telecom")[1].judge(ctx_of(env, draft), draft)
  off = pipeline.rule_roles("telecom", TelecomOptions(fix_rule=False))[1].judge(ctx_of(env, draft), draft)
  assert "fix_without_diagnostic" in on.reasons and off.ok
