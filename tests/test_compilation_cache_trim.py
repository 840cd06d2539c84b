"""The test run's compiled-program cache is trimmed to its size at the end (tests/conftest.py)."""

from __future__ import annotations

import os

from conftest import trim_compilation_cache


def test_trim_keeps_the_most_recent_entries_that_fit_and_drops_access_time_files(tmp_path) -> None:
  sizes = [300, 200, 500, 100, 400]
  for i, size in enumerate(sizes):
    f = tmp_path / f"k{i}-cache"
    f.write_bytes(b"x" * size)
    os.utime(f, (1000 + 10 * i, 1000 + 10 * i))  # k4 is the most recent
  os.utime(tmp_path / "k0-cache", (2000, 1000))  # read last: the most recently used
  (tmp_path / "k1-atime").write_bytes(b"12345678")
  deleted = trim_compilation_cache(tmp_path, 1000)
  # brute force: the largest set of the most recent entries (by use) whose sizes fit in 1000
  order = [0, 4, 3, 2, 1]  # most recent first
  keep = next(order[:n] for n in range(len(order), -1, -1) if sum(sizes[i] for i in order[:n]) <= 1000)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"k{i}-cache" for i in keep)
  assert deleted == len(sizes) - len(keep) == 2
  assert trim_compilation_cache(tmp_path, 1000) == 0


def test_trim_leaves_a_cache_under_its_size_alone(tmp_path) -> None:
  for i in range(3):
    (tmp_path / f"k{i}-cache").write_bytes(b"x" * 10)
  assert trim_compilation_cache(tmp_path, 30) == 0
  assert len(list(tmp_path.iterdir())) == 3
