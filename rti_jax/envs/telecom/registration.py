"""tau2-Telecom (this project's offline port) in the environment registry: ``env.name=telecom``,
its options ``env.telecom.*``, the rule roles and tau2's customer-service judge prompts."""

from __future__ import annotations

import dataclasses
from typing import Any

from rti_jax.envs.registry import EnvSpec, register
from rti_jax.intervention.prompting import ServiceAgentPrompts


@dataclasses.dataclass
class TelecomOptions:
  """``env.telecom.*``."""

  # The policy text of the system prompt. full = tau2's policy + tech-support manual; condensed =
  # ``envs.telecom.condensed.CONDENSED_POLICY`` (for a tiny policy; what was condensed is listed
  # there). The agent-tool schemas are appended either way.
  policy_text: str = "full"
  # The rule Verifier rejects a device fix asked before any visible check showed its fault
  # (fix_without_diagnostic, docs/telecom.md); false: that rule off.
  fix_rule: bool = True

  def validate(self) -> None:
    if self.policy_text not in ("full", "condensed"):
      raise ValueError(f"policy_text: expected one of ['full', 'condensed'], got {self.policy_text!r}")


def _source(cfg: Any) -> Any:
  from rti_jax.envs.telecom.source import telecom_source

  return telecom_source(cfg, tools_in_template=cfg.env.tools_in_template)


def _rule_roles(options: TelecomOptions) -> tuple[Any, Any]:
  from rti_jax.intervention.rules_telecom import TelecomRuleValidator, TelecomRuleVerifier

  return TelecomRuleValidator(), TelecomRuleVerifier(check_fixes=options.fix_rule)


def _gold_agent(task: Any) -> Any:
  from rti_jax.envs.telecom.scripted_agents import GoldAgent

  return GoldAgent(task)


SPEC = register(EnvSpec(
    name="telecom",
    source=_source,
    options=TelecomOptions,
    rule_roles=_rule_roles,
    prompts=ServiceAgentPrompts("tau2_domain_telecom"),
    gold_agent=_gold_agent,
    user_side="scripted",
    description="tau2-Telecom, this project's offline port with a scripted user",
))
