"""Offline Navigation benchmark (paper Appendix C.2.1): an Amap-like world, three tools,
inverse-constructed tasks with order levels, the order-aware binary reward, and
scripted reference agents.

Typical use::

    from rti_jax.envs import navigation
    bench = navigation.load_benchmark("tiny")           # or "paper"
    env = navigation.NavigationEnv(bench.world)
    messages = env.reset(bench.train[0])
    result = env.step(assistant_text)                   # Qwen <tool_call> blocks
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rti_jax.envs.navigation.agents import NaiveAgent, OracleAgent, pass_rate, run_episode
from rti_jax.envs.navigation.config import PAPER, PRESETS, TINY, NavConfig, get_config
from rti_jax.envs.navigation.env import NavigationEnv, system_prompt
from rti_jax.envs.navigation.reward import ORDER_RULES, Route, route_matches, score_direction
from rti_jax.envs.navigation.tasks import (GenerationReport, NavTask, Stop, annotate_order_level, build_splits,
                                           load_tasks, save_tasks)
from rti_jax.envs.navigation.tools import tool_schemas
from rti_jax.envs.navigation.vocab import SPECIAL_TOKENS, WORD_PATTERN, tokenize_words, vocabulary
from rti_jax.envs.navigation.world import POI, World, build_world, normalize_location


@dataclasses.dataclass(frozen=True)
class Benchmark:
  """A world with its deterministic splits and the construction report."""

  config: NavConfig
  world: World
  train: list[NavTask]
  test: list[NavTask]
  report: GenerationReport


def load_benchmark(config: str | NavConfig = "tiny", **overrides: Any) -> Benchmark:
  """Builds the world and regenerates the train/test tasks of a preset or a ``NavConfig``."""
  cfg = get_config(config, **overrides) if isinstance(config, str) else dataclasses.replace(config, **overrides)
  world = build_world(cfg)
  report = GenerationReport()
  splits = build_splits(world, report)
  return Benchmark(config=cfg, world=world, train=splits["train"], test=splits["test"], report=report)


__all__ = [
    "Benchmark", "GenerationReport", "NaiveAgent", "NavConfig", "NavTask", "NavigationEnv", "ORDER_RULES",
    "OracleAgent", "PAPER", "POI", "PRESETS", "Route", "SPECIAL_TOKENS", "Stop", "TINY", "WORD_PATTERN", "World",
    "annotate_order_level", "build_splits", "build_world", "get_config", "load_benchmark", "load_tasks",
    "normalize_location", "pass_rate", "route_matches", "run_episode", "save_tasks", "score_direction",
    "system_prompt", "tokenize_words", "tool_schemas", "vocabulary",
]
