"""XLA:CPU compile time of small programs under both fusion emitters, and of the tiny policy's update.

    python benchmarks/bench_compile.py [--programs 100] [--json out.json]

Each setting runs in its own process (``XLA_FLAGS`` is read once, when the backend starts):
XLA's default (the MLIR fusion emitters) or ``--xla_cpu_use_fusion_emitters=false`` (the older
emitters), each with XLA's full optimisation or with ``jax_disable_most_optimizations``; the test
suite (``tests/conftest.py``) runs with the older emitters and the latter. Three workloads:
- ``jit``: ``--programs`` distinct small jitted functions (a matmul, a log-softmax and reductions
  over [4, 8] inputs), lowered and compiled;
- ``eager``: one eager ``jnp.exp`` on ``--programs`` distinct shapes (each shape is a new program);
- ``step``: the value-and-gradient of a random 3-layer Qwen3 (hidden 128, the shipped Navigation
  policy's size) on a [4, 640] batch, compiled once, then the median of 5 calls.
Prints milliseconds per program (and per call for ``step``) and the default's time over each other
setting's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

#: label -> (XLA_FLAGS, jax_disable_most_optimizations)
SETTINGS = {
    "default": ("", False),
    "older emitters": ("--xla_cpu_use_fusion_emitters=false", False),
    "default, tests' optimisation": ("", True),
    "older emitters, tests' optimisation": ("--xla_cpu_use_fusion_emitters=false", True),
}

_CHILD = r"""
import json, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_disable_most_optimizations", sys.argv[2] == "1")
n = int(sys.argv[1])
out = {}

def mk(i):
  def f(x, y):
    z = jnp.tanh(x * (i + 1)) @ y
    return jnp.sum(jax.nn.log_softmax(z, -1) * 0.5) + jnp.max(z)
  return jax.jit(f)

x, y = np.ones((4, 8), np.float32), np.ones((8, 16), np.float32)
t = time.perf_counter()
for i in range(n):
  mk(i).lower(x, y).compile()
out["jit"] = (time.perf_counter() - t) / n * 1e3
t = time.perf_counter()
for i in range(n):
  jnp.exp(jnp.ones((i + 1,))).block_until_ready()
out["eager"] = (time.perf_counter() - t) / n * 1e3

from flax import nnx
from models.config import QwenConfig
from models.qwen import Qwen
cfg = QwenConfig(model_type="qwen3", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=3, num_heads=2,
                 num_kv_heads=1, head_dim=64, max_position_embeddings=1024, tie_word_embeddings=True)
model = Qwen(cfg, rngs=nnx.Rngs(0))
graphdef, params = nnx.split(model)
ids = jnp.asarray(np.random.default_rng(0).integers(0, 512, (4, 640)), jnp.int32)
mask = jnp.ones((4, 640), jnp.int32)

def loss(p):
  logits = nnx.merge(graphdef, p)(ids, mask)
  return jnp.mean(jax.nn.log_softmax(logits, -1)[..., 0])

step = jax.jit(jax.value_and_grad(loss))
t = time.perf_counter()
compiled = step.lower(params).compile()
out["step_compile"] = (time.perf_counter() - t) * 1e3
times = []
for _ in range(5):
  t = time.perf_counter()
  jax.block_until_ready(compiled(params))
  times.append(time.perf_counter() - t)
out["step_call"] = statistics.median(times) * 1e3
print(json.dumps(out))
"""


def run_setting(flags: str, disable_most: bool, programs: int) -> dict[str, float]:
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                  env.get("PYTHONPATH")) if p)
  proc = subprocess.run([sys.executable, "-c", _CHILD, str(programs), "1" if disable_most else "0"], capture_output=True, text=True, env=env,
                        timeout=1200)
  if proc.returncode != 0:
    raise RuntimeError(f"XLA_FLAGS={flags!r}: {proc.stderr[-2000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--programs", type=int, default=100)
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  res = {name: run_setting(flags, most, args.programs) for name, (flags, most) in SETTINGS.items()}
  rows = [("small jitted program, compile", "jit"), ("eager op on a new shape", "eager"),
          ("tiny-policy gradient, compile", "step_compile"), ("tiny-policy gradient, one call", "step_call")]
  print("| workload | " + " | ".join(f"{n} ms" for n in SETTINGS) + " | default / each |")
  print("|---" * (len(SETTINGS) + 2) + "|")
  for label, key in rows:
    base = res["default"][key]
    ratios = ", ".join(f"{base / res[n][key]:.2f}x" for n in list(SETTINGS)[1:])
    print(f"| {label} | " + " | ".join(f"{res[n][key]:.1f}" for n in SETTINGS) + f" | {ratios} |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(res, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
