"""The train step's memory model against its plain counterparts on a tiny Qwen3.

Vocabulary-chunked token log-probs vs the full-logits path, the ``jax.nn.dot_product_attention``
pass vs the einsum attention of the cached path, per-layer remat vs none, and the sharded step
with micro-batches from a tokens-per-device budget vs one batch (value and gradient each).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.config import QwenConfig
from models.qwen import Qwen
from models.vocab_logprobs import hidden_token_logprobs, num_vocab_chunks
from rti_jax.objectives import next_token_logprobs

T = 160  # above the 128-row causal block, so the blocked attention path runs


def tiny(tie: bool = False, seed: int = 0) -> Qwen:
  cfg = QwenConfig(model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=tie)
  return Qwen(cfg, rngs=nnx.Rngs(seed))


def batch(t: int = T) -> tuple[jax.Array, jax.Array]:
  ids = jax.random.randint(jax.random.key(1), (3, t), 0, 96)
  lengths = jnp.array([t, t - 37, 5])
  return ids, (jnp.arange(t)[None] < lengths[:, None]).astype(jnp.int32)


def max_diff(a, b) -> float:
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def max_abs(a) -> float:
  return max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(a))


def test_num_vocab_chunks_divides_the_vocabulary() -> None:
  assert num_vocab_chunks(96, 20) == 6  # 16 ids each (96 / 5 is not whole)
  assert num_vocab_chunks(96, 96) == 1
  assert num_vocab_chunks(151936, 16384) == 16  # Qwen3's vocabulary: 9,496 ids a chunk
  with pytest.raises(ValueError, match="vocab chunk"):
    num_vocab_chunks(96, 0)


def test_hidden_token_logprobs_match_a_numpy_log_softmax() -> None:
  rng = np.random.default_rng(0)
  h = rng.normal(size=(2, 5, 8)).astype(np.float32)
  w = rng.normal(size=(8, 12)).astype(np.float32)
  y = rng.integers(0, 12, size=(2, 5))
  logits = h.astype(np.float64) @ w
  ref = np.take_along_axis(logits, y[..., None], -1)[..., 0] - np.log(np.exp(logits).sum(-1))
  for chunk in (12, 5, 1):
    got = hidden_token_logprobs(jnp.asarray(h), jnp.asarray(w), jnp.asarray(y), chunk=chunk)
    np.testing.assert_allclose(np.asarray(got), ref, atol=2e-6)
    tied = hidden_token_logprobs(jnp.asarray(h), jnp.asarray(w.T), jnp.asarray(y), chunk=chunk, vocab_major=True)
    np.testing.assert_allclose(np.asarray(tied), ref, atol=2e-6)


@pytest.mark.parametrize("tie", [False, True])
def test_vocab_chunked_logprobs_equal_the_full_logits_path(tie: bool) -> None:
  graphdef, params, rest = nnx.split(tiny(tie), nnx.Param, ...)
  ids, mask = batch()
  weights = jax.random.normal(jax.random.key(2), ids.shape) * mask

  def full(p):
    return next_token_logprobs(nnx.merge(graphdef, p, rest)(ids, mask), ids)

  def chunked(p, remat="none"):
    return nnx.merge(graphdef, p, rest).token_logprobs(ids, mask, vocab_chunk=20, remat=remat, right_padded=True)

  real = np.asarray(mask, bool)
  a, b = np.asarray(full(params)), np.asarray(chunked(params))
  assert np.all(b[:, 0] == 0.0)
  assert np.max(np.abs(a[real] - b[real])) <= 2e-6
  g_full = jax.grad(lambda p: jnp.sum(full(p) * weights))(params)
  for remat in ("none", "full", "dots"):
    g = jax.grad(lambda p: jnp.sum(chunked(p, remat) * weights))(params)
    assert max_diff(g, g_full) <= 1e-6 * max_abs(g_full), remat


def test_uncached_attention_equals_the_einsum_attention_of_the_cached_path() -> None:
  model = tiny()
  ids, mask = batch()
  from models.qwen import causal_padding_mask, positions_from_mask

  h_new = model.hidden_states(ids, mask)  # jax.nn.dot_product_attention, causal blocks
  cache = model.init_cache(ids.shape[0], T)
  h_ref, _ = model.forward(ids, positions_from_mask(mask), causal_padding_mask(mask), cache, 0)  # einsums
  real = np.asarray(mask, bool)
  assert np.max(np.abs(np.asarray(h_new)[real] - np.asarray(h_ref)[real])) <= 1e-5
  short = model.hidden_states(ids[:, :40], mask[:, :40])  # one block
  cache = model.init_cache(ids.shape[0], 40)
  ref, _ = model.forward(ids[:, :40], positions_from_mask(mask[:, :40]), causal_padding_mask(mask[:, :40]), cache, 0)
  assert np.max(np.abs(np.asarray(short) - np.asarray(ref))[real[:, :40]]) <= 1e-5


def test_remat_rejects_an_unknown_policy() -> None:
  ids, mask = batch(8)
  with pytest.raises(ValueError, match="remat"):
    tiny().hidden_states(ids, mask, remat="everything")
