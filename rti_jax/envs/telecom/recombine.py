"""More Telecom training tasks: train tasks with their phone-setting faults recombined.

tau2's 74 train tasks are too few for a tiny policy to learn the checklist rather than the
tasks. A *device fault* (airplane mode on, a bad network mode, a broken APN, data off, a VPN,
...) changes only phone settings, which the checklist fixes whatever they are, and none of a
task's reward checks names it: the checks follow the issue type and the *account faults* (data
used up, an overdue bill, a locked SIM, an ended contract, being abroad with roaming off). So a
new task is a train task with its device faults replaced by another set seen with the same issue
type in the train split: same user scenario, account faults, checks and (for transfer tasks)
gold transfer, other initialization actions.

Each fault's initialization actions are read from the train split alone (the actions every
train task with that fault has, ``fault_actions``); a recombined task's fault set never equals a
test task's (or a train task's) fault set for its issue type. ``recombined_tasks`` is
deterministic given its seed. ``tests/test_telecom_recombine.py`` checks that rebuilding each
train task from its own faults gives the same initial state, that the checklist agent solves
every recombined task, and that doing nothing solves none.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Sequence

import numpy as np

from rti_jax.envs.telecom.tasks import TelecomTask, load_split

#: faults that only change phone settings (the checklist fixes each whatever its state)
DEVICE_FAULTS = ("airplane_mode_on", "bad_network_preference", "bad_vpn", "bad_wifi_calling",
                 "break_apn_mms_setting", "break_apn_settings", "break_app_both_permissions",
                 "break_app_sms_permission", "break_app_storage_permission", "data_mode_off",
                 "data_saver_mode_on", "unseat_sim_card")
#: at most one of these per task (they remove overlapping permissions)
EXCLUSIVE = ({"break_app_both_permissions", "break_app_sms_permission", "break_app_storage_permission"},)
_ALWAYS = ("set_user_info", "simulate_network_search")  # set first / run last by every task that needs them


def _key(action: dict[str, Any]) -> str:
  return json.dumps([action["env_type"], action["func_name"], action.get("arguments") or {}], sort_keys=True)


@functools.cache
def fault_actions() -> dict[str, tuple[dict[str, Any], ...]]:
  """Device fault -> its initialization actions: those every train task with the fault has (in
  their order of appearance), without ``set_user_info`` / ``simulate_network_search``."""
  out = {}
  train = load_split("train")
  for fault in DEVICE_FAULTS:
    having = [t for t in train if fault in t.faults]
    if not having:
      raise ValueError(f"fault {fault!r}: no train task has it")
    common = set.intersection(*({_key(a) for a in t.init_actions} for t in having))
    out[fault] = tuple(a for a in having[0].init_actions if _key(a) in common and a["func_name"] not in _ALWAYS)
  return out


def with_device_faults(task: TelecomTask, faults: Sequence[str]) -> TelecomTask:
  """``task`` with its device faults replaced by ``faults`` (its other faults, scenario, checks and
  gold actions kept; the new device faults' actions go before ``simulate_network_search``)."""
  bad = [f for f in faults if f not in DEVICE_FAULTS]
  if bad:
    raise ValueError(f"faults: expected device faults {DEVICE_FAULTS}, got {bad}")
  table = fault_actions()
  drop = {_key(a) for f in task.faults if f in DEVICE_FAULTS for a in table[f]}
  kept = [a for a in task.init_actions if _key(a) not in drop]
  tail = [a for a in kept if a["func_name"] == "simulate_network_search"]
  head = [a for a in kept if a["func_name"] != "simulate_network_search"]
  added = [a for f in sorted(faults) for a in table[f]]
  new_faults = tuple(sorted(set(faults) | {f for f in task.faults if f not in DEVICE_FAULTS}))
  task_id = f"[{task.issue_type}]{'|'.join(new_faults)}[PERSONA:{task.persona_level}]"
  return dataclasses.replace(task, task_id=task_id, faults=new_faults, init_actions=tuple(head + added + tail))


def _fault_set(task: TelecomTask) -> tuple[str, frozenset[str]]:
  return task.issue_type, frozenset(task.faults)


def recombined_tasks(base: Sequence[TelecomTask], n: int, seed: int = 0,
                     exclude: Sequence[TelecomTask] | None = None) -> list[TelecomTask]:
  """``n`` new tasks, each a task of ``base`` with another set of device faults (1 to 5 of those
  seen with its issue type in ``base``; sizes as ``base``'s). ``exclude`` (default: tau2's train
  and test splits): no new task has the issue type and fault set of one of these or of another
  new task. Raises ValueError if ``n`` distinct tasks cannot be found."""
  rng = np.random.default_rng(seed)
  exclude = list(load_split("train")) + list(load_split("test")) if exclude is None else list(exclude)
  taken = {_fault_set(t) for t in exclude} | {_fault_set(t) for t in base}
  by_issue: dict[str, list[str]] = {}
  for t in base:
    by_issue.setdefault(t.issue_type, [])
    by_issue[t.issue_type] += [f for f in t.faults if f in DEVICE_FAULTS and f not in by_issue[t.issue_type]]
  sizes = [sum(f in DEVICE_FAULTS for f in t.faults) for t in base]
  out: list[TelecomTask] = []
  for _ in range(50 * n):
    if len(out) == n:
      break
    task = base[int(rng.integers(len(base)))]
    pool = sorted(by_issue[task.issue_type])
    k = int(np.clip(sizes[int(rng.integers(len(sizes)))], 1, min(5, len(pool))))
    faults = [str(f) for f in rng.choice(pool, size=k, replace=False)]
    if any(len(set(faults) & group) > 1 for group in EXCLUSIVE):
      continue
    new = with_device_faults(task, faults)
    if _fault_set(new) in taken:
      continue
    taken.add(_fault_set(new))
    out.append(new)
  if len(out) < n:
    raise ValueError(f"n: found {len(out)} distinct recombined tasks, asked for {n}")
  return out
