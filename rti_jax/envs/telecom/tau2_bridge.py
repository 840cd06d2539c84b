"""Scores a Telecom episode of this port with tau2-bench itself (the ``tau2`` extra).

``episode_record(env)`` takes a finished ``TelecomEnv`` episode apart into plain data:
the task, how it ended, and per turn the assistant's text or tool calls, the user's
device-tool calls and the user's reply. ``tau2_messages`` turns that into tau2's
``Message`` objects: every tool call (agent's and user's, with its arguments) is
replayed in tau2's own Telecom environment, built from the task's initialization
actions, and the tool reply is what that environment returns (so the messages pass
tau2's own replay check). ``score`` wraps them in a ``SimulationRun`` and calls tau2's
``evaluate_simulation`` (``EvaluationType.ALL``: the environment evaluator, which
replays the trajectory and runs the env assertions, times the action evaluator,
as the task's ``reward_basis`` says).

Covered reward bases: ENV_ASSERTION and ACTION (the only ones the 114 base tasks
use; DB is computed by tau2's evaluator but no Telecom task rewards it). No task has
NL assertions or communicate checks, so no LLM judge is needed: scoring is offline.

No tau2 code is copied here; tau2 is imported, lazily, and a clear ImportError says
how to install it when the extra is missing. Two shims make tau2's scoring of one
episode independent of what ran before it in the process (neither changes a rule):

* tau2's refuel on a customer without a draft bill names the new bill with
  ``uuid4``; while scoring, that name comes from a counter restarted per replay, so
  the replays that tau2's evaluator compares see the same bill ids;
* every phone's ``connect_vpn`` shares one VPN-details record, which the
  ``break_vpn`` fault degrades for the rest of the process; it is restored before
  each replay, so an episode is scored as in a fresh process (within the episode a
  VPN reconnected after the fault is still poor, as the port models).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import uuid
from typing import Any, Iterator

from rti_jax.envs.telecom.tasks import TelecomTask

INSTALL_HINT = 'the tau2 bridge needs tau2-bench: python -m pip install -e ".[tau2]" -c constraints.txt'
#: our episode endings -> tau2's termination reasons (a transfer ends with the user's ###TRANSFER###)
TERMINATION = {"agent_stop": "agent_stop", "user_stop": "user_stop", "transfer": "user_stop",
               "max_turns": "max_steps"}


@functools.cache
def tau2_modules() -> dict[str, Any]:
  """tau2's modules used here (imported once; raises ImportError with the install command)."""
  # litellm (imported by tau2's registry) would otherwise try to download its price table
  os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
  try:
    from loguru import logger
    logger.disable("tau2")  # its import-time and per-call logging
    from tau2.data_model import message, simulation, tasks
    from tau2.domains.telecom import environment, tools, user_data_model
    from tau2.evaluator import evaluator
  except ImportError as e:
    raise ImportError(f"{INSTALL_HINT} ({e})") from e
  return {"message": message, "simulation": simulation, "tasks": tasks, "environment": environment,
          "tools": tools, "user_data_model": user_data_model, "evaluator": evaluator}


@functools.cache
def _tau2_base_tasks() -> dict[str, Any]:
  env_mod = tau2_modules()["environment"]
  return {t.id: t for t in env_mod.get_tasks("base")}


def tau2_task(task: TelecomTask) -> Any:
  """tau2's own Task for a base task id; for any other task (e.g. a recombined one) a
  tau2 Task with this task's initialization and evaluation criteria."""
  base = _tau2_base_tasks()
  if task.task_id in base:
    return base[task.task_id]
  raw = next(iter(base.values())).model_dump(mode="json")
  raw["id"] = task.task_id
  raw["initial_state"] = {"initialization_data": None, "message_history": None,
                          "initialization_actions": [dict(a) for a in task.init_actions]}
  raw["evaluation_criteria"] = {
      "actions": [{"action_id": f"{a.name}_{i}", "requestor": a.requestor, "name": a.name,
                   "arguments": dict(a.arguments),
                   "compare_args": None if a.compare_args is None else list(a.compare_args)}
                  for i, a in enumerate(task.actions)],
      "env_assertions": [{"env_type": a.env_type, "func_name": a.func_name, "arguments": dict(a.arguments),
                          "assert_value": a.assert_value} for a in task.env_assertions],
      "reward_basis": list(task.reward_basis), "nl_assertions": None, "communicate_info": None}
  return tau2_modules()["tasks"].Task.model_validate(raw)


# ----------------------------------------------------------------------------- episodes


def episode_record(env: Any) -> dict[str, Any]:
  """A finished ``TelecomEnv`` episode as plain data: ``task`` (the TelecomTask),
  ``termination``, ``reward`` and ``evaluation`` (ours: ``RewardInfo.to_dict()``, each
  assertion's and expected action's result) and ``turns``: per turn ``assistant`` (the
  text, None for a user-only step), ``agent_calls`` / ``user_calls`` ([{name, arguments}])
  and ``user_reply`` (None when the user did not answer)."""
  transcript = env.transcript
  if not transcript.done:
    raise ValueError("episode_record needs a finished episode (the env is not done)")
  turns = [{"assistant": t["assistant"],
            "agent_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in t["agent_calls"]],
            "user_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in t["user_calls"]],
            "user_reply": t["user_reply"]} for t in transcript.info["turns"]]
  return {"task": env.task, "termination": transcript.info["termination"], "reward": transcript.reward,
          "evaluation": transcript.info.get("evaluation"), "turns": turns}


class _CountingIds:
  """Stands in for the ``uuid`` module in tau2's Telecom tools: ``uuid4`` counts from 1."""

  def __init__(self) -> None:
    self.n = 0

  def uuid4(self) -> uuid.UUID:
    self.n += 1
    return uuid.UUID(int=self.n << 96)


@contextlib.contextmanager
def _counting_ids() -> Iterator[_CountingIds]:
  tools = tau2_modules()["tools"]
  ids, saved = _CountingIds(), tools.uuid
  tools.uuid = ids
  try:
    yield ids
  finally:
    tools.uuid = saved


def _fresh_vpn_server() -> None:
  """Restores the VPN details that tau2's ``connect_vpn`` hands to every phone."""
  mods = tau2_modules()
  user_tools = mods["environment"].TelecomUserTools
  excellent = mods["user_data_model"].PerformanceLevel.EXCELLENT
  user_tools.default_vpn_details = user_tools.default_vpn_details.model_copy(update={"server_performance": excellent})


def _tau2_environment(task: Any) -> Any:
  _fresh_vpn_server()
  env = tau2_modules()["environment"].get_environment()
  init = task.initial_state
  env.set_state(initialization_data=init.initialization_data if init else None,
                initialization_actions=init.initialization_actions if init else None, message_history=[])
  return env


def tau2_messages(record: dict[str, Any]) -> list[Any]:
  """The episode as tau2 messages, every tool reply from tau2's own Telecom environment."""
  with _counting_ids():
    return _messages(record, tau2_task(record["task"]))


def _messages(record: dict[str, Any], task: Any) -> list[Any]:
  m = tau2_modules()["message"]
  env = _tau2_environment(task)
  messages: list[Any] = []
  n = 0

  def calls(requestor: str, specs: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    nonlocal n
    tool_calls = []
    for spec in specs:
      n += 1
      args = spec["arguments"] if isinstance(spec["arguments"], dict) else {}
      tool_calls.append(m.ToolCall(id=f"call_{n}", name=str(spec["name"]), arguments=args, requestor=requestor))
    return tool_calls, [env.get_response(tc) for tc in tool_calls]

  for turn in record["turns"]:
    if turn["assistant"] is not None:
      if turn["agent_calls"]:
        tool_calls, replies = calls("assistant", turn["agent_calls"])
        messages.append(m.AssistantMessage(role="assistant", content=None, tool_calls=tool_calls))
        messages.extend(replies)
      else:
        messages.append(m.AssistantMessage(role="assistant", content=turn["assistant"]))
    if turn["user_calls"]:
      tool_calls, replies = calls("user", turn["user_calls"])
      messages.append(m.UserMessage(role="user", content=None, tool_calls=tool_calls))
      messages.extend(replies)
    if turn["user_reply"] is not None:
      messages.append(m.UserMessage(role="user", content=turn["user_reply"]))
  return messages


@dataclasses.dataclass(frozen=True)
class Tau2Score:
  """tau2's verdict on one episode: the reward, its breakdown by reward basis, each env
  assertion and expected action with its result, and tau2's RewardInfo itself."""

  reward: float
  breakdown: dict[str, float]
  env_assertions: tuple[tuple[str, bool], ...]
  actions: tuple[tuple[str, bool], ...]
  termination: str
  reward_info: Any


def score(record: dict[str, Any]) -> Tau2Score:
  """Scores ``record`` (``episode_record``) with tau2's ``evaluate_simulation``."""
  mods = tau2_modules()
  sim_mod, ev = mods["simulation"], mods["evaluator"]
  termination = TERMINATION.get(record["termination"])
  if termination is None:
    raise ValueError(f"termination must be one of {sorted(TERMINATION)}, got {record['termination']!r}")
  task = tau2_task(record["task"])
  with _counting_ids() as ids:
    messages = _messages(record, task)
    ids.n = 0  # the evaluator's replay of the trajectory names new bills as the one above did
    _fresh_vpn_server()
    now = "2025-02-25T12:08:00"
    simulation = sim_mod.SimulationRun(
        id=f"rti-jax-{task.id}", task_id=task.id, start_time=now, end_time=now, duration=0.0,
        termination_reason=sim_mod.TerminationReason(termination), messages=messages)
    info = ev.evaluate_simulation(simulation=simulation, task=task, evaluation_type=ev.EvaluationType.ALL,
                                  solo_mode=False, domain="telecom")
  breakdown = {getattr(k, "value", str(k)): float(v) for k, v in (info.reward_breakdown or {}).items()}
  assertions = tuple((c.env_assertion.func_name, bool(c.met)) for c in info.env_assertions or [])
  actions = tuple((c.action.name, bool(c.action_match)) for c in info.action_checks or [])
  return Tau2Score(reward=float(info.reward), breakdown=breakdown, env_assertions=assertions, actions=actions,
                   termination=termination, reward_info=info)
