"""tau2-Telecom state: loading, fault injection and phone/DB consistency."""

import importlib.resources
import tomllib
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.tasks import get_task, load_split, load_tasks, rl_train_split, spread_by_issue

DATA = importlib.resources.files("rti_jax.envs.telecom").joinpath("data")
MMS_ALL = ("[mms_issue]airplane_mode_on|bad_network_preference|bad_wifi_calling|break_apn_mms_setting|"
           "break_app_both_permissions|data_mode_off|data_usage_exceeded|unseat_sim_card|"
           "user_abroad_roaming_disabled_off[PERSONA:Hard]")


def _raw(name):
  return tomllib.loads(DATA.joinpath(name).read_text())


def test_db_matches_toml_file():
  raw = _raw("db.toml")
  db = st.load_db()
  for table in ("plans", "devices", "lines", "customers", "bills"):
    assert [r[next(iter(r))] for r in db[table]] == [r[next(iter(r))] for r in raw[table]]
  assert len(db["lines"]) == 9 and len(db["customers"]) == 4 and len(db["plans"]) == 5
  line = st.find_record(db, "lines", "line_id", "L1002")
  assert (line["phone_number"], line["plan_id"], line["data_used_gb"]) == ("555-123-2002", "P1002", 8.7)


def test_load_db_returns_independent_copies():
  a, b = st.load_db(), st.load_db()
  a["lines"][0]["status"] = "Closed"
  assert b["lines"][0]["status"] == "Active"


def test_phone_matches_user_db():
  raw = _raw("user_db.toml")["device"]
  phone = st.load_phone()
  assert phone.airplane_mode is raw["airplane_mode"] is False
  assert phone.network_mode_preference == raw["network_mode_preference"] == "4g_5g_preferred"
  apn = phone.active_apn_settings
  assert (apn.apn_name, apn.mms_apn, apn.mmsc_url) == tuple(raw["active_apn_settings"].values())
  assert apn == st.ApnSettings()  # the file's APN is the carrier default a reset restores
  assert phone.app_permissions["messaging"] == raw["app_statuses"]["messaging"]["permissions"]


def test_tasks_and_split_sizes():
  assert len(load_tasks()) == 114
  train, test = load_split("train"), load_split("test")
  assert (len(train), len(test)) == (74, 40)
  assert {t.task_id for t in train}.isdisjoint(t.task_id for t in test)
  assert {t.task_id for t in train} | {t.task_id for t in test} == set(load_tasks())
  with pytest.raises(ValueError, match="split must be one of"):
    load_split("dev")


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.sampled_from(["service_issue", "mobile_data_issue", "mms_issue"]), min_size=1, max_size=80))
def test_spread_by_issue_keeps_each_type_near_its_share_in_every_tail(kinds):
  tasks = [types.SimpleNamespace(issue_type=k, n=i) for i, k in enumerate(kinds)]
  out = spread_by_issue(tasks)
  assert sorted(t.n for t in out) == list(range(len(tasks)))  # a permutation
  for kind in set(kinds):  # file order kept within a type
    ns = [t.n for t in out if t.issue_type == kind]
    assert ns == sorted(ns)
  total = {k: kinds.count(k) for k in set(kinds)}
  for m in range(1, len(out) + 1):
    tail = [t.issue_type for t in out[-m:]]
    for kind, n in total.items():
      assert abs(tail.count(kind) - m * n / len(kinds)) <= 2, (m, kind)


def test_rl_validation_split_holds_every_issue_type():
  from rti_jax.config import load_config
  from rti_jax.envs.telecom.source import telecom_source
  from rti_jax.policy.sft_data import split_train

  train = rl_train_split()
  assert sorted(t.task_id for t in train) == sorted(t.task_id for t in load_split("train"))
  assert [t.issue_type for t in load_split("train")[-10:]] == ["service_issue"] * 10  # why the order exists
  cfg = load_config("telecom")
  source = telecom_source(cfg)
  val = source.train[-cfg.train.val_tasks:]
  assert [t.task_id for t in val] == [t.task_id for t in split_train(rl_train_split(), cfg.train.val_tasks)[1]]
  counts = {k: sum(t.issue_type == k for t in val) for k in ("service_issue", "mobile_data_issue", "mms_issue")}
  assert counts == {"service_issue": 2, "mobile_data_issue": 4, "mms_issue": 4}  # 14 / 27 / 33 of 74


def test_outdated_tool_name_is_renamed():
  raw = DATA.joinpath("tasks_base114_release-37199f3.json").read_text()
  assert "get_status_bar" in raw
  assert all("get_status_bar" not in t.task_instructions for t in load_tasks().values())
  assert any("check_status_bar" in t.task_instructions for t in load_tasks().values())


def test_fault_injection_of_the_hardest_mms_task():
  state = st.initialize(list(get_task(MMS_ALL).init_actions))
  p, s = state.phone, state.surroundings
  assert p.airplane_mode and p.sim_card_missing and not p.data_enabled and not p.roaming_enabled
  assert p.network_mode_preference == "2g_only"
  assert p.wifi_calling_enabled and p.wifi_calling_mms_over_wifi
  assert p.active_apn_settings.mmsc_url is None
  assert not p.app_permissions["messaging"]["sms"] and not p.app_permissions["messaging"]["storage"]
  assert s.is_abroad and s.phone_number == "555-123-2002" and s.user_name == "John Smith"
  line = st.find_record(state.db, "lines", "line_id", "L1002")
  assert line["data_used_gb"] == 15.1 and line["roaming_enabled"] is False
  # Consistency: the phone sees what the DB says, and has no service.
  assert s.data_exhausted and not s.line_roaming_allowed
  assert (p.network_connection_status, p.network_signal_strength, p.network_technology_connected) == (
      "no_service", "none", "none")


def test_overdue_suspension_injects_bill_and_suspends():
  task = get_task("[service_issue]contract_end_suspension|lock_sim_card_pin[PERSONA:Hard]")
  state = st.initialize(list(task.init_actions))
  bill = st.find_record(state.db, "bills", "bill_id", "B1234321")
  line = st.find_record(state.db, "lines", "line_id", "L1002")
  assert bill["status"] == "Overdue" and bill["total_due"] == 65.0  # Premium plan price
  assert "B1234321" in st.find_record(state.db, "customers", "customer_id", "C1001")["bill_ids"]
  assert line["status"] == "Suspended" and line["contract_end_date"] < st.TODAY
  assert not state.surroundings.line_active
  assert state.phone.sim_card_status == "locked_pin"


def test_unknown_init_action_is_named():
  state = st.fresh_state()
  with pytest.raises(ValueError, match="user:break_everything"):
    st.apply_init_action(state, "user", "break_everything", {})
  with pytest.raises(ValueError, match="mode must be one of"):
    st.apply_init_action(state, "user", "set_network_mode_preference", {"mode": "6g"})


def test_every_base_task_initializes():
  for task in load_tasks().values():
    state = st.initialize(list(task.init_actions))
    assert state.phone.network_connection_status in ("connected", "no_service")


_MODE_TECH = {"4g_only": "4G", "3g_only": "3G", "2g_only": "2G"}


@settings(max_examples=200, deadline=None, derandomize=True)
@given(airplane=hst.booleans(), missing=hst.booleans(), sim=hst.sampled_from(st.SIM_STATUSES),
       broken_apn=hst.booleans(), line_status=hst.sampled_from(["Active", "Suspended"]),
       mode=hst.sampled_from(st.NETWORK_MODES),
       signals=hst.fixed_dictionaries({t: hst.sampled_from(st.SIGNAL_LEVELS) for t in ("2G", "3G", "4G", "5G")}))
def test_network_search_matches_brute_force(airplane, missing, sim, broken_apn, line_status, mode, signals):
  state = st.fresh_state()
  state.surroundings.phone_number = "555-123-2002"
  state.surroundings.signal_strength = signals
  st.find_record(state.db, "lines", "line_id", "L1002")["status"] = line_status
  p = state.phone
  p.airplane_mode, p.sim_card_missing, p.sim_card_status, p.network_mode_preference = airplane, missing, sim, mode
  if broken_apn:
    p.active_apn_settings.apn_name = st.BROKEN_APN_NAME
  st.sync_surroundings(state)
  st.network_search(state)
  expected = (not airplane and not missing and sim == "active" and not broken_apn and line_status == "Active")
  tech = _MODE_TECH.get(mode) or ("5G" if signals["5G"] != "none" else "4G")
  assert (p.network_connection_status == "connected") == expected
  assert p.network_technology_connected == (tech if expected else "none")
  assert p.network_signal_strength == (signals[tech] if expected else "none")


@settings(max_examples=100, deadline=None, derandomize=True)
@given(used=hst.floats(0, 30), refuel=hst.floats(0, 4), plan=hst.sampled_from(["P1001", "P1002", "P1003"]))
def test_data_exhausted_is_usage_at_limit_plus_refuel(used, refuel, plan):
  state = st.fresh_state()
  state.surroundings.phone_number = "555-123-2002"
  line = st.find_record(state.db, "lines", "line_id", "L1002")
  line.update(data_used_gb=used, data_refueling_gb=refuel, plan_id=plan)
  st.sync_surroundings(state)
  limit = {"P1001": 5.0, "P1002": 15.0, "P1003": 999.0}[plan]
  assert state.surroundings.data_exhausted == (used >= limit + refuel)
