"""Reference agents on the full default splits, vocabulary coverage, and the CLI."""

import functools
import json
import re

import pytest

from rti_jax.envs.navigation import NavigationEnv, load_benchmark, tokenize_words, vocabulary
from rti_jax.envs.navigation.__main__ import main
from rti_jax.envs.navigation.agents import NaiveAgent, OracleAgent, run_episode
from rti_jax.envs.navigation.tasks import load_tasks
from rti_jax.envs.tool_calls import parse_assistant_turn


@functools.lru_cache(maxsize=None)
def episodes(name):
  b = load_benchmark(name)
  env = NavigationEnv(b.world)
  out = {}
  for split, tasks in (("train", b.train), ("test", b.test)):
    out[split] = [(t, run_episode(env, OracleAgent(t), t), run_episode(env, NaiveAgent(t), t)) for t in tasks]
  return b, out


#: the paper setting's episodes (every task of both splits played twice) in the slow tier
PAPER = pytest.param("paper", marks=pytest.mark.slow)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", "paper"])
def test_oracle_scores_100_and_naive_fails_exactly_the_disambiguation_tasks(name):
  _, eps = episodes(name)
  for split in ("train", "test"):
    for task, oracle, naive in eps[split]:
      assert oracle.reward == 1.0, (task.task_id, oracle.info)
      assert oracle.num_turns <= 4
      assert naive.reward == (0.0 if task.needs_disambiguation else 1.0), task.task_id
      if task.needs_disambiguation:
        assert naive.info["reward_reason"] == "mismatch"
    share = sum(t.needs_disambiguation for t, _, _ in eps[split]) / len(eps[split])
    naive_rate = sum(n.reward for _, _, n in eps[split]) / len(eps[split])
    assert naive_rate == pytest.approx(1 - share)


@pytest.mark.parametrize("name", ["tiny", PAPER])
def test_agent_turns_are_exactly_the_parsed_qwen_format(name):
  _, eps = episodes(name)
  for _, oracle, naive in eps["test"][:50]:
    for tr in (oracle, naive):
      assistant = [m["content"] for m in tr.messages if m["role"] == "assistant"]
      for text in assistant[:-1]:
        parsed = parse_assistant_turn(text)
        assert parsed.tool_calls and not parsed.errors
        blocks = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL)
        assert [json.loads(b) for b in blocks] == [{"name": c.name, "arguments": c.arguments}
                                                   for c in parsed.tool_calls]
      assert parse_assistant_turn(assistant[-1]).is_answer
      assert tr.info["malformed"] == 0 and tr.info["tool_errors"] == 0


@pytest.mark.parametrize("name", ["tiny", PAPER])
def test_vocabulary_covers_every_text(name):
  vocab = set(vocabulary())
  assert 200 <= len(vocab) <= 600
  b, eps = episodes(name)
  for split in ("train", "test"):
    for _, oracle, naive in eps[split]:
      for tr in (oracle, naive):
        for m in tr.messages:
          missing = set(tokenize_words(m["content"])) - vocab
          assert not missing, (m["role"], missing)
  # Error observations of in-vocabulary model output stay in the vocabulary.
  env = NavigationEnv(b.world)
  env.reset(b.test[0])
  bad = ['<tool_call>{"name": "poi_search", "arguments": {"address": </tool_call>', "<tool_call>[1]</tool_call>",
         '<tool_call>{"name": "route", "arguments": {}}</tool_call>', '<tool_call>{"name": "direction", '
         '"arguments": {"origin": "Park", "destination": "1,2", "mode": "walk"}}</tool_call>', ""]
  for text in bad:
    for m in env.step(text).messages:
      assert not set(tokenize_words(m["content"])) - vocab, m["content"]


def test_tokenize_words_pattern():
  assert tokenize_words('<tool_call>\n{"a": "120.5,3"}</tool_call>') == [
      "<tool_call>", "{", '"', "a", '"', ":", '"', "1", "2", "0", ".", "5", ",", "3", '"', "}", "</tool_call>"]


def test_cli_stats_generate_and_sft(tmp_path, capsys):
  assert main(["stats", "--config", "tiny", "--num-train", "40", "--num-test", "20"]) == 0
  out = capsys.readouterr().out
  assert re.search(r"oracle pass rate\s+100\.0%\s+100\.0%", out)
  assert "need disambiguation" in out and "naive pass rate" in out and "order level 4" in out
  assert main(["generate", "--config", "paper", "--num-train", "12", "--num-test", "6", "--out", str(tmp_path)]) == 0
  train = load_tasks(tmp_path / "train.jsonl")
  assert len(train) == 12 and all(3 <= len(t.stops) <= 9 for t in train)
  assert json.loads((tmp_path / "config.json").read_text())["name"] == "paper"
  sft = tmp_path / "sft.jsonl"
  assert main(["sft", "--num-train", "8", "--num-test", "2", "--out", str(sft)]) == 0
  rows = [json.loads(line) for line in sft.read_text().splitlines()]
  assert len(rows) == 8 and all(r["reward"] == 1.0 and r["messages"][0]["role"] == "system" for r in rows)
  assert main(["stats", "--config", "tiny", "--min-stops", "5", "--max-stops", "3"]) == 2
  assert "min_stops" in capsys.readouterr().err


def test_first_turn_searches_follow_the_request_order():
  bench = load_benchmark("tiny")
  env = NavigationEnv(bench.world)
  reordered = 0
  for task in bench.train[:200]:
    first = OracleAgent(task).act(env.reset(task))
    names = [c.arguments["address"] for c in parse_assistant_turn(first).tool_calls]
    assert sorted(names) == sorted(s.name for s in task.stops)
    # each name's first whole-word mention in the request comes after the previous one's
    where = [re.search(re.escape(n) + r"(?![A-Za-z]| [A-Z])", task.query).start() for n in names]
    assert where == sorted(where), (task.query, names)
    reordered += names != [s.name for s in task.stops]
    if task.template == "end_b":  # "My last stop must be X. Before that, ...": X is searched first
      assert names[0] == task.stops[-1].name
  assert reordered > 10  # some templates mention the stops out of route order
