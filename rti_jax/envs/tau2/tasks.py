"""Tasks of a tau2 domain as this package uses them: tau2's own ``Task`` plus its domain and origin.

``Tau2Task.task`` is the tau2 ``Task`` object itself (its user scenario and evaluation criteria are
what the scripted user and tau2's evaluator read); tau2's own tasks and the generated training tasks
(``generate``) have the same shape. ``request_types`` names what a task asks for, read off its gold
write calls (the ones that do not fail on purpose): ``cancel``, ``return``, ``exchange``,
``modify_items``, ``modify_address``, ``modify_payment``, ``user_address`` (Retail); ``booking``,
``cancel``, ``modify_flights``, ``baggage``, ``passengers``, ``compensation`` (Airline); ``transfer``;
and ``refusal`` when it has none of these (the agent must decline, or only answer).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from rti_jax.envs.tau2 import bridge

#: gold tool name -> request type
REQUEST_TYPES = {
    "cancel_pending_order": "cancel", "return_delivered_order_items": "return",
    "exchange_delivered_order_items": "exchange", "modify_pending_order_items": "modify_items",
    "modify_pending_order_address": "modify_address", "modify_pending_order_payment": "modify_payment",
    "modify_user_address": "user_address", "book_reservation": "booking", "cancel_reservation": "cancel",
    "update_reservation_flights": "modify_flights", "update_reservation_baggages": "baggage",
    "update_reservation_passengers": "passengers", "send_certificate": "compensation",
    "transfer_to_human_agents": "transfer",
}
#: request types that change an existing order or reservation (the ``modify`` subset)
MODIFY_TYPES = frozenset({"modify_items", "modify_address", "modify_payment", "user_address", "modify_flights",
                          "baggage", "passengers"})
#: the request types each domain's tasks can have (``refusal``: no write and no transfer)
DOMAIN_TYPES = {
    "retail": ("cancel", "return", "exchange", "modify_items", "modify_address", "modify_payment", "user_address",
               "transfer", "refusal"),
    "airline": ("booking", "cancel", "modify_flights", "baggage", "passengers", "compensation", "transfer", "refusal"),
}


@dataclasses.dataclass(frozen=True, eq=False)
class Tau2Task:
  """One conversation task of a tau2 domain.

  domain: ``retail`` or ``airline``.
  task_id: ``<domain>-<tau2 id>`` for tau2's own tasks, ``<domain>-gen-<n>`` for generated ones.
  task: the tau2 ``Task`` (scenario, evaluation criteria).
  origin: ``tau2`` or ``generated``.
  failing_calls: the indices of the gold calls that fail on purpose when already known (a generated
    task's gold calls were all checked to succeed: ``()``); None: found by a gold replay on first use.
  """

  domain: str
  task_id: str
  task: Any
  origin: str = "tau2"
  failing_calls: tuple[int, ...] | None = None

  @property
  def scenario(self) -> Any:
    return self.task.user_scenario

  @property
  def gold_actions(self) -> list[tuple[str, dict[str, Any]]]:
    """Every gold call (name, arguments), in order, those that fail on purpose included."""
    criteria = self.task.evaluation_criteria
    return [(a.name, dict(a.arguments)) for a in (criteria.actions or [])] if criteria else []

  @property
  def failing(self) -> tuple[int, ...]:
    """Indices of the gold calls that fail on purpose (``bridge.gold_replay``)."""
    if self.failing_calls is not None:
      return self.failing_calls
    return bridge.gold_replay(self.domain, self.task).failing

  @property
  def required_actions(self) -> list[tuple[str, dict[str, Any]]]:
    """The gold calls minus those that fail on purpose."""
    failing = set(self.failing)
    return [a for i, a in enumerate(self.gold_actions) if i not in failing]

  @property
  def write_actions(self) -> list[tuple[str, dict[str, Any]]]:
    """The required gold calls that change the database."""
    writes = bridge.tool_info(self.domain)[1]
    return [a for a in self.required_actions if a[0] in writes]

  @property
  def communicate_info(self) -> list[str]:
    criteria = self.task.evaluation_criteria
    return [str(c) for c in (criteria.communicate_info or [])] if criteria else []

  @property
  def request_types(self) -> tuple[str, ...]:
    """What the task asks for (see the module docstring), in the order of its gold calls."""
    return request_types_of(self)


@functools.lru_cache(maxsize=4096)
def _types(domain: str, task_id: str, names: tuple[str, ...]) -> tuple[str, ...]:
  del domain, task_id  # cache keys
  out = tuple(dict.fromkeys(REQUEST_TYPES[n] for n in names if n in REQUEST_TYPES))
  return out or ("refusal",)


def request_types_of(task: Tau2Task) -> tuple[str, ...]:
  return _types(task.domain, task.task_id, tuple(name for name, _ in task.required_actions))


def tau2_tasks(domain: str, split: str = "base") -> list[Tau2Task]:
  """tau2's own tasks of ``domain``: ``base`` (all of them), or its ``train`` / ``test`` split."""
  ids = bridge.split_ids(domain)
  if split not in ids:
    raise ValueError(f"split: expected one of {sorted(ids)}, got {split!r}")
  keep = set(ids[split])
  return [Tau2Task(domain, f"{domain}-{t.id}", t) for t in bridge.base_tasks(domain) if t.id in keep]


def find_task(domain: str, task_id: str) -> Tau2Task:
  """tau2's task ``task_id`` of ``domain`` (``retail-12`` or tau2's own id ``12``)."""
  for task in tau2_tasks(domain):
    if task_id in (task.task_id, str(task.task.id)):
      return task
  raise ValueError(f"task_id: no {domain} task {task_id!r}")
