"""An independent reference for the Telecom ``fix_without_diagnostic`` rule, read off the phone
state instead of the tools' output text.

``shown_by_state(tool, arguments, phone)``: the settings the output of device tool ``tool`` shows,
with their values, from the phone state the tool left (``envs/telecom/device_tools.py``'s output
code restated on the state fields). ``FaultTracker`` replays an episode's user tool runs on a copy
of the state and says whether a device fix asked now is backed by the last output that showed its
setting."""

from __future__ import annotations

import copy
from typing import Any

from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom import state as st

_BAR = ("check_status_bar", "toggle_airplane_mode", "reseat_sim_card", "toggle_data", "set_network_mode_preference",
        "reboot_device")
#: fix -> (setting, the value of the setting the fix addresses; None: any mode other than the requested one)
FAULTS = {"toggle_airplane_mode": ("airplane_mode", True), "toggle_data": ("mobile_data", False),
          "toggle_roaming": ("data_roaming", False), "toggle_data_saver_mode": ("data_saver", True),
          "toggle_wifi_calling": ("wifi_calling", True), "reset_apn_settings": ("apn_ok", False),
          "set_apn_settings": ("apn_ok", False), "reseat_sim_card": ("sim", "missing"),
          "disconnect_vpn": ("vpn_connected", True), "set_network_mode_preference": ("network_mode", None),
          "grant_app_permission": ("permission", False)}


def shown_by_state(tool: str, arguments: dict[str, Any], phone: st.PhoneState) -> dict[str, Any]:
  out: dict[str, Any] = {}
  sim = st.sim_status(phone).split("_")[0]  # active, locked or missing
  tech_up = phone.network_technology_connected != "none"
  if tool in _BAR or (tool == "toggle_wifi" and phone.airplane_mode):  # outputs that end with the status bar
    out["airplane_mode"] = phone.airplane_mode
    if not phone.airplane_mode and phone.network_signal_strength != "none":
      out["mobile_data"] = phone.data_enabled and tech_up
    if not phone.airplane_mode and phone.data_enabled and tech_up:
      out["data_saver"] = phone.data_saver_mode
    if phone.vpn_connected:
      out["vpn_connected"] = True
  if tool == "check_network_status":
    out.update(airplane_mode=phone.airplane_mode, sim=sim, mobile_data=phone.data_enabled,
               data_roaming=phone.roaming_enabled)
  single = {"toggle_airplane_mode": ("airplane_mode", phone.airplane_mode),
            "toggle_data": ("mobile_data", phone.data_enabled),
            "toggle_roaming": ("data_roaming", phone.roaming_enabled),
            "toggle_data_saver_mode": ("data_saver", phone.data_saver_mode),
            "check_data_restriction_status": ("data_saver", phone.data_saver_mode),
            "toggle_wifi_calling": ("wifi_calling", phone.wifi_calling_enabled),
            "check_wifi_calling_status": ("wifi_calling", phone.wifi_calling_enabled),
            "check_sim_status": ("sim", sim), "reseat_sim_card": ("sim", sim),
            "check_vpn_status": ("vpn_connected", phone.vpn_connected),
            "disconnect_vpn": ("vpn_connected", phone.vpn_connected),
            "connect_vpn": ("vpn_connected", phone.vpn_connected),
            "check_network_mode_preference": ("network_mode", phone.network_mode_preference),
            "set_network_mode_preference": ("network_mode", phone.network_mode_preference)}
  if tool in single:
    out[single[tool][0]] = single[tool][1]
  if tool in ("check_apn_settings", "set_apn_settings"):
    apn = phone.active_apn_settings
    out["apn_ok"] = apn.apn_name == "internet" and apn.mmsc_url is not None
  if tool in ("check_app_permissions", "check_app_status", "grant_app_permission"):
    perms = phone.app_permissions.get(str(arguments.get("app_name", "")), {})
    out.update({f"permission:{arguments['app_name']}:{p}": on for p, on in perms.items()})
  return out


class FaultTracker:
  """Follows an episode: ``observe(state_before, user_calls)`` after each user turn (the state
  before the turn and the calls the user made, in order); ``backed(fix, arguments)``: whether the
  last output that showed the fix's setting showed the fault."""

  def __init__(self) -> None:
    self.shown: dict[str, Any] = {}

  def observe(self, state_before: st.TelecomState, user_calls: list[dict[str, Any]]) -> None:
    state = copy.deepcopy(state_before)
    for call in user_calls:
      dt.run_device_tool(state, call["name"], call["arguments"])
      self.shown.update(shown_by_state(call["name"], call["arguments"], state.phone))

  def backed(self, fix: str, arguments: dict[str, Any]) -> bool:
    setting, fault = FAULTS[fix]
    if setting == "permission":
      setting = f"permission:{arguments.get('app_name')}:{arguments.get('permission')}"
    if setting not in self.shown:
      return False
    value = self.shown[setting]
    return value != arguments.get("mode") if fault is None else value == fault
