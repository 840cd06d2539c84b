"""The user's device tools: deterministic functions of ``TelecomState``.

Only the (scripted) user runs these; an agent that calls one gets an error
observation from the environment. The tools, their arguments and their effects
are tau2-bench's (``tests/test_tau2_parity.py`` checks the rewards against it);
the output texts are this port's own, short and plain. After every tool the
surroundings are re-synced with the carrier's records; the phone re-registers on
the network (``state.network_search``) only after the actions that trigger a
search there: airplane mode, mobile data, roaming, network mode, SIM reseat, APN
set or reset, reboot (Data Saver, Wi-Fi, Wi-Fi Calling, VPN and app permissions
do not).

Speed model (``internet_speed``): download Mbit/s = the technology's mid-range (5G
275, 4G 55, 3G 3, 2G 0.25) x signal factor (excellent 1.0, good 0.8, fair 0.5,
poor 0.2) x 0.1 through a poor VPN x 0.2 with Data Saver on, rounded to 0.01; the
label is "very poor" below 1, "poor" below 5, "fair" below 25, "good" below 100,
else "excellent".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.state import TelecomState

#: (min, max) Mbit/s of each technology; the speed test uses the middle
TECH_RANGE_MBPS = {"2G": (0.1, 0.4), "3G": (1.0, 5.0), "4G": (10.0, 100.0), "5G": (50.0, 500.0)}
TECH_BASE_MBPS = {tech: (lo + hi) / 2.0 for tech, (lo, hi) in TECH_RANGE_MBPS.items()}
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
  factor = POOR_VPN_FACTOR if phone.vpn_connected and phone.vpn_performance == "poor" else 1.0
  if phone.data_saver_mode:
    factor *= DATA_SAVER_FACTOR
  mbps = TECH_BASE_MBPS.get(phone.network_technology_connected, 0.0)
  mbps = round(mbps * SIGNAL_FACTOR[phone.network_signal_strength] * factor, 2)
  return mbps, speed_label(mbps)


def mms_blockers(state: TelecomState) -> list[str]:
  """Why MMS cannot be sent right now (empty when it can)."""
  phone = state.phone
  reasons = []
  if not st.mobile_data_working(state):
    reasons.append("mobile data not working" if phone.network_connection_status == "connected"
                   else "no cellular service")
  elif phone.network_technology_connected == "2G":
    reasons.append("2G network")
  if phone.wifi_calling_enabled and phone.wifi_calling_mms_over_wifi:
    reasons.append("MMS over Wi-Fi calling")
  if phone.active_apn_settings.mmsc_url is None:
    reasons.append("MMSC URL not set")
  perms = phone.app_permissions.get("messaging")
  if perms is None:
    reasons.append("no messaging app")
  else:
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
  else:
    if p.network_signal_strength == "none":
      parts.append("No Signal")
    else:
      tech = f" {p.network_technology_connected}" if p.network_technology_connected != "none" else ""
      parts.append(f"Signal {_BARS[p.network_signal_strength]}{tech}")
    if p.data_enabled and p.network_technology_connected != "none":
      parts.append("Data Enabled")
      if p.data_saver_mode:
        parts.append("Data Saver")
    else:
      parts.append("Data Disabled")
  if p.wifi_enabled and p.wifi_connected:
    parts.append("Wi-Fi Connected")
  if p.vpn_connected:
    parts.append("VPN Connected")
  parts.append(f"Battery {p.battery_level}%")
  return "Status bar: " + " | ".join(parts)


def check_network_status(state: TelecomState) -> str:
  p = state.phone
  return (f"Airplane mode: {_on_off(p.airplane_mode)}. SIM: {st.sim_status(p)}. "
          f"Cellular: {p.network_connection_status}, "
          f"signal {p.network_signal_strength}, technology {p.network_technology_connected}. "
          f"Mobile data: {_on_off(p.data_enabled)}. Data roaming: {_on_off(p.roaming_enabled)}. "
          f"Wi-Fi: {'connected' if p.wifi_connected else _on_off(p.wifi_enabled)}.")


def check_network_mode_preference(state: TelecomState) -> str:
  return f"Network mode preference: {state.phone.network_mode_preference}."


def check_sim_status(state: TelecomState) -> str:
  labels = {"active": "Active", "locked_pin": "Locked (PIN required)",
            "locked_puk": "Locked (PUK required)", "missing": "Missing (no SIM card detected)"}
  status = st.sim_status(state.phone)
  return f"SIM status: {labels.get(status, status)}."


def check_data_restriction_status(state: TelecomState) -> str:
  return f"Data Saver mode: {_on_off(state.phone.data_saver_mode)}."


def check_apn_settings(state: TelecomState) -> str:
  apn = state.phone.active_apn_settings
  return f"APN settings: APN name {apn.apn_name}, MMSC URL {apn.mmsc_url or 'not set'}."


def check_wifi_status(state: TelecomState) -> str:
  p = state.phone
  if not p.wifi_enabled:
    return "Wi-Fi: OFF."
  if p.wifi_connected:
    return f"Wi-Fi: ON, connected, signal {p.wifi_signal_strength}."
  return "Wi-Fi: ON, not connected to any network."


def check_wifi_calling_status(state: TelecomState) -> str:
  return f"Wi-Fi Calling: {_on_off(state.phone.wifi_calling_enabled)}."


def check_vpn_status(state: TelecomState) -> str:
  p = state.phone
  if p.vpn_connected:
    return f"VPN: ON and connected. Performance: {(p.vpn_performance or 'unknown').capitalize()}."
  if p.vpn_enabled_setting:
    return "VPN: ON in settings, not connected."
  return "VPN: OFF."


def check_installed_apps(state: TelecomState) -> str:
  return "Installed apps: " + ", ".join(state.phone.app_permissions) + "."


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
  return f"App {app_name}: installed. {text}" if text else _unknown_app(state, app_name)


def _unknown_app(state: TelecomState, app_name: str) -> str:
  return (f"Error: app_name must be an installed app ({', '.join(state.phone.app_permissions)}), "
          f"got {app_name!r}.")


def run_speed_test(state: TelecomState) -> str:
  mbps, label = internet_speed(state)
  if mbps is None:
    return "Speed test: no connection."
  return f"Speed test: {mbps:.2f} Mbps download ({label})."


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


def turn(state: TelecomState, tool: str, on: bool) -> None:
  """Sets a toggled setting to ``on`` as tau2-bench's fault functions do: toggle once, and
  again if that left it the other way (so a setting already right is toggled twice, each
  toggle with its own effects, e.g. a network search)."""
  toggle, field = _TURNABLE[tool]
  toggle(state)
  if getattr(state.phone, field) != on:
    toggle(state)


def _toggle_airplane(state: TelecomState) -> None:
  """Turning airplane mode on drops Wi-Fi and the VPN; turning it off drops Wi-Fi (when
  on); either way the phone searches the network."""
  p = state.phone
  was_on = p.airplane_mode
  p.airplane_mode = not was_on
  if not was_on or p.wifi_enabled:
    p.wifi_connected, p.wifi_signal_strength = False, "none"
  if not was_on and p.vpn_connected:
    p.vpn_connected, p.vpn_performance = False, None
  st.network_search(state)


def toggle_airplane_mode(state: TelecomState) -> str:
  _toggle_airplane(state)
  return f"Airplane mode is now {_on_off(state.phone.airplane_mode)}. " + check_status_bar(state)


def reseat_sim_card(state: TelecomState) -> str:
  state.phone.sim_card_missing = False
  st.network_search(state)
  return "SIM card removed and reinserted. " + check_sim_status(state) + " " + check_status_bar(state)


def toggle_data(state: TelecomState) -> str:
  state.phone.data_enabled = not state.phone.data_enabled
  st.network_search(state)
  return f"Mobile data is now {_on_off(state.phone.data_enabled)}. " + check_status_bar(state)


def toggle_roaming(state: TelecomState) -> str:
  state.phone.roaming_enabled = not state.phone.roaming_enabled
  st.network_search(state)
  return f"Data roaming is now {_on_off(state.phone.roaming_enabled)}."


def toggle_data_saver_mode(state: TelecomState) -> str:
  state.phone.data_saver_mode = not state.phone.data_saver_mode
  return f"Data Saver mode is now {_on_off(state.phone.data_saver_mode)}."


def toggle_wifi(state: TelecomState) -> str:
  p = state.phone
  if p.airplane_mode:
    return "Wi-Fi cannot be changed while Airplane Mode is ON. " + check_status_bar(state)
  p.wifi_enabled = not p.wifi_enabled
  if not p.wifi_enabled:
    p.wifi_connected, p.wifi_signal_strength = False, "none"
  return f"Wi-Fi is now {_on_off(p.wifi_enabled)}. " + check_wifi_status(state)


def toggle_wifi_calling(state: TelecomState) -> str:
  state.phone.wifi_calling_enabled = not state.phone.wifi_calling_enabled
  return f"Wi-Fi Calling is now {_on_off(state.phone.wifi_calling_enabled)}."


def set_network_mode_preference(state: TelecomState, mode: str) -> str:
  if mode not in st.NETWORK_MODES:
    return f"Error: mode must be one of {', '.join(st.NETWORK_MODES)}, got {mode!r}."
  state.phone.network_mode_preference = mode
  st.network_search(state)
  return f"Network mode preference set to {mode}. " + check_status_bar(state)


_APN_FIELDS = {"apn_name": str, "reset_at_reboot": bool, "mms_apn": str, "mmsc_url": str, "mms_proxy": str,
               "mms_port": int}


def set_apn_settings(state: TelecomState, apn_settings: dict[str, Any]) -> str:
  """Replaces the APN settings with ``apn_settings`` (fields left out take the carrier
  default; ``apn_name`` is "internet" or "broken"; ``reset_at_reboot`` schedules a reset)."""
  if not isinstance(apn_settings, dict):
    return f"Error: apn_settings must be an object with fields {', '.join(_APN_FIELDS)}, got {apn_settings!r}."
  unknown = [k for k in apn_settings if k not in _APN_FIELDS]
  bad = [k for k, v in apn_settings.items() if k in _APN_FIELDS and v is not None
         and not (isinstance(v, _APN_FIELDS[k]) and (k == "reset_at_reboot" or not isinstance(v, bool)))]
  if apn_settings.get("apn_name", "internet") not in st.APN_NAMES or unknown or bad:
    return (f"Error: apn_settings takes {', '.join(_APN_FIELDS)} (apn_name one of {', '.join(st.APN_NAMES)}); "
            f"unknown {unknown}, bad values {bad or [k for k in ('apn_name',) if k in apn_settings]}.")
  fields = {k: v for k, v in apn_settings.items() if k != "reset_at_reboot"}
  if "apn_name" in fields and fields["apn_name"] is None:
    return "Error: apn_name must be one of internet, broken."
  state.phone.active_apn_settings = st.ApnSettings(**fields)
  state.phone.apn_reset_pending = bool(apn_settings.get("reset_at_reboot") or False)
  st.network_search(state)
  return "APN settings saved. " + check_apn_settings(state)


def reset_apn_settings(state: TelecomState) -> str:
  state.phone.apn_reset_pending = True
  st.network_search(state)
  return "APN settings will be reset to default at the next reboot."


def connect_vpn(state: TelecomState) -> str:
  p = state.phone
  if p.vpn_connected:
    return "VPN already connected."
  p.vpn_connected, p.vpn_performance = True, p.vpn_server_performance
  return check_vpn_status(state)


def disconnect_vpn(state: TelecomState) -> str:
  p = state.phone
  if not p.vpn_connected:
    return "No active VPN connection to disconnect."
  p.vpn_connected, p.vpn_performance = False, None
  return "VPN disconnected. " + check_vpn_status(state)


def grant_app_permission(state: TelecomState, app_name: str, permission: str) -> str:
  perms = state.phone.app_permissions.get(app_name)
  if perms is None:
    return _unknown_app(state, app_name)
  permission = permission.lower()
  if permission not in perms:
    return f"Error: permission must be one of {', '.join(perms)}, got {permission!r}."
  perms[permission] = True
  return f"Permission {permission} granted to {app_name}. " + check_app_permissions(state, app_name)


def reboot_device(state: TelecomState) -> str:
  phone = state.phone
  if phone.apn_reset_pending:
    phone.active_apn_settings = dataclasses.replace(state.default_apn)
    phone.apn_reset_pending = False
  st.network_search(state)
  return "Phone restarted. " + check_status_bar(state)


#: tool -> (its toggle, the phone field it flips), for ``turn``
_TURNABLE = {"toggle_airplane_mode": (_toggle_airplane, "airplane_mode"),
             "toggle_data": (lambda state: toggle_data(state), "data_enabled"),
             "toggle_roaming": (lambda state: toggle_roaming(state), "roaming_enabled"),
             "toggle_data_saver_mode": (lambda state: toggle_data_saver_mode(state), "data_saver_mode")}


def make_payment(state: TelecomState) -> str:
  """Pays the pending payment request: the bill becomes Paid in the carrier's DB."""
  req = state.surroundings.payment_request
  if req is None:
    return "Error: there is no payment request to pay."
  bill = st.find_record(state.db, "bills", "bill_id", req.bill_id)
  if bill is not None:
    bill["status"] = "Paid"
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
    _tool(set_apn_settings, True, ("apn_settings",), "set APN settings (an object: apn_name, mmsc_url, ...)"),
    _tool(reset_apn_settings, True, description="reset APN to default (applies at reboot)"),
    _tool(connect_vpn, True, description="connect the VPN"),
    _tool(disconnect_vpn, True, description="disconnect the VPN"),
    _tool(grant_app_permission, True, ("app_name", "permission"), "grant an app a permission"),
    _tool(reboot_device, True, description="restart the phone"),
    _tool(make_payment, True, description="pay the pending payment request"),
]}


#: arguments that are objects, not strings
_OBJECT_PARAMS = ("apn_settings",)


def run_device_tool(state: TelecomState, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
  """Runs device tool ``name``, then re-syncs the surroundings; returns (output, ok). Bad
  names or arguments give an error output and change nothing (never raise)."""
  tool = DEVICE_TOOLS.get(name)
  if tool is None:
    return f"Error: {name!r} is not a device tool.", False
  missing = [p for p in tool.params if p not in arguments]
  extra = [a for a in arguments if a not in tool.params]
  if missing or extra:
    return (f"Error: {name} takes arguments ({', '.join(tool.params) or 'none'}); "
            f"missing {missing}, unexpected {extra}."), False
  bad = [p for p in tool.params if p not in _OBJECT_PARAMS and not isinstance(arguments[p], str)]
  if bad:
    return f"Error: arguments {bad} of {name} must be strings.", False
  output = tool.fn(state, **arguments)
  st.sync_surroundings(state)
  return output, not output.startswith("Error")
