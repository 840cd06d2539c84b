"""benchmarks/bench_scale.py: the datasheet peaks it divides by, and a sharded run on 8 CPU devices
whose JSON figures are checked against an independent FLOP count."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def bench_scale():
  sys.path.insert(0, str(ROOT / "benchmarks"))
  try:
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "benchmarks" / "bench_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
  finally:
    sys.path.remove(str(ROOT / "benchmarks"))


@pytest.mark.parametrize("kind, tflops", [
  ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA H100 80GB HBM3", 989.0),
  ("NVIDIA H100 PCIe", 756.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.0),
  ("NVIDIA L4", 121.0), ("TPU v5 lite", 197.0), ("TPU v5", 459.0), ("cpu", None),
])
def test_spec_peak_reads_the_dense_bf16_datasheet_figure_of_the_device_kind(kind, tflops):
  assert bench_scale().spec_peak(kind) == tflops


@pytest.mark.slow
def test_a_sharded_run_writes_figures_that_match_an_independent_flop_count(tmp_path):
  out = tmp_path / "scale.json"
  # the tests' XLA flags (tests/conftest.py) and 8 host devices
  xla = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla)
  proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_scale.py"), "--size", "tiny", "--iters", "1",
                         "--mesh", "fsdp=4,tensor=2", "--peak", "0.5", "--gen-batch", "8", "--prompt", "24",
                         "--new", "8", "--train-batch", "8", "--train-len", "64", "--json", str(out)],
                        env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads(out.read_text())
  assert res["devices"] == 8 and res["mesh"] == {"data": 1, "fsdp": 4, "tensor": 2}
  assert res["sharded_params"] > 0 and res["param_tensors"] > res["sharded_params"] // 2
  # tiny: 4 layers, hidden 128, 4 heads x 32 (2 kv heads), mlp 384, vocab 1024, tied head
  n = 4 * (128 * 32 * (2 * 4 + 2 * 2) + 3 * 128 * 384) + 128 * 1024
  u = res["update"]
  flops = 8 * 64 * (6 * n + 12 * 4 * 4 * 32 * 64)
  assert u["tokens_per_s"] == pytest.approx(8 * 64 / u["s"])
  assert u["mfu"] == pytest.approx(flops / u["s"] / 1e12 / (8 * 0.5), rel=1e-9)
  for part in ("generate", "score"):
    assert res[part]["s"] > 0 and 0 < res[part]["mfu"] < 1
