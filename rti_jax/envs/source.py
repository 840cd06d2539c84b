"""What the trainer needs of a benchmark: its tasks, how to make its episodes, how to report them.

Each benchmark provides a function ``cfg -> TaskSource`` next to its environment
(``rti_jax.envs.navigation.source``, ``rti_jax.envs.telecom.source``); :func:`task_source`
picks one by ``cfg.env.name``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from rti_jax.config import ExperimentConfig
from rti_jax.envs.base import Environment


@dataclasses.dataclass
class TaskSource:
  """An environment's tasks and how to make its episodes (what the trainer needs of a benchmark).

  train / test: task objects the env's ``reset`` accepts.
  env_factory: a new ``Environment`` per episode.
  task_id: a stable id of a task.
  subsets: named boolean selectors for reporting, e.g. ``{"disambiguation": pred}``.
  domain: the intervention prompt/rule domain ("navigation", "telecom", ...).
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


def task_source(cfg: ExperimentConfig) -> TaskSource:
  """The ``TaskSource`` of ``cfg.env.name``."""
  if cfg.env.name == "navigation":
    from rti_jax.envs.navigation.source import navigation_source

    return navigation_source(cfg, tools_in_template=cfg.env.tools_in_template)
  if cfg.env.name == "telecom":
    from rti_jax.envs.telecom.source import telecom_source

    return telecom_source(cfg, tools_in_template=cfg.env.tools_in_template)
  raise ValueError(f"env.name: expected one of ['navigation', 'telecom'], got {cfg.env.name!r}")
