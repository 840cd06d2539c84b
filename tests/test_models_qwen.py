"""Logit parity of the Flax module with transformers (torch CPU, fp32) on padded batches."""


import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from models.qwen import apply_rope, positions_from_mask
from models_fixtures import padded_batch, torch_logits, write_checkpoint


@pytest.mark.parametrize("family, tie, rope", [
  pytest.param("qwen3", False, None, marks=pytest.mark.slow),  # the untied Qwen3 runs fast with rope scaling below
  ("qwen3", True, None),
  ("qwen2", True, None),
  pytest.param("qwen2", False, None, marks=pytest.mark.slow),
  ("qwen3", False, {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
  ("qwen3_moe", False, None),
])
def test_logits_match_transformers_on_a_padded_batch(tmp_path, family, tie, rope):
  ref_model = write_checkpoint(tmp_path, family, tie=tie, rope=rope)
  model, config = models.from_pretrained(tmp_path)
  assert config.tie_word_embeddings == tie
  ids, mask = padded_batch()
  ref = torch_logits(ref_model, ids, mask)
  got = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
  assert got.shape == ref.shape == (4, 9, config.vocab_size) and got.dtype == np.float32
  real = mask.astype(bool)
  assert np.abs(got - ref)[real].max() <= 1e-4
  assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero logits


def test_left_and_right_padding_give_the_same_logits(tmp_path):
  write_checkpoint(tmp_path, "qwen3")
  model, _ = models.from_pretrained(tmp_path)
  rng = np.random.default_rng(3)
  seq = rng.integers(0, 96, 5)
  left = np.concatenate([np.zeros(3, int), seq])[None]
  right = np.concatenate([seq, np.zeros(3, int)])[None]
  lm = np.array([[0, 0, 0, 1, 1, 1, 1, 1]])
  rm = lm[:, ::-1].copy()
  a = np.asarray(model(jnp.asarray(left), jnp.asarray(lm)))[0, 3:]
  b = np.asarray(model(jnp.asarray(right), jnp.asarray(rm)))[0, :5]
  np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("t", [129, pytest.param(300, marks=pytest.mark.slow), pytest.param(1100, marks=pytest.mark.slow)])
def test_causal_blocks_match_transformers_and_the_full_attention(tmp_path, t):
  """Sequences longer than one causal block (uncached passes) against transformers and against the
  same model's unblocked attention, with left and right padding."""
  from models.qwen import causal_padding_mask

  ref_model = write_checkpoint(tmp_path, "qwen3")
  model, config = models.from_pretrained(tmp_path)
  rng = np.random.default_rng(t)
  ids = rng.integers(0, config.vocab_size, (2, t))
  mask = np.ones((2, t), np.int64)
  mask[0, : t // 3] = 0  # left padding
  mask[1, t - 40:] = 0  # right padding
  @nnx.jit  # jitted: no op-by-op dispatch
  def blocked_and_full(model, ids, mask):
    h_full, _ = model.forward(ids, positions_from_mask(mask), causal_padding_mask(mask), causal=False)
    return model(ids, mask), model.logits(h_full)

  got, full = (np.asarray(x) for x in blocked_and_full(model, jnp.asarray(ids), jnp.asarray(mask)))
  real = mask.astype(bool)
  assert np.abs(got - full)[real].max() <= 1e-5
  if t <= 300:  # the torch reference is slow at 1100 tokens
    ref = torch_logits(ref_model, ids, mask)
    assert np.abs(got - ref)[real].max() <= 1e-4


def test_positions_from_mask():
  mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(positions_from_mask(mask), [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]])


def test_rope_matches_a_numpy_rotation_of_each_pair():
  """Half-split RoPE: pair (x_i, x_{i+D/2}) is rotated by angle pos * inv_freq_i."""
  rng = np.random.default_rng(0)
  d = 8
  x = rng.normal(size=(1, 3, 2, d)).astype(np.float32)
  pos = np.array([[0, 4, 11]])
  inv = 1.0 / (1e4 ** (np.arange(0, d, 2) / d))
  want = np.empty_like(x)
  for t in range(3):
    for i in range(d // 2):
      a = pos[0, t] * inv[i]
      x1, x2 = x[0, t, :, i], x[0, t, :, i + d // 2]
      want[0, t, :, i] = x1 * np.cos(a) - x2 * np.sin(a)
      want[0, t, :, i + d // 2] = x2 * np.cos(a) + x1 * np.sin(a)
  got = apply_rope(jnp.asarray(x), jnp.asarray(pos), jnp.asarray(inv, jnp.float32))
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_bf16_model_keeps_fp32_logits_close_to_fp32(tmp_path):
  write_checkpoint(tmp_path, "qwen3")
  ids, mask = padded_batch()
  m32, _ = models.from_pretrained(tmp_path)
  m16, _ = models.from_pretrained(tmp_path, dtype="bfloat16")
  a = np.asarray(m32(jnp.asarray(ids), jnp.asarray(mask)))
  b = m16(jnp.asarray(ids), jnp.asarray(mask))
  assert b.dtype == jnp.float32
  real = mask.astype(bool)
  rel = np.abs(np.asarray(b) - a)[real].max() / np.abs(a).max()
  assert rel < 0.1


def test_fp32_models_use_highest_matmul_precision(tmp_path):
  """So fp32 log-probs match torch on GPUs as well (no TF32)."""
  import jax
  write_checkpoint(tmp_path, "qwen2")
  m32, _ = models.from_pretrained(tmp_path)
  m16, _ = models.from_pretrained(tmp_path, dtype="bfloat16")
  assert m32.layers[0].attn.q_proj.precision == jax.lax.Precision.HIGHEST
  assert m32.layers[1].mlp.down_proj.precision == jax.lax.Precision.HIGHEST
  assert m16.layers[0].attn.q_proj.precision == jax.lax.Precision.DEFAULT


def test_moe_block_matches_a_per_token_numpy_reference(tmp_path):
  """Router + top-k + SwiGLU experts re-derived token by token in float64."""
  from models.qwen import MLP, MoE
  write_checkpoint(tmp_path, "qwen3_moe")
  model, config = models.from_pretrained(tmp_path)
  assert isinstance(model.layers[0].mlp, MoE) and isinstance(model.layers[1].mlp, MLP)
  moe = model.layers[0].mlp
  x = np.random.default_rng(0).normal(size=(2, 5, config.hidden_size)).astype(np.float32)
  got = np.asarray(moe(jnp.asarray(x)))
  router, gate, up, down = (np.asarray(p[...], np.float64) for p in
                            (moe.router, moe.gate_proj, moe.up_proj, moe.down_proj))
  silu = lambda z: z / (1 + np.exp(-z))
  want = np.zeros_like(got, dtype=np.float64)
  for b in range(2):
    for t in range(5):
      v = x[b, t].astype(np.float64)
      logits = v @ router
      probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
      top = np.argsort(-probs)[:config.num_experts_per_tok]
      w = probs[top] / probs[top].sum()  # norm_topk_prob=True in the fixture
      for e, we in zip(top, w):
        want[b, t] += we * ((silu(v @ gate[e]) * (v @ up[e])) @ down[e])
  np.testing.assert_allclose(got, want, atol=1e-5)
