"""Padded shapes for jitted functions: a few sequence lengths, so jit compiles rarely."""

from __future__ import annotations


def bucket_length(n: int, minimum: int = 128, step: int = 128) -> int:
  """The padded length for ``n`` tokens: powers of two and their 1.5x up to 512, then multiples of
  ``step``. (The update's cost grows faster than linearly in T at the tiny policy's width: padding a
  1050-token batch to 1536 instead of 1152 costs ~2x; ``benchmarks/bench_update.py``.)"""
  size = minimum
  while size < n and size < 512:
    size = size * 3 // 2 if (size & (size - 1)) == 0 else size * 4 // 3
  if size >= n:
    return size
  return -(-n // step) * step
