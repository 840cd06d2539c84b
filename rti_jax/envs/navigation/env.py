"""The Navigation episode: ``reset(task)`` -> messages, ``step(assistant_text)`` -> tool responses.

One instance runs one episode at a time. Each assistant turn may hold several
``<tool_call>`` blocks (parallel calls); they run in order and each gets one
``tool`` message, followed by one error message per malformed block. Coordinates shown by a turn's observations count as retrieved
only from the next turn on, so a ``direction`` call in the same turn as the
searches for its stops fails. The episode ends when the agent answers (a turn
with text and no calls), when ``max_turns`` assistant turns were taken, or, with
``end_on_direction``, right after a successful direction call. Its reward is
``reward.score_direction`` of the last direction call.

In a setting with hidden-city tasks (``hidden_city_share > 0``, docs/navigation.md) the env also
answers ``ask_user(question)`` as the user who knows their own plan (``hidden.user_reply``: the
city of each stop the question names, no coordinates); the system message and the tool list then
offer it. Otherwise ``ask_user`` is an unknown tool, as before.
"""

from __future__ import annotations

import json
from typing import Any

from rti_jax.envs.base import Environment, StepResult, Transcript
from rti_jax.envs.navigation import hidden, tools
from rti_jax.envs.navigation.reward import ORDER_RULES, score_direction
from rti_jax.envs.navigation.tasks import NavTask
from rti_jax.envs.navigation.world import World, normalize_location
from rti_jax.envs.tool_calls import parse_assistant_turn

SYSTEM_RULES = (
    "You are a navigation assistant. Find the coordinates of every place in the user request with the tools, "
    "then call direction once with the full route. Rules: use only coordinates from tool results; call direction "
    "only after every place has coordinates; make sure the places fit together as one trip, and search again "
    "with a region when a result does not fit; keep the order the user asks for. When the route is ready, "
    "answer the user briefly."
)
TOOLS_HEADER = "# Tools\nYou may call one or more functions. Function signatures:\n<tools>"
TOOLS_FOOTER = (
    "</tools>\nFor each call, return a json object with the function name and arguments within "
    "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call>"
)
# Settings with hidden-city tasks (``hidden.py``) add the ``ask_user`` tool and this rule.
ASK_RULE = ("When every place of the request exists in several cities and nothing tells which city is meant, "
            "ask the user with ask_user which city the places are in, then search them with that region.")
CONDENSED_ASK = ("If every place exists in several cities and nothing tells which, ask the user first.\n"
                 "Tools: poi_search(address, region); around_search(location, radius, keyword, region); "
                 "direction(origin, destination, waypoints, mode: driving|walking|bicycling|electrobike|transit); "
                 "ask_user(question).")
NO_ACTION = "error: no tool call and no answer; call a tool or answer the user"
TURN_LIMIT = "error: turn limit reached"


# The tiny setting's system message (``NavConfig.condensed_prompt``): the same rules in fewer words,
# each tool as a one-line signature instead of its JSON schema, and the call format: 174 tokens of
# the tiny policy's tokenizer, against about 400 for the terse JSON-schema layout under a tokenizer
# built for that layout. Every episode is shorter by the difference (each turn's prefill and every
# row of the update pay for it); a 1M-parameter policy learns the tools from the SFT data, not from
# the schemas.
CONDENSED_PROMPT = (
    "You are a navigation assistant. Search every place of the request, search again with a region when a result "
    "lies in another city than the rest of the trip, then call direction once with the route in the user's order, "
    "each stop as \"Name lon,lat\" from the tool results, and answer briefly.\n"
    "Tools: poi_search(address, region); around_search(location, radius, keyword, region); "
    "direction(origin, destination, waypoints, mode: driving|walking|bicycling|electrobike|transit).\n"
    "Call a tool as <tool_call>\n{\"name\": <tool>, \"arguments\": <json>}\n</tool_call>"
)


def system_prompt(terse: bool = False, condensed: bool = False, with_tools: bool = True, ask_user: bool = False) -> str:
  """The system message: rules plus the tool schemas in Qwen's function-calling layout, or with
  ``condensed`` the short ``CONDENSED_PROMPT`` of the tiny setting.

  with_tools=False: the rules only (``SYSTEM_RULES``); the chat template then writes the tools
  block from ``tools=env.tool_schemas()`` (Qwen3's own ``# Tools`` layout), as a served model sees
  them through the chat endpoint's ``tools`` field.

  ask_user: the setting has hidden-city tasks; the rules gain ``ASK_RULE`` and the tools
  ``ask_user`` (the condensed prompt's tools line becomes ``CONDENSED_ASK``). False: the message is
  the same text as without the option.
  """
  rules = f"{SYSTEM_RULES} {ASK_RULE}" if ask_user else SYSTEM_RULES
  if not with_tools:
    if condensed:
      raise ValueError("condensed: CONDENSED_PROMPT lists the tools itself; expected with_tools=True")
    return rules
  if condensed:
    if not ask_user:
      return CONDENSED_PROMPT
    lines = CONDENSED_PROMPT.split("\n")  # rules, the tools line, the call format
    return "\n".join([lines[0], CONDENSED_ASK, *lines[2:]])
  schemas = "\n".join(json.dumps(s, ensure_ascii=False, separators=(",", ":"))
                      for s in tools.tool_schemas(terse, ask_user))
  return f"{rules}\n\n{TOOLS_HEADER}\n{schemas}\n{TOOLS_FOOTER}"


class NavigationEnv(Environment):
  """Offline Navigation (Appendix C.2.1) over a ``World``; implements ``Environment``."""

  def __init__(self, world: World, max_turns: int | None = None, end_on_direction: bool | None = None,
               tools_in_prompt: bool = True):
    """tools_in_prompt: the system message lists the tools (default; the layout the tiny policies were
    trained on). False: it holds the rules only, and the tools reach the model through the chat
    template's ``tools=`` (pass ``env.tool_schemas()`` to the ``ChatFormatter``)."""
    cfg = world.config
    self.world = world
    self.tools_in_prompt = bool(tools_in_prompt)
    self.ask_user = cfg.hidden_city_share > 0  # the user answers ask_user (hidden.user_reply)
    if not self.tools_in_prompt and cfg.condensed_prompt:
      raise ValueError(f"tools_in_prompt=False needs a setting without condensed_prompt, got {cfg.name!r}")
    self.max_turns = cfg.max_turns if max_turns is None else max_turns
    self.end_on_direction = cfg.end_on_direction if end_on_direction is None else end_on_direction
    if self.max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
    self._task: NavTask | None = None
    self._transcript = Transcript(task_id="")
    self._retrieved: set[str] = set()
    self._last_direction: tuple[object, object, object] | None = None
    self._direction_error = False
    self._direction_snapshot: set[str] = set()

  # -- Environment interface
  def tool_schemas(self) -> list[dict[str, Any]]:
    return tools.tool_schemas(self.world.config.terse, self.ask_user)

  @property
  def transcript(self) -> Transcript:
    return self._transcript

  @property
  def task(self) -> NavTask:
    if self._task is None:
      raise RuntimeError("no episode: call reset(task) first")
    return self._task

  def reset(self, task: NavTask) -> list[dict[str, Any]]:
    if not isinstance(task, NavTask):
      raise TypeError(f"task must be a NavTask, got {type(task).__name__}")
    self._task = task
    self._retrieved = set()
    self._last_direction = None
    self._direction_error = False
    self._direction_snapshot = set()
    cfg = self.world.config
    messages = [{"role": "system", "content": system_prompt(cfg.terse, cfg.condensed_prompt, self.tools_in_prompt, self.ask_user)},
                {"role": "user", "content": task.query}]
    self._transcript = Transcript(task_id=task.task_id, messages=list(messages), info={
        "malformed": 0, "tool_calls": 0, "tool_errors": 0, "direction_calls": 0, "reward_reason": ""})
    return messages

  def step(self, assistant_text: str) -> StepResult:
    task = self.task
    tr = self._transcript
    if tr.done:
      raise RuntimeError(f"episode {task.task_id!r} is done; call reset(task) for a new one")
    if not isinstance(assistant_text, str):
      assistant_text = ""  # counted as malformed below
    tr.messages.append({"role": "assistant", "content": assistant_text})
    tr.num_turns += 1
    parsed = parse_assistant_turn(assistant_text)
    out: list[dict[str, Any]] = []
    shown: set[str] = set()
    direction_ok = False
    for call in parsed.tool_calls:
      tr.info["tool_calls"] += 1
      if self.ask_user and call.name == hidden.ASK_USER:
        result = self._ask_user(call)
      else:
        result = tools.execute(self.world, call)
      if call.name == "direction":
        tr.info["direction_calls"] += 1
        # The final direction call decides the reward; a rejected one scores 0.
        self._direction_error = result.error
        if result.route is not None:
          self._last_direction = result.route
          direction_ok = True
          self._direction_snapshot = set(self._retrieved)
      if result.error:
        tr.info["tool_errors"] += 1
      shown.update(p.location for p in result.pois)
      out.append({"role": "tool", "content": result.text})
    # Parse errors after the calls' results, so the first len(tool_calls) tool messages answer the calls.
    for err in parsed.errors:
      tr.info["malformed"] += 1
      out.append({"role": "tool", "content": f"error: malformed tool call: {err}"})
    done = False
    if parsed.is_answer:
      done = True
    elif not parsed.tool_calls and not parsed.errors:
      tr.info["malformed"] += 1
      out.append({"role": "tool", "content": NO_ACTION})
    self._retrieved |= {normalize_location(s, self.world.config.decimals) for s in shown}
    if self.end_on_direction and direction_ok:
      done = True
    if tr.num_turns >= self.max_turns and not done:
      done = True
      out.append({"role": "tool", "content": TURN_LIMIT})
    tr.messages.extend(out)
    reward = 0.0
    if done:
      reward = self._final_reward()
      tr.done, tr.reward = True, reward
    return StepResult(messages=out, done=done, reward=reward, info=dict(tr.info))

  def _ask_user(self, call: Any) -> tools.ToolOutput:
    """The user's reply (``hidden.user_reply``); reveals no coordinates."""
    extra = sorted(set(call.arguments) - {"question"})
    if extra:
      return tools.ToolOutput(text=f"error: unexpected argument {json.dumps(extra[0][:60])} of ask_user", error=True)
    text, error = hidden.user_reply(self.task, call.arguments)
    return tools.ToolOutput(text=text, error=error)

  def replay(self, task: NavTask, assistant_turns: list[str]) -> list[StepResult]:
    """Resets to ``task`` and re-runs ``assistant_turns`` (tools are deterministic), stopping
    early if the episode ends; e.g. to rebuild the state at a rollout's prefix for intervention."""
    self.reset(task)
    results: list[StepResult] = []
    for text in assistant_turns:
      results.append(self.step(text))
      if results[-1].done:
        break
    return results

  def _final_reward(self) -> float:
    task, tr = self.task, self._transcript
    if self._direction_error:
      reward, reason = 0.0, "direction_error"
    else:
      reward, reason = score_direction(self._last_direction, task.truth, task.order_level,
                                       self.world.config.decimals, self._direction_snapshot)
    tr.info["reward_reason"] = reason
    return reward

  def reward_evidence(self) -> dict[str, Any]:
    """The ground truth for a Validator/Corrector (privileged; never shown to the policy).

    Keys: ``order`` (0-4), ``order_rule`` (its meaning), ``ref`` (stops in route order:
    name, city, location), ``groundtruth`` (the reference direction call's arguments).
    """
    task = self.task
    truth = task.truth
    return {
        "order": task.order_level,
        "order_rule": ORDER_RULES[task.order_level],
        "ref": [{"name": s.name, "city": s.city, "location": s.location} for s in task.stops],
        "groundtruth": {"name": "direction", "arguments": {
            "origin": truth.origin, "destination": truth.destination, "waypoints": list(truth.waypoints),
            "mode": task.mode}},
    }
