"""tau2-Telecom tools: the device model (speed, MMS), device fixes and agent tools."""

import inspect
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from rti_jax.envs.telecom import agent_tools as at
from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom import state as st


def _healthy(abroad=False):
  state = st.fresh_state()
  state.surroundings.phone_number = "555-123-2002"
  state.surroundings.is_abroad = abroad
  st.sync_surroundings(state)
  st.network_search(state)
  return state


def _speed_reference(tech, signal, saver, poor_vpn):
  """Independent re-derivation of the documented speed model with numpy: the middle of the
  technology's range x the signal factor x 0.2 (Data Saver) x 0.1 (poor VPN), to 0.01."""
  lo, hi = {"5G": (50.0, 500.0), "4G": (10.0, 100.0), "3G": (1.0, 5.0), "2G": (0.1, 0.4)}[tech]
  factor = {"excellent": 1.0, "good": 0.8, "fair": 0.5, "poor": 0.2}[signal]
  mbps = round(float(np.mean([lo, hi])) * factor * (0.2 if saver else 1.0) * (0.1 if poor_vpn else 1.0), 2)
  labels = np.array(["very poor", "poor", "fair", "good", "excellent"])
  return mbps, str(labels[np.digitize(mbps, [1.0, 5.0, 25.0, 100.0])])


@settings(max_examples=150, deadline=None, derandomize=True)
@given(mode=hst.sampled_from(st.NETWORK_MODES), signal=hst.sampled_from(["poor", "fair", "good", "excellent"]),
       saver=hst.booleans(), vpn=hst.sampled_from(["off", "excellent", "poor"]))
def test_speed_model_matches_reference(mode, signal, saver, vpn):
  state = st.fresh_state()
  state.surroundings.phone_number = "555-123-2002"
  state.surroundings.signal_strength = dict.fromkeys(("2G", "3G", "4G", "5G"), signal)
  p = state.phone
  p.network_mode_preference, p.data_saver_mode = mode, saver
  p.vpn_connected, p.vpn_performance = vpn != "off", (None if vpn == "off" else vpn)
  st.sync_surroundings(state)
  st.network_search(state)
  mbps, label = dt.internet_speed(state)
  ref_mbps, ref_label = _speed_reference(p.network_technology_connected, signal, saver, vpn == "poor")
  assert mbps == pytest.approx(ref_mbps) and label == ref_label
  assert dt.run_speed_test(state) == f"Speed test: {ref_mbps:.2f} Mbps download ({ref_label})."


def test_speeds_where_the_user_is():
  """The default surroundings (5G excellent, 4G good, 3G fair, 2G poor): 5G 275 Mbit/s, excellent."""
  state = _healthy()
  assert dt.internet_speed(state) == (275.0, "excellent")
  dt.toggle_data_saver_mode(state)
  assert dt.internet_speed(state) == (55.0, "good")
  dt.toggle_data_saver_mode(state)
  for mode, want in (("4g_only", (44.0, "good")), ("3g_only", (1.5, "poor")), ("2g_only", (0.05, "very poor"))):
    dt.set_network_mode_preference(state, mode)
    assert dt.internet_speed(state) == want, mode


def test_no_data_means_no_connection():
  state = _healthy()
  dt.toggle_data(state)
  assert dt.internet_speed(state) == (None, "no connection")
  assert dt.run_speed_test(state) == "Speed test: no connection."


@settings(max_examples=200, deadline=None, derandomize=True)
@given(abroad=hst.booleans(), phone_roaming=hst.booleans(), line_roaming=hst.booleans(), data=hst.booleans(),
       exhausted=hst.booleans(), mode=hst.sampled_from(st.NETWORK_MODES), mmsc=hst.booleans(),
       wfc=hst.booleans(), mms_wifi=hst.booleans(), sms=hst.booleans(), storage=hst.booleans())
def test_mms_matches_brute_force(abroad, phone_roaming, line_roaming, data, exhausted, mode, mmsc, wfc,
                                 mms_wifi, sms, storage):
  state = _healthy(abroad)
  line = st.find_record(state.db, "lines", "line_id", "L1002")
  line["roaming_enabled"], line["data_used_gb"] = line_roaming, (20.0 if exhausted else 1.0)
  p = state.phone
  p.roaming_enabled, p.data_enabled, p.network_mode_preference = phone_roaming, data, mode
  p.active_apn_settings.mmsc_url = "http://mms.example" if mmsc else None
  p.wifi_calling_enabled, p.wifi_calling_mms_over_wifi = wfc, mms_wifi
  p.app_permissions["messaging"].update(sms=sms, storage=storage)
  st.sync_surroundings(state)
  st.network_search(state)
  data_ok = data and not exhausted and (not abroad or (phone_roaming and line_roaming))
  expected = data_ok and mode != "2g_only" and mmsc and not (wfc and mms_wifi) and sms and storage
  assert dt.can_send_mms_now(state) == expected
  assert ("can send" in dt.can_send_mms(state)) == expected


def test_reset_apn_applies_only_at_reboot():
  state = _healthy()
  st.apply_init_action(state, "user", "break_apn_settings", {})
  st.network_search(state)
  assert state.phone.network_connection_status == "no_service"
  assert "APN name broken" in dt.check_apn_settings(state)
  dt.reset_apn_settings(state)
  assert state.phone.active_apn_settings.apn_name == st.BROKEN_APN_NAME
  assert state.phone.network_connection_status == "no_service"
  out = dt.reboot_device(state)
  assert state.phone.active_apn_settings == st.ApnSettings() and not state.phone.apn_reset_pending
  assert state.phone.network_connection_status == "connected" and "Signal 4 bars (excellent) 5G" in out


def test_set_apn_settings_takes_an_object():
  state = _healthy()
  out, ok = dt.run_device_tool(state, "set_apn_settings", {"apn_settings": {"apn_name": "broken"}})
  assert ok and state.phone.network_connection_status == "no_service"
  out, ok = dt.run_device_tool(state, "set_apn_settings", {"apn_settings": {"apn_name": "internet", "mmsc_url": None}})
  assert ok and state.phone.network_connection_status == "connected" and not dt.can_send_mms_now(state)
  for bad in ({"apn_name": "wap"}, {"proxy": "x"}, "internet", {"mms_port": "80"}):
    out, ok = dt.run_device_tool(state, "set_apn_settings", {"apn_settings": bad})
    assert not ok and out.startswith("Error"), bad
  assert state.phone.active_apn_settings.mmsc_url is None  # the bad calls changed nothing
  out, ok = dt.run_device_tool(state, "set_apn_settings", {"apn_name": "internet", "mmsc_url": "x"})
  assert not ok and "missing ['apn_settings']" in out


def test_toggles_flip_and_resync():
  state = _healthy()
  dt.connect_vpn(state)
  assert "Airplane mode is now ON" in dt.toggle_airplane_mode(state)
  assert state.phone.network_connection_status == "no_service" and not state.phone.vpn_connected
  assert dt.check_status_bar(state) == "Status bar: Airplane Mode | Battery 80%"
  assert dt.toggle_wifi(state).startswith("Wi-Fi cannot be changed while Airplane Mode is ON")
  dt.toggle_airplane_mode(state)
  assert state.phone.network_connection_status == "connected"
  assert not state.phone.vpn_connected  # airplane mode dropped the VPN for good
  for tool, attr in (("toggle_data", "data_enabled"), ("toggle_roaming", "roaming_enabled"),
                     ("toggle_data_saver_mode", "data_saver_mode"), ("toggle_wifi_calling", "wifi_calling_enabled"),
                     ("toggle_wifi", "wifi_enabled")):
    before = getattr(state.phone, attr)
    out, ok = dt.run_device_tool(state, tool, {})
    assert ok and getattr(state.phone, attr) is (not before), out


def test_sim_reseat_and_lock():
  state = _healthy()
  st.apply_init_action(state, "user", "unseat_sim_card", {})
  st.network_search(state)
  assert dt.check_sim_status(state).startswith("SIM status: Missing")
  dt.reseat_sim_card(state)
  assert state.phone.network_connection_status == "connected"
  st.apply_init_action(state, "user", "lock_sim_card", {"mode": "pin"})
  dt.reseat_sim_card(state)  # reseating does not unlock a PIN-locked SIM
  assert state.phone.network_connection_status == "no_service"
  assert "Locked (PIN required)" in dt.check_sim_status(state)


def test_permissions_vpn_and_network_mode():
  state = _healthy()
  st.apply_init_action(state, "user", "remove_app_permission", {"app_name": "messaging", "permission": "sms"})
  assert "sms" not in dt.check_app_permissions(state, "messaging")
  out, ok = dt.run_device_tool(state, "grant_app_permission", {"app_name": "messaging", "permission": "sms"})
  assert ok and state.phone.app_permissions["messaging"]["sms"] is True
  st.apply_init_action(state, "user", "break_vpn", {})
  assert dt.check_vpn_status(state) == "VPN: ON and connected. Performance: Poor."
  assert dt.internet_speed(state) == (27.5, "good")
  dt.disconnect_vpn(state)
  assert not state.phone.vpn_connected and dt.internet_speed(state) == (275.0, "excellent")
  assert dt.connect_vpn(state) == "VPN: ON and connected. Performance: Poor."  # the broken server again
  assert dt.connect_vpn(state) == "VPN already connected."
  dt.disconnect_vpn(state)
  assert dt.disconnect_vpn(state) == "No active VPN connection to disconnect."
  out, ok = dt.run_device_tool(state, "set_network_mode_preference", {"mode": "3g_only"})
  assert ok and state.phone.network_technology_connected == "3G"


def test_device_tool_bad_input_is_an_error_not_a_crash():
  state = _healthy()
  assert dt.run_device_tool(state, "fly", {}) == ("Error: 'fly' is not a device tool.", False)
  out, ok = dt.run_device_tool(state, "set_network_mode_preference", {"mode": "6g"})
  assert not ok and "mode must be one of" in out and "'6g'" in out
  out, ok = dt.run_device_tool(state, "grant_app_permission", {"app_name": "messaging"})
  assert not ok and "missing ['permission']" in out
  out, ok = dt.run_device_tool(state, "check_app_permissions", {"app_name": "camera"})
  assert not ok and "installed app" in out
  out, ok = dt.run_device_tool(state, "make_payment", {})
  assert not ok and "no payment request" in out


def test_payment_flow_between_agent_and_user():
  state = _healthy()
  st.suspend_line_for_overdue_bill(state, "C1001", "L1002", "B9", contract_ended=False)
  assert state.phone.network_connection_status == "connected"  # until the phone searches the network
  st.sync_surroundings(state)
  st.network_search(state)
  assert state.phone.network_connection_status == "no_service"
  out, ok = at.run_agent_tool(state, "send_payment_request", {"customer_id": "C1001", "bill_id": "B9"})
  assert ok and st.find_record(state.db, "bills", "bill_id", "B9")["status"] == "Awaiting Payment"
  out, ok = at.run_agent_tool(state, "send_payment_request", {"customer_id": "C1001", "bill_id": "B1002"})
  assert not ok and "already has bill B9 awaiting payment" in out
  st.sync_surroundings(state)
  assert dt.check_payment_request(state) == "Payment request: bill B9, amount $65.00, awaiting your payment."
  assert dt.make_payment(state) == "Payment of $65.00 for bill B9 made."
  assert st.find_record(state.db, "bills", "bill_id", "B9")["status"] == "Paid"
  out, ok = at.run_agent_tool(state, "resume_line", {"customer_id": "C1001", "line_id": "L1002"})
  assert ok and st.find_record(state.db, "lines", "line_id", "L1002")["status"] == "Active"
  st.sync_surroundings(state)  # the environment syncs after every tool call
  assert state.phone.network_connection_status == "no_service"  # the phone re-registers on a device action
  dt.reboot_device(state)
  assert state.phone.network_connection_status == "connected"


def test_agent_lookups():
  state = _healthy()
  by_phone = json.loads(at.run_agent_tool(state, "get_customer_by_phone", {"phone_number": "555-123-2002"})[0])
  assert by_phone["customer_id"] == "C1001" and by_phone["full_name"] == "John Smith"
  assert by_phone["lines"][1] == {"line_id": "L1002", "phone_number": "555-123-2002", "status": "Active"}
  assert "address" not in by_phone  # terse; the full record is get_details_by_id
  assert json.loads(at.get_details_by_id(state, "C1001"))["address"]["city"] == "Anytown"
  # A line number that is not a customer's contact number still finds the line's owner.
  assert json.loads(at.get_customer_by_phone(state, "555-123-2005"))["customer_id"] == "C1002"
  for other_format in ("(555) 123-2002", "5551232002", " 555-123-2002"):  # numbers match as the DB writes them
    out, ok = at.run_agent_tool(state, "get_customer_by_phone", {"phone_number": other_format})
    assert not ok and "no customer with phone_number" in out
  assert [c["customer_id"] for c in json.loads(at.get_customer_by_name(state, "sarah johnson", "1990-11-22"))] == [
      "C1002"]
  assert json.loads(at.get_customer_by_name(state, "Sarah Johnson", "1990-11-23")) == []
  assert json.loads(at.get_details_by_id(state, "P1002"))["data_limit_gb"] == 15.0
  usage = json.loads(at.get_data_usage(state, "C1001", "L1002"))
  assert (usage["data_used_gb"], usage["data_limit_gb"]) == (8.7, 15.0)
  bills = json.loads(at.get_bills_for_customer(state, "C1001"))
  assert [b["bill_id"] for b in bills] == ["B1003", "B1002", "B1001"]
  assert [b["bill_id"] for b in json.loads(at.run_agent_tool(state, "get_bills_for_customer",
                                                           {"customer_id": "C1001", "limit": 2})[0])] == ["B1003", "B1002"]
  out, ok = at.run_agent_tool(state, "get_details_by_id", {"id": "c1001"})
  assert not ok and "not found" in out  # ids are case-sensitive


def test_refuel_price_charge_and_roaming():
  state = _healthy()
  draft = st.find_record(state.db, "bills", "bill_id", "B1003")
  before = draft["total_due"]
  out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2})
  assert ok and out.startswith("Refueled 2 GB on line L1002 for $4.00")  # Premium: $2/GB
  assert st.find_record(state.db, "lines", "line_id", "L1002")["data_refueling_gb"] == 2.0
  assert draft["total_due"] == before + 4.0 and draft["line_items"][-1]["item_type"] == "Charge"
  # The tool takes any positive amount; the 2 GB cap is the policy's (the agent's decision).
  out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.5})
  assert ok and st.find_record(state.db, "lines", "line_id", "L1002")["data_refueling_gb"] == 4.5
  out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 0})
  assert not ok and "gb_amount must be positive" in out
  out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1002", "line_id": "L1004", "gb_amount": 1})
  assert ok  # C1002 has no draft bill: the charge opens one
  new = [b for b in state.db["bills"] if b["customer_id"] == "C1002" and b["status"] == "Draft"]
  rate = st.find_record(state.db, "plans", "plan_id", "P1003")["data_refueling_price_per_gb"]
  assert len(new) == 1 and new[0]["total_due"] == rate and new[0]["bill_id"] in st.find_record(
      state.db, "customers", "customer_id", "C1002")["bill_ids"]
  out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1004", "gb_amount": 1})
  assert not ok and "does not belong to customer 'C1001'" in out
  out, ok = at.run_agent_tool(state, "disable_roaming", {"customer_id": "C1001", "line_id": "L1002"})
  assert ok and not st.find_record(state.db, "lines", "line_id", "L1002")["roaming_enabled"]


def test_agent_tool_bad_input_is_an_error_not_a_crash():
  state = _healthy()
  out, ok = at.run_agent_tool(state, "delete_everything", {})
  assert not ok and out.startswith("Error: unknown tool 'delete_everything'")
  out, ok = at.run_agent_tool(state, "get_customer_by_id", {"customer_id": "user's id"})
  assert not ok and "customer_id \"user's id\" not found" in out
  out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": "lots"})
  assert not ok and "must be a number" in out
  for bad in (True, False, [1], {"gb": 1}, None, "nan", "inf", float("inf"), "1" * 5000, "1.5"):
    out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": bad})
    assert not ok and "must be a" in out and "number" in out, (bad, out)  # a numeric string is not a number
  out, ok = at.run_agent_tool(state, "get_customer_by_phone", {"phone": "555-123-2002"})
  assert not ok and "missing ['phone_number'], unexpected ['phone']" in out
  out, ok = at.run_agent_tool(state, "resume_line", {"customer_id": "C1001", "line_id": "L1002"})
  assert not ok and "must be Suspended or Pending Activation" in out
  out, ok = at.run_agent_tool(state, "change_plan", {"customer_id": "C1001", "line_id": "L1002", "plan_id": "P1001"})
  assert not ok and "unknown tool 'change_plan'" in out  # not a tau2 tool


def test_schemas_match_tool_signatures():
  for name, tool in at.AGENT_TOOLS.items():
    schema = tool.schema()["function"]
    params = list(inspect.signature(tool.fn).parameters.values())[1:]  # drop state
    assert schema["name"] == name and list(schema["parameters"]["properties"]) == [p.name for p in params]
    assert schema["parameters"]["required"] == [p.name for p in params if p.default is inspect.Parameter.empty]
  for name, tool in dt.DEVICE_TOOLS.items():
    assert list(inspect.signature(tool.fn).parameters)[1:] == list(tool.params), name
  assert not set(at.AGENT_TOOLS) & set(dt.DEVICE_TOOLS)
