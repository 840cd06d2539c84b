"""Scripted agents for the tau2 domains: the gold replay (what the scripted user's coverage is
measured with) and the do-nothing baselines (``run_episode`` is ``envs.base.run_episode``).

``GoldAgent`` plays a task's gold calls through the text interface the way the policy must: it
first asks the user to identify themself, runs each required gold call (the ones that do not fail
on purpose) as a Qwen ``<tool_call>`` block, and before each write lists the call's exact details
and asks for a yes; at the end it tells the user what the task's ``communicate_info`` requires and
asks whether anything else is needed (the scripted user then ends the call). It scores 1 on a task
exactly when the scripted user answered it as the task needs.
"""

from __future__ import annotations

import json
from typing import Any

from rti_jax.envs.base import run_episode  # noqa: F401  (re-exported for callers)
from rti_jax.envs.tau2 import bridge
from rti_jax.envs.tau2.bridge import STOP
from rti_jax.envs.tau2.tasks import Tau2Task


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
  """One call in Qwen's layout."""
  body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
  return f"<tool_call>\n{body}\n</tool_call>"


def _identity_question(task: Tau2Task) -> str:
  names = [name for name, _ in task.required_actions]
  if "find_user_id_by_email" in names:
    return "I can help with that. Could you please tell me your email address?"
  if "find_user_id_by_name_zip" in names:
    return "I can help with that. Could you please tell me your first and last name and your zip code?"
  if task.domain == "airline":
    return "I can help with that. Could you please tell me your user id?"
  return "I can help with that. Could you please tell me your email address, or your name and zip code?"


def describe_call(name: str, arguments: dict[str, Any]) -> str:
  """The exact details of a write call, as the agent lists them before asking for a yes."""
  details = "; ".join(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
  return f"{name.replace('_', ' ')} with {details}"


class GoldAgent:
  """Replays ``task``'s required gold calls through the text interface (see the module docstring)."""

  def __init__(self, task: Tau2Task) -> None:
    self.task = task
    self.writes = bridge.tool_info(task.domain)[1]
    self.plan: list[tuple[str, Any]] = [("say", _identity_question(task))]
    for name, args in task.required_actions:
      if name in self.writes:
        self.plan.append(("say", f"To confirm, I will {describe_call(name, args)}. Shall I proceed (yes/no)?"))
      self.plan.append(("call", (name, args)))
    if "transfer_to_human_agents" not in [n for n, _ in task.required_actions]:
      told = f" For your information: {', '.join(task.communicate_info)}." if task.communicate_info else ""
      self.plan.append(("say", f"Everything you asked for is done.{told} Is there anything else I can help you with?"))
      self.plan.append(("say", f"Thank you for contacting us. {STOP}"))
    self._i = 0

  def act(self, messages: list[dict[str, Any]]) -> str:
    del messages
    if self._i >= len(self.plan):
      return STOP
    kind, what = self.plan[self._i]
    self._i += 1
    return tool_call_text(*what) if kind == "call" else what


class DoNothingAgent:
  """Ends the conversation at once (``stop=True``, what tau2 scores an empty episode) or only chats
  until the user or the turn limit ends it."""

  def __init__(self, stop: bool = True) -> None:
    self.stop = stop

  def act(self, messages: list[dict[str, Any]]) -> str:
    del messages
    return STOP if self.stop else "I understand. Is there anything else I can help you with?"
