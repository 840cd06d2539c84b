"""Multi-host training (rti_jax/distributed.py).

The slow tests train a toy policy for 3 iterations twice: one process over 8 forced CPU devices, and
two processes on 127.0.0.1 over 4 forced devices each (``jax.distributed``, gloo collectives), both
with ``mesh.rollout_slices=2``; the runs must agree on every per-iteration metric, the evaluation
and the final parameters, and only process 0 may write files (besides its own part of the collective
orbax checkpoints). The same two processes then start the run that loses a process (SIGKILL, once
the non-coordinator, once after a restart the coordinator): the survivor must end with an error
naming what it lost, only finished iterations may be on disk, and the last restart must resume to
the uninterrupted run's records and parameters exactly (tests/_multihost_check.py).
The fast tests check the slicing, the counters' merge and the single-process identities directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from rti_jax import distributed
from rti_jax.config import ConfigError, load_config
from rti_jax.intervention import InterventionConfig, InterventionRoles, PolicyCorrector, intervene_groups
from rti_jax.intervention.stats import InterventionStats
from rti_jax.rollout import ChatFormatter, RolloutConfig, rollout_groups
from rti_jax.generation.base import SamplingParams
from rti_jax.policy.tokenizer import byte_tokenizer
from rti_jax.trainer import TIMING_KEYS
from intervention_doubles import BigramBackend, MiniNavEnv, mini_nav_tasks

HERE = pathlib.Path(__file__).resolve().parent

#: Metric keys compared exactly (counts and rewards) between the one- and two-process runs; every
#: other number (loss, gradient norm, KL, ratios) within FLOAT_TOL.
EXACT_KEYS = ("iteration", "reward_mean", "reward_mean_after_intervention", "all_fail_group_frac", "turn_hist",
              "tokens", "truncated_frac", "rti/groups_triggered")
FLOAT_TOL = 1e-5
#: The final parameters agree within 1% of Adam's step (optim.lr=0.01 in _multihost_check.py) per
#: iteration. Adam divides each gradient element by its own running scale, so where an element's
#: gradient is close to zero the two runs' summation-order noise is magnified to a fraction of the
#: step, not of the gradient; a slice's gradient lost or counted twice changes the direction of the
#: gradient, and with it many elements' steps by a large part of a step.
PARAM_TOL = 0.01 * 0.01 * 3


# --- fast checks -------------------------------------------------------------------------------


def test_slice_bounds_cover_in_order_like_array_split():
  for n, parts in [(8, 2), (7, 3), (2, 4), (0, 2), (12, 5)]:
    got = [list(range(*distributed.slice_bounds(n, parts, k))) for k in range(parts)]
    assert got == [list(a) for a in np.array_split(np.arange(n), parts)]
  with pytest.raises(ValueError, match="0 <= k < parts"):
    distributed.slice_bounds(4, 2, 2)


def test_single_process_helpers_are_identities():
  assert not jax.distributed.is_initialized()
  assert distributed.process_count() == 1 and distributed.process_index() == 0 and distributed.is_writer()
  assert distributed.owned(list(range(5))) == [0, 1, 2, 3, 4]
  x = np.arange(6).reshape(2, 3)
  assert distributed.sum_over_processes(x) is x
  assert distributed.allgather_objects({"a": 1}) == [{"a": 1}]
  assert distributed.from_writer(lambda: 7) == 7
  sentinel = object()
  assert distributed.process_local(sentinel, None) is sentinel and distributed.host_model(sentinel) is sentinel
  key = jax.random.key(3)
  keys = distributed.slice_keys(key, 3)
  assert len(keys) == 3 and keys[0] is key  # slice 0: the iteration's key itself (one slice = the plain loop)
  np.testing.assert_array_equal(jax.random.key_data(keys[2]),
                                jax.random.key_data(jax.random.fold_in(jax.random.key(3), 2)))


def test_rollout_slice_count_and_config_checks():
  mesh = load_config("navigation", ["rollout.tasks_per_iter=4"]).mesh
  assert distributed.num_rollout_slices(mesh, 4) == 1  # 0 = one per process
  assert distributed.num_rollout_slices(dataclasses.replace(mesh, rollout_slices=2), 4) == 2
  with pytest.raises(ValueError, match="divisor of rollout.tasks_per_iter=4"):
    distributed.num_rollout_slices(dataclasses.replace(mesh, rollout_slices=3), 4)
  with pytest.raises(ConfigError, match="mesh.rollout_slices"):
    load_config("navigation", ["rollout.tasks_per_iter=4", "mesh.rollout_slices=3"])
  with pytest.raises(ConfigError, match="mesh.process_id"):
    load_config("navigation", ["mesh.num_processes=2", "mesh.process_id=2"])
  assert not distributed.wanted(mesh) and distributed.initialize(mesh) is False
  assert not jax.distributed.is_initialized()
  # A coordinator without a process count / id is refused before jax.distributed is touched.
  with pytest.raises(ValueError, match="mesh.num_processes and mesh.process_id"):
    distributed.initialize(dataclasses.replace(mesh, coordinator="127.0.0.1:1"))
  assert not jax.distributed.is_initialized()


def test_merge_counters_sums_every_field():
  a = InterventionStats(groups_total=2, groups_triggered=1, accepted_ppl_sum=1.5, verifier_reasons={"leak": 1})
  b = InterventionStats(groups_total=3, steps_total=4, accepted_ppl_sum=0.25, verifier_reasons={"leak": 2, "x": 1})
  m = distributed.merge_counters([a, b])
  assert (m.groups_total, m.groups_triggered, m.steps_total, m.accepted_ppl_sum) == (5, 1, 4, 1.75)
  assert m.verifier_reasons == {"leak": 3, "x": 1}


def test_only_the_writer_process_writes_reports(tmp_path, monkeypatch):
  """reporting's JSON writers and the experiment's results write on process 0 only."""
  from rti_jax import experiment, reporting

  results = {"seeds": [0], "runs": {"0": {"grpo": {"all": {"p@1": 0.5}}, "grpo_records": [{"iteration": 1}]}}}
  for writer, out in ((False, tmp_path / "p1"), (True, tmp_path / "p0")):
    out.mkdir()
    monkeypatch.setattr(distributed, "is_writer", lambda w=writer: w)
    reporting.write_json(out / "a.json", {"x": 1})
    reporting.append_jsonl(out / "m.jsonl", {"iteration": 1})
    reporting.write_jsonl(out / "w.jsonl", [{"iteration": 1}])
    experiment.write_results(results, out, ["| table |"])
  assert sorted(p.name for p in (tmp_path / "p1").iterdir()) == []
  assert sorted(p.name for p in (tmp_path / "p0").iterdir()) == ["a.json", "m.jsonl", "results.json", "table.md",
                                                                 "w.jsonl"]
  assert reporting.read_jsonl(tmp_path / "p0" / "m.jsonl") == [{"iteration": 1}]


def test_sliced_stages_equal_per_slice_rollouts_with_the_slice_seeds():
  """Two slices in one process: the groups, rewards and summed counters of rolling out (and
  intervening on) each half of the tasks by hand with its slice's seeds, in slice order."""
  tok = byte_tokenizer()
  fmt = ChatFormatter(tok)
  backend = BigramBackend(vocab_size=len(tok), seed=1)
  rc = RolloutConfig(group_size=2, sampling=SamplingParams(max_new_tokens=6, temperature=1.0), max_context_tokens=512)
  icfg = InterventionConfig(verifier_enabled=False)
  roles = InterventionRoles(None, PolicyCorrector(backend, rc.sampling, fmt.end_of_turn_id), None)
  tasks = mini_nav_tasks() * 2
  source = type("Src", (), {"env_factory": MiniNavEnv, "task_id": staticmethod(lambda t: t.task_id)})()
  trainer = type("T", (), {"source": source, "backend": backend, "formatter": fmt, "rollout_config": rc,
                           "roles": roles, "intervention_config": dataclasses.replace(icfg, enabled=False)})()
  roll, inter = [11, 22], [33, 44]
  groups, before, stats, _, _ = distributed.sliced_stages(trainer, tasks, roll, inter)
  want, want_stats = [], []
  for k, (lo, hi) in enumerate([(0, len(tasks) // 2), (len(tasks) // 2, len(tasks))]):
    part = tasks[lo:hi]
    g = rollout_groups(part, MiniNavEnv, backend, fmt, rc, task_id=lambda t: t.task_id, seed=roll[k])
    g, s = intervene_groups(g, part, MiniNavEnv, backend, fmt, roles, trainer.intervention_config, rc,
                            task_id=lambda t: t.task_id, seed=inter[k])
    want += g
    want_stats.append(s)
  assert [[list(t.token_ids) for t in g] for g in groups] == [[list(t.token_ids) for t in g] for g in want]
  np.testing.assert_array_equal(before, [[t.reward for t in g] for g in want])
  assert stats.groups_total == len(tasks) == sum(s.groups_total for s in want_stats)
  # The two slices really are seeded apart: slice 1 differs from the same tasks under slice 0's seed.
  same_seed = rollout_groups(tasks[2:], MiniNavEnv, backend, fmt, rc, task_id=lambda t: t.task_id, seed=roll[0])
  assert [[list(t.token_ids) for t in g] for g in same_seed] != [[list(t.token_ids) for t in g] for g in groups[2:]]


# --- the two-process runs --------------------------------------------------------------------------


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env() -> dict[str, str]:
  env = dict(os.environ)
  # XLA_FLAGS as the tests set it (tests/conftest.py); the check adds its own device count
  env["JAX_PLATFORMS"] = "cpu"
  return env


#: How XLA aborts an in-process CPU collective whose 8 device threads did not all arrive (thread
#: starvation on a host with fewer cores than forced devices, seen under heavy load, not a fault
#: of the code under test): the run is then started once more.
RENDEZVOUS_ABORT = "Termination timeout for `all reduce"
#: the processes' heartbeat timeout (mesh.heartbeat_timeout_s): how soon a lost process is noticed
HEARTBEAT_S = 10


def _run_single(policy: str, out: pathlib.Path) -> None:
  for attempt in range(2):
    if out.exists():
      shutil.rmtree(out)
    proc = subprocess.run([sys.executable, str(HERE / "_multihost_check.py"), policy, str(out), "single"],
                          capture_output=True, text=True, env=_env(), cwd=HERE.parent, timeout=900)
    if proc.returncode == 0 or RENDEZVOUS_ABORT not in proc.stderr or attempt:
      break
  assert proc.returncode == 0, proc.stderr[-4000:]


def _run_pair(policy: str, out: pathlib.Path, kill: str, victim: int, at: int, cache: pathlib.Path,
              reference: bool = False, timeout: float = 420.0) -> tuple[list[int | None], list[str], float | None]:
  """Both processes of one launch (``reference``: first training the uninterrupted run): exit codes,
  logs, and how long the survivor lived after the victim died.

  Both processes are watched together: when one exits with an error the other is given the
  heartbeat timeout plus a margin to notice, then stopped. A process still running at the end is
  sent SIGUSR1 before it is killed, on which it prints every thread's Python stack (faulthandler)
  into its log (SIGTERM is taken by jax.distributed's preemption notice)."""
  port = str(_free_port())
  env = dict(_env(), JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
  logs = [out / f"{kill}_{at}_process_{i}.log" for i in range(2)]
  handles = [open(log, "w") for log in logs]
  procs = [subprocess.Popen([sys.executable, str(HERE / "_multihost_check.py"), policy, str(out), "multi", str(i),
                             port, kill, str(victim), str(at), str(HEARTBEAT_S), *(["reference"] if reference else [])],
                            stdout=h, stderr=subprocess.STDOUT, env=env, cwd=HERE.parent) for i, h in enumerate(handles)]
  deadline, died, survived = time.monotonic() + timeout, None, None
  try:
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
      if died is None and any(p.poll() not in (None, 0) for p in procs):
        died = time.monotonic()
        deadline = min(deadline, died + HEARTBEAT_S + 60)
      time.sleep(0.2)
    if died is None and any(p.poll() not in (None, 0) for p in procs):
      died = time.monotonic()  # both ended within one poll (a lost coordinator ends the others at once)
    if died is not None and all(p.poll() is not None for p in procs):
      survived = time.monotonic() - died
  finally:
    running = [p for p in procs if p.poll() is None]
    for p in running:
      p.send_signal(signal.SIGUSR1)
    time.sleep(2.0 if running else 0.0)
    for p in running:
      p.kill()
      p.wait()
    for h in handles:
      h.close()
  return [p.returncode for p in procs], [log.read_text(errors="replace") for log in logs], survived


@pytest.fixture(scope="module")
def two_process_runs(toy_policy, tmp_path_factory) -> dict:
  """The one-process run, and the first launch of the two processes: the uninterrupted run, then the
  run in which process 1 kills itself in the rollout of iteration 2. Started once more when XLA's
  in-process rendezvous aborted or the uninterrupted run did not finish in time."""
  single, multi = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("multi")
  _run_single(toy_policy, single)
  cache = tmp_path_factory.mktemp("compilation_cache")
  for attempt in range(2):
    codes, texts, survived = _run_pair(toy_policy, multi, "rollout", 1, 2, cache, reference=True)
    finished = all("reference finished" in t for t in texts)
    if finished or attempt or not (survived is None or any(RENDEZVOUS_ABORT in t for t in texts)):
      break
    shutil.rmtree(multi)
    multi.mkdir()
  return {"single": single, "multi": multi, "cache": cache, "first_launch": (codes, texts, survived)}


def _assert_records_close(a: list[dict], b: list[dict]) -> float:
  assert len(a) == len(b) == 3
  worst = 0.0
  for ra, rb in zip(a, b):
    assert ra.keys() == rb.keys()
    for k, va in ra.items():
      vb = rb[k]
      if k in EXACT_KEYS or not isinstance(va, float):
        assert va == vb, (k, va, vb)
      else:
        worst = max(worst, abs(va - vb))
        assert abs(va - vb) <= FLOAT_TOL, (k, va, vb)
  return worst


def _max_param_diff(a: pathlib.Path, b: pathlib.Path) -> float:
  pa, pb = np.load(a), np.load(b)
  assert sorted(pa.files) == sorted(pb.files) and len(pa.files) > 0
  return max(float(np.max(np.abs(pa[k].astype(np.float64) - pb[k].astype(np.float64)))) for k in pa.files)


@pytest.mark.slow
def test_two_processes_train_like_one_process_of_eight_devices(two_process_runs):
  single, multi = two_process_runs["single"], two_process_runs["multi"]
  _, texts, _ = two_process_runs["first_launch"]
  assert all("reference finished" in t for t in texts), "\n".join(t[-3000:] for t in texts)
  one, two = (json.loads((d / "result.json").read_text()) for d in (single, multi))
  assert (one["rollout_mesh_devices"], two["rollout_mesh_devices"]) == (8, 4)
  # Same per-iteration metrics (rewards exactly, losses within FLOAT_TOL), a real update.
  _assert_records_close(one["records"], two["records"])
  assert all(r["grad_norm"] > 0 for r in two["records"])
  assert one["eval"]["successes"] == two["eval"]["successes"]
  assert _max_param_diff(single / "params_full.npz", multi / "params_full.npz") <= PARAM_TOL
  # Every process returned the same records, not only the writer.
  p1 = json.loads((multi / "writes_1.json").read_text())
  assert p1["records"] == two["records"] and p1["eval_successes"] == two["eval"]["successes"]
  # Only process 0 writes: process 1 touched nothing but its own part of the collective checkpoints.
  own_part = re.compile(r"^full/ckpt/\d+\.orbax-checkpoint-tmp/state\.orbax-checkpoint-tmp/array_metadatas/process_1$")
  assert p1["writes"] and all(own_part.match(w) for w in p1["writes"]), p1["writes"]
  p0_out = json.loads((multi / "writes_0.json").read_text())
  assert p0_out["run_dir"] == p1["run_dir"]  # one timestamped run directory for the job (process 0's)
  p0 = p0_out["writes"]
  assert "full/metrics.jsonl" in p0 and "full/policy/config.json" in p0 and "result.json" in p0
  assert len((multi / "full" / "metrics.jsonl").read_text().splitlines()) == 3
  assert sorted(p.name for p in (multi / "full" / "ckpt").iterdir() if p.name.isdigit()) == ["2", "3"]  # the last two kept


@pytest.mark.slow
def test_a_killed_process_ends_the_job_and_a_restart_resumes_exactly(two_process_runs, toy_policy):
  """SIGKILL one process mid-rollout (process 1, iteration 2, in the launch that trained the
  uninterrupted run), then, after a restart, mid-update (process 0, the coordinator, iteration 3):
  each time the survivor exits non-zero within the heartbeat timeout plus a margin, naming the lost
  process; only finished iterations are on disk; the final restart resumes to the uninterrupted
  run's records and parameters."""
  multi, cache = two_process_runs["multi"], two_process_runs["cache"]
  run = multi / "run"

  def metrics(run_dir: pathlib.Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

  def checkpoints(run_dir: pathlib.Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "ckpt").iterdir() if p.name.isdigit())

  codes, texts, survived = two_process_runs["first_launch"]
  assert all("reference finished" in t for t in texts), [t[-3000:] for t in texts]
  full = metrics(multi / "full")
  assert [r["iteration"] for r in full] == [1, 2, 3]
  assert codes[1] == -signal.SIGKILL and codes[0] not in (0, None), (codes, texts[0][-3000:])
  assert survived is not None and survived < HEARTBEAT_S + 60, survived
  assert re.search(r"stopped sending heartbeats\):\s*1\b", texts[0]), texts[0][-3000:]
  assert metrics(run) == full[:1] and checkpoints(run) == ["1"]

  codes, texts, survived = _run_pair(toy_policy, multi, "update", 0, 3, cache)
  assert codes[0] == -signal.SIGKILL and codes[1] not in (0, None), (codes, texts[1][-3000:])
  assert survived is not None and survived < HEARTBEAT_S + 60, survived
  assert "leader task" in texts[1] and "died" in texts[1], texts[1][-3000:]
  assert metrics(run) == full[:2] and checkpoints(run) == ["1", "2"]

  codes, texts, _ = _run_pair(toy_policy, multi, "none", 0, 0, cache)
  assert codes == [0, 0], "\n".join(t[-3000:] for t in texts)
  assert metrics(run) == full
  assert _max_param_diff(multi / "params_run.npz", multi / "params_full.npz") == 0.0
