"""A host-side store of KV caches keyed by token prefix, for multi-turn sampling.

A multi-turn rollout asks the sampler, turn after turn, for a continuation of a context that
extends the previous turn's context (prompt + the turn it generated + the environment's reply).
Without a store every turn prefills the whole context again: attention cost grows with the square
of the context per turn. :class:`PrefixCache` keeps, for each generated row, the KV entries of
every token the sampler fed (prompt and generated tokens), so the next turn prefills only the
tokens after its longest stored prefix (the reply and the new turn's header).

Lookup is exact on token ids: a rolling polynomial hash over the prompt's prefixes (one vectorised
pass per prompt) finds candidate lengths, and a candidate counts only if its ids equal the
prompt's first ids. The store evicts least-recently-used entries beyond ``max_bytes`` and must be
cleared whenever the weights change (``Sampler.sync_weights`` does).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np

_HASH_BASE = np.uint64(1_000_003)


def prefix_hashes(ids: np.ndarray, powers: np.ndarray) -> np.ndarray:
  """h[k] = sum_{t<k} (ids[t] + 1) * base**t (mod 2**64), for k = 0 .. len(ids): [len(ids) + 1] uint64."""
  terms = (ids.astype(np.uint64) + np.uint64(1)) * powers[:len(ids)]
  out = np.zeros(len(ids) + 1, np.uint64)
  np.cumsum(terms, dtype=np.uint64, out=out[1:])
  return out


@dataclasses.dataclass
class Entry:
  """Stored KV of ``ids``: ``kv[layer, 0 / 1 (k / v), kv_head, t, head_dim]`` for t < len(ids)."""

  ids: np.ndarray
  kv: np.ndarray

  @property
  def nbytes(self) -> int:
    return int(self.kv.nbytes + self.ids.nbytes)


class PrefixCache:
  """LRU store of per-row KV caches (see the module docstring).

  max_bytes: entries beyond this total are evicted, least recently used first (an entry larger
  than ``max_bytes`` is not stored). Counters: ``hits`` / ``misses`` (lookups), ``reused_tokens``
  (prefill tokens saved), ``evictions``.
  """

  def __init__(self, max_bytes: int, max_len: int):
    if int(max_bytes) < 1:
      raise ValueError(f"max_bytes: expected >= 1, got {max_bytes}")
    self.max_bytes = int(max_bytes)
    steps = np.full(int(max_len) + 1, _HASH_BASE, np.uint64)
    steps[0] = 1
    self.powers = np.cumprod(steps, dtype=np.uint64)  # base**t mod 2**64 (uint64 wraps)
    self._entries: collections.OrderedDict[tuple[int, int], Entry] = collections.OrderedDict()
    self._lengths: collections.Counter[int] = collections.Counter()
    self.bytes = 0
    self.hits = self.misses = self.reused_tokens = self.evictions = 0

  def __len__(self) -> int:
    return len(self._entries)

  def clear(self) -> None:
    """Drops every entry (the weights changed); counters are kept."""
    self._entries.clear()
    self._lengths.clear()
    self.bytes = 0

  def _key(self, ids: np.ndarray) -> tuple[int, int]:
    return len(ids), int(prefix_hashes(ids, self.powers)[-1])

  def lookup(self, ids: Sequence[int] | np.ndarray, max_reuse: int | None = None) -> Entry | None:
    """The stored entry with the longest ids that are a prefix of ``ids`` (at most ``max_reuse``
    of them, default ``len(ids) - 1``: a prompt keeps at least one token to prefill), or None."""
    ids = np.asarray(ids, np.int32)
    limit = len(ids) - 1 if max_reuse is None else min(int(max_reuse), len(ids))
    if not self._entries or limit < 1:
      self.misses += 1
      return None
    hashes = prefix_hashes(ids[:limit], self.powers)
    for n in sorted((n for n in self._lengths if n <= limit), reverse=True):
      key = (n, int(hashes[n]))
      entry = self._entries.get(key)
      if entry is not None and np.array_equal(entry.ids, ids[:n]):
        self._entries.move_to_end(key)
        self.hits += 1
        self.reused_tokens += n
        return entry
    self.misses += 1
    return None

  def put(self, ids: Sequence[int] | np.ndarray, kv: np.ndarray) -> None:
    """Stores ``kv`` ([layers, 2, kv_heads, len(ids), head_dim]) for ``ids``."""
    ids = np.asarray(ids, np.int32).copy()
    if kv.ndim != 5 or kv.shape[3] != len(ids):
      raise ValueError(f"kv: expected [layers, 2, kv_heads, {len(ids)}, head_dim], got {kv.shape}")
    entry = Entry(ids, kv)
    if entry.nbytes > self.max_bytes or len(ids) == 0:
      return
    key = self._key(ids)
    old = self._entries.pop(key, None)
    if old is not None:
      self.bytes -= old.nbytes
      self._lengths[len(old.ids)] -= 1
    self._entries[key] = entry
    self._lengths[len(ids)] += 1
    self.bytes += entry.nbytes
    while self.bytes > self.max_bytes:
      _, gone = self._entries.popitem(last=False)
      self.bytes -= gone.nbytes
      self._lengths[len(gone.ids)] -= 1
      if self._lengths[len(gone.ids)] == 0:
        del self._lengths[len(gone.ids)]
      self.evictions += 1

  def stats(self) -> dict[str, int]:
    return {"entries": len(self._entries), "bytes": self.bytes, "hits": self.hits, "misses": self.misses,
            "reused_tokens": self.reused_tokens, "evictions": self.evictions}
