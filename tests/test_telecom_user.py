"""The scripted tau2-Telecom user: request mapping, identity, offers, goal and determinism."""

import pytest

from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.tasks import get_task, load_tasks
from rti_jax.envs.telecom.user_sim import ScriptedUser, find_requests, first_person, goal_of, profile_of

MMS_ALL = ("[mms_issue]airplane_mode_on|bad_network_preference|bad_wifi_calling|break_apn_mms_setting|"
           "break_app_both_permissions|data_mode_off|data_usage_exceeded|unseat_sim_card|"
           "user_abroad_roaming_disabled_off[PERSONA:Hard]")
DATA_AT_HOME = "[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]"
SERVICE = "[service_issue]airplane_mode_on|overdue_bill_suspension[PERSONA:None]"


def _user(task_id, seed=0):
  task = get_task(task_id)
  return ScriptedUser(task, st.initialize(list(task.init_actions)), seed=seed)


@pytest.mark.parametrize("message, expected", [
    ("Please turn off airplane mode.", [("toggle_airplane_mode", {})]),
    ("Could you check your status bar and tell me what you see?", [("check_status_bar", {})]),
    ("Please make sure mobile data is turned on.", [("toggle_data", {})]),
    ("Can you toggle your wifi calling off?", [("toggle_wifi_calling", {})]),
    ("Let's reset your APN settings and then restart your phone.", [("reset_apn_settings", {}), ("reboot_device", {})]),
    ("Please grant the messaging app the storage permission.",
     [("grant_app_permission", {"app_name": "messaging", "permission": "storage"})]),
    ("Please change your network mode to 4G/5G preferred.", [("set_network_mode_preference", {"mode": "4g_5g_preferred"})]),
    ("Please run a speed test.", [("run_speed_test", {})]),
    ("Could you try sending an MMS again?", [("can_send_mms", {})]),
    ("I've enabled roaming on your line. Now please turn on data roaming on your phone.", [("toggle_roaming", {})]),
    ("Would you like me to enable roaming on your line?", []),
    ("Please remove and reinsert your SIM card.", [("reseat_sim_card", {})]),
    ("Please disconnect your VPN.", [("disconnect_vpn", {})]),
    ("Please turn off Data Saver mode.", [("toggle_data_saver_mode", {})]),
    ("Please run the check_network_status function on your device and send me the result.",
     [("check_network_status", {})]),
    ("Please run get_status_bar.", [("check_status_bar", {})]),  # the tasks' outdated name
    ('Run grant_app_permission(app_name="messaging", permission="sms") now.',
     [("grant_app_permission", {"app_name": "messaging", "permission": "sms"})]),
    ("1. Run reset_apn_settings() to restore the network configuration. 2. Then run reboot_device().",
     [("reset_apn_settings", {}), ("reboot_device", {})]),
    ("Please run toggle_wifi_calling() on your phone.", [("toggle_wifi_calling", {})]),
    ("Hello, how are you today?", []),
    ("Would you like to switch to a plan with more data?", []),
    ("Your data usage is over the limit; please turn on mobile data anyway.", [("toggle_data", {})]),
    ('Run set_apn_settings(apn_name="internet", mmsc_url="http://mms.carrier.com/mms/wapenc"). Then reboot.',
     [("set_apn_settings", {"apn_name": "internet", "mmsc_url": "http://mms.carrier.com/mms/wapenc"}),
      ("reboot_device", {})]),
])
def test_requests_are_mapped_to_device_tools(message, expected):
  requests, unclear = find_requests(message, st.fresh_state().phone)
  assert [(r.tool, r.arguments) for r in requests] == expected
  assert unclear == []


def test_it_refers_to_the_setting_mentioned_last():
  phone = st.fresh_state().phone
  requests, _ = find_requests("Airplane mode is on. Please turn it off.", phone)
  assert [(r.tool, r.direction) for r in requests] == [("toggle_airplane_mode", "off")]
  requests, _ = find_requests("Please switch it off.", phone, prior_feature="vpn")
  assert [r.tool for r in requests] == ["disconnect_vpn"]
  assert find_requests("Please turn it off.", phone) == ([], [])
  user = _user(MMS_ALL)  # across turns: the user remembers what the agent spoke of
  user.respond("I see airplane mode is enabled on your phone.")
  reply = user.respond("Please turn it off.")
  assert [c.name for c in reply.tool_calls] == ["toggle_airplane_mode"] and not user.state.phone.airplane_mode


def test_incomplete_request_asks_for_the_missing_argument():
  user = _user(MMS_ALL)
  reply = user.respond("Please grant the permission to the messaging app.")
  assert reply.tool_calls == [] and "Which settings should I use for grant_app_permission?" in reply.content


def test_unmappable_message_gets_a_clarification_and_is_counted():
  user = _user(DATA_AT_HOME)
  reply = user.respond("Let us consider the broader implications.")
  assert not reply.understood and reply.stop is None and "?" in reply.content
  assert user.unmapped == 1


def test_identity_answers_come_from_known_info_only():
  user = _user(MMS_ALL)
  reply = user.respond("Could you give me your phone number and your full name?")
  assert "555-123-2002" in reply.content and "John Smith" in reply.content
  reply = user.respond("What is your date of birth?")
  assert "1985" not in reply.content and "don't have my date of birth" in reply.content
  assert "abroad in France" in user.respond("Where are you currently located?").content
  service = _user(SERVICE)  # its known_info gives no location
  assert "France" not in service.respond("Are you currently abroad?").content


def test_offers_follow_task_instructions():
  user = _user(DATA_AT_HOME)
  assert "Yes, please add 2 GB of data." in user.respond("Would you like me to refuel 2 GB of data for $4?").content
  plan_reply = user.respond("Would you like to switch to a plan with more data?")
  assert plan_reply.content == "No, I don't want to change my plan." and plan_reply.tool_calls == []
  assert user.respond("Is there anything else I can help you with?").content == "Yes, my problem is not solved yet."
  service = _user(SERVICE)
  assert "Yes, I'll pay the bill." in service.respond("Would you like me to help you pay the overdue bill?").content


def test_device_action_reports_the_real_output():
  user = _user(MMS_ALL)
  expected_state = st.initialize(list(get_task(MMS_ALL).init_actions))
  expected_output = dt.toggle_airplane_mode(expected_state)
  reply = user.respond("Please turn off airplane mode.")
  assert [c.name for c in reply.tool_calls] == ["toggle_airplane_mode"]
  assert reply.tool_calls[0].output == expected_output and expected_output in reply.content
  assert user.state.phone.airplane_mode is False


def test_direction_is_honoured_for_settings_already_set():
  user = _user(DATA_AT_HOME)  # airplane mode is off in this task
  reply = user.respond("Please turn off airplane mode.")
  assert reply.tool_calls == [] and "Airplane mode is already OFF." in reply.content
  assert user.state.phone.airplane_mode is False


def test_agent_side_statements_are_not_requests():
  requests, _ = find_requests("I have enabled roaming on your line and refueled your data.", st.fresh_state().phone)
  assert requests == []


def test_user_stops_only_when_a_tool_shows_the_goal():
  user = _user(DATA_AT_HOME)
  assert user.respond("Please run a speed test.").stop is None  # data is off: no connection
  user.respond("Please turn on your mobile data.")
  line = st.find_record(user.state.db, "lines", "line_id", "L1002")
  line["data_refueling_gb"] = 2.0
  st.sync_surroundings(user.state)
  reply = user.respond("Please run a speed test now.")
  assert reply.stop == "user_stop" and "excellent" in reply.content and reply.content.endswith("###STOP###")


def test_frustration_after_an_unsuccessful_fix():
  user = _user(DATA_AT_HOME)
  user.respond("Please turn on your mobile data.")
  first = user.respond("Please run a speed test.")
  second = user.respond("Is it working now?")
  assert "Hmm, that didn't fix it." in first.content and "It's still not working." in second.content


def test_transfer_ends_the_call():
  user = _user(SERVICE)
  assert user.respond("Anything.", transferred=True).stop == "transfer"
  assert _user(SERVICE).respond("YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.").stop == "transfer"


def test_deterministic_given_seed():
  a, b = _user(MMS_ALL, seed=3), _user(MMS_ALL, seed=3)
  assert a.opening() == b.opening()
  msg = "Please turn off airplane mode. Is it working now?"
  assert a.respond(msg).content == b.respond(msg).content
  openings = {_user(DATA_AT_HOME, seed=s).opening() for s in range(8)}
  assert len(openings) > 1  # the seed varies the phrasing


def test_opening_states_the_problem_in_first_person():
  opening = _user(DATA_AT_HOME).opening()
  assert "My mobile data is not working properly" in opening and "You " not in opening
  assert "at home in the United States" in opening
  hard = _user(MMS_ALL).opening()  # Hard personas only share their location when asked
  assert "France" not in hard
  assert first_person("You want to fix your phone.") == "I want to fix my phone."


def test_goals_and_profiles_of_every_task():
  goals = {t.issue_type: goal_of(t).name for t in load_tasks().values()}
  assert goals == {"mms_issue": "mms", "mobile_data_issue": "speed", "service_issue": "signal"}
  for task in load_tasks().values():
    profile = profile_of(task)
    assert (profile.name, profile.phone_number) == ("John Smith", "555-123-2002")
    assert profile.refuel_gb == (None if task.issue_type == "service_issue" else 2.0)
    assert profile.pays_bills == (task.issue_type == "service_issue")
    assert not profile.accepts_plan_change
