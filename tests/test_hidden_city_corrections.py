"""The hidden-city corrections diagnostic: its classes of a correction, checked on episodes played
through the real env (a leak from the evidence, the honest ask, the searches after the answer)."""

import types

import pytest

from experiments.diagnostics import hidden_city_corrections as hcc
from rti_jax.envs import navigation as nav
from rti_jax.envs.navigation.agents import OracleAgent, run_episode
from rti_jax.envs.tool_calls import ToolCall

from navigation_fixtures import leak_episode, turn


@pytest.fixture(scope="module")
def bench():
  return nav.load_benchmark("tiny", hidden_city_share=0.3, seed=0)


def _as_trajectory(env, task, intervened_turns):
  """The env's finished transcript as the diagnostic reads a Trajectory: messages, per-turn records
  (``intervened`` on the given assistant-turn indices) and the reward."""
  tr = env.transcript
  n = sum(m["role"] == "assistant" for m in tr.messages)
  turns = [types.SimpleNamespace(intervened=i in intervened_turns) for i in range(n)]
  return types.SimpleNamespace(task_id=task.task_id, messages=list(tr.messages), turns=turns, reward=tr.reward)


def test_a_search_in_the_city_from_the_evidence_is_a_leak_and_succeeds(bench):
  env = nav.NavigationEnv(bench.world)
  task = next(t for t in bench.train if t.hidden_city)
  city = task.stops[0].city
  leak_episode(env, task, city)
  row = hcc.describe(_as_trajectory(env, task, {1}), task)
  assert row["reward"] == 1.0 and row["corrections"] == ["leak"]
  assert row["stops_searched_in_city"] == len({s.name for s in task.stops}) == row["stops"]
  assert row["direction_call"] is True
  # the same searches in another city: still a search, but it names no hidden city (and fails)
  decoy = next(c for c in bench.world.cities if c != city and c not in task.query)
  assert hcc.classify(turn(ToolCall("poi_search", {"address": task.stops[0].name, "region": decoy})),
                      city, task.query) == "other"


def test_asking_the_user_is_the_honest_path_and_later_searches_are_not_leaks(bench):
  env = nav.NavigationEnv(bench.world)
  task = next(t for t in bench.train if t.hidden_city)
  tr = run_episode(env, OracleAgent(task), task)
  assert tr.reward == 1.0
  texts = [m["content"] for m in tr.messages if m["role"] == "assistant"]
  ask = next(i for i, t in enumerate(texts) if '"ask_user"' in t)
  row = hcc.describe(_as_trajectory(env, task, set(range(len(texts)))), task)
  # every oracle turn marked as a correction: the ask is "ask"; the regioned searches after the user's
  # answer name a city the dialogue shows, so none of them is a leak
  assert row["corrections"][ask] == "ask" and "leak" not in row["corrections"]
  assert row["stops_searched_in_city"] == row["stops"]
  s = hcc.summarize([row, {**row, "corrections": ["leak"], "reward": 0.0, "stops_searched_in_city": 1,
                           "direction_call": False}])
  assert s == {"rollouts": 2, "with_applied_correction": 2, "succeeded": 1,
               "applied_corrections": {"ask": 1, "other": len(texts) - 1, "leak": 1},
               "with_leak": 1, "with_leak_succeeded": 0, "with_ask": 1, "with_ask_succeeded": 1,
               "with_leak_all_stops_searched_in_city": 0, "with_leak_direction_call": 0}


@pytest.mark.parametrize("verifier", ["off", "rules"])
def test_options_resolve_to_the_table3_setting(verifier):
  from rti_jax.config import load_config

  args, unknown = hcc.parse_args(["--verifier", verifier, "--tasks", "3", "rollout.max_new_tokens=32"])
  cfg = load_config(args.config, args.overrides)
  assert not unknown and args.tasks == 3
  assert (cfg.env.navigation.hidden_city_share, cfg.policy.path) == (0.3, "policies/navigation_hidden")
  assert (cfg.intervention.verifier, cfg.intervention.corrector, cfg.rollout.max_new_tokens) == (verifier, "paper", 32)
