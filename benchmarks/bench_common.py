"""What every benchmark here prints and how it times: the machine with its load average, and
medians of calls run in alternation, so that a load change during a run hits both sides alike."""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable


def load_average() -> float:
  """The 1-minute load average (NaN where the OS has none)."""
  return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def machine() -> str:
  """Accelerator, host CPU, visible cores, the load average now, library versions."""
  import jax

  cpu = platform.processor() or "unknown cpu"
  try:
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  dev = jax.devices()[0]
  return (f"{dev.platform}:{dev.device_kind} x{len(jax.devices())}; host cpu '{cpu}', "
          f"{os.cpu_count()} logical cores, load avg {load_average():.2f}; jax {jax.__version__}")


def alternating_medians(fns: dict[str, Callable[[], object]], iters: int) -> dict[str, float]:
  """Median seconds per call of each function (each must block until its result is ready).

  Each runs once first (compile / warm-up, not timed); then ``iters`` rounds call every function
  once, in turn, so slow and fast moments of a shared machine fall on all of them.
  """
  for fn in fns.values():
    fn()
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(iters):
    for name, fn in fns.items():
      t0 = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(ts) for name, ts in times.items()}


def parse_mesh(text: str) -> dict[str, int]:
  """'fsdp=4,tensor=2' -> {'data': 1, 'fsdp': 4, 'tensor': 2} (the axes of ``rti_jax.sharding``)."""
  sizes = {"data": 1, "fsdp": 1, "tensor": 1}
  for part in filter(None, text.split(",")):
    name, _, value = part.partition("=")
    if name not in sizes or not value.isdigit():
      raise SystemExit(f"--mesh: expected name=size with name in {sorted(sizes)}, got {part!r}")
    sizes[name] = int(value)
  return sizes


def navigation_update_batch(overrides: list[str], prefix: str) -> tuple[object, list]:
  """A trainer of ``configs/navigation.yaml`` (``overrides`` on top) and the rollout groups of its
  first iteration (a real batch for ``Trainer.update``: multi-turn episodes with system prompt, tool
  results and assistant turns); the iteration's own update has run."""
  import tempfile

  from rti_jax.config import load_config
  from rti_jax.trainer import Trainer

  cfg = load_config("navigation", ["train.val_tasks=0", "train.eval_every=1000", *overrides])
  trainer = Trainer(cfg, tempfile.mkdtemp(prefix=prefix), progress=False)
  update, captured = trainer.update, {}

  def capture(groups):
    captured["groups"] = groups
    return update(groups)

  trainer.update = capture
  trainer.iterate()
  trainer.update = update
  return trainer, captured["groups"]
