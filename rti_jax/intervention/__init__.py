"""Rollout-Time Intervention (paper Sec. 4.1-4.2, Algorithm 1): roles, pipeline, statistics.

The data path: ``rollout.rollout_groups`` -> ``intervene_groups`` (only all-fail groups)
-> ``objectives.assemble_batch`` -> ``objectives.loss_from_batch``.
"""

from rti_jax.intervention.judges import (
  Correction,
  JudgeLLM,
  LLMCorrector,
  LLMValidator,
  LLMVerifier,
  PolicyCorrector,
  StepContext,
  ValidatorJudgement,
  VerifierJudgement,
  parse_corrector,
  parse_json_object,
  parse_validator,
  parse_verifier,
)
from rti_jax.intervention.pipeline import (
  InterventionConfig,
  InterventionRoles,
  group_all_failed,
  intervene_groups,
  make_roles,
  run_intervened_rollouts,
)
from rti_jax.intervention.rules_navigation import NavigationRuleValidator, NavigationRuleVerifier
from rti_jax.intervention.stats import InterventionStats

__all__ = [
  "Correction",
  "InterventionConfig",
  "InterventionRoles",
  "InterventionStats",
  "JudgeLLM",
  "LLMCorrector",
  "LLMValidator",
  "LLMVerifier",
  "NavigationRuleValidator",
  "NavigationRuleVerifier",
  "PolicyCorrector",
  "StepContext",
  "ValidatorJudgement",
  "VerifierJudgement",
  "group_all_failed",
  "intervene_groups",
  "make_roles",
  "parse_corrector",
  "parse_json_object",
  "parse_validator",
  "parse_verifier",
  "run_intervened_rollouts",
]
from rti_jax.intervention.rules_telecom import TelecomRuleValidator, TelecomRuleVerifier  # noqa: E402

__all__ += ["TelecomRuleValidator", "TelecomRuleVerifier"]
