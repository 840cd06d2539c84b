"""Episodes: reset/step, parallel and malformed calls, turn limit, retrieval rule, final-call reward."""

import functools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rti_jax.envs.base import Environment
from rti_jax.envs.navigation import NavigationEnv, load_benchmark
from rti_jax.envs.navigation.agents import NaiveAgent, OracleAgent, run_episode
from rti_jax.envs.navigation.env import NO_ACTION, TURN_LIMIT
from rti_jax.envs.tool_calls import parse_assistant_turn


@functools.lru_cache(maxsize=None)
def bench(name="tiny"):
  return load_benchmark(name, num_train=60, num_test=40)


def call(name, **arguments):
  return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def search_all(task, region=True):
  return "\n".join(call("poi_search", address=s.name, **({"region": s.city} if region else {})) for s in task.stops)


def direction(locs, mode="driving"):
  args = {"origin": locs[0], "destination": locs[-1], "mode": mode}
  if len(locs) > 2:
    args["waypoints"] = list(locs[1:-1])
  return call("direction", **args)


def task_where(pred, name="tiny"):
  return next(t for t in bench(name).train + bench(name).test if pred(t))


def new_env(name="tiny", **kw):
  return NavigationEnv(bench(name).world, **kw)


def test_reset_gives_system_prompt_with_schemas_and_the_query():
  env = new_env("paper")
  assert isinstance(env, Environment) and env.max_turns == 6
  task = bench("paper").test[0]
  msgs = env.reset(task)
  assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"] == task.query
  sys = msgs[0]["content"]
  for schema in env.tool_schemas():
    assert json.dumps(schema, separators=(",", ":")) in sys
  assert "<tool_call>" in sys and "</tool_call>" in sys
  assert env.transcript.messages == msgs and env.transcript.task_id == task.task_id


def test_parallel_calls_then_direction_then_answer_scores_one():
  env, task = new_env(), task_where(lambda t: len(t.stops) == 4)
  env.reset(task)
  r1 = env.step("I will search.\n" + search_all(task))
  assert not r1.done and len(r1.messages) == 4 and all(m["role"] == "tool" for m in r1.messages)
  for m, s in zip(r1.messages, task.stops):
    assert f"name {s.name}; city {s.city}; location {s.location}" in m["content"]
  r2 = env.step(direction([s.location for s in task.stops], task.mode))
  assert not r2.done and r2.messages[0]["content"].startswith("route ok")
  r3 = env.step("Your route is ready.")
  assert r3.done and r3.reward == 1.0 and r3.messages == []
  tr = env.transcript
  assert tr.done and tr.reward == 1.0 and tr.num_turns == 3 and tr.info["reward_reason"] == "match"
  assert len(tr.messages) == 2 + 3 + 4 + 1
  assert tr.info["tool_calls"] == 5 and tr.info["direction_calls"] == 1


@pytest.mark.parametrize("text,counter,fragment", [
    ("<tool_call>{\"name\": \"poi_search\", \"arguments\": {\"address\": </tool_call>", "malformed", "not valid JSON"),
    (call("geocode", address="Dajin Park"), "tool_errors", "unknown tool"),
    (call("poi_search"), "tool_errors", "missing argument address"),
    ("I am thinking about it.<tool_call></tool_call>", "malformed", "empty <tool_call>"),
    ("", "malformed", NO_ACTION),
    ("<think>hmm</think>", "malformed", NO_ACTION),
])
def test_malformed_output_gives_error_observation_and_episode_goes_on(text, counter, fragment):
  env, task = new_env(), bench().test[0]
  env.reset(task)
  r = env.step(text)
  assert not r.done and r.reward == 0.0
  assert r.info[counter] == 1 and any(fragment in m["content"] for m in r.messages)
  assert all(m["content"].startswith("error: ") for m in r.messages)
  # The episode continues and can still succeed.
  env.step(search_all(task))
  env.step(direction([s.location for s in task.stops]))
  assert env.step("Done.").reward == 1.0


def test_non_string_output_is_malformed_not_a_crash():
  env = new_env()
  env.reset(bench().test[0])
  assert env.step(None).info["malformed"] == 1  # type: ignore[arg-type]


def test_turn_limit_ends_the_episode_with_its_last_direction_call():
  env, task = new_env(), bench().test[1]
  env.reset(task)
  env.step(search_all(task))
  env.step(direction([s.location for s in task.stops]))
  for i in range(3):
    assert not env.step(call("poi_search", address=task.stops[0].name)).done
  last = env.step(call("poi_search", address=task.stops[0].name))
  assert last.done and env.transcript.num_turns == 6 and last.messages[-1]["content"] == TURN_LIMIT
  assert last.reward == 1.0  # the direction call of turn 2 is the final one
  with pytest.raises(RuntimeError, match="done"):
    env.step("more")


def test_six_malformed_turns_end_with_zero():
  env = new_env()
  env.reset(bench().test[2])
  results = [env.step("") for _ in range(6)]
  assert [r.done for r in results] == [False] * 5 + [True]
  assert results[-1].reward == 0.0 and env.transcript.info["reward_reason"] == "no_direction_call"


def test_direction_in_the_same_turn_as_the_searches_fails():
  env, task = new_env(), bench().test[3]
  env.reset(task)
  env.step(search_all(task) + "\n" + direction([s.location for s in task.stops]))
  r = env.step("Here is the route.")
  assert r.done and r.reward == 0.0 and env.transcript.info["reward_reason"] == "not_retrieved"


def test_fabricated_coordinates_fail_even_when_correct():
  env, task = new_env(), task_where(lambda t: len(t.stops) >= 3)
  env.reset(task)
  env.step(call("poi_search", address=task.stops[0].name, region=task.city))  # only one stop retrieved
  env.step(direction([s.location for s in task.stops]))
  assert env.step("Done.").reward == 0.0 and env.transcript.info["reward_reason"] == "not_retrieved"


def test_the_final_direction_call_decides():
  task = task_where(lambda t: len(t.stops) >= 3 and t.order_level == 4)
  locs = [s.location for s in task.stops]
  wrong = [locs[0], locs[2], locs[1], *locs[3:]]
  for first, second, expected in [(locs, wrong, 0.0), (wrong, locs, 1.0)]:
    env = new_env()
    env.reset(task)
    env.step(search_all(task))
    env.step(direction(first))
    env.step(direction(second))
    assert env.step("Done.").reward == expected
  env = new_env()
  env.reset(task)
  env.step(search_all(task))
  env.step(direction(locs))
  env.step(direction(locs, mode="flying"))  # a rejected final call scores 0
  assert env.step("Done.").reward == 0.0 and env.transcript.info["reward_reason"] == "direction_error"


@pytest.mark.parametrize("level,ok_perm,bad_perm", [
    (0, lambda l: l[::-1], lambda l: l[:-1] + l[:1]),
    (1, lambda l: l[:1] + l[1:][::-1], lambda l: l[1:2] + l[:1] + l[2:]),
    (2, lambda l: l[:-1][::-1] + l[-1:], lambda l: l[:-2] + l[-1:] + l[-2:-1]),
    (3, lambda l: l[:1] + l[1:-1][::-1] + l[-1:], lambda l: l[-1:] + l[1:-1] + l[:1]),
    (4, lambda l: list(l), lambda l: l[:1] + l[2:3] + l[1:2] + l[3:]),
])
def test_order_levels_through_the_env(level, ok_perm, bad_perm):
  task = task_where(lambda t: t.order_level == level and len(t.stops) >= 4, "paper")
  locs = [s.location for s in task.stops]
  for perm, expected in [(ok_perm(locs), 1.0), (bad_perm(locs), 0.0)]:
    env = new_env("paper")
    env.reset(task)
    env.step(search_all(task))
    env.step(direction(perm))
    assert env.step("Done.").reward == expected, (level, perm)


def test_d4_case_trusting_the_far_result_fails_and_requerying_succeeds():
  """Appendix D.4: the unregioned search puts one stop in another city."""
  task = task_where(lambda t: t.needs_disambiguation and not any(s.hinted for s in t.stops), "paper")
  env = new_env("paper")
  naive = run_episode(env, NaiveAgent(task), task)
  assert naive.reward == 0.0 and naive.info["reward_reason"] == "mismatch"
  oracle = run_episode(env, OracleAgent(task), task)
  assert oracle.reward == 1.0
  turns = [m["content"] for m in oracle.messages if m["role"] == "assistant"]
  requery = parse_assistant_turn(turns[1]).tool_calls
  assert {c.arguments["address"] for c in requery} == set(task.ambiguous)
  assert all(c.arguments["region"] == task.city for c in requery)
  assert "far from the other places" in turns[1]


def test_end_on_direction_stops_right_after_the_call():
  env, task = new_env(end_on_direction=True), bench().test[4]
  env.reset(task)
  env.step(search_all(task))
  r = env.step(direction([s.location for s in task.stops]))
  assert r.done and r.reward == 1.0


def test_reward_evidence_is_the_ground_truth_route():
  env, task = new_env("paper"), bench("paper").test[5]
  env.reset(task)
  ev = env.reward_evidence()
  assert ev["order"] == task.order_level and isinstance(ev["order_rule"], str)
  assert [r["name"] for r in ev["ref"]] == [s.name for s in task.stops]
  gt = ev["groundtruth"]["arguments"]
  assert [gt["origin"], *gt["waypoints"], gt["destination"]] == [s.location for s in task.stops]
  assert ev["groundtruth"]["name"] == "direction"


def test_step_before_reset_raises():
  with pytest.raises(RuntimeError, match="reset"):
    new_env().step("hi")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_raises(text):
  env = new_env()
  env.reset(bench().test[0])
  r = env.step(text)
  assert isinstance(r.messages, list) and (r.done or r.messages)


def test_replay_rebuilds_the_same_episode_and_call_results_come_before_parse_errors():
  task = bench().test[6]
  env = new_env()
  tr = run_episode(env, OracleAgent(task), task)
  turns = [m["content"] for m in tr.messages if m["role"] == "assistant"]
  other = new_env()
  results = other.replay(task, turns[:1])
  assert len(results) == 1 and other.transcript.messages == tr.messages[:2 + 1 + len(task.stops)]
  other.replay(task, turns + ["ignored after the end"])
  assert other.transcript.messages == tr.messages and other.transcript.reward == 1.0
  env.reset(task)
  r = env.step("<tool_call>{bad</tool_call>\n" + call("poi_search", address=task.stops[0].name))
  assert r.messages[0]["content"].startswith("found") and "malformed" in r.messages[1]["content"]
