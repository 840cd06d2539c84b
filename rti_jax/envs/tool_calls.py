"""Parsing Qwen-style tool calls out of assistant text.

Qwen chat templates put each call in its own block::

    <tool_call>
    {"name": "poi_search", "arguments": {"address": "Dajin Park"}}
    </tool_call>

Several blocks in one assistant turn are parallel calls. Anything that cannot be
parsed is reported in ``ParsedTurn.errors`` (never raised), so an environment can
answer malformed model output with an error observation and count it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)


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
  visible = _THINK_RE.sub("", text)
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
  try:
    obj = json.loads(body)
  except json.JSONDecodeError as e:
    return None, f"tool call is not valid JSON ({e.msg} at char {e.pos}): {body[:200]!r}"
  if not isinstance(obj, dict):
    return None, f"tool call must be a JSON object, got {type(obj).__name__}"
  name = obj.get("name")
  if not isinstance(name, str) or not name:
    return None, "tool call is missing a string 'name'"
  args = obj.get("arguments", {})
  if isinstance(args, str):  # Some models emit arguments as a JSON string.
    try:
      args = json.loads(args) if args.strip() else {}
    except json.JSONDecodeError:
      return None, f"arguments of {name!r} are a string that is not JSON: {args[:200]!r}"
  if not isinstance(args, dict):
    return None, f"arguments of {name!r} must be a JSON object, got {type(args).__name__}"
  return ToolCall(name=name, arguments=args), ""
