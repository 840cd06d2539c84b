"""The tiny policy's tokenizer and its Qwen-style chat template.

A byte-level BPE (``tokenizers`` library) trained on Navigation train-split transcripts.
Pre-tokenization isolates every whitespace run, every ASCII letter run, every decimal
number (``104.0145``) and every run of other characters (with single spaces inside or after it, e.g.
``'": "'``), then maps bytes to symbols (ByteLevel), so:

* any text encodes (256 byte symbols, no unknown token) and ``decode(encode(s)) == s``;
* a word is the same token wherever it appears (``"Jiming"`` in the query and inside a
  JSON string), and so is a number: a coordinate ``104.0145,30.5197`` is typically two
  number tokens (BPE merges every number that occurs at least twice in the corpus), the
  same in a tool result and in a call, so the policy copies single identical tokens;
* ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>`` are special tokens and
  ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``,
  ``<think>``, ``</think>`` single added tokens kept by ``decode``.

``CHAT_TEMPLATE`` renders Qwen's ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``,
consecutive tool messages as one user turn of ``<tool_response>`` blocks, optional
``reasoning_content`` as a ``<think>`` block, structured ``tool_calls`` as
``<tool_call>`` blocks, and a ``# Tools`` block in the system turn when ``tools`` are
passed and the system prompt does not already list them (the Navigation system prompt
does, so ``ChatFormatter(tok)`` and ``ChatFormatter(tok, env.tool_schemas())`` give the
same ids there).

``byte_tokenizer()`` is the untrained counterpart: the 256 byte symbols and the nine special and
markup tokens (all special), with ``BYTE_CHAT_TEMPLATE``, a plain ChatML template that lists
``tools`` as JSON lines. It is built in memory, so tests and benchmarks get a real tokenizer
without training or downloading one.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKUP_TOKENS: tuple[str, ...] = (
  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
PRE_TOKENIZER_PATTERN = r"\s+|[A-Za-z]+|[0-9]+(?:\.[0-9]+)?|[^\sA-Za-z0-9]+(?: [^\sA-Za-z0-9]+)* ?"
# Whole place names and whole coordinates: a capitalised name (``Shimen Hill``) is one pre-token, and
# takes the space after it when a number follows (``Shimen Hill 109.0145,34.4338`` is name, coordinate:
# in a labelled ``direction`` stop the coordinate directly follows its name, the key of its look-up); a
# ``lon,lat`` pair is one pre-token (why: docs/tiny_policy.md).
NAME_PATTERN = (r"[A-Z][a-z]+(?: [A-Z][a-z]+)*(?: (?=[0-9]))?|[0-9]+(?:\.[0-9]+)?(?:,[0-9]+(?:\.[0-9]+)?)?|\s+|"
                r"[A-Za-z]+|[^\sA-Za-z0-9]+(?: [^\sA-Za-z0-9]+)* ?")
END_OF_TURN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

CHAT_TEMPLATE = r"""
{%- macro text(c) -%}
{%- if c is string -%}{{ c }}{%- elif c is none -%}{%- else -%}{%- for p in c -%}{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- set sys = text(messages[0].content) if has_system else '' -%}
{%- if tools and '<tools>' not in sys -%}
{{- '<|im_start|>system\n' -}}
{%- if sys -%}{{- sys + '\n\n' -}}{%- endif -%}
{{- '# Tools\nYou may call one or more functions. Function signatures:\n<tools>\n' -}}
{%- for t in tools -%}{{- t | tojson -}}{{- '\n' -}}{%- endfor -%}
{{- '</tools>\nFor each call, return a json object with the function name and arguments within <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif has_system -%}
{{- '<|im_start|>system\n' + sys + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' -%}
{%- if not loop.first -%}{{- '<|im_start|>system\n' + text(m.content) + '<|im_end|>\n' -}}{%- endif -%}
{%- elif m.role == 'user' -%}
{{- '<|im_start|>user\n' + text(m.content) + '<|im_end|>\n' -}}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if m.reasoning_content is defined and m.reasoning_content -%}
{{- '<think>\n' + m.reasoning_content.strip() + '\n</think>\n\n' -}}
{%- endif -%}
{{- text(m.content) -}}
{%- if m.tool_calls is defined and m.tool_calls -%}
{%- for call in m.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- if not loop.first or text(m.content) -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + text(m.content) + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
""".strip("\n")


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 2048, path: str | os.PathLike | None = None,
                    pattern: str | None = None) -> PreTrainedTokenizerFast:
  """Trains the byte-level BPE on ``corpus`` (deterministic for a given corpus order).

  vocab_size: the total size including the 256 byte symbols and the 9 special/markup
    tokens (at least 512). path: if given, the tokenizer (``tokenizer.json``,
    ``tokenizer_config.json`` with ``CHAT_TEMPLATE``) is saved there. pattern: the
    pre-tokenizer regex (default ``PRE_TOKENIZER_PATTERN``; ``NAME_PATTERN`` for whole names and
    coordinates).
  """
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

  if int(vocab_size) < 512:
    raise ValueError(f"vocab_size: expected >= 512 (256 byte symbols + merges), got {vocab_size}")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pattern or PRE_TOKENIZER_PATTERN), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
  ])
  tok.decoder = decoders.ByteLevel()
  n_added = len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)
  trainer = trainers.BpeTrainer(
    vocab_size=int(vocab_size) - len(MARKUP_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    special_tokens=list(SPECIAL_TOKENS), show_progress=False, min_frequency=2)
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
  tok.train_from_iterator(list(corpus), trainer)
  if tok.get_vocab_size() < 256 + n_added:
    raise RuntimeError(f"tokenizer: expected >= {256 + n_added} tokens after training, got {tok.get_vocab_size()}")
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, eos_token=END_OF_TURN, pad_token=PAD_TOKEN, unk_token=None, bos_token=None,
    clean_up_tokenization_spaces=False, model_max_length=8192)
  fast.chat_template = CHAT_TEMPLATE
  if path is not None:
    fast.save_pretrained(os.fspath(path))
  return fast


BYTE_CHAT_TEMPLATE = r"""
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
{{- '# Tools\n<tools>\n' -}}
{%- for t in tools -%}{{- t | tojson -}}{{- '\n' -}}{%- endfor -%}
{{- '</tools><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + m.content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


def byte_tokenizer() -> PreTrainedTokenizerFast:
  """An untrained byte-level tokenizer: 256 byte tokens, then ``SPECIAL_TOKENS`` and
  ``MARKUP_TOKENS`` as special tokens (ids 256..264), with ``BYTE_CHAT_TEMPLATE``."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers

  alphabet = pre_tokenizers.ByteLevel.alphabet()
  vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    eos_token=END_OF_TURN,
    pad_token=PAD_TOKEN,
    unk_token=None,
    additional_special_tokens=[*SPECIAL_TOKENS, *MARKUP_TOKENS],
  )
  fast.chat_template = BYTE_CHAT_TEMPLATE
  return fast


def add_whole_pretokens(fast: PreTrainedTokenizerFast, texts: Iterable[str]) -> tuple[PreTrainedTokenizerFast, list[int]]:
  """``fast`` with BPE merges that make every pre-token of ``texts`` one token; (the new tokenizer,
  the ids of those pre-tokens' tokens, new or not).

  For a policy continued on a world with places its tokenizer never saw (a setting with
  hidden-city places): under ``NAME_PATTERN`` a new name or coordinate would otherwise be several
  pieces, unlike every place the policy learned to copy. Pass texts made of such pre-tokens, e.g.
  ``"Shimen Hill"`` and ``"Shimen Hill 109.0145,34.4338"`` (a name, a name before a number, a
  coordinate). A pre-token that already is one token is left alone; the pieces of any other are
  merged left to right by merges ranked after every existing one, each merge's result a new token
  (ids after the last id in use). A new merge applies only where no existing merge can, so a text
  that the old merges turned into whole tokens encodes as before.
  """
  import json

  from tokenizers import Tokenizer

  backend = fast.backend_tokenizer
  state = json.loads(backend.to_str())
  model = state["model"]
  if model.get("type") != "BPE":
    raise ValueError(f"add_whole_pretokens: expected a BPE tokenizer, got {model.get('type')!r}")
  vocab: dict[str, int] = model["vocab"]
  merges: list = model["merges"]
  known = {tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges}
  # The library gives an added token that is not in the model's vocabulary the id len(vocab) + k,
  # so the added tokens above the model's ids (the markup after training) enter it at their ids first.
  for t in state["added_tokens"]:
    vocab.setdefault(t["content"], t["id"])
  if sorted(vocab.values()) != list(range(len(vocab))):
    raise ValueError("add_whole_pretokens: expected the ids of the vocabulary and the added tokens to be 0..n-1")
  next_id = len(vocab)
  ids: list[int] = []
  symbols = dict.fromkeys(sym for text in texts for sym, _ in backend.pre_tokenizer.pre_tokenize_str(text))
  for symbol in symbols:
    parts = [t.value for t in backend.model.tokenize(symbol)]
    acc = parts[0]
    for part in parts[1:]:
      pair, acc = (acc, part), acc + part
      if pair not in known:
        merges.append([pair[0], pair[1]])
        known.add(pair)
      if acc not in vocab:
        vocab[acc] = next_id
        next_id += 1
    ids.append(vocab[acc])
  out = PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer.from_str(json.dumps(state)), eos_token=fast.eos_token, pad_token=fast.pad_token,
    unk_token=None, bos_token=None, clean_up_tokenization_spaces=False, model_max_length=fast.model_max_length)
  out.chat_template = fast.chat_template
  return out, ids


def save_tokenizer(tok: Any, policy_dir: str) -> None:
  """Saves ``tok`` into ``policy_dir`` without the load-time keys a tokenizer read with
  ``local_files_only`` carries into its saved config (they are not the tokenizer's)."""
  import json

  tok.save_pretrained(policy_dir)
  path = os.path.join(policy_dir, "tokenizer_config.json")
  with open(path) as f:
    conf = json.load(f)
  if not any(k in conf for k in ("is_local", "local_files_only")):
    return
  for key in ("is_local", "local_files_only"):
    conf.pop(key, None)
  with open(path, "w") as f:
    json.dump(conf, f, indent=2, ensure_ascii=False)
    f.write("\n")
