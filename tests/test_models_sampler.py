"""KV-cache sampler and score: transformers parity, log-prob consistency, distributions."""

import jax
import numpy as np
import pytest
import torch
from scipy import stats

import models
from models import sampler as sampler_lib
from models.sampler import Sampler, filter_logits
from models.scoring import next_token_logprobs, response_logprobs
from rti_jax.shapes import bucket_length
from models_fixtures import qwen2_tied_ckpt, qwen3_ckpt, qwen3_moe_ckpt  # noqa: F401 (fixtures)

PROMPTS = [[5, 6, 7, 8, 9], [1, 2], [3, 4, 5, 6, 7, 8, 9, 10, 11], [42]]


def _torch_next_logits(ref_model, prompt):
  with torch.no_grad():
    return ref_model(input_ids=torch.tensor([prompt])).logits[0, -1].double().numpy()


def _softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def _chi2_pvalue(samples, probs, n):
  """Pearson chi-square of ``samples`` against ``probs``; bins with expected < 5 are pooled."""
  counts = np.bincount(samples, minlength=len(probs))
  assert counts[probs == 0].sum() == 0, "sampled a token of probability 0"
  exp = probs * n
  big = exp >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(exp[big], exp[~big].sum())
  keep = exp > 0
  return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


@pytest.fixture(scope="module")
def qwen3(qwen3_ckpt):
  path, ref = qwen3_ckpt
  model, _ = models.from_pretrained(path)
  return Sampler(model, max_cache_len=256), ref


# the families' forward passes are checked against transformers in test_models_qwen's fast tier
@pytest.mark.parametrize("ckpt", ["qwen3_ckpt", pytest.param("qwen2_tied_ckpt", marks=pytest.mark.slow),
                                  pytest.param("qwen3_moe_ckpt", marks=pytest.mark.slow)])
def test_greedy_equals_transformers_generate(request, ckpt):
  path, ref = request.getfixturevalue(ckpt)
  model, _ = models.from_pretrained(path)
  out = Sampler(model).generate(PROMPTS, key=jax.random.key(0), max_new_tokens=12, temperature=0.0)
  longest = max(map(len, PROMPTS))
  ids = torch.tensor([[0] * (longest - len(p)) + p for p in PROMPTS])
  mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in PROMPTS])
  want = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                      pad_token_id=0)[:, longest:].numpy()
  np.testing.assert_array_equal(np.stack(out.tokens), want)
  assert out.finish_reasons == ["length"] * 4
  assert all(np.all(s == 0) for s in out.sampling_logprobs)


def test_length_bucket_is_the_smallest_allowed_size():
  """Brute force over the allowed sizes: powers of two >= 16, and 1.5x powers of two from 96 on."""
  sizes = sorted({1 << k for k in range(4, 14)} | {3 << k for k in range(5, 13)})
  for n in range(0, 5000):
    want = next(s for s in sizes if s >= max(n, 16))
    assert bucket_length(n) == want, n
  assert [bucket_length(n) for n in (17, 65, 97, 257, 530, 769)] == [32, 96, 128, 384, 768, 1024]


def test_long_prompts_prefill_in_causal_blocks_like_transformers(qwen3_ckpt):
  """Prompts over one causal block (the prefill skips keys after each query block): greedy tokens
  equal transformers' and the sampled log-probs equal ``score`` (an uncached pass). The longer
  prompt pads to a 1.5x length bucket (384), not a power of two."""
  path, ref = qwen3_ckpt
  model, config = models.from_pretrained(path)
  rng = np.random.default_rng(7)
  prompts = [rng.integers(1, config.vocab_size, n).tolist() for n in (300, 170)]
  assert bucket_length(300) == 384
  sampler = Sampler(model, max_cache_len=512)
  out = sampler.generate(prompts, key=jax.random.key(0), max_new_tokens=6, temperature=0.0)
  for p, toks in zip(prompts, out.tokens):
    want = ref.generate(input_ids=torch.tensor([p]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, len(p):]
    np.testing.assert_array_equal(toks, want.numpy())
  for lp, sc in zip(out.logprobs, sampler.score(prompts, out.tokens)):
    assert np.abs(lp - sc).max() <= 1e-4


def test_sampled_logprobs_equal_score_and_torch(qwen3):
  sampler, ref = qwen3
  out = sampler.generate(PROMPTS, key=jax.random.key(1), max_new_tokens=16, temperature=0.8, top_k=30)
  scored = sampler.score(PROMPTS, out.tokens)
  for p, toks, lp, sc in zip(PROMPTS, out.tokens, out.logprobs, scored):
    assert len(toks) == 16 and lp.dtype == np.float32 and sc.dtype == np.float32
    assert np.abs(lp - sc).max() <= 1e-4
    with torch.no_grad():
      full = ref(input_ids=torch.tensor([p + toks.tolist()])).logits[0].log_softmax(-1).numpy()
    want = full[np.arange(len(p) - 1, len(p) - 1 + len(toks)), toks]
    assert np.abs(sc - want).max() <= 1e-4


def test_tempered_score_equals_the_sampling_logprobs_and_torch(qwen3):
  """score(..., temperature=0.6) of tokens drawn at 0.6 (no top-k / top-p) is what generate reported
  as their sampling log-probs, and transformers' log_softmax(logits / 0.6) at those positions."""
  sampler, ref = qwen3
  out = sampler.generate(PROMPTS, key=jax.random.key(3), max_new_tokens=12, temperature=0.6)
  scored = sampler.score(PROMPTS, out.tokens, temperature=0.6)
  for p, toks, lp, slp, sc in zip(PROMPTS, out.tokens, out.logprobs, out.sampling_logprobs, scored):
    assert len(toks) == 12 and sc.dtype == np.float32
    assert np.abs(slp - sc).max() <= 1e-4
    with torch.no_grad():
      logits = ref(input_ids=torch.tensor([p + toks.tolist()])).logits[0].double()
    want = (logits / 0.6).log_softmax(-1).numpy()[np.arange(len(p) - 1, len(p) - 1 + len(toks)), toks]
    assert np.abs(sc - want).max() <= 1e-4
    assert np.abs(lp - want).mean() > 0.01  # the temperature-1 log-probs are another quantity
  with pytest.raises(ValueError, match="temperature"):
    sampler.score(PROMPTS[:1], [[1]], temperature=0.0)


def test_score_handles_mixed_lengths_and_empty_responses(qwen3):
  sampler, ref = qwen3
  prompts, responses = [[1, 2, 3], [7]], [[], [8, 9, 10, 11]]
  got = sampler.score(prompts, responses)
  assert got[0].shape == (0,)
  with torch.no_grad():
    full = ref(input_ids=torch.tensor([[7, 8, 9, 10, 11]])).logits[0].log_softmax(-1).numpy()
  np.testing.assert_allclose(got[1], full[[0, 1, 2, 3], [8, 9, 10, 11]], atol=1e-4)
  assert models.sampler.score(sampler_model(sampler), prompts, responses)[1].shape == (4,)


def test_score_of_long_sequences_uses_chunks_and_stays_exact(qwen3):
  """600 tokens -> a 1024-token bucket; the head runs on the 512 response positions only."""
  _, ref = qwen3
  sampler = Sampler(sampler_model(qwen3[0]), max_cache_len=1024)
  rng = np.random.default_rng(0)
  prompt, response = rng.integers(0, 96, 100).tolist(), rng.integers(0, 96, 500).tolist()
  got = sampler.score([prompt], [response])[0]
  with torch.no_grad():
    full = ref(input_ids=torch.tensor([prompt + response])).logits[0].log_softmax(-1).numpy()
  want = full[np.arange(99, 599), response]
  assert got.shape == (500,) and np.abs(got - want).max() <= 1e-4


def sampler_model(sampler):
  from flax import nnx
  return nnx.merge(sampler.graphdef, sampler.state)


N_DRAWS = 4096


def _first_tokens(sampler, prompt, seed, **kw):
  out = sampler.generate([prompt] * N_DRAWS, key=jax.random.key(seed), max_new_tokens=1, **kw)
  return np.array([t[0] for t in out.tokens]), out


def test_temperature_sampling_matches_softmax_of_scaled_logits(qwen3):
  """Chi-square: samples at t = 0.7 fit softmax(logits / 0.7) and reject softmax(logits)."""
  sampler, ref = qwen3
  prompt = [3, 1, 4, 1, 5]
  logits = _torch_next_logits(ref, prompt)
  toks, out = _first_tokens(sampler, prompt, seed=2, temperature=0.7)
  assert _chi2_pvalue(toks, _softmax(logits / 0.7), N_DRAWS) > 1e-3
  assert _chi2_pvalue(toks, _softmax(logits), N_DRAWS) < 1e-6
  # returned log-probs are those of the temperature-1 policy, sampling ones of the tempered law
  np.testing.assert_allclose([l[0] for l in out.logprobs], np.log(_softmax(logits))[toks], atol=1e-4)
  np.testing.assert_allclose([l[0] for l in out.sampling_logprobs],
                             np.log(_softmax(logits / 0.7))[toks], atol=1e-4)


def _reference_filter(logits, k, p):
  """Brute force: keep the top k, then the smallest prefix whose mass-before is < p."""
  order = np.argsort(-logits, kind="stable")
  keep = np.zeros(len(logits), bool)
  k = k if k > 0 else len(logits)
  probs = _softmax(logits[order[:k]])
  mass = 0.0
  for rank, tok in enumerate(order[:k]):
    if rank > 0 and mass >= p:
      break
    keep[tok] = True
    mass += probs[rank]
  return keep


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.6), (10, 0.8), (1, 1.0), (0, 1.0)])
def test_filter_logits_matches_brute_force(top_k, top_p):
  rng = np.random.default_rng(top_k)
  logits = rng.normal(size=(6, 40)).astype(np.float32) * 2
  got = np.asarray(filter_logits(logits, np.full(6, top_k), np.full(6, top_p, np.float32)))
  for row in range(6):
    want = _reference_filter(logits[row].astype(np.float64), top_k, top_p)
    np.testing.assert_array_equal(np.isfinite(got[row]), want)
    np.testing.assert_array_equal(got[row][want], logits[row][want])


# slow: the filter is checked by brute force and the sampler's law at a temperature in the fast tier
@pytest.mark.parametrize("top_k, top_p", [pytest.param(5, 1.0, marks=pytest.mark.slow),
                                          pytest.param(0, 0.7, marks=pytest.mark.slow)])
def test_top_k_top_p_sampling_matches_the_truncated_law(qwen3, top_k, top_p):
  sampler, ref = qwen3
  prompt = [2, 7, 1, 8]
  logits = _torch_next_logits(ref, prompt) / 1.3
  keep = _reference_filter(logits, top_k, top_p)
  probs = np.where(keep, _softmax(np.where(keep, logits, -np.inf)), 0.0)
  toks, _ = _first_tokens(sampler, prompt, seed=3, temperature=1.3, top_k=top_k, top_p=top_p)
  assert keep[toks].all()
  assert _chi2_pvalue(toks, probs, N_DRAWS) > 1e-3


def test_stop_ids_end_rows_early_and_independently(qwen3):
  sampler, _ = qwen3
  greedy = sampler.generate(PROMPTS, key=jax.random.key(0), max_new_tokens=16, temperature=0.0)
  stop = int(greedy.tokens[0][3])
  first_hit = [int(np.argmax(t == stop)) if (t == stop).any() else None for t in greedy.tokens]
  out = sampler.generate(PROMPTS, key=jax.random.key(0), max_new_tokens=16, temperature=0.0,
                         stop_token_ids=[stop, 95])
  for row, hit in enumerate(first_hit):
    if hit is None:
      assert out.finish_reasons[row] == "length" and len(out.tokens[row]) == 16
      np.testing.assert_array_equal(out.tokens[row], greedy.tokens[row])
    else:
      assert out.finish_reasons[row] == "stop" and out.tokens[row][-1] == stop
      np.testing.assert_array_equal(out.tokens[row], greedy.tokens[row][:hit + 1])
      assert len(out.logprobs[row]) == hit + 1
  assert out.finish_reasons[0] == "stop" and len(out.tokens[0]) <= 4


def test_explicit_keys_make_sampling_reproducible(qwen3):
  sampler, _ = qwen3
  a = sampler.generate(PROMPTS, key=jax.random.key(7), max_new_tokens=8)
  b = sampler.generate(PROMPTS, key=jax.random.key(7), max_new_tokens=8)
  c = sampler.generate(PROMPTS, key=jax.random.key(8), max_new_tokens=8)
  np.testing.assert_array_equal(np.stack(a.tokens), np.stack(b.tokens))
  assert not np.array_equal(np.stack(a.tokens), np.stack(c.tokens))


def test_no_recompilation_within_a_bucket(qwen3):
  sampler, _ = qwen3
  sampler.generate([[1, 2, 3]] * 3, key=jax.random.key(0), max_new_tokens=10)
  before = sampler_lib._generate_jit._cache_size()
  sampler.generate([[1] * 12, [4, 5], [6]], key=jax.random.key(1), max_new_tokens=16, temperature=0.3)
  sampler.generate([[9]] * 4, key=jax.random.key(2), max_new_tokens=5, temperature=0.0,
                   top_k=3, top_p=0.5, stop_token_ids=[1, 2, 3])
  assert sampler_lib._generate_jit._cache_size() == before
  sampler.score([[1, 2]], [[3, 4]])
  n_score = sampler_lib._score_jit._cache_size()
  sampler.score([[1, 2, 3, 4]], [[5]])
  assert sampler_lib._score_jit._cache_size() == n_score


@pytest.mark.parametrize("prompts, kw, needle", [
  ([[1, 2], []], {}, r"prompts\[1\].*empty"),
  ([[1, 96]], {}, r"prompts\[0\].*\[0, 96\).*96"),
  ([[-3, 1]], {}, r"prompts\[0\].*-3"),
  ([[1] * 250], {"max_new_tokens": 10}, r"prompts\[0\].*250.*max_cache_len=256"),
  ([[1]], {"max_new_tokens": 0}, "max_new_tokens"),
  ([[1]], {"top_p": 0.0}, "top_p"),
  ([[1]], {"stop_token_ids": [500], "max_new_tokens": 4}, "stop_token_ids"),
  ([], {}, "at least one prompt"),
  ([[1]], {"pad_id": -1, "max_new_tokens": 4}, "pad_id"),
  ([[1.5, 2]], {}, r"prompts\[0\].*integer"),
])
def test_bad_generate_input_raises_clear_errors(qwen3, prompts, kw, needle):
  sampler, _ = qwen3
  with pytest.raises(ValueError, match=needle):
    sampler.generate(prompts, key=jax.random.key(0), **kw)


@pytest.mark.parametrize("prompts, responses, needle", [
  ([[1]], [[2], [3]], "responses: expected 1"),
  ([[]], [[2]], r"prompts\[0\].*empty"),
  ([[1]], [[200]], r"responses\[0\].*200"),
  ([[1] * 200], [[2] * 100], "max_cache_len=256"),
])
def test_bad_score_input_raises_clear_errors(qwen3, prompts, responses, needle):
  sampler, _ = qwen3
  with pytest.raises(ValueError, match=needle):
    sampler.score(prompts, responses)


def test_bf16_model_samples_with_fp32_logprobs_consistent_with_score(qwen3_ckpt):
  path, _ = qwen3_ckpt
  model, _ = models.from_pretrained(path, dtype="bfloat16")
  sampler = Sampler(model)
  out = sampler.generate(PROMPTS, key=jax.random.key(4), max_new_tokens=12)
  scored = sampler.score(PROMPTS, out.tokens)
  for lp, sc in zip(out.logprobs, scored):
    assert lp.dtype == sc.dtype == np.float32
    assert np.abs(lp - sc).max() <= 2e-2


def test_next_token_logprobs_is_exact_with_ragged_chunks_and_differentiable(qwen3):
  import jax.numpy as jnp
  from flax import nnx
  from models_fixtures import padded_batch
  model = sampler_model(qwen3[0])
  ids, mask = padded_batch()  # T = 9: chunks of 4 leave a ragged tail
  full = jax.nn.log_softmax(model(jnp.asarray(ids), jnp.asarray(mask)), axis=-1)
  want = np.take_along_axis(np.asarray(full[:, :-1]), ids[:, 1:, None], axis=-1)[..., 0]
  got = np.asarray(next_token_logprobs(model, jnp.asarray(ids), jnp.asarray(mask), chunk=4))
  assert got.shape == (4, 9) and np.all(got[:, -1] == 0)
  real = (mask[:, :-1] * mask[:, 1:]).astype(bool)
  assert np.abs(got[:, :-1] - want)[real].max() <= 1e-5

  def loss(m):
    lp = next_token_logprobs(m, jnp.asarray(ids), jnp.asarray(mask), chunk=4)
    return -jnp.sum(lp[:, :-1] * real)

  grads = nnx.jit(nnx.grad(loss))(model)
  g = grads["layers"][0]["mlp"]["up_proj"]["kernel"][...]
  assert np.all(np.isfinite(g)) and np.abs(g).max() > 0


def test_response_logprobs_equal_the_full_pass_at_the_asked_positions_in_chunks(qwen3):
  """The head on ``width`` positions from ``starts`` (in ragged chunks of 2) gives the full
  pass's next-token log-probs there; positions past the row end are clamped, not out of range."""
  import jax.numpy as jnp
  from models_fixtures import padded_batch
  model = sampler_model(qwen3[0])
  ids, mask = padded_batch()
  full = np.asarray(next_token_logprobs(model, jnp.asarray(ids), jnp.asarray(mask)))
  starts = np.array([0, 3, 5, 7], np.int32)
  got = np.asarray(response_logprobs(model, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(starts), 5, chunk=2))
  assert got.shape == (4, 5) and np.all(np.isfinite(got))
  for i, s0 in enumerate(starts):
    n = min(5, ids.shape[1] - 1 - s0)
    np.testing.assert_allclose(got[i, :n], full[i, s0:s0 + n], atol=1e-5)


def test_batches_over_the_attention_budget_run_in_sub_batches_with_the_same_results(qwen3_ckpt):
  path, _ = qwen3_ckpt
  model, _ = models.from_pretrained(path)
  whole = Sampler(model, max_cache_len=256)
  small = Sampler(model, max_cache_len=256, max_attention_bytes=1)  # one row per call
  assert small._rows_per_call(16, 32) == 1 and whole._rows_per_call(16, 32) > len(PROMPTS)
  kw = dict(max_new_tokens=6, temperature=0.0)
  a, b = whole.generate(PROMPTS, key=jax.random.key(0), **kw), small.generate(PROMPTS, key=jax.random.key(0), **kw)
  for x, y in zip(a.tokens + a.logprobs, b.tokens + b.logprobs):  # greedy: the split changes nothing
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
  assert a.finish_reasons == b.finish_reasons
  # sampled: sub-batch j uses fold_in(key, j), reproducibly
  kw = dict(max_new_tokens=6, temperature=1.0)
  s1, s2 = (small.generate(PROMPTS, key=jax.random.key(3), **kw) for _ in range(2))
  one = whole.generate(PROMPTS[2:3], key=jax.random.fold_in(jax.random.key(3), 2), **kw)
  assert all(np.array_equal(x, y) for x, y in zip(s1.tokens, s2.tokens))
  np.testing.assert_array_equal(s1.tokens[2], one.tokens[0])
  responses = [[1, 2, 3], [], [4], [5, 6]]
  for x, y in zip(whole.score(PROMPTS, responses), small.score(PROMPTS, responses)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="max_attention_bytes"):
    Sampler(model, max_attention_bytes=0)


def _brute_force_inverse(probs, u):
  """The first id whose running sum (float64) exceeds u * total, skipping ids without mass."""
  total, acc = probs.sum(), 0.0
  for i, p in enumerate(probs):
    acc += p
    if p > 0 and acc > u * total:
      return i
  return int(np.flatnonzero(probs > 0)[-1])


def test_invert_cdf_matches_brute_force_and_never_picks_an_excluded_id():
  rng = np.random.default_rng(0)
  probs = rng.dirichlet(np.ones(12), size=6)
  probs[0, [0, 1]] = 0.0          # excluded ids first ...
  probs[1, [5, 6]] = 0.0          # ... in the middle ...
  probs[2, [9, 10, 11]] = 0.0     # ... and last, where u near 1 lands past the last id with mass
  probs[3] = np.eye(12)[7]        # one id with all the mass
  probs[4, :] = 0.0
  probs[4, [0, 11]] = 0.5
  us = np.array([0.0, 1e-9, 0.3, 0.5, 0.999999, 1.0], np.float32)
  for u in us:
    got = np.asarray(sampler_lib.invert_cdf(np.asarray(probs, np.float32), np.full(6, u, np.float32)))
    for row in range(6):
      assert probs[row, got[row]] > 0
      if u < 1.0:  # at u = 1 float32 rounding decides; only the mass rule is checked
        assert got[row] == _brute_force_inverse(probs[row].astype(np.float32).astype(np.float64), float(u))


def test_inverse_cdf_draw_follows_the_softmax_law():
  """Chi-square: 20,000 draws from one row with masked ids fit its softmax; none lands on a masked id."""
  rng = np.random.default_rng(1)
  logits = rng.normal(size=40).astype(np.float32) * 1.5
  logits[[3, 17, 39]] = -np.inf
  n = 20_000
  toks = np.asarray(sampler_lib.inverse_cdf_draw(jax.random.key(4), np.tile(logits, (n, 1))))
  probs = _softmax(logits.astype(np.float64))
  assert not np.isin(toks, [3, 17, 39]).any()
  assert _chi2_pvalue(toks, probs, n) > 1e-3
  assert _chi2_pvalue(toks, _softmax(np.where(np.isfinite(logits), 0.0, -np.inf)), n) < 1e-6  # not uniform
