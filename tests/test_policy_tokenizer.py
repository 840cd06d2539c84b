"""The tiny policy's tokenizer (exact round trip) and its Qwen-style chat template."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rti_jax.envs import navigation as nav
from rti_jax.envs.navigation import vocab as nav_vocab
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.intervention.judges import feedback_message
from rti_jax.intervention.rules_navigation import NavigationRuleValidator
from rti_jax.policy import sft_data
from rti_jax.policy.tokenizer import CHAT_TEMPLATE, MARKUP_TOKENS, NAME_PATTERN, SPECIAL_TOKENS, build_tokenizer
from rti_jax.rollout import ChatFormatter


@pytest.fixture(scope="module")
def bench():
  return nav.load_benchmark("tiny")


@pytest.fixture(scope="module")
def tok(bench):
  env = nav.NavigationEnv(bench.world)
  return build_tokenizer(sft_data.corpus_texts(bench.train[:60], env) + list(nav.vocabulary()), 2048)


def _episode_texts(bench, tasks):
  env = nav.NavigationEnv(bench.world)
  out = []
  for t in tasks:
    for agent in (nav.OracleAgent(t), nav.NaiveAgent(t), sft_data.TrustingAgent(t)):
      out += [m["content"] for m in sft_data.play(env, agent, t)]
  return out


def test_round_trip_on_every_text_the_env_and_agents_produce(bench, tok):
  texts = _episode_texts(bench, bench.train[::25] + bench.test[::10])
  texts += list(nav.vocabulary()) + nav_vocab._probe_texts() + nav_vocab._template_texts()
  texts += [feedback_message(NavigationRuleValidator().judge(_ctx(bench)))]
  assert len(texts) > 300
  for s in texts:
    ids = tok.encode(s, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == s


def _ctx(bench):
  env = nav.NavigationEnv(bench.world)
  task = next(t for t in bench.train if t.needs_disambiguation and not any(s.hinted for s in t.stops))
  msgs = sft_data.play(env, sft_data.TrustingAgent(task), task)
  env.replay(task, [m["content"] for m in msgs if m["role"] == "assistant"][:1])
  return sft_data.step_context(msgs[:3 + len(task.stops)], msgs[3 + len(task.stops)]["content"], env)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_round_trip_on_arbitrary_unicode(s):
  tok = _small_tok()
  assert tok.decode(tok.encode(s, add_special_tokens=False), skip_special_tokens=False) == s


_SMALL: list = []


def _small_tok():
  if not _SMALL:
    _SMALL.append(build_tokenizer(["hello world 12.5", "<tool_call>\n{\"a\": 1}\n</tool_call>"] * 3, 512))
  return _SMALL[0]


def test_control_and_markup_tokens_are_single_ids(tok):
  for t in SPECIAL_TOKENS + MARKUP_TOKENS:
    ids = tok.encode(t, add_special_tokens=False)
    assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == t
  assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
  assert len(tok) <= 2048


def test_words_and_numbers_tokenize_the_same_in_a_result_and_in_a_call(bench, tok):
  # Copying from observations into calls works on identical tokens.
  obs = "1. name Nanhu Lake; city Chengdu; location 104.1497,30.6141; type scenic spot"
  call = '{"name": "direction", "arguments": {"origin": "104.1497,30.6141", "region": "Chengdu", "address": "Nanhu Lake"}}'
  enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
  # Every POI coordinate of the map is two number tokens around a comma.
  assert all(len(enc(p.location)) == 3 for p in bench.world.pois)
  for piece in ("Nanhu", "Lake", "Chengdu", "104.1497", "30.6141"):
    sub = enc(piece)
    for text in (obs, call):
      ids = enc(text)
      assert any(ids[i:i + len(sub)] == sub for i in range(len(ids))), (piece, text)


def test_template_renders_chatml_tool_responses_and_generation_prompt(tok):
  msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
          {"role": "assistant", "content": "A"}, {"role": "tool", "content": "T1"}, {"role": "tool", "content": "T2"},
          {"role": "user", "content": "F"}]
  text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
  assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
                  "<|im_start|>user\n<tool_response>\nT1\n</tool_response>\n<tool_response>\nT2\n</tool_response>"
                  "<|im_end|>\n<|im_start|>user\nF<|im_end|>\n<|im_start|>assistant\n")
  off = tok.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False)
  assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_template_structured_calls_and_reasoning_parse_back(tok):
  call = {"name": "poi_search", "arguments": {"address": "Nanhu Lake", "region": "Chengdu"}}
  msgs = [{"role": "user", "content": "U"},
          {"role": "assistant", "content": "Searching.", "reasoning_content": "think first",
           "tool_calls": [{"type": "function", "function": call}, call]}]
  text = tok.apply_chat_template(msgs, tokenize=False)
  turn = text.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>")[0]
  assert turn.startswith("<think>\nthink first\n</think>\n\nSearching.\n<tool_call>\n")
  parsed = parse_assistant_turn(turn)
  assert parsed.errors == () and [(c.name, c.arguments) for c in parsed.tool_calls] == [(call["name"], call["arguments"])] * 2


def test_tools_block_only_when_the_system_prompt_lacks_it(bench, tok):
  env = nav.NavigationEnv(bench.world)
  msgs = env.reset(bench.train[0])
  assert msgs[0]["content"] == nav.system_prompt(condensed=True)  # the tiny setting's short prompt
  msgs = [{"role": "system", "content": nav.system_prompt(terse=True)}, msgs[1]]  # the full layout
  plain = ChatFormatter(tok).prompt_ids(msgs)
  assert ChatFormatter(tok, env.tool_schemas()).prompt_ids(msgs) == plain  # the system prompt lists them
  other = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
  text = tok.apply_chat_template(other, tools=env.tool_schemas(), tokenize=False, add_generation_prompt=True)
  assert text.startswith("<|im_start|>system\nS\n\n# Tools\n") and json.dumps(env.tool_schemas()[0]) in text


def test_rollout_layout_equals_the_template_of_the_transcript(bench, tok):
  """SFT sequences are built turn by turn like the rollout engine; they must equal the
  template applied to the whole conversation (else training and rollouts would differ)."""
  fmt = ChatFormatter(tok)
  env = nav.NavigationEnv(bench.world)
  for task in bench.train[:6]:
    for agent in (nav.OracleAgent(task), sft_data.TrustingAgent(task)):
      msgs = sft_data.play(env, agent, task)
      ids, mask = sft_data.encode_messages(fmt, msgs)
      whole = tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
      assert ids == list(whole)[:len(ids)] and len(whole) - len(ids) == 1  # the template adds "\n" after the last turn
      trained = tok.decode([i for i, m in zip(ids, mask) if m])
      assert trained == "".join(m["content"] + "<|im_end|>" for m in msgs if m["role"] == "assistant")


def test_template_is_the_one_saved(tok, tmp_path):
  tok.save_pretrained(tmp_path)
  from transformers import AutoTokenizer

  again = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
  assert again.chat_template == CHAT_TEMPLATE
  s = "I will search for each place first.\n<tool_call>\n{}\n</tool_call>"
  assert again.encode(s, add_special_tokens=False) == tok.encode(s, add_special_tokens=False)


def test_name_pattern_puts_each_coordinate_right_after_its_name(bench):
  # NAME_PATTERN: a whole name is one token, and so is a whole coordinate; in a labelled direction
  # stop the name token takes the space, so the coordinate is the very next token (a 1-back copy),
  # and the coordinate token is the same in the stop, a result line and a bare JSON value.
  env = nav.NavigationEnv(bench.world)
  tok = build_tokenizer(sft_data.corpus_texts(bench.train[:60], env) + list(nav.vocabulary()), 4096,
                        pattern=NAME_PATTERN)
  enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
  for p in bench.world.pois[:40]:
    assert len(enc(p.location)) == 1, p.location
    stop = enc(f"{p.name} {p.location}")
    assert len(stop) == 2 and stop[1] == enc(p.location)[0], (p.name, tok.convert_ids_to_tokens(stop))
    call = enc('{"origin": "' + p.location + '"}')
    assert enc(p.location)[0] in call
  # a name followed by anything but a number keeps its own token, without the space
  assert tok.convert_ids_to_tokens(enc("Shimen Hill, Xiling Zoo"))[0] == "ShimenĠHill"
  text = "Can you plan a route covering Shimen Hill, Xiling Zoo and Luojia Hill?"
  assert tok.decode(enc(text)) == text
