"""Run as a script (8 forced CPU devices): the lean train step (remat, scanned layers, vocab chunks,
micro-batches from a tokens-per-device budget, donated state) on meshes of 8 devices against the
plain step on one device. Prints one JSON line of max differences per mesh."""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_memory_model import max_abs, max_diff, rti_batch, tiny  # noqa: E402

from rti_jax import sharding as S  # noqa: E402
from rti_jax.objectives import LossConfig  # noqa: E402


def host(tree):
  return jax.tree.map(np.asarray, tree)


def main() -> None:
  batch = rti_batch(rows=16, t=24)
  tx = optax.adamw(1e-2, eps=1e-3, weight_decay=0.1)
  one = S.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  plain = S.make_train_step(tiny(seed=3), tx, one, LossConfig(name="rti"))
  s_ref, o_ref = plain.step(plain.state, plain.shard_batch(batch))
  s_ref, o_ref, start = host(s_ref), host(o_ref), host(plain.state.params)
  out = {}
  for name, shape, budget in (("fsdp8", (1, 8, 1), 24), ("dp2fsdp2tp2", (2, 2, 2), 24)):
    ts = S.make_train_step(tiny(seed=3), tx, S.make_mesh(*shape), LossConfig(name="rti"), remat="full",
                           scan_layers=True, vocab_chunk=20, tokens_per_device=budget, donate=True)
    state, o = ts.step(ts.state, ts.shard_batch(batch))
    state, o = host(state), host(o)
    dp = ts.data_parallel_degree
    out[name] = {"micro_batches": ts_count(budget, batch, dp), "loss": abs(float(o.loss) - float(o_ref.loss)),
                 "grads_rel": max_diff(o.grads, o_ref.grads) / max_abs(o_ref.grads),
                 "params": max_diff(state.params, s_ref.params),
                 "moved": max_diff(s_ref.params, start),
                 "num_tokens": [float(o.metrics["num_tokens"]), float(o_ref.metrics["num_tokens"])]}
  print(json.dumps(out))


def ts_count(budget: int, batch, dp: int) -> int:
  from rti_jax.step_fns import MemoryModel

  return MemoryModel(tokens_per_device=budget).count(batch.shape[0], batch.shape[1], dp)


if __name__ == "__main__":
  np.set_printoptions(precision=3)
  main()
