"""A stand-in for an OpenAI-compatible chat server (SGLang's ``/v1/chat/completions``), on
127.0.0.1, answering as SGLang's OpenAI server does: ``{"id", "object": "chat.completion",
"created", "model", "choices": [{"index", "message": {"role", "content", "reasoning_content",
"tool_calls"}, "logprobs", "finish_reason", "matched_stop"}], "usage"}``.

``reply(messages) -> str`` writes the assistant text. Faults for the tests: ``hang_s`` (the server
sits on the request), ``garbage`` (a body to send instead, bytes or a JSON value), ``fail_next`` (that
many 503 answers first) and ``stop()`` (the server goes away).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class ChatServer:
  def __init__(self, reply: Callable[[list[dict[str, Any]]], str]) -> None:
    self.reply = reply
    self.requests: list[dict[str, Any]] = []
    self.hang_s = 0.0
    self.garbage: Any = None
    self.fail_next = 0
    self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
    self._httpd.daemon_threads = True
    self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    self._thread.start()
    self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

  def stop(self) -> None:
    self._httpd.shutdown()
    self._httpd.server_close()

  def answer(self, body: dict[str, Any]) -> dict[str, Any]:
    text = self.reply(body["messages"])
    return {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "default"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                                 "tool_calls": None},
                         "logprobs": None, "finish_reason": "stop", "matched_stop": 151645}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def _handler(state: ChatServer) -> type[BaseHTTPRequestHandler]:
  class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
      pass

    def _send(self, code: int, data: bytes) -> None:
      try:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
      except (BrokenPipeError, ConnectionResetError):
        pass

    def do_POST(self) -> None:
      body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
      state.requests.append(body)
      if state.fail_next > 0:
        state.fail_next -= 1
        return self._send(503, b'{"error": "overloaded"}')
      if state.hang_s:
        time.sleep(state.hang_s)
      if self.path != "/v1/chat/completions":
        return self._send(404, b'{"detail": "Not Found"}')
      if state.garbage is not None:
        g = state.garbage
        return self._send(200, g if isinstance(g, bytes) else json.dumps(g).encode())
      self._send(200, json.dumps(state.answer(body)).encode())

  return Handler
