"""Run by tests/test_multihost.py in fresh interpreters: a short toy GRPO training (with a KL term to
the initial policy, 3 iterations, a checkpoint after each), either in one process over 8 forced CPU
devices or as process ``PID`` of a 2-process job over 4 forced devices each (the devices must be
forced before jax is imported, hence the subprocess).

    python tests/_multihost_check.py POLICY OUT single
    python tests/_multihost_check.py POLICY OUT multi PID PORT KILL VICTIM AT HEARTBEAT_S [reference]

``single`` and ``multi ... reference`` train the uninterrupted run in ``OUT/full``, evaluate and
export it; process 0 writes ``OUT/result.json`` (records, evaluation) and ``OUT/params_full.npz``;
every process writes ``OUT/writes_<pid>.json``: the files it opened for writing, or renamed, under
OUT so far (a Python audit hook; orbax's own writes go through tensorstore and are not seen). Both
processes also name a run directory (``reporting.make_run_dir``), process 1 a little later.

``multi`` then trains (or resumes) the run in ``OUT/run``: with KILL=rollout or KILL=update, process
VICTIM kills itself with SIGKILL (no clean-up) in that stage of iteration AT; with KILL=none the run
ends and process 0 writes ``OUT/params_run.npz``. The reference and the killed run share the
processes, so the programs compiled for the one serve the other.
``MULTIHOST_CHECK_OVERRIDES`` in the environment: more config overrides (space-separated).
"""

from __future__ import annotations

import faulthandler
import json
import os
import pathlib
import signal
import sys
import time

POLICY, OUT, MODE = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
if MODE == "multi":
  PID, PORT, KILL, VICTIM, AT, HEARTBEAT = int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7]), \
      int(sys.argv[8]), sys.argv[9]
  REFERENCE = sys.argv[10:] == ["reference"]
else:
  PID, KILL, REFERENCE = 0, "none", True
# Ops run on their device's thread (no intra-op tasks queued behind threads blocked in a collective's
# rendezvous); a rendezvous that still starves aborts after 120 s (XLA's in-process CPU collectives).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={8 if MODE == 'single' else 4}"
                           " --xla_cpu_multi_thread_eigen=false --xla_cpu_collective_call_terminate_timeout_seconds=120"
                           ).strip()

_WRITES: list[str] = []
_ROOT = str(OUT.resolve())


def _audit(event: str, args: tuple) -> None:
  path = None
  if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
    mode, flags = args[1], args[2]
    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
    path = os.fsdecode(args[0]) if writing else None
  elif event in ("os.rename", "shutil.copyfile"):
    path = os.fsdecode(args[1])
  if path is not None:
    full = os.path.abspath(path)
    if full.startswith(_ROOT) and not full.endswith(f"writes_{PID}.json"):
      _WRITES.append(os.path.relpath(full, _ROOT))


sys.addaudithook(_audit)
faulthandler.register(signal.SIGUSR1)  # the test sends it before killing a stuck run: where was each thread
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402

# Eager collectives dispatched asynchronously on a few host cores can starve XLA's in-process
# rendezvous (8 device threads must meet); run them one at a time.
jax.config.update("jax_cpu_enable_async_dispatch", False)

from rti_jax import distributed, reporting  # noqa: E402
from rti_jax import rollout as rollout_mod  # noqa: E402
from rti_jax.config import load_config  # noqa: E402
from rti_jax.envs.source import TaskSource  # noqa: E402
from rti_jax.trainer import TIMING_KEYS, Trainer  # noqa: E402
from trainer_fixtures import ONE_STEP_FROM_SAMPLER, LengthRewardEnv  # noqa: E402

ITERATION = [0]  # the iteration in progress
ARMED = [False]  # only in the run of OUT/run


def die_here(stage: str) -> None:
  if ARMED[0] and KILL == stage and PID == VICTIM and ITERATION[0] == AT:
    print(f"process {PID}: SIGKILL in the {stage} of iteration {AT}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


real_iterate, real_update, real_rollout = Trainer.iterate, Trainer.update, rollout_mod.rollout_groups


def iterate(self):
  ITERATION[0] = self.iteration + 1
  return real_iterate(self)


def update(self, groups):
  die_here("update")
  return real_update(self, groups)


def rollout(*args, **kwargs):
  die_here("rollout")
  return real_rollout(*args, **kwargs)


# the sliced rollouts of a multi-process run import rollout_groups from rti_jax.rollout when they run
Trainer.iterate, Trainer.update, rollout_mod.rollout_groups = iterate, update, rollout


def source() -> TaskSource:
  return TaskSource(train=list(range(12)), test=list(range(100, 104)), env_factory=LengthRewardEnv, task_id=str,
                    subsets={}, domain="navigation")


def config():
  extra = ["mesh.distributed=true", f"mesh.coordinator=127.0.0.1:{PORT}", "mesh.num_processes=2",
           f"mesh.process_id={PID}", f"mesh.heartbeat_timeout_s={HEARTBEAT}"] if MODE == "multi" else []
  return load_config("navigation", [
      f"policy.path={POLICY}", "loss.method=grpo", "loss.beta=0.05", "rollout.tasks_per_iter=2", "rollout.group_size=4",
      "rollout.max_new_tokens=6", "rollout.max_context=128", "train.iterations=3", "train.checkpoint_every=1",
      "optim.lr=0.01", "train.eval_every=100", "train.val_tasks=0", "mesh.rollout_slices=2",
      *ONE_STEP_FROM_SAMPLER, *extra,  # the process split is what is checked
      *os.environ.get("MULTIHOST_CHECK_OVERRIDES", "").split()])


def params(trainer: Trainer) -> dict[str, np.ndarray]:
  host = distributed.host_arrays(trainer.state.params)  # collective with 2 processes
  flat = jax.tree_util.tree_flatten_with_path(host)[0]
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def strip(records):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def reference(cfg) -> None:
  full = Trainer(cfg, OUT / "full", source=source(), progress=False)
  assert jax.process_count() == (2 if MODE == "multi" else 1) and jax.device_count() == 8
  if PID == 1:
    time.sleep(1.5)  # a timestamp of its own would now differ from process 0's
  run_dir = reporting.make_run_dir(OUT / "runs", "toy")
  records = full.train()
  ev = full.evaluate(full.source.test, 4, seed=5)
  full.export(OUT / "full" / "policy")
  p_full = params(full)
  if distributed.is_writer():
    np.savez(OUT / "params_full.npz", **p_full)
    (OUT / "result.json").write_text(json.dumps({
        "records": strip(records), "eval": ev, "rollout_mesh_devices": int(full.rollout_mesh.size)}))
  distributed.barrier("multihost_check_reference_done")
  (OUT / f"writes_{PID}.json").write_text(json.dumps({
      "writes": sorted(set(_WRITES)), "records": strip(records), "eval_successes": ev["successes"],
      "rollout_mesh_devices": int(full.rollout_mesh.size), "run_dir": str(run_dir)}))
  print(f"process {PID}: reference finished", flush=True)


def main() -> None:
  cfg = config()
  if REFERENCE:
    reference(cfg)
  if MODE != "multi":
    return
  ARMED[0] = True
  run = Trainer(cfg, OUT / "run", source=source(), progress=False)
  run.train()
  p_run = params(run)
  if distributed.is_writer():
    np.savez(OUT / "params_run.npz", **p_run)
  print(f"process {PID}: finished", flush=True)


if __name__ == "__main__":
  main()
