"""What the trainer needs of a benchmark: its tasks, how to make its episodes, how to report them.

Each benchmark registers a function ``cfg -> TaskSource`` (``rti_jax.envs.registry``);
``registry.task_source(cfg)`` calls the one of ``cfg.env.name``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from rti_jax.envs.base import Environment


@dataclasses.dataclass
class TaskSource:
  """An environment's tasks and how to make its episodes (what the trainer needs of a benchmark).

  train / test: task objects the env's ``reset`` accepts.
  env_factory: a new ``Environment`` per episode.
  task_id: a stable id of a task.
  subsets: named boolean selectors for reporting, e.g. ``{"disambiguation": pred}``.
  domain: the registered environment name, which picks its rule roles and judge prompts.
  tool_schemas: schemas passed to the chat template (None when the env writes its own
    system prompt with the tools, as Navigation does).
  """

  train: Sequence[Any]
  test: Sequence[Any]
  env_factory: Callable[[], Environment]
  task_id: Callable[[Any], str]
  subsets: dict[str, Callable[[Any], bool]]
  domain: str
  tool_schemas: list[dict[str, Any]] | None = None
  rl_exclude: Callable[[Any], bool] | None = None  # train tasks kept out of RL rollouts (not out of validation)
  # An episode succeeds when its reward reaches this (rewards may be fractional); a group none of
  # whose rollouts succeeds is an all-fail group (Algorithm 1 line 5), and Pass@k counts successes.
  success_threshold: float = 1.0

  def __post_init__(self) -> None:
    if not 0.0 < self.success_threshold < float("inf"):
      raise ValueError(f"success_threshold: expected a finite reward > 0, got {self.success_threshold}")
