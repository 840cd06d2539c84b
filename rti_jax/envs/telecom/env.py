"""tau2-Telecom as an ``rti_jax.envs.base.Environment``: offline and programmatic.

Episode (at most ``max_turns`` = 30 assistant turns, as in the paper's protocol):

* ``reset(task)`` -> [system (policy + manual), user (the problem)];
* ``step(text)``: a turn with Qwen ``<tool_call>`` blocks runs agent tools and
  returns ``tool`` messages (a call to a user-device tool is an error observation:
  the user must do it); a turn without calls is a message to the user, whom the
  scripted simulator answers with a ``user`` message. The episode ends on the
  agent's ``###STOP###``, the user's stop (goal reached) or transfer, or the turn
  limit (reward 0).
* reward (at the end): ``evaluation.evaluate`` (product of the task's
  ENV_ASSERTION and, where listed, ACTION checks).

``transcript.info["turns"]`` keeps one record per turn (assistant text, agent tool
calls with outputs, the user's device actions and reply) for judging and for an
intervention Validator; ``reward_evidence()`` gives the task's assertions and gold
actions (privileged, never shown to the policy).
"""

from __future__ import annotations

import importlib.resources
import json
from typing import Any

from rti_jax.envs.base import ConversationEnv, StepResult, Transcript
from rti_jax.envs.navigation.env import TOOLS_FOOTER, TOOLS_HEADER
from rti_jax.envs.telecom import agent_tools as at
from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.evaluation import RewardInfo, ToolCallRecord, evaluate
from rti_jax.envs.telecom.tasks import TelecomTask, get_task
from rti_jax.envs.telecom.user_sim import ScriptedUser, goal_of
from rti_jax.envs.tool_calls import parse_assistant_turn

AGENT_STOP = "###STOP###"
TRANSFER_MESSAGE = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."
MAX_TURNS = 30


NO_ACTION = "Error: empty turn; call a tool or write a message to the user."


def policy_text() -> str:
  """The agent policy and the tech-support manual, as tau2-bench gives the agent, plus
  the offline conventions (which tools are the user's, how to end)."""
  data = importlib.resources.files("rti_jax.envs.telecom").joinpath("data")
  policy = data.joinpath("main_policy.md").read_text(encoding="utf-8")
  manual = data.joinpath("tech_support_manual.md").read_text(encoding="utf-8")
  return (f"{policy.strip()}\n\n{manual.strip()}\n\nUser-device tools (the user runs them, you cannot): "
          f"{', '.join(dt.DEVICE_TOOLS)}. End the conversation with {AGENT_STOP} when the issue is resolved.")


def system_prompt(policy: str | None = None, with_tools: bool = True) -> str:
  """The system message: ``policy`` (default ``policy_text()``) plus, with ``with_tools``, the
  agent tool schemas in Qwen's function-calling layout (the same layout as Navigation)."""
  text = (policy if policy is not None else policy_text()).strip()
  if not with_tools:
    return text
  schemas = "\n".join(json.dumps(t.schema(), ensure_ascii=False, separators=(",", ":"))
                      for t in at.AGENT_TOOLS.values())
  return f"{text}\n\n{TOOLS_HEADER}\n{schemas}\n{TOOLS_FOOTER}"


class TelecomEnv(ConversationEnv):
  """One tau2-Telecom episode at a time; create one instance per concurrent episode.

  policy: replaces the policy text (e.g. a condensed policy for a tiny model).
  seed: the scripted user's phrasing seed.
  tools_in_prompt: the system message lists the agent tools (default; the layout the tiny policy
    was trained on); False: the policy text only, and the tools go to the chat template's
    ``tools=`` (``tool_schemas()``), as a real chat model expects.
  """

  def __init__(self, policy: str | None = None, max_turns: int = MAX_TURNS, seed: int = 0,
               tools_in_prompt: bool = True):
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    self.max_turns = max_turns
    self.seed = seed
    self.tools_in_prompt = bool(tools_in_prompt)
    self._system_prompt = system_prompt(policy, with_tools=self.tools_in_prompt)
    self._task: TelecomTask | None = None
    self._state: st.TelecomState | None = None
    self._user: ScriptedUser | None = None
    self._calls: list[ToolCallRecord] = []
    self._transcript = Transcript(task_id="")
    self._transferred = False
    self.result: RewardInfo | None = None

  # --------------------------------------------------------------------------- API

  def reset(self, task: TelecomTask | str) -> list[dict[str, Any]]:
    """Starts an episode on ``task`` (a ``TelecomTask`` or a base task id)."""
    task = get_task(task) if isinstance(task, str) else task
    if not isinstance(task, TelecomTask):
      raise TypeError(f"task must be a TelecomTask or a task id, got {type(task).__name__}")
    self._task = task
    self._state = st.initialize(list(task.init_actions))
    self._user = ScriptedUser(task, self._state, seed=self.seed)
    self._calls = []
    self._transferred = False
    self.result = None
    messages = [{"role": "system", "content": self._system_prompt},
                {"role": "user", "content": self._user.opening()}]
    self._transcript = Transcript(task_id=task.task_id, messages=list(messages), info={
        "turns": [], "malformed": 0, "tool_errors": 0, "user_device_calls_by_agent": 0,
        "unknown_tools": 0, "unmapped_user_turns": 0, "mixed_turns": 0, "multi_call_turns": 0,
        "termination": None})
    return messages

  def step(self, assistant_text: str) -> StepResult:
    if self._task is None or self._transcript.done:
      raise RuntimeError("step() needs an episode in progress: call reset(task) first")
    info = self._transcript.info
    if not isinstance(assistant_text, str):
      assistant_text = ""  # counted as malformed below
    self._transcript.num_turns += 1
    self._transcript.messages.append({"role": "assistant", "content": assistant_text})
    parsed = parse_assistant_turn(assistant_text)
    record: dict[str, Any] = {"turn": self._transcript.num_turns, "assistant": assistant_text,
                              "agent_calls": [], "user_calls": [], "user_reply": None}
    new: list[dict[str, Any]] = []
    termination = None
    if parsed.tool_calls or parsed.errors:
      if parsed.content:
        info["mixed_turns"] += 1
      info["multi_call_turns"] += int(len(parsed.tool_calls) + len(parsed.errors) > 1)
      for error in parsed.errors:
        info["malformed"] += 1
        new.append({"role": "tool", "content": f"Error: {error}"})
      for call in parsed.tool_calls:
        new.append({"role": "tool", "content": self._run_agent_call(call.name, call.arguments, record)})
    elif not parsed.content:
      info["malformed"] += 1
      new.append({"role": "tool", "content": NO_ACTION})
    else:
      content = parsed.content
      if AGENT_STOP in content:
        termination = "agent_stop"
      else:
        reply = self._user.respond(content, transferred=self._transferred)
        self._calls.extend(reply.tool_calls)
        record["user_calls"] = [{"name": c.name, "arguments": c.arguments, "output": c.output}
                                for c in reply.tool_calls]
        record["user_reply"] = reply.content
        info["unmapped_user_turns"] += int(not reply.understood)
        new.append({"role": "user", "content": reply.content})
        termination = reply.stop and ("transfer" if reply.stop == "transfer" else "user_stop")
    return self._end_turn(new, record, termination)

  @property
  def transcript(self) -> Transcript:
    return self._transcript

  def tool_schemas(self) -> list[dict[str, Any]]:
    return [tool.schema() for tool in at.AGENT_TOOLS.values()]

  def reward_evidence(self) -> dict[str, Any]:
    """The task's assertions and gold actions split by side (privileged, never shown
    to the policy). Keys: ``agent_actions`` / ``user_actions`` (gold calls, in order),
    ``env_assertions``, ``reward_basis``, ``evaluation_criteria`` (all three),
    ``completion_note`` (the user's goal), ``user_side_tools`` / ``agent_side_tools``
    (tool names by side), ``known_info`` (what the user may say), ``task_id``,
    ``issue_type``, ``faults``."""
    task = self._task
    if task is None:
      return {}
    fmt = lambda a: {"name": a.name, "arguments": a.arguments}  # noqa: E731
    assertions = [{"env_type": a.env_type, "func_name": a.func_name, "arguments": a.arguments,
                   "assert_value": a.assert_value} for a in task.env_assertions]
    goal = {"mms": "the user can send an MMS (can_send_mms)", "speed": "the speed test is excellent (run_speed_test)",
            "signal": "the status bar shows signal (check_status_bar)"}[goal_of(task).name]
    ends_by_transfer = any(a.name == "transfer_to_human_agents" for a in task.actions)
    return {
        "task_id": task.task_id, "issue_type": task.issue_type, "faults": list(task.faults),
        "reward_basis": list(task.reward_basis), "env_assertions": assertions,
        "agent_actions": [fmt(a) for a in task.agent_actions], "user_actions": [fmt(a) for a in task.user_actions],
        "evaluation_criteria": {"actions": [{"requestor": a.requestor, **fmt(a)} for a in task.actions],
                                "env_assertions": assertions, "reward_basis": list(task.reward_basis)},
        "completion_note": ("the issue cannot be fixed by the agent: transfer to a human agent"
                            if ends_by_transfer else f"every required action is done and {goal}"),
        "user_side_tools": list(dt.DEVICE_TOOLS), "agent_side_tools": list(at.AGENT_TOOLS),
        "known_info": task.known_info, "ticket": task.ticket,
    }

  def run_user_tool(self, name: str, arguments: dict[str, Any]) -> str:
    """Runs device tool ``name`` as the user, outside the scripted user's reading of the
    agent's messages (to replay a recorded episode or to probe the tools with arguments
    the scripted user never sends); recorded like the user's own calls. Returns its output."""
    if self._task is None or self._transcript.done:
      raise RuntimeError("run_user_tool() needs an episode in progress: call reset(task) first")
    if not isinstance(arguments, dict):
      raise TypeError(f"arguments must be a dict, got {type(arguments).__name__}")
    output, ok = dt.run_device_tool(self._state, name, arguments)
    self._calls.append(ToolCallRecord("user", name, dict(arguments), ok, output))
    self._transcript.info["turns"].append({
        "turn": self._transcript.num_turns, "assistant": None, "agent_calls": [],
        "user_calls": [{"name": name, "arguments": dict(arguments), "output": output}], "user_reply": None})
    return output

  # --------------------------------------------------------------------------- helpers

  @property
  def task(self) -> TelecomTask | None:
    """The task of the current (or last) episode."""
    return self._task

  @property
  def state(self) -> st.TelecomState:
    if self._state is None:
      raise RuntimeError("no episode: call reset(task) first")
    return self._state

  @property
  def tool_calls(self) -> list[ToolCallRecord]:
    """Every successful or failed tool call so far, agent's and user's."""
    return list(self._calls)

  def _run_agent_call(self, name: str, arguments: dict[str, Any], record: dict[str, Any]) -> str:
    info = self._transcript.info
    if name in dt.DEVICE_TOOLS:
      info["user_device_calls_by_agent"] += 1
      info["tool_errors"] += 1
      output, ok = (f"Error: {name} is a tool on the user's phone; you cannot run it. "
                    f"Ask the user to run {name} and tell you the result.", False)
    else:
      output, ok = at.run_agent_tool(self._state, name, arguments)
      if not ok:
        info["tool_errors"] += 1
        info["unknown_tools"] += int(name not in at.AGENT_TOOLS)
      st.sync_surroundings(self._state)
    if ok and name == "transfer_to_human_agents":
      self._transferred = True
    self._calls.append(ToolCallRecord("assistant", name, dict(arguments), ok, output))
    record["agent_calls"].append({"name": name, "arguments": arguments, "output": output, "ok": ok})
    return output

  def _counters(self) -> dict[str, Any]:
    return {k: v for k, v in self._transcript.info.items() if k != "turns"}

  def _finish(self, new: list[dict[str, Any]], termination: str) -> StepResult:
    self.result = evaluate(self._task, self._state, self._calls, termination)
    self._transcript.done = True
    self._transcript.reward = self.result.reward
    self._transcript.info["termination"] = termination
    self._transcript.info["evaluation"] = self.result.to_dict()
    return StepResult(messages=new, done=True, reward=self.result.reward, info=self._counters())
