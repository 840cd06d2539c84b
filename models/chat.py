"""Tokenizers and the Qwen chat format (tool calls, tool responses, ``<think>`` reasoning).

A Qwen conversation is a list of chat-template dicts::

    {"role": "system" | "user" | "assistant" | "tool", "content": str}

and assistant turns may carry ``"reasoning_content"`` (rendered as a ``<think>`` block)
and ``"tool_calls"`` (``{"name", "arguments"}`` or OpenAI's ``{"function": {...}}``),
rendered as ``<tool_call>\\n{json}\\n</tool_call>``. Consecutive tool messages become one
user turn of ``<tool_response>`` blocks. With ``tools``, the system turn lists their
schemas in ``<tools></tools>``. Assistant ``content`` is rendered verbatim, so raw model
text that already holds ``<think>`` / ``<tool_call>`` blocks round-trips unchanged.

:func:`build_tiny_tokenizer` makes a small byte-level BPE tokenizer with the Qwen special
tokens and this template, for tests and the tiny default policy (no model hub needed).

The official Qwen3 templates ship in ``models/templates`` (provenance, licence and hashes in its
README): :func:`qwen3_chat_template` returns ``"qwen3"`` (the hybrid Qwen3 template,
``enable_thinking``), ``"qwen3_thinking_2507"`` (Qwen3 Thinking-2507: the generation prompt opens
``<think>``) or ``"qwen3_append_only"`` (ours: Qwen3's layout with every assistant turn kept as
generated). Where the official template re-renders history differently from the append-only
trajectory the rollout keeps (earlier reasoning dropped after a new user message; an empty think
block dropped from earlier turns under ``enable_thinking=False``), serve the policy with the
append-only template so the served contexts equal the trained ones (docs/qwen3_chat_template.md).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Sequence

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

#: Control tokens: never split, dropped by ``decode(..., skip_special_tokens=True)``.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Markup tokens: never split, but kept when decoding (the parser reads them).
MARKUP_TOKENS: tuple[str, ...] = (
  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

QWEN_CHAT_TEMPLATE = (
  "{%- macro text(content) -%}"
  "{%- if content is string -%}{{- content -}}"
  "{%- elif content is iterable -%}{%- for part in content -%}"
  "{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}"
  "{%- endif -%}"
  "{%- endmacro -%}"
  "{%- set ns = namespace(last_user=-1) -%}"
  "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
  "{%- endif -%}{%- endfor -%}"
  # system turn, with the tool schemas when there are tools
  "{%- if tools -%}"
  "{{- '<|im_start|>system\\n' -}}"
  "{%- if messages and messages[0].role == 'system' -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
  "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
  "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
  "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
  "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
  "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
  "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
  "{%- elif messages and messages[0].role == 'system' -%}"
  "{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}"
  "{%- endif -%}"
  "{%- for m in messages -%}"
  "{%- if m.role == 'system' -%}"
  "{%- if not loop.first -%}{{- '<|im_start|>system\\n' + text(m.content) + '<|im_end|>\\n' -}}{%- endif -%}"
  "{%- elif m.role == 'user' -%}"
  "{{- '<|im_start|>user\\n' + text(m.content) + '<|im_end|>\\n' -}}"
  "{%- elif m.role == 'assistant' -%}"
  "{{- '<|im_start|>assistant\\n' -}}"
  # reasoning is kept only for turns after the last user query (as Qwen3 does)
  "{%- if m.reasoning_content is defined and m.reasoning_content and loop.index0 > ns.last_user -%}"
  "{{- '<think>\\n' + m.reasoning_content.strip() + '\\n</think>\\n\\n' -}}"
  "{%- endif -%}"
  "{{- text(m.content) -}}"
  "{%- if m.tool_calls is defined and m.tool_calls -%}"
  "{%- for call in m.tool_calls -%}"
  "{%- set fn = call.function if call.function is defined else call -%}"
  "{%- if not loop.first or (m.content is string and m.content) -%}{{- '\\n' -}}{%- endif -%}"
  "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' -}}"
  "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
  "{{- '}\\n</tool_call>' -}}"
  "{%- endfor -%}"
  "{%- endif -%}"
  "{{- '<|im_end|>\\n' -}}"
  "{%- elif m.role == 'tool' -%}"
  # consecutive tool results share one user turn
  "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
  "{{- '\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' -}}"
  "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
  "{%- endif -%}"
  "{%- endfor -%}"
  "{%- if add_generation_prompt -%}"
  "{{- '<|im_start|>assistant\\n' -}}"
  "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
  "{%- endif -%}"
)


TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
#: sha256 of each template file; the official ones are verbatim copies of the published strings.
TEMPLATE_SHA256: dict[str, str | None] = {
  "qwen3": "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
  "qwen3_thinking_2507": "3802169b2a02b81e6adb7ab4f64f91ff02db753c8c3a64a01c35192d3a61d8d7",
  "qwen3_append_only": None,  # ours; no published original to match
}


def qwen3_chat_template(name: str = "qwen3") -> str:
  """The Jinja text of ``models/templates/{name}.jinja`` (official ones checked against their hash).

  name: ``"qwen3"`` (official hybrid Qwen3), ``"qwen3_thinking_2507"`` (official Thinking-2507) or
  ``"qwen3_append_only"`` (every assistant turn rendered as the generation prompt plus its text).
  """
  if name not in TEMPLATE_SHA256:
    raise ValueError(f"name: expected one of {sorted(TEMPLATE_SHA256)}, got {name!r}")
  text = (TEMPLATE_DIR / f"{name}.jinja").read_text(encoding="utf-8")
  want = TEMPLATE_SHA256[name]
  got = hashlib.sha256(text.encode("utf-8")).hexdigest()
  if want is not None and got != want:
    raise ValueError(f"{name}.jinja: expected sha256 {want}, got {got} (the file was edited)")
  return text


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
  """``AutoTokenizer`` from a local checkpoint directory (no hub access).

  A tokenizer without a chat template gets :data:`QWEN_CHAT_TEMPLATE`.
  """
  tok = AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True)
  if not getattr(tok, "chat_template", None):
    tok.chat_template = QWEN_CHAT_TEMPLATE
  return tok


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], *,
                tools: Sequence[dict[str, Any]] | None = None, add_generation_prompt: bool = True,
                enable_thinking: bool = True, **template_kwargs: Any) -> str:
  """The prompt text of ``messages`` (and ``tools`` schemas) under the tokenizer's template: the whole
  list rendered at once, as a chat endpoint does (``template_kwargs``: e.g. ``think_prefilled``)."""
  _check_messages(messages)
  return tokenizer.apply_chat_template(
    list(messages), tools=list(tools) if tools else None, tokenize=False,
    add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking, **template_kwargs)


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], *,
                tools: Sequence[dict[str, Any]] | None = None, add_generation_prompt: bool = True,
                enable_thinking: bool = True, **template_kwargs: Any) -> list[int]:
  """Token ids of :func:`render_chat` (markup tags map to their single added-token ids): the prompt a
  server holding this template feeds the model, where ``rollout.ChatFormatter`` appends turn by turn."""
  text = render_chat(tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt,
                     enable_thinking=enable_thinking, **template_kwargs)
  return tokenizer.encode(text, add_special_tokens=False)


def _check_messages(messages: Sequence[dict[str, Any]]) -> None:
  roles = ("system", "user", "assistant", "tool")
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or m.get("role") not in roles:
      got = m.get("role") if isinstance(m, dict) else type(m).__name__
      raise ValueError(f"messages[{i}]: expected a dict with role in {roles}, got {got!r}")


def build_tiny_tokenizer(vocab_words: Sequence[str], path: str | os.PathLike | None = None, *,
                         chat_template: str = QWEN_CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
  """A small byte-level BPE tokenizer whose vocabulary holds each word of ``vocab_words``.

  Any text encodes (256 byte symbols, no unknown token) and ``decode(encode(s)) == s``.
  Each word, alone and with a leading space, becomes one token (a word with punctuation,
  e.g. ``poi_search``, is first split as the byte-level pre-tokenizer splits it, as in
  Qwen's own tokenizer: ``poi`` ``_`` ``search``); the Qwen control and
  markup tokens are single added tokens. Saved to ``path`` (if given) so
  ``AutoTokenizer.from_pretrained(path)`` / :func:`load_tokenizer` load it back.
  Token ids are deterministic for a given ``vocab_words``.
  """
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

  words = [w for w in dict.fromkeys(vocab_words) if w]
  if any(not isinstance(w, str) for w in words):
    raise TypeError("vocab_words: expected strings")
  corpus = words + [" " + w for w in words]
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  budget = len(alphabet) + len(SPECIAL_TOKENS) + sum(len(w.encode()) + 1 for w in corpus)
  trainer = trainers.BpeTrainer(vocab_size=budget, initial_alphabet=alphabet,
                                special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                min_frequency=1)
  tok.train_from_iterator(corpus, trainer)
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
    unk_token=None, bos_token=None, clean_up_tokenization_spaces=False)
  fast.chat_template = chat_template
  if path is not None:
    fast.save_pretrained(os.fspath(path))
  return fast
