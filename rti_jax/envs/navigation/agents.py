"""Scripted reference agents whose transcripts double as SFT data.

Both agents read the query's meaning from the task (the stop names in route order,
which stops the query hints a city for, and the travel mode: what a perfect reader
of the query knows), but take every coordinate from the tool observations in the
conversation, never from the task. Their turns are plain Qwen-style text::

    I will search for each place first.
    <tool_call>
    {"name": "poi_search", "arguments": {"address": "Dajin Park"}}
    </tool_call>

Both search the stops in the order the request mentions them (``mention_order``).
``OracleAgent`` searches, notices a result that lies in another city than the rest
of the trip and searches it again with that region (Appendix D.4), then calls
direction in the route order. ``NaiveAgent`` trusts the first result of each
unregioned search.

In a setting with hidden-city tasks (``hidden.py``; the system message offers ``ask_user``),
``OracleAgent`` asks the user which city the places are in when no search result tells the trip's
city (every stop is listed in several cities), then searches the stops with the city the user
named: the honest path, which needs no reward-side evidence.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from typing import Any, Protocol

from rti_jax.envs.base import Transcript
from rti_jax.envs.base import run_episode as base_run_episode
from rti_jax.envs.navigation.env import NavigationEnv
from rti_jax.envs.navigation.hidden import ASK_USER, told_cities
from rti_jax.envs.navigation.tasks import NavTask, join_names
from rti_jax.envs.tool_calls import ToolCall, parse_assistant_turn

_POI_LINE = re.compile(r"^\d+\. name (?P<name>[^;]+); city (?P<city>[^;]+);(?: address [^;]+;)? location (?P<loc>[^;]+);")
_ROUTE = re.compile(r"distance (?P<km>[\d.]+) km; time (?P<min>\d+) min")

SEARCH_FIRST = "I will search for each place first."
PLAN_NOW = "I have the coordinates of all places. Now I plan the route."
ASK_FIRST = "Every place was found in several cities and nothing tells which one you mean, so I ask you."


class Agent(Protocol):
  def act(self, messages: list[dict[str, Any]]) -> str:
    """The next assistant turn given the conversation so far."""
    ...


@dataclasses.dataclass(frozen=True)
class Candidate:
  name: str
  city: str
  location: str


def render_turn(text: str, calls: list[ToolCall]) -> str:
  """An assistant turn: a short sentence, then one ``<tool_call>`` block per call."""
  blocks = [f"<tool_call>\n{c.to_json()}\n</tool_call>" for c in calls]
  return "\n".join([text, *blocks]) if text else "\n".join(blocks)


def observed_searches(messages: list[dict[str, Any]]) -> list[tuple[ToolCall, str]]:
  """(call, observation) pairs of the conversation, matching each assistant turn's calls
  to the tool messages that follow it, in order."""
  pairs: list[tuple[ToolCall, str]] = []
  pending: list[ToolCall] = []
  for m in messages:
    if m["role"] == "assistant":
      pending = list(parse_assistant_turn(m["content"]).tool_calls)
    elif m["role"] == "tool" and pending:
      pairs.append((pending.pop(0), m["content"]))
  return pairs


def parse_candidates(observation: str) -> list[Candidate]:
  """The candidate lines of a poi_search / around_search observation."""
  out = []
  for line in observation.splitlines():
    m = _POI_LINE.match(line)
    if m:
      out.append(Candidate(m["name"], m["city"], m["loc"].strip()))
  return out


def _final_answer(messages: list[dict[str, Any]]) -> str:
  summary = ""
  for call, obs in observed_searches(messages):
    m = _ROUTE.search(obs) if call.name == "direction" else None
    if m:
      summary = f" It is {m['km']} km and takes about {m['min']} min."
  return f"Your route is ready.{summary}"


def direction_call(stops: list[str], mode: str | None) -> ToolCall:
  """A ``direction`` call over ``stops`` (origin, waypoints..., destination), arguments in route order."""
  args: dict[str, Any] = {"origin": stops[0]}
  if len(stops) > 2:
    args["waypoints"] = stops[1:-1]
  args["destination"] = stops[-1]
  if mode is not None:
    args["mode"] = mode
  return ToolCall("direction", args)


def _direction_call(task: NavTask, chosen: dict[str, Candidate]) -> ToolCall:
  """The route in the user's order, each stop written ``"Name lon,lat"`` (the tool ignores the label).

  The label puts every coordinate right after the name it belongs to, a key the policy has just
  written; the tiny policy learns to copy a coordinate out of the tool results only with that key
  (docs/tiny_policy.md).
  """
  return direction_call([f"{chosen[s.name].name} {chosen[s.name].location}" for s in task.stops], task.mode)


def mention_order(task: NavTask) -> list[Any]:
  """The task's stops in the order the request mentions them (the order of the first turn's
  searches). A name's mention is its first whole-name match: not followed by a letter or by
  another capitalised word (so ``Jingshan Zoo`` does not match inside ``Jingshan Zoo Park``);
  a stop whose name is not found keeps its route position after the found ones.

  Why this order: with searches in the request's order, the k-th search name is the place
  named right after the (k-1)-th one in the request, a local look-up a tiny policy learns far
  sooner than the route order (docs/tiny_policy.md; the figures are in docs/research_log.md).
  """
  def where(stop: Any) -> int:
    m = re.search(re.escape(stop.name) + r"(?![A-Za-z]| [A-Z])", task.query)
    return m.start() if m else len(task.query)

  return sorted(task.stops, key=where)  # stable: unmatched stops keep their route order


def search_resolution(messages: list[dict[str, Any]]
                      ) -> tuple[str | None, dict[str, tuple[Candidate, bool]], list[str]]:
  """(trip city, best, off): per searched address (in search order) its latest exact-name result
  and whether that came from a regioned search; the trip's city is the most common city among the
  stops whose exact-name results lie in one city only (or that were searched with a region),
  None when no stop gives one; ``off``: the addresses (in search order) whose latest exact result
  is unregioned and lies outside the trip's city. What ``OracleAgent`` re-searches (and what a
  policy's check line names, ``rti_jax.policy.check_line``)."""
  best: dict[str, tuple[Candidate, bool]] = {}
  city_votes: collections.Counter[str] = collections.Counter()
  for call, obs in observed_searches(messages):
    if call.name != "poi_search":
      continue
    name = call.arguments.get("address")
    exact = [c for c in parse_candidates(obs) if isinstance(name, str) and c.name.lower() == name.lower()]
    if not exact:
      continue
    regioned = "region" in call.arguments
    best[name] = (exact[0], regioned)
    if regioned or len({c.city for c in exact}) == 1:
      city_votes[exact[0].city] += 1
  trip = city_votes.most_common(1)[0][0] if city_votes else None
  off = [name for name, (cand, regioned) in best.items() if not regioned and trip is not None and cand.city != trip]
  return trip, best, off


def offers_ask_user(messages: list[dict[str, Any]]) -> bool:
  """The system message offers the ``ask_user`` tool (a setting with hidden-city tasks)."""
  return any(m["role"] == "system" and ASK_USER in str(m["content"]) for m in messages)


def user_answers(messages: list[dict[str, Any]]) -> tuple[dict[str, str], bool]:
  """({place name (lower case): city} the user's replies to ``ask_user`` told, whether it was asked)."""
  told: dict[str, str] = {}
  asked = False
  for call, obs in observed_searches(messages):
    if call.name == ASK_USER:
      asked = True
      told.update(told_cities(obs))
  return told, asked


def _regioned_searches(messages: list[dict[str, Any]]) -> set[tuple[str, str]]:
  return {(str(c.arguments.get("address")), str(c.arguments.get("region"))) for c, _ in observed_searches(messages)
          if c.name == "poi_search" and "region" in c.arguments}


def _direction_done(messages: list[dict[str, Any]]) -> bool:
  return any(call.name == "direction" and obs.startswith("route ok") for call, obs in observed_searches(messages))


class NaiveAgent:
  """Searches every stop without a region and trusts each first result."""

  def __init__(self, task: NavTask):
    self.task = task

  def act(self, messages: list[dict[str, Any]]) -> str:
    task = self.task
    if _direction_done(messages):
      return _final_answer(messages)
    searches = {c.arguments["address"]: parse_candidates(obs) for c, obs in observed_searches(messages)
                if c.name == "poi_search"}
    if not searches:
      return render_turn(SEARCH_FIRST, [ToolCall("poi_search", {"address": s.name}) for s in mention_order(task)])
    chosen = {s.name: searches[s.name][0] for s in task.stops}
    return render_turn(PLAN_NOW, [_direction_call(task, chosen)])


class OracleAgent:
  """Searches every stop (with the city the query gives, if any), infers the trip's city
  from the stops whose name exists in one city only, re-searches every stop whose first
  result lies elsewhere with that region, then plans the route in the required order."""

  def __init__(self, task: NavTask):
    self.task = task

  def act(self, messages: list[dict[str, Any]]) -> str:
    task = self.task
    if _direction_done(messages):
      return _final_answer(messages)
    pairs = [(c, parse_candidates(obs)) for c, obs in observed_searches(messages) if c.name == "poi_search"]
    if not pairs:
      calls = [ToolCall("poi_search", {"address": s.name, "region": s.city} if s.hinted else {"address": s.name})
               for s in mention_order(task)]
      return render_turn(SEARCH_FIRST, calls)
    trip_city, best, off_names = search_resolution(messages)
    told, asked = user_answers(messages)
    if told:  # the user named the city: search again, with it, every stop found elsewhere
      redo = [s for s in task.stops if s.name.lower() in told and s.name in best
              and best[s.name][0].city != told[s.name.lower()]
              and (s.name, told[s.name.lower()]) not in _regioned_searches(messages)]
      if redo:
        text = " ".join(f"You said {s.name} is in {told[s.name.lower()]}. I will search it there." for s in redo)
        return render_turn(text, [ToolCall("poi_search", {"address": s.name, "region": told[s.name.lower()]})
                                  for s in redo])
    elif trip_city is None and not asked and offers_ask_user(messages):
      names = [s.name for s in mention_order(task)]
      question = f"Which city {'is' if len(names) == 1 else 'are'} {join_names(names)} in?"
      return render_turn(ASK_FIRST, [ToolCall(ASK_USER, {"question": question})])
    off = [s for s in task.stops if s.name in off_names]  # in route order
    if off:
      text = " ".join(f"{s.name} was found in {best[s.name][0].city}, far from the other places in {trip_city}. "
                      f"I will search it again in {trip_city}." for s in off)
      return render_turn(text, [ToolCall("poi_search", {"address": s.name, "region": trip_city}) for s in off])
    chosen = {s.name: best[s.name][0] for s in task.stops}
    return render_turn(PLAN_NOW, [_direction_call(task, chosen)])


def run_episode(env: NavigationEnv, agent: Agent, task: NavTask) -> Transcript:
  """Plays one episode of ``agent`` on ``task``; returns the finished transcript."""
  return base_run_episode(env, agent, task)


def pass_rate(env: NavigationEnv, agent_cls: type, tasks: list[NavTask]) -> float:
  """Mean reward of ``agent_cls(task)`` over ``tasks``."""
  if not tasks:
    raise ValueError("tasks must be non-empty, got an empty list")
  return sum(run_episode(env, agent_cls(t), t).reward for t in tasks) / len(tasks)


def sft_example(transcript: Transcript) -> str:
  """The transcript's messages as one JSON line (for SFT data files)."""
  return json.dumps({"task_id": transcript.task_id, "reward": transcript.reward,
                     "messages": transcript.messages}, ensure_ascii=False)
