"""Rule-based Validator and Verifier for tau2-Telecom (the tau2 hard rules of App. A.1, no LLM).

The defaults for a small policy that cannot act as a judge. They read the same inputs as the
LLM roles (``StepContext``; evidence = ``TelecomEnv.reward_evidence()``) and return the same
judgements. The pieces:
  * ``telecom_validator``: ``TelecomRuleValidator`` and the rule names it reports;
  * ``telecom_verifier``: ``TelecomRuleVerifier`` (leaks, unseen values, invented results, fixes
    asked before a check showed their need);
  * ``telecom_fixes``: which device fix the visible conversation justifies (``FIX_RULES``, ``READERS``);
  * ``telecom_evidence``: reading the conversation (values, tool runs, required actions);
  * ``telecom_diagnostics``: firing rates of the Validator on scripted agents.
"""

from rti_jax.intervention.telecom_evidence import device_requests
from rti_jax.intervention.telecom_fixes import FIX_RULES, unjustified_fixes
from rti_jax.intervention.telecom_validator import (
  ARGUMENT_MISMATCH,
  FABRICATED_ARGUMENTS,
  FALSE_CLAIM,
  GOAL_DRIFT,
  POINTLESS_REPEAT,
  PREMATURE_TERMINATION,
  RULES,
  USER_SIDE_DEVICE_ACTION,
  TelecomRuleValidator,
)
from rti_jax.intervention.telecom_verifier import TelecomRuleVerifier

__all__ = [
  "ARGUMENT_MISMATCH",
  "FABRICATED_ARGUMENTS",
  "FALSE_CLAIM",
  "FIX_RULES",
  "GOAL_DRIFT",
  "POINTLESS_REPEAT",
  "PREMATURE_TERMINATION",
  "RULES",
  "USER_SIDE_DEVICE_ACTION",
  "TelecomRuleValidator",
  "TelecomRuleVerifier",
  "device_requests",
  "unjustified_fixes",
]
