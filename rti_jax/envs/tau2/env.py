"""A tau2 Retail, Airline or Telecom conversation as an ``rti_jax.envs.base.Environment``, run by tau2's
own code.

Episode (at most ``max_turns`` assistant turns):

* ``reset(task)`` -> [system (policy text + tool list), user (the customer's request)], over a fresh
  tau2 environment (its tools over a private copy of the domain's database);
* ``step(text)``: the turn is parsed with ``tool_calls.parse_assistant_turn``. Each tool call goes to
  tau2's ``Environment.get_response`` and its reply comes back as a ``tool`` message (tau2's JSON,
  re-rendered compactly unless ``observation="raw"``); an unknown tool, wrong or missing arguments,
  or any other failure is tau2's ``Error: ...`` reply, counted in ``info``, never an exception. A
  turn without calls is a message to the user, whose reply comes back as a ``user`` message.
* the episode ends when the user ends the call (tau2's ``###STOP###`` / ``###TRANSFER###``), when
  the agent writes ``###STOP###``, when a ``transfer_to_human_agents`` call succeeds, or at the turn
  limit (reward 0, as tau2 scores a run that hit its step limit).

tau2's own message log (``AssistantMessage`` / ``ToolMessage`` / ``UserMessage``, every tool reply
exactly as tau2 returned it) is kept in ``tau2_messages``; at the end the reward is tau2's: its
``evaluate_simulation`` (``reward="tau2"``) or ``bridge.fast_reward`` (``reward="fast"``, the same
number read off the live database; the tests check they agree). ``reward_evidence()`` gives the
task's gold calls, what must be told to the user and the evaluation criteria (privileged).

Two inputs never reach tau2, because its tools would not return on them: a ``calculate`` expression
with ``**`` or over ``MAX_EXPRESSION_CHARS`` characters (Python would evaluate a power tower for
hours), and arguments that are not a JSON object. They get an error observation, counted as
``guarded_calls``, and do not enter the message log (neither changes the database).

Telecom (tau2's ``tau2.domains.telecom``): the customer also acts, with tools on its simulated phone
(toggle_data, reboot_device, set_network_mode_preference, ...). Its tool calls, which come with its
reply (the reply's ``tool_calls``) or from ``run_user_tool``, run through tau2's user-tool path and
enter the log as tau2's orchestrator logs them: a user message with the calls, then tau2's replies,
then the customer's text; turn records gain ``user_calls``. There is no offline customer of Telecom
here (the fast port ``rti_jax.envs.telecom`` has one, over its own state), so ``reset`` takes the
customer as ``user=``: ``replay.replay`` plays an episode of the port this way, step by step. A
successful ``transfer_to_human_agents`` call does not end a Telecom episode; the customer ends it
(``###TRANSFER###``) on the agent's next message, as in the port.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from rti_jax.envs.base import ConversationEnv, StepResult, Transcript
from rti_jax.envs.navigation.env import TOOLS_FOOTER, TOOLS_HEADER
from rti_jax.envs.tau2 import bridge
from rti_jax.envs.tau2.bridge import STOP
from rti_jax.envs.tau2.condensed import condensed_policy
from rti_jax.envs.tau2.tasks import Tau2Task, find_task
from rti_jax.envs.tau2.user import LLMUser, ScriptedUser, wish_of
from rti_jax.envs.tool_calls import parse_assistant_turn

MAX_TURNS = 30
MAX_EXPRESSION_CHARS = 200
NO_ACTION = "Error: empty turn; call a tool or write a message to the user."
POLICY_TEXTS = ("full", "condensed")
USERS = ("scripted", "llm")
REWARDS = ("fast", "tau2")
OBSERVATIONS = ("compact", "raw")


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
  """An OpenAI function schema cut down for a small context: the description's first sentence and
  each parameter's type (with its item type), without the parameter descriptions."""
  fn = schema.get("function", schema)
  desc = " ".join(str(fn.get("description", "")).split())
  first = re.split(r"(?<=\.)\s", desc, maxsplit=1)[0]
  params = fn.get("parameters", {}) or {}
  props = {}
  for name, spec in (params.get("properties", {}) or {}).items():
    props[name] = _compact_type(spec, params.get("$defs", {}))
  out_params = {"type": "object", "properties": props, "required": list(params.get("required", []))}
  return {"type": "function", "function": {"name": fn.get("name"), "description": first, "parameters": out_params}}


def _compact_type(spec: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> dict[str, Any]:
  if depth > 4:
    return {}
  if "$ref" in spec:
    target = defs.get(spec["$ref"].rsplit("/", 1)[-1], {})
    return _compact_type(target, defs, depth + 1)
  if "anyOf" in spec:
    options = [_compact_type(s, defs, depth + 1) for s in spec["anyOf"]]
    objects = [o for o in options if o.get("type") == "object"]
    return objects[0] if objects else options[0] if options else {}
  if "enum" in spec:
    return {"type": spec.get("type", "string"), "enum": list(spec["enum"])}
  out: dict[str, Any] = {"type": spec.get("type", "string")}
  if out["type"] == "array" and isinstance(spec.get("items"), dict):
    out["items"] = _compact_type(spec["items"], defs, depth + 1)
  if out["type"] == "object" and isinstance(spec.get("properties"), dict):
    out["properties"] = {k: _compact_type(v, defs, depth + 1) for k, v in spec["properties"].items()}
  return out


def tool_schemas(domain: str, compact: bool) -> list[dict[str, Any]]:
  """The agent tools of ``domain`` as OpenAI schemas: tau2's own, or ``compact_schema`` of each."""
  schemas = [dict(s) for s in bridge.tool_info(domain)[0]]
  return [compact_schema(s) for s in schemas] if compact else schemas


def policy_of(domain: str, policy_text: str) -> str:
  """The policy text for ``policy_text`` (``full``: tau2's own; ``condensed``: ``condensed.py``, or
  for Telecom the port's ``rti_jax.envs.telecom.condensed.CONDENSED_POLICY``)."""
  if policy_text == "full":
    return bridge.policy_text(domain)
  if policy_text == "condensed":
    if domain == bridge.TELECOM:
      from rti_jax.envs.telecom.condensed import CONDENSED_POLICY

      return CONDENSED_POLICY
    return condensed_policy(domain)
  raise ValueError(f"policy_text: expected one of {list(POLICY_TEXTS)}, got {policy_text!r}")


def _type_words(spec: dict[str, Any]) -> str:
  if "enum" in spec:
    return "|".join(str(v) for v in spec["enum"])
  kind = spec.get("type", "string")
  if kind == "array":
    return f"[{_type_words(spec.get('items', {}))}]"
  if kind == "object" and spec.get("properties"):
    return "{" + ", ".join(f"{k}: {_type_words(v)}" for k, v in spec["properties"].items()) + "}"
  return {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}.get(kind, str(kind))


def signature_line(schema: dict[str, Any]) -> str:
  """One tool as a signature line: ``name(arg: type, ...): description`` (``compact_schema`` types)."""
  fn = compact_schema(schema)["function"]
  args = ", ".join(f"{k}: {_type_words(v)}" for k, v in fn["parameters"]["properties"].items())
  return f"{fn['name']}({args}): {fn['description']}"


def system_prompt(policy: str, schemas: list[dict[str, Any]], with_tools: bool = True, compact: bool = False) -> str:
  """The system message: ``policy`` plus, with ``with_tools``, the tools in Qwen's layout, one a
  line: each schema's JSON, or with ``compact`` its ``signature_line``."""
  text = policy.strip()
  if not with_tools:
    return text
  if compact:
    lines = "\n".join(signature_line(s) for s in schemas)
  else:
    lines = "\n".join(json.dumps(s, ensure_ascii=False, separators=(",", ":")) for s in schemas)
  return f"{text}\n\n{TOOLS_HEADER}\n{lines}\n{TOOLS_FOOTER}"


def render_observation(content: str, compact: bool) -> str:
  """A tool reply for the policy: tau2's text, or with ``compact`` its JSON without spaces and
  without null fields (a string or an error stays as it is)."""
  if not compact or not content or content[0] not in "[{":
    return content
  try:
    value = json.loads(content)
  except (json.JSONDecodeError, ValueError, RecursionError):
    return content
  return json.dumps(_drop_nulls(value), ensure_ascii=False, separators=(",", ":"))


def _drop_nulls(value: Any) -> Any:
  if isinstance(value, dict):
    return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
  if isinstance(value, list):
    return [_drop_nulls(v) for v in value]
  return value


def completion_note(task: Tau2Task) -> str:
  """What a successful episode of ``task`` does, in one line (for the judges)."""
  writes = task.write_actions
  names = [name for name, _ in task.required_actions]
  parts = []
  if writes:
    calls = "; ".join(f"{n}({json.dumps(a, ensure_ascii=False, sort_keys=True)})" for n, a in writes)
    parts.append(f"the database ends as these write calls leave it, each confirmed by the user first: {calls}")
  elif "transfer_to_human_agents" not in names:
    parts.append("no write call: the request is declined or only answered, and the database stays unchanged")
  if "transfer_to_human_agents" in names:
    parts.append("the agent transfers the user to a human agent (transfer_to_human_agents)")
  if task.communicate_info:
    parts.append(f"the agent tells the user: {', '.join(task.communicate_info)}")
  return "; ".join(parts)


class Tau2Env(ConversationEnv):
  """One tau2 Retail / Airline / Telecom episode at a time; create one instance per concurrent episode.

  domain: ``retail``, ``airline`` or ``telecom`` (whose customer is given to ``reset``: see the
    module docstring).
  policy_text: ``full`` (tau2's policy, tau2's tool schemas) or ``condensed`` (``condensed.py``;
    ``compact_schema`` schemas, listed in the system message as ``signature_line`` lines).
  policy: replaces the policy text (the tool list is still added).
  user: ``scripted`` (``user.ScriptedUser``, offline) or ``llm`` (tau2's user-simulator prompt
    answered by model ``user_model`` at the OpenAI-compatible ``user_url``, each request within
    ``user_timeout_s`` seconds and retried at most ``user_max_retries`` times).
  reward: ``fast`` (``bridge.fast_reward``) or ``tau2`` (tau2's ``evaluate_simulation``).
  observation: ``compact`` or ``raw`` tool replies (the log keeps tau2's own either way).
  tools_in_prompt: the system message lists the tools (default); False: the policy text only, and
    the tools reach the model through the chat template's ``tools=`` (``tool_schemas()``).
  audit_share: with ``reward="fast"``, the share of finished episodes also scored by tau2's
    ``evaluate_simulation`` (drawn by a hash of the episode's messages, so the same episode is always
    drawn or not); the final ``info`` then has ``reward_audits`` 1 and ``reward_audit_mismatches`` 0 or
    1 (the trainer sums both into its records).
  """

  def __init__(self, domain: str, policy_text: str = "condensed", max_turns: int = MAX_TURNS,
               policy: str | None = None, user: str = "scripted", user_url: str | None = None,
               user_model: str = "default", reward: str = "fast", observation: str = "compact",
               tools_in_prompt: bool = True, user_timeout_s: float = 120.0, user_max_retries: int = 2,
               audit_share: float = 0.0) -> None:
    self.domain = bridge.check_domain(domain, bridge.ENV_DOMAINS)
    if not isinstance(max_turns, int) or max_turns < 1:
      raise ValueError(f"max_turns: expected an integer >= 1, got {max_turns!r}")
    if user not in USERS:
      raise ValueError(f"user: expected one of {list(USERS)}, got {user!r}")
    if user == "llm" and not user_url:
      raise ValueError("user_url: the llm user needs the URL of an OpenAI-compatible server, got None")
    if user == "llm" and self.domain == bridge.TELECOM:
      raise ValueError("user: the telecom customer runs tools on its phone, which the llm user does not; "
                       "pass a customer to reset(task, user=...)")
    if reward not in REWARDS:
      raise ValueError(f"reward: expected one of {list(REWARDS)}, got {reward!r}")
    if observation not in OBSERVATIONS:
      raise ValueError(f"observation: expected one of {list(OBSERVATIONS)}, got {observation!r}")
    if isinstance(audit_share, bool) or not (isinstance(audit_share, (int, float)) and 0.0 <= audit_share <= 1.0):
      raise ValueError(f"audit_share: expected a share in [0, 1], got {audit_share!r}")
    self.audit_share = float(audit_share)
    if policy is not None and not (isinstance(policy, str) and policy.strip()):
      raise ValueError(f"policy: expected a non-empty string or None, got {policy!r}")
    text = policy if policy is not None else policy_of(self.domain, policy_text)
    self.max_turns = max_turns
    self.user_kind, self.user_url, self.user_model = user, user_url, user_model
    self._user_client = None
    if user == "llm":
      from rti_jax.generation.openai_chat import OpenAIChatClient

      self._user_client = OpenAIChatClient(user_url, user_model, label="user simulator",
                                           timeout_s=user_timeout_s, max_retries=user_max_retries)
    self.reward_kind = reward
    self.compact = observation == "compact"
    self._schemas = tool_schemas(self.domain, compact=policy_text == "condensed")
    self._tool_names = frozenset(s["function"]["name"] for s in self._schemas)
    self._user_tool_names = bridge.user_tool_names(self.domain)
    # Retail / Airline end at a successful transfer call; in Telecom the customer ends the call on
    # the agent's next message, as in the port (``rti_jax.envs.telecom``)
    self._transfer_ends = self.domain != bridge.TELECOM
    self._system_prompt = system_prompt(text, self._schemas, with_tools=tools_in_prompt,
                                        compact=policy_text == "condensed")
    self._task: Tau2Task | None = None
    self._env: Any = None
    # True while self._env's databases are as new_environment made them (no initial state, no write
    # or user call reached tau2): the next episode may start on them instead of a fresh copy
    self._untouched = False
    self._user: Any = None
    self._log: list[Any] = []
    self._writes: list[tuple[str, dict[str, Any]]] = []
    self._n_calls = 0
    self._ids: Any = None
    self._transcript = Transcript(task_id="")
    self.result: bridge.Tau2Reward | None = None

  # --------------------------------------------------------------------------- API

  def reset(self, task: Tau2Task | str, user: Any = None) -> list[dict[str, Any]]:
    """Starts an episode on ``task`` (a ``Tau2Task`` of this domain, or one of tau2's task ids).

    user: plays the customer instead of the environment's own (needed in Telecom): an object with
      ``opening()`` (the first message; None: the log starts at the agent's first turn) and
      ``respond(message, done_writes)``, whose reply has ``content``, ``stop`` (None, ``"stop"`` or
      ``"transfer"``), ``understood`` and, optionally, ``tool_calls``: (name, arguments) pairs the
      customer runs on its side before answering (``replay.RecordedUser``)."""
    task = find_task(self.domain, task) if isinstance(task, str) else task
    if not isinstance(task, Tau2Task):
      raise TypeError(f"task: expected a Tau2Task or a task id, got {type(task).__name__}")
    if task.domain != self.domain:
      raise ValueError(f"task: {task.task_id!r} is a {task.domain} task, this environment is {self.domain}")
    if user is None and self.domain == bridge.TELECOM:
      raise ValueError("user: the telecom customer runs tools on its phone; pass one to reset(task, user=...) "
                       "(e.g. replay.RecordedUser)")
    msg = bridge.tau2_modules()["message"]
    self._task = task
    # Parsing a fresh copy of the database is most of an episode's cost; one that nothing wrote to
    # is still the initial database (tau2's read, think and generic tools do not change it), and a
    # Retail or Airline one that was written to is put back record by record
    if self.domain == bridge.TELECOM or self._env is None:
      self._env = bridge.new_environment(self.domain)
    elif not self._untouched:
      self._env = bridge.restore_environment(self.domain, self._env)
    self._untouched = True
    self._ids = bridge.episode_ids(self.domain)
    init = task.task.initial_state
    if init is not None:
      self._untouched = False
      with bridge.tool_ids(self._ids):
        self._env.set_state(initialization_data=init.initialization_data,
                            initialization_actions=init.initialization_actions,
                            message_history=list(init.message_history or []))
    if user is not None:
      self._user = user
    elif self.user_kind == "llm":
      self._user = LLMUser(task.scenario, self._user_client)
    else:
      self._user = ScriptedUser(task.scenario, [wish_of(n, a) for n, a in task.write_actions], task.communicate_info)
    self._writes = []
    self._n_calls = 0
    self.result = None
    opening = self._user.opening()
    self._log = [] if opening is None else [msg.UserMessage(role="user", content=opening)]
    messages = [{"role": "system", "content": self._system_prompt}]
    if opening is not None:
      messages.append({"role": "user", "content": opening})
    self._transcript = Transcript(task_id=task.task_id, messages=list(messages), info={
        "turns": [], "malformed": 0, "tool_calls": 0, "tool_errors": 0, "unknown_tools": 0, "bad_arguments": 0,
        "guarded_calls": 0, "write_calls": 0, "mixed_turns": 0, "multi_call_turns": 0, "unmapped_user_turns": 0,
        "empty_user_replies": int(opening is not None and not opening.strip()), "termination": None})
    return messages

  def step(self, assistant_text: str) -> StepResult:
    if self._task is None or self._transcript.done:
      raise RuntimeError("step() needs an episode in progress: call reset(task) first")
    msg = bridge.tau2_modules()["message"]
    info = self._transcript.info
    if not isinstance(assistant_text, str):
      assistant_text = ""  # counted as malformed below
    self._transcript.num_turns += 1
    self._transcript.messages.append({"role": "assistant", "content": assistant_text})
    parsed = parse_assistant_turn(assistant_text)
    record: dict[str, Any] = {"turn": self._transcript.num_turns, "assistant": assistant_text, "calls": [],
                              "user_reply": None}
    if self._user_tool_names:
      record["user_calls"] = []
    new: list[dict[str, Any]] = []
    termination = None
    if parsed.tool_calls or parsed.errors:
      info["mixed_turns"] += int(bool(parsed.content))
      info["multi_call_turns"] += int(len(parsed.tool_calls) + len(parsed.errors) > 1)
      for error in parsed.errors:
        info["malformed"] += 1
        new.append({"role": "tool", "content": f"Error: {error}"})
      calls, replies = [], []
      for call in parsed.tool_calls:
        output, tau2_call, reply = self._run_call(call.name, call.arguments, record)
        new.append({"role": "tool", "content": output})
        if tau2_call is not None:
          calls.append(tau2_call)
          replies.append(reply)
          if call.name == "transfer_to_human_agents" and not reply.error and self._transfer_ends:
            termination = "transfer"
      if calls:
        self._log.append(msg.AssistantMessage(role="assistant", content=parsed.content or None, tool_calls=calls))
        self._log.extend(replies)
    elif not parsed.content:
      info["malformed"] += 1
      new.append({"role": "tool", "content": NO_ACTION})
    else:
      self._log.append(msg.AssistantMessage(role="assistant", content=parsed.content))
      if STOP in parsed.content:
        termination = "agent_stop"
      else:
        reply = self._user.respond(parsed.content, list(self._writes))
        user_calls = list(getattr(reply, "tool_calls", None) or ())
        if user_calls:
          record["user_calls"] = self._run_user_calls(user_calls)
        record["user_reply"] = reply.content
        info["unmapped_user_turns"] += int(not reply.understood)
        info["empty_user_replies"] += int(not (reply.content or "").strip())
        self._log.append(msg.UserMessage(role="user", content=reply.content or " "))
        new.append({"role": "user", "content": reply.content})
        if reply.stop:
          termination = "transfer" if reply.stop == "transfer" else "user_stop"
    return self._end_turn(new, record, termination)

  @property
  def transcript(self) -> Transcript:
    return self._transcript

  def tool_schemas(self) -> list[dict[str, Any]]:
    return [dict(s) for s in self._schemas]

  def run_user_tool(self, name: str, arguments: dict[str, Any]) -> str:
    """Runs the customer's tool ``name`` (Telecom's phone tools) through tau2's user-tool path, outside
    a reply to the agent (to replay a recorded episode, or to probe the tools): logged as a user
    message with the call plus tau2's reply, and kept as a turn record without an assistant text.
    Returns tau2's reply."""
    if self._task is None or self._transcript.done:
      raise RuntimeError("run_user_tool() needs an episode in progress: call reset(task) first")
    if not self._user_tool_names:
      raise ValueError(f"run_user_tool: the {self.domain} customer has no tools")
    calls = self._run_user_calls([(name, arguments)])
    self._transcript.info["turns"].append({"turn": self._transcript.num_turns, "assistant": None, "calls": [],
                                           "user_calls": calls, "user_reply": None})
    return calls[0]["output"]

  def reward_evidence(self) -> dict[str, Any]:
    """The task's reward-side evidence (privileged, never shown to the policy). Keys:
    ``completion_note`` (one line), ``agent_actions`` (the gold calls minus those that fail on
    purpose, ``{name, arguments}``), ``write_actions`` (the ones that change the database),
    ``communicate_info`` (what the agent must tell the user), ``evaluation_criteria`` (tau2's: every
    gold call, each marked ``fails_on_purpose``, ``communicate_info``, ``reward_basis``),
    ``request_types``, ``agent_side_tools`` / ``user_side_tools``, ``write_tools`` (the tools that
    change the database), ``known_info`` (what the
    user knows), ``task_id``, ``domain``."""
    task = self._task
    if task is None:
      return {}
    failing = set(task.failing)
    fmt = lambda name, args: {"name": name, "arguments": args}
    criteria = task.task.evaluation_criteria
    basis = [getattr(b, "value", str(b)) for b in (criteria.reward_basis if criteria else [])]
    return {
        "task_id": task.task_id, "domain": task.domain, "request_types": list(task.request_types),
        "completion_note": completion_note(task),
        "agent_actions": [fmt(n, a) for n, a in task.required_actions],
        "write_actions": [fmt(n, a) for n, a in task.write_actions],
        "communicate_info": list(task.communicate_info),
        "evaluation_criteria": {
            "actions": [{**fmt(n, a), "fails_on_purpose": i in failing} for i, (n, a) in enumerate(task.gold_actions)],
            "communicate_info": list(task.communicate_info), "reward_basis": basis},
        "agent_side_tools": sorted(self._tool_names), "user_side_tools": sorted(self._user_tool_names),
        "write_tools": sorted(bridge.tool_info(self.domain)[1]),
        "known_info": str(getattr(task.scenario.instructions, "known_info", "") or ""),
    }

  # --------------------------------------------------------------------------- helpers

  @property
  def task(self) -> Tau2Task | None:
    """The task of the current (or last) episode."""
    return self._task

  @property
  def tau2_environment(self) -> Any:
    """The live tau2 ``Environment`` of the episode."""
    if self._env is None:
      raise RuntimeError("no episode: call reset(task) first")
    self._untouched = False  # the caller may change it
    return self._env

  @property
  def tau2_messages(self) -> list[Any]:
    """tau2's message log of the episode (what tau2's evaluator scores)."""
    return list(self._log)

  @property
  def done_writes(self) -> list[tuple[str, dict[str, Any]]]:
    """Every successful write call so far (name, arguments)."""
    return list(self._writes)

  def _run_call(self, name: str, arguments: Any, record: dict[str, Any]) -> tuple[str, Any, Any]:
    """Runs one call through tau2; (the observation, tau2's ToolCall, tau2's ToolMessage), the last
    two None for a guarded call that never reached tau2."""
    info = self._transcript.info
    info["tool_calls"] += 1
    guard = _guard(name, arguments, self._tool_names)
    if guard:
      info["guarded_calls"] += 1
      info["tool_errors"] += 1
      record["calls"].append({"name": name, "arguments": arguments, "output": guard, "error": True})
      return guard, None, None
    msg = bridge.tau2_modules()["message"]
    self._n_calls += 1
    call = msg.ToolCall(id=f"call_{self._n_calls}", name=name, arguments=dict(arguments), requestor="assistant")
    if name in bridge.tool_info(self.domain)[1]:
      self._untouched = False
    with bridge.quiet_serializer(), bridge.tool_ids(self._ids):
      reply = self._env.get_response(call)
    content = reply.content or ""
    if reply.error:
      info["tool_errors"] += 1
      if name not in self._tool_names:
        info["unknown_tools"] += 1
      elif _bad_arguments(self.domain, name, arguments):
        info["bad_arguments"] += 1
    elif name in bridge.tool_info(self.domain)[1]:
      info["write_calls"] += 1
      self._writes.append((name, dict(arguments)))
    output = render_observation(content, self.compact)
    record["calls"].append({"name": name, "arguments": arguments, "output": output, "error": bool(reply.error)})
    return output, call, reply

  def _run_user_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Runs the customer's ``calls`` (name, arguments) in order through tau2's user-tool path
    (``requestor="user"``), numbered with the agent's calls; logs one user message with every call,
    then tau2's replies. Returns per call {name, arguments, output (tau2's text), error}."""
    msg = bridge.tau2_modules()["message"]
    tool_calls, replies = [], []
    self._untouched = False
    for name, arguments in calls:
      if not isinstance(arguments, dict):
        raise TypeError(f"arguments of the user's {name!r} call: expected a dict, got {type(arguments).__name__}")
      self._n_calls += 1
      call = msg.ToolCall(id=f"call_{self._n_calls}", name=str(name), arguments=dict(arguments), requestor="user")
      with bridge.quiet_serializer(), bridge.tool_ids(self._ids):
        replies.append(self._env.get_response(call))
      tool_calls.append(call)
    self._log.append(msg.UserMessage(role="user", content=None, tool_calls=tool_calls))
    self._log.extend(replies)
    return [{"name": c.name, "arguments": c.arguments, "output": r.content or "", "error": bool(r.error)}
            for c, r in zip(tool_calls, replies)]

  def _counters(self) -> dict[str, Any]:
    return {k: v for k, v in self._transcript.info.items() if k not in ("turns", "evaluation")}

  def score(self, method: str | None = None) -> bridge.Tau2Reward:
    """The reward of the finished episode by ``method`` (``fast`` or ``tau2``; default the env's)."""
    termination = self._transcript.info.get("termination")
    if termination is None:
      raise RuntimeError("score() needs a finished episode")
    method = method or self.reward_kind
    if method == "tau2":
      return bridge.tau2_reward(self.domain, self._task.task, self._log, termination)
    if method == "fast":
      if getattr(self._task.task.evaluation_criteria, "env_assertions", None):
        self._untouched = False  # assertions run tau2 functions on the live environment
      return bridge.fast_reward(self.domain, self._task.task, self._env, self._log, termination,
                                untouched=self._untouched)
    raise ValueError(f"method: expected one of {list(REWARDS)}, got {method!r}")

  def _finish(self, new: list[dict[str, Any]], termination: str) -> StepResult:
    self._transcript.info["termination"] = termination
    self.result = self.score()
    self._transcript.done = True
    self._transcript.reward = self.result.reward
    self._transcript.info["evaluation"] = self.result.to_dict()
    if self.reward_kind == "fast" and self._drawn_for_audit():
      audited = self.score("tau2").reward
      self._transcript.info["reward_audits"] = 1
      self._transcript.info["reward_audit_mismatches"] = int(audited != self.result.reward)
    return StepResult(messages=new, done=True, reward=self.result.reward, info=self._counters())


  def _drawn_for_audit(self) -> bool:
    if self.audit_share <= 0.0:
      return False
    text = json.dumps([[m.get("role"), m.get("content")] for m in self._transcript.messages], default=str)
    return zlib.crc32(text.encode()) / 2**32 < self.audit_share


def _guard(name: str, arguments: Any, tools: frozenset[str]) -> str:
  """The error for a call tau2 must not run (see the module docstring), else "". ``tools``: the
  domain's agent tools (a ``calculate`` call where there is none is tau2's unknown-tool error)."""
  if not isinstance(arguments, dict):
    return f"Error: the arguments of {name!r} must be a JSON object"
  if name == "calculate" and name in tools:
    expr = arguments.get("expression")
    if isinstance(expr, str) and ("**" in expr or len(expr) > MAX_EXPRESSION_CHARS):
      return (f"Error: expression must use only + - * / and parentheses, at most {MAX_EXPRESSION_CHARS} "
              "characters, without **")
  return ""


def _bad_arguments(domain: str, name: str, arguments: dict[str, Any]) -> bool:
  """Whether ``arguments`` do not fit tool ``name``'s parameters (missing, unknown or mistyped)."""
  model = bridge.parameter_models(domain).get(name)
  if model is None:
    return False
  unknown = set(arguments) - set(model.model_fields)
  try:
    model.model_validate(arguments, strict=True)
  except Exception:  # pydantic's ValidationError
    return True
  return bool(unknown)
