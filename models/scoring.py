"""Teacher-forced log-probs for the Qwen module: every position, or only the responses' positions.

* :func:`next_token_logprobs` — ``log pi(input_ids[:, t+1] | input_ids[:, :t+1])`` at every
  position of a batch (pure and differentiable).
* :func:`response_logprobs` — the same quantity at ``width`` positions per row starting at
  ``starts`` (a response's tokens after its prompt): every decoder layer but the last runs over the
  whole sequence; the last layer, the LM head, the ``[.., V]`` logits and their logsumexp are
  computed for the response positions only. Scoring a short correction after a long rollout context (the PPL gate, Eq. 3; pi_cal /
  pi_roll, Eq. 5) then costs one decoder pass, not one decoder pass plus ``T`` vocabulary
  projections.

Both build at most ``chunk`` positions' logits at a time (``lax.map`` over position chunks when
more are asked for), so a long row never holds its full ``[T, V]`` logits.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.qwen import Qwen
from models.axes import DECODE_AXIS_RULES, activation_sharding
from models.shapes import bucket_length, bucket_rows
from models.vocab_logprobs import token_logprobs

SCORE_CHUNK = 512  # positions whose [B, chunk, V] logits are materialised at once


def _target_logprobs(model: Qwen, h: jax.Array, targets: jax.Array, chunk: int,
                     temperature: float = 1.0) -> jax.Array:
  """h: [B, P, E], targets: [B, P] -> log softmax(logits(h) / temperature)[targets] [B, P] fp32,
  ``chunk`` positions at a time."""
  b, p, e = h.shape

  def one(hc: jax.Array, tc: jax.Array) -> jax.Array:
    logits = model.logits(hc)  # [B, C, V] fp32
    if temperature != 1.0:
      logits = logits / temperature
    hit = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
    return hit - jax.nn.logsumexp(logits, axis=-1)

  chunk = max(1, min(p, chunk))
  if chunk == p:  # one chunk: no loop around the head
    return one(h, targets)
  pad = -p % chunk
  h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets, ((0, 0), (0, pad)))
  n = (p + pad) // chunk
  hs = h.reshape(b, n, chunk, e).swapaxes(0, 1)
  ts = targets.reshape(b, n, chunk).swapaxes(0, 1)
  out = jax.lax.map(lambda a: one(*a), (hs, ts))
  return out.swapaxes(0, 1).reshape(b, p + pad)[:, :p]


def next_token_logprobs(model: Qwen, input_ids: jax.Array, attention_mask: jax.Array,
                        chunk: int = SCORE_CHUNK) -> jax.Array:
  """logp: [B, T] fp32 with logp[:, t] = log pi(input_ids[:, t+1] | input_ids[:, :t+1]); last column 0.

  input_ids, attention_mask: [B, T] (any padding; padded positions give meaningless values
  the caller masks out). Pure and differentiable, so a train step can use it under
  ``jax.grad``; the [B, chunk, V] logits are built ``chunk`` time steps at a time
  (``lax.map``), so the full [B, T, V] tensor never exists.
  """
  h = model.hidden_states(input_ids, attention_mask)  # [B, T, E]
  targets = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1)
  return _target_logprobs(model, h, targets, chunk).at[:, -1].set(0.0)


def response_logprobs(model: Qwen, input_ids: jax.Array, attention_mask: jax.Array, starts: jax.Array,
                      width: int, chunk: int = SCORE_CHUNK, temperature: float = 1.0) -> jax.Array:
  """out: [B, width] fp32 with out[i, j] = log pi(input_ids[i, s+1] | input_ids[i, :s+1]) at
  s = starts[i] + j (the next-token log-prob of position s, as :func:`next_token_logprobs`), of
  ``logits / temperature`` (1: the policy's own log-probs).

  input_ids, attention_mask: [B, T] right-padded, every row with at least one token (on a GPU a
  bf16 model then attends with cuDNN's fused kernel from the row lengths); starts: [B] int, the
  position before each row's first response token (its prompt length - 1). Positions past
  ``T - 2`` are clamped there, so entries beyond a row's real response are meaningless and the
  caller drops them.
  """
  t = input_ids.shape[1]
  pos = jnp.minimum(starts[:, None] + jnp.arange(width, dtype=starts.dtype)[None, :], max(t - 2, 0))
  # The last layer runs at the response positions only (all earlier ones over the whole row).
  h_r = model.hidden_states(input_ids, attention_mask, right_padded=True, query_index=pos)  # [B, width, E]
  targets = jnp.take_along_axis(input_ids, jnp.minimum(pos + 1, t - 1), axis=1)
  return _target_logprobs(model, h_r, targets, chunk, temperature)


def token_logprobs_at(model: Qwen, input_ids: jax.Array, attention_mask: jax.Array, positions: jax.Array, *,
                      vocab_chunk: int | None = None, remat: str = "none", right_padded: bool = False,
                      scan: bool = False, temperature: float = 1.0) -> jax.Array:
  """``rti_jax.objectives.next_token_logprobs(model(input_ids, attention_mask) / temperature, input_ids)``
  at ``positions`` only, 0 elsewhere: out[i, t] = log p(input_ids[i, t] | input_ids[i, :t]) where
  t is in ``positions[i]``. [B, T] fp32, differentiable.

  positions: [B, W] int, positions t >= 1 (each at most once per row); 0 marks an unused slot. The
  last decoder layer, the final norm and the LM head run at the W positions before them alone
  (``Qwen.hidden_states``' ``query_index``): a loss over a quarter of a batch's tokens pays for a
  quarter of the head. vocab_chunk: None (the [B, W, V] logits at once) or the ids per chunk
  (``models.vocab_logprobs``); remat, right_padded, scan: as ``Qwen.hidden_states``.
  """
  b, t = input_ids.shape
  h = model.hidden_states(input_ids, attention_mask, remat=remat, right_padded=right_padded, scan=scan,
                          query_index=jnp.maximum(positions - 1, 0))  # [B, W, E]
  targets = jnp.take_along_axis(input_ids, positions, axis=1)
  if vocab_chunk is None:
    logits = model.logits(h)
    lp = token_logprobs(logits if temperature == 1.0 else logits / temperature, targets)
  else:
    lp = model.head_logprobs(h, targets, vocab_chunk=vocab_chunk, temperature=temperature)
  lp = jnp.where(positions > 0, lp, 0.0)  # every unused slot writes the same 0 at column 0
  return jnp.zeros((b, t), jnp.float32).at[jnp.arange(b)[:, None], positions].set(lp)


@functools.partial(jax.jit, static_argnames=("graphdef", "width", "mesh", "temperature"))
def score_jit(graphdef: nnx.GraphDef, state: nnx.State, ids: jax.Array, mask: jax.Array, starts: jax.Array,
              width: int, mesh: Any = None, temperature: float = 1.0) -> jax.Array:
  """ids, mask: [B, T] right-padded; starts: [B] -> :func:`response_logprobs` [B, width] (at
  ``temperature``, a static argument: one program per temperature)."""
  with activation_sharding(mesh, DECODE_AXIS_RULES):
    return response_logprobs(nnx.merge(graphdef, state), ids, mask, starts, width, temperature=temperature)


def pack_rows(prompts: Sequence[np.ndarray], responses: Sequence[np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  """Checked prompt / response id rows -> the inputs of :func:`score_jit`: ids, mask [B', T']
  right-padded (B' = ``bucket_rows(B)``, T' = ``bucket_length`` of the longest row), starts [B']
  (each prompt's length - 1) and width (``bucket_length`` of the longest response, at most T').
  Padding rows hold one token (id 0), so every row has a length."""
  lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
  bb, tb = bucket_rows(len(lengths)), bucket_length(max(lengths))
  width = min(tb, bucket_length(max(len(r) for r in responses)))
  ids = np.zeros((bb, tb), np.int32)
  mask = np.zeros((bb, tb), np.int32)
  mask[len(lengths):, 0] = 1
  starts = np.zeros((bb,), np.int32)
  for i, (p, r) in enumerate(zip(prompts, responses)):
    ids[i, :lengths[i]] = np.concatenate([p, r])
    mask[i, :lengths[i]] = 1
    starts[i] = len(p) - 1
  return ids, mask, starts, width


def check_ids(name: str, seqs: Sequence[Sequence[int]], vocab_size: int, allow_empty: bool) -> list[np.ndarray]:
  """Validates token id lists; raises ValueError naming the argument, row and value."""
  if isinstance(seqs, (str, bytes)) or not hasattr(seqs, "__len__"):
    raise TypeError(f"{name}: expected a sequence of token-id sequences, got {type(seqs).__name__}")
  out = []
  for i, s in enumerate(seqs):
    raw = np.asarray(s).reshape(-1) if len(s) else np.zeros((0,), np.int64)
    if raw.size and not np.issubdtype(raw.dtype, np.integer):
      raise ValueError(f"{name}[{i}]: expected integer token ids, got dtype {raw.dtype}")
    arr = raw.astype(np.int64)
    if arr.size == 0 and not allow_empty:
      raise ValueError(f"{name}[{i}]: expected at least one token id, got an empty sequence")
    bad = (arr < 0) | (arr >= vocab_size)
    if bad.any():
      raise ValueError(f"{name}[{i}]: token ids must be in [0, {vocab_size}), got "
                       f"{int(arr[bad][0])} at position {int(np.argmax(bad))}")
    out.append(arr.astype(np.int32))
  return out
