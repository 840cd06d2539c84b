"""Tiny tokenizer and the Qwen chat template: tool calls, tool responses, <think>."""

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.chat import (MARKUP_TOKENS, QWEN_CHAT_TEMPLATE, SPECIAL_TOKENS, build_tiny_tokenizer,
                         encode_chat, load_tokenizer, render_chat)
from rti_jax.envs.tool_calls import parse_assistant_turn

WORDS = ["hello", "world", "poi_search", "address", "Dajin", "Park", "route", "the", "name", "arguments"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok")
  build_tiny_tokenizer(WORDS, path)
  return path


@pytest.fixture(scope="module")
def tok(tok_dir):
  return load_tokenizer(tok_dir)


def test_saved_tokenizer_loads_with_autotokenizer_and_same_ids(tok_dir, tok):
  built = build_tiny_tokenizer(WORDS)
  assert len(tok) == len(built)
  assert tok.get_vocab() == built.get_vocab()  # deterministic build
  assert tok.chat_template == QWEN_CHAT_TEMPLATE
  assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_words_and_markup_are_single_tokens(tok):
  for w in WORDS:
    if w.isalpha():
      assert len(tok.encode(w, add_special_tokens=False)) == 1, w
      assert len(tok.encode(" " + w, add_special_tokens=False)) == 1, w
  assert tok.convert_ids_to_tokens(tok.encode("poi_search", add_special_tokens=False)) == ["poi", "_", "search"]
  for t in SPECIAL_TOKENS + MARKUP_TOKENS:
    assert tok.encode(t, add_special_tokens=False) == [tok.convert_tokens_to_ids(t)], t
  ids = tok.encode("<|im_start|>hello<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
  assert tok.decode(ids, skip_special_tokens=True) == "hello<tool_call>x</tool_call>"


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=60))
def test_any_text_round_trips(tok, text):
  assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


TOOLS = [{"type": "function", "function": {"name": "poi_search", "description": "Find a place.",
                                            "parameters": {"type": "object", "properties": {
                                              "address": {"type": "string"}}}}}]
CONVERSATION = [
  {"role": "system", "content": "You are a navigator."},
  {"role": "user", "content": "Go to Dajin Park."},
  {"role": "assistant", "content": "", "reasoning_content": "Find it first.",
   "tool_calls": [{"name": "poi_search", "arguments": {"address": "Dajin Park"}},
                  {"type": "function", "function": {"name": "route", "arguments": "{\"to\": 3}"}}]},
  {"role": "tool", "content": "{\"id\": 3}"},
  {"role": "tool", "content": "ok"},
]


def test_render_matches_the_qwen_format(tok):
  want = (
    "<|im_start|>system\nYou are a navigator.\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOLS[0], ensure_ascii=False) +
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\nGo to Dajin Park.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nFind it first.\n</think>\n\n"
    "<tool_call>\n{\"name\": \"poi_search\", \"arguments\": {\"address\": \"Dajin Park\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"route\", \"arguments\": {\"to\": 3}}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n{\"id\": 3}\n</tool_response>\n"
    "<tool_response>\nok\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n")
  assert render_chat(tok, CONVERSATION, tools=TOOLS) == want


def test_rendered_tool_calls_parse_back(tok):
  text = render_chat(tok, CONVERSATION[:3], add_generation_prompt=False)
  turn = text.split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
  parsed = parse_assistant_turn(turn)
  assert parsed.errors == ()
  assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
    ("poi_search", {"address": "Dajin Park"}), ("route", {"to": 3})]


def test_reasoning_kept_only_after_the_last_user_turn(tok):
  msgs = [{"role": "user", "content": "a"},
          {"role": "assistant", "content": "b", "reasoning_content": "old thought"},
          {"role": "user", "content": "c"},
          {"role": "assistant", "content": "d", "reasoning_content": "new thought"}]
  text = render_chat(tok, msgs, add_generation_prompt=False)
  assert "old thought" not in text
  assert "<|im_start|>assistant\n<think>\nnew thought\n</think>\n\nd<|im_end|>\n" in text
  raw = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nx\n</think>\n\ny"}]
  assert render_chat(tok, raw, add_generation_prompt=False).endswith(
    "<|im_start|>assistant\n<think>\nx\n</think>\n\ny<|im_end|>\n")


def test_generation_prompt_and_disabled_thinking(tok):
  msgs = [{"role": "user", "content": "hello"}]
  assert render_chat(tok, msgs) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
  assert render_chat(tok, msgs, enable_thinking=False).endswith(
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
  assert render_chat(tok, msgs, add_generation_prompt=False) == "<|im_start|>user\nhello<|im_end|>\n"


def test_encode_chat_uses_single_ids_for_markup(tok):
  ids = encode_chat(tok, CONVERSATION, tools=TOOLS)
  assert tok.decode(ids) == render_chat(tok, CONVERSATION, tools=TOOLS)
  call_id = tok.convert_tokens_to_ids("<tool_call>")
  assert ids.count(call_id) == 4  # two in the system prompt (text and example), two calls
  assert ids.count(tok.convert_tokens_to_ids("<tool_response>")) == 2


def test_tokenizer_without_template_gets_the_qwen_template(tmp_path):
  build_tiny_tokenizer(WORDS, tmp_path)
  os.remove(tmp_path / "chat_template.jinja")
  cfg = json.load(open(tmp_path / "tokenizer_config.json"))
  cfg.pop("chat_template", None)
  json.dump(cfg, open(tmp_path / "tokenizer_config.json", "w"))
  assert load_tokenizer(tmp_path).chat_template == QWEN_CHAT_TEMPLATE


def test_bad_roles_are_rejected(tok):
  with pytest.raises(ValueError, match=r"messages\[1\].*'robot'"):
    render_chat(tok, [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])


def test_tiny_policy_path_chat_to_generation_and_back(tok):
  """Tokenizer -> chat ids -> sampler (stop at <|im_end|>) -> text, with a fresh tiny model."""
  import jax
  from flax import nnx
  import models
  config = models.QwenConfig(model_type="qwen3", vocab_size=len(tok), hidden_size=32,
                             intermediate_size=48, num_layers=1, num_heads=2, num_kv_heads=1,
                             head_dim=16, tie_word_embeddings=True)
  model = models.Qwen(config, rngs=nnx.Rngs(0))
  prompt = encode_chat(tok, [{"role": "user", "content": "hello world"}])
  end = tok.convert_tokens_to_ids("<|im_end|>")
  out = models.Sampler(model, max_cache_len=128).generate(
    [prompt], key=jax.random.key(0), max_new_tokens=20, stop_token_ids=[end])
  toks = out.tokens[0]
  assert 1 <= len(toks) <= 20 and ((toks[-1] == end) == (out.finish_reasons[0] == "stop"))
  assert isinstance(tok.decode(toks.tolist()), str)


# -- the Qwen3 template files ----------------------------------------------------------------------

_EPISODE = [
  {"role": "system", "content": "rules"},
  {"role": "user", "content": "plan a route"},
  {"role": "assistant", "content": "<think>\nfirst\n</think>\n\n<tool_call>\n{\"name\": \"poi_search\", \"arguments\": {}}\n</tool_call>"},
  {"role": "tool", "content": "1. name Dajin Park"},
  {"role": "user", "content": "and then?"},
  {"role": "assistant", "content": "<think>\nsecond\n</think>\n\nthe route"},
]


def _appends(tok, template: str, after: str = "user", **kw) -> list[bool]:
  """For each assistant turn k, with one more message of role ``after`` following it: does the
  rendering start with the prompt of turn k (generation prompt included), the text generated after it
  and <|im_end|>? (what an append-only trajectory holds)"""
  from models.chat import qwen3_chat_template

  chat = qwen3_chat_template(template)
  render = lambda msgs, gen: tok.apply_chat_template(msgs, chat_template=chat, tokenize=False,  # noqa: E731
                                                     add_generation_prompt=gen, **kw)
  out = []
  for k, m in enumerate(_EPISODE):
    if m["role"] == "assistant":
      text = m["content"].removeprefix("<think>\n") if kw.get("think_prefilled") else m["content"]
      later = render(_EPISODE[:k] + [dict(m, content=text), {"role": after, "content": "next"}], False)
      out.append(later.startswith(render(_EPISODE[:k], True) + text + "<|im_end|>\n"))
  return out


def test_the_official_templates_are_verbatim_and_hash_checked(tmp_path, monkeypatch):
  import models.chat as chat

  assert "enable_thinking is defined and enable_thinking is false" in chat.qwen3_chat_template("qwen3")
  assert chat.qwen3_chat_template("qwen3_thinking_2507").endswith("{{- '<|im_start|>assistant\\n<think>\\n' }}\n{%- endif %}")
  with pytest.raises(ValueError, match="name: expected one of"):
    chat.qwen3_chat_template("qwen4")
  for name in ("qwen3", "qwen3_thinking_2507", "qwen3_append_only"):
    (tmp_path / f"{name}.jinja").write_text(chat.qwen3_chat_template(name).replace("tool_call", "toolcall"))
  monkeypatch.setattr(chat, "TEMPLATE_DIR", tmp_path)
  with pytest.raises(ValueError, match="qwen3.jinja: expected sha256"):
    chat.qwen3_chat_template("qwen3")
  assert "toolcall" in chat.qwen3_chat_template("qwen3_append_only")  # ours carries no published hash


def test_append_only_template_keeps_every_turn_as_generated(tok):
  """The append-only template: each assistant turn renders as its prompt's generation prompt plus its
  text, later turns and user messages change nothing before them, in every thinking mode. The official
  template drops the first turn's reasoning once a user message follows it."""
  assert _appends(tok, "qwen3_append_only") == [True, True]
  assert _appends(tok, "qwen3_append_only", enable_thinking=False) == [True, True]
  assert _appends(tok, "qwen3_append_only", think_prefilled=True) == [True, True]
  assert _appends(tok, "qwen3_append_only", after="tool") == [True, True]
  assert _appends(tok, "qwen3", after="tool") == [True, True]  # tool results are no new query
  assert _appends(tok, "qwen3") == [False, False]  # a new user message drops the reasoning before it
