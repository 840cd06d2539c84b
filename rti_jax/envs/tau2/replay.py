"""Telecom episodes of the fast port (``rti_jax.envs.telecom``) played again through ``Tau2Env``: tau2's
own Telecom environment behind the adapter that runs Retail and Airline.

``replay(record)`` takes a finished port episode as ``tau2_bridge.episode_record`` writes it down and
plays it turn by turn in a ``Tau2Env("telecom")``:

* every assistant turn goes through ``Tau2Env.step``, the same parsing and tool-call path as in
  Retail and Airline (each agent call answered by tau2's ``Environment.get_response``);
* the customer is a ``RecordedUser``: it answers each agent message with the recorded words, and
  the device-tool calls recorded with them run first, through tau2's user-tool path; a device call
  recorded outside a reply (the port's ``run_user_tool``) goes to ``Tau2Env.run_user_tool``.

Every tool reply is therefore tau2's own, not the port's, and every state change is made by tau2's
tools. The replay must end where the port's episode ended, by the same ending, else it raises
``ReplayError`` (so must every recorded reply be asked for). The episode is scored by the adapter
as it finishes (``Tau2Env(reward="tau2")``, the default here: tau2's ``evaluate_simulation`` on the
adapter's own log), and can be scored again with ``Tau2Env.score``.

The record does not carry the customer's opening message (nor does ``tau2_bridge``'s message list),
so the replayed log starts at the agent's first turn unless ``opening`` is given.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rti_jax.envs.tau2 import bridge
from rti_jax.envs.tau2.env import Tau2Env
from rti_jax.envs.tau2.tasks import Tau2Task


class ReplayError(ValueError):
  """A recorded episode the adapter does not play the same way (a reply never asked for, an agent
  message without a recorded reply, another ending)."""


@dataclasses.dataclass(frozen=True)
class RecordedReply:
  """The customer's turn in a replay: its words, how they end the call (``stop``: None, ``"stop"`` or
  ``"transfer"``), and the device-tool calls (name, arguments) it made before answering."""

  content: str
  stop: str | None = None
  understood: bool = True
  tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()


class RecordedUser:
  """The customer of a recorded episode, for ``Tau2Env.reset(task, user=...)``.

  ``expect(turn)`` hands it the recorded turn that comes next; ``respond`` then answers the agent's
  message with that turn's reply and device-tool calls, whatever the message says. The call ends
  where the recorded words end it, as tau2's user does: ``###TRANSFER###`` (a transfer) or
  ``###STOP###``.
  """

  def __init__(self, opening: str | None = None) -> None:
    self._opening = opening
    self._next: dict[str, Any] | None = None

  def opening(self) -> str | None:
    return self._opening

  def expect(self, turn: dict[str, Any]) -> None:
    """The recorded turn the next agent message belongs to (ignored when it has no customer reply)."""
    self._next = turn if turn["user_reply"] is not None or turn["user_calls"] else None

  @property
  def pending(self) -> bool:
    """A recorded reply that has not been asked for."""
    return self._next is not None

  def respond(self, message: str, done_writes: Any = None) -> RecordedReply:
    del done_writes  # the recorded customer does not read the episode
    turn, self._next = self._next, None
    if turn is None or turn["user_reply"] is None:
      raise ReplayError(f"the agent's message {message[:80]!r} gets a reply here; the record has none")
    content = str(turn["user_reply"])
    stop = "transfer" if bridge.TRANSFER in content else "stop" if bridge.STOP in content else None
    calls = tuple((str(c["name"]), c["arguments"]) for c in turn["user_calls"])
    return RecordedReply(content=content, stop=stop, tool_calls=calls)


def telecom_task(task: Any) -> Tau2Task:
  """The port's ``TelecomTask`` as the adapter's task: tau2's own ``Task`` for a base task, else one
  built from the task's initialization and evaluation criteria (``tau2_bridge.tau2_task``)."""
  from rti_jax.envs.telecom import tau2_bridge

  return Tau2Task(bridge.TELECOM, f"{bridge.TELECOM}-{task.task_id}", tau2_bridge.tau2_task(task))


def replay(record: dict[str, Any], env: Tau2Env | None = None, opening: str | None = None) -> Tau2Env:
  """Plays ``record`` (``tau2_bridge.episode_record`` of a finished port episode) in ``env`` (default
  a new ``Tau2Env("telecom", reward="tau2")``; a Telecom one with the port episode's ``max_turns``,
  30 in both by default) and returns it finished:
  ``env.result`` / ``env.transcript.reward`` are the adapter's reward, ``env.tau2_messages`` its log.
  Raises ``ReplayError`` where the adapter does not play the record the same way."""
  env = env if env is not None else Tau2Env(bridge.TELECOM, reward="tau2")
  if env.domain != bridge.TELECOM:
    raise ValueError(f"env: expected a telecom Tau2Env, got a {env.domain} one")
  user = RecordedUser(opening)
  env.reset(telecom_task(record["task"]), user=user)
  for i, turn in enumerate(record["turns"]):
    if env.transcript.done:
      raise ReplayError(f"turn {i}: the adapter's episode ended ({env.transcript.info['termination']}) "
                        f"before the record's ({record['termination']})")
    if turn["assistant"] is None:
      if turn["user_reply"] is not None:
        raise ReplayError(f"turn {i}: a customer reply without an agent message")
      for call in turn["user_calls"]:
        env.run_user_tool(call["name"], call["arguments"])
      continue
    user.expect(turn)
    env.step(turn["assistant"])
    if user.pending:
      raise ReplayError(f"turn {i}: the record has a customer reply the adapter did not ask for")
  ending = env.transcript.info["termination"]
  if not env.transcript.done or ending != record["termination"]:
    raise ReplayError(f"the record ends by {record['termination']}; the adapter's episode "
                      f"{'by ' + ending if env.transcript.done else 'goes on'}")
  return env
