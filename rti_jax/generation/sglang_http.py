"""SGLang over HTTP: the native ``/generate`` API with token ids in and per-token log-probs out.

SGLang is never imported: this module speaks its HTTP API with ``requests``. The
subset used (field names as documented for SGLang's native API; verified against a
real server only on a GPU machine, see the README):

* ``POST /generate`` with ``input_ids`` (a batch, ``[[int]]``), ``sampling_params``
  (one dict per prompt), ``return_logprob: true`` and ``logprob_start_len``. Each
  answer item carries ``meta_info.output_token_logprobs`` (``[[logprob, token_id,
  text|null], ...]``), ``meta_info.input_token_logprobs`` (same layout, for
  prompt positions from ``logprob_start_len`` on; the very first prompt token has
  a ``null`` log-prob) and ``meta_info.finish_reason.type`` (``"stop"`` or
  ``"length"``).
* ``GET /health``: 200 when the server is up.
* ``POST /update_weights_from_disk`` with ``model_path``: reloads weights written by
  ``save_pretrained``; answers ``{"success": bool, "message": str}``.

To check on a real server (GPU machine): that ``output_token_logprobs`` are the policy's
temperature-1 log-probs (the behaviour log-probs the loss needs; if the server reports
post-temperature values, sample at temperature 1 or recompute them with ``score``),
that the matched stop token is included in ``output_token_logprobs``, and that
``max_new_tokens = 0`` scoring requests are accepted.

Deadlines and retries are ``http_json.HTTPJSONClient``'s: one total deadline per request, bounded
retries on connection errors and 5xx / 429, a timed-out POST never re-sent, then a
``BackendUnavailableError`` naming the URL. A 4xx answer or a malformed body raises
``SGLangProtocolError`` naming the URL and the field: every answer is checked (types, finite
log-probs <= 0, non-negative integer token ids, at most ``max_new_tokens`` tokens) before
anything reaches a batch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable, Sequence

import numpy as np

from rti_jax.generation.base import Completion, SamplingParams
from rti_jax.generation.http_json import HTTPJSONClient
from rti_jax.generation.sglang_protocol import (BackendUnavailableError, SGLangProtocolError, _aborted,
                                                 _logprob, _triples, parse_generate_item,
                                                 sampling_params_to_sglang)


def save_with_save_pretrained(model: Any, path: str) -> None:
  """Default weight writer: ``model.save_pretrained(path)`` (HF layout, safetensors)."""
  save = getattr(model, "save_pretrained", None)
  if not callable(save):
    raise TypeError(
      f"model: expected an object with save_pretrained(path) or a save_fn, got {type(model).__name__}"
    )
  save(path)


class SGLangHTTPBackend(HTTPJSONClient):
  """A ``GenerationBackend`` served by an SGLang server over HTTP.

  base_url: e.g. ``http://127.0.0.1:30000``.
  timeout_s: the total deadline of one generation / scoring / reload request (connect, headers
    and body); health checks use ``health_timeout_s``.
  max_retries / backoff_s / max_backoff_s: bounded retries on connection errors and 5xx / 429
    answers, sleeping ``min(backoff_s * 2**(attempt-1), max_backoff_s)`` (a ``Retry-After``
    header is honoured only up to ``max_backoff_s``); a POST that timed out is not re-sent.
  weights_dir: where ``sync_weights`` writes the policy (default: one directory made on first use,
    in ``/dev/shm`` where possible, reused by every sync and removed by ``close``).
  save_fn: ``save_fn(model, path)`` writes an HF checkpoint; default
    ``model.save_pretrained(path)``.
  """

  label = "SGLang server"
  protocol_error = SGLangProtocolError

  def __init__(
    self,
    base_url: str,
    *,
    timeout_s: float = 300.0,
    health_timeout_s: float = 5.0,
    max_retries: int = 2,
    backoff_s: float = 0.5,
    max_backoff_s: float = 5.0,
    weights_dir: str | None = None,
    save_fn: Callable[[Any, str], None] = save_with_save_pretrained,
    send_seed: bool = False,
  ) -> None:
    super().__init__(base_url, timeout_s=timeout_s, health_timeout_s=health_timeout_s,
                     max_retries=max_retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s)
    self.weights_dir = weights_dir
    self._own_weights_dir: str | None = None
    self.save_fn = save_fn
    self.send_seed = send_seed

  # -- health ------------------------------------------------------------------

  def health(self) -> bool:
    """True when ``GET /health`` answers 200 (no exception when the server is down)."""
    try:
      return self._request("GET", "/health", timeout_s=self.health_timeout_s)[0] == 200
    except (BackendUnavailableError, SGLangProtocolError):
      return False

  def check_health(self) -> None:
    """Raises ``BackendUnavailableError`` naming the URL unless the server is healthy."""
    if not self.health():
      raise BackendUnavailableError(f"SGLang server at {self.base_url}/health is not healthy or unreachable")

  # -- GenerationBackend -----------------------------------------------------------

  def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int) -> list[Completion]:
    """Samples one completion per prompt in a single batched ``/generate`` call."""
    if not prompts:
      return []
    for i, p in enumerate(prompts):
      if len(p) == 0:
        raise ValueError(f"prompts[{i}]: expected a non-empty list of token ids, got []")
    sp = [
      sampling_params_to_sglang(params, seed + i if self.send_seed else None) for i in range(len(prompts))
    ]
    body = {
      "input_ids": [[int(t) for t in p] for p in prompts],
      "sampling_params": sp,
      "return_logprob": True,
      "logprob_start_len": -1,
    }
    items = self._as_batch(self._post_json("/generate", body), len(prompts), "/generate")
    aborted = [i for i, it in enumerate(items) if _aborted(it)]
    if aborted:  # the server aborted some items (e.g. under memory pressure): ask again for those only
      again = {k: [v[i] for i in aborted] if k in ("input_ids", "sampling_params") else v for k, v in body.items()}
      for i, it in zip(aborted, self._as_batch(self._post_json("/generate", again), len(aborted), "/generate")):
        items[i] = it
    return [parse_generate_item(it, f"{self.base_url}/generate", params.max_new_tokens) for it in items]

  def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
            temperature: float = 1.0) -> list[np.ndarray]:
    """Per-token log-probs ``[len(response)]`` of each response given its prompt.

    Sends prompt+response with ``max_new_tokens=0`` and reads the prompt log-probs
    from ``logprob_start_len = len(prompt) - 1`` on; the last ``len(response)``
    entries are the response's. A server's prompt log-probs are the policy's own, so only
    ``temperature`` 1 is served (ValueError otherwise).
    """
    if temperature != 1.0:
      raise ValueError(f"temperature={temperature!r}: SGLang's prompt log-probs are at temperature 1; train with "
                       "loss.behaviour_logp=recompute to take the ratio at another temperature")
    if len(prompts) != len(responses):
      raise ValueError(f"responses: expected {len(prompts)} (one per prompt), got {len(responses)}")
    out: list[np.ndarray | None] = [None] * len(prompts)
    todo = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
      if len(p) == 0:
        raise ValueError(f"prompts[{i}]: expected a non-empty list of token ids, got []")
      if len(r) == 0:
        out[i] = np.zeros((0,), np.float32)
      else:
        todo.append(i)
    if todo:
      body = {
        "input_ids": [[int(t) for t in prompts[i]] + [int(t) for t in responses[i]] for i in todo],
        "sampling_params": [{"max_new_tokens": 0, "temperature": 1.0} for _ in todo],
        "return_logprob": True,
        "logprob_start_len": [max(len(prompts[i]) - 1, 0) for i in todo],
      }
      url = f"{self.base_url}/generate"
      items = self._as_batch(self._post_json("/generate", body), len(todo), "/generate")
      for i, item in zip(todo, items):
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
          raise SGLangProtocolError(f"{url}: score answer item has no meta_info dict")
        triples = _triples(meta, "input_token_logprobs", url)
        n = len(responses[i])
        tail = triples[-n:]
        if len(tail) != n or any(t[0] is None for t in tail):
          raise SGLangProtocolError(
            f"{url}: input_token_logprobs has {len(triples)} entries, expected >= {n} non-null ones for prompt {i}"
          )
        if [t[1] for t in tail] != [int(t) for t in responses[i]]:
          raise SGLangProtocolError(f"{url}: input_token_logprobs token ids do not match response {i}")
        out[i] = np.asarray([_logprob(t[0], f"meta_info.input_token_logprobs[{j}][0]", url)
                             for j, t in enumerate(tail)], dtype=np.float32)
    return [o for o in out]  # type: ignore[misc]

  def _get_json(self, *paths: str) -> Any:
    """The JSON of the first of ``paths`` the server has (older and newer servers name routes differently)."""
    for path in paths:
      try:
        _, body = self._request("GET", path, timeout_s=self.health_timeout_s * 2)
      except SGLangProtocolError as e:
        if "HTTP 404" in str(e) and path != paths[-1]:
          continue
        raise
      return self._json(path, body)
    raise AssertionError("unreachable")

  def check_server(self, *, max_context: int, model_path: str | None = None) -> dict[str, Any]:
    """The start-up handshake: the server serves a generation model (``/get_model_info``), the one
    at ``model_path`` when given, and its context length (``/get_server_info``'s ``context_length``,
    when the server reports one) holds ``max_context`` tokens. Returns both answers."""
    info = self._get_json("/get_model_info", "/model_info")
    if not isinstance(info, dict):
      raise SGLangProtocolError(f"{self.base_url}/get_model_info: expected a JSON object, got {type(info).__name__}")
    if info.get("is_generation") is False:
      raise SGLangProtocolError(f"{self.base_url}: the server's model {info.get('model_path')!r} is not a "
                                "generation model")
    if model_path is not None and os.path.normpath(str(info.get("model_path"))) != os.path.normpath(model_path):
      raise SGLangProtocolError(f"{self.base_url}: the server serves {info.get('model_path')!r}, expected "
                                f"{model_path!r}")
    server = self._get_json("/get_server_info", "/server_info")
    context = server.get("context_length") if isinstance(server, dict) else None
    if context is not None:
      if isinstance(context, bool) or not isinstance(context, int):
        raise SGLangProtocolError(f"{self.base_url}/get_server_info: context_length must be an integer, got "
                                  f"{context!r:.80}")
      if context < max_context:
        raise SGLangProtocolError(f"{self.base_url}: the server's context_length {context} is shorter than "
                                  f"rollout.max_context={max_context}; start it with --context-length {max_context}")
    return {"model_info": info, "server_info": server}

  def check_behaviour_logprobs(self, prompt: Sequence[int], *, temperature: float = 2.0, tokens: int = 16,
                               atol: float = 0.05, seed: int = 0) -> float:
    """Checks that ``/generate`` reports the policy's temperature-1 log-probs, which the loss uses as
    the behaviour log-probs; returns the mean absolute difference.

    Samples ``tokens`` tokens at ``temperature`` (far from 1, so that temperature-scaled values
    differ clearly), scores the same tokens with ``score`` (a prefill at temperature 1) and raises
    ``SGLangProtocolError`` if the two disagree by more than ``atol`` nats on average. A stock
    server reports log-probs after temperature scaling; start it with
    ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` in its environment.
    """
    if temperature == 1.0:
      raise ValueError("temperature: the probe needs a temperature other than 1")
    out = self.generate([list(prompt)], SamplingParams(max_new_tokens=tokens, temperature=temperature), seed)[0]
    if len(out.token_ids) == 0:
      raise SGLangProtocolError(f"{self.base_url}/generate: the log-prob probe generated no tokens")
    ref = self.score([list(prompt)], [out.token_ids.tolist()])[0]
    diff = float(np.mean(np.abs(out.logprobs - ref)))
    if not diff <= atol:
      raise SGLangProtocolError(
        f"{self.base_url}/generate reports log-probs that differ from the temperature-1 scores of the same "
        f"tokens by {diff:.3f} nats on average (at temperature {temperature:g}): the server returns "
        f"temperature-scaled log-probs. Start it with SGLANG_RETURN_ORIGINAL_LOGPROB=1 so the importance "
        f"ratios use the behaviour policy's log-probs.")
    return diff

  def sync_weights(self, model: Any) -> None:
    """Writes ``model`` with ``save_fn`` into the one weights directory and asks the server to reload it.

    The checkpoint goes to ``policy/`` inside ``weights_dir``, or inside a directory made on first
    use (under ``/dev/shm`` where it is writable: the checkpoint never touches the disk), reused by
    every later sync; the previous checkpoint there is removed before each write, so syncs never
    pile up. ``close()`` removes a
    directory the backend made.
    """
    path = self._weights_path()
    for entry in os.listdir(path):  # the previous sync's files: a shard count may change
      full = os.path.join(path, entry)
      shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)
    self.save_fn(model, path)
    self.update_weights_from_disk(path)

  def _weights_path(self) -> str:
    """``<weights_dir or a directory of its own>/policy``: only this subdirectory is ever cleared."""
    if self.weights_dir is not None:
      root = self.weights_dir
    else:
      if self._own_weights_dir is None:
        shm = "/dev/shm"
        base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
        self._own_weights_dir = tempfile.mkdtemp(prefix="rti_sglang_weights_", dir=base)
      root = self._own_weights_dir
    path = os.path.join(root, "policy")
    os.makedirs(path, exist_ok=True)
    return path

  def close(self) -> None:
    """Closes the HTTP session and removes the weights directory the backend made (if any)."""
    super().close()
    if self._own_weights_dir is not None:
      shutil.rmtree(self._own_weights_dir, ignore_errors=True)
      self._own_weights_dir = None

  def update_weights_from_disk(self, model_path: str) -> None:
    """``POST /update_weights_from_disk``; raises ``SGLangProtocolError`` unless ``success`` (a real
    server answers a failed reload with HTTP 400 and ``{"success": false, "message": ...}``)."""
    try:
      ans = self._post_json("/update_weights_from_disk", {"model_path": model_path})
    except SGLangProtocolError as e:
      raise SGLangProtocolError(f"{self.base_url}/update_weights_from_disk: reload of {model_path!r} failed: {e}") from None
    if not isinstance(ans, dict) or ans.get("success") is not True:
      raise SGLangProtocolError(
        f"{self.base_url}/update_weights_from_disk: reload of {model_path!r} failed: {ans!r}"
      )

  # -- helpers -------------------------------------------------------------------

  def _as_batch(self, items: Any, n: int, path: str) -> list[dict[str, Any]]:
    if isinstance(items, dict) and n == 1:
      items = [items]
    if not isinstance(items, list) or len(items) != n:
      got = len(items) if isinstance(items, list) else type(items).__name__
      raise SGLangProtocolError(f"{self.base_url}{path}: expected a list of {n} answer items, got {got}")
    return items


