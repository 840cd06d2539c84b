"""Used by tests/test_tensor_parallel.py: the trainer on 8 forced CPU devices, or on the devices there are.

``python tests/_tp_trainer_check.py POLICY_DIR RUN_DIR DATA FSDP TENSOR`` builds the trainer of a toy
one-turn environment on a (DATA, FSDP, TENSOR) mesh (``8`` devices are forced when the product is
8), runs one iteration (rollouts from the sampler's decode copy, the sharded update, the weight
sync) and prints one JSON object: the iteration's metrics and where the parameters live. The test
runs the one-device reference in its own process with ``run``.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and int(sys.argv[3]) * int(sys.argv[4]) * int(sys.argv[5]) == 8:
  # Ops run on their device's thread (no intra-op tasks queued behind threads blocked in a
  # collective's rendezvous); a rendezvous that still starves aborts after 120 s.
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + (
      " --xla_force_host_platform_device_count=8 --xla_cpu_multi_thread_eigen=false"
      " --xla_cpu_collective_call_terminate_timeout_seconds=120")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402

import jax  # noqa: E402

# Eager collectives dispatched asynchronously on a few host cores can starve XLA's in-process
# rendezvous (8 device threads must meet); run them one at a time.
jax.config.update("jax_cpu_enable_async_dispatch", False)

from rti_jax.config import load_config  # noqa: E402
from rti_jax.envs.source import TaskSource  # noqa: E402
from rti_jax.trainer import Trainer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_fixtures import ONE_STEP_FROM_SAMPLER, LengthRewardEnv  # noqa: E402


def run(policy: str, run_dir: str, data: int, fsdp: int, tensor: int) -> dict:
  """One iteration on a (data, fsdp, tensor) mesh: the report ``main`` prints."""
  cfg = load_config("navigation", [
      f"policy.path={policy}", "loss.method=grpo", "rollout.tasks_per_iter=2", "rollout.group_size=4",
      "rollout.max_new_tokens=6", "rollout.max_context=64", "train.iterations=1", "train.val_tasks=0",
      "optim.length_chunks=1", "optim.lr=1e-6", "loss.beta=0", f"mesh.data={data}", f"mesh.fsdp={fsdp}",
      f"mesh.tensor={tensor}", *ONE_STEP_FROM_SAMPLER])  # the mesh is what is checked
  src = TaskSource(train=list(range(4)), test=[100], env_factory=LengthRewardEnv, task_id=str, subsets={},
                   domain="navigation")
  tr = Trainer(cfg, run_dir, source=src, progress=False)
  specs = {jax.tree_util.keystr(p): str(x.sharding.spec)
           for p, x in jax.tree_util.tree_leaves_with_path(tr.state.params)}
  record = tr.iterate()
  decode = {jax.tree_util.keystr(p): str(x.sharding.spec)
            for p, x in jax.tree_util.tree_leaves_with_path(tr.backend.sampler.state)}
  return {
      "devices": int(tr.mesh.size), "mesh": dict(tr.mesh.shape), "has_model": hasattr(tr, "model"),
      "specs": specs, "decode_specs": decode, "record": {k: v for k, v in record.items() if isinstance(v, (int, float))},
      "sampler_mesh": None if tr.backend.sampler.mesh is None else dict(tr.backend.sampler.mesh.shape),
  }


def main() -> None:
  print(json.dumps(run(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]))))


if __name__ == "__main__":
  main()
