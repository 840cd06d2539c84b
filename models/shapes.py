"""Padded shapes for jitted functions: a few distinct sizes, so jit compiles rarely.

One rule pads every sequence length (prompts, new-token budgets, update batches): the smallest
size of 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, ... (powers of two and, from
96 on, 1.5x a power of two) that holds the tokens; above ``linear_above`` (if given) the next
multiple of ``step`` instead, which wastes less where an update's cost grows faster than linearly
in the length; with ``per_octave`` the step grows with the length, at least a ``per_octave``-th of
the power of two below it, which bounds the count of distinct sizes (each one a compilation) of
long rows. Batch rows pad to a power of two (``bucket_rows``).
"""

from __future__ import annotations

#: The policy update's length buckets: at least 128 tokens, geometric up to 512, then multiples of 128.
UPDATE_BUCKETS: dict[str, int] = {"minimum": 128, "linear_above": 512, "step": 128}


def bucket_rows(n: int, minimum: int = 1) -> int:
  """The smallest power of two >= max(n, minimum, 1)."""
  n = max(int(n), int(minimum), 1)
  return 1 << (n - 1).bit_length()


def bucket_length(n: int, *, minimum: int = 16, linear_above: int | None = None, step: int = 128,
                  per_octave: int | None = None) -> int:
  """The padded length for ``n`` tokens (at least ``minimum``), by the module's rule."""
  m = max(int(n), int(minimum), 1)
  if linear_above is not None and m > linear_above:
    if per_octave:
      step = max(step, (1 << ((m - 1).bit_length() - 1)) // int(per_octave))
    return -(-m // step) * step
  p = bucket_rows(m)
  three_quarters = p // 4 * 3
  return three_quarters if p >= 128 and three_quarters >= m else p
