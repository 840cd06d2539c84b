"""A chat model behind an OpenAI-compatible ``/chat/completions`` endpoint (an SGLang or vLLM
server's ``/v1``), for the parts of an episode that are not the policy: an LLM user simulator.

Requests go through ``http_json.HTTPJSONClient`` (one total deadline per request, bounded retries,
then ``BackendUnavailableError`` naming the server). Every answer is checked before its text is
used: ``choices[0].message.content`` must be a string (``null`` only with tool calls, which a chat
partner must not make); anything else is a ``ChatProtocolError`` naming the URL and the field. A
thinking model's ``<think>...</think>`` block is removed from the text (a block that never closes
leaves nothing).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from rti_jax.generation.http_json import BackendUnavailableError, HTTPJSONClient, ServerProtocolError

__all__ = ["BackendUnavailableError", "ChatProtocolError", "OpenAIChatClient", "strip_thinking"]

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


class ChatProtocolError(ServerProtocolError):
  """The chat server answered, but not with an OpenAI chat completion."""


def strip_thinking(text: str) -> str:
  """``text`` without ``<think>...</think>`` blocks (an unclosed block runs to the end), and a stray
  ``</think>`` prefix (servers that open the block inside the chat template)."""
  if "</think>" in text and "<think>" not in text.split("</think>", 1)[0]:
    text = text.split("</think>", 1)[1]
  return _THINK.sub("", text).strip()


class OpenAIChatClient(HTTPJSONClient):
  """``complete(messages)`` -> the assistant's text, from ``POST {base_url}/chat/completions``.

  base_url: the API root, e.g. ``http://127.0.0.1:30001/v1``. model: the served model's name.
  label: how errors name this server (e.g. "user simulator").
  """

  protocol_error = ChatProtocolError

  def __init__(self, base_url: str, model: str = "default", *, label: str = "chat server",
               timeout_s: float = 120.0, max_retries: int = 2, backoff_s: float = 0.5,
               max_backoff_s: float = 5.0) -> None:
    super().__init__(base_url, timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                     max_backoff_s=max_backoff_s)
    if not (isinstance(model, str) and model.strip()):
      raise ValueError(f"model: expected a non-empty model name, got {model!r}")
    self.model = model
    self.label = label

  def complete(self, messages: Sequence[dict[str, str]], *, temperature: float = 0.0,
               max_tokens: int | None = None, seed: int | None = None) -> str:
    body: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages],
                            "temperature": float(temperature), "stream": False}
    if max_tokens is not None:
      body["max_tokens"] = int(max_tokens)
    if seed is not None:
      body["seed"] = int(seed)
    return strip_thinking(parse_chat_completion(self._post_json("/chat/completions", body),
                                                f"{self.base_url}/chat/completions"))


def parse_chat_completion(answer: Any, url: str) -> str:
  """The assistant text of an OpenAI chat completion, every field on the way checked."""
  def bad(field: str, got: Any) -> ChatProtocolError:
    return ChatProtocolError(f"{url}: {field}: expected {got}")

  if not isinstance(answer, dict):
    raise bad("answer", f"a JSON object, got {type(answer).__name__}")
  if "error" in answer and "choices" not in answer:
    raise ChatProtocolError(f"{url}: the server answered with an error: {str(answer['error'])[:300]}")
  choices = answer.get("choices")
  if not isinstance(choices, list) or not choices:
    raise bad("choices", f"a non-empty list, got {str(choices)[:80]}")
  choice = choices[0]
  message = choice.get("message") if isinstance(choice, dict) else None
  if not isinstance(message, dict):
    raise bad("choices[0].message", f"an object, got {str(message)[:80]}")
  if message.get("tool_calls"):
    raise bad("choices[0].message.tool_calls", "none (a chat partner has no tools)")
  content = message.get("content")
  if not isinstance(content, str):
    raise bad("choices[0].message.content", f"a string, got {type(content).__name__}")
  return content
