"""glibc allocator settings that keep freed host memory in the process, for long runs on the CPU
backend (opt-in: ``RTI_JAX_HOST_MALLOC=keep``).

XLA:CPU takes each program's output and temporary buffers from ``malloc``. glibc serves a block
above its mmap threshold (and, in a thread's own arena, any block over the arena heap's 64 MiB) with
a fresh ``mmap`` and returns it with ``munmap`` when it is freed. A training step on the CPU frees
and allocates buffers of tens of MiB to GiB many times over, so each one is mapped anew and every
page of it is zeroed again by the kernel. With every thread on the main arena (``MALLOC_ARENA_MAX=1``),
no mmap-served blocks (``MALLOC_MMAP_MAX_=0``) and a trim threshold far above any block
(``MALLOC_TRIM_THRESHOLD_``), freed memory is reused instead. The trade (docs/benchmarks.md): each
update of the default Navigation run takes 0.89x the time and the whole run about 5% less wall time,
for about half again the peak memory; but XLA's multi-threaded compilation, most likely sharing the one
arena's lock, gets slower, so short, compile-bound runs (``--quick``) take longer. Hence off by default.

glibc reads these variables when the process starts, so ``experiments/run.py`` re-executes itself
once with them set (``reexec_with_settings``) when ``RTI_JAX_HOST_MALLOC=keep``. Even then nothing
changes where the user set any allocator variable already, off Linux/glibc, where a GPU or TPU plugin
of jaxlib is installed, or where ``JAX_PLATFORMS`` names another platform.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from typing import Mapping

#: the settings, as environment variables glibc reads at start-up
SETTINGS: dict[str, str] = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 36),
}
#: allocator variables a user may have chosen: any of them leaves the environment as it is
USER_VARIABLES = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                  "MALLOC_TOP_PAD_", "GLIBC_TUNABLES", "LD_PRELOAD")
SWITCH = "RTI_JAX_HOST_MALLOC"  # "keep": the settings; anything else (the default): glibc's own
_ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin", "libtpu")


def on_glibc() -> bool:
  """Whether this process runs on Linux with glibc (whose allocator reads ``SETTINGS``)."""
  return sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


def settings_for(environ: Mapping[str, str], *, glibc: bool, accelerator_plugin: bool) -> dict[str, str] | None:
  """The variables to add to ``environ`` before the run starts, or None to leave it as it is."""
  if environ.get(SWITCH, "system") != "keep" or not glibc or accelerator_plugin:
    return None
  if any(v in environ for v in USER_VARIABLES):
    return None
  platforms = environ.get("JAX_PLATFORMS", "")
  if platforms and platforms.split(",")[0].strip().lower() != "cpu":
    return None
  return dict(SETTINGS)


def _accelerator_plugin_installed() -> bool:
  return any(importlib.util.find_spec(name) is not None for name in _ACCELERATOR_PLUGINS)


def reexec_with_settings() -> None:
  """Replaces this process by the same command with ``SETTINGS`` in its environment, where
  ``settings_for`` gives them (returns without doing anything otherwise). Without the switch it
  returns before looking at the C library or the installed plugins, so a default start pays nothing."""
  if os.environ.get(SWITCH) != "keep":
    return
  add = settings_for(os.environ, glibc=on_glibc(), accelerator_plugin=_accelerator_plugin_installed())
  if add is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, list(sys.orig_argv), {**os.environ, **add})
