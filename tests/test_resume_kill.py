"""A run killed with SIGKILL at any point resumes to exactly the uninterrupted run's records.

Each case starts a short GRPO training in a child process that kills itself (SIGKILL, no clean-up)
at one point: after an iteration's metrics line but before its first checkpoint, in the middle of
writing a metrics line, right after a checkpoint, and in the middle of the metrics rewrite that a
resume does. The run directory is then resumed (a second child process, run to the end) and its
``metrics.jsonl`` must equal the uninterrupted run's, with no iteration lost or duplicated.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from rti_jax import reporting
from rti_jax.config import load_config
from rti_jax.envs.source import TaskSource
from rti_jax.trainer import TIMING_KEYS, Trainer
from models.chat import build_tiny_tokenizer
from trainer_fixtures import WORDS, LengthRewardEnv, write_random_qwen

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]


class ParityEnv(LengthRewardEnv):
  modulus = 2


def toy_source() -> TaskSource:
  return TaskSource(train=list(range(12)), test=list(range(100, 104)), env_factory=ParityEnv, task_id=str,
                    subsets={}, domain="navigation")


def cfg(policy_dir: str):
  return load_config("navigation", [
      f"policy.path={policy_dir}", "loss.method=grpo", "rollout.tasks_per_iter=2", "rollout.group_size=4",
      "rollout.max_new_tokens=6", "rollout.max_context=128", "train.iterations=4", "train.checkpoint_every=2",
      "optim.lr=0.01", "train.eval_every=100", "train.val_tasks=0"])


CHILD = textwrap.dedent("""
  import os, signal, sys
  import test_resume_kill as T
  from rti_jax import reporting
  from rti_jax import trainer as trainer_mod
  policy, run_dir, kill_at = sys.argv[1], sys.argv[2], sys.argv[3]
  die = lambda: os.kill(os.getpid(), signal.SIGKILL)
  real_append, real_write, real_save = reporting.append_jsonl, reporting.write_jsonl, trainer_mod.Trainer.save
  def append(path, record):
    if kill_at == "torn_metrics_line" and record.get("iteration") == 3:
      with open(path, "a") as f:
        f.write('{"iteration": 3, "loss": 0.12')  # half a line, then the kill
      die()
    real_append(path, record)
    if kill_at == "before_first_checkpoint" and record.get("iteration") == 1:
      die()
  def save(self):
    real_save(self)
    if kill_at == "after_checkpoint" and self.iteration == 2:
      die()
  def write(path, records):
    if kill_at == "mid_rewrite":
      import tempfile
      fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix="." + os.path.basename(path) + ".")
      os.write(fd, b'{"iteration": 1')  # the temporary file half written, the real one untouched
      die()
    real_write(path, records)
  reporting.append_jsonl, reporting.write_jsonl, trainer_mod.Trainer.save = append, write, save
  t = trainer_mod.Trainer(T.cfg(policy), run_dir, source=T.toy_source(), progress=False)
  if kill_at == "mid_rewrite":  # a first life that stops after iteration 3 (checkpoint at 2)
    reporting.write_jsonl = real_write
    t.train(stop_after=3)
    reporting.write_jsonl = write
    t = trainer_mod.Trainer(T.cfg(policy), run_dir, source=T.toy_source(), progress=False)
  t.train()
""")


def _child(policy: str, run_dir: pathlib.Path, kill_at: str, cache_dir: pathlib.Path) -> int:
  # The children compile the same programs: the first one's compiled programs serve the others.
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
             JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
  return subprocess.run([sys.executable, "-c", CHILD, policy, str(run_dir), kill_at], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=900).returncode


def _strip(records):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


@pytest.fixture(scope="module")
def policy_and_reference(tmp_path_factory):
  path = tmp_path_factory.mktemp("policy")
  tok = build_tiny_tokenizer(WORDS, path)
  policy = write_random_qwen(path, len(tok), seed=0, layers=1, heads=2, kv_heads=1, head_dim=8, max_positions=256)
  full = Trainer(cfg(policy), tmp_path_factory.mktemp("full"), source=toy_source(), progress=False).train()
  assert [r["iteration"] for r in full] == [1, 2, 3, 4]
  return policy, _strip(full), tmp_path_factory.mktemp("compilation_cache")


@pytest.mark.parametrize("kill_at", ["before_first_checkpoint", "torn_metrics_line", "after_checkpoint",
                                     "mid_rewrite"])
def test_a_run_killed_anywhere_resumes_to_the_uninterrupted_records(policy_and_reference, tmp_path, kill_at):
  policy, full, cache_dir = policy_and_reference
  run_dir = tmp_path / "run"
  assert _child(policy, run_dir, kill_at, cache_dir) == -signal.SIGKILL
  resumed = Trainer(cfg(policy), run_dir, source=toy_source(), progress=False)
  records = resumed.train()
  assert resumed.iteration == 4
  on_disk = reporting.read_jsonl(run_dir / "metrics.jsonl")
  assert [r["iteration"] for r in on_disk] == [1, 2, 3, 4]
  assert _strip(on_disk) == full and _strip(records) == full

