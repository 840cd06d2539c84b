"""Navigation in the environment registry (``rti_jax.envs.registry``): ``env.name=navigation``,
its options ``env.navigation.*``, the rule roles, the route-planning judge prompts and the scripted
oracle as LUFFY's demonstrator."""

from __future__ import annotations

import dataclasses
from typing import Any

from rti_jax.envs.navigation.prompts import NavigationPrompts
from rti_jax.envs.registry import EnvSpec, register


@dataclasses.dataclass
class NavigationOptions:
  """``env.navigation.*``."""

  # Share of each split built as hidden-city tasks (``envs.navigation.hidden``): nothing the policy
  # sees tells the trip's city, the user does when asked (the ``ask_user`` tool, offered only when
  # > 0). 0 leaves the world, the tasks and the tools as they were.
  hidden_city_share: float = 0.0
  # Leave tasks that a later candidate of the first results already solves
  # (``tasks.listed_alternative``) out of RL rollouts. Validation and test splits are unchanged.
  rl_exclude_listed: bool = False

  def validate(self) -> None:
    if not 0.0 <= self.hidden_city_share <= 1.0:
      raise ValueError(f"hidden_city_share: expected in [0, 1], got {self.hidden_city_share}")


def _source(cfg: Any) -> Any:
  from rti_jax.envs.navigation.source import navigation_source

  return navigation_source(cfg, tools_in_template=cfg.env.tools_in_template)


def _rule_roles(options: NavigationOptions) -> tuple[Any, Any]:
  from rti_jax.intervention.rules_navigation import NavigationRuleValidator, NavigationRuleVerifier

  return NavigationRuleValidator(), NavigationRuleVerifier()


def _demonstrator(check_line: bool) -> Any:
  """The scripted ``OracleAgent`` (searches, re-searches off-city stops with the trip's region,
  plans the route); with ``check_line`` wrapped in ``CheckedAgent`` (the policy's own format)."""
  from rti_jax.envs.navigation import OracleAgent
  from rti_jax.policy.check_line import CheckedAgent

  return (lambda task: CheckedAgent(OracleAgent(task))) if check_line else OracleAgent


SPEC = register(EnvSpec(
    name="navigation",
    source=_source,
    options=NavigationOptions,
    rule_roles=_rule_roles,
    prompts=NavigationPrompts(),
    demonstrator=_demonstrator,
    gold_agent=lambda task: _demonstrator(False)(task),
    user_side="none (single request)",
    description="offline route planning with POI search (App. C.2.1)",
))
