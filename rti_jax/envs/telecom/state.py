"""tau2-Telecom domain state: the agent's DB, the user's phone and its surroundings.

Three pieces, loaded from the copied tau2-bench data files and mutated by tools:

* ``db``: the carrier's records (plans, devices, lines, customers, bills), a plain
  dict read from ``data/db.toml`` (the agent-side tools read and write it);
* ``phone``: the user's handset (``PhoneState``, from ``data/user_db.toml``);
* ``surroundings``: what links the phone to the world: who the user is, whether
  they are abroad, and what the carrier's records say about their line (active,
  roaming allowed, data exhausted, pending payment request).

Consistency rule: ``sync_surroundings`` copies the line's carrier-side facts onto the
phone after every tool call, and ``network_search`` re-registers the phone on the
network (derives signal, technology and connection status) after every device
action that changes settings, as a real handset does. Each task's initialization
actions (``apply_init_action``) inject its faults; ``initialize`` ends with one sync
and one network search so the phone is consistent before the first turn.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.resources
import tomllib
from typing import Any

#: The policy's "current time" (main_policy.md): 2025-02-25 12:08 EST.
TODAY = "2025-02-25"

NETWORK_MODES = ("4g_5g_preferred", "4g_only", "3g_only", "2g_only")
#: technology the phone registers on for each network-mode preference
_MODE_TECHNOLOGY = {"4g_5g_preferred": "5G", "4g_only": "4G", "3g_only": "3G", "2g_only": "2G"}
SIGNAL_LEVELS = ("none", "poor", "fair", "good", "excellent")
SIM_STATUSES = ("active", "missing", "locked_pin", "locked_puk")
#: the APN name written by the ``break_apn_settings`` fault (no data or service)
BROKEN_APN_NAME = "broken"


@dataclasses.dataclass
class ApnSettings:
  """The phone's access-point settings; ``mmsc_url`` None means MMS cannot be sent."""

  apn_name: str
  mms_apn: str
  mmsc_url: str | None


@dataclasses.dataclass
class PhoneState:
  """The user's handset. Fields named as in ``user_db.toml``; derived fields
  (``network_*``) are only written by ``network_search``."""

  sim_card_status: str
  sim_card_missing: bool
  airplane_mode: bool
  network_signal_strength: str
  network_technology_connected: str
  network_connection_status: str
  battery_level: int
  data_enabled: bool
  roaming_enabled: bool
  network_mode_preference: str
  wifi_enabled: bool
  wifi_connected: bool
  wifi_signal_strength: str
  wifi_calling_enabled: bool
  wifi_calling_mms_over_wifi: bool
  data_saver_mode: bool
  vpn_enabled_setting: bool
  vpn_connected: bool
  active_apn_settings: ApnSettings
  app_permissions: dict[str, dict[str, bool]]
  #: "good" or "poor"; the ``break_vpn`` fault connects a poor VPN
  vpn_performance: str = "good"
  #: ``reset_apn_settings`` restores the default APN at the next reboot
  apn_reset_pending: bool = False


@dataclasses.dataclass
class PaymentRequest:
  bill_id: str
  amount: float


@dataclasses.dataclass
class Surroundings:
  """The user's identity and location, and the carrier's view of their line."""

  user_name: str | None = None
  phone_number: str | None = None
  is_abroad: bool = False
  #: radio conditions where the user is (the phone's best possible signal)
  signal_at_location: str = "good"
  #: no wifi network is reachable in any base task ("You do not have access to wifi")
  wifi_available: bool = False
  line_active: bool = True
  line_roaming_allowed: bool = False
  data_exhausted: bool = False
  payment_request: PaymentRequest | None = None


@dataclasses.dataclass
class TelecomState:
  """Everything one episode mutates."""

  db: dict[str, Any]
  phone: PhoneState
  surroundings: Surroundings
  default_apn: ApnSettings


# ----------------------------------------------------------------------------- loading


@functools.cache
def _load_toml(name: str) -> dict[str, Any]:
  text = importlib.resources.files("rti_jax.envs.telecom").joinpath("data", name).read_bytes()
  return tomllib.loads(text.decode("utf-8"))


def load_db() -> dict[str, Any]:
  """A fresh copy of the agent DB: {"plans", "devices", "lines", "customers", "bills"}."""
  db = copy.deepcopy(_load_toml("db.toml"))
  for customer in db["customers"]:
    customer.setdefault("payment_methods", [])
    customer.setdefault("line_ids", [])
    customer.setdefault("bill_ids", [])
  for bill in db["bills"]:
    bill.setdefault("line_items", [])
  return db


def load_phone() -> tuple[PhoneState, ApnSettings]:
  """A fresh phone from ``user_db.toml`` and its default (carrier) APN settings."""
  raw = copy.deepcopy(_load_toml("user_db.toml")["device"])
  apn = ApnSettings(**raw.pop("active_apn_settings"))
  apps = raw.pop("app_statuses")
  permissions = {name: dict(app["permissions"]) for name, app in apps.items()}
  phone = PhoneState(active_apn_settings=copy.deepcopy(apn), app_permissions=permissions, **raw)
  return phone, apn


def fresh_state() -> TelecomState:
  phone, apn = load_phone()
  return TelecomState(db=load_db(), phone=phone, surroundings=Surroundings(), default_apn=apn)


# ----------------------------------------------------------------------------- DB lookups


def find_record(db: dict[str, Any], table: str, key: str, value: str) -> dict[str, Any] | None:
  """The first record of ``db[table]`` whose ``key`` equals ``value``, or None."""
  for record in db[table]:
    if record.get(key) == value:
      return record
  return None


def digits(phone_number: str) -> str:
  return "".join(ch for ch in str(phone_number) if ch.isdigit())


def line_by_phone(db: dict[str, Any], phone_number: str) -> dict[str, Any] | None:
  wanted = digits(phone_number)
  for line in db["lines"]:
    if digits(line["phone_number"]) == wanted:
      return line
  return None


def customer_of_line(db: dict[str, Any], line_id: str) -> dict[str, Any] | None:
  for customer in db["customers"]:
    if line_id in customer["line_ids"]:
      return customer
  return None


def plan_data_limit_gb(db: dict[str, Any], line: dict[str, Any]) -> float:
  plan = find_record(db, "plans", "plan_id", line["plan_id"])
  return float(plan["data_limit_gb"]) if plan else 0.0


def line_data_exhausted(db: dict[str, Any], line: dict[str, Any]) -> bool:
  """Data stops when usage exceeds the plan's limit plus refuelled data (main policy)."""
  return float(line["data_used_gb"]) > plan_data_limit_gb(db, line) + float(line["data_refueling_gb"])


# ----------------------------------------------------------------------------- consistency


def sync_surroundings(state: TelecomState) -> None:
  """Copies the user's line facts from the agent DB onto the phone's surroundings."""
  s = state.surroundings
  line = line_by_phone(state.db, s.phone_number) if s.phone_number else None
  if line is None:
    s.line_active, s.line_roaming_allowed, s.data_exhausted, s.payment_request = False, False, True, None
    return
  s.line_active = line["status"] == "Active"
  s.line_roaming_allowed = bool(line["roaming_enabled"])
  s.data_exhausted = line_data_exhausted(state.db, line)
  customer = customer_of_line(state.db, line["line_id"])
  s.payment_request = None
  if customer is not None:
    for bill in state.db["bills"]:
      if bill["bill_id"] in customer["bill_ids"] and bill["status"] == "Awaiting Payment":
        s.payment_request = PaymentRequest(bill_id=bill["bill_id"], amount=float(bill["total_due"]))
        break


def apn_is_broken(phone: PhoneState) -> bool:
  return phone.active_apn_settings.apn_name == BROKEN_APN_NAME


def sim_usable(phone: PhoneState) -> bool:
  return not phone.sim_card_missing and phone.sim_card_status == "active"


def network_search(state: TelecomState) -> None:
  """Re-registers the phone: derives connection status, signal and technology.

  Service needs airplane mode off, a seated unlocked SIM, a working APN and an
  active line; the technology follows the network-mode preference and the signal
  is the location's.
  """
  phone, s = state.phone, state.surroundings
  has_service = (not phone.airplane_mode and sim_usable(phone) and not apn_is_broken(phone)
                 and s.line_active)
  if has_service:
    phone.network_connection_status = "connected"
    phone.network_signal_strength = s.signal_at_location
    phone.network_technology_connected = _MODE_TECHNOLOGY[phone.network_mode_preference]
  else:
    phone.network_connection_status = "no_service"
    phone.network_signal_strength = "none"
    phone.network_technology_connected = "none"
  phone.wifi_connected = phone.wifi_enabled and not phone.airplane_mode and s.wifi_available
  phone.wifi_signal_strength = s.signal_at_location if phone.wifi_connected else "none"
  phone.vpn_connected = phone.vpn_enabled_setting and (has_service or phone.wifi_connected)


def mobile_data_working(state: TelecomState) -> bool:
  """Cellular data flows: service, data on, roaming allowed when abroad, data left."""
  phone, s = state.phone, state.surroundings
  if phone.network_connection_status != "connected" or not phone.data_enabled:
    return False
  if s.is_abroad and not (phone.roaming_enabled and s.line_roaming_allowed):
    return False
  return not s.data_exhausted


# ----------------------------------------------------------------------------- fault injection


def _past_date() -> str:
  return "2025-01-31"


def suspend_line_for_overdue_bill(state: TelecomState, customer_id: str, line_id: str,
                                  new_bill_id: str, contract_ended: bool) -> None:
  """Adds an overdue bill for the line's plan and suspends the line; with
  ``contract_ended`` the contract end date is moved into the past."""
  db = state.db
  customer = _require(db, "customers", "customer_id", customer_id)
  line = _require(db, "lines", "line_id", line_id)
  plan = _require(db, "plans", "plan_id", line["plan_id"])
  amount = float(plan["price_per_month"])
  db["bills"].append({
      "bill_id": new_bill_id, "customer_id": customer_id, "period_start": "2025-01-01",
      "period_end": "2025-01-31", "issue_date": "2025-01-05", "total_due": amount,
      "due_date": "2025-01-19", "status": "Overdue",
      "line_items": [{"description": f"{plan['name']} - Line {line['phone_number']}",
                      "amount": amount, "date": "2025-01-05", "item_type": "Plan Charge"}],
  })
  customer["bill_ids"].append(new_bill_id)
  line["status"] = "Suspended"
  line["suspension_start_date"] = "2025-02-01"
  if contract_ended:
    line["contract_end_date"] = _past_date()


def _require(db: dict[str, Any], table: str, key: str, value: str) -> dict[str, Any]:
  record = find_record(db, table, key, value)
  if record is None:
    raise ValueError(f"initialization: no {table} record with {key}={value!r}")
  return record


def _set_user_info(state: TelecomState, name: str, phone_number: str) -> None:
  state.surroundings.user_name = name
  state.surroundings.phone_number = phone_number


def _remove_app_permission(state: TelecomState, app_name: str, permission: str) -> None:
  state.phone.app_permissions.setdefault(app_name, {})[permission] = False


def _set_network_mode(state: TelecomState, mode: str) -> None:
  if mode not in NETWORK_MODES:
    raise ValueError(f"initialization: mode must be one of {NETWORK_MODES}, got {mode!r}")
  state.phone.network_mode_preference = mode


def _lock_sim(state: TelecomState, mode: str) -> None:
  if mode not in ("pin", "puk"):
    raise ValueError(f"initialization: lock mode must be 'pin' or 'puk', got {mode!r}")
  state.phone.sim_card_status = f"locked_{mode}"


def _break_apn_settings(state: TelecomState) -> None:
  state.phone.active_apn_settings.apn_name = BROKEN_APN_NAME


def _break_apn_mms(state: TelecomState) -> None:
  state.phone.active_apn_settings.mmsc_url = None


def _break_vpn(state: TelecomState) -> None:
  p = state.phone
  p.vpn_enabled_setting, p.vpn_connected, p.vpn_performance = True, True, "poor"


def _set_phone(**fields: Any):
  def apply(state: TelecomState) -> None:
    for key, value in fields.items():
      setattr(state.phone, key, value)
  return apply


def _set_line(field: str, value: Any):
  def apply(state: TelecomState, customer_id: str, line_id: str) -> None:
    line = _require(state.db, "lines", "line_id", line_id)
    if line_id not in _require(state.db, "customers", "customer_id", customer_id)["line_ids"]:
      raise ValueError(f"initialization: line {line_id!r} is not on customer {customer_id!r}")
    line[field] = value
  return apply


def _set_data_usage(state: TelecomState, customer_id: str, line_id: str, data_used_gb: float) -> None:
  _set_line("data_used_gb", float(data_used_gb))(state, customer_id, line_id)


def _set_wifi_calling(state: TelecomState, enabled: bool, mms_over_wifi: bool) -> None:
  state.phone.wifi_calling_enabled = bool(enabled)
  state.phone.wifi_calling_mms_over_wifi = bool(mms_over_wifi)


def _set_user_location(state: TelecomState, abroad: bool) -> None:
  state.surroundings.is_abroad = bool(abroad)


def _simulate_network_search(state: TelecomState) -> None:
  sync_surroundings(state)
  network_search(state)


#: (env_type, func_name) -> function(state, **arguments); the faults of the 114 base tasks
INIT_ACTIONS = {
    ("user", "set_user_info"): _set_user_info,
    ("user", "set_user_location"): _set_user_location,
    ("user", "turn_airplane_mode_on"): _set_phone(airplane_mode=True),
    ("user", "turn_data_off"): _set_phone(data_enabled=False),
    ("user", "turn_data_saver_mode_on"): _set_phone(data_saver_mode=True),
    ("user", "turn_roaming_off"): _set_phone(roaming_enabled=False),
    ("user", "turn_roaming_on"): _set_phone(roaming_enabled=True),
    ("user", "unseat_sim_card"): _set_phone(sim_card_missing=True),
    ("user", "lock_sim_card"): _lock_sim,
    ("user", "set_network_mode_preference"): _set_network_mode,
    ("user", "set_wifi_calling"): _set_wifi_calling,
    ("user", "break_apn_settings"): _break_apn_settings,
    ("user", "break_apn_mms_setting"): _break_apn_mms,
    ("user", "break_vpn"): _break_vpn,
    ("user", "remove_app_permission"): _remove_app_permission,
    ("user", "simulate_network_search"): _simulate_network_search,
    ("assistant", "set_data_usage"): _set_data_usage,
    ("assistant", "enable_roaming"): _set_line("roaming_enabled", True),
    ("assistant", "disable_roaming"): _set_line("roaming_enabled", False),
    ("assistant", "suspend_line_for_overdue_bill"): suspend_line_for_overdue_bill,
}


def apply_init_action(state: TelecomState, env_type: str, func_name: str,
                      arguments: dict[str, Any]) -> None:
  """Runs one task initialization action; unknown names raise ValueError."""
  fn = INIT_ACTIONS.get((env_type, func_name))
  if fn is None:
    known = sorted(f"{e}:{n}" for e, n in INIT_ACTIONS)
    raise ValueError(f"initialization action {env_type}:{func_name} is unknown; expected one of {known}")
  fn(state, **arguments)


def initialize(actions: list[dict[str, Any]]) -> TelecomState:
  """A fresh state with a task's ``initialization_actions`` applied, then synced."""
  state = fresh_state()
  for action in actions:
    apply_init_action(state, action["env_type"], action["func_name"], action.get("arguments") or {})
  sync_surroundings(state)
  network_search(state)
  return state
