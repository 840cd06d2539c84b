"""The check line (rti_jax/policy/check_line.py): what it names, what the wrapper changes, how a
policy dir records it, and where its tokens are in an encoded turn."""

import collections
import re

import pytest

from rti_jax.envs.navigation import NavigationEnv, load_benchmark
from rti_jax.envs.navigation.agents import PLAN_NOW, OracleAgent, run_episode
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.policy.check_line import (CHECK_PREFIX, TRUST_FIRST, CheckedAgent, check_line, check_line_length,
                                       policy_check_line)
from rti_jax.policy.sft_data import TrustingAgent, play


def _first_results(messages):
  """{searched name: city of its first result line} after the first turn, read with a regex."""
  turn1 = [m for m in messages if m["role"] == "assistant"][0]["content"]
  names = re.findall(r'"address": "([^"]+)"', turn1)
  obs = [m["content"] for m in messages[messages.index(next(m for m in messages if m["role"] == "assistant")) + 1:]
         if m["role"] == "tool"][:len(names)]
  return {n: (re.search(r"^1\. name [^;]+; city ([^;]+);", o, re.M) or [None, None])[1] for n, o in zip(names, obs)}


def test_check_line_names_exactly_the_stops_the_oracle_re_searches():
  b = load_benchmark("tiny")
  env = NavigationEnv(b.world)
  seen = collections.Counter()
  for task in b.train[:200]:
    oracle = play(env, CheckedAgent(OracleAgent(task)), task)
    turns = [m["content"] for m in oracle if m["role"] == "assistant"]
    line, rest = turns[1].split("\n", 1)
    assert line.startswith(CHECK_PREFIX) and not rest.startswith(CHECK_PREFIX)
    assert all(not t.startswith(CHECK_PREFIX) for i, t in enumerate(turns) if i != 1)
    # the stops the oracle re-searches (regioned searches after the first turn), with their first result's city
    researched = [c.arguments["address"] for t in turns[1:] for c in parse_assistant_turn(t).tool_calls
                  if c.name == "poi_search"]
    first = _first_results(oracle)
    if researched:  # in the order of the first searches (the oracle re-searches in route order)
      assert line == CHECK_PREFIX + ", ".join(f"{n} in {c}" for n, c in first.items() if n in researched) + "."
      assert len(set(researched)) == len(researched) and set(researched) <= set(first)
      assert task.needs_disambiguation
    else:
      trip = next(iter(set(first.values()) - {None}), None)
      assert line == f"{CHECK_PREFIX}all in {trip}.", (task.task_id, line, first)
    seen["odd" if researched else "all"] += 1
    # the wrapper adds the line and changes nothing else: same calls, same reward
    for agent in (OracleAgent, TrustingAgent):
      plain_ep, checked_ep = run_episode(env, agent(task), task), run_episode(env, CheckedAgent(agent(task)), task)
      assert plain_ep.reward == checked_ep.reward
      a = [m["content"] for m in plain_ep.messages if m["role"] == "assistant"]
      c = [m["content"] for m in checked_ep.messages if m["role"] == "assistant"]
      assert c[0] == a[0] and c[2:] == a[2:]
      if agent is TrustingAgent and researched:  # plans although the line names an off stop: says so
        assert a[1].startswith(PLAN_NOW) and c[1] == line + "\n" + TRUST_FIRST + a[1][len(PLAN_NOW):]
      else:
        assert c[1] == line + "\n" + a[1]
  assert seen["odd"] > 50 and seen["all"] > 50


def test_check_line_is_none_before_any_search_result_and_all_found_without_a_city():
  assert check_line([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]) is None
  from rti_jax.policy.check_line import check_text

  assert check_text(None, {"A": (None, False)}, []) == CHECK_PREFIX + "all found."


def test_policy_check_line_reads_build_json(tmp_path):
  assert policy_check_line(tmp_path) is False  # no build.json: a policy without the line
  (tmp_path / "build.json").write_text('{"check_line": true, "config": {}}')
  assert policy_check_line(tmp_path) is True
  (tmp_path / "build.json").write_text('{"check_line": false}')
  assert policy_check_line(tmp_path) is False
  (tmp_path / "build.json").write_text("[1, 2]")
  with pytest.raises(ValueError, match="build.json"):
    policy_check_line(tmp_path)


def test_check_line_length_counts_the_line_and_its_newline():
  from rti_jax.policy.tokenizer import build_tokenizer

  turn = "Check: all in Wuhan.\nI have the coordinates of all places. Now I plan the route."
  tok = build_tokenizer([turn] * 4, 512)
  ids = [0, 0] + tok.encode(turn, add_special_tokens=False)
  n = check_line_length(tok, ids, 2, turn)
  assert tok.decode(ids[2:2 + n]) == "Check: all in Wuhan.\n"
  with pytest.raises(ValueError, match="check line"):
    check_line_length(tok, ids, 2, "I have the coordinates of all places.")
