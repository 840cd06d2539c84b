"""A scripted Telecom agent that decides every step from what it has seen (no hidden state).

``GoldAgent`` replays a task's gold actions, which follow the task's *hidden* faults: its
k-th request cannot be inferred from the conversation, so a policy imitating it can only
memorise train tasks. ``ChecklistAgent`` is the imitable alternative for a tiny policy: it
follows the condensed policy's checklist (``condensed.CONDENSED_POLICY``) and branches only on
messages it has received:

1. asks for the phone number, ``get_customer_by_phone``, ``get_details_by_id`` of that line;
2. suspended line whose contract ended -> transfer;
3. asks the user to check the SIM status: missing -> reseat; locked (either time) -> transfer
   (before any account change: a locked SIM is transferred whatever else is wrong);
   then, on a suspended line: bills, a payment request for an overdue bill, the user pays,
   ``resume_line``;
4. checks the network status and the APN settings (data and MMS issues: also the data
   restriction and VPN status), then asks for the fixes those outputs show a need for (airplane
   mode off, APN reset; mobile data on) and a reboot;
5. mobile data and MMS issues: ``get_data_usage`` (used up: plan look-up, 2 GB refuel offer,
   ``refuel_data`` if accepted), ``enable_roaming`` when the line has it off; checks the network
   mode preference (MMS: also Wi-Fi Calling and the messaging app's permissions), then asks for
   the fixes shown: roaming on, Data Saver off, VPN off, network mode ``4g_5g_preferred`` (MMS:
   Wi-Fi Calling off, the sms and storage permissions);
6. asks the user to check the goal (MMS / speed test / status bar), then ``###STOP###``.

Diagnostic first: a fix is asked for only when the last visible reading of its setting shows
the fault, read exactly as the Verifier reads it (``intervention.telecom_fixes``), so no fix this
agent asks for is a ``fix_without_diagnostic``. Device steps are asked for in directed plain
words ("Please turn off airplane mode."). The issue type is read from the user's opening message.
``DEVICE_REQUESTS`` maps each device step (checks and fixes) to its text; ``steps_of(text)``
splits a turn into them.
"""

from __future__ import annotations

import json
import re
from typing import Any, Generator, Sequence

from rti_jax.envs.telecom.env import AGENT_STOP, TRANSFER_MESSAGE
from rti_jax.envs.telecom.scripted_agents import tool_call_text

TODAY = "2025-02-25"
ASK_PHONE = "I can help with that. Could you please give me your phone number?"
ASK_PHONE_AGAIN = "Could you please tell me the phone number of the line with the issue?"
PAY_MESSAGE = "I sent a payment request for your overdue bill. Please check your payment request and pay it."
#: device step -> (tool, arguments, the request in plain words)
DEVICE_REQUESTS: dict[str, tuple[str, dict[str, str], str]] = {
    "sim": ("check_sim_status", {}, "Please check your SIM card status and tell me what it shows."),
    "reseat": ("reseat_sim_card", {}, "Please take out your SIM card and put it back in."),
    "airplane": ("toggle_airplane_mode", {}, "Please turn off airplane mode."),
    "apn": ("reset_apn_settings", {}, "Please reset your APN settings to the default."),
    "reboot": ("reboot_device", {}, "Please restart your phone."),
    "data": ("toggle_data", {}, "Please turn on your mobile data."),
    "roaming": ("toggle_roaming", {}, "Please turn on data roaming on your phone."),
    "saver": ("toggle_data_saver_mode", {}, "Please turn off Data Saver mode."),
    "vpn": ("disconnect_vpn", {}, "Please disconnect your VPN."),
    "mode": ("set_network_mode_preference", {"mode": "4g_5g_preferred"},
             "Please change your preferred network mode to 4G/5G preferred."),
    "wifi_calling": ("toggle_wifi_calling", {}, "Please turn off Wi-Fi Calling."),
    "sms": ("grant_app_permission", {"app_name": "messaging", "permission": "sms"},
            "Please grant the messaging app the sms permission."),
    "storage": ("grant_app_permission", {"app_name": "messaging", "permission": "storage"},
                "Please grant the messaging app the storage permission."),
    "pay": ("make_payment", {}, PAY_MESSAGE),
    # the checks that show the settings the fixes above change
    "network_status": ("check_network_status", {}, "Please check your network status."),
    "apn_settings": ("check_apn_settings", {}, "Please check your APN settings."),
    "restriction": ("check_data_restriction_status", {},
                    "Please check your data restriction status."),
    "vpn_status": ("check_vpn_status", {}, "Please check your VPN status."),
    "mode_status": ("check_network_mode_preference", {},
                    "Please check your preferred network mode."),
    "wifi_calling_status": ("check_wifi_calling_status", {},
                            "Please check your Wi-Fi Calling status."),
    "permissions": ("check_app_permissions", {"app_name": "messaging"},
                    "Please check the permissions of your messaging app."),
}
#: the checks, then the fixes they may show a need for, of each stage of the checklist; "reboot"
#: is asked every time (a generic step, and what makes an APN reset take effect)
STAGES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "basics": (("network_status", "apn_settings"), ("airplane", "apn", "reboot")),
    "data_basics": (("network_status", "apn_settings", "restriction", "vpn_status"), ("airplane", "apn", "reboot", "data")),
    "data_settings": (("mode_status",), ("roaming", "saver", "vpn", "mode")),
    "mms_settings": (("mode_status", "wifi_calling_status", "permissions"),
                     ("roaming", "saver", "vpn", "mode", "wifi_calling", "sms", "storage")),
}
#: at most this many steps in one turn (the scripted user runs ``user_sim.MAX_ACTIONS_PER_TURN``)
STEPS_PER_TURN = 4
GOAL_REQUESTS = {"mms": "Please try sending a picture message now.", "data": "Please run a speed test now.",
                 "service": "Please look at your status bar now and tell me what it shows."}
_PHONE_RE = re.compile(r"\(?\d{3}\)?[\s.-]?\d{3}[\s.-]?\d{4}")

Message = dict[str, Any]
Plan = Generator[str, None, None]


def issue_of(opening: str) -> str:
  """"mms", "data" or "service" from the user's opening message."""
  low = opening.lower()
  if "mms" in low or "picture message" in low:
    return "mms"
  if "mobile data" in low or "internet" in low or "speed" in low:
    return "data"
  return "service"


def _json(text: str) -> Any:
  try:
    return json.loads(text)
  except (TypeError, ValueError):
    return None


def _transfer(summary: str) -> Plan:
  yield tool_call_text("transfer_to_human_agents", {"summary": summary})
  yield TRANSFER_MESSAGE


def group_request(steps: Sequence[str]) -> str:
  """The one turn that asks for ``steps`` (``DEVICE_REQUESTS`` keys): their requests, in order."""
  return " ".join(DEVICE_REQUESTS[step][2] for step in steps)


def steps_of(text: str) -> list[str]:
  """The ``DEVICE_REQUESTS`` keys a turn of this agent asks for, in order ([] for any other turn)."""
  out, rest = [], text
  while rest:
    step = next((k for k, (_, _, req) in DEVICE_REQUESTS.items() if rest == req or rest.startswith(req + " ")), None)
    if step is None:
      return []
    out.append(step)
    rest = rest[len(DEVICE_REQUESTS[step][2]):].lstrip(" ")
  return out


def needed(steps: Sequence[str], seen: Sequence[str]) -> list[str]:
  """The fix ``steps`` whose fault the visible outputs ``seen`` show, in order (a step outside the
  Verifier's fix rule, such as the reboot, always is)."""
  from rti_jax.intervention.telecom_fixes import FIX_DIRECTION, judge_fix, last_readings, readings_in

  last = last_readings(readings_in(list(seen)))
  out = []
  for step in steps:
    tool, arguments, _ = DEVICE_REQUESTS[step]
    if judge_fix(tool, arguments, FIX_DIRECTION.get(tool), last) is None:
      out.append(step)
  return out


def _plan(opening: str, obs: Sequence[str], grouped: bool = True, checks: bool = True) -> Plan:
  """The checklist's turns; ``obs[i]`` is what the env answered to turn i (read only after
  turn i is yielded). grouped: up to ``STEPS_PER_TURN`` steps in one turn. checks: False asks
  for every fix of each stage without its checks (idempotent: a setting already right stays
  right), the fix-first checklist."""
  k = 0

  seen: list[str] = []  # everything the env answered so far, in order

  def turn(text: str) -> Generator[str, None, str]:
    nonlocal k
    yield text
    k += 1
    seen.append(obs[k - 1])
    return obs[k - 1]

  o = yield from turn(ASK_PHONE)
  phone = _PHONE_RE.search(o)
  if phone is None:
    o = yield from turn(ASK_PHONE_AGAIN)
    phone = _PHONE_RE.search(o)
  if phone is None:
    yield from _transfer("The user did not give a phone number.")
    return
  number = phone.group(0)
  o = yield from turn(tool_call_text("get_customer_by_phone", {"phone_number": number}))
  customer = _json(o)
  digits = re.sub(r"\D", "", number)[-10:]
  lines = [ln for ln in (customer or {}).get("lines", []) if re.sub(r"\D", "", ln.get("phone_number", ""))[-10:] == digits]
  if not isinstance(customer, dict) or not lines:
    yield from _transfer("No customer line found for the phone number the user gave.")
    return
  cid, lid = customer["customer_id"], lines[0]["line_id"]
  line = _json((yield from turn(tool_call_text("get_details_by_id", {"id": lid})))) or {}
  suspended = line.get("status") == "Suspended"
  if suspended and str(line.get("contract_end_date", "9999")) < TODAY:
    yield from _transfer("The line is suspended and its contract has ended.")
    return
  o = yield from turn(DEVICE_REQUESTS["sim"][2])
  if "Missing" in o:
    o = yield from turn(DEVICE_REQUESTS["reseat"][2])
  if "Locked" in o:
    yield from _transfer("The SIM card is locked.")
    return
  if suspended:
    bills = _json((yield from turn(tool_call_text("get_bills_for_customer", {"customer_id": cid})))) or []
    overdue = [b["bill_id"] for b in bills if isinstance(b, dict) and b.get("status") == "Overdue"]
    if overdue:
      yield from turn(tool_call_text("send_payment_request", {"customer_id": cid, "bill_id": overdue[0]}))
      yield from turn(PAY_MESSAGE)
    yield from turn(tool_call_text("resume_line", {"customer_id": cid, "line_id": lid}))
  def ask(steps: Sequence[str]) -> Generator[str, None, None]:
    size = STEPS_PER_TURN if grouped else 1
    for i in range(0, len(steps), size):
      yield from turn(group_request(steps[i:i + size]))

  def stage(name: str) -> Generator[str, None, None]:
    stage_checks, fixes = STAGES[name]
    if not checks:
      yield from ask(fixes)
      return
    yield from ask(stage_checks)
    yield from ask(needed(fixes, seen))

  issue = issue_of(opening)
  yield from stage("basics" if issue == "service" else "data_basics")
  if issue in ("data", "mms"):
    usage = _json((yield from turn(tool_call_text("get_data_usage", {"customer_id": cid, "line_id": lid})))) or {}
    try:
      used_up = float(usage["data_used_gb"]) >= float(usage["data_limit_gb"]) + float(usage["data_refueling_gb"])
    except (KeyError, TypeError, ValueError):
      used_up = False
    if used_up:
      plan = _json((yield from turn(tool_call_text("get_details_by_id", {"id": line.get("plan_id", "")})))) or {}
      price = plan.get("data_refueling_price_per_gb")
      offer = (f"Your line has used up its data allowance. I can add 2 GB of data for ${2 * float(price):.2f}. "
               f"Would you like me to proceed?") if isinstance(price, (int, float)) else (
               "Your line has used up its data allowance. I can add 2 GB of data. Would you like me to proceed?")
      o = yield from turn(offer)
      if re.search(r"\byes\b|\bplease\b|\bsure\b|\bok", o.lower()):
        yield from turn(tool_call_text("refuel_data", {"customer_id": cid, "line_id": lid, "gb_amount": 2.0}))
    if line.get("roaming_enabled") is False:
      yield from turn(tool_call_text("enable_roaming", {"customer_id": cid, "line_id": lid}))
    yield from stage("mms_settings" if issue == "mms" else "data_settings")
  yield from turn(GOAL_REQUESTS[issue])
  yield f"Thank you for contacting us. {AGENT_STOP}"


def observations(messages: Sequence[Message]) -> tuple[str, list[str]]:
  """(the user's opening, per assistant turn the env messages after it joined by newlines)."""
  opening = next((str(m.get("content", "")) for m in messages if m.get("role") == "user"), "")
  obs: list[str] = []
  seen_assistant = False
  for m in messages:
    if m.get("role") == "assistant":
      obs.append("")
      seen_assistant = True
    elif seen_assistant and m.get("role") in ("user", "tool"):
      obs[-1] = (obs[-1] + "\n" + str(m.get("content", ""))).strip("\n")
  return opening, obs


class ChecklistAgent:
  """``act(messages)``: the checklist's next turn given the conversation so far (deterministic;
  the task is not read). After the checklist ends it stops.

  grouped: ask for up to ``STEPS_PER_TURN`` checks or fixes in one turn (default); False: one
  per turn (longer episodes). checks: False gives the fix-first checklist (every fix of a stage,
  no checks; its fixes are mostly ``fix_without_diagnostic`` by the Verifier's rule).
  """

  def __init__(self, task: Any = None, grouped: bool = True, checks: bool = True):
    del task  # decides from the conversation only
    self.grouped, self.checks = grouped, checks

  def act(self, messages: list[Message]) -> str:
    opening, obs = observations(messages)
    n = sum(m.get("role") == "assistant" for m in messages)
    for i, text in enumerate(_plan(opening, obs, self.grouped, self.checks)):
      if i == n:
        return text
    return AGENT_STOP


def device_step_of(text: str) -> str | None:
  """The ``DEVICE_REQUESTS`` key whose request is ``text`` (None for any other turn)."""
  return next((k for k, (_, _, req) in DEVICE_REQUESTS.items() if req == text), None)
