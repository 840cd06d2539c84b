"""tau2-bench's Retail and Airline domains in the environment registry: ``env.name=retail`` and
``env.name=airline``, their options ``env.retail.*`` / ``env.airline.*``, the rule roles, the
service-agent judge prompts, and the gold replay as reference agent and LUFFY's demonstrator.

Nothing from tau2 is imported here (tau2 is the optional ``tau2`` extra): the source and the
environment import it on first use, and without it they raise an ImportError that names
``pip install -e ".[tau2]" -c constraints.txt -c constraints-tau2.txt``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from rti_jax.envs.registry import EnvSpec, register
from rti_jax.intervention.prompting import ServiceAgentPrompts

_CHOICES = {"policy_text": ("full", "condensed"), "user": ("scripted", "llm"), "reward": ("fast", "tau2"),
            "observation": ("compact", "raw"), "splits": ("generated", "tau2"),
            "validator_rules": ("outcome", "steps")}


@dataclasses.dataclass
class Tau2Options:
  """The options of a tau2 domain (``env.retail.*`` / ``env.airline.*``)."""

  # The system prompt's policy text: full = tau2's own policy and tool schemas; condensed =
  # ``envs.tau2.condensed`` (a few hundred tokens, for a tiny policy) with compact tool schemas.
  policy_text: str = "condensed"
  # Who plays the customer: scripted = ``envs.tau2.user.ScriptedUser`` (offline, deterministic);
  # llm = tau2's user-simulator prompt answered by the OpenAI-compatible server at user_url.
  user: str = "scripted"
  user_url: Optional[str] = None  # e.g. http://127.0.0.1:30000/v1 (an SGLang server)
  user_model: str = "default"  # the model name sent to that server
  # Each user request's total deadline and its retries; then the run stops with an error naming the server.
  user_timeout_s: float = 120.0
  user_max_retries: int = 2
  # The episode's reward: fast = the live database's hash against the gold one times tau2's
  # communicate check (equal to tau2's evaluator, ``bridge.fast_reward``); tau2 = tau2's
  # evaluate_simulation itself (replays the episode: about 0.3 s Retail, 0.7 s Airline).
  reward: str = "fast"
  # Tool replies for the policy: compact = tau2's JSON without spaces and null fields; raw = as is.
  observation: str = "compact"
  # generated = test on all of tau2's tasks, train on generated ones; tau2 = tau2's own train/test split.
  splits: str = "generated"
  # With reward=fast, this share of the finished episodes (training and evaluation) is also scored by
  # tau2's evaluate_simulation; the records count the checks and any disagreement (reward_audit/*).
  audit_share: float = 0.1
  # The rule Validator's rules (``envs.tau2.rules``): outcome = only steps that leave every path to the
  # gold outcome (an off-path write, an early end, an untold fact); steps = also a call with an id no
  # message has shown and a claim that the request is done before any write.
  validator_rules: str = "outcome"

  def validate(self) -> None:
    for name, choices in _CHOICES.items():
      value = getattr(self, name)
      if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
    if self.user == "llm" and not self.user_url:
      raise ValueError("user_url: user=llm needs the URL of an OpenAI-compatible server "
                       "(e.g. http://127.0.0.1:30000/v1), got None")
    if self.user_url is not None and not str(self.user_url).startswith(("http://", "https://")):
      raise ValueError(f"user_url: expected an http(s) URL, got {self.user_url!r}")
    if not (isinstance(self.user_model, str) and self.user_model.strip()):
      raise ValueError(f"user_model: expected a non-empty model name, got {self.user_model!r}")
    if isinstance(self.user_timeout_s, bool) or not (isinstance(self.user_timeout_s, (int, float))
                                                      and 0 < self.user_timeout_s < float("inf")):
      raise ValueError(f"user_timeout_s: expected a finite number of seconds > 0, got {self.user_timeout_s!r}")
    if isinstance(self.audit_share, bool) or not (isinstance(self.audit_share, (int, float))
                                                  and 0.0 <= self.audit_share <= 1.0):
      raise ValueError(f"audit_share: expected a share in [0, 1], got {self.audit_share!r}")
    if isinstance(self.user_max_retries, bool) or not (isinstance(self.user_max_retries, int)
                                                        and 0 <= self.user_max_retries <= 10):
      raise ValueError(f"user_max_retries: expected an integer in [0, 10], got {self.user_max_retries!r}")


@dataclasses.dataclass
class RetailOptions(Tau2Options):
  """``env.retail.*`` (see ``Tau2Options``)."""


@dataclasses.dataclass
class AirlineOptions(Tau2Options):
  """``env.airline.*`` (see ``Tau2Options``)."""


def _source(domain: str) -> Any:
  def source(cfg: Any) -> Any:
    from rti_jax.envs.tau2.source import tau2_source

    return tau2_source(cfg, domain, tools_in_template=cfg.env.tools_in_template)

  return source


def _rule_roles(options: Tau2Options) -> tuple[Any, Any]:
  from rti_jax.envs.tau2.rules import Tau2RuleValidator, Tau2RuleVerifier

  return Tau2RuleValidator(rules=options.validator_rules), Tau2RuleVerifier()


def _gold_agent(task: Any) -> Any:
  from rti_jax.envs.tau2.agents import GoldAgent

  return GoldAgent(task)


def _demonstrator(check_line: bool) -> Any:
  """The gold replay (``agents.GoldAgent``); the tau2 domains have no check line."""
  if check_line:
    raise ValueError("check_line: the tau2 domains have no check line; use a policy built without it")
  return _gold_agent


def _register(domain: str, options: type) -> EnvSpec:
  return register(EnvSpec(
      name=domain,
      source=_source(domain),
      options=options,
      rule_roles=_rule_roles,
      prompts=ServiceAgentPrompts(f"tau2_domain_{domain}"),
      demonstrator=_demonstrator,
      gold_agent=_gold_agent,
      stats_overrides=(f"env.{domain}.reward=tau2",),  # the stats score every gold replay by tau2's evaluator
      user_side="scripted or LLM",
      description=f"tau2-bench {domain.capitalize()}, run by tau2's own tools and evaluator",
  ))


RETAIL = _register("retail", RetailOptions)
AIRLINE = _register("airline", AirlineOptions)
