"""Every token a Navigation episode can show, for a word-level tokenizer.

Texts split into tokens with ``WORD_PATTERN``: a ``<tool_call>`` / ``</tool_call>``
marker, a run of ASCII letters (case kept), a single digit, or a single other
non-space character. ``vocabulary()`` lists every token that system prompts,
queries, tool observations (including error observations), the scripted agents'
turns and well-formed tool calls can contain; a model's own words echoed back in
an error observation are tokens the model produced, so they are covered too.
"""

from __future__ import annotations

import functools
import json
import re
import string

from rti_jax.envs.navigation import agents, env, tasks, tools, words
from rti_jax.envs.navigation.config import TINY
from rti_jax.envs.navigation.world import build_world
from rti_jax.envs.tool_calls import ToolCall, parse_assistant_turn

WORD_PATTERN = r"</?tool_call>|[A-Za-z]+|[0-9]|[^\sA-Za-z0-9]"
SPECIAL_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>")
_WORD_RE = re.compile(WORD_PATTERN)

# Messages of Python's JSON decoder, which tool-call parse errors quote.
_JSON_ERRORS = (
    "Expecting value", "Expecting ',' delimiter", "Expecting ':' delimiter",
    "Expecting property name enclosed in double quotes", "Unterminated string starting at",
    "Invalid control character at", "Invalid \\escape", "Invalid \\uXXXX escape", "Extra data",
    "Illegal trailing comma before end of object", "Illegal trailing comma before end of array",
    "list int float str bool NoneType dict",
)


def tokenize_words(text: str) -> list[str]:
  """``text`` split by ``WORD_PATTERN`` (whitespace dropped)."""
  return _WORD_RE.findall(text)


def _probe_texts() -> list[str]:
  """Observations of every tool path and parse error, with in-vocabulary arguments."""
  world = build_world(TINY)
  p = world.pois[0]
  probes = [
      ToolCall("poi_search", {"address": p.name}), ToolCall("poi_search", {"address": p.name, "region": p.city}),
      ToolCall("poi_search", {"address": "Park", "region": "Park"}), ToolCall("poi_search", {"address": 1}),
      ToolCall("poi_search", {"address": p.name, "region": 1}), ToolCall("poi_search", {}),
      ToolCall("poi_search", {"address": p.name, "city": p.city}), ToolCall("route", {}),
      ToolCall("around_search", {"location": p.location, "radius": 3000, "keyword": "scenic spot"}),
      ToolCall("around_search", {"location": p.name}), ToolCall("around_search", {"location": p.location, "radius": -1}),
      ToolCall("around_search", {"location": p.location, "keyword": 1}),
      ToolCall("direction", {"origin": p.location, "destination": p.location, "waypoints": [p.location]}),
      ToolCall("direction", {"origin": p.location, "destination": p.location, "mode": "flying"}),
      ToolCall("direction", {"origin": p.name, "destination": p.location}),
      ToolCall("direction", {"origin": p.location, "destination": p.location, "waypoints": 1}),
      ToolCall("direction", {"origin": p.location, "destination": p.location, "waypoints": [p.location] * 17}),
      ToolCall("direction", {"origin": p.location, "destination": p.location, "waypoints": ["1"]}),
  ]
  texts = [tools.execute(world, c).text for c in probes]
  texts += [tools.format_poi(1, p, 12.0, terse=False), tools.format_poi(1, p, 12.0, terse=True)]
  bad_turns = ["<tool_call></tool_call>", "<tool_call>[1]</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
               "<tool_call>{\"name\": \"direction\", \"arguments\": \"x\"}</tool_call>",
               "<tool_call>{\"name\": \"direction\", \"arguments\": [1]}</tool_call>", "<tool_call>{bad</tool_call>"]
  for t in bad_turns:
    texts.extend(f"error: malformed tool call: {e}" for e in parse_assistant_turn(t).errors)
  texts += [env.NO_ACTION, env.TURN_LIMIT, *_JSON_ERRORS]
  return texts


def _template_texts() -> list[str]:
  sample = [tasks.Stop(name=f"{s} Park", city=c[0], location="", poi_id="", hinted=i % 2 == 0)
            for i, (s, c) in enumerate(zip(words.STEMS, words.CITIES * 2))]
  out = []
  for name, _, min_stops, _ in tasks.TEMPLATES:
    for n in range(max(2, min_stops), 6):
      for mode in words.MODES:
        out.append(tasks.render_query(name, sample[:n], mode, " ".join(tasks.PREFIXES), " ".join(tasks.SUFFIXES)))
  return out


def _agent_texts() -> list[str]:
  return [agents.SEARCH_FIRST, agents.PLAN_NOW,
          "Your route is ready. It is 1.5 km and takes about 3 min.",
          "Park was found in Beijing, far from the other places in Beijing. I will search it again in Beijing."]


@functools.lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
  """Sorted tokens (under ``WORD_PATTERN``) covering every text of the benchmark, both configs."""
  world_words = [c[0] for c in words.CITIES] + list(words.STEMS) + list(words.SCENIC_CATEGORIES)
  world_words += list(words.OTHER_CATEGORIES) + list(words.OTHER_CATEGORIES.values())
  world_words += [words.SCENIC_TYPE, *words.STREET_KINDS, *words.MODES, *words.MODE_VERBS.values()]
  texts = [env.system_prompt(), env.system_prompt(condensed=True), json.dumps(tools.tool_schemas()), *world_words, *_probe_texts(),
           *_template_texts(), *_agent_texts(), "direction poi_search around_search name arguments"]
  tokens = set(SPECIAL_TOKENS) | set(string.digits) | set(string.punctuation)
  for t in texts:
    tokens.update(tokenize_words(t))
  return tuple(sorted(tokens))
