"""A generation server that dies or starts answering garbage in the middle of an iteration.

A short GRPO training generates through the SGLang HTTP backend against the stand-in server of
``test_sglang_http`` (the project's JAX sampler behind SGLang's API, reloading the checkpoints the
trainer writes, as a real server does). Part-way through the third iteration's rollouts the server
either goes away (its socket closed: connections refused) or answers with malformed items. The run
must stop with an error naming the server, after the client's bounded retries; keep only the
iterations it finished (the checkpoint of iteration 2, two metrics lines: the broken iteration's
batch is discarded); and a restart against a healthy server at the same address must resume to the
uninterrupted run's records exactly.
"""

from __future__ import annotations

import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from models.chat import build_tiny_tokenizer
from models.weights import from_pretrained
from rti_jax import reporting
from rti_jax.config import load_config
from rti_jax.generation.jax_backend import JaxBackend
from rti_jax.generation.sglang_protocol import BackendUnavailableError, SGLangProtocolError
from rti_jax.trainer import Trainer
from test_resume_kill import _strip, toy_source
from test_sglang_http import FakeSGLang, _handler
from trainer_fixtures import WORDS, write_random_qwen



class Server:
  """The stand-in SGLang server over the JAX sampler; ``stop()`` closes its socket, ``start()``
  opens it again at the same address."""

  def __init__(self, policy: str) -> None:
    self.state = FakeSGLang(JaxBackend(from_pretrained(policy)[0], max_cache_len=128))
    self.state.reload_fn = self._reload
    self.fault_after: int | None = None  # /generate calls answered before the fault
    self.fault = ""
    self.generates = 0
    real = self.state.generate

    def generate(body):
      self.generates += 1
      if self.fault_after is not None and self.generates > self.fault_after:
        if self.fault == "dies":
          threading.Thread(target=self.stop).start()
          raise ConnectionAbortedError  # the handler thread ends without an answer
        items = real(body)
        for it in items:
          it["meta_info"]["output_token_logprobs"] = [[0.5, 3, None]]  # a log-prob above 0
        return items
      return real(body)

    self.state.generate = generate
    self.port = 0
    self.start()

  def _reload(self, path: str) -> bool:
    self.state.backend = JaxBackend(from_pretrained(path)[0], max_cache_len=128)
    return True

  def start(self) -> None:
    self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self.state))
    self.port = self.httpd.server_address[1]
    threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()

  def stop(self) -> None:
    self.httpd.shutdown()
    self.httpd.server_close()

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"


def config(policy: str, url: str):
  return load_config("navigation", [
      f"policy.path={policy}", "loss.method=grpo", "rollout.tasks_per_iter=2", "rollout.group_size=4",
      "rollout.max_new_tokens=6", "rollout.max_context=128", "train.iterations=4", "train.checkpoint_every=2",
      "optim.lr=0.01", "train.eval_every=100", "train.val_tasks=0", "rollout.backend=sglang",
      f"rollout.sglang_url={url}", "loss.behaviour_logp=recompute"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The policy, the uninterrupted run's records and the /generate calls of its first two iterations."""
  path = tmp_path_factory.mktemp("policy")
  tok = build_tiny_tokenizer(WORDS, path)
  policy = write_random_qwen(path, len(tok), seed=0, layers=1, heads=2, kv_heads=1, head_dim=8, max_positions=256)
  server = Server(policy)
  try:
    trainer = Trainer(config(policy, server.url), tmp_path_factory.mktemp("full"), source=toy_source(), progress=False)
    trainer.train(stop_after=2)
    first_two = server.generates
    records = trainer.train()
  finally:
    server.stop()
  assert [r["iteration"] for r in records] == [1, 2, 3, 4]
  return policy, _strip(records), first_two


@pytest.mark.parametrize("fault,error", [("dies", BackendUnavailableError), ("garbage", SGLangProtocolError)])
def test_a_failing_server_stops_the_run_and_a_restart_resumes_exactly(reference, tmp_path, fault, error):
  policy, full, first_two = reference
  server = Server(policy)
  server.fault, server.fault_after = fault, first_two  # iteration 3 starts, its rollouts fail
  run_dir = tmp_path / "run"
  t0 = time.monotonic()
  with pytest.raises(error, match=rf"{server.url}") as info:
    Trainer(config(policy, server.url), run_dir, source=toy_source(), progress=False).train()
  assert time.monotonic() - t0 < 120
  if fault == "dies":
    assert "SGLang server at" in str(info.value) and "failed after 2 retries" in str(info.value)
  else:
    assert "output_token_logprobs" in str(info.value)
  # Only what iterations 1 and 2 finished is on disk: iteration 3's batch never reached an update.
  assert [r["iteration"] for r in reporting.read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]
  assert sorted(p.name for p in (run_dir / "ckpt").iterdir() if p.name.isdigit()) == ["2"]
  # The server is back (same address, healthy): the same command resumes to the uninterrupted records.
  server.fault_after = None
  if fault == "dies":
    server.start()
  try:
    resumed = Trainer(config(policy, server.url), run_dir, source=toy_source(), progress=False).train()
  finally:
    server.stop()
  assert _strip(resumed) == full
  assert _strip(reporting.read_jsonl(run_dir / "metrics.jsonl")) == full


def test_the_command_line_names_the_server_and_how_to_resume(reference, tmp_path, capsys):
  import socket

  from experiments import run

  policy = reference[0]
  with socket.socket() as s:  # a port nothing listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  code = run.main(["--exp=navigation", "--quick", "--no-progress", "--compile-cache", "off", "--out",
                   str(tmp_path / "run"), f"policy.path={policy}", "rollout.backend=sglang",
                   f"rollout.sglang_url=http://127.0.0.1:{port}", "loss.behaviour_logp=recompute"])
  err = capsys.readouterr().err
  assert code == 1
  assert f"stopped: SGLang server at http://127.0.0.1:{port}" in err and "resumes every training" in err
