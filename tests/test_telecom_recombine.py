"""Recombined Telecom training tasks (rti_jax/envs/telecom/recombine.py)."""

import collections

import pytest

from rti_jax.envs.telecom import TelecomEnv, load_split, run_episode
from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.checklist_agent import ChecklistAgent
from rti_jax.envs.telecom.condensed import CONDENSED_POLICY
from rti_jax.envs.telecom.recombine import DEVICE_FAULTS, fault_actions, recombined_tasks, with_device_faults
from rti_jax.envs.telecom.scripted_agents import ScriptAgent


def test_each_task_rebuilt_from_its_own_faults_has_the_same_initial_state():
  """The fault -> actions table (read from the train split) reproduces every base task, test
  included: removing a task's device faults and adding them back changes nothing."""
  for task in load_split("base"):
    again = with_device_faults(task, [f for f in task.faults if f in DEVICE_FAULTS])
    assert again.task_id == task.task_id
    assert repr(st.initialize(list(again.init_actions))) == repr(st.initialize(list(task.init_actions)))
  assert [a["func_name"] for a in fault_actions()["break_app_both_permissions"]] == ["remove_app_permission"] * 2


def test_recombined_tasks_are_new_solvable_and_need_fixing():
  train = load_split("train")[:64]
  tasks = recombined_tasks(train, 120, seed=3)
  assert len(tasks) == 120 and tasks == recombined_tasks(train, 120, seed=3)  # deterministic
  seen = {(t.issue_type, frozenset(t.faults)) for t in load_split("base")}
  keys = [(t.issue_type, frozenset(t.faults)) for t in tasks]
  assert len(set(keys)) == len(keys) and not set(keys) & seen
  env = TelecomEnv(policy=CONDENSED_POLICY)
  for t in tasks:
    # the scenario, checks and account faults are a train task's; only device faults change
    source = [b for b in train if b.issue_type == t.issue_type and b.env_assertions == t.env_assertions
              and b.reason_for_call == t.reason_for_call]
    assert source, t.task_id
    assert any(f in DEVICE_FAULTS for f in t.faults)
    assert run_episode(env, ChecklistAgent(), t).reward == 1.0, t.task_id
    assert run_episode(env, ScriptAgent(["###STOP###"]), t).reward == 0.0, t.task_id
  assert set(collections.Counter(t.issue_type for t in tasks)) == {"mms_issue", "mobile_data_issue", "service_issue"}


def test_bad_requests_raise():
  task = load_split("train")[0]
  with pytest.raises(ValueError, match="device faults"):
    with_device_faults(task, ["lock_sim_card_pin"])
  with pytest.raises(ValueError, match="found"):
    recombined_tasks(load_split("train")[:1], 200)  # one task's issue type has too few fault sets
