"""How often the rule-based tau2-Telecom Validator fires on scripted agents.

``python -m rti_jax.intervention.telecom_diagnostics`` prints, per agent, the mean reward,
the steps judged, the share flagged, the episodes with a flagged step and the flags per rule:
the gold agent on all 114 tasks (device actions asked for by tool name, and in plain words)
and three failing agents on the 74 train tasks (one that stops at once, one that chats to the
turn limit, and ``naive_device_turns``, which runs the device tools itself). The Validator
flags none of the gold agent's steps, every do-nothing episode (PREMATURE_TERMINATION), the
chatting agent from its second message on (POINTLESS_REPEAT) and every device call of the
naive agent (USER_SIDE_DEVICE_ACTION); written as the agent's message, its hints for those
device calls pass the Verifier and repair every naive episode (diagnostic-first: a fix that no
output has shown a need for is preceded by the check that shows it). The Verifier, on the gold
steps, rejects only the refuel offers that quote a price no lookup has shown (the gold script does
not look the plan up) and the device fixes asked before any output showed their fault
(``fix_without_diagnostic``: the gold script asks for the task's fixes straight from the evidence).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from rti_jax.intervention.judges import StepContext
from rti_jax.intervention.telecom_validator import TelecomRuleValidator


def naive_device_turns(task: Any) -> list[str]:
  """The gold replay (``scripted_agents.gold_agent_turns``, named style) with every device
  request turned into the agent's own tool call: the App. D.1 failure, at every device step."""
  from rti_jax.envs.telecom.scripted_agents import gold_agent_turns, tool_call_text

  out = []
  for turn in gold_agent_turns(task):
    m = re.fullmatch(r"Please run (\w+)\((.*?)\) on your phone and tell me the result\.", turn)
    out.append(tool_call_text(m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))) if m else turn)
  return out


def firing_rates(make_agent: Any, tasks: Sequence[Any], validator: TelecomRuleValidator | None = None) -> dict[str, Any]:
  """Runs ``make_agent(task)`` on every task in a ``TelecomEnv`` and judges each of its steps.

  Returns ``{"tasks", "steps", "flagged", "episodes_flagged", "mean_reward", "by_rule"}``
  (``by_rule``: flagged steps per error type).
  """
  from rti_jax.envs.telecom.env import TelecomEnv

  validator = validator or TelecomRuleValidator()
  env = TelecomEnv()
  steps = flagged = episodes = 0
  reward = 0.0
  by_rule: dict[str, int] = {}
  for task in tasks:
    env.reset(task)
    agent = make_agent(task)
    hit = False
    while True:
      msgs = env.transcript.messages
      draft = agent.act(msgs)
      ctx = StepContext(msgs[1]["content"], tuple(m for m in msgs if m["role"] != "system"), draft,
                        tuple(env.tool_schemas()), env.reward_evidence(), "telecom")
      j = validator.judge(ctx)
      steps += 1
      if not j.is_valid:
        flagged += 1
        hit = True
        for e in j.error_types:
          by_rule[e] = by_rule.get(e, 0) + 1
      result = env.step(draft)
      if result.done:
        reward += result.reward
        break
    episodes += hit
  return {"tasks": len(tasks), "steps": steps, "flagged": flagged, "episodes_flagged": episodes,
          "mean_reward": reward / max(len(tasks), 1), "by_rule": dict(sorted(by_rule.items()))}


def main() -> None:
  """Prints how often the Validator fires on the gold agent (all 114 tasks, both request styles)
  and on failing agents (the 74 train tasks)."""
  from rti_jax.envs.telecom import DescribedGoldAgent, DoNothingAgent, GoldAgent, ScriptAgent, load_split

  base, train = load_split("base"), load_split("train")
  rows = [("gold, by tool name (base)", GoldAgent, base), ("gold, in plain words (base)", DescribedGoldAgent, base),
          ("do-nothing, stops at once (train)", lambda t: DoNothingAgent(t), train),
          ("do-nothing, chats to the limit (train)", lambda t: DoNothingAgent(t, stop=False), train),
          ("naive, runs device tools itself (train)", lambda t: ScriptAgent(naive_device_turns(t)), train)]
  print(f"{'agent':42s} {'reward':>6s} {'steps':>6s} {'flagged':>8s} {'episodes':>9s}  by rule")
  for name, make, tasks in rows:
    r = firing_rates(make, tasks)
    print(f"{name:42s} {r['mean_reward']:6.3f} {r['steps']:6d} {r['flagged'] / r['steps']:8.3f} "
          f"{r['episodes_flagged']:4d}/{r['tasks']:<4d}  {r['by_rule']}")


if __name__ == "__main__":
  main()
