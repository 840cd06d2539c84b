"""SGLangHTTPBackend against a local server (127.0.0.1) that serves SGLang's native API subset
(/generate with input_ids / sampling_params / return_logprob / logprob_start_len, /health,
/update_weights_from_disk) on top of an in-process backend. A real SGLang server is verified
only on a GPU machine (see docs/gpu.md)."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from rti_jax.generation.base import SamplingParams
from rti_jax.generation.sglang_http import BackendUnavailableError, SGLangHTTPBackend, SGLangProtocolError
from intervention_doubles import BigramBackend


class FakeSGLang:
  """State of the fake server: the backend it serves, injected faults, and a request log."""

  def __init__(self, backend: Any) -> None:
    self.backend = backend
    self.fail_next = 0  # answer this many requests with HTTP 503 first
    self.malformed = False
    self.reload_ok = True
    self.reload_fn = lambda path: os.path.isfile(os.path.join(path, "weights.npy"))
    self.hits: list[str] = []
    self.reloaded: list[str] = []
    self.retry_after: str | None = None  # a Retry-After header on the 503s
    self.sleep_s = 0.0  # wait this long before answering a POST
    self.drip_s = 0.0  # send the body one byte per drip_s seconds
    self.mutate: Any = None  # items -> items, applied to /generate answers
    # A stock SGLang server reports log-probs after temperature scaling; with
    # SGLANG_RETURN_ORIGINAL_LOGPROB=1 it reports the temperature-1 ones (``original_logprobs``).
    self.original_logprobs = False
    self.model_info: dict[str, Any] | None = {"model_path": "/models/policy", "is_generation": True}
    self.context_length: int | None = 4096
    # A real server also stops on the model's generation-config EOS ids unless the request sets
    # ignore_eos (Qwen3: <|endoftext|> 151643, besides the <|im_end|> the client asks for); ids the
    # served model's vocabulary does not hold (the small test models) are left out, as no model has them.
    self.eos_token_ids: tuple[int, ...] = (151643,)

  def _eos(self) -> tuple[int, ...]:
    b = self.backend
    vocab = getattr(b, "vocab_size", None) or getattr(getattr(getattr(b, "sampler", None), "config", None), "vocab_size", None)
    return tuple(t for t in self.eos_token_ids if vocab is None or t < vocab)

  def generate(self, body: dict[str, Any]) -> list[dict[str, Any]]:
    ids = body["input_ids"]
    ids = [ids] if ids and isinstance(ids[0], int) else ids
    sps = body.get("sampling_params") or {}
    sps = sps if isinstance(sps, list) else [sps] * len(ids)
    starts = body.get("logprob_start_len", -1)
    starts = starts if isinstance(starts, list) else [starts] * len(ids)
    out = []
    for p, sp, start in zip(ids, sps, starts):
      meta: dict[str, Any] = {"prompt_tokens": len(p)}
      if start is not None and start >= 0:
        lp = self.backend.score([p[:1]], [p[1:]])[0]
        full = [None] + [float(x) for x in lp]
        meta["input_token_logprobs"] = [[full[j], p[j], None] for j in range(start, len(p))]
      n = sp.get("max_new_tokens", 16)
      if n == 0:
        meta.update(output_token_logprobs=[], finish_reason={"type": "length", "length": 0})
        out.append({"text": "", "output_ids": [], "meta_info": meta})
        continue
      params = SamplingParams(
        max_new_tokens=n,
        temperature=sp.get("temperature", 1.0),
        top_p=sp.get("top_p", 1.0),
        top_k=max(sp.get("top_k", -1), 0),
        stop_token_ids=tuple(sp.get("stop_token_ids", ())) + (() if sp.get("ignore_eos") else self._eos()),
      )
      c = self.backend.generate([p], params, sp.get("sampling_seed", 0))[0]
      lps = c.logprobs
      if not self.original_logprobs and params.temperature not in (0.0, 1.0) and hasattr(self.backend, "_logp"):
        prev = [int(p[-1]), *[int(t) for t in c.token_ids[:-1]]]
        lps = [self.backend._logp(a, params.temperature)[int(t)] for a, t in zip(prev, c.token_ids)]
      meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(lps, c.token_ids)]
      meta["finish_reason"] = {"type": c.finish_reason}
      if self.malformed:
        meta["output_token_logprobs"] = "oops"
      out.append({"text": "", "output_ids": [int(t) for t in c.token_ids], "meta_info": meta})
    return out


def _handler(state: FakeSGLang) -> type[BaseHTTPRequestHandler]:
  class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # keep test output quiet
      pass

    def _send(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
      data = json.dumps(obj).encode()
      self.send_response(code)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      for k, v in (headers or {}).items():
        self.send_header(k, v)
      self.end_headers()
      if state.drip_s and code == 200:
        try:
          for i in range(len(data)):
            self.wfile.write(data[i:i + 1])
            self.wfile.flush()
            time.sleep(state.drip_s)
        except (BrokenPipeError, ConnectionResetError):
          pass
        return
      self.wfile.write(data)

    def _fault(self) -> bool:
      state.hits.append(self.path)
      if state.fail_next > 0:
        state.fail_next -= 1
        self._send(503, {"error": "warming up"}, {"Retry-After": state.retry_after} if state.retry_after else None)
        return True
      return False

    def do_GET(self) -> None:
      if self._fault():
        return
      if self.path == "/health":
        self._send(200, {})
      elif self.path == "/get_model_info" and state.model_info is not None:
        self._send(200, state.model_info)
      elif self.path == "/model_info":
        self._send(200, state.model_info or {})
      elif self.path == "/get_server_info":
        self._send(200, {"context_length": state.context_length, "tp_size": 1})
      else:
        self._send(404, {"error": "no route"})

    def do_POST(self) -> None:
      if self._fault():
        return
      body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
      time.sleep(state.sleep_s)
      if self.path == "/generate":
        items = state.generate(body)
        self._send(200, state.mutate(items) if state.mutate else items)
      elif self.path == "/update_weights_from_disk":
        path = body["model_path"]
        ok = state.reload_ok and state.reload_fn(path)
        state.reloaded.append(path)
        # the real server answers a failed reload with HTTP 400
        self._send(200 if ok else 400, {"success": ok, "message": "loaded" if ok else "no checkpoint"})
      else:
        self._send(404, {"error": "no route"})

  return Handler


@pytest.fixture
def server():
  """Yields (state, url) of a fake SGLang server over a BigramBackend on 127.0.0.1."""
  state = FakeSGLang(BigramBackend(vocab_size=64, seed=3))
  httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
  thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)  # quick shutdown
  thread.start()
  yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
  httpd.shutdown()
  httpd.server_close()


def _client(url: str, **kw: Any) -> SGLangHTTPBackend:
  kw.setdefault("backoff_s", 0.01)
  kw.setdefault("timeout_s", 10.0)
  return SGLangHTTPBackend(url, **kw)


def test_generate_matches_the_served_backend(server):
  state, url = server
  state.original_logprobs = True  # a server started with SGLANG_RETURN_ORIGINAL_LOGPROB=1
  client = _client(url, send_seed=True)
  prompts = [[1, 2, 3], [5, 9], [7]]
  params = SamplingParams(max_new_tokens=12, temperature=0.9, stop_token_ids=(4,))
  got = client.generate(prompts, params, seed=11)
  for i, (p, c) in enumerate(zip(prompts, got)):
    ref = state.backend.generate([p], params, 11 + i)[0]
    np.testing.assert_array_equal(c.token_ids, ref.token_ids)
    np.testing.assert_allclose(c.logprobs, ref.logprobs, rtol=0, atol=1e-6)
    assert c.finish_reason == ref.finish_reason
  # Behaviour log-probs are temperature-1 log-probs of the served policy (independent re-derivation).
  c0 = got[0]
  seq = prompts[0] + c0.token_ids.tolist()
  W = state.backend.W
  manual = [W[seq[j - 1]][seq[j]] - np.log(np.exp(W[seq[j - 1]]).sum()) for j in range(len(prompts[0]), len(seq))]
  np.testing.assert_allclose(c0.logprobs, manual, atol=1e-5)
  # A stock server reports the temperature-0.9 log-probs of the same tokens instead.
  state.original_logprobs = False
  scaled = client.generate(prompts[:1], params, seed=11)[0]
  np.testing.assert_array_equal(scaled.token_ids, c0.token_ids)
  want = [(W[seq[j - 1]] / 0.9)[seq[j]] - np.log(np.exp(W[seq[j - 1]] / 0.9).sum()) for j in range(3, len(seq))]
  np.testing.assert_allclose(scaled.logprobs, want, atol=1e-5)


def test_score_matches_teacher_forcing(server):
  state, url = server
  client = _client(url)
  prompts, responses = [[1, 2, 3], [8], [4, 4]], [[5, 6, 7, 8], [2], []]
  got = client.score(prompts, responses)
  ref = state.backend.score(prompts, responses)
  assert [g.shape for g in got] == [(4,), (1,), (0,)]
  for g, r in zip(got, ref):
    np.testing.assert_allclose(g, r, atol=1e-6)
  with pytest.raises(ValueError, match="behaviour_logp=recompute"):  # prompt log-probs are at temperature 1
    client.score(prompts, responses, temperature=0.8)


def test_health_and_weight_sync(server, tmp_path):
  state, url = server
  client = _client(url, weights_dir=str(tmp_path / "w"))
  assert client.health()

  class Model:
    def save_pretrained(self, path: str) -> None:
      np.save(os.path.join(path, "weights.npy"), np.arange(3))

  client.sync_weights(Model())
  assert state.reloaded == [str(tmp_path / "w" / "policy")]
  (tmp_path / "w" / "policy" / "stale.bin").write_bytes(b"old shard")
  (tmp_path / "w" / "mine.txt").write_text("a file of the user's")
  client.sync_weights(Model())  # the same directory again, the previous checkpoint replaced
  assert state.reloaded == [str(tmp_path / "w" / "policy")] * 2
  assert sorted(os.listdir(tmp_path / "w" / "policy")) == ["weights.npy"]
  assert (tmp_path / "w" / "mine.txt").exists()
  state.reload_ok = False
  with pytest.raises(SGLangProtocolError, match="update_weights_from_disk: reload of .* failed.*HTTP 400"):
    client.sync_weights(Model())
  with pytest.raises(TypeError, match="save_pretrained"):
    client.sync_weights(object())


def test_transient_errors_are_retried_with_a_bound(server):
  state, url = server
  client = _client(url, max_retries=3)
  state.fail_next = 2
  assert client.score([[1, 2]], [[3]])[0].shape == (1,)
  assert state.hits.count("/generate") == 3
  state.fail_next = 10
  state.hits.clear()
  with pytest.raises(BackendUnavailableError, match=f"{url}/generate.*503"):
    client.score([[1, 2]], [[3]])
  assert state.hits.count("/generate") == 4  # 1 try + 3 retries


def test_unreachable_server_names_the_url():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}"
  client = _client(url, max_retries=1)
  assert not client.health()
  with pytest.raises(BackendUnavailableError, match=f"127.0.0.1:{port}/generate.*unreachable"):
    client.generate([[1]], SamplingParams(max_new_tokens=2), seed=0)


def test_malformed_answers_raise_protocol_errors(server):
  state, url = server
  client = _client(url)
  state.malformed = True
  with pytest.raises(SGLangProtocolError, match="output_token_logprobs"):
    client.generate([[1]], SamplingParams(max_new_tokens=2), seed=0)
  with pytest.raises(ValueError, match=r"prompts\[0\]"):
    client.generate([[]], SamplingParams(max_new_tokens=2), seed=0)
  with pytest.raises(ValueError, match="base_url"):
    SGLangHTTPBackend("localhost:30000")


def test_http_backend_over_the_jax_backend():
  """The same server API on top of the project's JAX sampler (tiny random Qwen3)."""
  from flax import nnx

  from models.config import QwenConfig
  from models.qwen import Qwen
  from rti_jax.generation.jax_backend import JaxBackend

  cfg = QwenConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1,
                   num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)
  backend = JaxBackend(Qwen(cfg, rngs=nnx.Rngs(0)), max_cache_len=64)
  state = FakeSGLang(backend)
  httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
  threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
  try:
    client = _client(f"http://127.0.0.1:{httpd.server_address[1]}")
    prompts = [[3, 4, 5], [9, 1, 2]]
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    got = client.generate(prompts, params, seed=0)
    for p, c in zip(prompts, got):
      ref = backend.generate([p], params, 0)[0]
      np.testing.assert_array_equal(c.token_ids, ref.token_ids)
      # The reported behaviour log-probs equal teacher-forced scores of the same tokens.
      np.testing.assert_allclose(c.logprobs, backend.score([p], [c.token_ids.tolist()])[0], atol=1e-5)
    scored = client.score(prompts, [c.token_ids.tolist() for c in got])
    for s, c in zip(scored, got):
      np.testing.assert_allclose(s, c.logprobs, atol=1e-5)

    # Weight sync: the client writes an HF checkpoint, the server reloads it from disk.
    from models.weights import from_pretrained
    from rti_jax.generation.jax_backend import qwen_save_fn

    def reload(path):  # what a real server does: load the checkpoint it was pointed at
      state.backend = JaxBackend(from_pretrained(path)[0], max_cache_len=64)
      return True

    state.reload_fn = reload
    new_model = Qwen(cfg, rngs=nnx.Rngs(7))
    reference = JaxBackend(new_model, max_cache_len=64)
    with tempfile.TemporaryDirectory() as d:
      sync_client = _client(client.base_url, weights_dir=d, save_fn=qwen_save_fn)
      sync_client.sync_weights(new_model)
      assert sorted(os.listdir(os.path.join(d, "policy"))) == ["config.json", "generation_config.json", "model.safetensors"]
    after = client.score(prompts, [c.token_ids.tolist() for c in got])
    expected = reference.score(prompts, [c.token_ids.tolist() for c in got])
    for a, e, before in zip(after, expected, scored):
      np.testing.assert_allclose(a, e, atol=1e-5)
      assert not np.allclose(a, before, atol=1e-3)
    backend.sync_weights(new_model)  # in-process sync: same architecture, new parameters
    for a, e in zip(backend.score(prompts, [c.token_ids.tolist() for c in got]), expected):
      np.testing.assert_allclose(a, e, atol=1e-5)
  finally:
    httpd.shutdown()
    httpd.server_close()


def test_a_dripping_body_is_cut_off_at_the_total_deadline(server):
  """Timeouts per read would let a body sent one byte at a time run forever; the deadline is total."""
  state, url = server
  state.drip_s = 0.05  # ~200 bytes of answer: 10 s at this rate
  client = _client(url, timeout_s=1.0, max_retries=2)
  t0 = time.monotonic()
  with pytest.raises(BackendUnavailableError, match=r"/generate did not answer within 1 s"):
    client.generate([[1, 2]], SamplingParams(max_new_tokens=4), seed=0)
  assert time.monotonic() - t0 < 3.0
  assert state.hits.count("/generate") == 1  # a POST the server took is not sent again


def test_a_slow_post_is_not_re_sent(server):
  state, url = server
  state.sleep_s = 1.5
  client = _client(url, timeout_s=0.5, max_retries=3)
  with pytest.raises(BackendUnavailableError, match="did not answer within"):
    client.update_weights_from_disk("/nowhere")
  time.sleep(1.2)  # let the server finish the one request it got
  assert state.hits.count("/update_weights_from_disk") == 1


def test_an_excessive_retry_after_is_capped(server):
  state, url = server
  state.fail_next, state.retry_after = 2, "3600"
  client = _client(url, max_retries=3, max_backoff_s=0.2)
  t0 = time.monotonic()
  assert client.score([[1, 2]], [[3]])[0].shape == (1,)
  assert time.monotonic() - t0 < 2.0
  assert client._backoff(1, "0.05") == pytest.approx(0.05) and client._backoff(3, "soon") == 0.04


def test_health_checks_have_a_short_default_deadline():
  client = SGLangHTTPBackend("http://127.0.0.1:1")
  assert client.health_timeout_s <= 10 and client.timeout_s * (client.max_retries + 1) <= 15 * 60


def _item_edit(fn):
  def mutate(items):
    for it in items:
      fn(it)
    return items
  return mutate


@pytest.mark.parametrize("mutate, field", [
    (lambda items: ["not a dict"] * len(items), "answer item must be a JSON object"),
    (lambda items: items[:0], "expected a list of 1 answer items"),
    (_item_edit(lambda it: it["meta_info"].update(output_token_logprobs=[[-0.1]])), r"output_token_logprobs\[0\]"),
    (_item_edit(lambda it: it["meta_info"].update(output_token_logprobs=[["x", 3, None]])), r"finite log-prob"),
    (_item_edit(lambda it: it["meta_info"].update(output_token_logprobs=[[0.7, 3, None]])), r"finite log-prob <= 0"),
    (_item_edit(lambda it: it["meta_info"].update(output_token_logprobs=[[float("nan"), 3, None]])), "finite"),
    (_item_edit(lambda it: it["meta_info"].update(output_token_logprobs=[[-0.1, -4, None]])), r"token id .* >= 0"),
    (_item_edit(lambda it: it["meta_info"].update(output_token_logprobs=[[-0.1, 2.5, None]])), r"token id"),
    (_item_edit(lambda it: it["meta_info"].update(output_token_logprobs=[[-0.1, True, None]])), r"token id"),
    (_item_edit(lambda it: (it["meta_info"].update(output_token_logprobs=[[-0.1, 3, None]] * 9),
                            it.pop("output_ids"))), "more than max_new_tokens=4"),
    (_item_edit(lambda it: it["meta_info"].update(finish_reason={"type": "abort"})), "finish_reason"),
    (_item_edit(lambda it: it.update(output_ids="123")), "output_ids"),
])
def test_every_answer_field_is_checked_before_it_reaches_a_batch(server, mutate, field):
  state, url = server
  state.mutate = mutate
  with pytest.raises(SGLangProtocolError, match=field):
    _client(url).generate([[1, 2]], SamplingParams(max_new_tokens=4), seed=0)


def test_weight_syncs_reuse_one_directory_of_their_own_and_close_removes_it(server):
  state, url = server
  client = _client(url)

  class Model:
    def save_pretrained(self, path: str) -> None:
      np.save(os.path.join(path, "weights.npy"), np.arange(3))

  for _ in range(3):
    client.sync_weights(Model())
  assert len(set(state.reloaded)) == 1
  root = os.path.dirname(state.reloaded[0])
  if os.access("/dev/shm", os.W_OK):
    assert root.startswith("/dev/shm/")
  client.close()
  assert not os.path.exists(root)


def test_the_log_prob_probe_refuses_a_server_that_scales_by_temperature(server):
  """A stock server (temperature-scaled log-probs) is refused; started with
  SGLANG_RETURN_ORIGINAL_LOGPROB=1 it passes, its log-probs equal the temperature-1 scores."""
  state, url = server
  client = _client(url, send_seed=True)
  with pytest.raises(SGLangProtocolError, match="SGLANG_RETURN_ORIGINAL_LOGPROB=1"):
    client.check_behaviour_logprobs([1, 2, 3])
  state.original_logprobs = True
  assert client.check_behaviour_logprobs([1, 2, 3]) < 1e-5
  with pytest.raises(ValueError, match="temperature"):
    client.check_behaviour_logprobs([1], temperature=1.0)


def test_the_start_up_handshake_checks_model_and_context_length(server):
  state, url = server
  client = _client(url)
  got = client.check_server(max_context=4096, model_path="/models/policy/")
  assert got["server_info"]["context_length"] == 4096
  with pytest.raises(SGLangProtocolError, match="context_length 4096 is shorter than rollout.max_context=8192"):
    client.check_server(max_context=8192)
  with pytest.raises(SGLangProtocolError, match="serves '/models/policy', expected '/models/other'"):
    client.check_server(max_context=16, model_path="/models/other")
  state.model_info = {"model_path": "/m", "is_generation": False}
  with pytest.raises(SGLangProtocolError, match="not a generation model"):
    client.check_server(max_context=16)
  state.model_info, state.context_length = None, None  # an older server: /model_info, no context length
  assert client.check_server(max_context=10**6)["model_info"] == {}


def test_aborted_items_are_asked_for_again_once(server):
  state, url = server
  state.original_logprobs = True
  calls = []

  def abort_second_once(items):
    calls.append(len(items))
    if len(calls) == 1:
      items[1]["meta_info"]["finish_reason"] = {"type": "abort", "message": "out of memory"}
    return items

  state.mutate = abort_second_once
  client = _client(url, send_seed=True)
  prompts, params = [[1, 2], [5, 9], [7]], SamplingParams(max_new_tokens=4, temperature=0.9)
  got = client.generate(prompts, params, seed=3)
  assert calls == [3, 1]  # the batch, then the aborted item alone
  assert [c.finish_reason for c in got] == ["length"] * 3
  state.mutate = _item_edit(lambda it: it["meta_info"].update(finish_reason={"type": "abort"}))
  with pytest.raises(SGLangProtocolError, match="finish_reason"):
    client.generate(prompts, params, seed=3)
