"""JSON over HTTP with one total deadline per request and bounded retries: the plumbing shared by
the SGLang backend (``sglang_http``) and the OpenAI-compatible chat client (``openai_chat``).

Every request has one total deadline (connect, headers and body together: a server that drips its
body byte by byte is cut off). A request that could not connect, or was answered 5xx / 429, is tried
again at most ``max_retries`` times with capped exponential backoff (a server's ``Retry-After`` is
not obeyed beyond ``max_backoff_s``); a POST whose answer did not arrive in time is not sent again
(the server may still be running it). After that a ``BackendUnavailableError`` names the server
and the URL. A 4xx answer or a body that is not JSON raises the client's protocol error, naming the
URL.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import requests


class BackendUnavailableError(RuntimeError):
  """The server could not be reached, or did not answer in time (after all retries)."""


class ServerProtocolError(RuntimeError):
  """The server answered, but not with what its API promises."""


class HTTPJSONClient:
  """``base_url`` plus the request plumbing; ``label`` names the server in errors ("SGLang server",
  "user simulator", ...) and ``protocol_error`` is the exception raised for a 4xx or unreadable
  answer."""

  label = "server"
  protocol_error: type[Exception] = ServerProtocolError

  def __init__(self, base_url: str, *, timeout_s: float = 300.0, health_timeout_s: float = 5.0,
               max_retries: int = 2, backoff_s: float = 0.5, max_backoff_s: float = 5.0) -> None:
    if not (isinstance(base_url, str) and base_url.startswith(("http://", "https://"))):
      raise ValueError(f"base_url: expected 'http://host:port', got {base_url!r}")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
      raise ValueError(f"max_retries: expected an integer >= 0, got {max_retries!r}")
    for name, value in (("timeout_s", timeout_s), ("health_timeout_s", health_timeout_s)):
      if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a finite number of seconds > 0, got {value}")
    self.base_url = base_url.rstrip("/")
    self.timeout_s = timeout_s
    self.health_timeout_s = health_timeout_s
    self.max_retries = max_retries
    self.backoff_s = backoff_s
    self.max_backoff_s = max_backoff_s
    self.session = requests.Session()

  def _request(self, method: str, path: str, payload: dict[str, Any] | None = None,
               timeout_s: float | None = None) -> tuple[int, bytes]:
    """``(status, body)`` of one request under one total deadline, with bounded retries."""
    url = f"{self.base_url}{path}"
    budget = self.timeout_s if timeout_s is None else timeout_s
    last = ""
    last_retry_after = None
    for attempt in range(self.max_retries + 1):
      if attempt:
        time.sleep(self._backoff(attempt, last_retry_after))
      last_retry_after = None
      try:
        status, body, headers = self._once(method, url, payload, budget)
      except _Deadline as e:  # the server took the request: re-sending could run it twice
        raise BackendUnavailableError(f"{self.label} at {url} did not answer within {budget:g} s: {e}") from None
      except requests.ConnectionError as e:
        last = f"unreachable: {e.__class__.__name__}: {e}"
        continue
      if status >= 500 or status == 429:
        last = f"HTTP {status}: {body[:300]!r}"
        last_retry_after = headers.get("Retry-After")
        continue
      if status >= 400:
        raise self.protocol_error(f"{url}: HTTP {status}: {body[:300]!r}")
      return status, body
    raise BackendUnavailableError(f"{self.label} at {url} failed after {self.max_retries} retries; last: {last}")

  def _backoff(self, attempt: int, retry_after: str | None) -> float:
    wait = self.backoff_s * 2 ** (attempt - 1)
    try:
      if retry_after is not None:
        wait = max(wait, float(retry_after))
    except ValueError:  # an HTTP date or garbage: our own backoff
      pass
    return min(max(wait, 0.0), self.max_backoff_s)

  def _once(self, method: str, url: str, payload: dict[str, Any] | None, budget: float
            ) -> tuple[int, bytes, Any]:
    """One try: the connection, the headers and the whole body must arrive before the deadline."""
    deadline = time.monotonic() + budget
    try:
      resp = self.session.request(method, url, json=payload, timeout=(min(budget, 10.0), budget), stream=True)
    except requests.Timeout as e:
      if isinstance(e, requests.ConnectTimeout):
        raise requests.ConnectionError(str(e)) from None
      raise _Deadline("no answer") from None
    try:
      chunks = []
      while True:
        left = deadline - time.monotonic()
        if left <= 0:
          raise _Deadline("the body did not arrive in time")
        sock = _socket_of(resp)
        if sock is not None:
          sock.settimeout(left)
        try:
          chunk = resp.raw.read1(65536)
        except Exception as e:  # urllib3 / socket timeouts and resets while reading the body
          if time.monotonic() >= deadline or "timed out" in str(e).lower():
            raise _Deadline("the body did not arrive in time") from None
          raise requests.ConnectionError(f"{e.__class__.__name__}: {e}") from None
        if not chunk:
          break
        chunks.append(chunk)
      return resp.status_code, b"".join(chunks), resp.headers
    finally:
      resp.close()

  def _post_json(self, path: str, payload: dict[str, Any]) -> Any:
    _, body = self._request("POST", path, payload)
    return self._json(path, body)

  def _json(self, path: str, body: bytes) -> Any:
    try:
      return json.loads(body)
    except (ValueError, RecursionError) as e:
      raise self.protocol_error(f"{self.base_url}{path}: body is not JSON: {body[:300]!r}") from e

  def close(self) -> None:
    self.session.close()


class _Deadline(Exception):
  """A request's total deadline passed after the server had it."""


def _socket_of(resp: requests.Response) -> Any:
  """The socket under a streamed response (to bound each read by the time left), if reachable."""
  fp = getattr(resp.raw, "_fp", None)
  fp = getattr(fp, "fp", None)
  raw = getattr(fp, "raw", None)
  return getattr(raw, "_sock", None)
