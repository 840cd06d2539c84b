"""Keeps a long CPU run's memory mappings under the kernel's limit.

XLA:CPU links every compiled program's kernels into memory of their own, three mappings or so per
kernel (code, read-only data, data), and keeps them while JAX caches the program. A run that compiles
many shapes (SFT over many length buckets, a build of several stages, a long training with its
evaluation and intervention programs) grows the process's mappings by hundreds to thousands per
program; past ``/proc/sys/vm/max_map_count`` (65,530 by default on Linux) LLVM fails with "Cannot
allocate memory" and the process dies, with free RAM to spare. A build of the tiny Retail policy
reached 46,000 mappings 400 steps into its second stage.

``relieve`` drops JAX's compiled programs (``jax.clear_caches``), which unmaps their code, once the
count passes a share of the limit; programs are compiled again when next called. The count is read
from ``/proc/self/maps``; where that or the limit cannot be read (not Linux) nothing is done.
"""

from __future__ import annotations

import gc
from typing import Callable

LIMIT_FILE = "/proc/sys/vm/max_map_count"
MAPS_FILE = "/proc/self/maps"
#: the share of the limit past which ``relieve`` drops the compiled programs
SHARE = 0.5


def mapping_count(path: str = MAPS_FILE) -> int | None:
  """The number of memory mappings of this process, or None where it cannot be read."""
  try:
    with open(path, "rb") as f:
      return f.read().count(b"\n")
  except OSError:
    return None


def mapping_limit(path: str = LIMIT_FILE) -> int | None:
  """The kernel's limit on a process's memory mappings, or None where it cannot be read."""
  try:
    with open(path) as f:
      return int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return None


def relieve(share: float = SHARE, log: Callable[[str], None] | None = None,
            count: Callable[[], int | None] = mapping_count, limit: Callable[[], int | None] = mapping_limit) -> bool:
  """Drops every compiled program (``jax.clear_caches``) when the process holds more than ``share``
  of the kernel's mapping limit; returns whether it did. Results are unchanged: the programs are
  compiled again when next called."""
  n, cap = count(), limit()
  if n is None or not cap or n <= share * cap:
    return False
  import jax

  jax.clear_caches()
  gc.collect()
  if log is not None:
    after = count()
    log(f"memory mappings {n:,} of the kernel's {cap:,}: dropped the compiled programs ({after:,} mappings now; "
        "they compile again when needed)")
  return True
