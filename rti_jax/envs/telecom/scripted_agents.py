"""Scripted agents that drive ``TelecomEnv`` through its text interface.

* ``gold_agent_turns``: replays a task's gold actions as an agent would, in
  Qwen ``<tool_call>`` format: asks for the phone number, looks the customer up,
  then for each expected action either calls the agent tool (offering a refuel
  first, checking bills before a payment request, sending the transfer message
  after a transfer) or asks the user to run the device tool by name with its
  arguments (``style="named"``) or in plain words (``"described"``); finally asks
  the user to check the goal, then stops.
* ``do_nothing_turns``: stops at once (``stop=True``) or only chats.

Agents follow the Navigation agents' protocol (``act(messages) -> str``);
``run_episode(env, agent, task)`` plays one episode and returns its transcript. The
gold replay's coverage (tasks it solves with the scripted user) is what ``stats``
reports.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from rti_jax.envs.base import Transcript
from rti_jax.envs.base import run_episode as base_run_episode
from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.env import AGENT_STOP, TRANSFER_MESSAGE, TelecomEnv
from rti_jax.envs.telecom.tasks import Action, TelecomTask
from rti_jax.envs.telecom.user_sim import goal_of, profile_of


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
  """One Qwen-style tool-call turn."""
  return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


#: plain-words requests for the gold device actions (no tool names), for ``style="described"``
_DESCRIBED = {
    "toggle_airplane_mode": "Please turn off airplane mode.",
    "toggle_data": "Please turn on your mobile data.",
    "toggle_roaming": "Please turn on data roaming on your phone.",
    "toggle_data_saver_mode": "Please turn off Data Saver mode.",
    "toggle_wifi_calling": "Please turn off Wi-Fi Calling.",
    "reset_apn_settings": "Please reset your APN settings to the default.",
    "reboot_device": "Please restart your phone.",
    "reseat_sim_card": "Please take out your SIM card and put it back in.",
    "disconnect_vpn": "Please disconnect your VPN.",
}
_DESCRIBED_GOAL = {"mms": "Please try sending a picture message now.", "speed": "Please run a speed test now.",
                   "signal": "Please look at your status bar now and tell me what it shows."}
STYLES = ("named", "described")


def _device_request(action: Action, style: str) -> str:
  if style == "described":
    if action.name == "set_network_mode_preference":
      return "Please change your preferred network mode to 4G/5G preferred."
    if action.name == "grant_app_permission":
      return f"Please grant the {action.arguments['app_name']} app the {action.arguments['permission']} permission."
    if action.name in _DESCRIBED:
      return _DESCRIBED[action.name]
  args = ", ".join(f'{k}="{v}"' for k, v in action.arguments.items())
  return f"Please run {action.name}({args}) on your phone and tell me the result."


def _refuel_offer(action: Action) -> str:
  db = st.load_db()
  line = st.find_record(db, "lines", "line_id", action.arguments["line_id"])
  plan = st.find_record(db, "plans", "plan_id", line["plan_id"]) if line else None
  gb = float(action.arguments["gb_amount"])
  price = float(plan["data_refueling_price_per_gb"]) * gb if plan else 0.0
  return (f"Your line has used up its data allowance. I can add {gb:g} GB of data for ${price:.2f}. "
          f"Would you like me to proceed?")


def gold_agent_turns(task: TelecomTask, style: str = "named") -> list[str]:
  """The assistant turns of a gold replay of ``task``; device actions are asked for by
  tool name (``style="named"``) or in plain words without tool names (``"described"``)."""
  if style not in STYLES:
    raise ValueError(f"style must be one of {STYLES}, got {style!r}")
  phone = profile_of(task).phone_number or ""
  turns = ["I can help with that. Could you please give me your phone number?",
           tool_call_text("get_customer_by_phone", {"phone_number": phone})]
  for action in task.actions:
    if action.requestor == "user":
      if action.name == "make_payment":
        turns.append("I sent a payment request for your overdue bill. Please check your payment request and pay it.")
      else:
        turns.append(_device_request(action, style))
      continue
    if action.name == "refuel_data":
      turns.append(_refuel_offer(action))
    if action.name == "send_payment_request":
      turns.append(tool_call_text("get_bills_for_customer", {"customer_id": action.arguments["customer_id"]}))
    turns.append(tool_call_text(action.name, action.arguments))
    if action.name == "transfer_to_human_agents":
      turns.append(TRANSFER_MESSAGE)
  goal = goal_of(task)
  turns.append(_DESCRIBED_GOAL[goal.name] if style == "described" else
               f"Please run {goal.tools[0]}() on your phone to check whether the issue is fixed.")
  turns.append(f"Thank you for contacting us. {AGENT_STOP}")
  return turns


def do_nothing_turns(stop: bool = True, max_turns: int = 30) -> list[str]:
  """An agent that ends at once (``stop``) or only chats until the turn limit."""
  if stop:
    return [f"I'm sorry, I cannot help with that. {AGENT_STOP}"]
  return ["I see. Could you tell me a bit more?"] * max_turns


class Agent(Protocol):
  def act(self, messages: list[dict[str, Any]]) -> str:
    """The next assistant turn given the conversation so far."""
    ...


class ScriptAgent:
  """Plays fixed turns: the k-th assistant turn of the conversation is ``turns[k]``;
  after the last one it stops (``###STOP###``)."""

  def __init__(self, turns: list[str]):
    self.turns = list(turns)

  def act(self, messages: list[dict[str, Any]]) -> str:
    k = sum(m.get("role") == "assistant" for m in messages)
    return self.turns[k] if k < len(self.turns) else AGENT_STOP


class GoldAgent(ScriptAgent):
  """The gold replay of ``task`` (``gold_agent_turns``)."""

  def __init__(self, task: TelecomTask, style: str = "named"):
    super().__init__(gold_agent_turns(task, style))


class DescribedGoldAgent(GoldAgent):
  """The gold replay asking for device actions in plain words, never by tool name."""

  def __init__(self, task: TelecomTask):
    super().__init__(task, style="described")


class DoNothingAgent(ScriptAgent):
  """Stops at once (``stop``) or only chats until the turn limit."""

  def __init__(self, task: TelecomTask | None = None, stop: bool = True):
    del task
    super().__init__(do_nothing_turns(stop=stop))


def run_episode(env: TelecomEnv, agent: Agent, task: TelecomTask | str) -> Transcript:
  """Plays one episode of ``agent`` on ``task``; returns the finished transcript."""
  return base_run_episode(env, agent, task)


def pass_rate(env: TelecomEnv, agent_cls: type, tasks: list[TelecomTask]) -> float:
  """Mean reward of ``agent_cls(task)`` over ``tasks``."""
  if not tasks:
    raise ValueError("tasks must be non-empty, got an empty list")
  return sum(run_episode(env, agent_cls(t), t).reward for t in tasks) / len(tasks)
