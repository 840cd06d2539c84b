"""The sampler's prefix cache: multi-turn generation that prefills only what follows a stored prefix.

References: the default sampler (every prompt prefilled whole, tested against transformers in
test_models_sampler.py) and transformers' logits of the whole conversation.
"""

import jax
import numpy as np
import pytest
import torch

import models
from models.prefix_cache import PrefixCache, prefix_hashes
from models.sampler import Sampler
from models_fixtures import qwen3_ckpt  # noqa: F401 (fixture)
from test_models_sampler import _chi2_pvalue

SYSTEM = list(range(3, 3 + 40))  # ids < 96 (the fixture vocab)  # a shared "system prompt" longer than the shared-prefill threshold


def _turns(sampler, prompts, replies, n_turns, **kw):
  """Drives a multi-turn loop: prompt -> generated turn + reply -> next prompt. Returns per turn
  (prompts, GenerateOutput)."""
  out = []
  prompts = [list(p) for p in prompts]
  for turn in range(n_turns):
    gen = sampler.generate(prompts, key=jax.random.key(turn), **kw)
    out.append((prompts, gen))
    prompts = [p + g.tolist() + replies[(i + turn) % len(replies)] for i, (p, g) in enumerate(zip(prompts, gen.tokens))]
  return out


@pytest.fixture(scope="module")
def model_and_ref(qwen3_ckpt):
  path, ref = qwen3_ckpt
  return models.from_pretrained(path)[0], ref


@pytest.mark.slow
def test_greedy_turns_equal_the_uncached_sampler_and_reuse_the_conversation(model_and_ref):
  model, ref = model_and_ref
  starts = [SYSTEM + [50, 51], SYSTEM + [55], SYSTEM + [70, 71, 72, 73], [9, 8, 7]]
  replies = [[80, 81, 82], [90], [60, 61, 62, 63, 64]]
  kw = dict(max_new_tokens=6, temperature=0.0)
  plain = _turns(Sampler(model, max_cache_len=256), starts, replies, 3, **kw)
  cached_sampler = Sampler(model, max_cache_len=256, prefix_cache_bytes=1 << 26)
  cached = _turns(cached_sampler, starts, replies, 3, **kw)
  for (p_plain, g_plain), (p_cached, g_cached) in zip(plain, cached):
    assert p_plain == p_cached
    for a, b in zip(g_plain.tokens, g_cached.tokens):
      np.testing.assert_array_equal(a, b)
    for a, b in zip(g_plain.logprobs, g_cached.logprobs):
      np.testing.assert_allclose(a, b, atol=2e-5)
  stats = cached_sampler.prefix_cache.stats()
  # Turn 1: 3 rows share SYSTEM (one shared prefill, then 3 hits); turns 2 and 3: every row hits
  # its own previous turn.
  assert stats["hits"] == 3 + 4 + 4
  prompt_lens = sum(len(p) for prompts, _ in cached[1:] for p in prompts)
  fed_before = sum(len(p) + len(g) for prompts, gen in cached[:-1] for p, g in zip(prompts, gen.tokens))
  assert stats["reused_tokens"] == 3 * len(SYSTEM) + fed_before
  assert prompt_lens - fed_before == sum(len(r) for r in [replies[(i + t) % 3] for t in range(2) for i in range(4)])
  # the last turn's log-probs equal transformers' on the whole conversation
  prompts, gen = cached[-1]
  for p, toks, lps in zip(prompts, gen.tokens, gen.logprobs):
    full = torch.tensor([p + toks.tolist()])
    with torch.no_grad():
      logp = torch.log_softmax(ref(input_ids=full).logits[0].double(), -1).numpy()
    want = [logp[len(p) - 1 + j, t] for j, t in enumerate(toks)]
    np.testing.assert_allclose(lps, want, atol=2e-4)


def test_sampling_with_the_cache_follows_the_same_law(model_and_ref):
  """Temperature 1: the first sampled token of a cached continuation has the softmax law of the
  whole conversation's logits (a chi-square test over many rows of one call)."""
  model, ref = model_and_ref
  sampler = Sampler(model, max_cache_len=256, prefix_cache_bytes=1 << 26)
  base = SYSTEM + [11, 12]
  sampler.generate([base], key=jax.random.key(0), max_new_tokens=1, temperature=0.0)
  first = sampler.generate([base], key=jax.random.key(0), max_new_tokens=1, temperature=0.0).tokens[0].tolist()
  prompt = base + first + [13, 14]
  n = 2048
  out = sampler.generate([prompt] * n, key=jax.random.key(1), max_new_tokens=1, temperature=1.0)
  assert sampler.prefix_cache.hits >= n
  with torch.no_grad():
    probs = torch.softmax(ref(input_ids=torch.tensor([prompt])).logits[0, -1].double(), -1).numpy()
  assert _chi2_pvalue(np.concatenate(out.tokens), probs, n) > 1e-3


@pytest.mark.slow
def test_sub_batches_and_weight_sync(model_and_ref):
  model, _ = model_and_ref
  prompts = [SYSTEM + [50 + i] for i in range(5)]
  big = Sampler(model, max_cache_len=256, prefix_cache_bytes=1 << 26)
  small = Sampler(model, max_cache_len=256, prefix_cache_bytes=1 << 26, max_attention_bytes=1)  # a row per call
  a = big.generate(prompts, key=jax.random.key(0), max_new_tokens=5, temperature=0.0)
  b = small.generate(prompts, key=jax.random.key(0), max_new_tokens=5, temperature=0.0)
  for x, y in zip(a.tokens, b.tokens):
    np.testing.assert_array_equal(x, y)
  assert len(big.prefix_cache) == 1 + 5  # the shared prefix and one entry per row
  big.sync_weights(model)
  assert len(big.prefix_cache) == 0 and big.prefix_cache.bytes == 0


def test_store_lookup_is_exact_and_evicts_least_recently_used():
  cache = PrefixCache(max_bytes=3 * (2 * 10 * 4 * 4 + 10 * 4), max_len=64)  # three 10-id entries (kv + ids bytes)
  kv = lambda n, v: np.full((1, 2, 1, n, 4), v, np.float32)
  a, b = np.arange(10), np.arange(10) + 100
  cache.put(a, kv(10, 1.0))
  cache.put(b, kv(10, 2.0))
  assert cache.lookup(np.arange(10)) is None  # a prompt keeps one id to prefill
  hit = cache.lookup(np.arange(12))
  assert hit is not None and hit.kv[0, 0, 0, 0, 0] == 1.0
  assert cache.lookup(np.r_[np.arange(9), 99, 5]) is None  # differs at id 9
  cache.put(np.arange(5), kv(5, 3.0))
  assert cache.lookup(np.arange(7)).kv[0, 0, 0, 0, 0] == 3.0  # the only prefix of these 7 ids
  assert cache.lookup(np.arange(20)).kv[0, 0, 0, 0, 0] == 1.0  # the longest prefix wins
  cache.put(np.arange(10) + 200, kv(10, 4.0))  # over budget: b (least recently used) goes
  assert cache.evictions == 1 and cache.lookup(np.arange(100, 112)) is None
  assert cache.lookup(np.arange(12)) is not None
  with pytest.raises(ValueError, match="kv"):
    cache.put(np.arange(3), kv(4, 0.0))
  # the hashes are the polynomial the docstring states
  ids = np.array([3, 0, 7])
  h = prefix_hashes(ids, cache.powers)
  assert int(h[3]) == (4 + 1 * 1_000_003 + 8 * 1_000_003 ** 2) % 2 ** 64
