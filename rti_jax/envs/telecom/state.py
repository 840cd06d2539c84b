"""tau2-Telecom domain state: the agent's DB, the user's phone and its surroundings.

Three pieces, loaded from the copied tau2-bench data files and mutated by tools:

* ``db``: the carrier's records (plans, devices, lines, customers, bills), a plain
  dict read from ``data/db.toml`` (the agent-side tools read and write it);
* ``phone``: the user's handset (``PhoneState``, from ``data/user_db.toml``);
* ``surroundings``: what links the phone to the world: who the user is, whether
  they are abroad, the signal of each network technology where they are, and what
  the carrier's records say about their line (active, roaming allowed, data used
  up, pending payment request).

The rules follow tau2-bench's Telecom environment (checked against it by
``tests/test_tau2_parity.py``): ``sync_surroundings`` copies the line's
carrier-side facts onto the surroundings after every tool call (agent's or
user's); ``network_search`` re-registers the phone (connection status,
technology, signal) only when a device action triggers one (airplane mode, mobile
data, roaming, network mode, SIM reseat, APN changes, reboot), so a line resumed
by the agent gets service at the user's next such action. Each task's
initialization actions (``apply_init_action``) inject its faults with the same
device functions, each followed by a sync, and nothing more.
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
#: technology each network-mode preference registers on (4g_5g_preferred: 5G where there is a
#: 5G signal, else 4G)
_MODE_TECHNOLOGY = {"4g_only": "4G", "3g_only": "3G", "2g_only": "2G"}
SIGNAL_LEVELS = ("none", "poor", "fair", "good", "excellent")
SIM_STATUSES = ("active", "missing", "locked_pin", "locked_puk")
#: the APN name written by the ``break_apn_settings`` fault (no data or service)
BROKEN_APN_NAME = "broken"
APN_NAMES = ("internet", BROKEN_APN_NAME)
#: signal of each technology where the user is (the same in every base task)
DEFAULT_SIGNALS = {"2G": "poor", "3G": "fair", "4G": "good", "5G": "excellent"}
#: the VPN server ``connect_vpn`` connects to performs well until a ``break_vpn`` fault
VPN_DEFAULT_PERFORMANCE = "excellent"


@dataclasses.dataclass
class ApnSettings:
  """The phone's access-point settings; ``mmsc_url`` None means MMS cannot be sent.
  The defaults are the carrier's (a reset restores them)."""

  apn_name: str = "internet"
  mms_apn: str | None = "mms"
  mmsc_url: str | None = "http://mms.carrier.com/mms/wapenc"
  mms_proxy: str | None = None
  mms_port: int | None = None


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
  #: the connected VPN's performance ("excellent" or "poor"); None when no VPN is connected
  vpn_performance: str | None = None
  #: the performance of the VPN server that ``connect_vpn`` connects to. ``break_vpn`` makes
  #: the server poor, so a VPN reconnected later in the episode is poor too (in tau2-bench
  #: the fault degrades the one server record every connection shares)
  vpn_server_performance: str = VPN_DEFAULT_PERFORMANCE
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
  #: signal of each technology ("2G".."5G") where the user is
  signal_strength: dict[str, str] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SIGNALS))
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


def load_phone() -> PhoneState:
  """A fresh phone from ``user_db.toml``."""
  raw = copy.deepcopy(_load_toml("user_db.toml")["device"])
  apn = ApnSettings(**raw.pop("active_apn_settings"))
  apps = raw.pop("app_statuses")
  permissions = {name: dict(app["permissions"]) for name, app in apps.items()}
  return PhoneState(active_apn_settings=apn, app_permissions=permissions, **raw)


def fresh_state() -> TelecomState:
  return TelecomState(db=load_db(), phone=load_phone(), surroundings=Surroundings(), default_apn=ApnSettings())


# ----------------------------------------------------------------------------- DB lookups


def find_record(db: dict[str, Any], table: str, key: str, value: Any) -> dict[str, Any] | None:
  """The first record of ``db[table]`` whose ``key`` equals ``value``, or None."""
  for record in db[table]:
    if record.get(key) == value:
      return record
  return None


def line_by_phone(db: dict[str, Any], phone_number: Any) -> dict[str, Any] | None:
  """The line with exactly this phone number (as written in the DB, e.g. "555-123-2002")."""
  return find_record(db, "lines", "phone_number", phone_number)


def customer_by_phone(db: dict[str, Any], phone_number: Any) -> dict[str, Any] | None:
  """The customer whose contact number, or one of whose lines' numbers, is ``phone_number``
  exactly (customers in DB order, each checked contact number first)."""
  for customer in db["customers"]:
    if customer["phone_number"] == phone_number:
      return customer
    for line_id in customer["line_ids"]:
      line = find_record(db, "lines", "line_id", line_id)
      if line is not None and line["phone_number"] == phone_number:
        return customer
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
  """Data stops once usage reaches the plan's limit plus refuelled data."""
  return float(line["data_used_gb"]) >= plan_data_limit_gb(db, line) + float(line["data_refueling_gb"])


# ----------------------------------------------------------------------------- consistency


def sync_surroundings(state: TelecomState) -> None:
  """Copies the user's line facts from the agent DB onto the surroundings (nothing before
  the user is known). The payment request is the first of the customer's bills awaiting
  payment (paying it makes the bill Paid, ``device_tools.make_payment``)."""
  s = state.surroundings
  if s.phone_number is None:
    return
  line = line_by_phone(state.db, s.phone_number)
  if line is None:
    s.line_active, s.line_roaming_allowed, s.data_exhausted, s.payment_request = False, False, True, None
    return
  s.line_active = line["status"] == "Active"
  s.line_roaming_allowed = bool(line["roaming_enabled"])
  s.data_exhausted = line_data_exhausted(state.db, line)
  customer = customer_by_phone(state.db, s.phone_number)
  s.payment_request = None
  if customer is not None:
    for bill_id in customer["bill_ids"]:
      bill = find_record(state.db, "bills", "bill_id", bill_id)
      if bill is not None and bill["status"] == "Awaiting Payment":
        s.payment_request = PaymentRequest(bill_id=bill_id, amount=float(bill["total_due"]))
        break


def apn_is_broken(phone: PhoneState) -> bool:
  return phone.active_apn_settings.apn_name == BROKEN_APN_NAME


def sim_status(phone: PhoneState) -> str:
  return "missing" if phone.sim_card_missing else phone.sim_card_status


def sim_usable(phone: PhoneState) -> bool:
  return sim_status(phone) == "active"


def network_search(state: TelecomState) -> None:
  """Re-registers the phone: derives connection status, technology and signal.

  Service needs a seated unlocked SIM, airplane mode off, a working APN and an active
  line; the technology follows the network-mode preference (4g_5g_preferred: 5G where
  there is a 5G signal, else 4G) and the signal is that technology's where the user is.
  """
  phone, s = state.phone, state.surroundings
  has_service = (sim_usable(phone) and not phone.airplane_mode and not apn_is_broken(phone)
                 and s.line_active)
  if has_service:
    mode = phone.network_mode_preference
    tech = _MODE_TECHNOLOGY.get(mode, "4G")
    if mode == "4g_5g_preferred":
      tech = "5G" if s.signal_strength.get("5G", "none") != "none" else "4G"
    phone.network_connection_status = "connected"
    phone.network_technology_connected = tech
    phone.network_signal_strength = s.signal_strength.get(tech, "none")
  else:
    phone.network_connection_status = "no_service"
    phone.network_technology_connected = "none"
    phone.network_signal_strength = "none"


def mobile_data_working(state: TelecomState) -> bool:
  """Cellular data flows: airplane mode off, a signal and service, data on, roaming on the
  phone and allowed on the line when abroad, data left."""
  phone, s = state.phone, state.surroundings
  if phone.airplane_mode or phone.network_signal_strength == "none":
    return False
  if phone.network_connection_status == "no_service":
    return False
  if s.is_abroad and not (phone.roaming_enabled and s.line_roaming_allowed):
    return False
  return phone.data_enabled and not s.data_exhausted


# ----------------------------------------------------------------------------- fault injection
# The faults are device functions the user cannot call (device_tools has the ones shared with
# the user's tools); each task lists them in ``initialization_actions``.


def suspend_line_for_overdue_bill(state: TelecomState, customer_id: str, line_id: str,
                                  new_bill_id: str, contract_ended: bool) -> None:
  """Adds an overdue bill (last month, the line's plan price) and suspends the Active line;
  with ``contract_ended`` the contract ends on the last day of last month."""
  db = state.db
  line = _require(db, "lines", "line_id", line_id)
  if line["status"] != "Active":
    raise ValueError(f"initialization: line {line_id!r} must be Active to suspend for an unpaid bill")
  plan = _require(db, "plans", "plan_id", line["plan_id"])
  amount = float(plan["price_per_month"])
  customer = _require(db, "customers", "customer_id", customer_id)
  if any((b := find_record(db, "bills", "bill_id", i)) is not None and b["status"] == "Overdue"
         for i in customer["bill_ids"]):
    raise ValueError(f"initialization: customer {customer_id!r} already has an overdue bill")
  db["bills"].append({
      "bill_id": new_bill_id, "customer_id": customer_id, "period_start": "2025-01-01",
      "period_end": "2025-01-31", "issue_date": "2025-01-01", "total_due": amount,
      "due_date": "2025-01-15", "status": "Overdue",
      "line_items": [{"description": f"Charge for line {line_id}", "amount": amount, "date": TODAY,
                      "item_type": "Charge"}],
  })
  customer["bill_ids"].append(new_bill_id)
  line["status"] = "Suspended"
  line["suspension_start_date"] = TODAY
  if contract_ended:
    line["contract_end_date"] = "2025-01-31"


def _require(db: dict[str, Any], table: str, key: str, value: str) -> dict[str, Any]:
  record = find_record(db, table, key, value)
  if record is None:
    raise ValueError(f"initialization: no {table} record with {key}={value!r}")
  return record


def _set_user_info(state: TelecomState, name: str, phone_number: str) -> None:
  state.surroundings.user_name = name
  state.surroundings.phone_number = phone_number


def _remove_app_permission(state: TelecomState, app_name: str, permission: str) -> None:
  perms = state.phone.app_permissions.get(app_name)
  if perms is not None and permission.lower() in perms:
    perms[permission.lower()] = False


def _lock_sim(state: TelecomState, mode: str) -> None:
  if mode not in ("pin", "puk"):
    raise ValueError(f"initialization: lock mode must be 'pin' or 'puk', got {mode!r}")
  state.phone.sim_card_status = f"locked_{mode}"
  network_search(state)


def _unseat_sim(state: TelecomState) -> None:
  state.phone.sim_card_missing = True
  network_search(state)


def _break_apn_settings(state: TelecomState) -> None:
  state.phone.active_apn_settings.apn_name = BROKEN_APN_NAME
  network_search(state)


def _break_apn_mms(state: TelecomState) -> None:
  state.phone.active_apn_settings.mmsc_url = None


def _break_vpn(state: TelecomState) -> None:
  p = state.phone
  p.vpn_connected = True
  p.vpn_performance = p.vpn_server_performance = "poor"


def _set_data_usage(state: TelecomState, customer_id: str, line_id: str, data_used_gb: float) -> None:
  line = _require(state.db, "lines", "line_id", line_id)
  if line_id not in _require(state.db, "customers", "customer_id", customer_id)["line_ids"]:
    raise ValueError(f"initialization: line {line_id!r} is not on customer {customer_id!r}")
  line["data_used_gb"] = data_used_gb


def _set_wifi_calling(state: TelecomState, enabled: bool, mms_over_wifi: bool | None = None) -> None:
  state.phone.wifi_calling_enabled = bool(enabled)
  if mms_over_wifi is not None:
    state.phone.wifi_calling_mms_over_wifi = bool(mms_over_wifi)


def _set_user_location(state: TelecomState, abroad: bool) -> None:
  state.surroundings.is_abroad = bool(abroad)


def _init_actions() -> dict[tuple[str, str], Any]:
  # The device functions shared with the user's tools live in device_tools (imported here,
  # late, because device_tools builds on this module).
  from rti_jax.envs.telecom import agent_tools as at
  from rti_jax.envs.telecom import device_tools as dt

  def agent_tool(fn):
    def apply(state: TelecomState, **arguments: Any) -> None:
      fn(state, **arguments)
    return apply

  return {
      ("user", "set_user_info"): _set_user_info,
      ("user", "set_user_location"): _set_user_location,
      ("user", "turn_airplane_mode_on"): lambda state: dt.turn(state, "toggle_airplane_mode", True),
      ("user", "turn_airplane_mode_off"): lambda state: dt.turn(state, "toggle_airplane_mode", False),
      ("user", "turn_data_off"): lambda state: dt.turn(state, "toggle_data", False),
      ("user", "turn_data_on"): lambda state: setattr(state.phone, "data_enabled", True),
      ("user", "turn_data_saver_mode_on"): lambda state: dt.turn(state, "toggle_data_saver_mode", True),
      ("user", "turn_data_saver_mode_off"): lambda state: dt.turn(state, "toggle_data_saver_mode", False),
      ("user", "turn_roaming_off"): lambda state: dt.turn(state, "toggle_roaming", False),
      ("user", "turn_roaming_on"): lambda state: dt.turn(state, "toggle_roaming", True),
      ("user", "unseat_sim_card"): _unseat_sim,
      ("user", "lock_sim_card"): _lock_sim,
      ("user", "set_network_mode_preference"): lambda state, mode: _checked_mode(state, mode),
      ("user", "set_wifi_calling"): _set_wifi_calling,
      ("user", "break_apn_settings"): _break_apn_settings,
      ("user", "break_apn_mms_setting"): _break_apn_mms,
      ("user", "break_vpn"): _break_vpn,
      ("user", "remove_app_permission"): _remove_app_permission,
      ("user", "simulate_network_search"): network_search,
      ("assistant", "set_data_usage"): _set_data_usage,
      ("assistant", "enable_roaming"): agent_tool(at.enable_roaming),
      ("assistant", "disable_roaming"): agent_tool(at.disable_roaming),
      ("assistant", "suspend_line_for_overdue_bill"): suspend_line_for_overdue_bill,
  }


def _checked_mode(state: TelecomState, mode: str) -> None:
  if mode not in NETWORK_MODES:
    raise ValueError(f"initialization: mode must be one of {NETWORK_MODES}, got {mode!r}")
  from rti_jax.envs.telecom import device_tools as dt
  dt.set_network_mode_preference(state, mode)


#: (env_type, func_name) -> function(state, **arguments); the faults of the 114 base tasks
INIT_ACTIONS: dict[tuple[str, str], Any] = {}


def apply_init_action(state: TelecomState, env_type: str, func_name: str,
                      arguments: dict[str, Any]) -> None:
  """Runs one task initialization action, then syncs; unknown names raise ValueError."""
  if not INIT_ACTIONS:
    INIT_ACTIONS.update(_init_actions())
  fn = INIT_ACTIONS.get((env_type, func_name))
  if fn is None:
    known = sorted(f"{e}:{n}" for e, n in INIT_ACTIONS)
    raise ValueError(f"initialization action {env_type}:{func_name} is unknown; expected one of {known}")
  fn(state, **arguments)
  sync_surroundings(state)


def initialize(actions: list[dict[str, Any]]) -> TelecomState:
  """A fresh state with a task's ``initialization_actions`` applied in order (each followed
  by a sync, as tau2-bench runs them; the phone re-registers only where an action does)."""
  state = fresh_state()
  for action in actions:
    apply_init_action(state, action["env_type"], action["func_name"], action.get("arguments") or {})
  return state
