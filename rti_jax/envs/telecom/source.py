"""tau2-Telecom as the trainer's ``TaskSource`` (as ``rti_jax.envs.navigation.source`` is for Navigation).

Train / test are the 74 / 40 base tasks of tau2-bench's split, train in ``rl_train_split``'s order
(issue types spread evenly, so the trainer's validation split, its last ``train.val_tasks``, holds
each type). Each episode gets a fresh ``TelecomEnv`` (it writes its own system prompt with the tool
schemas, so ``tool_schemas`` is None as for Navigation). Subsets for reporting: the three issue types
and the Hard persona.
"""

from __future__ import annotations

from typing import Any

from rti_jax.envs.registry import options_of
from rti_jax.envs.source import TaskSource
from rti_jax.envs.telecom.env import MAX_TURNS, TelecomEnv
from rti_jax.envs.telecom.tasks import ISSUE_TYPES, TelecomTask, load_split, rl_train_split


def _issue(kind: str) -> Any:
  return lambda t: t.issue_type == kind


def telecom_subsets() -> dict[str, Any]:
  """Named boolean selectors over ``TelecomTask``: each issue type, and ``hard_persona``."""
  subsets = {kind: _issue(kind) for kind in ISSUE_TYPES}
  subsets["hard_persona"] = lambda t: t.persona_level == "Hard"
  return subsets


def policy_for(policy_text: str) -> str | None:
  """The policy text for ``env.telecom.policy_text``: None (the env's full text) for "full", the
  condensed policy for "condensed"."""
  if policy_text == "full":
    return None
  if policy_text == "condensed":
    from rti_jax.envs.telecom.condensed import CONDENSED_POLICY

    return CONDENSED_POLICY
  raise ValueError(f"env.telecom.policy_text: expected 'full' or 'condensed', got {policy_text!r}")


def telecom_source(cfg: Any, policy: str | None = None, tools_in_template: bool = False) -> TaskSource:
  """The offline tau2-Telecom benchmark as a ``TaskSource``.

  cfg: reads ``cfg.env.max_turns`` (1..30; the paper's protocol allows 30 assistant
    turns), ``cfg.env.seed`` (the scripted user's phrasing seed) and ``cfg.env.telecom.policy_text``
    ("full" or "condensed", used when ``policy`` is None).
  policy: replaces the policy text of the system prompt (e.g. a condensed policy for a
    tiny model); None: ``cfg.env.telecom.policy_text`` decides ("full": the policy and tech-support
    manual; "condensed": ``condensed.CONDENSED_POLICY``).
  tools_in_template: the system message holds the policy text only and the agent tools reach the
    model through the chat template's ``tools=``; default False: the system message lists them.
  """
  max_turns = int(cfg.env.max_turns)
  if not 1 <= max_turns <= MAX_TURNS:
    raise ValueError(f"cfg.env.max_turns: expected 1..{MAX_TURNS} for telecom, got {cfg.env.max_turns}")
  if policy is not None and not (isinstance(policy, str) and policy.strip()):
    raise ValueError(f"policy: expected a non-empty string or None, got {policy!r}")
  if policy is None:
    policy = policy_for(options_of(cfg).policy_text)
  seed = int(cfg.env.seed)
  train: list[TelecomTask] = rl_train_split()  # issue types spread, so the validation tail holds each
  test: list[TelecomTask] = load_split("test")
  return TaskSource(
      train=train,
      test=test,
      env_factory=lambda: TelecomEnv(policy=policy, max_turns=max_turns, seed=seed,
                                     tools_in_prompt=not tools_in_template),
      task_id=lambda t: t.task_id,
      subsets=telecom_subsets(),
      domain="telecom",
      tool_schemas=TelecomEnv(policy=policy, tools_in_prompt=False).tool_schemas() if tools_in_template else None,
  )
