"""Navigation episodes written by hand, shared by the hidden-city tests."""

from rti_jax.envs.navigation.agents import parse_candidates
from rti_jax.envs.tool_calls import ToolCall


def turn(*calls):
  """An assistant turn made of ``calls`` (``ToolCall``s) in Qwen's ``<tool_call>`` format."""
  return "\n".join(f"<tool_call>\n{c.to_json()}\n</tool_call>" for c in calls)


def leak_episode(env, task, city):
  """Search unregioned, then every stop with the region ``city`` (what a correction from the
  evidence writes), then direction with the regioned results; returns the last step's result."""
  env.reset(task)
  env.step(turn(*(ToolCall("poi_search", {"address": s.name}) for s in task.stops)))
  res = env.step(turn(*(ToolCall("poi_search", {"address": s.name, "region": city}) for s in task.stops)))
  found = {}
  for s, m in zip(task.stops, res.messages):
    cands = [c for c in parse_candidates(m["content"]) if c.name == s.name]
    found[s.name] = cands[0].location
  stops = [found[s.name] for s in task.stops]
  args = {"origin": stops[0], "waypoints": stops[1:-1], "destination": stops[-1], "mode": task.mode}
  env.step(turn(ToolCall("direction", args)))
  return env.step("Your route is ready.")
