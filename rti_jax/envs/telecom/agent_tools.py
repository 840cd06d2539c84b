"""The agent's (carrier back-office) tools over the agent DB, with their schemas.

Each tool is a function ``(state, **arguments) -> str`` returning compact JSON or a
short sentence; a bad id or argument returns ``"Error: ..."`` naming the argument,
the expected and the received value (never raises). The tools, their arguments and
their effects are tau2-bench's 13 agent tools (``tests/test_tau2_parity.py`` checks
the rewards against it): they check what the tool itself requires (a line must be
Active to suspend, one bill awaiting payment at a time, a positive refuel) and leave
policy decisions (the 2 GB refuel cap, not resuming a line whose contract ended) to
the agent. Lookups by phone number match the number exactly as the DB writes it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable

from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.state import TelecomState

#: the policy's refuel cap (the tool itself accepts any positive amount, as tau2-bench's does)
MAX_REFUEL_GB = 2.0


class ToolError(Exception):
  """A bad argument; the environment turns it into an error observation."""


def _short(value: object, limit: int = 40) -> str:
  """``repr(value)`` cut to ``limit`` characters (a 5,000-digit literal stays readable)."""
  if isinstance(value, int) and value.bit_length() > 100:  # repr() refuses past 4,300 digits
    return f"an integer of {len(str(abs(value))) if value.bit_length() < 14_000 else 'over 4,000'} digits"
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


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
  customer = st.customer_by_phone(state.db, phone_number)
  if customer is None:
    raise ToolError(f"no customer with phone_number {phone_number!r} (numbers are written like '555-123-2002')")
  return _dump(_customer_summary(state, customer))


def get_customer_by_id(state: TelecomState, customer_id: str) -> str:
  return _dump(_customer_summary(state, _customer(state, customer_id)))


def get_customer_by_name(state: TelecomState, full_name: str, dob: str) -> str:
  """Every customer with this full name (any case) and date of birth (YYYY-MM-DD); may be empty."""
  return _dump([_customer_summary(state, c) for c in state.db["customers"]
                if c["full_name"].lower() == full_name.lower() and c["date_of_birth"] == dob])


_ID_TABLES = {"C": ("customers", "customer_id"), "L": ("lines", "line_id"), "P": ("plans", "plan_id"),
              "D": ("devices", "device_id"), "B": ("bills", "bill_id")}


def get_details_by_id(state: TelecomState, id: str) -> str:  # noqa: A002 (the tool's argument name)
  table = _ID_TABLES.get(id[:1]) if id else None
  record = st.find_record(state.db, *table, id) if table else None
  if record is None:
    raise ToolError(f"id {id!r} not found (expected a customer C..., line L..., plan P..., device D... or bill B... id)")
  return _dump(record)


def get_bills_for_customer(state: TelecomState, customer_id: str, limit: int = 12) -> str:
  customer = _customer(state, customer_id)
  bills = [b for b in state.db["bills"] if b["bill_id"] in customer["bill_ids"]]
  bills.sort(key=lambda b: b["issue_date"], reverse=True)
  return _dump([{k: b[k] for k in ("bill_id", "period_start", "period_end", "total_due", "due_date", "status")}
                for b in bills[:limit]])


def get_data_usage(state: TelecomState, customer_id: str, line_id: str) -> str:
  line = _line_of(state, customer_id, line_id)
  return _dump({"line_id": line_id, "data_used_gb": line["data_used_gb"],
                "data_limit_gb": st.plan_data_limit_gb(state.db, line),
                "data_refueling_gb": line["data_refueling_gb"], "cycle_end_date": "2025-02-28"})


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
  """Adds ``gb_amount`` GB to the line and charges it on the customer's draft bill."""
  line = _line_of(state, customer_id, line_id)
  if gb_amount <= 0:
    raise ToolError(f"gb_amount must be positive, got {gb_amount!r}")
  plan = st.find_record(state.db, "plans", "plan_id", line["plan_id"])
  if plan is None:
    raise ToolError(f"line {line_id} has no plan")
  rate = plan["data_refueling_price_per_gb"]
  price = gb_amount * rate
  line["data_refueling_gb"] = line["data_refueling_gb"] + gb_amount
  _charge(state, customer_id, price, f"Data refueling: {gb_amount} GB at ${rate}/GB")
  return (f"Refueled {gb_amount:g} GB on line {line_id} for ${price:.2f}. "
          f"Refueled this cycle: {line['data_refueling_gb']:g} GB.")


def _charge(state: TelecomState, customer_id: str, amount: float, description: str) -> None:
  """A one-time charge on the customer's Draft bill (a new one for next month if none)."""
  customer = _customer(state, customer_id)
  draft = next((b for i in customer["bill_ids"]
                if (b := st.find_record(state.db, "bills", "bill_id", i)) is not None and b["status"] == "Draft"), None)
  if draft is None:
    draft = {"bill_id": f"B{customer_id}D{len(state.db['bills'])}", "customer_id": customer_id,
             "period_start": "2025-03-01", "period_end": "2025-03-31", "issue_date": "2025-03-01",
             "total_due": 0, "due_date": "2025-03-15", "status": "Draft", "line_items": []}
    state.db["bills"].append(draft)
    customer["bill_ids"].append(draft["bill_id"])
  draft["line_items"].append({"description": description, "amount": amount, "date": st.TODAY,
                              "item_type": "Credit" if amount < 0 else "Charge"})
  draft["total_due"] = draft["total_due"] + amount


def suspend_line(state: TelecomState, customer_id: str, line_id: str, reason: str) -> str:
  line = _line_of(state, customer_id, line_id)
  if line["status"] != "Active":
    raise ToolError(f"line {line_id} must be Active to suspend, its status is {line['status']!r}")
  line["status"] = "Suspended"
  line["suspension_start_date"] = st.TODAY
  return f"Line {line_id} suspended ({reason})."


def resume_line(state: TelecomState, customer_id: str, line_id: str) -> str:
  line = _line_of(state, customer_id, line_id)
  if line["status"] not in ("Suspended", "Pending Activation"):
    raise ToolError(f"line {line_id} must be Suspended or Pending Activation to resume, "
                    f"its status is {line['status']!r}")
  line["status"] = "Active"
  line.pop("suspension_start_date", None)
  return f"Line {line_id} resumed. The user must reboot the phone to get service."


def send_payment_request(state: TelecomState, customer_id: str, bill_id: str) -> str:
  customer = _customer(state, customer_id)
  for other in state.db["bills"]:
    if other["bill_id"] in customer["bill_ids"] and other["status"] == "Awaiting Payment":
      raise ToolError(f"customer {customer_id} already has bill {other['bill_id']} awaiting payment")
  if bill_id not in customer["bill_ids"]:
    raise ToolError(f"bill_id {bill_id!r} is not a bill of customer {customer_id!r} (bills: {customer['bill_ids']})")
  bill = st.find_record(state.db, "bills", "bill_id", bill_id)
  bill["status"] = "Awaiting Payment"
  return f"Payment request for bill {bill_id} (${float(bill['total_due']):.2f}) sent to the customer."


def transfer_to_human_agents(state: TelecomState, summary: str) -> str:
  del state, summary
  return "Transfer successful."


@dataclasses.dataclass(frozen=True)
class AgentTool:
  """An agent tool: function, description, JSON-schema properties (required unless named in
  ``optional``)."""

  name: str
  fn: Callable[..., str]
  description: str
  properties: dict[str, dict[str, str]]
  optional: tuple[str, ...] = ()

  @property
  def required(self) -> list[str]:
    return [p for p in self.properties if p not in self.optional]

  def schema(self) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": self.name, "description": self.description,
        "parameters": {"type": "object", "properties": self.properties,
                       "required": self.required}}}


_S = {"type": "string"}
#: free text that the tool only logs (any JSON value is accepted, as tau2-bench's tools do)
_ANY = {"type": "string"}  # (``is``-compared: a separate object from _S)
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
    AgentTool("get_bills_for_customer", get_bills_for_customer,
              "List a customer's bills, newest first (at most limit, default 12).",
              {**_CID, "limit": {"type": "integer"}}, optional=("limit",)),
    AgentTool("get_data_usage", get_data_usage, "Data used, plan limit and refuelled data of a line.", dict(_CL)),
    AgentTool("enable_roaming", enable_roaming, "Enable roaming on a line (free).", dict(_CL)),
    AgentTool("disable_roaming", disable_roaming, "Disable roaming on a line.", dict(_CL)),
    AgentTool("refuel_data", refuel_data, "Add data to a line, charged at the plan's price per GB.",
              {**_CL, "gb_amount": {"type": "number"}}),
    AgentTool("suspend_line", suspend_line, "Suspend an active line.", {**_CL, "reason": _ANY}),
    AgentTool("resume_line", resume_line, "Resume a suspended line.", dict(_CL)),
    AgentTool("send_payment_request", send_payment_request,
              "Send the customer a payment request for a bill (sets it to Awaiting Payment).",
              {**_CID, "bill_id": _S}),
    AgentTool("transfer_to_human_agents", transfer_to_human_agents,
              "Transfer the user to a human agent, with a summary of the issue.", {"summary": _ANY}),
]}


def _check_arguments(tool: AgentTool, arguments: dict[str, Any]) -> dict[str, Any]:
  """Names and JSON types as the schema says (a number is a JSON number, not a numeric
  string; an integer is a whole JSON number); raises ToolError otherwise."""
  missing = [p for p in tool.required if p not in arguments]
  extra = [a for a in arguments if a not in tool.properties]
  if missing or extra:
    raise ToolError(f"{tool.name} takes ({', '.join(tool.properties) or 'no arguments'}); "
                    f"missing {missing}, unexpected {extra}")
  clean = {}
  for name, value in arguments.items():
    spec = tool.properties[name]
    kind = spec["type"]
    if spec is _ANY:
      pass
    elif kind in ("number", "integer"):
      # JSON true/false is not a number; a numeric string is not one either (tau2-bench's
      # tools fail on it)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "integer" and not isinstance(value, int)):
        raise ToolError(f"argument {name} of {tool.name} must be a{'n integer' if kind == 'integer' else ' number'}, "
                        f"got {value!r}")
      try:
        finite = math.isfinite(value)
      except OverflowError:  # an integer literal beyond any float
        finite = False
      if not finite:
        raise ToolError(f"argument {name} of {tool.name} must be a finite number, got {_short(value)}")
      value = float(value) if kind == "number" else value
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
