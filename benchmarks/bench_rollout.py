"""Benchmark: the multi-turn rollout engine and the intervention pipeline on Navigation.

A random tiny Qwen3 (JAX sampler) plays the offline Navigation benchmark with the
byte-level test tokenizer; every group fails, so every group goes through the
intervention pipeline (rule-based Validator/Verifier, policy Corrector, PPL gate).
Reports, after one warm-up (compile) iteration, the median wall time of
``rollout_groups`` and of ``intervene_groups``, with generated tokens/s of each. The
random policy answers at once, so this measures engine + pipeline overhead per step,
not a trained policy's episode length. Usage:

  python benchmarks/bench_rollout.py                        # 8 tasks x G=8
  python benchmarks/bench_rollout.py --tasks 4 --group 4 --iters 2 --new 32
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
from flax import nnx

from models.config import QwenConfig
from models.qwen import Qwen
from rti_jax.envs import navigation as nav
from rti_jax.generation.base import SamplingParams
from rti_jax.generation.jax_backend import JaxBackend
from rti_jax.intervention import InterventionConfig, intervene_groups, make_roles
from rti_jax.objectives import assemble_batch
from rti_jax.policy.tokenizer import byte_tokenizer
from rti_jax.rollout import ChatFormatter, RolloutConfig, rollout_groups


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--tasks", type=int, default=8)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--new", type=int, default=64, help="max new tokens per turn")
  ap.add_argument("--iters", type=int, default=3)
  ap.add_argument("--hidden", type=int, default=64)
  ap.add_argument("--layers", type=int, default=2)
  args = ap.parse_args()

  tok = byte_tokenizer()
  cfg = QwenConfig(model_type="qwen3", vocab_size=272, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                   num_layers=args.layers, num_heads=4, num_kv_heads=2, head_dim=args.hidden // 4,
                   max_position_embeddings=8192)
  backend = JaxBackend(Qwen(cfg, rngs=nnx.Rngs(0)), max_cache_len=4096)
  bench = nav.load_benchmark("tiny")
  env_factory = lambda: nav.NavigationEnv(bench.world)  # noqa: E731
  fmt = ChatFormatter(tok)  # the Navigation system prompt already lists the tools
  rc = RolloutConfig(group_size=args.group, sampling=SamplingParams(max_new_tokens=args.new, temperature=0.8),
                     max_context_tokens=4096)
  roles = make_roles("rules", backend, fmt, rc.sampling)
  tasks = bench.train[: args.tasks]
  tid = lambda t: t.task_id  # noqa: E731

  def gen_tokens(groups) -> int:
    return int(sum(sum(t.loss_mask) for g in groups for t in g))

  t_roll, t_int, n_roll, n_int = [], [], 0, 0
  for it in range(args.iters + 1):
    t0 = time.perf_counter()
    groups = rollout_groups(tasks, env_factory, backend, fmt, rc, task_id=tid, seed=it)
    t1 = time.perf_counter()
    new, stats = intervene_groups(groups, tasks, env_factory, backend, fmt, roles, InterventionConfig(), rc,
                                  task_id=tid, seed=100 + it)
    assemble_batch(new)
    t2 = time.perf_counter()
    if it == 0:
      continue  # warm-up: compilation
    t_roll.append(t1 - t0)
    t_int.append(t2 - t1)
    n_roll = gen_tokens(groups)
    n_int = stats.steps_total
  print(f"machine: {platform.machine()} {platform.processor() or ''}".strip())
  print(f"model: qwen3 hidden={args.hidden} layers={args.layers}; {args.tasks} tasks x G={args.group}; "
        f"max_new={args.new}")
  r, i = statistics.median(t_roll), statistics.median(t_int)
  print(f"rollout_groups:   {r:.3f} s  ({n_roll / r:.0f} generated tokens/s, {args.tasks * args.group / r:.1f} episodes/s)")
  print(f"intervene_groups: {i:.3f} s  ({n_int} intervened steps, {n_int / i:.1f} steps/s)")
  print(stats.format_table())


if __name__ == "__main__":
  np.set_printoptions(precision=3)
  main()
