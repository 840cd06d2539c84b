"""The offline Navigation benchmark as the trainer's ``TaskSource``."""

from __future__ import annotations

from typing import Any

from rti_jax.envs.registry import options_of
from rti_jax.envs.source import TaskSource


def navigation_source(cfg: Any, tools_in_template: bool = False) -> TaskSource:
  """The offline Navigation benchmark as a ``TaskSource``.

  tools_in_template: the system message holds the rules only and ``tool_schemas`` goes to the chat
  template's ``tools=`` (a real chat model, e.g. Qwen3, gets its own tools layout); default False:
  the system message lists the tools (the tiny policies' layout) and ``tool_schemas`` is None.
  """
  from rti_jax.envs import navigation
  from rti_jax.envs.navigation.tasks import listed_alternative

  opts = options_of(cfg)  # env.navigation.*
  bench = navigation.load_benchmark(
      cfg.env.setting, num_train=cfg.env.num_train, num_test=cfg.env.num_test, seed=cfg.env.seed,
      max_turns=cfg.env.max_turns, hidden_city_share=opts.hidden_city_share,
  )
  world = bench.world
  listed = lambda t: listed_alternative(world, t)  # noqa: E731
  return TaskSource(
      train=bench.train,
      test=bench.test,
      env_factory=lambda: navigation.NavigationEnv(world, tools_in_prompt=not tools_in_template),
      task_id=lambda t: t.task_id,
      subsets={"disambiguation": lambda t: bool(t.needs_disambiguation), "listed_alternative": listed,
               "research_only": lambda t: bool(t.needs_disambiguation) and not listed(t),
               **({"hidden_city": lambda t: bool(t.hidden_city)} if world.config.hidden_city_share > 0 else {})},
      domain="navigation",
      rl_exclude=listed if opts.rl_exclude_listed else None,
      tool_schemas=navigation.tool_schemas(world.config.terse, world.config.hidden_city_share > 0)
      if tools_in_template else None,
  )
