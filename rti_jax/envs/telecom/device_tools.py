"""The user's device tools: deterministic functions of ``TelecomState``.

Only the (scripted) user runs these; an agent that calls one gets an error
observation from the environment. Read-only tools describe the phone; fix tools
change a setting, then the phone re-syncs with the carrier and re-registers on
the network (``state.sync_surroundings`` + ``state.network_search``), so every
output reflects the state after the action. Outputs are short plain text.

Speed model (``internet_speed``): download Mbit/s = technology base (5G 500, 4G
100, 3G 10, 2G 0.5) x signal factor (excellent 1.0, good 0.8, fair 0.5, poor 0.2)
x 0.2 with Data Saver on x 0.1 through a poor VPN; the label is "very poor" below
1, "poor" below 5, "fair" below 25, "good" below 100, else "excellent".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.state import TelecomState

TECH_BASE_MBPS = {"5G": 500.0, "4G": 100.0, "3G": 10.0, "2G": 0.5}
SIGNAL_FACTOR = {"excellent": 1.0, "good": 0.8, "fair": 0.5, "poor": 0.2, "none": 0.0}
DATA_SAVER_FACTOR = 0.2
POOR_VPN_FACTOR = 0.1
#: (upper bound exclusive, label), checked in order; anything above is "excellent"
SPEED_LABELS = ((1.0, "very poor"), (5.0, "poor"), (25.0, "fair"), (100.0, "good"))
_BARS = {"none": "No Signal", "poor": "1 bar (poor)", "fair": "2 bars (fair)",
         "good": "3 bars (good)", "excellent": "4 bars (excellent)"}
#: permissions the messaging app needs to send MMS (tech support manual)
MMS_PERMISSIONS = ("sms", "storage")


def speed_label(mbps: float) -> str:
  for bound, label in SPEED_LABELS:
    if mbps < bound:
      return label
  return "excellent"


def internet_speed(state: TelecomState) -> tuple[float | None, str]:
  """(download Mbit/s, label); (None, "no connection") when mobile data does not work."""
  if not st.mobile_data_working(state):
    return None, "no connection"
  phone = state.phone
  mbps = TECH_BASE_MBPS[phone.network_technology_connected]
  mbps *= SIGNAL_FACTOR[phone.network_signal_strength]
  if phone.data_saver_mode:
    mbps *= DATA_SAVER_FACTOR
  if phone.vpn_connected and phone.vpn_performance == "poor":
    mbps *= POOR_VPN_FACTOR
  return mbps, speed_label(mbps)


def mms_blockers(state: TelecomState) -> list[str]:
  """Why MMS cannot be sent right now (empty when it can)."""
  phone = state.phone
  reasons = []
  if phone.network_connection_status != "connected":
    reasons.append("no cellular service")
  elif not st.mobile_data_working(state):
    reasons.append("mobile data not working")
  elif phone.network_technology_connected == "2G":
    reasons.append("2G network")
  if not phone.active_apn_settings.mmsc_url:
    reasons.append("MMSC URL not set")
  if phone.wifi_calling_enabled and phone.wifi_calling_mms_over_wifi:
    reasons.append("MMS over Wi-Fi calling")
  perms = phone.app_permissions.get("messaging", {})
  reasons.extend(f"messaging lacks {p} permission" for p in MMS_PERMISSIONS if not perms.get(p))
  return reasons


def can_send_mms_now(state: TelecomState) -> bool:
  return not mms_blockers(state)


# ----------------------------------------------------------------------------- read-only tools


def _on_off(flag: bool) -> str:
  return "ON" if flag else "OFF"


def check_status_bar(state: TelecomState) -> str:
  p = state.phone
  parts = []
  if p.airplane_mode:
    parts.append("Airplane Mode")
  if p.network_connection_status == "connected":
    parts.append(f"Signal {_BARS[p.network_signal_strength]} {p.network_technology_connected}")
  else:
    parts.append("No Signal")
  parts.append("Data Enabled" if p.data_enabled else "Data Disabled")
  if p.data_saver_mode:
    parts.append("Data Saver")
  if p.wifi_enabled:
    parts.append("Wi-Fi Connected" if p.wifi_connected else "Wi-Fi Enabled")
  if p.vpn_connected:
    parts.append("VPN Connected")
  parts.append(f"Battery {p.battery_level}%")
  return "Status bar: " + " | ".join(parts)


def check_network_status(state: TelecomState) -> str:
  p = state.phone
  return (f"Airplane mode: {_on_off(p.airplane_mode)}. Cellular: {p.network_connection_status}, "
          f"signal {p.network_signal_strength}, technology {p.network_technology_connected}. "
          f"Mobile data: {_on_off(p.data_enabled)}. Data roaming: {_on_off(p.roaming_enabled)}. "
          f"Wi-Fi: {'connected' if p.wifi_connected else _on_off(p.wifi_enabled)}.")


def check_network_mode_preference(state: TelecomState) -> str:
  return f"Network mode preference: {state.phone.network_mode_preference}."


def check_sim_status(state: TelecomState) -> str:
  p = state.phone
  if p.sim_card_missing:
    return "SIM status: Missing (no SIM card detected)."
  labels = {"active": "Active", "locked_pin": "Locked (PIN required)",
            "locked_puk": "Locked (PUK required)", "missing": "Missing"}
  return f"SIM status: {labels.get(p.sim_card_status, p.sim_card_status)}."


def check_data_restriction_status(state: TelecomState) -> str:
  return (f"Data Saver mode: {_on_off(state.phone.data_saver_mode)}. "
          f"Background data restricted: {'yes' if state.phone.data_saver_mode else 'no'}.")


def check_apn_settings(state: TelecomState) -> str:
  apn = state.phone.active_apn_settings
  verdict = "Incorrect" if st.apn_is_broken(state.phone) else "Correct"
  mmsc = apn.mmsc_url or "not set"
  pending = " Reset pending: reboot to apply." if state.phone.apn_reset_pending else ""
  return f"APN settings ({verdict}): APN name {apn.apn_name}, MMS APN {apn.mms_apn}, MMSC URL {mmsc}.{pending}"


def check_wifi_status(state: TelecomState) -> str:
  p = state.phone
  if not p.wifi_enabled:
    return "Wi-Fi: OFF."
  if p.wifi_connected:
    return f"Wi-Fi: ON, connected, signal {p.wifi_signal_strength}."
  return "Wi-Fi: ON, not connected (no known networks in range)."


def check_wifi_calling_status(state: TelecomState) -> str:
  p = state.phone
  return (f"Wi-Fi Calling: {_on_off(p.wifi_calling_enabled)}. "
          f"MMS over Wi-Fi: {_on_off(p.wifi_calling_mms_over_wifi)}.")


def check_vpn_status(state: TelecomState) -> str:
  p = state.phone
  if not p.vpn_enabled_setting:
    return "VPN: OFF."
  if not p.vpn_connected:
    return "VPN: ON, not connected."
  return f"VPN: ON and connected. Performance: {p.vpn_performance.capitalize()}."


def check_installed_apps(state: TelecomState) -> str:
  return "Installed apps: " + ", ".join(sorted(state.phone.app_permissions)) + "."


def _app_permissions_text(state: TelecomState, app_name: str) -> str | None:
  perms = state.phone.app_permissions.get(app_name)
  if perms is None:
    return None
  granted = [name for name, on in perms.items() if on]
  return f"{app_name} permissions granted: {', '.join(granted) if granted else 'none'}."


def check_app_permissions(state: TelecomState, app_name: str) -> str:
  text = _app_permissions_text(state, app_name)
  return text if text else _unknown_app(state, app_name)


def check_app_status(state: TelecomState, app_name: str) -> str:
  text = _app_permissions_text(state, app_name)
  if text is None:
    return _unknown_app(state, app_name)
  restricted = "restricted (Data Saver)" if state.phone.data_saver_mode else "allowed"
  return f"App {app_name}: installed. {text} Background data: {restricted}."


def _unknown_app(state: TelecomState, app_name: str) -> str:
  return (f"Error: app_name must be an installed app ({', '.join(sorted(state.phone.app_permissions))}), "
          f"got {app_name!r}.")


def run_speed_test(state: TelecomState) -> str:
  mbps, label = internet_speed(state)
  if mbps is None:
    return "Speed test: no connection."
  return f"Speed test: {mbps:.1f} Mbps download ({label})."


def can_send_mms(state: TelecomState) -> str:
  if can_send_mms_now(state):
    return "MMS: your messaging app can send MMS messages."
  return "MMS: your messaging app cannot send MMS messages."


def check_payment_request(state: TelecomState) -> str:
  req = state.surroundings.payment_request
  if req is None:
    return "Payment requests: none."
  return f"Payment request: bill {req.bill_id}, amount ${req.amount:.2f}, awaiting your payment."


# ----------------------------------------------------------------------------- fix tools


def _resync(state: TelecomState) -> None:
  st.sync_surroundings(state)
  st.network_search(state)


def toggle_airplane_mode(state: TelecomState) -> str:
  state.phone.airplane_mode = not state.phone.airplane_mode
  if state.phone.airplane_mode:
    state.phone.wifi_enabled = False
  _resync(state)
  return f"Airplane mode is now {_on_off(state.phone.airplane_mode)}. " + check_status_bar(state)


def reseat_sim_card(state: TelecomState) -> str:
  state.phone.sim_card_missing = False
  _resync(state)
  return "SIM card removed and reinserted. " + check_sim_status(state) + " " + check_status_bar(state)


def toggle_data(state: TelecomState) -> str:
  state.phone.data_enabled = not state.phone.data_enabled
  _resync(state)
  return f"Mobile data is now {_on_off(state.phone.data_enabled)}. " + check_status_bar(state)


def toggle_roaming(state: TelecomState) -> str:
  state.phone.roaming_enabled = not state.phone.roaming_enabled
  _resync(state)
  return f"Data roaming is now {_on_off(state.phone.roaming_enabled)}."


def toggle_data_saver_mode(state: TelecomState) -> str:
  state.phone.data_saver_mode = not state.phone.data_saver_mode
  _resync(state)
  return f"Data Saver mode is now {_on_off(state.phone.data_saver_mode)}."


def toggle_wifi(state: TelecomState) -> str:
  state.phone.wifi_enabled = not state.phone.wifi_enabled
  _resync(state)
  return f"Wi-Fi is now {_on_off(state.phone.wifi_enabled)}. " + check_wifi_status(state)


def toggle_wifi_calling(state: TelecomState) -> str:
  state.phone.wifi_calling_enabled = not state.phone.wifi_calling_enabled
  _resync(state)
  return f"Wi-Fi Calling is now {_on_off(state.phone.wifi_calling_enabled)}."


def set_network_mode_preference(state: TelecomState, mode: str) -> str:
  if mode not in st.NETWORK_MODES:
    return f"Error: mode must be one of {', '.join(st.NETWORK_MODES)}, got {mode!r}."
  state.phone.network_mode_preference = mode
  _resync(state)
  return f"Network mode preference set to {mode}. " + check_status_bar(state)


def set_apn_settings(state: TelecomState, apn_name: str, mmsc_url: str) -> str:
  apn = state.phone.active_apn_settings
  apn.apn_name, apn.mmsc_url = apn_name, mmsc_url or None
  _resync(state)
  return "APN settings saved. " + check_apn_settings(state)


def reset_apn_settings(state: TelecomState) -> str:
  state.phone.apn_reset_pending = True
  return "APN settings will be reset to default at the next reboot."


def connect_vpn(state: TelecomState) -> str:
  state.phone.vpn_enabled_setting = True
  _resync(state)
  return check_vpn_status(state)


def disconnect_vpn(state: TelecomState) -> str:
  state.phone.vpn_enabled_setting = False
  _resync(state)
  return "VPN disconnected. " + check_vpn_status(state)


def grant_app_permission(state: TelecomState, app_name: str, permission: str) -> str:
  perms = state.phone.app_permissions.get(app_name)
  if perms is None:
    return _unknown_app(state, app_name)
  if permission not in perms:
    return f"Error: permission must be one of {', '.join(perms)}, got {permission!r}."
  perms[permission] = True
  return f"Permission {permission} granted to {app_name}. " + check_app_permissions(state, app_name)


def reboot_device(state: TelecomState) -> str:
  phone = state.phone
  if phone.apn_reset_pending:
    phone.active_apn_settings = dataclasses.replace(state.default_apn)
    phone.apn_reset_pending = False
  _resync(state)
  return "Phone restarted. " + check_status_bar(state)


def make_payment(state: TelecomState) -> str:
  """Pays the pending payment request: the bill becomes Paid in the carrier's DB."""
  st.sync_surroundings(state)
  req = state.surroundings.payment_request
  if req is None:
    return "Error: there is no payment request to pay."
  bill = st.find_record(state.db, "bills", "bill_id", req.bill_id)
  bill["status"] = "Paid"
  _resync(state)
  return f"Payment of ${req.amount:.2f} for bill {req.bill_id} made."


@dataclasses.dataclass(frozen=True)
class DeviceTool:
  """One device tool: its function, whether it changes state, its argument names."""

  name: str
  fn: Callable[..., str]
  writes: bool
  params: tuple[str, ...] = ()
  description: str = ""


def _tool(fn: Callable[..., str], writes: bool, params: tuple[str, ...] = (), description: str = "") -> DeviceTool:
  return DeviceTool(fn.__name__, fn, writes, params, description)


DEVICE_TOOLS: dict[str, DeviceTool] = {t.name: t for t in [
    _tool(check_status_bar, False, description="icons in the phone's status bar"),
    _tool(check_network_status, False, description="cellular/Wi-Fi connection, airplane mode, data, roaming"),
    _tool(check_network_mode_preference, False, description="preferred network type"),
    _tool(check_sim_status, False, description="SIM active, missing or locked"),
    _tool(check_data_restriction_status, False, description="Data Saver and background data"),
    _tool(check_apn_settings, False, description="APN name and MMSC URL"),
    _tool(check_wifi_status, False, description="Wi-Fi on/off and connection"),
    _tool(check_wifi_calling_status, False, description="Wi-Fi Calling on/off"),
    _tool(check_vpn_status, False, description="VPN connection and performance"),
    _tool(check_installed_apps, False, description="installed apps"),
    _tool(check_app_status, False, ("app_name",), "an app's permissions and background data"),
    _tool(check_app_permissions, False, ("app_name",), "an app's granted permissions"),
    _tool(run_speed_test, False, description="download speed"),
    _tool(can_send_mms, False, description="whether MMS can be sent"),
    _tool(check_payment_request, False, description="pending payment requests"),
    _tool(toggle_airplane_mode, True, description="airplane mode on/off"),
    _tool(reseat_sim_card, True, description="remove and reinsert the SIM"),
    _tool(toggle_data, True, description="mobile data on/off"),
    _tool(toggle_roaming, True, description="data roaming on/off"),
    _tool(toggle_data_saver_mode, True, description="Data Saver on/off"),
    _tool(toggle_wifi, True, description="Wi-Fi on/off"),
    _tool(toggle_wifi_calling, True, description="Wi-Fi Calling on/off"),
    _tool(set_network_mode_preference, True, ("mode",), "set preferred network type"),
    _tool(set_apn_settings, True, ("apn_name", "mmsc_url"), "set APN settings"),
    _tool(reset_apn_settings, True, description="reset APN to default (applies at reboot)"),
    _tool(connect_vpn, True, description="connect the VPN"),
    _tool(disconnect_vpn, True, description="disconnect the VPN"),
    _tool(grant_app_permission, True, ("app_name", "permission"), "grant an app a permission"),
    _tool(reboot_device, True, description="restart the phone"),
    _tool(make_payment, True, description="pay the pending payment request"),
]}


def run_device_tool(state: TelecomState, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
  """Runs device tool ``name``; returns (output, ok). Bad names or arguments give an
  error output (never raise)."""
  tool = DEVICE_TOOLS.get(name)
  if tool is None:
    return f"Error: {name!r} is not a device tool.", False
  missing = [p for p in tool.params if p not in arguments]
  extra = [a for a in arguments if a not in tool.params]
  if missing or extra:
    return (f"Error: {name} takes arguments ({', '.join(tool.params) or 'none'}); "
            f"missing {missing}, unexpected {extra}."), False
  bad = [p for p in tool.params if not isinstance(arguments[p], str)]
  if bad:
    return f"Error: arguments {bad} of {name} must be strings.", False
  output = tool.fn(state, **arguments)
  return output, not output.startswith("Error")
