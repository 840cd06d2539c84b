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
4. airplane mode off, APN reset, reboot (every issue needs service);
5. mobile data and MMS issues: data on, ``get_data_usage`` (used up: plan look-up, 2 GB refuel
   offer, ``refuel_data`` if accepted), ``enable_roaming`` when the line has it off, roaming on,
   Data Saver off, VPN off, network mode ``4g_5g_preferred``;
6. MMS issues: Wi-Fi Calling off, the messaging app's sms and storage permissions;
7. asks the user to check the goal (MMS / speed test / status bar), then ``###STOP###``.

Device steps are asked for in directed plain words ("Please turn off airplane mode."), so a
setting that is already right stays right (the scripted user says so instead of toggling);
every fix is idempotent, which is what lets the agent skip the diagnostics. The issue type is
read from the user's opening message. ``DEVICE_REQUESTS`` maps each device step to its text;
``device_turns(messages)`` finds which assistant turns of an episode are device steps.
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
}
#: grouped device steps (``ChecklistAgent(grouped=True)``, the default): one turn asks for each
#: group's fixes in order, one sentence each (the scripted user does up to
#: ``user_sim.MAX_ACTIONS_PER_TURN`` = 4 per message). Train episodes: 10.4 assistant turns on average, at
#: most 14 (one fix per turn: 16.3, at most 22).
DEVICE_GROUPS: dict[str, tuple[str, ...]] = {
    "basics": ("airplane", "apn", "reboot"),
    "data_basics": ("airplane", "apn", "reboot", "data"),
    "data_settings": ("roaming", "saver", "vpn", "mode"),
    "mms_settings": ("wifi_calling", "sms", "storage"),
}
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


def group_request(group: str) -> str:
  """The one turn that asks for the steps of ``DEVICE_GROUPS[group]``: their requests, in order."""
  return " ".join(DEVICE_REQUESTS[step][2] for step in DEVICE_GROUPS[group])


def _plan(opening: str, obs: Sequence[str], grouped: bool = True) -> Plan:
  """The checklist's turns; ``obs[i]`` is what the env answered to turn i (read only after
  turn i is yielded). grouped: ask for each group of ``DEVICE_GROUPS`` in one turn."""
  k = 0

  def turn(text: str) -> Generator[str, None, str]:
    nonlocal k
    yield text
    k += 1
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
  def steps(group: str) -> Generator[str, None, None]:
    if grouped:
      yield from turn(group_request(group))
    else:
      for step in DEVICE_GROUPS[group]:
        yield from turn(DEVICE_REQUESTS[step][2])

  issue = issue_of(opening)
  yield from steps("basics" if issue == "service" else "data_basics")
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
    yield from steps("data_settings")
  if issue == "mms":
    yield from steps("mms_settings")
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

  grouped: ask for each group of fixes (``DEVICE_GROUPS``) in one turn (default); False: one fix
  per turn (longer episodes; the turn counts of both are at ``DEVICE_GROUPS``).
  """

  def __init__(self, task: Any = None, grouped: bool = True):
    del task  # decides from the conversation only
    self.grouped = grouped

  def act(self, messages: list[Message]) -> str:
    opening, obs = observations(messages)
    n = sum(m.get("role") == "assistant" for m in messages)
    for i, text in enumerate(_plan(opening, obs, self.grouped)):
      if i == n:
        return text
    return AGENT_STOP


def device_step_of(text: str) -> str | None:
  """The ``DEVICE_REQUESTS`` key whose request is ``text`` (None for any other turn)."""
  return next((k for k, (_, _, req) in DEVICE_REQUESTS.items() if req == text), None)
