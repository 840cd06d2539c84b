"""The 114 tau2-Telecom base tasks and their train 74 / test 40 split.

Loaded from ``data/tasks_base114_release-37199f3.json`` (tau2-bench release
37199f3) and ``data/split_base.json`` (the train/test/base keys of tau2-bench's
``split_tasks.json``). One fix on load: the task texts name the status-bar tool
``get_status_bar``; the tools here (as in current tau2-bench) call it
``check_status_bar``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.resources
import json
import re
from typing import Any

TASKS_FILE = "tasks_base114_release-37199f3.json"
SPLIT_FILE = "split_base.json"
SPLITS = ("train", "test", "base")
ISSUE_TYPES = ("service_issue", "mobile_data_issue", "mms_issue")
_ID_RE = re.compile(r"^\[(?P<issue>[a-z_]+)\](?P<faults>[^\[]*)\[PERSONA:(?P<persona>[A-Za-z]+)\]$")


@dataclasses.dataclass(frozen=True)
class Action:
  """An expected tool call: who makes it (``requestor``: "assistant" | "user"),
  its name and arguments; ``compare_args`` None compares all arguments."""

  requestor: str
  name: str
  arguments: dict[str, Any]
  compare_args: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class EnvAssertion:
  """A state check: ``func_name(**arguments)`` on the ``env_type`` side must equal
  ``assert_value``."""

  env_type: str
  func_name: str
  arguments: dict[str, Any]
  assert_value: bool = True


@dataclasses.dataclass(frozen=True)
class TelecomTask:
  """One task: its user scenario, initialization (fault injection) and evaluation."""

  task_id: str
  issue_type: str
  faults: tuple[str, ...]
  persona_level: str  # "None" | "Easy" | "Hard"
  persona: str | None
  reason_for_call: str
  known_info: str
  task_instructions: str
  ticket: str
  init_actions: tuple[dict[str, Any], ...]
  actions: tuple[Action, ...]
  env_assertions: tuple[EnvAssertion, ...]
  reward_basis: tuple[str, ...]

  @property
  def agent_actions(self) -> tuple[Action, ...]:
    return tuple(a for a in self.actions if a.requestor == "assistant")

  @property
  def user_actions(self) -> tuple[Action, ...]:
    return tuple(a for a in self.actions if a.requestor == "user")


def _fix_text(text: str | None) -> str:
  return (text or "").replace("get_status_bar", "check_status_bar")


def parse_task(raw: dict[str, Any]) -> TelecomTask:
  """Builds a ``TelecomTask`` from one tau2-bench task dict."""
  m = _ID_RE.match(raw["id"])
  if m is None:
    raise ValueError(f"task id must look like '[issue]fault|fault[PERSONA:X]', got {raw['id']!r}")
  instr = raw["user_scenario"]["instructions"]
  crit = raw["evaluation_criteria"]
  actions = tuple(
      Action(requestor=a["requestor"], name=a["name"], arguments=dict(a.get("arguments") or {}),
             compare_args=None if a.get("compare_args") is None else tuple(a["compare_args"]))
      for a in crit.get("actions") or [])
  assertions = tuple(
      EnvAssertion(env_type=a["env_type"], func_name=a["func_name"], arguments=dict(a.get("arguments") or {}),
                   assert_value=bool(a.get("assert_value", True)))
      for a in crit.get("env_assertions") or [])
  return TelecomTask(
      task_id=raw["id"], issue_type=m.group("issue"),
      faults=tuple(f for f in m.group("faults").split("|") if f),
      persona_level=m.group("persona"), persona=(raw["user_scenario"].get("persona") or None),
      reason_for_call=_fix_text(instr.get("reason_for_call")), known_info=_fix_text(instr.get("known_info")),
      task_instructions=_fix_text(instr.get("task_instructions")), ticket=_fix_text(raw.get("ticket")),
      init_actions=tuple(raw["initial_state"].get("initialization_actions") or []),
      actions=actions, env_assertions=assertions, reward_basis=tuple(crit.get("reward_basis") or []))


def _read(name: str) -> Any:
  path = importlib.resources.files("rti_jax.envs.telecom").joinpath("data", name)
  return json.loads(path.read_text(encoding="utf-8"))


@functools.cache
def load_tasks() -> dict[str, TelecomTask]:
  """All 114 base tasks, by id, in file order."""
  return {t.task_id: t for t in map(parse_task, _read(TASKS_FILE))}


@functools.cache
def split_ids(split: str) -> tuple[str, ...]:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  return tuple(_read(SPLIT_FILE)[split])


def load_split(split: str) -> list[TelecomTask]:
  """The tasks of ``split`` ("train" 74, "test" 40, "base" 114), in the split file's order."""
  tasks = load_tasks()
  missing = [i for i in split_ids(split) if i not in tasks]
  if missing:
    raise ValueError(f"split {split!r} names {len(missing)} unknown task ids, e.g. {missing[0]!r}")
  return [tasks[i] for i in split_ids(split)]


def spread_by_issue(tasks: list[TelecomTask]) -> list[TelecomTask]:
  """``tasks`` reordered so that each issue type is spread evenly through the list (in file order
  within a type): the i-th of a type's n tasks gets the key (i + 0.5) / n, ties broken by
  ``ISSUE_TYPES`` order. Any tail of the result then holds the issue types in about their overall
  shares. tau2's train split lists its tasks by issue type, so its last 10 in file order are all
  service tasks; the RL validation split (the trainer's last ``train.val_tasks``) and the base
  policy's held-out tasks (``telecom_sft``'s ``data.holdout``) are the tail of this order instead
  (``rl_train_split``)."""
  rank: dict[str, int] = {}
  counts = collections.Counter(t.issue_type for t in tasks)
  keys = []
  for pos, t in enumerate(tasks):
    i = rank.get(t.issue_type, 0)
    rank[t.issue_type] = i + 1
    order = ISSUE_TYPES.index(t.issue_type) if t.issue_type in ISSUE_TYPES else len(ISSUE_TYPES)
    keys.append(((i + 0.5) / counts[t.issue_type], order, pos))
  return [tasks[k[2]] for k in sorted(keys)]


def rl_train_split() -> list[TelecomTask]:
  """tau2's 74 train tasks in the order the RL experiments read them (``spread_by_issue``): the
  trainer's validation split is its last ``train.val_tasks`` and ``telecom_sft``'s ``data.holdout`` keeps the
  same tail out of SFT, so both hold every issue type."""
  return spread_by_issue(load_split("train"))


def get_task(task_id: str) -> TelecomTask:
  tasks = load_tasks()
  if task_id not in tasks:
    raise KeyError(f"task_id {task_id!r} is not one of the {len(tasks)} base tasks")
  return tasks[task_id]
