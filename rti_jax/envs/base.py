"""The generic multi-turn environment interface.

Every benchmark (Navigation, tau2-Telecom, ...) implements ``Environment``. An
episode is driven by the rollout engine as::

    messages = env.reset(task)            # system prompt (+ tool schemas) and user query
    while True:
      result = env.step(assistant_text)   # parse calls, run tools, maybe end
      if result.done: break
      # result.messages are appended to the conversation (tool responses or user turns)

Messages are chat-template dicts: ``{"role": "system"|"user"|"assistant"|"tool",
"content": str}``. Environments never raise on model output: malformed output
becomes an error observation and is counted in ``StepResult.info``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any


@dataclasses.dataclass
class StepResult:
  """What one assistant turn produced.

  messages: new messages for the conversation (tool responses, user replies).
  done: the episode has ended (answer, stop, or turn limit).
  reward: the final reward; meaningful when ``done`` (0.0 before).
  info: counters and diagnostics, e.g. ``{"malformed": 1, "tool_errors": 0}``.
  """

  messages: list[dict[str, Any]]
  done: bool
  reward: float = 0.0
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Transcript:
  """The full record of an episode, kept for inspection, judging and plots."""

  task_id: str
  messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  num_turns: int = 0
  reward: float = 0.0
  done: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


class Environment(abc.ABC):
  """A stateful episode over one task. Create one instance per concurrent episode."""

  #: the most assistant turns an episode may take
  max_turns: int

  @abc.abstractmethod
  def reset(self, task: Any) -> list[dict[str, Any]]:
    """Starts an episode; returns the initial messages (system, user)."""

  @abc.abstractmethod
  def step(self, assistant_text: str) -> StepResult:
    """Consumes one assistant turn; returns new messages, done and reward."""

  @property
  @abc.abstractmethod
  def transcript(self) -> Transcript:
    """The episode so far (all messages, turns, reward)."""

  @abc.abstractmethod
  def tool_schemas(self) -> list[dict[str, Any]]:
    """OpenAI/Qwen function-calling schemas of the agent's tools."""

  def reward_evidence(self) -> dict[str, Any]:
    """Reward-side evidence for a Validator (privileged: never shown to the policy).

    Navigation returns the ground-truth route; tau2 returns the task's assertions.
    """
    return {}


class ConversationEnv(Environment):
  """The turn bookkeeping of a conversation with tools and a user (tau2-Telecom, the tau2 adapter):
  a subclass keeps its episode in ``_transcript`` (whose ``info["turns"]`` lists one record per
  turn), counts in ``_counters()`` and scores an ended episode in ``_finish(new, termination)``."""

  _transcript: Transcript

  @abc.abstractmethod
  def _counters(self) -> dict[str, Any]:
    """The episode's counters for ``StepResult.info``."""

  @abc.abstractmethod
  def _finish(self, new: list[dict[str, Any]], termination: str) -> StepResult:
    """Scores the ended episode; the last step's result."""

  def _end_turn(self, new: list[dict[str, Any]], record: dict[str, Any], termination: str | None) -> StepResult:
    """Closes one turn: ``new`` messages into the transcript, ``record`` into its turns, the turn
    limit applied (``"max_turns"``); the episode ends when ``termination`` is set."""
    if termination is None and self._transcript.num_turns >= self.max_turns:
      termination = "max_turns"
    self._transcript.messages.extend(new)
    self._transcript.info["turns"].append(record)
    if termination is None:
      return StepResult(messages=new, done=False, info=self._counters())
    return self._finish(new, termination)


def run_episode(env: Environment, agent: Any, task: Any) -> Transcript:
  """Plays one episode of ``agent`` (``act(messages) -> str``, the messages so far) on ``task``;
  returns the finished transcript."""
  messages = env.reset(task)
  while True:
    result = env.step(agent.act(messages))
    messages = env.transcript.messages
    if result.done:
      return env.transcript
