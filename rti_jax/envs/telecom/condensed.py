"""A condensed Telecom policy for a tiny policy model (``TelecomEnv(policy=CONDENSED_POLICY)``).

The full policy text (``env.policy_text()``: tau2-bench's ``main_policy.md`` + ``tech_support_manual.md``
+ the offline conventions) is about 23.5k characters; a tiny model with a 4k context cannot hold it
next to a 20-turn episode. ``CONDENSED_POLICY`` keeps every rule and every name a task of the
benchmark needs, as short imperative lines, and drops the rest. What exactly was condensed:

| full text (section)                                   | condensed policy                                            |
| ----------------------------------------------------- | ----------------------------------------------------------- |
| main policy: role, one tool call *or* one message per turn, deny out-of-policy requests, transfer procedure and exact transfer message | kept, one line each (transfer message verbatim)  |
| main policy: "do not give information not provided by the user or tools" | kept, one line                              |
| main policy: current time 2025-02-25 12:08 EST         | date kept (contract-end comparisons need it), time dropped  |
| main policy: Domain Basics (customer / payment method / line / plan / device / bill field lists, status types) | dropped: the tools' JSON shows the fields |
| main policy: Customer Lookup (phone, id, name + date of birth) | kept as "ask for the phone number, get_customer_by_phone"; the name + dob route dropped (no task needs it; the tool schema still lists it) |
| main policy: Overdue Bill Payment (check overdue, amount, send request, user pays, check PAID; one bill awaiting payment) | kept as one line with the tool order |
| main policy: Line Suspension (overdue bill / contract end; resume only after payment, never after contract end; reboot after resume) | kept, two lines |
| main policy: Data Refueling (max 2 GB, confirm price, apply) | kept, one line |
| main policy: Change Plan (6 steps)                     | one line: offer it only as an alternative to refuelling (no task requires a plan change; the scripted user declines it) |
| main policy: Data Roaming (enable for free when travelling) | kept, one line                                          |
| manual: introduction, "try everything before transferring" | kept as one line                                        |
| manual: 14 diagnostic + 14 fix device-tool descriptions | dropped; the device-tool *names* are kept in one list (which side runs them is the rule that matters) |
| manual: Service (airplane mode, SIM missing -> reseat_sim_card, SIM locked -> transfer, APN incorrect -> reset_apn_settings then reboot_device, line suspended) | kept as a checklist line each |
| manual: Mobile data (data off -> toggle_data, roaming, data limit, Data Saver, VPN poor -> disconnect_vpn, network mode -> set_network_mode_preference 4g_5g_preferred; "below excellent is slow") | kept as a checklist line each |
| manual: MMS (needs service + data, >= 3G, MMSC URL -> reset APN + reboot, Wi-Fi Calling off, messaging app needs sms and storage permissions) | kept as a checklist line each |
| manual: explanations of what MMS / APN / VPN / mobile data are | dropped |
| offline conventions (user-device tools listed, end with ###STOP###) | kept                                                  |

The argument values a device request needs (``4g_5g_preferred``, ``messaging``, ``sms``,
``storage``) stay in the text, so the rule-based Validator's hints, which may name values the
policy text shows (``rules_telecom.TelecomRuleValidator(policy=...)``), name nothing the policy
model cannot see; ``required_names()`` lists every tool name the 114 tasks need, and the tests
check that each appears.
"""

from __future__ import annotations

from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom.env import AGENT_STOP, TRANSFER_MESSAGE

CONDENSED_POLICY = f"""You are a telecom support agent. Today is 2025-02-25.
Each turn is either one tool call or one message to the user, never both.
Use only what the user or a tool told you. Deny requests against this policy.
First ask for the phone number, then get_customer_by_phone. Look up the line with get_details_by_id.
Phone tools run only on the user's phone: never call them yourself. Ask the user to run them and tell you the result: {", ".join(dt.DEVICE_TOOLS)}.
Service: airplane mode must be off. SIM missing: reseat_sim_card. SIM locked: transfer. APN incorrect: reset_apn_settings, then reboot_device.
Suspended line: if the contract end date is past, transfer. If a bill is overdue: get_bills_for_customer, send_payment_request, the user pays with make_payment, then resume_line and the user must reboot_device.
Mobile data: data on (toggle_data). Abroad: roaming on (toggle_roaming) and enable_roaming on the line, free. Data Saver off. Poor VPN: disconnect_vpn. Network mode: set_network_mode_preference with mode 4g_5g_preferred. Slow means below excellent.
Data used up: offer refuel_data of at most 2 GB at the plan's price per GB; refuel after the user agrees.
MMS: needs service and data. Wi-Fi Calling off (toggle_wifi_calling). The messaging app needs the sms and storage permissions (grant_app_permission).
Try every fix before transferring. To transfer: call transfer_to_human_agents, then say '{TRANSFER_MESSAGE}'
When fixed, ask the user to check (can_send_mms, run_speed_test or check_status_bar), then end with {AGENT_STOP}."""


def required_names() -> tuple[str, ...]:
  """Every tool name (agent or device side) that an expected action of a base task uses, plus
  the three goal checks; sorted. The condensed policy must mention each."""
  from rti_jax.envs.telecom.tasks import load_split

  names = {a.name for t in load_split("base") for a in t.actions}
  names |= {"can_send_mms", "run_speed_test", "check_status_bar", "get_customer_by_phone"}
  return tuple(sorted(names))


def prompt_stats(tokenizer: object | None = None) -> dict[str, int]:
  """Characters (and with ``tokenizer``, tokens) of the full and the condensed system prompts
  (policy + agent-tool schemas, as ``env.system_prompt`` renders them)."""
  from rti_jax.envs.telecom.env import system_prompt

  out: dict[str, int] = {}
  for key, text in (("full", system_prompt()), ("condensed", system_prompt(CONDENSED_POLICY))):
    out[f"{key}_chars"] = len(text)
    if tokenizer is not None:
      out[f"{key}_tokens"] = len(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
  return out
