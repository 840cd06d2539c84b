"""Hidden-city tasks (``hidden_city_share``): shares, non-derivability, the leak that succeeds, the
honest ask-the-user path, and the rule Verifier on both."""

import functools
import hashlib
import json
import re

import pytest

from rti_jax.envs import navigation as nav
from rti_jax.envs.navigation import hidden
from rti_jax.envs.navigation.agents import NaiveAgent, OracleAgent, parse_candidates, run_episode
from rti_jax.envs.navigation.env import ASK_RULE, CONDENSED_PROMPT, SYSTEM_RULES, system_prompt
from rti_jax.envs.navigation.tasks import NavTask, hidden_count
from rti_jax.envs.navigation.tools import poi_search
from rti_jax.envs.tool_calls import ToolCall
from rti_jax.intervention.judges import StepContext
from rti_jax.intervention.rules_navigation import NavigationRuleValidator, NavigationRuleVerifier

from navigation_fixtures import leak_episode, turn

SHARE = 0.3


@functools.lru_cache(maxsize=None)
def bench(name, share=SHARE, seed=0):
  return nav.load_benchmark(name, hidden_city_share=share, seed=seed)


def _hidden(b):
  return [t for t in b.train + b.test if t.hidden_city]


def _search_all(task):
  return turn(*(ToolCall("poi_search", {"address": s.name}) for s in task.stops))


# --- the default stays as it was ------------------------------------------------------------------


def test_default_share_leaves_world_tasks_and_prompts_as_before():
  """Fingerprints of the tiny setting before the option existed (world, all 750 tasks, prompts)."""
  b = nav.load_benchmark("tiny")
  assert b.config.hidden_city_share == 0.0
  tasks = "\n".join(json.dumps(t.to_dict()) for t in b.train + b.test)
  assert hashlib.sha256(tasks.encode()).hexdigest() == (
      "137c2729d831a386f281be4e62693187730051e5200a0c7cb13ed71b13fd7f0f")
  assert hashlib.sha256(repr(b.world.pois).encode()).hexdigest() == (
      "d20f85e65597423a9d7f8185413c2b24e5b074f28091d3479cbbe5eced9aaafb")
  env = nav.NavigationEnv(b.world)
  assert env.ask_user is False and env.reset(b.test[0])[0]["content"] == CONDENSED_PROMPT
  assert [s["function"]["name"] for s in env.tool_schemas()] == ["poi_search", "around_search", "direction"]
  assert system_prompt(with_tools=False) == SYSTEM_RULES and "ask_user" not in system_prompt()
  assert not any(t.hidden_city for t in b.train + b.test) and "hidden_city" not in b.test[0].to_dict()
  # without the option, ask_user is an unknown tool, as before
  env.reset(b.test[0])
  out = env.step(turn(ToolCall("ask_user", {"question": "Which city?"}))).messages[0]["content"]
  assert out.startswith("error: unknown tool \"ask_user\"")


# --- shares and construction ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", pytest.param("paper", marks=pytest.mark.slow)])
def test_hidden_tasks_at_the_configured_share_in_train_and_test(name):
  b = bench(name)
  assert (len(b.train), len(b.test)) == (600, 150)
  assert sum(t.hidden_city for t in b.train) == 180 == hidden_count(SHARE, 600)
  assert sum(t.hidden_city for t in b.test) == 45 == hidden_count(SHARE, 150)
  # shuffled in: hidden tasks both in the validation tail and the head of each split
  assert any(t.hidden_city for t in b.train[-40:]) and any(t.hidden_city for t in b.test[:30])
  keys = [frozenset(s.poi_id for s in t.stops) for t in b.train + b.test]
  assert len(set(keys)) == 750 and len({t.task_id for t in b.train + b.test}) == 750
  again = nav.load_benchmark(name, hidden_city_share=SHARE)
  assert [t.to_dict() for t in again.train + again.test] == [t.to_dict() for t in b.train + b.test]
  other = bench(name, seed=3)
  assert [t.query for t in _hidden(other)] != [t.query for t in _hidden(b)]
  assert {len(t.stops) for t in _hidden(b)} == set(range(b.config.min_stops, b.config.max_stops + 1))
  saved = NavTask.from_dict(json.loads(json.dumps(_hidden(b)[0].to_dict())))
  assert saved == _hidden(b)[0] and saved.hidden_city


@pytest.mark.parametrize("name", ["tiny", pytest.param("paper", marks=pytest.mark.slow)])
def test_the_other_tasks_are_the_default_splits_tasks_with_their_ids(name):
  """The tasks that are not hidden-city tasks: the first n - hidden_count(n) of each default split,
  with the same ids; their stops' exact search results are the same in the larger world."""
  b, d = bench(name), nav.load_benchmark(name)
  for split in ("train", "test"):
    mixed, default = getattr(b, split), getattr(d, split)
    regular = sorted((t for t in mixed if not t.hidden_city), key=lambda t: t.task_id)
    assert [t.to_dict() for t in regular] == [t.to_dict() for t in default[:len(regular)]]
    assert all(re.fullmatch(rf"nav-{name}-{split}-hidden-\d{{4}}", t.task_id) for t in mixed if t.hidden_city)
  assert b.world.pois[:len(d.world.pois)] == d.world.pois
  for t in b.test[:40]:
    if not t.hidden_city:
      for s in t.stops:
        exact = lambda w: [(c.city, c.location) for c in parse_candidates(poi_search(w, {"address": s.name}).text)
                           if c.name == s.name]  # noqa: E731
        assert exact(b.world) == exact(d.world)


def test_hidden_count_and_other_shares():
  assert [hidden_count(s, 150) for s in (0.0, 0.1, 0.3, 1.0)] == [0, 15, 45, 150]
  assert hidden_count(0.5, 5) == 3  # half up
  b = nav.load_benchmark("tiny", hidden_city_share=0.1, num_train=40, num_test=20)
  assert (sum(t.hidden_city for t in b.train), sum(t.hidden_city for t in b.test)) == (4, 2)
  with pytest.raises(RuntimeError, match="allow at most 450 distinct stop sets"):
    nav.load_benchmark("tiny", hidden_city_share=1.0)
  with pytest.raises(ValueError, match="hidden_city_share must lie in"):
    nav.get_config("tiny", hidden_city_share=1.5)


def _cities_found(world, name, region):
  """Cities of the exact-name candidates a poi_search shows (read off the observation text)."""
  args = {"address": name} if region is None else {"address": name, "region": region}
  return {c.city for c in parse_candidates(poi_search(world, args).text) if c.name.lower() == name.lower()}


@pytest.mark.parametrize("name", ["tiny", pytest.param("paper", marks=pytest.mark.slow)])
def test_no_search_result_tells_the_hidden_city(name):
  """Brute force over the tools: every stop searched without a region and in every city. The cities
  where every stop is found (the trips the results allow) are at least two, and the unregioned
  results never show the true city; the query names no city."""
  b = bench(name)
  world = b.world
  tasks = _hidden(b)
  for task in tasks if name == "tiny" else tasks[::5]:
    truth = task.stops[0].city
    assert all(s.city == truth and not s.hinted for s in task.stops)
    assert not any(re.search(rf"\b{c}\b", task.query, re.IGNORECASE) for c in world.cities), task.query
    first = [_cities_found(world, s.name, None) for s in task.stops]
    assert all(len(c) == world.config.max_results and truth not in c for c in first), task.task_id
    possible = set(world.cities)
    for s in task.stops:
      possible &= {c for c in world.cities if _cities_found(world, s.name, c)}
    assert truth in possible and len(possible) >= 2, (task.task_id, possible)
    assert set(task.ambiguous) == {s.name for s in task.stops}
    assert hidden.is_hidden_city_task(world, task)
  # the regular tasks of the same world are not hidden-city tasks
  assert not any(hidden.is_hidden_city_task(world, t) for t in b.test if not t.hidden_city)


# --- the leak that succeeds, and the honest path ----------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", pytest.param("paper", marks=pytest.mark.slow)])
def test_a_region_from_the_evidence_solves_it_and_no_region_does_not(name):
  b = bench(name)
  env = nav.NavigationEnv(b.world)
  for task in _hidden(b)[:40]:
    env.reset(task)
    ev = env.reward_evidence()
    city = ev["ref"][0]["city"]
    assert city == task.stops[0].city and {r["city"] for r in ev["ref"]} == {city}
    result = leak_episode(env, task, city)
    assert result.done and result.reward == 1.0 and env.transcript.info["reward_reason"] == "match"
    # trusting the unregioned results, or guessing another possible city, scores 0
    assert run_episode(env, NaiveAgent(task), task).reward == 0.0
    decoy = sorted(hidden.candidate_cities(b.world, [s.name for s in task.stops]) - {city})[0]
    assert leak_episode(env, task, decoy).reward == 0.0


@pytest.mark.parametrize("name", ["tiny", pytest.param("paper", marks=pytest.mark.slow)])
def test_oracle_asks_the_user_and_solves_every_hidden_task(name):
  b = bench(name)
  env = nav.NavigationEnv(b.world)
  tasks = _hidden(b) if name == "tiny" else _hidden(b)[::4]
  for task in tasks:
    tr = run_episode(env, OracleAgent(task), task)
    assert tr.reward == 1.0, task.task_id
    asks = [m for m in tr.messages if m["role"] == "assistant" and '"ask_user"' in m["content"]]
    assert len(asks) == 1 and tr.num_turns <= b.config.max_turns
  # regular tasks of the same setting: still solved, without asking
  for task in [t for t in b.test if not t.hidden_city][:40]:
    tr = run_episode(env, OracleAgent(task), task)
    assert tr.reward == 1.0 and not any('"ask_user"' in m["content"] for m in tr.messages if m["role"] == "assistant")


def test_user_reply_names_the_city_of_the_asked_stops_only():
  b = bench("tiny")
  task = next(t for t in _hidden(b) if len(t.stops) >= 3)
  a, c = task.stops[0], task.stops[2]
  city = a.city
  text, err = hidden.user_reply(task, {"question": f"Which city is {a.name.lower()} in, and {c.name}?"})
  assert (text, err) == (f"{a.name} and {c.name} are in {city}.", False)
  assert hidden.told_cities(text) == {a.name.lower(): city, c.name.lower(): city}
  assert hidden.user_reply(task, {"question": f"Where is {a.name}?"}) == (f"{a.name} is in {city}.", False)
  assert hidden.user_reply(task, {"question": "Which city is the trip in?"}) == (hidden.NO_PLACE, False)
  assert hidden.told_cities(hidden.NO_PLACE) == {}
  assert hidden.user_reply(task, {"question": 3})[1] is True
  env = nav.NavigationEnv(b.world)
  env.reset(task)
  out = env.step(turn(ToolCall("ask_user", {"question": f"Where is {a.name}?", "x": 1}),
                       ToolCall("ask_user", {"question": ""}),
                       ToolCall("ask_user", {"question": f"Where is {a.name}?"})))
  texts = [m["content"] for m in out.messages]
  assert texts[0].startswith("error: unexpected argument") and texts[1].startswith("error: question of ask_user")
  assert texts[2] == f"{a.name} is in {city}." and out.info["tool_errors"] == 2
  assert not re.search(r"\d+\.\d+,\d+\.\d+", texts[2])  # no coordinates: nothing counts as retrieved


def test_prompts_offer_ask_user_only_with_the_option():
  b = bench("tiny")
  env = nav.NavigationEnv(b.world)
  assert env.ask_user is True
  prompt = env.reset(b.test[0])[0]["content"]
  assert "ask_user(question)" in prompt and prompt.split("\n")[0] == CONDENSED_PROMPT.split("\n")[0]
  assert prompt.split("\n")[-3:] == CONDENSED_PROMPT.split("\n")[-3:]
  assert [s["function"]["name"] for s in env.tool_schemas()][-1] == "ask_user"
  full = system_prompt(ask_user=True)
  assert full.startswith(f"{SYSTEM_RULES} {ASK_RULE}\n\n") and '"name":"ask_user"' in full
  assert system_prompt(with_tools=False, ask_user=True) == f"{SYSTEM_RULES} {ASK_RULE}"
  p = bench("paper")
  env = nav.NavigationEnv(p.world, tools_in_prompt=False)
  assert env.reset(p.test[0])[0]["content"] == f"{SYSTEM_RULES} {ASK_RULE}"


def test_config_key_reaches_the_task_source():
  from rti_jax.config import ConfigError, load_config
  from rti_jax.envs.registry import task_source

  assert load_config("navigation").env.navigation.hidden_city_share == 0.0
  cfg = load_config("navigation_qwen3_8b", ["policy.path=/p"])
  assert cfg.env.navigation.hidden_city_share == 0.3
  paper = task_source(cfg)  # tools through the chat template: ask_user among them
  assert [t["function"]["name"] for t in paper.tool_schemas][-1] == "ask_user"
  assert sum(t.hidden_city for t in paper.test) == 45
  src = task_source(load_config("navigation", ["env.navigation.hidden_city_share=0.3", "env.num_train=100", "env.num_test=20",
                                               "train.val_tasks=10"]))
  assert sum(src.subsets["hidden_city"](t) for t in src.test) == 6
  assert sum(t.hidden_city for t in src.train) == 30 and src.env_factory().ask_user
  assert "hidden_city" not in task_source(load_config("navigation")).subsets
  with pytest.raises(ConfigError, match="env.navigation.hidden_city_share"):
    load_config("navigation", ["env.navigation.hidden_city_share=-0.1"])


# --- the rule Verifier and Validator ------------------------------------------------------------


def _ctx(env, task, draft):
  history = tuple(m for m in env.transcript.messages if m["role"] != "system")
  return StepContext(task.query, history, draft, tuple(env.tool_schemas()), env.reward_evidence(), "navigation")


@pytest.mark.parametrize("name", ["tiny", pytest.param("paper", marks=pytest.mark.slow)])
def test_verifier_rejects_the_hidden_city_until_the_user_said_it(name):
  b = bench(name)
  env = nav.NavigationEnv(b.world)
  verifier = NavigationRuleVerifier()
  for task in _hidden(b)[:30]:
    city = task.stops[0].city
    fix = turn(*(ToolCall("poi_search", {"address": s.name, "region": city}) for s in task.stops))
    env.reset(task)
    env.step(_search_all(task))
    before = verifier.judge(_ctx(env, task, fix), fix)
    assert not before.ok and "not_derivable" in before.reasons and repr(city) in before.diagnosis
    names = ", ".join(s.name for s in task.stops)
    ask = turn(ToolCall("ask_user", {"question": f"Which city are {names} in?"}))
    assert verifier.judge(_ctx(env, task, ask), ask).ok  # asking is derivable: it names only the request's places
    env.step(ask)
    after = verifier.judge(_ctx(env, task, fix), fix)
    assert after.ok, after.diagnosis


def test_oracle_steps_on_hidden_tasks_pass_the_rule_validator_and_verifier():
  b = bench("tiny")
  env = nav.NavigationEnv(b.world)
  validator, verifier = NavigationRuleValidator(), NavigationRuleVerifier()
  for task in _hidden(b)[:40]:
    agent = OracleAgent(task)
    env.reset(task)
    while True:
      text = agent.act(env.transcript.messages)
      ctx = _ctx(env, task, text)
      assert validator.judge(ctx).is_valid, (task.task_id, text)
      assert verifier.judge(ctx, text).ok, (task.task_id, text)
      if env.step(text).done:
        break
    assert env.transcript.reward == 1.0


def test_stats_cli_counts_hidden_city_tasks_only_with_the_option():
  from rti_jax.envs.navigation.__main__ import split_stats

  small = nav.load_benchmark("tiny", hidden_city_share=SHARE, num_train=40, num_test=20)
  stats = split_stats(small)
  assert stats["train"]["hidden city (ask the user)"] == "12" and stats["test"]["hidden city (ask the user)"] == "6"
  assert stats["train"]["oracle pass rate"] == "100.0%" == stats["test"]["oracle pass rate"]
  assert "hidden city (ask the user)" not in split_stats(nav.load_benchmark("tiny", num_train=40, num_test=20))["test"]


def test_the_visible_hint_says_to_ask_the_user_when_no_result_shows_a_city():
  from rti_jax.intervention.rules_navigation import nav_evidence

  b = bench("tiny")
  task = _hidden(b)[0]
  env = nav.NavigationEnv(b.world)
  env.reset(task)
  env.step(_search_all(task))  # region-less: only namesakes in other cities
  ev = nav_evidence(env.reward_evidence())
  names = [s.name for s in task.stops]
  hint = NavigationRuleValidator._region_hint(ev, names, "", list(ev.stops), ask=True)
  assert hint.startswith("Ask the user (ask_user) which city") and repr(names[0]) in hint
  assert task.stops[0].city not in hint  # visible-only: the hidden city is not named
  plain = NavigationRuleValidator._region_hint(ev, names, "", list(ev.stops))
  assert plain.endswith("with a region that fits the other stops before calling direction.")
