"""Helpers the Telecom intervention tests share: a step's StepContext, an env after given turns,
and the steps of a scripted agent's replay with the state-based fault tracker beside them."""

from __future__ import annotations

import copy
from typing import Any, Iterator, Sequence

from rti_jax.envs.telecom import TelecomEnv, get_task
from rti_jax.intervention import StepContext
from telecom_state_reference import FaultTracker


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


def replay_steps(agent_cls: Any, tasks: Sequence[Any]) -> Iterator[tuple[TelecomEnv, str, FaultTracker]]:
  """``(env, draft, tracker)`` before every step of ``agent_cls``'s episode on each task; once the
  caller is done with a step, the env takes the draft and the tracker observes the user's turn."""
  for task in tasks:
    env = TelecomEnv()
    env.reset(task)
    agent = agent_cls(task)
    tracker = FaultTracker()
    while True:
      draft = agent.act(env.transcript.messages)
      yield env, draft, tracker
      before = copy.deepcopy(env.state)
      done = env.step(draft).done
      tracker.observe(before, env.transcript.info["turns"][-1]["user_calls"])
      if done:
        break
