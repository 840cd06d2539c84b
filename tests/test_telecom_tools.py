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
  """Independent re-derivation of the documented speed model with numpy."""
  base = {"5G": 500.0, "4G": 100.0, "3G": 10.0, "2G": 0.5}[tech]
  factor = {"excellent": 1.0, "good": 0.8, "fair": 0.5, "poor": 0.2}[signal]
  mbps = base * factor * (0.2 if saver else 1.0) * (0.1 if poor_vpn else 1.0)
  labels = np.array(["very poor", "poor", "fair", "good", "excellent"])
  return mbps, str(labels[np.digitize(mbps, [1.0, 5.0, 25.0, 100.0])])


@settings(max_examples=150, deadline=None, derandomize=True)
@given(mode=hst.sampled_from(st.NETWORK_MODES), signal=hst.sampled_from(["poor", "fair", "good", "excellent"]),
       saver=hst.booleans(), vpn=hst.sampled_from(["off", "good", "poor"]))
def test_speed_model_matches_reference(mode, signal, saver, vpn):
  state = st.fresh_state()
  state.surroundings.phone_number = "555-123-2002"
  state.surroundings.signal_at_location = signal
  p = state.phone
  p.network_mode_preference, p.data_saver_mode = mode, saver
  p.vpn_enabled_setting, p.vpn_performance = vpn != "off", ("poor" if vpn == "poor" else "good")
  st.sync_surroundings(state)
  st.network_search(state)
  mbps, label = dt.internet_speed(state)
  ref_mbps, ref_label = _speed_reference(p.network_technology_connected, signal, saver, vpn == "poor")
  assert mbps == pytest.approx(ref_mbps) and label == ref_label
  assert dt.run_speed_test(state) == f"Speed test: {ref_mbps:.1f} Mbps download ({ref_label})."


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
  assert "Incorrect" in dt.check_apn_settings(state)
  dt.reset_apn_settings(state)
  assert state.phone.active_apn_settings.apn_name == st.BROKEN_APN_NAME
  assert "Reset pending" in dt.check_apn_settings(state)
  out = dt.reboot_device(state)
  assert state.phone.active_apn_settings.apn_name == "internet"
  assert state.phone.network_connection_status == "connected" and "Signal 3 bars (good) 5G" in out


def test_toggles_flip_and_resync():
  state = _healthy()
  assert "Airplane mode is now ON" in dt.toggle_airplane_mode(state)
  assert state.phone.network_connection_status == "no_service"
  assert "No Signal" in dt.check_status_bar(state) and "Airplane Mode" in dt.check_status_bar(state)
  dt.toggle_airplane_mode(state)
  assert state.phone.network_connection_status == "connected"
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
  st.network_search(state)
  assert dt.check_vpn_status(state) == "VPN: ON and connected. Performance: Poor."
  dt.disconnect_vpn(state)
  assert not state.phone.vpn_connected
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
  assert state.phone.network_connection_status == "no_service"  # the phone re-registers on a device action
  dt.reboot_device(state)
  assert state.phone.network_connection_status == "connected"


def test_agent_lookups():
  state = _healthy()
  by_phone = json.loads(at.run_agent_tool(state, "get_customer_by_phone", {"phone_number": "(555) 123-2002"})[0])
  assert by_phone["customer_id"] == "C1001" and by_phone["full_name"] == "John Smith"
  assert by_phone["lines"][1] == {"line_id": "L1002", "phone_number": "555-123-2002", "status": "Active"}
  assert "address" not in by_phone  # terse; the full record is get_details_by_id
  assert json.loads(at.get_details_by_id(state, "C1001"))["address"]["city"] == "Anytown"
  # A line number that is not a customer's contact number still finds the line's owner.
  assert json.loads(at.get_customer_by_phone(state, "555-123-2005"))["customer_id"] == "C1002"
  assert json.loads(at.get_customer_by_name(state, "sarah johnson", "1990-11-22"))["customer_id"] == "C1002"
  assert json.loads(at.get_details_by_id(state, "P1002"))["data_limit_gb"] == 15.0
  usage = json.loads(at.get_data_usage(state, "C1001", "L1002"))
  assert (usage["data_used_gb"], usage["data_limit_gb"]) == (8.7, 15.0)
  bills = json.loads(at.get_bills_for_customer(state, "C1001"))
  assert [b["bill_id"] for b in bills] == ["B1003", "B1002", "B1001"]


def test_refuel_price_cap_and_roaming():
  state = _healthy()
  out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2})
  assert ok and out.startswith("Refueled 2 GB on line L1002 for $4.00")  # Premium: $2/GB
  assert st.find_record(state.db, "lines", "line_id", "L1002")["data_refueling_gb"] == 2.0
  out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.5})
  assert not ok and "gb_amount must be in (0, 2.0]" in out and "2.5" in out
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
  for bad in (True, False, [1], {"gb": 1}, None, "nan", "inf", float("inf"), "1" * 5000):
    out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": bad})
    assert not ok and "must be a" in out and "number" in out, (bad, out)
  out, ok = at.run_agent_tool(state, "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": "1.5"})
  assert ok, out  # a numeric string is a number, as tau2's argument parsing reads it
  out, ok = at.run_agent_tool(state, "get_customer_by_phone", {"phone": "555-123-2002"})
  assert not ok and "missing ['phone_number'], unexpected ['phone']" in out
  out, ok = at.run_agent_tool(state, "resume_line", {"customer_id": "C1001", "line_id": "L1002"})
  assert not ok and "must be Suspended" in out


def test_schemas_match_tool_signatures():
  for name, tool in at.AGENT_TOOLS.items():
    schema = tool.schema()["function"]
    params = list(inspect.signature(tool.fn).parameters)[1:]  # drop state
    assert schema["name"] == name and schema["parameters"]["required"] == params
  for name, tool in dt.DEVICE_TOOLS.items():
    assert list(inspect.signature(tool.fn).parameters)[1:] == list(tool.params), name
  assert not set(at.AGENT_TOOLS) & set(dt.DEVICE_TOOLS)
