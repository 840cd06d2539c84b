"""The agent's (carrier back-office) tools over the agent DB, with their schemas.

Each tool is a function ``(state, **arguments) -> str`` returning compact JSON or a
short sentence; a bad id or argument returns ``"Error: ..."`` naming the argument,
the expected and the received value (never raises). Tools follow the main policy
(``data/main_policy.md``) where the policy describes the tool's own behaviour (the
refuel cap of 2 GB, one bill awaiting payment at a time) and leave policy decisions
(e.g. not resuming a line whose contract ended) to the agent, as tau2-bench does.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable

from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.state import TelecomState

MAX_REFUEL_GB = 2.0


class ToolError(Exception):
  """A bad argument; the environment turns it into an error observation."""


def _dump(obj: Any) -> str:
  return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _customer(state: TelecomState, customer_id: str) -> dict[str, Any]:
  customer = st.find_record(state.db, "customers", "customer_id", customer_id)
  if customer is None:
    raise ToolError(f"customer_id {customer_id!r} not found (expected an id like 'C1001')")
  return customer


def _line_of(state: TelecomState, customer_id: str, line_id: str) -> dict[str, Any]:
  customer = _customer(state, customer_id)
  line = st.find_record(state.db, "lines", "line_id", line_id)
  if line is None:
    raise ToolError(f"line_id {line_id!r} not found (expected an id like 'L1001')")
  if line_id not in customer["line_ids"]:
    raise ToolError(f"line_id {line_id!r} does not belong to customer {customer_id!r} "
                    f"(its lines: {customer['line_ids']})")
  return line


def _customer_summary(state: TelecomState, customer: dict[str, Any]) -> dict[str, Any]:
  """A terse customer view for lookups: ids, name, status, and each line's number and status
  (the full record is ``get_details_by_id``)."""
  lines = []
  for line_id in customer["line_ids"]:
    line = st.find_record(state.db, "lines", "line_id", line_id)
    if line is not None:
      lines.append({"line_id": line_id, "phone_number": line["phone_number"], "status": line["status"]})
  return {"customer_id": customer["customer_id"], "full_name": customer["full_name"],
          "phone_number": customer["phone_number"], "account_status": customer["account_status"],
          "lines": lines, "bill_ids": customer["bill_ids"]}


# ----------------------------------------------------------------------------- lookups


def get_customer_by_phone(state: TelecomState, phone_number: str) -> str:
  wanted = st.digits(phone_number)
  if len(wanted) < 7:
    raise ToolError(f"phone_number must be a phone number like '555-123-2002', got {phone_number!r}")
  for customer in state.db["customers"]:
    if st.digits(customer["phone_number"]) == wanted:
      return _dump(_customer_summary(state, customer))
  line = st.line_by_phone(state.db, phone_number)
  if line is not None:
    customer = st.customer_of_line(state.db, line["line_id"])
    if customer is not None:
      return _dump(_customer_summary(state, customer))
  raise ToolError(f"no customer with phone_number {phone_number!r}")


def get_customer_by_id(state: TelecomState, customer_id: str) -> str:
  return _dump(_customer_summary(state, _customer(state, customer_id)))


def get_customer_by_name(state: TelecomState, full_name: str, dob: str) -> str:
  for customer in state.db["customers"]:
    if customer["full_name"].lower() == full_name.strip().lower() and customer["date_of_birth"] == dob.strip():
      return _dump(_customer_summary(state, customer))
  raise ToolError(f"no customer with full_name {full_name!r} and dob {dob!r} (dob format YYYY-MM-DD)")


_ID_TABLES = {"C": ("customers", "customer_id"), "L": ("lines", "line_id"), "P": ("plans", "plan_id"),
              "D": ("devices", "device_id"), "B": ("bills", "bill_id")}


def get_details_by_id(state: TelecomState, id: str) -> str:  # noqa: A002 (the tool's argument name)
  table = _ID_TABLES.get(id[:1].upper()) if id else None
  record = st.find_record(state.db, *table, id) if table else None
  if record is None:
    raise ToolError(f"id {id!r} not found (expected a customer C..., line L..., plan P..., device D... or bill B... id)")
  return _dump(record)


def get_bills_for_customer(state: TelecomState, customer_id: str) -> str:
  customer = _customer(state, customer_id)
  bills = [b for b in state.db["bills"] if b["bill_id"] in customer["bill_ids"]]
  bills.sort(key=lambda b: b["issue_date"], reverse=True)
  return _dump([{k: b[k] for k in ("bill_id", "period_start", "period_end", "total_due", "due_date", "status")}
                for b in bills])


def get_data_usage(state: TelecomState, customer_id: str, line_id: str) -> str:
  line = _line_of(state, customer_id, line_id)
  return _dump({"line_id": line_id, "data_used_gb": line["data_used_gb"],
                "data_limit_gb": st.plan_data_limit_gb(state.db, line),
                "data_refueling_gb": line["data_refueling_gb"], "cycle_end_date": "2025-02-28"})


def get_available_plans(state: TelecomState) -> str:
  return _dump(state.db["plans"])


# ----------------------------------------------------------------------------- actions


def enable_roaming(state: TelecomState, customer_id: str, line_id: str) -> str:
  line = _line_of(state, customer_id, line_id)
  if line["roaming_enabled"]:
    return f"Roaming is already enabled on line {line_id}."
  line["roaming_enabled"] = True
  return f"Roaming enabled on line {line_id}."


def disable_roaming(state: TelecomState, customer_id: str, line_id: str) -> str:
  line = _line_of(state, customer_id, line_id)
  if not line["roaming_enabled"]:
    return f"Roaming is already disabled on line {line_id}."
  line["roaming_enabled"] = False
  return f"Roaming disabled on line {line_id}."


def refuel_data(state: TelecomState, customer_id: str, line_id: str, gb_amount: float) -> str:
  line = _line_of(state, customer_id, line_id)
  if not 0 < gb_amount <= MAX_REFUEL_GB:
    raise ToolError(f"gb_amount must be in (0, {MAX_REFUEL_GB}] GB, got {gb_amount!r}")
  plan = st.find_record(state.db, "plans", "plan_id", line["plan_id"])
  price = float(plan["data_refueling_price_per_gb"]) * gb_amount
  line["data_refueling_gb"] = round(float(line["data_refueling_gb"]) + gb_amount, 6)
  return (f"Refueled {gb_amount:g} GB on line {line_id} for ${price:.2f}. "
          f"Refueled this cycle: {line['data_refueling_gb']:g} GB.")


def change_plan(state: TelecomState, customer_id: str, line_id: str, plan_id: str) -> str:
  line = _line_of(state, customer_id, line_id)
  plan = st.find_record(state.db, "plans", "plan_id", plan_id)
  if plan is None:
    raise ToolError(f"plan_id {plan_id!r} not found (plans: {[p['plan_id'] for p in state.db['plans']]})")
  line["plan_id"] = plan_id
  line["last_plan_change_date"] = st.TODAY
  return f"Line {line_id} changed to {plan['name']} ({plan_id}), ${plan['price_per_month']:.2f}/month."


def suspend_line(state: TelecomState, customer_id: str, line_id: str, reason: str) -> str:
  line = _line_of(state, customer_id, line_id)
  if line["status"] != "Active":
    raise ToolError(f"line {line_id} must be Active to suspend, its status is {line['status']!r}")
  line["status"] = "Suspended"
  line["suspension_start_date"] = st.TODAY
  return f"Line {line_id} suspended ({reason})."


def resume_line(state: TelecomState, customer_id: str, line_id: str) -> str:
  line = _line_of(state, customer_id, line_id)
  if line["status"] != "Suspended":
    raise ToolError(f"line {line_id} must be Suspended to resume, its status is {line['status']!r}")
  line["status"] = "Active"
  line.pop("suspension_start_date", None)
  return f"Line {line_id} resumed. The user must reboot the phone to get service."


def send_payment_request(state: TelecomState, customer_id: str, bill_id: str) -> str:
  customer = _customer(state, customer_id)
  if bill_id not in customer["bill_ids"]:
    raise ToolError(f"bill_id {bill_id!r} is not a bill of customer {customer_id!r} (bills: {customer['bill_ids']})")
  for other in state.db["bills"]:
    if other["bill_id"] in customer["bill_ids"] and other["status"] == "Awaiting Payment":
      raise ToolError(f"customer {customer_id} already has bill {other['bill_id']} awaiting payment")
  bill = st.find_record(state.db, "bills", "bill_id", bill_id)
  bill["status"] = "Awaiting Payment"
  return f"Payment request for bill {bill_id} (${float(bill['total_due']):.2f}) sent to the customer."


def transfer_to_human_agents(state: TelecomState, summary: str) -> str:
  del state, summary
  return "Transfer successful."


@dataclasses.dataclass(frozen=True)
class AgentTool:
  """An agent tool: function, JSON-schema properties (all required) and description."""

  name: str
  fn: Callable[..., str]
  description: str
  properties: dict[str, dict[str, str]]

  def schema(self) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": self.name, "description": self.description,
        "parameters": {"type": "object", "properties": self.properties,
                       "required": list(self.properties)}}}


_S = {"type": "string"}
_CID = {"customer_id": {"type": "string", "description": "customer id, e.g. C1001"}}
_CL = {**_CID, "line_id": {"type": "string", "description": "line id, e.g. L1001"}}

AGENT_TOOLS: dict[str, AgentTool] = {t.name: t for t in [
    AgentTool("get_customer_by_phone", get_customer_by_phone, "Find a customer by phone number.",
              {"phone_number": _S}),
    AgentTool("get_customer_by_id", get_customer_by_id, "Get a customer by customer id.", dict(_CID)),
    AgentTool("get_customer_by_name", get_customer_by_name,
              "Find a customer by full name and date of birth (YYYY-MM-DD).", {"full_name": _S, "dob": _S}),
    AgentTool("get_details_by_id", get_details_by_id,
              "Get a customer, line, plan, device or bill record by its id.", {"id": _S}),
    AgentTool("get_bills_for_customer", get_bills_for_customer, "List a customer's bills, newest first.",
              dict(_CID)),
    AgentTool("get_data_usage", get_data_usage, "Data used, plan limit and refuelled data of a line.", dict(_CL)),
    AgentTool("get_available_plans", get_available_plans, "List all plans.", {}),
    AgentTool("enable_roaming", enable_roaming, "Enable roaming on a line (free).", dict(_CL)),
    AgentTool("disable_roaming", disable_roaming, "Disable roaming on a line.", dict(_CL)),
    AgentTool("refuel_data", refuel_data, "Add data (at most 2 GB) to a line at the plan's price per GB.",
              {**_CL, "gb_amount": {"type": "number"}}),
    AgentTool("change_plan", change_plan, "Change a line's plan.", {**_CL, "plan_id": _S}),
    AgentTool("suspend_line", suspend_line, "Suspend an active line.", {**_CL, "reason": _S}),
    AgentTool("resume_line", resume_line, "Resume a suspended line.", dict(_CL)),
    AgentTool("send_payment_request", send_payment_request,
              "Send the customer a payment request for a bill (sets it to Awaiting Payment).",
              {**_CID, "bill_id": _S}),
    AgentTool("transfer_to_human_agents", transfer_to_human_agents,
              "Transfer the user to a human agent, with a summary of the issue.", {"summary": _S}),
]}


def _check_arguments(tool: AgentTool, arguments: dict[str, Any]) -> dict[str, Any]:
  missing = [p for p in tool.properties if p not in arguments]
  extra = [a for a in arguments if a not in tool.properties]
  if missing or extra:
    raise ToolError(f"{tool.name} takes ({', '.join(tool.properties) or 'no arguments'}); "
                    f"missing {missing}, unexpected {extra}")
  clean = {}
  for name, value in arguments.items():
    kind = tool.properties[name]["type"]
    if kind == "number":
      if isinstance(value, bool):  # JSON true/false is not a number (float(True) would read it as 1)
        raise ToolError(f"argument {name} of {tool.name} must be a number, got {value!r}")
      try:
        value = float(value)  # a JSON number, or a numeric string as tau2's argument parsing accepts
      except (TypeError, ValueError, OverflowError):
        raise ToolError(f"argument {name} of {tool.name} must be a number, got {value!r}") from None
      if not math.isfinite(value):
        raise ToolError(f"argument {name} of {tool.name} must be a finite number, got {value!r}")
    elif not isinstance(value, str):
      raise ToolError(f"argument {name} of {tool.name} must be a string, got {value!r}")
    clean[name] = value
  return clean


def run_agent_tool(state: TelecomState, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
  """Runs agent tool ``name``; returns (observation, ok). Never raises on bad input."""
  tool = AGENT_TOOLS.get(name)
  if tool is None:
    return f"Error: unknown tool {name!r}; available tools: {', '.join(AGENT_TOOLS)}.", False
  try:
    return tool.fn(state, **_check_arguments(tool, arguments)), True
  except ToolError as e:
    return f"Error: {e}.", False
