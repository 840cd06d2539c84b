"""Qwen3 dense, Qwen3-MoE and Qwen2/Qwen2.5 causal LMs in Flax NNX.

One module covers both families; ``QwenConfig`` switches q/k/v bias and q/k RMSNorm.
Calling convention::

    logits = model(input_ids, attention_mask)      # [B, T] int, [B, T] {0,1} -> [B, T, V] fp32

``attention_mask`` is 1 on real tokens; left or right padding both work because
positions are derived from the mask (``positions = cumsum(mask) - 1``). The KV cache
is owned by the sampler (``models.sampler``) and passed through :meth:`Qwen.forward`.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from models.config import QwenConfig
from models.vocab_logprobs import hidden_token_logprobs
from models.weight_table import axis_units, expand_table
from models.axes import LOGICAL_AXES_KEY, LOGICAL_UNITS_KEY, constrain

_MASK_VALUE = -1e30  # finite, so a fully masked (padding) query row stays NaN-free
# Uncached (training / scoring) passes split the queries into at most this many causal blocks of at
# least _MIN_BLOCK rows; block i attends only to keys [0, end of block i): about (n + 1) / 2n of the
# full T x T scores (0.56 at 8 blocks). Exact: the skipped keys are masked for those queries anyway.
_CAUSAL_BLOCKS = 8
_MIN_BLOCK = 128

# Logical names of the activations' dimensions (mapped to mesh axes by rti_jax.sharding's table; the
# constraints are active only under ``rti_jax.sharding.activation_sharding``).
RESIDUAL = ("batch", "seq", "act_embed")  # [B, T, E]
Q_HEADS = ("batch", "seq", "act_heads", "head_dim")  # [B, T, N, D]
KV_HEADS = ("batch", "seq", "act_kv_heads", "head_dim")  # [B, T, Kv, D]
ATTN_OUT = ("batch", "seq", "act_heads")  # [B, T, N * D]
MLP_HIDDEN = ("batch", "seq", "act_mlp")  # [B, T, I]
CACHE = ("batch", "act_kv_heads", "seq", "head_dim")  # [B, Kv, S, D]

#: ``remat`` values of :meth:`Qwen.hidden_states`: what each decoder layer keeps for the backward
#: pass (``none``: everything autodiff saves; ``full``: only its input, the rest is recomputed;
#: ``dots``: also its matmul outputs without batch dimensions, the projections).
REMAT_POLICIES = {"none": None, "full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def _cudnn_attention_ok(q: jax.Array) -> bool:
  """cuDNN's fused attention: on a GPU, for bf16 / fp16 inputs with a head_dim it supports."""
  return (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
          and q.shape[-1] <= 128 and q.shape[-1] % 8 == 0)


class LayerCache(NamedTuple):
  """One layer's keys and values. k, v: [B, num_kv_heads, S, head_dim]."""

  k: jax.Array
  v: jax.Array


class RMSNorm(nnx.Module):
  """y = w * x / sqrt(mean(x^2) + eps), statistics in fp32 (as transformers' Qwen RMSNorm)."""

  def __init__(self, dim: int, eps: float, *, param_dtype: jnp.dtype = jnp.float32):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(x.dtype) * y.astype(x.dtype)


def rope_inv_freq(config: QwenConfig) -> jax.Array:
  """inv_freq: [head_dim // 2] = 1 / theta^(2i / head_dim), divided by the linear factor."""
  d = config.head_dim
  inv = 1.0 / (config.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  if config.rope_type == "linear":
    inv = inv / config.rope_factor
  return inv


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotary embedding, half-split layout (transformers' ``rotate_half``).

  x: [B, T, N, D]; positions: [B, T] int; inv_freq: [D/2]. Angles in fp32.
  """
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, D]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


class Attention(nnx.Module):
  """Grouped-query attention with optional q/k/v bias and q/k RMSNorm (Qwen3)."""

  def __init__(self, config: QwenConfig, *, dtype: jnp.dtype, param_dtype: jnp.dtype,
               precision: jax.lax.Precision, rngs: nnx.Rngs):
    c = config
    lin = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, precision=precision,
               kernel_init=nnx.initializers.normal(0.02))
    self.q_proj = nnx.Linear(c.hidden_size, c.num_heads * c.head_dim, use_bias=c.qkv_bias, **lin)
    self.k_proj = nnx.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, use_bias=c.qkv_bias, **lin)
    self.v_proj = nnx.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, use_bias=c.qkv_bias, **lin)
    self.o_proj = nnx.Linear(c.num_heads * c.head_dim, c.hidden_size, use_bias=c.o_bias, **lin)
    if c.qk_norm:
      self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype=param_dtype)
      self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype=param_dtype)
    self.qk_norm = c.qk_norm
    self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
    self.precision = precision

  def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array, inv_freq: jax.Array,
               cache: LayerCache | None = None, cache_index: jax.Array | None = None, causal: bool = False,
               lengths: jax.Array | None = None, query_index: jax.Array | None = None,
               ) -> tuple[jax.Array, LayerCache | None]:
    """x: [B, T, E]; positions: [B, T]; mask: [B, T, S] bool (S = T, or the cache length).

    With a cache, this step's k/v are written at slots ``cache_index .. cache_index+T`` (a
    scalar, or ``[B]``: one start slot per row, which must leave room for T slots) and
    attention runs over all S cache slots (``mask`` says which are visible). causal: promises
    that ``mask`` hides every key after its query (as ``causal_padding_mask`` does; for a cache
    prefill, also the empty slots after the prompt), so an uncached pass or a prefill at cache
    index 0 is computed in causal query blocks that skip those keys. lengths: [B] real tokens per
    row, given only for an uncached pass over a right-padded batch whose ``mask`` is causal; on a
    GPU with a bf16 / fp16 model the attention then runs as cuDNN's fused kernel (causal, padded
    by lengths), which never holds the [T, S] scores.

    query_index: [B, W] positions (uncached only): the output is computed for those queries alone,
    [B, W, E], each attending to the keys its row of ``mask`` shows (keys and values still come from
    every position of ``x``).

    Without a cache the attention is ``jax.nn.dot_product_attention``.
    """
    if query_index is not None:
      return self._attend_at(x, positions, mask, inv_freq, query_index), None
    b, t, _ = x.shape
    q, k, v = self._project(x, positions, x, positions, inv_freq)
    if cache is None:
      out = self._attend_uncached(q, k, v, mask, causal, lengths).reshape(b, t, self.num_heads * self.head_dim)
      return self.o_proj(constrain(out, ATTN_OUT)), None
    # Heads-major layout [B, N, T, D], so both attention matmuls batch over (B, kv head)
    # without transposing the cache.
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    if jnp.ndim(cache_index) == 1:  # per-row slots [B] (models.sampler's prefix-cache path)
      write = jax.vmap(lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (0, i, 0)))
      k = write(cache.k, k.astype(cache.k.dtype), cache_index)
      v = write(cache.v, v.astype(cache.v.dtype), cache_index)
    else:
      start = (0, 0, cache_index, 0)
      k = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), start)
      v = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), start)
    k, v = constrain(k, CACHE), constrain(v, CACHE)
    new_cache = LayerCache(k, v)
    groups = self.num_heads // self.num_kv_heads
    q = q.reshape(b, t, self.num_kv_heads, groups, self.head_dim).transpose(0, 2, 3, 1, 4)
    # Blocks need the keys to start at slot 0: a cache prefill at index 0.
    at_start = isinstance(cache_index, int) and cache_index == 0
    if causal and at_start and t > _MIN_BLOCK:
      size = max(_MIN_BLOCK, -(-t // _CAUSAL_BLOCKS))
      out = jnp.concatenate([
        self._attend(q[:, :, :, lo:lo + size], k[:, :, :lo + size], v[:, :, :lo + size],
                     mask[:, lo:lo + size, :lo + size])
        for lo in range(0, t, size)], axis=3)
    else:
      out = self._attend(q, k, v, mask)  # [B, Kv, G, T, D]
    out = constrain(out.transpose(0, 3, 1, 2, 4).reshape(b, t, self.num_heads * self.head_dim), ATTN_OUT)
    return self.o_proj(out), new_cache

  def _project(self, xq: jax.Array, pos_q: jax.Array, xkv: jax.Array, pos_kv: jax.Array,
               inv_freq: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [B, Tq, N, D] from ``xq``, k and v [B, Tk, Kv, D] from ``xkv``: projected, q/k-normed
    (Qwen3) and rotated at their positions."""
    q = constrain(self.q_proj(xq).reshape(*xq.shape[:2], self.num_heads, self.head_dim), Q_HEADS)
    k = constrain(self.k_proj(xkv).reshape(*xkv.shape[:2], self.num_kv_heads, self.head_dim), KV_HEADS)
    v = constrain(self.v_proj(xkv).reshape(*xkv.shape[:2], self.num_kv_heads, self.head_dim), KV_HEADS)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return apply_rope(q, pos_q, inv_freq), apply_rope(k, pos_kv, inv_freq), v

  def _attend_at(self, x: jax.Array, positions: jax.Array, mask: jax.Array, inv_freq: jax.Array,
                 query_index: jax.Array) -> jax.Array:
    """The uncached attention output [B, W, E] at the positions ``query_index`` [B, W] only."""
    b, w = query_index.shape
    take = lambda a: jnp.take_along_axis(a, query_index.reshape(b, w, *[1] * (a.ndim - 2)), axis=1)  # noqa: E731
    q, k, v = self._project(take(x), take(positions), x, positions, inv_freq)
    out = self._attend_uncached(q, k, v, take(mask), False, None).reshape(b, w, self.num_heads * self.head_dim)
    return self.o_proj(constrain(out, ATTN_OUT))

  def _attend_uncached(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, causal: bool,
                       lengths: jax.Array | None) -> jax.Array:
    """q: [B, T, N, D]; k, v: [B, S, Kv, D]; mask: [B, T, S] -> [B, T, N, D] by
    ``jax.nn.dot_product_attention`` (grouped heads: query head n reads kv head n // groups)."""
    t = q.shape[1]
    if lengths is not None and causal and _cudnn_attention_ok(q):
      return jax.nn.dot_product_attention(q, k, v, is_causal=True, query_seq_lengths=lengths,
                                          key_value_seq_lengths=lengths, implementation="cudnn")
    # The XLA implementation (the only one JAX picks by itself today). fp32 models keep true fp32
    # matmuls (HIGHEST), as the cached path's einsums.
    highest = self.precision == jax.lax.Precision.HIGHEST
    with jax.default_matmul_precision("highest") if highest else contextlib.nullcontext():
      if causal and t > _MIN_BLOCK:
        size = max(_MIN_BLOCK, -(-t // _CAUSAL_BLOCKS))
        return jnp.concatenate([
          jax.nn.dot_product_attention(q[:, lo:lo + size], k[:, :lo + size], v[:, :lo + size],
                                       mask=mask[:, None, lo:lo + size, :lo + size])
          for lo in range(0, t, size)], axis=1)
      return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])

  def _attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """q: [B, Kv, G, T, D]; k, v: [B, Kv, S, D]; mask: [B, T, S] -> [B, Kv, G, T, D]."""
    scores = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32,
                        precision=self.precision)
    scores = scores * (self.head_dim ** -0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bksd->bkgtd", probs, v, precision=self.precision)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, config: QwenConfig, *, dtype: jnp.dtype, param_dtype: jnp.dtype,
               precision: jax.lax.Precision, rngs: nnx.Rngs):
    lin = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs, precision=precision,
               kernel_init=nnx.initializers.normal(0.02))
    self.gate_proj = nnx.Linear(config.hidden_size, config.intermediate_size, **lin)
    self.up_proj = nnx.Linear(config.hidden_size, config.intermediate_size, **lin)
    self.down_proj = nnx.Linear(config.intermediate_size, config.hidden_size, **lin)

  def __call__(self, x: jax.Array) -> jax.Array:
    hidden = constrain(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x), MLP_HIDDEN)
    return self.down_proj(hidden)


class MoE(nnx.Module):
  """Qwen3-MoE sparse block: softmax router, top-k experts, each a SwiGLU.

  Router weights: softmax over all experts (fp32), keep the top k, renormalise them if
  ``norm_topk_prob``. Token-expert pairs are sorted by expert and run through grouped
  matmuls (``lax.ragged_dot``), so compute scales with k, not with the number of experts.
  Parameters: router [E_hidden, n_exp]; gate_proj, up_proj [n_exp, E_hidden, I];
  down_proj [n_exp, I, E_hidden].
  """

  def __init__(self, config: QwenConfig, *, dtype: jnp.dtype, param_dtype: jnp.dtype,
               precision: jax.lax.Precision, rngs: nnx.Rngs):
    n, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
    init = nnx.initializers.normal(0.02)
    self.router = nnx.Param(init(rngs.params(), (h, n), param_dtype))
    self.gate_proj = nnx.Param(init(rngs.params(), (n, h, i), param_dtype))
    self.up_proj = nnx.Param(init(rngs.params(), (n, h, i), param_dtype))
    self.down_proj = nnx.Param(init(rngs.params(), (n, i, h), param_dtype))
    self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
    self.dtype, self.precision = dtype, precision

  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [B, T, E] -> [B, T, E]."""
    b, t, h = x.shape
    xs = x.reshape(b * t, h).astype(self.dtype)
    n_exp = self.router.shape[-1]
    logits = jnp.dot(xs, self.router[...].astype(self.dtype), precision=self.precision,
                     preferred_element_type=jnp.float32)  # [N, n_exp]
    top_w, top_i = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), self.top_k)  # [N, k]
    if self.norm_topk_prob:
      top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
    flat_expert = top_i.reshape(-1)  # [N * k]
    order = jnp.argsort(flat_expert, stable=True)
    token = order // self.top_k
    group_sizes = jnp.bincount(flat_expert, length=n_exp).astype(jnp.int32)
    mm = lambda a, w: jax.lax.ragged_dot(a, w[...].astype(self.dtype), group_sizes,
                                         precision=self.precision)
    rows = xs[token]  # [N * k, E] sorted by expert
    hidden = jax.nn.silu(mm(rows, self.gate_proj)) * mm(rows, self.up_proj)
    out = mm(hidden, self.down_proj) * top_w.reshape(-1)[order][:, None].astype(self.dtype)
    return jnp.zeros_like(xs).at[token].add(out).reshape(b, t, h)


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)) (MLP or MoE)."""

  def __init__(self, config: QwenConfig, *, dtype: jnp.dtype, param_dtype: jnp.dtype,
               precision: jax.lax.Precision, rngs: nnx.Rngs, moe: bool = False):
    kw = dict(dtype=dtype, param_dtype=param_dtype, precision=precision, rngs=rngs)
    self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype=param_dtype)
    self.attn = Attention(config, **kw)
    self.post_attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype=param_dtype)
    self.mlp = MoE(config, **kw) if moe else MLP(config, **kw)

  def __call__(self, x, positions, mask, inv_freq, cache=None, cache_index=None, causal=False, lengths=None,
               query_index=None):
    """query_index: [B, W] (uncached): the layer's output at those positions only, [B, W, E]."""
    h, new_cache = self.attn(self.input_norm(x), positions, mask, inv_freq, cache, cache_index, causal, lengths,
                             query_index)
    if query_index is not None:
      x = jnp.take_along_axis(x, query_index[..., None], axis=1)
    x = constrain(x + h, RESIDUAL)
    return constrain(x + self.mlp(self.post_attn_norm(x)), RESIDUAL), new_cache


def _same_layers(layers) -> bool:
  """Whether every layer has the first one's structure (a scan needs it; MoE models may mix)."""
  first = nnx.split(layers[0])[0]
  return all(nnx.split(layer)[0] == first for layer in layers[1:])


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
  """positions: [B, T] = cumsum(mask) - 1, clipped at 0 (padding gets position 0 on the left)."""
  return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def causal_padding_mask(attention_mask: jax.Array) -> jax.Array:
  """mask: [B, T, T] bool, query t sees key s iff s <= t and key s is a real token."""
  t = attention_mask.shape[-1]
  causal = jnp.tril(jnp.ones((t, t), dtype=bool))
  return causal[None] & attention_mask.astype(bool)[:, None, :]


def default_precision(dtype: jnp.dtype) -> jax.lax.Precision:
  """HIGHEST for fp32 (true fp32 matmuls, as torch computes them; no TF32 on GPUs), else DEFAULT."""
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


class Qwen(nnx.Module):
  """The causal LM. Parameters in ``param_dtype``, activations in ``dtype``, logits in fp32.

  precision: matmul precision; default :func:`default_precision` of ``dtype``.
  """

  def __init__(self, config: QwenConfig, *, dtype: jnp.dtype = jnp.float32,
               param_dtype: jnp.dtype = jnp.float32, precision: jax.lax.Precision | None = None,
               rngs: nnx.Rngs):
    precision = default_precision(dtype) if precision is None else precision
    self.precision = precision
    self.config = config
    self.embed = nnx.Embed(config.vocab_size, config.hidden_size, dtype=dtype,
                           param_dtype=param_dtype, rngs=rngs,
                           embedding_init=nnx.initializers.normal(0.02))
    self.layers = nnx.List([DecoderLayer(config, dtype=dtype, param_dtype=param_dtype,
                                         precision=precision, rngs=rngs, moe=config.is_moe_layer(i))
                            for i in range(config.num_layers)])
    self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype=param_dtype)
    if not config.tie_word_embeddings:
      self.lm_head = nnx.Param(nnx.initializers.normal(0.02)(
        rngs.params(), (config.hidden_size, config.vocab_size), param_dtype))
    self.dtype = dtype
    annotate_logical_axes(self, config)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
    """input_ids: [B, T] int; attention_mask: [B, T] (1 = real). Returns logits [B, T, V] fp32."""
    if attention_mask is None:
      attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    h = self.hidden_states(input_ids, attention_mask)
    return self.logits(h)

  def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array, *, remat: str = "none",
                    right_padded: bool = False, scan: bool = False,
                    query_index: jax.Array | None = None) -> jax.Array:
    """Final-norm hidden states [B, T, E] of a full (uncached) forward pass.

    remat: a key of ``REMAT_POLICIES``, what each decoder layer keeps for a backward pass.
    right_padded: the caller promises every row's real tokens come first (``RTIBatch``'s layout),
    which lets a GPU run cuDNN's fused attention from the row lengths.
    scan: run the layers as one ``lax.scan`` over a stacked view of their parameters (one compiled
    layer body; the parameter tree is unchanged), when all layers share one structure.
    query_index: [B, W] int positions: return [B, W, E], the hidden states at those positions only.
    Every layer but the last still runs over all T positions (their keys and values are needed);
    the last one computes its queries, MLP and norm at the W positions alone, which is what a
    caller that needs a few positions' log-probs (``models.scoring.response_logprobs``) saves.
    """
    lengths = jnp.sum(attention_mask, axis=-1).astype(jnp.int32) if right_padded else None
    h, _ = self.forward(input_ids, positions_from_mask(attention_mask), causal_padding_mask(attention_mask),
                        causal=True, remat=remat, lengths=lengths, scan=scan, query_index=query_index)
    return h

  def token_logprobs(self, input_ids: jax.Array, attention_mask: jax.Array, *, vocab_chunk: int,
                     remat: str = "none", right_padded: bool = False, scan: bool = False,
                     temperature: float = 1.0) -> jax.Array:
    """``rti_jax.objectives.next_token_logprobs(self(input_ids, attention_mask) / temperature, input_ids)``
    without the [B, T, V] logits: out[:, t] = log p(input_ids[:, t] | input_ids[:, :t]), out[:, 0] = 0,
    fp32, the vocabulary ``vocab_chunk`` ids at a time (``models.vocab_logprobs``)."""
    h = self.hidden_states(input_ids, attention_mask, remat=remat, right_padded=right_padded, scan=scan)
    targets = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1)
    lp = self.head_logprobs(h, targets, vocab_chunk=vocab_chunk, temperature=temperature)
    return jnp.pad(lp[:, :-1], ((0, 0), (1, 0)))

  def head_logprobs(self, h: jax.Array, targets: jax.Array, *, vocab_chunk: int, temperature: float = 1.0) -> jax.Array:
    """h: [B, W, E], targets: [B, W] -> log softmax(logits(h) / temperature)[targets] [B, W] fp32,
    the vocabulary ``vocab_chunk`` ids at a time (``models.vocab_logprobs``)."""
    tied = self.config.tie_word_embeddings
    head = self.embed.embedding[...] if tied else self.lm_head[...]
    return hidden_token_logprobs(h, head, targets, chunk=vocab_chunk, vocab_major=tied, precision=self.precision,
                                 temperature=temperature)

  def forward(self, input_ids: jax.Array, positions: jax.Array, mask: jax.Array,
              cache: list[LayerCache] | None = None, cache_index: jax.Array | None = None,
              causal: bool = False, remat: str = "none", lengths: jax.Array | None = None,
              scan: bool = False, query_index: jax.Array | None = None,
              ) -> tuple[jax.Array, list[LayerCache] | None]:
    """The decoder stack. input_ids, positions: [B, T]; mask: [B, T, S] bool; causal, lengths: see
    ``Attention.__call__`` (set by :meth:`hidden_states`, whose mask is causal); remat, scan,
    query_index: see :meth:`hidden_states` (uncached passes only).

    Returns final-norm hidden states [B, T, E] and the updated cache (None without one).
    """
    if remat not in REMAT_POLICIES:
      raise ValueError(f"remat: expected one of {sorted(REMAT_POLICIES)}, got {remat!r}")
    inv_freq = rope_inv_freq(self.config)
    x = constrain(self.embed(input_ids), RESIDUAL)
    if cache is None:
      run = lambda layer, x: layer(x, positions, mask, inv_freq, causal=causal, lengths=lengths)[0]  # noqa: E731
      last = len(self.layers) if query_index is None else len(self.layers) - 1
      if scan and last > 1 and _same_layers(self.layers[:last]):
        x = self._scan_layers(run, x, remat, last)
      else:
        if remat != "none":
          run = nnx.remat(run, policy=REMAT_POLICIES[remat])
        for layer in self.layers[:last]:
          x = run(layer, x)
      if query_index is not None:
        x = self.layers[last](x, positions, mask, inv_freq, query_index=query_index)[0]
      return self.norm(x), None
    if query_index is not None:
      raise ValueError("query_index: only for an uncached pass")
    new_cache = []
    for i, layer in enumerate(self.layers):
      x, layer_cache = layer(x, positions, mask, inv_freq, cache[i], cache_index, causal)
      new_cache.append(layer_cache)
    return self.norm(x), new_cache

  def _scan_layers(self, run, x: jax.Array, remat: str, count: int) -> jax.Array:
    """The first ``count`` decoder layers as one ``lax.scan`` over a stacked view of their parameters.

    The parameter tree stays one entry per layer (HF load / save, checkpoints); the stack is built
    inside the traced function, its floating leaves cast to the compute dtype first (each layer
    casts its weights to it before every matmul anyway, so the numbers are those of the loop), and
    its gradient flows back to each layer's own parameters.
    """
    graphdef, _ = nnx.split(self.layers[0])
    cast = lambda a: a.astype(self.dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a  # noqa: E731
    stacked = jax.tree.map(lambda *a: jnp.stack([cast(v) for v in a]), *[nnx.state(l) for l in self.layers[:count]])

    def body(h, layer_state):
      return run(nnx.merge(graphdef, layer_state), h), None

    if remat != "none":
      body = jax.checkpoint(body, policy=REMAT_POLICIES[remat])
    return jax.lax.scan(body, x, stacked)[0]

  def logits(self, h: jax.Array) -> jax.Array:
    """h: [..., E] -> logits [..., V] in fp32 (fp32 accumulation even for bf16 weights)."""
    axes = ("batch",) + ("seq",) * (h.ndim - 2) + ("act_vocab",)
    if self.config.tie_word_embeddings:
      w = self.embed.embedding[...]
      return constrain(jnp.einsum("...e,ve->...v", h, w.astype(h.dtype), preferred_element_type=jnp.float32,
                                  precision=self.precision), axes)
    w = self.lm_head[...]
    return constrain(jnp.einsum("...e,ev->...v", h, w.astype(h.dtype), preferred_element_type=jnp.float32,
                                precision=self.precision), axes)

  def init_cache(self, batch: int, length: int, dtype: jnp.dtype | None = None) -> list[LayerCache]:
    """An empty KV cache: per layer k, v zeros [batch, num_kv_heads, length, head_dim]."""
    c = self.config
    dt = dtype or self.dtype
    shape = (batch, c.num_kv_heads, length, c.head_dim)
    zeros = lambda: constrain(jnp.zeros(shape, dt), CACHE)  # noqa: E731
    return [LayerCache(zeros(), zeros()) for _ in range(c.num_layers)]


def annotate_logical_axes(model: Qwen, config: QwenConfig) -> None:
  """Sets every parameter's ``logical_axes`` (and ``logical_units``: whole heads) metadata from its
  row of ``models.weight_table``.

  Raises ValueError if a parameter has no row, or a row's axes do not match its rank.
  """
  annotated = set()
  for entry in expand_table(config):
    if entry.path in annotated:
      continue
    var: object = model
    for key in entry.path:
      var = var[key] if isinstance(key, int) else getattr(var, key)
    if not isinstance(var, nnx.Param) or len(entry.spec.axes) != var.ndim:
      raise ValueError(f"weight table row {entry.spec.hf!r}: expected a rank-{len(entry.spec.axes)} parameter "
                       f"at {'.'.join(map(str, entry.path))}, got {type(var).__name__} "
                       f"{getattr(var, 'shape', None)}")
    var.set_metadata(**{LOGICAL_AXES_KEY: tuple(entry.spec.axes), LOGICAL_UNITS_KEY: axis_units(entry.spec, config)})
    annotated.add(entry.path)
  for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    if tuple(path) not in annotated:
      raise ValueError(f"parameter {'.'.join(map(str, path))}: no row of the weight table names it")
