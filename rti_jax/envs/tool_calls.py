"""Parsing Qwen-style tool calls out of assistant text.

Qwen chat templates put each call in its own block::

    <tool_call>
    {"name": "poi_search", "arguments": {"address": "Dajin Park"}}
    </tool_call>

Several blocks in one assistant turn are parallel calls. Reasoning is not read: closed
``<think>...</think>`` blocks are skipped, and so is everything before a ``</think>`` that no
``<think>`` opens (Qwen3 Thinking-2507's generation prompt ends with ``<think>``, so its turns
start inside the reasoning). Anything that cannot be
parsed is reported in ``ParsedTurn.errors`` (never raised), so an environment can
answer malformed model output with an error observation and count it: invalid JSON,
JSON nested deeper than ``MAX_JSON_DEPTH`` levels, an integer literal longer than
Python's int-string limit. Every step runs in time linear in the text's length.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"

#: The deepest JSON nesting a tool call may have (a call needs 3: call, arguments, waypoints).
MAX_JSON_DEPTH = 32
# A JSON string literal (an unterminated one runs to the end) or a bracket, for counting depth.
_JSON_LEXEME_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def strip_think(text: str) -> str:
  """``text`` without its closed ``<think>...</think>`` blocks, each ended by the first
  ``</think>`` after it (what ``re.sub("<think>.*?</think>", "", text, flags=re.DOTALL)``
  gives, in linear time: that regex rescans to the end from every unclosed ``<think>``)."""
  out: list[str] = []
  pos = 0
  while True:
    start = text.find(_THINK_OPEN, pos)
    if start < 0:
      break
    end = text.find(_THINK_CLOSE, start + len(_THINK_OPEN))
    if end < 0:
      break
    out.append(text[pos:start])
    pos = end + len(_THINK_CLOSE)
  out.append(text[pos:])
  return "".join(out)


def strip_reasoning(text: str) -> str:
  """``text`` without its reasoning: the text up to a first ``</think>`` that no ``<think>`` before
  it opens (a turn whose generation prompt opened the block), then closed blocks (``strip_think``)."""
  close = text.find(_THINK_CLOSE)
  if close >= 0 and _THINK_OPEN not in text[:close]:
    text = text[close + len(_THINK_CLOSE):]
  return strip_think(text)


def reasoning_of(text: str) -> str:
  """The reasoning ``strip_reasoning`` removes, its blocks joined by newlines: each ``</think>``
  closes the block its last ``<think>`` opened (or, with none, the text since the previous close,
  as when the generation prompt opened the block)."""
  parts = []
  pos = 0
  while True:
    close = text.find(_THINK_CLOSE, pos)
    if close < 0:
      break
    start = text.rfind(_THINK_OPEN, pos, close)
    parts.append(text[(start + len(_THINK_OPEN)) if start >= 0 else pos:close])
    pos = close + len(_THINK_CLOSE)
  return "\n".join(parts)


def json_nesting_exceeds(text: str, limit: int = MAX_JSON_DEPTH, start: int = 0) -> int | None:
  """Where the JSON value at ``text[start:]`` first nests deeper than ``limit``, or None.

  Brackets inside string literals do not count, and the scan ends where the first bracket
  opened closes again, so a None means ``json`` cannot recurse deeper than ``limit`` when
  decoding from ``start``. Linear in the length scanned (text with at most ``limit``
  brackets needs no scan).
  """
  depth = 0
  for m in _JSON_LEXEME_RE.finditer(text, start):
    ch = text[m.start()]
    if ch == "{" or ch == "[":
      depth += 1
      if depth > limit:
        return m.start()
    elif ch == "}" or ch == "]":
      depth -= 1
      if depth <= 0:
        return None
  return None


def json_nesting_depths(text: str, limit: int = MAX_JSON_DEPTH, start: int = 0) -> tuple[dict[int, int | None], int]:
  """For every bracket the JSON value at ``text[start:]`` opens (outside string literals): where
  the value it opens first nests deeper than ``limit`` (None: never). Also where the scan ended.

  One linear pass, to where the bracket at ``start`` closes (or the end); each bracket met gets
  the answer ``json_nesting_exceeds`` would give for a value starting there.
  """
  deepest: dict[int, int | None] = {}
  stack: list[int] = []
  for m in _JSON_LEXEME_RE.finditer(text, start):
    at = m.start()
    ch = text[at]
    if ch == "{" or ch == "[":
      stack.append(at)
      deepest[at] = None
      if len(stack) > limit and deepest[stack[-limit - 1]] is None:
        deepest[stack[-limit - 1]] = at
    elif ch == "}" or ch == "]":
      if stack:
        stack.pop()
      if not stack:
        return deepest, m.end()
  return deepest, len(text)


def loads_json(text: str, what: str = "tool call") -> tuple[Any, str]:
  """``(value, "")`` for a JSON document, else ``(None, message)``; never raises.

  Rejected: invalid JSON, nesting deeper than ``MAX_JSON_DEPTH``, an integer literal over
  Python's int-string limit (``ValueError``), anything that still exhausts the stack. The
  messages use only words of the Navigation vocabulary (``envs.navigation.vocab``).
  """
  too_deep = f"{what} is not valid JSON (more than {MAX_JSON_DEPTH} array or object one within another): {text[:200]!r}"
  if text.count("{") + text.count("[") > MAX_JSON_DEPTH and json_nesting_exceeds(text) is not None:
    return None, too_deep
  try:
    return json.loads(text), ""
  except json.JSONDecodeError as e:
    return None, f"{what} is not valid JSON ({e.msg} at char {e.pos}): {text[:200]!r}"
  except ValueError:  # int("9" * 5000): past sys.get_int_max_str_digits()
    return None, f"{what} is not valid JSON (an integer not within the int limit): {text[:200]!r}"
  except RecursionError:
    return None, too_deep


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One parsed call: ``name`` and a JSON-object ``arguments``."""

  name: str
  arguments: dict[str, Any]

  def to_json(self) -> str:
    return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
  """An assistant turn split into its visible text, its calls and its parse errors.

  ``content`` is the text outside ``<think>`` and ``<tool_call>`` blocks (the
  final answer when there are no calls). ``errors`` holds one human-readable
  message per malformed block; those blocks produce no ``ToolCall``.
  """

  content: str
  tool_calls: tuple[ToolCall, ...]
  errors: tuple[str, ...]

  @property
  def is_answer(self) -> bool:
    """A turn with no calls, no malformed blocks and some visible text."""
    return not self.tool_calls and not self.errors and bool(self.content.strip())


def parse_assistant_turn(text: str) -> ParsedTurn:
  """Splits ``text`` into tool calls, visible content and parse errors."""
  visible = strip_reasoning(text)
  # An unterminated <think> hides everything after it.
  if "<think>" in visible:
    visible = visible.split("<think>", 1)[0]
  calls: list[ToolCall] = []
  errors: list[str] = []
  for match in _TOOL_CALL_RE.finditer(visible):
    body = match.group(1).strip()
    call, error = _parse_call_body(body)
    if call is not None:
      calls.append(call)
    else:
      errors.append(error)
  content = _TOOL_CALL_RE.sub("", visible).strip()
  return ParsedTurn(content=content, tool_calls=tuple(calls), errors=tuple(errors))


def _parse_call_body(body: str) -> tuple[ToolCall | None, str]:
  if not body:
    return None, "empty <tool_call> block"
  obj, error = loads_json(body)
  if error:
    return None, error
  if not isinstance(obj, dict):
    return None, f"tool call must be a JSON object, got {type(obj).__name__}"
  name = obj.get("name")
  if not isinstance(name, str) or not name:
    return None, "tool call is missing a string 'name'"
  args = obj.get("arguments", {})
  if isinstance(args, str):  # Some models emit arguments as a JSON string.
    decoded, error = loads_json(args) if args.strip() else ({}, "")
    if error:
      return None, f"arguments of {name!r} are a string that is not JSON: {args[:200]!r}"
    args = decoded
  if not isinstance(args, dict):
    return None, f"arguments of {name!r} must be a JSON object, got {type(args).__name__}"
  return ToolCall(name=name, arguments=args), ""
