"""Which device fixes the visible tau2-Telecom conversation justifies.

A fix (turn off airplane mode, reset the APN, reseat the SIM, grant a permission ...) addresses
one faulty phone setting. Which setting is faulty is written in the task's reward-side evidence
(its gold ``user_actions``, its initial state); the policy learns it only from a device check the
user ran and reported (``I ran <tool>: <output>``). A correction that asks for a fix before any
visible output has shown that setting in the faulty state, or after one has shown it fine, names
something only the evidence tells: the Verifier rejects it (``fix_without_diagnostic``), and the
Validator's visible hint asks for the check first (``FixRule.diagnostic``).

Two tables, both data:
  * ``READERS``: the phrases of the device tools' outputs (``envs/telecom/device_tools.py``, and the
    scripted user's "X is already ON") that show a setting, and the value each shows;
  * ``FIX_RULES``: per fix, the setting it changes, the value of that setting that it addresses
    (for toggles the opposite of ``FIX_DIRECTION``), and the check that shows the setting.

A fix is justified when the last reading of its setting in the visible conversation (user
messages and tool results, in order) has the faulty value. Out of scope: ``reboot_device`` (a
generic step), ``make_payment`` (it follows the agent's own payment request), ``toggle_wifi`` and
``connect_vpn`` (no task's fault is fixed by them; the Validator's GOAL_DRIFT covers them), a toggle
asked the other way round (not the fix; GOAL_DRIFT again) and the agent-side writes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

from rti_jax.intervention.judges import StepContext

#: toggle -> the direction that fixes the telecom faults (turning it the other way breaks a setting)
FIX_DIRECTION = {"toggle_airplane_mode": "off", "toggle_data": "on", "toggle_roaming": "on",
                 "toggle_data_saver_mode": "off", "toggle_wifi_calling": "off"}

#: the value a reading gives to a rule whose faulty value depends on the request (the network mode)
OTHER_THAN_REQUESTED = "other than the requested one"


def _on(m: re.Match[str]) -> bool:
  return m.group(1).upper() in ("ON", "ENABLED")


def _const(value: Any) -> Callable[[re.Match[str]], Any]:
  return lambda m: value


def _apn_ok(m: re.Match[str]) -> bool:
  return m.group(1) == "internet" and m.group(2) != "not set"


def _sim(m: re.Match[str]) -> str:
  """"active", "locked" (PIN or PUK) or "missing"."""
  return m.group(1).lower().split("_")[0]


def _permissions(m: re.Match[str]) -> list[tuple[str, Any]]:
  from rti_jax.envs.telecom.user_sim import PERMISSIONS

  granted = {p.strip().lower() for p in m.group(2).split(",")}
  return [(f"permission:{m.group(1)}:{p}", p in granted) for p in PERMISSIONS]


#: (pattern, setting, value of the match): every phrase of a device output that shows a setting.
#: A converter returning a list gives several (setting, value) readings (an app's permissions).
READERS: tuple[tuple[re.Pattern[str], str, Callable[[re.Match[str]], Any]], ...] = tuple(
  (re.compile(p), s, f) for p, s, f in (
    (r"Airplane mode: (ON|OFF)\b", "airplane_mode", _on),  # check_network_status
    (r"Airplane mode is (?:now|already) (ON|OFF)\b", "airplane_mode", _on),  # toggle / the user's "already"
    (r"Status bar: Airplane Mode\b", "airplane_mode", _const(True)),
    (r"Status bar: (?:No )?Signal\b", "airplane_mode", _const(False)),
    (r"while Airplane Mode is ON\b", "airplane_mode", _const(True)),  # toggle_wifi refused
    (r"Mobile data: (ON|OFF)\b", "mobile_data", _on),
    (r"Mobile data is (?:now|already) (ON|OFF)\b", "mobile_data", _on),
    # with no signal the status bar says "Data Disabled" whatever the setting: read it only with a signal
    (r"Status bar: Signal [^|\n]{0,40}\| Data (Enabled|Disabled)\b", "mobile_data", _on),
    (r"Data roaming: (ON|OFF)\b", "data_roaming", _on),
    (r"Data roaming is (?:now|already) (ON|OFF)\b", "data_roaming", _on),
    (r"Data Saver mode: (ON|OFF)\b", "data_saver", _on),  # check_data_restriction_status
    (r"Data Saver(?: mode)? is (?:now|already) (ON|OFF)\b", "data_saver", _on),
    (r"\| Data Enabled \| Data Saver\b", "data_saver", _const(True)),  # status bar, data on
    (r"\| Data Enabled(?! \| Data Saver)", "data_saver", _const(False)),
    (r"Wi-Fi Calling: (ON|OFF)\b", "wifi_calling", _on),
    (r"Wi-Fi Calling is (?:now|already) (ON|OFF)\b", "wifi_calling", _on),
    (r"APN settings: APN name (\w+), MMSC URL (not set|\S+?)\.?(?:\s|$)", "apn_ok", _apn_ok),
    (r"SIM status: (Active|Locked|Missing)\b", "sim", _sim),
    (r"\bSIM: (active|locked_pin|locked_puk|missing)\b", "sim", _sim),
    (r"VPN: ON and connected\b|VPN already connected\b|\| VPN Connected\b", "vpn_connected", _const(True)),
    (r"VPN: OFF\b|VPN: ON in settings, not connected\b|No active VPN connection\b|VPN disconnected\b",
     "vpn_connected", _const(False)),
    (r"Network mode preference(?::| set to) (\w+)", "network_mode", lambda m: m.group(1)),
    (r"\b(\w+) permissions granted: ([\w ,]*)\.", "permission", _permissions),
  ))


@dataclasses.dataclass(frozen=True)
class FixRule:
  """One device fix: the ``setting`` it changes (a ``READERS`` key; ``{app_name}`` / ``{permission}``
  filled from the request), the ``fault`` value of that setting it addresses, the check whose
  output shows the setting (``diagnostic``, with ``diagnostic_args`` taken from the request), every
  device output that shows it (``shown_by``, documentation and a test cross-check), and the setting
  in plain words."""

  fix: str
  setting: str
  fault: Any
  diagnostic: str
  shown_by: tuple[str, ...]
  words: str
  diagnostic_args: tuple[str, ...] = ()

  def setting_key(self, arguments: dict[str, Any]) -> str:
    try:
      return self.setting.format(**{k: str(v).lower() for k, v in arguments.items()})
    except (KeyError, IndexError, ValueError):
      return self.setting.format(app_name="messaging", permission="?")

  def is_fault(self, value: Any, arguments: dict[str, Any]) -> bool:
    if self.fault == OTHER_THAN_REQUESTED:
      return value != str(arguments.get("mode", "")).lower()
    return value == self.fault


_STATUS_BAR = ("check_status_bar", "toggle_airplane_mode", "reseat_sim_card", "toggle_data",
               "set_network_mode_preference", "reboot_device")
#: device fix -> what justifies it (see the module docstring)
FIX_RULES: dict[str, FixRule] = {r.fix: r for r in (
  FixRule("toggle_airplane_mode", "airplane_mode", True, "check_status_bar",
          ("check_network_status", "toggle_wifi") + _STATUS_BAR, "airplane mode"),
  FixRule("toggle_data", "mobile_data", False, "check_network_status",
          ("check_network_status",) + _STATUS_BAR, "mobile data"),
  FixRule("toggle_roaming", "data_roaming", False, "check_network_status",
          ("check_network_status", "toggle_roaming"), "data roaming"),
  FixRule("toggle_data_saver_mode", "data_saver", True, "check_data_restriction_status",
          ("check_data_restriction_status", "toggle_data_saver_mode") + _STATUS_BAR, "Data Saver"),
  FixRule("toggle_wifi_calling", "wifi_calling", True, "check_wifi_calling_status",
          ("check_wifi_calling_status", "toggle_wifi_calling"), "Wi-Fi Calling"),
  FixRule("reset_apn_settings", "apn_ok", False, "check_apn_settings", ("check_apn_settings", "set_apn_settings"),
          "the APN settings"),
  FixRule("set_apn_settings", "apn_ok", False, "check_apn_settings", ("check_apn_settings", "set_apn_settings"),
          "the APN settings"),
  FixRule("reseat_sim_card", "sim", "missing", "check_sim_status",
          ("check_sim_status", "check_network_status", "reseat_sim_card"), "the SIM card"),
  FixRule("disconnect_vpn", "vpn_connected", True, "check_vpn_status",
          ("check_vpn_status", "connect_vpn", "disconnect_vpn") + _STATUS_BAR, "the VPN"),
  FixRule("set_network_mode_preference", "network_mode", OTHER_THAN_REQUESTED, "check_network_mode_preference",
          ("check_network_mode_preference", "set_network_mode_preference"), "the network mode preference"),
  FixRule("grant_app_permission", "permission:{app_name}:{permission}", False, "check_app_permissions",
          ("check_app_permissions", "check_app_status", "grant_app_permission"), "the app's permissions",
          ("app_name",)),
)}


@dataclasses.dataclass(frozen=True)
class Reading:
  """One setting shown in the visible conversation: message index, position, setting, value."""

  message: int
  pos: int
  setting: str
  value: Any


def readings_in(texts: Sequence[str]) -> list[Reading]:
  """Every ``READERS`` reading in ``texts`` (the visible messages, in order), in order."""
  out = []
  for i, text in enumerate(texts):
    if not isinstance(text, str) or not text:
      continue
    for pattern, setting, convert in READERS:
      for m in pattern.finditer(text):
        value = convert(m)
        for s, v in (value if isinstance(value, list) else [(setting, value)]):
          out.append(Reading(i, m.start(), s, v))
  out.sort(key=lambda r: (r.message, r.pos))
  return out


def visible_texts(ctx: StepContext) -> list[str]:
  """What the policy has been shown, in order: the user query, then per history message its text
  ("" for the assistant's own words, which are not evidence); history index k is index k + 1 here."""
  return [ctx.user_query] + [str(m.get("content", "")) if m.get("role") != "assistant" else "" for m in ctx.history]


def last_readings(readings: Sequence[Reading]) -> dict[str, Reading]:
  """setting -> its last reading."""
  return {r.setting: r for r in readings}


@dataclasses.dataclass(frozen=True)
class Unjustified:
  """A fix a text asks for that the visible conversation does not justify, and why."""

  fix: str
  arguments: dict[str, Any]
  why: str


def judge_fix(tool: str, arguments: dict[str, Any], direction: str | None,
              last: dict[str, Reading]) -> Unjustified | None:
  """None when asking for ``tool`` needs no diagnostic or the last reading of its setting shows the
  fault; else why it is unjustified."""
  rule = FIX_RULES.get(tool)
  if rule is None:
    return None
  fix_way = FIX_DIRECTION.get(tool)
  if fix_way is not None and direction is not None and direction != fix_way:
    return None  # asked the other way round: not this fix (the Validator's GOAL_DRIFT)
  reading = last.get(rule.setting_key(arguments))
  if reading is None:
    return Unjustified(tool, dict(arguments), f"asks for {tool} but nothing the user reported or a tool returned shows "
                                              f"{rule.words} yet (a check such as {rule.diagnostic} would)")
  if rule.is_fault(reading.value, arguments):
    return None
  return Unjustified(tool, dict(arguments), f"asks for {tool} but the last report shows {rule.words} "
                                            f"already fine ({reading.value!r})")


def requested_fixes(text: str) -> list[tuple[str, dict[str, Any], str | None]]:
  """``(tool, arguments, direction)`` of every device action ``text`` asks for: in its content and
  its reasoning (by tool name or in plain words, as the scripted user reads them) and as its own
  device-tool calls."""
  from rti_jax.envs.telecom import device_tools as dt
  from rti_jax.envs.tool_calls import parse_assistant_turn, reasoning_of
  from rti_jax.intervention.telecom_evidence import device_requests

  turn = parse_assistant_turn(text)
  out = [(r.tool, dict(r.arguments), r.direction) for part in (turn.content, reasoning_of(text)) if part
         for r in device_requests(part)]
  out += [(c.name, dict(c.arguments), None) for c in turn.tool_calls if c.name in dt.DEVICE_TOOLS]
  return out


def unjustified_fixes(ctx: StepContext, text: str) -> list[Unjustified]:
  """The fixes ``text`` asks for that the visible conversation of ``ctx`` does not justify."""
  if not isinstance(text, str) or not text:
    return []
  asked = requested_fixes(text)
  if not any(tool in FIX_RULES for tool, _, _ in asked):
    return []
  last = last_readings(readings_in(visible_texts(ctx)))
  out = []
  for tool, arguments, direction in asked:
    u = judge_fix(tool, arguments, direction, last)
    if u is not None and not any(o.fix == u.fix and o.arguments == u.arguments for o in out):
      out.append(u)
  return out
