"""``rti_jax.jit_maps``: compiled programs are dropped, and their code unmapped, before a long CPU
run's memory mappings reach the kernel's limit."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rti_jax import jit_maps

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux
def test_the_count_and_the_limit_are_read_from_proc(tmp_path):
  with open("/proc/self/maps") as f:
    lines = len(f.readlines())
  assert abs(jit_maps.mapping_count() - lines) < 50 and lines > 10
  with open("/proc/sys/vm/max_map_count") as f:
    assert jit_maps.mapping_limit() == int(f.read())
  assert jit_maps.mapping_count(str(tmp_path / "none")) is None
  bad = tmp_path / "limit"
  bad.write_text("many\n")
  assert jit_maps.mapping_limit(str(bad)) is None and jit_maps.mapping_limit(str(tmp_path / "none")) is None


@linux
def test_relieve_drops_the_compiled_programs_past_the_share_and_unmaps_their_code():
  @jax.jit
  def f(x):
    for _ in range(4):
      x = jnp.tanh(x) * jnp.cos(x) + 1.0
    return x.sum()

  for n in range(1, 13):
    f(jnp.ones((n, 3)))
  assert f._cache_size() == 12
  n = jit_maps.mapping_count()
  logs: list[str] = []
  assert not jit_maps.relieve(log=logs.append, limit=lambda: 2 * n + 100)  # under half the limit: kept
  assert f._cache_size() == 12 and logs == []
  assert not jit_maps.relieve(count=lambda: None) and not jit_maps.relieve(limit=lambda: None)  # unreadable: kept
  assert jit_maps.relieve(log=logs.append, limit=lambda: n)  # past half of it: dropped
  assert f._cache_size() == 0 and len(logs) == 1 and "dropped the compiled programs" in logs[0]
  assert jit_maps.mapping_count() < n  # the programs' code is unmapped
  x = np.ones((2, 3))
  for _ in range(4):
    x = np.tanh(x) * np.cos(x) + 1.0
  assert float(f(jnp.ones((2, 3)))) == pytest.approx(x.sum(), rel=1e-6) and f._cache_size() == 1  # compiled again
