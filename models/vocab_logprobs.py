"""Token log-probs from final hidden states, the vocabulary taken a chunk at a time.

``log p(y | h) = h . w_y - logsumexp_v(h . w_v)``. The LM head is cut into ``n`` column chunks and
a ``lax.scan`` computes, per chunk, the chunk's logsumexp and the target's logit when the target
falls in it; the chunk body is rematerialised, so neither the forward nor the backward pass holds
more than one ``[B, T, V / n]`` block of logits (the full ``[B, T, V]`` tensor never exists).

Chunk ``j`` holds the vocabulary ids ``c * n + j`` (a strided split): reshaping ``[E, V]`` to
``[E, V / n, n]`` keeps the vocabulary's tensor-parallel split on the ``V / n`` dimension, so the
scan over ``n`` needs no resharding of the head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.axes import constrain


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """``log_softmax(logits)[b, t, targets[b, t]]`` [B, T] float32 from logits [B, T, V] and integer
  targets [B, T], as ``logits[target] - logsumexp(logits)`` (no [B, T, V] log_softmax). Unchecked:
  ``rti_jax.objectives.token_logprobs`` checks its inputs and calls this."""
  picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(logits, axis=-1)


def num_vocab_chunks(vocab_size: int, chunk: int) -> int:
  """The fewest chunks ``n`` dividing ``vocab_size`` whose size ``vocab_size / n`` is at most ``chunk``."""
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
    raise ValueError(f"vocab chunk: expected a positive int, got {chunk!r}")
  return next(n for n in range(1, vocab_size + 1) if vocab_size % n == 0 and vocab_size // n <= chunk)


def hidden_token_logprobs(h: jax.Array, head: jax.Array, targets: jax.Array, *, chunk: int,
                          vocab_major: bool = False, precision: jax.lax.Precision | None = None,
                          temperature: float = 1.0) -> jax.Array:
  """log softmax(h @ head / temperature)[targets] without the full logits.

  h: [B, T, E]; head: [E, V] (``vocab_major``: [V, E], a tied embedding); targets: [B, T] int in
  [0, V). Logits are accumulated in fp32 from ``h``'s dtype. Returns [B, T] fp32; equal to the
  full ``log_softmax`` gather up to fp32 rounding of the logsumexp (value and gradient).
  """
  v = head.shape[0] if vocab_major else head.shape[1]
  n = num_vocab_chunks(v, chunk)
  size = v // n
  w = head.reshape(size, n, head.shape[1]) if vocab_major else head.reshape(head.shape[0], size, n)
  w = jnp.moveaxis(w, 1 if vocab_major else 2, 0)  # [n, V/n, E] or [n, E, V/n]
  spec = "bte,ce->btc" if vocab_major else "bte,ec->btc"
  axes = ("batch", "seq", "act_vocab")

  def body(carry, xs):
    w_j, j = xs
    logits = constrain(jnp.einsum(spec, h, w_j.astype(h.dtype), preferred_element_type=jnp.float32,
                                  precision=precision), axes)  # [B, T, V/n]
    if temperature != 1.0:
      logits = logits / temperature
    ids = jnp.arange(size, dtype=targets.dtype) * n + j
    hit = jnp.sum(jnp.where(ids == targets[..., None], logits, 0.0), axis=-1)
    return carry, (jax.nn.logsumexp(logits, axis=-1), hit)

  _, (lse, hit) = jax.lax.scan(jax.checkpoint(body), None, (w, jnp.arange(n, dtype=targets.dtype)))
  return jnp.sum(hit, axis=0) - jax.nn.logsumexp(lse, axis=0)
