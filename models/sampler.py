"""Batched KV-cache sampling and teacher-forced scoring for the Qwen module.

Two entry points, both jit-compiled once per shape bucket (batch rounded up to a power of two,
prompt length and new-token count to ``rti_jax.shapes.bucket_length``, so a rollout loop does not recompile):

* :meth:`Sampler.generate` — left-padded prompts, one prefill, then a ``lax.while_loop``
  decode with per-row early stop; returns the sampled ids and, for each id, its
  log-prob under the policy (``log softmax(logits)``, temperature 1: the behaviour
  log-prob pi_roll the RL loss needs) and under the sampling distribution actually used.
* :func:`score` — per-token log-probs of given responses under given prompts: the one
  function the perplexity gate PPL_roll = exp(-mean_t log pi_roll) (Eq. 3) and the
  calibration ratio rho = pi_cal / pi_roll (Eq. 5, clipped in Eq. 6, used in Eq. 7) read.

Sampling settings (temperature / top-p / top-k) are traced values, not static, so
changing them does not recompile. ``temperature == 0`` is greedy.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.decode_copy import DecodeCopy, state_mesh
from models.prefix_cache import PrefixCache
from models.qwen import LayerCache, Qwen, causal_padding_mask, positions_from_mask
from models.scoring import check_ids as _check_ids
from models.scoring import pack_rows
from models.scoring import score_jit as _score_jit
from models.axes import DECODE_AXIS_RULES, activation_sharding
from models.shapes import bucket_length, bucket_rows

_MIN_CACHED_ROWS = 8  # the prefix-cache path pads a call to at least this many rows (a power of two) ...
_MIN_CACHED_REST = 128  # ... and the ids after the stored prefixes to a power of two of at least this
_MIN_SHARED_PREFIX = 32  # prompts of one call that miss the prefix cache and share >= this many ids share a prefill


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  """Per-prompt results of :meth:`Sampler.generate` (row i belongs to prompt i).

  tokens[i]: [n_i] int32 generated ids, including the stop id if one was produced.
  logprobs[i]: [n_i] fp32 log pi(token) under the model at temperature 1 (the
    behaviour-policy log-prob; equals :func:`score` of the same tokens).
  sampling_logprobs[i]: [n_i] fp32 log-prob under the distribution sampled from
    (after temperature / top-k / top-p); 0 for greedy rows.
  finish_reasons[i]: "stop" if a stop id ended the row, else "length".
  """

  tokens: list[np.ndarray]
  logprobs: list[np.ndarray]
  sampling_logprobs: list[np.ndarray]
  finish_reasons: list[str]


def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
  """Top-k then top-p (nucleus) filtering, as in transformers' logits warpers.

  logits: [B, V] fp32 (already divided by the temperature); top_k: [B] int (0 = off);
  top_p: [B] float (1 = off). Returns logits with filtered tokens set to -inf. A token is
  kept by top-p if the probability mass of the tokens ranked above it is < top_p
  (the top token is always kept). Ties at the cut-off are all kept.
  """
  v = logits.shape[-1]
  sorted_desc = -jnp.sort(-logits, axis=-1)  # [B, V]
  k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)  # [B]
  rank = jnp.arange(v)[None, :]
  in_top_k = rank < k[:, None]
  probs = jax.nn.softmax(jnp.where(in_top_k, sorted_desc, -jnp.inf), axis=-1)
  mass_above = jnp.cumsum(probs, axis=-1) - probs
  keep = in_top_k & ((mass_above < top_p[:, None]) | (rank == 0))
  n_keep = jnp.sum(keep, axis=-1)  # [B] >= 1
  threshold = jnp.take_along_axis(sorted_desc, (n_keep - 1)[:, None], axis=-1)  # [B, 1]
  return jnp.where(logits >= threshold, logits, -jnp.inf)


def inverse_cdf_draw(key: jax.Array, logits: jax.Array) -> jax.Array:
  """One id per row of ``softmax(logits)`` ([B, V], -inf = excluded): the first id whose cumulative
  probability exceeds ``u`` times the row's total, for one uniform ``u`` per row.

  The same law as ``jax.random.categorical`` (Gumbel-max), from B uniforms instead of B x V Gumbel
  draws: on a CPU the noise was most of a small model's decode step. An excluded id is never
  drawn: its cumulative probability equals its predecessor's, and an id past the last one with
  mass (a rounding case at ``u`` near 1) is moved back to that one.
  """
  probs = jax.nn.softmax(logits, axis=-1)
  return invert_cdf(probs, jax.random.uniform(key, (logits.shape[0],), dtype=probs.dtype))


def invert_cdf(probs: jax.Array, u: jax.Array) -> jax.Array:
  """probs: [B, V] >= 0; u: [B] in [0, 1]. The first id whose cumulative probability exceeds
  ``u * total``, never one without mass (``inverse_cdf_draw``)."""
  cdf = jnp.cumsum(probs, axis=-1)
  first_above = jnp.sum(cdf <= u[:, None] * cdf[:, -1:], axis=-1)
  last_with_mass = probs.shape[-1] - 1 - jnp.argmax(probs[:, ::-1] > 0, axis=-1)
  return jnp.minimum(first_above, last_with_mass).astype(jnp.int32)


def sample_step(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: jax.Array,
                top_p: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Draws one token per row.

  logits: [B, V] fp32; temperature, top_p: [B] float; top_k: [B] int.
  Returns tokens [B] int32, logprobs [B] (log softmax(logits), temperature 1) and
  sampling_logprobs [B] (log-prob under the filtered, tempered distribution; 0 if greedy).
  """
  greedy = temperature <= 0.0
  t = jnp.where(greedy, 1.0, temperature)
  scaled = logits / t[:, None]
  needs_filter = jnp.any((top_k > 0) | (top_p < 1.0))
  filtered = jax.lax.cond(needs_filter, filter_logits, lambda x, *_: x, scaled, top_k, top_p)
  sampled = inverse_cdf_draw(key, filtered)
  tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)[:, 0]
  slogp = jnp.take_along_axis(jax.nn.log_softmax(filtered, axis=-1), tokens[:, None], axis=-1)[:, 0]
  return tokens, logp, jnp.where(greedy, 0.0, slogp)


@functools.partial(jax.jit, static_argnames=("graphdef", "num_new", "mesh"))
def _generate_jit(graphdef: nnx.GraphDef, state: nnx.State, prompt_ids: jax.Array,
                  prompt_mask: jax.Array, row_valid: jax.Array, key: jax.Array,
                  max_new_tokens: jax.Array, temperature: jax.Array, top_k: jax.Array,
                  top_p: jax.Array, stop_ids: jax.Array, pad_id: jax.Array, num_new: int, mesh: Any = None):
  """prompt_ids, prompt_mask: [B, P] left-padded; row_valid: [B] bool; stop_ids: [K] (-1 = none).
  mesh: the decoding mesh (activation constraints by ``DECODE_AXIS_RULES``), or None.

  Returns tokens [B, num_new], logprobs, sampling_logprobs [B, num_new], n_generated [B],
  stopped [B].
  """
  with activation_sharding(mesh, DECODE_AXIS_RULES):
    model = nnx.merge(graphdef, state)
    b, p = prompt_ids.shape
    cache = model.init_cache(b, p + num_new)
    prefill_mask = jnp.concatenate(
      [causal_padding_mask(prompt_mask), jnp.zeros((b, p, num_new), bool)], axis=-1)
    h, cache = model.forward(prompt_ids, positions_from_mask(prompt_mask), prefill_mask, cache, 0, causal=True)
    logits = model.logits(h[:, -1])
    lengths = jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)  # [B] next position per row
    prompt_keys = prompt_mask.astype(bool)

    def feed(tok, cache, step):
      gen_keys = jnp.arange(num_new)[None, :] <= step
      mask = jnp.concatenate([prompt_keys, jnp.broadcast_to(gen_keys, (b, num_new))], axis=-1)
      h, cache = model.forward(tok[:, None], (lengths + step)[:, None], mask[:, None, :], cache, p + step)
      return model.logits(h[:, 0]), cache

    toks, lps, slps, n_gen, stopped, _ = _decode(feed, logits, cache, key, row_valid, max_new_tokens, temperature,
                                                 top_k, top_p, stop_ids, pad_id, num_new)
    return toks, lps, slps, n_gen, stopped


def _decode(feed: Any, logits: jax.Array, cache: Any, key: jax.Array, row_valid: jax.Array,
            max_new_tokens: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
            stop_ids: jax.Array, pad_id: jax.Array, num_new: int):
  """The decode loop of both generate paths: per step, sample from ``logits``, record, and
  ``feed(tok, cache, step) -> (next logits, cache)``; rows stop at a stop id. Returns tokens,
  logprobs, sampling_logprobs [B, num_new], n_generated [B], stopped [B] and the cache."""
  b = logits.shape[0]

  def cond(carry):
    step, _, _, _, done, *_ = carry
    return (step < max_new_tokens) & ~jnp.all(done)

  def body(carry):
    step, logits, cache, key, done, toks, lps, slps, n_gen, stopped = carry
    key, sub = jax.random.split(key)
    tok, lp, slp = sample_step(logits, sub, temperature, top_k, top_p)
    tok = jnp.where(done, pad_id, tok)
    toks = toks.at[:, step].set(tok)
    lps = lps.at[:, step].set(jnp.where(done, 0.0, lp))
    slps = slps.at[:, step].set(jnp.where(done, 0.0, slp))
    n_gen = n_gen + (~done).astype(jnp.int32)
    hit = jnp.any(tok[:, None] == stop_ids[None, :], axis=-1) & ~done
    stopped = stopped | hit
    done = done | hit
    logits, cache = feed(tok, cache, step)
    return (step + 1, logits, cache, key, done, toks, lps, slps, n_gen, stopped)

  zeros = jnp.zeros((b, num_new), jnp.float32)
  carry = (jnp.int32(0), logits, cache, key, ~row_valid,
           jnp.full((b, num_new), pad_id, jnp.int32), zeros, zeros,
           jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool))
  _, _, cache, _, _, toks, lps, slps, n_gen, stopped = jax.lax.while_loop(cond, body, carry)
  return toks, lps, slps, n_gen, stopped, cache


@functools.partial(jax.jit, static_argnames=("graphdef", "num_new", "mesh"), donate_argnames=("cache",))
def _generate_cached_jit(graphdef: nnx.GraphDef, state: nnx.State, cache: list[LayerCache], ids: jax.Array,
                         n_in: jax.Array, start: jax.Array, row_valid: jax.Array, key: jax.Array,
                         max_new_tokens: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                         stop_ids: jax.Array, pad_id: jax.Array, num_new: int, mesh: Any = None):
  """The prefix-cache path: no padding inside a row, slot = position.

  cache: per layer k, v ``[B, Kv, S, D]`` whose slots ``[0, start_i)`` hold row i's stored prefix;
  ids: ``[B, R]`` the rest of each prompt, right-padded (``n_in[i]`` real ids, >= 1 for valid rows).
  The rest is prefilled at slots ``start_i ..`` (pad ids write slots the decode overwrites before
  any query sees them), then the decode writes slot ``start_i + n_in_i + step``. Returns what
  :func:`_generate_jit` returns and the cache, whose slots ``[0, start_i + n_in_i + n_gen_i)``
  hold the prompt and every generated id (each sampled id is fed before the loop ends).
  """
  with activation_sharding(mesh, DECODE_AXIS_RULES):
    model = nnx.merge(graphdef, state)
    b, r = ids.shape
    slots = jnp.arange(cache[0].k.shape[2])
    positions = start[:, None] + jnp.arange(r)[None, :]
    h, cache = model.forward(ids, positions, slots[None, None, :] <= positions[:, :, None], cache, start)
    last = jnp.clip(n_in - 1, 0, r - 1)
    logits = model.logits(h[jnp.arange(b), last])
    lengths = start + n_in  # next slot per row

    def feed(tok, cache, step):
      pos = lengths + step
      h, cache = model.forward(tok[:, None], pos[:, None], slots[None, None, :] <= pos[:, None, None], cache, pos)
      return model.logits(h[:, 0]), cache

    return _decode(feed, logits, cache, key, row_valid, max_new_tokens, temperature, top_k, top_p, stop_ids, pad_id,
                   num_new)


def _common_prefix_len(rows: Sequence[np.ndarray]) -> int:
  """Length of the longest common prefix of ``rows``."""
  n = min(len(r) for r in rows)
  first = rows[0][:n]
  for r in rows[1:]:
    diff = np.flatnonzero(r[:n] != first)
    n = int(diff[0]) if diff.size else n
    first = first[:n]
  return n


class Sampler:
  """Owns the jitted generate/score functions for one model.

  max_cache_len: the most slots a row may use (prompt + new tokens); default the
    model's ``max_position_embeddings``.
  max_attention_bytes: a batch whose fp32 attention scores ``[B, heads, T, T + new]`` would
    exceed this is run in consecutive sub-batches (each a power of two of rows), so a large
    group of long episodes does not run the host out of memory. A sub-batch ``i`` of
    ``generate`` samples with ``jax.random.fold_in(key, i)``; below the limit nothing changes.
  prefix_cache_bytes: > 0 keeps the KV of every generated row (prompt and sampled ids) in a
    :class:`~models.prefix_cache.PrefixCache` of this size, and ``generate`` prefills only what
    follows a prompt's longest stored prefix: a multi-turn episode's next turn prefills the
    environment's reply instead of the whole conversation. Prompts of one call that miss and share
    a prefix (the system prompt) prefill it once. Each row then has its own slots, no padding; its
    logits equal the default path's up to float rounding, so a seed may sample other ids than
    with 0 (the default: no store, every prompt prefilled whole). ``sync_weights`` clears it.
    Entries live in host memory (per token: layers x 2 x kv heads x head dim values; 0.75 KB for
    the tiny Telecom policy, 144 KB for Qwen3-8B in bf16), so it suits small models; at scale
    SGLang's own prefix (radix) cache does this job.
  mesh: the devices to decode on (a ``rti_jax.sharding.make_mesh`` mesh); default: the mesh the
    model's parameters are spread over, if any. The sampler keeps its own copy of the parameters
    (``models.decode_copy``): in ``param_dtype`` (default the model's compute dtype ``model.dtype``:
    a bf16 copy of fp32 master weights), laid out by ``rti_jax.sharding.DECODE_AXIS_RULES`` on that
    mesh; ``sync_weights`` refreshes it on the devices. Parameters already in that dtype and
    layout are used without a copy.
  """

  def __init__(self, model: Qwen, *, max_cache_len: int | None = None, max_attention_bytes: int = 1 << 30,
               prefix_cache_bytes: int = 0, mesh: Any = None, param_dtype: Any = None):
    self.config = model.config
    self.max_cache_len = int(max_cache_len or model.config.max_position_embeddings)
    if int(max_attention_bytes) < 1:
      raise ValueError(f"max_attention_bytes: expected >= 1, got {max_attention_bytes}")
    if int(prefix_cache_bytes) < 0:
      raise ValueError(f"prefix_cache_bytes: expected >= 0, got {prefix_cache_bytes}")
    self.max_attention_bytes = int(max_attention_bytes)
    self.prefix_cache = PrefixCache(prefix_cache_bytes, self.max_cache_len) if prefix_cache_bytes else None
    self.cache_dtype = np.dtype(model.dtype)
    self.graphdef, state = nnx.split(model)
    mesh = state_mesh(state) if mesh is None else mesh
    self.mesh = mesh if mesh is not None and mesh.size > 1 else None
    self._decode_copy = DecodeCopy(state, mesh=mesh, dtype=model.dtype if param_dtype is None else param_dtype)
    self.state = self._decode_copy(state)

  def _rows_per_call(self, length: int, width: int) -> int:
    """The most rows (a power of two, >= 1) whose attention scores fit ``max_attention_bytes``."""
    per_row = 4 * self.config.num_heads * int(length) * int(width)
    rows = max(1, self.max_attention_bytes // max(per_row, 1))
    return 1 << (rows.bit_length() - 1)

  def sync_weights(self, model: Qwen) -> None:
    """Uses ``model``'s current parameters (same architecture) from now on."""
    graphdef, state = nnx.split(model)
    if graphdef != self.graphdef:
      raise ValueError("model: expected the same architecture as the sampler's model, got a different graph")
    self.state = None  # the old copy is freed before the new one is made
    self.state = self._decode_copy(state)
    if self.prefix_cache is not None:
      self.prefix_cache.clear()  # stored keys and values were computed with the old weights

  def generate(self, prompts: Sequence[Sequence[int]], *, key: jax.Array, max_new_tokens: int = 256,
               temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
               stop_token_ids: Sequence[int] = (), pad_id: int = 0) -> GenerateOutput:
    """Samples one continuation per prompt (batched). See :class:`GenerateOutput`.

    prompts: B lists of token ids (non-empty, in vocab). key: a ``jax.random`` key.
    Raises ValueError on empty prompts, out-of-vocab ids, bad settings, or a prompt
    that with ``max_new_tokens`` does not fit ``max_cache_len``.
    """
    rows = _check_ids("prompts", prompts, self.config.vocab_size, allow_empty=False)
    if not rows:
      raise ValueError("prompts: expected at least one prompt, got 0")
    if int(max_new_tokens) < 1:
      raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    if not 0.0 < float(top_p) <= 1.0:
      raise ValueError(f"top_p: expected in (0, 1], got {top_p}")
    if int(top_k) < 0 or float(temperature) < 0 or not np.isfinite(temperature):
      raise ValueError(f"top_k >= 0 and finite temperature >= 0 expected, got top_k={top_k}, "
                       f"temperature={temperature}")
    longest = max(len(r) for r in rows)
    if longest + max_new_tokens > self.max_cache_len:
      i = int(np.argmax([len(r) for r in rows]))
      raise ValueError(f"prompts[{i}]: {len(rows[i])} tokens + max_new_tokens={max_new_tokens} "
                       f"exceed the cache (max_cache_len={self.max_cache_len})")
    if not 0 <= int(pad_id) < self.config.vocab_size:
      raise ValueError(f"pad_id: expected an id in [0, {self.config.vocab_size}), got {pad_id}")
    stops = [int(s) for s in stop_token_ids]
    if any(not 0 <= s < self.config.vocab_size for s in stops):
      raise ValueError(f"stop_token_ids: expected ids in [0, {self.config.vocab_size}), got {stops}")
    if self.prefix_cache is not None:
      return self._generate_cached(rows, key, int(max_new_tokens), float(temperature), float(top_p), int(top_k),
                                   stops, int(pad_id))
    b = len(rows)
    bb, pb, nb = bucket_rows(b), bucket_length(longest), bucket_length(max_new_tokens)
    per_call = self._rows_per_call(pb, pb + nb)
    if b > per_call:
      parts = [self.generate(rows[i:i + per_call], key=jax.random.fold_in(key, j), max_new_tokens=max_new_tokens,
                             temperature=temperature, top_p=top_p, top_k=top_k, stop_token_ids=stop_token_ids,
                             pad_id=pad_id)
               for j, i in enumerate(range(0, b, per_call))]
      return GenerateOutput(*(sum((getattr(o, f.name) for o in parts), [])
                              for f in dataclasses.fields(GenerateOutput)))
    ids = np.full((bb, pb), pad_id, np.int32)
    mask = np.zeros((bb, pb), np.int32)
    for i, r in enumerate(rows):  # left padding
      ids[i, pb - len(r):] = r
      mask[i, pb - len(r):] = 1
    stop_arr = np.full((bucket_rows(len(stops), 8),), -1, np.int32)
    stop_arr[:len(stops)] = stops
    valid = np.arange(bb) < b
    fill = lambda v, dt: jnp.full((bb,), v, dt)
    toks, lps, slps, n_gen, stopped = _generate_jit(
      self.graphdef, self.state, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(valid), key,
      jnp.int32(max_new_tokens), fill(temperature, jnp.float32), fill(top_k, jnp.int32),
      fill(top_p, jnp.float32), jnp.asarray(stop_arr), jnp.int32(pad_id), num_new=nb, mesh=self.mesh)
    toks, lps, slps, n_gen, stopped = jax.device_get((toks, lps, slps, n_gen, stopped))
    return GenerateOutput(
      tokens=[toks[i, :n_gen[i]] for i in range(b)],
      logprobs=[lps[i, :n_gen[i]] for i in range(b)],
      sampling_logprobs=[slps[i, :n_gen[i]] for i in range(b)],
      finish_reasons=["stop" if stopped[i] else "length" for i in range(b)],
    )

  def _generate_cached(self, rows: list[np.ndarray], key: jax.Array, max_new_tokens: int, temperature: float,
                       top_p: float, top_k: int, stops: list[int], pad_id: int) -> GenerateOutput:
    """``generate`` with the prefix cache (checked arguments; see the class docstring)."""
    cache = self.prefix_cache
    hits = [cache.lookup(r) for r in rows]
    groups: dict[bytes, list[np.ndarray]] = {}
    for r, e in zip(rows, hits):
      if e is None and len(r) > _MIN_SHARED_PREFIX:
        groups.setdefault(r[:_MIN_SHARED_PREFIX].tobytes(), []).append(r)
    shared = [g[0][:min(_common_prefix_len(g), min(len(r) for r in g) - 1)] for g in groups.values() if len(g) > 1]
    shared = [p for p in shared if len(p) >= _MIN_SHARED_PREFIX]
    if shared:  # prompts that missed and share a prefix: prefill it once, as a row of its own
      self._cached_call(shared, [None] * len(shared), key, 1, 0.0, 1.0, 0, [], pad_id, keep_generated=False)
      hits = [e if e is not None else cache.lookup(r) for r, e in zip(rows, hits)]
    return self._cached_call(rows, hits, key, max_new_tokens, temperature, top_p, top_k, stops, pad_id)

  def _cached_call(self, rows: list[np.ndarray], hits: list[Any], key: jax.Array, max_new_tokens: int,
                   temperature: float, top_p: float, top_k: int, stops: list[int], pad_id: int,
                   keep_generated: bool = True) -> GenerateOutput:
    """One jitted call (or consecutive sub-batches) from the stored prefixes ``hits`` (None: no
    prefix); stores each row's prompt (and, with ``keep_generated``, its generated ids) after it."""
    b = len(rows)
    starts = [0 if e is None else len(e.ids) for e in hits]
    nb = bucket_length(max_new_tokens)
    # Coarser than the whole-prefill path's buckets: here a program is keyed by rows, rest and
    # cache width, and a multi-turn run meets many of those (64 programs in the default Navigation
    # run with the finer buckets, 2 s of compilation each; docs/benchmarks.md).
    rb = bucket_rows(max(len(r) - c for r, c in zip(rows, starts)), _MIN_CACHED_REST)
    width = bucket_length(max(max(starts) + rb, max(len(r) for r in rows) + nb))
    per_call = self._rows_per_call(rb, width)
    if b > per_call:
      parts = [self._cached_call(rows[i:i + per_call], hits[i:i + per_call], jax.random.fold_in(key, j),
                                 max_new_tokens, temperature, top_p, top_k, stops, pad_id, keep_generated)
               for j, i in enumerate(range(0, b, per_call))]
      return GenerateOutput(*(sum((getattr(o, f.name) for o in parts), [])
                              for f in dataclasses.fields(GenerateOutput)))
    c = self.config
    bb = max(bucket_rows(b), min(_MIN_CACHED_ROWS, per_call))  # padding rows stay within the attention budget
    ids = np.full((bb, rb), pad_id, np.int32)
    n_in = np.zeros((bb,), np.int32)
    start = np.zeros((bb,), np.int32)
    layers = []
    for layer in range(c.num_layers):
      k = np.zeros((bb, c.num_kv_heads, width, c.head_dim), self.cache_dtype)
      v = np.zeros_like(k)
      for i, e in enumerate(hits):
        if e is not None:
          k[i, :, :starts[i]], v[i, :, :starts[i]] = e.kv[layer, 0], e.kv[layer, 1]
      layers.append(LayerCache(jnp.asarray(k), jnp.asarray(v)))
    for i, r in enumerate(rows):
      start[i], n_in[i] = starts[i], len(r) - starts[i]
      ids[i, :n_in[i]] = r[starts[i]:]
    stop_arr = np.full((bucket_rows(len(stops), 8),), -1, np.int32)
    stop_arr[:len(stops)] = stops
    fill = lambda v, dt: jnp.full((bb,), v, dt)
    out = _generate_cached_jit(
      self.graphdef, self.state, layers, jnp.asarray(ids), jnp.asarray(n_in), jnp.asarray(start),
      jnp.asarray(np.arange(bb) < b), key, jnp.int32(max_new_tokens), fill(temperature, jnp.float32),
      fill(top_k, jnp.int32), fill(top_p, jnp.float32), jnp.asarray(stop_arr), jnp.int32(pad_id), num_new=nb,
      mesh=self.mesh)
    toks, lps, slps, n_gen, stopped, layers = jax.device_get(out)
    for i, r in enumerate(rows):
      n = int(n_gen[i]) if keep_generated else 0
      fed = len(r) + n
      self.prefix_cache.put(np.concatenate([r, toks[i, :n]]),
                            np.stack([np.stack([lc.k[i, :, :fed], lc.v[i, :, :fed]]) for lc in layers]))
    return GenerateOutput(
      tokens=[toks[i, :n_gen[i]] for i in range(b)],
      logprobs=[lps[i, :n_gen[i]] for i in range(b)],
      sampling_logprobs=[slps[i, :n_gen[i]] for i in range(b)],
      finish_reasons=["stop" if stopped[i] else "length" for i in range(b)],
    )

  def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
            temperature: float = 1.0) -> list[np.ndarray]:
    """Per-token log-probs of each response given its prompt (the inputs of Eq. 3 and Eq. 5).

    prompts[i]: non-empty ids; responses[i]: ids (may be empty). Returns B fp32 arrays
    ``[len(responses[i])]`` with entry j = log pi(responses[i][j] | prompt, responses[i][:j]), of
    ``logits / temperature`` (default 1: the policy's own; the sampling temperature gives what
    ``generate`` reports as ``sampling_logprobs`` without top-k / top-p).
    """
    if not (np.isfinite(temperature) and temperature > 0):
      raise ValueError(f"temperature: expected a finite number > 0, got {temperature!r}")
    p_rows = _check_ids("prompts", prompts, self.config.vocab_size, allow_empty=False)
    r_rows = _check_ids("responses", responses, self.config.vocab_size, allow_empty=True)
    if len(p_rows) != len(r_rows):
      raise ValueError(f"responses: expected {len(p_rows)} (one per prompt), got {len(r_rows)}")
    if not p_rows:
      return []
    lengths = [len(p) + len(r) for p, r in zip(p_rows, r_rows)]
    if max(lengths) > self.max_cache_len:
      i = int(np.argmax(lengths))
      raise ValueError(f"prompts[{i}] + responses[{i}]: {lengths[i]} tokens exceed "
                       f"max_cache_len={self.max_cache_len}")
    b = len(p_rows)
    tb = bucket_length(max(lengths))
    per_call = self._rows_per_call(tb, tb)
    if b > per_call:
      return sum((self.score(p_rows[i:i + per_call], r_rows[i:i + per_call], temperature)
                  for i in range(0, b, per_call)), [])
    # the LM head runs on the response positions only (``models.scoring.response_logprobs``)
    ids, mask, starts, width = pack_rows(p_rows, r_rows)
    logp = np.asarray(jax.device_get(_score_jit(self.graphdef, self.state, jnp.asarray(ids), jnp.asarray(mask),
                                                jnp.asarray(starts), width=width, mesh=self.mesh,
                                                temperature=float(temperature))))
    return [logp[i, :len(r)] for i, r in enumerate(r_rows)]


def generate(model: Qwen, prompts: Sequence[Sequence[int]], *, key: jax.Array, **kwargs: Any) -> GenerateOutput:
  """One-shot :meth:`Sampler.generate` (the jit cache is shared across calls)."""
  return Sampler(model).generate(prompts, key=key, **kwargs)


def score(model: Qwen, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[np.ndarray]:
  """One-shot :meth:`Sampler.score`: per-token log-probs ``[len(r)]`` of each response."""
  return Sampler(model).score(prompts, responses)
