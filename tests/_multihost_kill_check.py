"""Run by tests/test_multihost.py: process ``PID`` of a 2-process toy GRPO training (2 forced CPU
devices each, 3 iterations, a checkpoint after each) in RUN_DIR; with KILL=rollout or KILL=update,
process VICTIM kills itself with SIGKILL (no clean-up) in that stage of iteration AT. With REFERENCE
(a directory), the same processes first train the uninterrupted run there (the programs they compile
serve both runs).

    python tests/_multihost_kill_check.py POLICY RUN_DIR PID PORT KILL VICTIM AT HEARTBEAT_S [REFERENCE]
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys

POLICY, RUN_DIR, PID, PORT, KILL, VICTIM, AT, HEARTBEAT = sys.argv[1:9]
PID, VICTIM, AT = int(PID), int(VICTIM), int(AT)
REFERENCE = sys.argv[9] if len(sys.argv) > 9 else None
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
                           " --xla_cpu_multi_thread_eigen=false --xla_cpu_collective_call_terminate_timeout_seconds=120"
                           ).strip()
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import jax  # noqa: E402

jax.config.update("jax_cpu_enable_async_dispatch", False)

from rti_jax import rollout as rollout_mod  # noqa: E402
from rti_jax import trainer as trainer_mod  # noqa: E402
from rti_jax.config import load_config  # noqa: E402
from rti_jax.envs.source import TaskSource  # noqa: E402
from trainer_fixtures import LengthRewardEnv  # noqa: E402

ITERATION = [0]  # the iteration in progress
ARMED = [REFERENCE is None]  # not while the reference run trains


def die_here(stage: str) -> None:
  if ARMED[0] and KILL == stage and PID == VICTIM and ITERATION[0] == AT:
    print(f"process {PID}: SIGKILL in the {stage} of iteration {AT}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


real_iterate, real_update, real_rollout = trainer_mod.Trainer.iterate, trainer_mod.Trainer.update, rollout_mod.rollout_groups


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
trainer_mod.Trainer.iterate, trainer_mod.Trainer.update, rollout_mod.rollout_groups = iterate, update, rollout

cfg = load_config("navigation", [
    f"policy.path={POLICY}", "loss.method=grpo", "rollout.tasks_per_iter=2", "rollout.group_size=4",
    "rollout.max_new_tokens=6", "rollout.max_context=128", "train.iterations=3", "train.checkpoint_every=1",
    "optim.lr=0.01", "train.eval_every=100", "train.val_tasks=0", "mesh.rollout_slices=2",
    "mesh.distributed=true", f"mesh.coordinator=127.0.0.1:{PORT}", "mesh.num_processes=2", f"mesh.process_id={PID}",
    f"mesh.heartbeat_timeout_s={HEARTBEAT}"])
source = TaskSource(train=list(range(12)), test=list(range(100, 104)), env_factory=LengthRewardEnv, task_id=str,
                    subsets={}, domain="navigation")
if REFERENCE is not None:
  trainer_mod.Trainer(cfg, REFERENCE, source=source, progress=False).train()
  print(f"process {PID}: reference finished", flush=True)
  ARMED[0] = True
trainer_mod.Trainer(cfg, RUN_DIR, source=source, progress=False).train()
print(f"process {PID}: finished", flush=True)
