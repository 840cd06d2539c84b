"""Helpers the Telecom intervention tests share: a step's StepContext and an env after given turns."""

from __future__ import annotations

from rti_jax.envs.telecom import TelecomEnv, get_task
from rti_jax.intervention import StepContext


def ctx_of(env: TelecomEnv, draft: str = "") -> StepContext:
  """The roles' view of ``env``'s current step (as ``pipeline.step_context`` builds it)."""
  msgs = env.transcript.messages
  return StepContext(msgs[1]["content"], tuple(m for m in msgs if m["role"] != "system"), draft,
                     tuple(env.tool_schemas()), env.reward_evidence(), "telecom")


def env_after(task_id: str, turns: list[str]) -> TelecomEnv:
  """A fresh env of ``task_id`` after the assistant ``turns`` (none of which may end it)."""
  env = TelecomEnv()
  env.reset(get_task(task_id))
  for t in turns:
    assert not env.step(t).done
  return env
