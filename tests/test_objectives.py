"""Tests for rti_jax.objectives: every function against an independent numpy (or torch)
re-derivation, the invariants the paper states, edge cases and bad input.

Numpy references are written as explicit loops over responses and tokens, straight from the
paper's equations, so they share no code or vectorisation tricks with the library.
"""

from __future__ import annotations

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rti_jax import objectives as O

jax.config.update("jax_enable_x64", False)
SETTINGS = settings(max_examples=12, deadline=None)

# ---------------------------------------------------------------------------------------
# independent numpy references (loops over the paper's sums)
# ---------------------------------------------------------------------------------------


def np_advantages(r: np.ndarray, g: int, std: str, eps: float = 1e-6) -> np.ndarray:
  out = np.zeros(len(r), np.float64)
  for s in range(0, len(r), g):
    grp = [float(x) for x in r[s:s + g]]
    mu = sum(grp) / g
    if max(grp) == min(grp):
      continue
    if std == "none":
      sigma, e = 1.0, 0.0
    else:
      div = g if std == "population" else g - 1
      sigma, e = math.sqrt(sum((x - mu) ** 2 for x in grp) / div), eps
    for j, x in enumerate(grp):
      out[s + j] = (x - mu) / (sigma + e)
  return out


def np_surrogate_token(lp: float, olp: float, a: float, cl: float, ch: float, dual=None) -> float:
  r = math.exp(max(-20.0, min(20.0, lp - olp)))
  obj = min(r * a, min(max(r, 1 - cl), 1 + ch) * a)
  loss = -obj
  if dual is not None and a < 0:
    loss = min(loss, -dual * a)
  return loss


def np_cal_weight(cal: float, roll: float, inter: float, eps: float) -> float:
  if inter == 0:
    return 1.0
  rho = math.exp(max(-20.0, min(20.0, cal - roll)))
  return min(max(rho, 1 - eps), 1 + eps)


def np_kl_token(lp: float, ref: float, kind: str) -> float:
  d = lp - ref
  if kind == "k1":
    return d
  if kind == "abs":
    return abs(d)
  if kind == "k2":
    return 0.5 * d * d
  x = max(-20.0, min(20.0, ref - lp))
  return max(-10.0, min(10.0, math.exp(x) - x - 1))


def np_aggregate(x: np.ndarray, m: np.ndarray, mode: str, norm=None) -> float:
  b, t = x.shape
  rows = []
  tokens, total = 0, 0.0
  for i in range(b):
    vals = [float(x[i, j]) for j in range(t) if m[i, j] != 0]
    tokens += len(vals)
    total += sum(vals)
    if vals:
      if mode == "seq-mean-token-mean":
        rows.append(sum(vals) / len(vals))
      elif mode == "seq-mean-token-sum":
        rows.append(sum(vals))
      elif mode == "dr-grpo":
        rows.append(sum(vals) / (t if norm is None else norm))
  if mode == "token-mean":
    return total / tokens if tokens else 0.0
  if mode == "seq-mean-token-sum-norm":  # verl: the batch's token sum over the constant alone
    return total / (t if norm is None else norm)
    return total / tokens if tokens else 0.0
  return sum(rows) / len(rows) if rows else 0.0


def np_rti_loss(lp, olp, adv, mask, cal=None, roll=None, inter=None, *, eps_cal=0.2, cl=0.2,
                ch=0.2, dual=None, ref=None, beta=0.0, kind="low_var_kl",
                agg="seq-mean-token-mean") -> float:
  """Eq. 7 (Eq. 2 when inter is None) + beta KL, straight from the sums."""
  b, t = lp.shape
  per = np.zeros((b, t))
  for i in range(b):
    for j in range(t):
      if mask[i, j] == 0:
        continue
      a = float(adv[i]) if adv.ndim == 1 else float(adv[i, j])
      w = 1.0 if inter is None else np_cal_weight(cal[i, j], roll[i, j], inter[i, j], eps_cal)
      per[i, j] = w * np_surrogate_token(lp[i, j], olp[i, j], a, cl, ch, dual)
      if beta:
        per[i, j] += beta * np_kl_token(lp[i, j], ref[i, j], kind)
  return np_aggregate(per, mask, agg)


def rand_inputs(seed: int, b: int = 6, t: int = 9, spread: float = 0.4):
  rng = np.random.default_rng(seed)
  old = (rng.normal(size=(b, t)) * 0.5 - 2.0).astype(np.float32)
  lp = (old + rng.normal(size=(b, t)) * spread).astype(np.float32)
  adv = rng.normal(size=b).astype(np.float32)
  mask = (rng.random((b, t)) < 0.7).astype(np.float32)
  mask[0] = 0  # a fully masked row
  return lp, old, adv, mask


# ---------------------------------------------------------------------------------------
# log-probs
# ---------------------------------------------------------------------------------------


def test_token_logprobs_matches_torch_log_softmax() -> None:
  rng = np.random.default_rng(0)
  logits = (rng.normal(size=(3, 5, 17)) * 4).astype(np.float32)
  logits[0, 0, 3] = 80.0  # large logit: naive softmax would overflow
  ids = rng.integers(0, 17, (3, 5))
  want = torch.log_softmax(torch.tensor(logits), -1).gather(-1, torch.tensor(ids)[..., None])[..., 0].numpy()
  got = O.token_logprobs(jnp.asarray(logits), jnp.asarray(ids, jnp.int32))
  chex.assert_shape(got, (3, 5))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
  # bf16 logits are upcast, not computed in bf16
  got16 = O.token_logprobs(jnp.asarray(logits, jnp.bfloat16), jnp.asarray(ids, jnp.int32))
  assert got16.dtype == jnp.float32


def test_next_token_logprobs_aligns_with_input_ids() -> None:
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(2, 6, 9)).astype(np.float32)
  ids = rng.integers(0, 9, (2, 6))
  got = np.asarray(O.next_token_logprobs(jnp.asarray(logits), jnp.asarray(ids, jnp.int32)))
  lsm = torch.log_softmax(torch.tensor(logits), -1).numpy()
  for b in range(2):
    assert got[b, 0] == 0.0
    for t in range(1, 6):
      np.testing.assert_allclose(got[b, t], lsm[b, t - 1, ids[b, t]], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------
# Eq. 1
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(st.lists(st.sampled_from([0.0, 1.0, 0.5, 0.25, 3.0]), min_size=8, max_size=8),
       st.sampled_from([2, 4, 8]), st.sampled_from(["population", "unbiased", "none"]))
def test_group_advantages_matches_numpy(rewards, g, std) -> None:
  r = np.asarray(rewards, np.float32)
  got = O.group_advantages(jnp.asarray(r), g, std=std)
  chex.assert_shape(got, (8,))
  np.testing.assert_allclose(np.asarray(got), np_advantages(r, g, std), rtol=1e-5, atol=1e-6)


def test_group_advantages_population_vs_unbiased_known_group() -> None:
  r = jnp.array([1.0, 0.0, 0.0, 0.0])
  pop = np.asarray(O.group_advantages(r, 4))
  unb = np.asarray(O.group_advantages(r, 4, std="unbiased"))
  # sigma_pop = sqrt(3/16), sigma_unb = sqrt(3/12): the ratio of the advantages is sqrt(4/3)
  np.testing.assert_allclose(pop[0] / unb[0], math.sqrt(4 / 3), rtol=1e-4)
  np.testing.assert_allclose(pop.sum(), 0.0, atol=1e-6)


def test_zero_variance_groups_give_exact_zero_and_no_nan() -> None:
  r = jnp.array([0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0], jnp.float32)
  for std in ("population", "unbiased", "none"):
    got = np.asarray(O.group_advantages(r, 3, std=std))
    assert np.all(got[:6] == 0.0), (std, got)
    assert np.isfinite(got).all()
    assert got[7] > 0 > got[6]
  got1 = np.asarray(O.group_advantages(r, 1))
  assert np.all(got1 == 0.0)


# ---------------------------------------------------------------------------------------
# Eq. 2: clipped surrogate
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(st.integers(0, 10_000), st.sampled_from([0.2, 0.1]), st.sampled_from([0.2, 0.28]),
       st.sampled_from([None, 3.0]), st.booleans())
def test_clipped_surrogate_matches_numpy(seed, cl, ch, dual, token_adv) -> None:
  lp, old, adv, _ = rand_inputs(seed, spread=0.6)
  if token_adv:
    adv = np.random.default_rng(seed + 1).normal(size=lp.shape).astype(np.float32)
  got = np.asarray(O.clipped_surrogate(lp, old, adv, clip_low=cl, clip_high=ch, dual_clip=dual))
  want = np.array([[np_surrogate_token(lp[i, j], old[i, j], adv[i] if adv.ndim == 1 else adv[i, j],
                                       cl, ch, dual) for j in range(lp.shape[1])]
                   for i in range(lp.shape[0])])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _torch_ppo_grad(d: float, a: float, cl: float, ch: float) -> float:
  """verl/TRL form in torch: max(-A r, -A clamp(r)) with r = exp(d); d(loss)/d(logp)."""
  lp = torch.tensor(d, dtype=torch.float32, requires_grad=True)
  r = torch.exp(lp)
  loss = torch.maximum(-a * r, -a * torch.clamp(r, 1 - cl, 1 + ch))
  loss.backward()
  return float(lp.grad)


def _jax_grad(d: float, a: float, cl: float, ch: float) -> float:
  f = lambda x: O.clipped_surrogate(x[None, None], jnp.zeros((1, 1)), jnp.array([a]),
                                    clip_low=cl, clip_high=ch)[0, 0]
  return float(jax.grad(f)(jnp.float32(d)))


@pytest.mark.parametrize("side", ["upper", "lower"])
def test_clip_behaviour_exactly_at_the_bounds(side: str) -> None:
  """On the bound: full (unclipped) gradient as in torch; just outside: zero gradient."""
  d = np.float32(0.15) if side == "upper" else np.float32(-0.15)
  r = np.exp(d, dtype=np.float32)
  bound = float(r) - 1.0 if side == "upper" else 1.0 - float(r)  # exact: 1 +- bound == r in f32
  a = 1.5 if side == "upper" else -1.5
  kw = dict(cl=0.2, ch=bound) if side == "upper" else dict(cl=bound, ch=0.2)
  at = _jax_grad(float(d), a, **kw)
  np.testing.assert_allclose(at, -a * float(r), rtol=1e-6)
  np.testing.assert_allclose(at, _torch_ppo_grad(float(d), a, **kw), rtol=1e-6)
  outside = d + np.float32(1e-5 if side == "upper" else -1e-5)
  assert _jax_grad(float(outside), a, **kw) == 0.0
  assert _torch_ppo_grad(float(outside), a, **kw) == 0.0
  inside = d - np.float32(1e-5 if side == "upper" else -1e-5)
  np.testing.assert_allclose(_jax_grad(float(inside), a, **kw), -a * float(np.exp(inside)), rtol=1e-6)
  # value at the bound: -A * (1 +- bound), continuous from both sides
  val = O.clipped_surrogate(jnp.array([[d]]), jnp.zeros((1, 1)), jnp.array([a]), clip_low=kw["cl"],
                            clip_high=kw["ch"])
  np.testing.assert_allclose(float(val[0, 0]), -a * float(r), rtol=1e-6)


def test_opposite_side_is_never_clipped() -> None:
  """A > 0 with a small ratio (and A < 0 with a large one) keeps the full gradient."""
  np.testing.assert_allclose(_jax_grad(-1.0, 1.0, 0.2, 0.2), -math.exp(-1.0), rtol=1e-6)
  np.testing.assert_allclose(_jax_grad(1.0, -1.0, 0.2, 0.2), math.exp(1.0), rtol=1e-6)


def test_dual_clip_caps_negative_advantage_loss() -> None:
  lp = jnp.array([[3.0, 0.5]])
  got = O.clipped_surrogate(lp, jnp.zeros((1, 2)), jnp.array([-2.0]), dual_clip=3.0)
  np.testing.assert_allclose(np.asarray(got), [[6.0, 2.0 * math.exp(0.5)]], rtol=1e-6)
  g = jax.grad(lambda x: O.clipped_surrogate(x, jnp.zeros((1, 2)), jnp.array([-2.0]), dual_clip=3.0).sum())(lp)
  np.testing.assert_allclose(np.asarray(g), [[0.0, 2.0 * math.exp(0.5)]], rtol=1e-6)


# ---------------------------------------------------------------------------------------
# Eq. 5-6: calibration weights
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(st.integers(0, 10_000), st.sampled_from([0.2, 0.05, 0.5]))
def test_calibration_weights_match_numpy(seed, eps) -> None:
  rng = np.random.default_rng(seed)
  cal = (rng.normal(size=(4, 7)) - 2).astype(np.float32)
  roll = (cal + rng.normal(size=(4, 7)) * 0.4).astype(np.float32)
  inter = (rng.random((4, 7)) < 0.5).astype(np.int32)
  got = np.asarray(O.calibration_weights(cal, roll, inter, eps_cal=eps))
  want = np.array([[np_cal_weight(cal[i, j], roll[i, j], inter[i, j], eps) for j in range(7)] for i in range(4)])
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert np.all(got[inter == 0] == 1.0)
  assert np.all((got >= 1 - eps - 1e-7) & (got <= 1 + eps + 1e-7))


def test_calibration_weights_are_exactly_one_off_the_intervened_tokens_even_for_garbage() -> None:
  cal = jnp.array([[jnp.nan, jnp.inf, -1e30, 0.0]])
  roll = jnp.array([[0.0, -jnp.inf, 1e30, -50.0]])
  w = np.asarray(O.calibration_weights(cal, roll, jnp.array([[0, 0, 0, 1]])))
  np.testing.assert_array_equal(w, np.array([[1.0, 1.0, 1.0, 1.2]], np.float32))


def test_calibration_weight_exactly_at_bounds() -> None:
  # rho == 1.25 exactly (log-ratio of powers of two) against eps 0.25: stays 1.25
  cal = jnp.log(jnp.array([[1.25, 0.75, 1.5, 0.5]], jnp.float32))
  w = np.asarray(O.calibration_weights(cal, jnp.zeros((1, 4)), jnp.ones((1, 4)), eps_cal=0.25))
  np.testing.assert_allclose(w, [[1.25, 0.75, 1.25, 0.75]], rtol=1e-6)


# ---------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(st.integers(0, 10_000), st.sampled_from(O.AGG_MODES), st.sampled_from([None, 4.0]))
def test_aggregate_matches_numpy(seed, mode, norm) -> None:
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(5, 8)).astype(np.float32)
  m = (rng.random((5, 8)) < 0.5).astype(np.float32)
  m[2] = 0
  got = float(O.aggregate(x, m, mode, norm=norm))
  np.testing.assert_allclose(got, np_aggregate(x, m, mode, norm), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", O.AGG_MODES)
def test_aggregate_parts_accumulate_exactly_over_micro_batches(mode) -> None:
  rng = np.random.default_rng(4)
  x = rng.normal(size=(8, 6)).astype(np.float32)
  m = (rng.random((8, 6)) < 0.6).astype(np.float32)
  m[5] = 0
  full = float(O.aggregate(x, m, mode))
  nums, dens = zip(*[O.aggregate_parts(x[s:s + 2], m[s:s + 2], mode, norm=6.0) for s in range(0, 8, 2)])
  np.testing.assert_allclose(float(sum(nums)) / max(float(sum(dens)), 1.0), full, rtol=1e-6)


def test_aggregation_names_mean_what_verl_and_trl_mean() -> None:
  """verl's ``loss_agg_mode`` and TRL's ``loss_type`` formulas, written out in torch."""
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(11)
  x = rng.normal(size=(6, 9)).astype(np.float32)
  m = (rng.random((6, 9)) < 0.7).astype(np.float32)
  m[:, 0] = 1.0  # every row counts at least one token (verl and TRL average over all rows)
  lt, mt = torch.tensor(x), torch.tensor(m)
  seq_sum = (lt * mt).sum(-1)
  reference = {
      "token-mean": (lt * mt).sum() / mt.sum(),                    # verl token-mean, TRL "dapo"/"bnpo"
      "seq-mean-token-mean": (seq_sum / mt.sum(-1)).mean(),        # verl, TRL "grpo"
      "seq-mean-token-sum": seq_sum.mean(),                        # verl
      "seq-mean-token-sum-norm": seq_sum.sum() / mt.shape[-1],     # verl: / response length only
      "dr-grpo": (lt * mt).sum() / (lt.shape[0] * mt.shape[-1]),   # TRL "dr_grpo": / (B * max length)
  }
  assert set(reference) == set(O.AGG_MODES)
  for mode, want in reference.items():
    np.testing.assert_allclose(float(O.aggregate(x, m, mode)), float(want), rtol=1e-6, err_msg=mode)
  # The two length-free modes differ by exactly the row count.
  np.testing.assert_allclose(float(O.aggregate(x, m, "seq-mean-token-sum-norm")),
                             6 * float(O.aggregate(x, m, "dr-grpo")), rtol=1e-6)


def test_fully_masked_rows_contribute_nothing_and_give_no_nan() -> None:
  lp, old, adv, mask = rand_inputs(3)
  lp_bad = lp.copy()
  lp_bad[0] = np.nan  # row 0 is fully masked: garbage there must not leak
  old_bad = old.copy()
  old_bad[0] = -np.inf
  for fn in (lambda a, b: O.grpo_loss(a, b, adv, mask),
             lambda a, b: O.rti_loss(a, b, adv, mask, a, b, mask)):
    val, grad = jax.value_and_grad(fn)(jnp.asarray(lp_bad), jnp.asarray(old_bad))
    np.testing.assert_allclose(float(val), float(fn(jnp.asarray(lp), jnp.asarray(old))), rtol=1e-6)
    assert np.isfinite(np.asarray(grad)).all()
    assert np.all(np.asarray(grad)[0] == 0.0)
  for mode in O.AGG_MODES:
    assert float(O.aggregate(jnp.ones((2, 3)), jnp.zeros((2, 3)), mode)) == 0.0


# ---------------------------------------------------------------------------------------
# KL and Eq. 3-4
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", O.KL_KINDS)
def test_kl_penalty_matches_numpy(kind) -> None:
  rng = np.random.default_rng(5)
  lp = (rng.normal(size=(3, 6)) * 3 - 2).astype(np.float32)
  ref = (rng.normal(size=(3, 6)) * 3 - 2).astype(np.float32)
  ref[0, 0] = lp[0, 0] + 30.0  # exercises the k3 clamps
  got = np.asarray(O.kl_penalty(lp, ref, kind))
  want = np.array([[np_kl_token(lp[i, j], ref[i, j], kind) for j in range(6)] for i in range(3)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_k3_and_low_var_kl_are_the_same_estimator() -> None:
  lp, old, _, _ = rand_inputs(6)
  chex.assert_trees_all_equal(O.kl_penalty(lp, old, "k3"), O.kl_penalty(lp, old, "low_var_kl"))


def test_sequence_perplexity_matches_numpy_and_empty_rows_are_inf() -> None:
  rng = np.random.default_rng(7)
  lp = (rng.normal(size=(4, 5)) - 1.5).astype(np.float32)
  m = (rng.random((4, 5)) < 0.6).astype(np.float32)
  m[1] = 0
  m[2, 0] = 1
  got = np.asarray(O.sequence_perplexity(lp, m))
  for i in range(4):
    vals = [lp[i, j] for j in range(5) if m[i, j]]
    want = math.exp(-sum(vals) / len(vals)) if vals else math.inf
    np.testing.assert_allclose(got[i], want, rtol=1e-5)
  assert got[1] == np.inf


def test_ppl_gate_thresholds() -> None:
  ppl = jnp.array([1.0, 4.99, 5.0, 5.01, 1e6, jnp.inf])
  np.testing.assert_array_equal(np.asarray(O.ppl_gate(ppl, 5.0)), [1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(np.asarray(O.ppl_gate(ppl, 0.0)), [0] * 6)
  np.testing.assert_array_equal(np.asarray(O.ppl_gate(ppl, math.inf)), [1] * 6)
  np.testing.assert_array_equal(np.asarray(O.ppl_gate(jnp.array([0.0]), 0.0)), [0])
  # end to end with Eq. 3: mean NLL log(5) is exactly at the paper's delta = 5
  lp = jnp.full((1, 4), -math.log(5.0), jnp.float32)
  ppl5 = O.sequence_perplexity(lp, jnp.ones((1, 4)))
  np.testing.assert_allclose(float(ppl5[0]), 5.0, rtol=1e-6)


# ---------------------------------------------------------------------------------------
# Eq. 2 and Eq. 7
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(st.integers(0, 10_000), st.sampled_from(O.AGG_MODES), st.sampled_from([0.0, 0.05]),
       st.sampled_from(["k1", "k3"]))
def test_grpo_loss_matches_numpy(seed, agg, beta, kind) -> None:
  lp, old, adv, mask = rand_inputs(seed)
  ref = (old - 0.1).astype(np.float32)
  got = float(O.grpo_loss(lp, old, adv, mask, ref_logp=ref, beta=beta, kl_kind=kind, agg=agg))
  want = np_rti_loss(lp, old, adv, mask, ref=ref, beta=beta, kind=kind, agg=agg)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(st.integers(0, 10_000), st.sampled_from([0.2, 0.1]))
def test_rti_loss_matches_numpy(seed, eps_cal) -> None:
  lp, old, adv, mask = rand_inputs(seed)
  rng = np.random.default_rng(seed + 7)
  roll = (old + rng.normal(size=old.shape) * 0.1).astype(np.float32)
  cal = (roll + rng.normal(size=old.shape) * 0.5).astype(np.float32)
  inter = np.zeros_like(mask)
  inter[2, 2:7] = 1
  inter[4] = 1
  got = float(O.rti_loss(lp, old, adv, mask, cal, roll, inter, eps_cal=eps_cal, beta=0.02, ref_logp=old))
  want = np_rti_loss(lp, old, adv, mask, cal, roll, inter, eps_cal=eps_cal, ref=old, beta=0.02)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(st.integers(0, 10_000), st.sampled_from(O.AGG_MODES), st.sampled_from([None, 3.0]))
def test_rti_equals_grpo_when_nothing_is_intervened(seed, agg, dual) -> None:
  lp, old, adv, mask = rand_inputs(seed)
  rng = np.random.default_rng(seed)
  cal = rng.normal(size=lp.shape).astype(np.float32) * 5  # arbitrary: must not matter
  f_rti = lambda x: O.rti_loss(x, old, adv, mask, cal, old, np.zeros_like(mask), agg=agg, dual_clip=dual)
  f_grpo = lambda x: O.grpo_loss(x, old, adv, mask, agg=agg, dual_clip=dual)
  (v1, g1), (v2, g2) = jax.value_and_grad(f_rti)(lp), jax.value_and_grad(f_grpo)(lp)
  chex.assert_trees_all_equal((v1, g1), (v2, g2))


def test_gradient_wrt_cal_and_roll_logp_is_exactly_zero() -> None:
  lp, old, adv, mask = rand_inputs(11)
  cal = old + 0.05
  inter = np.ones_like(mask)
  g_cal, g_roll = jax.grad(lambda c, r: O.rti_loss(lp, old, adv, mask, c, r, inter), argnums=(0, 1))(
      jnp.asarray(cal), jnp.asarray(old))
  assert np.all(np.asarray(g_cal) == 0.0) and np.all(np.asarray(g_roll) == 0.0)
  # whereas the policy gradient is not zero, and is the weighted GRPO gradient
  w = np.asarray(O.calibration_weights(cal, old, inter))
  assert np.any(w != 1.0)
  g = jax.grad(lambda x: O.rti_loss(x, old, adv, mask, cal, old, inter))(jnp.asarray(lp))
  assert np.abs(np.asarray(g)).max() > 0


def test_rti_weights_scale_the_per_token_gradient() -> None:
  """Eq. 7 gradient = rho_cal^t x (GRPO per-token gradient): check token by token."""
  lp, old, adv, mask = rand_inputs(12, spread=0.05)  # ratios inside the clip range
  rng = np.random.default_rng(12)
  cal = (old + rng.normal(size=old.shape) * 0.3).astype(np.float32)
  inter = (rng.random(old.shape) < 0.5).astype(np.float32)
  g_rti = np.asarray(jax.grad(lambda x: O.rti_loss(x, old, adv, mask, cal, old, inter))(jnp.asarray(lp)))
  g_grpo = np.asarray(jax.grad(lambda x: O.grpo_loss(x, old, adv, mask))(jnp.asarray(lp)))
  w = np.array([[np_cal_weight(cal[i, j], old[i, j], inter[i, j], 0.2) for j in range(lp.shape[1])]
                for i in range(lp.shape[0])])
  np.testing.assert_allclose(g_rti, w * g_grpo, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", [n if n in ("grpo", "rti") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(O.LOSSES)])
@pytest.mark.parametrize("extreme", [-1e4, pytest.param(0.0, marks=pytest.mark.slow)])
def test_every_loss_is_finite_for_extreme_logprobs(name, extreme) -> None:
  b, t = 4, 5
  lp = jnp.full((b, t), extreme, jnp.float32).at[1].set(-1e4 if extreme == 0.0 else 0.0)
  old = jnp.full((b, t), 0.0 if extreme == -1e4 else -1e4, jnp.float32)
  batch = O.RTIBatch(input_ids=jnp.zeros((b, t), jnp.int32), attention_mask=jnp.ones((b, t)),
                     loss_mask=jnp.ones((b, t)), old_logp=old,
                     advantages=jnp.array([1.0, -1.0, 2.0, -0.5]), roll_logp=old, cal_logp=lp,
                     intervened_mask=jnp.ones((b, t)), ref_logp=old, teacher_logp=lp,
                     entropy=jnp.linspace(0.0, 3.0, b * t).reshape(b, t))
  cfg = O.LossConfig(name=name, beta=0.1, dual_clip=3.0)
  (val, metrics), grad = jax.value_and_grad(lambda x: O.loss_from_batch(x, batch, cfg), has_aux=True)(lp)
  assert np.isfinite(float(val)), (name, float(val))
  assert np.isfinite(np.asarray(grad)).all()
  assert all(np.isfinite(float(v)) for v in metrics.values())


# ---------------------------------------------------------------------------------------
# baselines
# ---------------------------------------------------------------------------------------


def test_gspo_matches_sequence_level_numpy_value_and_gradient() -> None:
  lp, old, adv, mask = rand_inputs(21, spread=0.3)
  cl, ch = 0.05, 0.08
  got, grad = jax.value_and_grad(lambda x: O.gspo_loss(x, old, adv, mask, clip_low=cl, clip_high=ch))(jnp.asarray(lp))
  rows, want_grad = [], np.zeros_like(lp, dtype=np.float64)
  nonempty = [i for i in range(lp.shape[0]) if mask[i].sum() > 0]
  for i in nonempty:
    idx = [j for j in range(lp.shape[1]) if mask[i, j]]
    s = math.exp(sum(lp[i, j] - old[i, j] for j in idx) / len(idx))
    a = float(adv[i])
    rows.append(-min(s * a, min(max(s, 1 - cl), 1 + ch) * a))
    clipped = (a > 0 and s > 1 + ch) or (a < 0 and s < 1 - cl)
    for j in idx:  # d/dlogp_j of -s a = -a s / |y_i|, averaged over the G rows
      want_grad[i, j] = 0.0 if clipped else -a * s / len(idx) / len(nonempty)
  np.testing.assert_allclose(float(got), sum(rows) / len(rows), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-7)
  assert 0 < sum(w != 0 for w in want_grad.sum(1)) < len(nonempty)  # some rows clipped, some not


def test_luffy_matches_numpy_value_and_gradient() -> None:
  lp, old, adv, mask = rand_inputs(22)
  off = np.zeros_like(mask)
  off[3:] = 1  # rows 3.. are teacher trajectories
  gamma = 0.1
  got, grad = jax.value_and_grad(lambda x: O.luffy_loss(x, old, adv, mask, off, gamma=gamma))(jnp.asarray(lp))
  per = np.zeros(lp.shape)
  want_grad = np.zeros(lp.shape)
  n = mask.sum()
  for i in range(lp.shape[0]):
    for j in range(lp.shape[1]):
      if not mask[i, j]:
        continue
      a = float(adv[i])
      if off[i, j]:
        p = math.exp(lp[i, j])
        per[i, j] = -a * p / (p + gamma)
        want_grad[i, j] = -a * gamma * p / (p + gamma) ** 2 / n
      else:
        per[i, j] = np_surrogate_token(lp[i, j], old[i, j], a, 0.2, 0.2)
        r = math.exp(lp[i, j] - old[i, j])
        clipped = (a > 0 and r > 1.2) or (a < 0 and r < 0.8)
        want_grad[i, j] = 0.0 if clipped else -a * r / n
  np.testing.assert_allclose(float(got), per.sum() / n, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-8)


def test_luffy_without_on_policy_clip_is_plain_ratio_times_advantage() -> None:
  lp, old, adv, mask = rand_inputs(24, spread=0.8)
  off = np.zeros_like(mask)
  got = np.asarray(O.luffy_token_loss(lp, old, adv, mask, off, on_policy_clip=False))
  want = np.where(mask > 0, -adv[:, None] * np.exp(lp.astype(np.float64) - old), 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  clipped = np.asarray(O.luffy_token_loss(lp, old, adv, mask, off))
  assert np.any(np.abs(clipped - got) > 1e-3)  # the spread makes some tokens clip


def test_opd_advantages_match_numpy() -> None:
  rng = np.random.default_rng(23)
  stu = (rng.normal(size=(3, 4)) - 2).astype(np.float32)
  tea = (rng.normal(size=(3, 4)) - 2).astype(np.float32)
  adv = np.array([0.5, -1.0, 0.0], np.float32)
  m = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]], np.float32)
  got = np.asarray(O.opd_advantages(adv, stu, tea, m, coef=0.7))
  want = np.array([[(adv[i] - 0.7 * (stu[i, j] - tea[i, j])) if m[i, j] else 0.0 for j in range(4)]
                   for i in range(3)])
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_aepo_value_equals_grpo_and_gradient_is_preserved_on_high_clipped_tokens() -> None:
  lp = jnp.log(jnp.array([[1.5, 1.1, 0.5], [1.5, 0.9, 0.5]], jnp.float32))
  old = jnp.zeros((2, 3))
  adv = jnp.array([2.0, -1.0])
  mask = jnp.ones((2, 3))
  v_aepo, g_aepo = jax.value_and_grad(lambda x: O.aepo_loss(x, old, adv, mask))(lp)
  v_grpo = O.grpo_loss(lp, old, adv, mask, agg="token-mean")
  np.testing.assert_allclose(float(v_aepo), float(v_grpo), rtol=1e-6)
  # token-mean over 6 tokens; ratios [1.5, 1.1, .5 | 1.5, .9, .5]
  want = np.array([[-2.0 * 1.2, -2.0 * 1.1, -2.0 * 0.5],  # A>0: upper-clipped keeps (1+eps) A
                   [1.0 * 1.5, 1.0 * 0.9, 0.0]]) / 6  # A<0: lower-clipped token has no gradient
  np.testing.assert_allclose(np.asarray(g_aepo), want, rtol=1e-5)


def test_aepo_advantages_match_numpy() -> None:
  ent = np.array([[0.5, 1.5, 9.0], [2.5, 0.0, 9.0]], np.float32)
  m = np.array([[1, 1, 0], [1, 1, 0]], np.float32)
  adv = np.array([1.0, -2.0], np.float32)
  vals = [0.5, 1.5, 2.5, 0.0]
  mu = sum(vals) / 4
  sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / 3)  # Bessel, as torch .std() in AEPO's code
  got = np.asarray(O.aepo_advantages(adv, ent, m, alpha=0.5))
  want = np.array([[adv[i] * (1 + 0.5 * (ent[i, j] - mu) / sd) if m[i, j] else 0.0 for j in range(3)]
                   for i in range(2)])
  np.testing.assert_allclose(got, want, rtol=1e-5)
  flat = np.asarray(O.aepo_advantages(adv, np.ones_like(ent), m))
  np.testing.assert_allclose(flat, np.where(m > 0, adv[:, None], 0.0))
  one = np.asarray(O.aepo_advantages(adv, ent, np.array([[0, 1, 0], [0, 0, 0]], np.float32)))
  np.testing.assert_array_equal(one, [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # single token: z = 0, no NaN
  # standardized=True takes the entropy as the z-score itself (taken over a larger batch)
  z = (np.where(m > 0, ent, 0.0) - mu) / sd * m
  np.testing.assert_allclose(np.asarray(O.entropy_zscore(ent, m)), z, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(O.aepo_advantages(adv, z.astype(np.float32), m, alpha=0.5, standardized=True)),
                             want, rtol=1e-5)


def test_minibatch_zscore_over_chunks_of_different_widths_is_the_whole_batch_zscore() -> None:
  from rti_jax.baselines import minibatch_zscore

  rng = np.random.default_rng(4)
  ent = rng.gamma(2.0, 1.0, (6, 9)).astype(np.float32)
  mask = (rng.random((6, 9)) < 0.7).astype(np.float32)
  parts = minibatch_zscore([ent[:2, :4], ent[2:, :]], [mask[:2, :4] > 0, mask[2:] > 0])
  mask[:2, 4:] = 0  # the first chunk is cut to width 4: its tokens beyond are not in the minibatch
  whole = np.asarray(O.entropy_zscore(ent, mask))
  np.testing.assert_allclose(parts[0], whole[:2, :4], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(parts[1], whole[2:], rtol=1e-5, atol=1e-6)
  flat = minibatch_zscore([np.ones((2, 3))], [np.ones((2, 3), bool)])
  np.testing.assert_array_equal(flat[0], np.zeros((2, 3)))  # constant entropies: z = 0, no NaN


# ---------------------------------------------------------------------------------------
# registry, batch, jit
# ---------------------------------------------------------------------------------------


def _full_batch(seed: int = 30) -> tuple[jax.Array, O.RTIBatch]:
  lp, old, adv, mask = rand_inputs(seed)
  rng = np.random.default_rng(seed)
  inter = np.zeros_like(mask)
  inter[3, 1:6] = 1
  b = O.RTIBatch(input_ids=np.zeros(lp.shape, np.int32), attention_mask=np.ones(lp.shape, np.int32),
                 loss_mask=mask, old_logp=old, advantages=adv, roll_logp=old + 0.05,
                 cal_logp=(old + rng.normal(size=old.shape) * 0.3).astype(np.float32),
                 intervened_mask=inter, ref_logp=old - 0.1, teacher_logp=old - 0.2,
                 entropy=rng.random(old.shape).astype(np.float32))
  return jnp.asarray(lp), b


def test_a_batch_without_intervened_tokens_is_updated_by_grpos_own_program() -> None:
  """Without an intervened loss token the batch drops its intervention fields, and then the RTI
  loss is the GRPO loss by construction (the same jaxpr, so the same numbers on any backend), with
  the same metric keys as a batch that has them; a batch with one intervened token is kept."""
  lp, b = _full_batch(32)
  assert O.without_empty_intervention(b) is b
  # An intervened token outside the loss mask does not count.
  off_loss = np.where(np.asarray(b.loss_mask) == 0, 1, 0).astype(np.int32)
  empty = O.without_empty_intervention(dataclasses.replace(b, intervened_mask=off_loss))
  assert (empty.roll_logp, empty.cal_logp, empty.intervened_mask) == (None, None, None)
  np.testing.assert_array_equal(empty.old_logp, b.old_logp)
  cfg = {n: O.LossConfig(name=n, beta=0.1) for n in ("grpo", "rti")}
  jaxprs = {n: str(jax.make_jaxpr(lambda x, n=n: O.LOSSES[n](x, empty, cfg[n]))(lp)) for n in cfg}
  assert jaxprs["rti"] == jaxprs["grpo"]
  with_fields = dataclasses.replace(b, intervened_mask=np.zeros_like(off_loss))
  kept = O.loss_from_batch(lp, with_fields, cfg["rti"])
  dropped = O.loss_from_batch(lp, empty, cfg["rti"])
  np.testing.assert_allclose(float(dropped[0]), float(kept[0]), rtol=1e-6)
  for key in ("clip_frac", "clip_frac_on_policy", "clip_frac_intervened", "intervened_tokens", "on_policy_tokens",
              "num_tokens"):
    np.testing.assert_allclose(float(dropped[1][key]), float(kept[1][key]), rtol=1e-6, err_msg=key)
  assert float(dropped[1]["intervened_tokens"]) == 0 and float(dropped[1]["on_policy_tokens"]) == np.sum(b.loss_mask)


def test_registry_entries_match_the_array_functions() -> None:
  lp, b = _full_batch()
  a = dict(logp=lp, old_logp=b.old_logp, advantages=b.advantages, loss_mask=b.loss_mask)
  cfg = lambda name, **k: O.LossConfig(name=name, **k)
  want = {
      "grpo": O.grpo_loss(**a, ref_logp=b.ref_logp, beta=0.1),
      "rti": O.rti_loss(**a, cal_logp=b.cal_logp, roll_logp=b.roll_logp,
                        intervened_mask=b.intervened_mask, ref_logp=b.ref_logp, beta=0.1),
      "gspo": O.gspo_loss(**a),
      "luffy": O.luffy_loss(**a, off_policy_mask=b.intervened_mask),
      "opd": O.grpo_loss(lp, b.old_logp, O.opd_advantages(b.advantages, b.old_logp, b.teacher_logp,
                                                           b.loss_mask), b.loss_mask,
                         ref_logp=b.ref_logp, beta=0.1),
      "aepo": O.aepo_loss(**a, entropy=b.entropy),
  }
  for name in O.LOSSES:
    # the batch carries AEPO's entropy already standardised (over the minibatch, by the trainer)
    bn = dataclasses.replace(b, entropy=O.entropy_zscore(b.entropy, b.loss_mask)) if name == "aepo" else b
    got, metrics = O.loss_from_batch(lp, bn, cfg(name, beta=0.1 if name in ("grpo", "rti", "opd") else 0.0))
    np.testing.assert_allclose(float(got), float(want[name]), rtol=1e-6, err_msg=name)
    assert 0.0 <= float(metrics["clip_frac"]) <= 1.0
  assert set(O.LOSSES) == {"grpo", "rti", "gspo", "luffy", "opd", "aepo"}


def test_rti_registry_loss_parts_accumulate_over_micro_batches() -> None:
  lp, b = _full_batch(31)
  cfg = O.LossConfig(name="rti")
  full, _ = O.loss_from_batch(lp, b, cfg)
  parts = [O.LOSSES["rti"](lp[s:s + 2], jax.tree.map(lambda x: x[s:s + 2], b), cfg) for s in (0, 2, 4)]
  np.testing.assert_allclose(float(sum(p.numerator for p in parts) / sum(p.denominator for p in parts)),
                             float(full), rtol=1e-6)


def test_jit_and_eager_agree() -> None:
  lp, b = _full_batch(32)
  args = (lp, b.old_logp, b.advantages, b.loss_mask)
  fns = {
      "rti": lambda *x: O.rti_loss(*x, b.cal_logp, b.roll_logp, b.intervened_mask),
      "grpo": lambda *x: O.grpo_loss(*x, ref_logp=b.ref_logp, beta=0.1),
      "gspo": O.gspo_loss,
      "luffy": lambda *x: O.luffy_loss(*x, b.intervened_mask),
      "aepo": lambda *x: O.aepo_loss(*x, entropy=b.entropy),
      "surrogate": lambda l, o, a, m: O.clipped_surrogate(l, o, a, dual_clip=3.0),
      "agg": lambda l, o, a, m: O.aggregate_parts(l, m, "dr-grpo"),
      "kl": lambda l, o, a, m: O.kl_penalty(l, o, "k3"),
      "ppl": lambda l, o, a, m: O.ppl_gate(O.sequence_perplexity(l, m), 20.0),
      "adv": lambda l, o, a, m: O.group_advantages(a, 3),
      "opd": lambda l, o, a, m: O.opd_advantages(a, o, l, m),
  }
  for name, fn in fns.items():
    chex.assert_trees_all_close(jax.jit(fn)(*args), fn(*args), rtol=1e-6, atol=1e-7, custom_message=name)
  cfg = O.LossConfig(name="rti")
  chex.assert_trees_all_close(jax.jit(O.loss_from_batch, static_argnums=2)(lp, b, cfg),
                              O.loss_from_batch(lp, b, cfg), rtol=1e-6)


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------

_L = np.zeros((4, 5), np.float32)
_M = np.ones((4, 5), np.float32)
_A = np.zeros(4, np.float32)

BAD_CALLS = [
    ("rewards", lambda: O.group_advantages(np.zeros((2, 3), np.float32), 3)),
    ("group_size", lambda: O.group_advantages(np.zeros(6, np.float32), 4)),
    ("group_size", lambda: O.group_advantages(np.zeros(6, np.float32), 0)),
    ("group_size", lambda: O.group_advantages(np.zeros(6, np.float32), 1, std="unbiased")),
    ("std", lambda: O.group_advantages(np.zeros(6, np.float32), 3, std="sample")),
    ("logp", lambda: O.clipped_surrogate(np.zeros(5, np.float32), np.zeros(5, np.float32), _A)),
    ("logp", lambda: O.clipped_surrogate(np.zeros((4, 5), np.int32), _L, _A)),
    ("old_logp", lambda: O.clipped_surrogate(_L, np.zeros((4, 6), np.float32), _A)),
    ("advantages", lambda: O.clipped_surrogate(_L, _L, np.zeros(3, np.float32))),
    ("advantages", lambda: O.clipped_surrogate(_L, _L, np.zeros((4, 4), np.float32))),
    ("clip_low", lambda: O.clipped_surrogate(_L, _L, _A, clip_low=1.5)),
    ("dual_clip", lambda: O.clipped_surrogate(_L, _L, _A, dual_clip=0.5)),
    ("intervened_mask", lambda: O.calibration_weights(_L, _L, np.ones((4, 4)))),
    ("eps_cal", lambda: O.calibration_weights(_L, _L, _M, eps_cal=1.0)),
    ("mode", lambda: O.aggregate(_L, _M, "seq-mean")),
    ("mask", lambda: O.aggregate(_L, np.ones((5, 4)), "token-mean")),
    ("mask", lambda: O.aggregate(_L, np.array([["a"] * 5] * 4), "token-mean")),
    ("kind", lambda: O.kl_penalty(_L, _L, "k4")),
    ("delta", lambda: O.ppl_gate(np.ones(3, np.float32), -1.0)),
    ("ref_logp", lambda: O.grpo_loss(_L, _L, _A, _M, beta=0.1)),
    ("loss_mask", lambda: O.rti_loss(_L, _L, _A, np.ones((4, 6)), _L, _L, _M)),
    ("targets", lambda: O.token_logprobs(np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.float32))),
    ("targets", lambda: O.token_logprobs(np.zeros((2, 3, 4), np.float32), np.zeros((2, 4), np.int32))),
    ("off_policy_mask", lambda: O.luffy_loss(_L, _L, _A, _M, np.ones((4,)))),
    ("LossConfig.name", lambda: O.LossConfig(name="ppo")),
    ("LossConfig.agg", lambda: O.LossConfig(agg="sum")),
    ("name", lambda: O.get_loss("dpo")),
    ("LossConfig.luffy_gamma", lambda: O.LossConfig(name="luffy", luffy_gamma=0.0)),
    ("LossConfig.eps_cal", lambda: O.LossConfig(eps_cal=-0.1)),
    ("batch", lambda: O.loss_from_batch(_L, {"old_logp": _L}, O.LossConfig())),
    ("batch.old_logp", lambda: O.loss_from_batch(_L, O.RTIBatch(np.zeros((4, 5), np.int32), _M, _M,
                                                                  np.zeros((4, 6), np.float32), _A),
                                                 O.LossConfig())),
    ("batch.roll_logp", lambda: O.loss_from_batch(_L, O.RTIBatch(np.zeros((4, 5), np.int32), _M, _M, _L,
                                                                   _A, cal_logp=_L), O.LossConfig())),
    ("teacher_logp", lambda: O.loss_from_batch(_L, O.RTIBatch(np.zeros((4, 5), np.int32), _M, _M, _L, _A),
                                               O.LossConfig(name="opd"))),
]


@pytest.mark.parametrize("arg,call", BAD_CALLS, ids=[f"{a}-{i}" for i, (a, _) in enumerate(BAD_CALLS)])
def test_bad_input_raises_value_error_naming_the_argument(arg, call) -> None:
  with pytest.raises(ValueError, match=arg.replace(".", "\\.")):
    call()


def test_bad_input_is_caught_at_trace_time_under_jit() -> None:
  f = jax.jit(lambda l, o, a, m: O.rti_loss(l, o, a, m, l, o, m))
  with pytest.raises(ValueError, match="advantages: expected shape \\(4,\\) or \\(4, 5\\), got \\(5,\\)"):
    f(_L, _L, np.zeros(5, np.float32), _M)
  with pytest.raises(ValueError, match="rewards: expected a real"):
    jax.jit(lambda r: O.group_advantages(r, 2))(jnp.zeros(4, jnp.complex64))


def test_clip_fraction_is_reported_over_intervened_and_on_policy_tokens_apart() -> None:
  lp, b = _full_batch(31)
  lp = lp.at[3, 1:6].add(0.5)  # the intervened tokens move far from old_logp: most are clipped
  inter = np.asarray(b.intervened_mask) != 0
  mask = np.asarray(b.loss_mask) != 0
  ratio = np.exp(np.asarray(lp, np.float64) - np.asarray(b.old_logp, np.float64))
  clipped = (ratio < 0.8) | (ratio > 1.2)

  def frac(sel):
    return clipped[sel].mean() if sel.any() else 0.0

  _, metrics = O.loss_from_batch(lp, b, O.LossConfig(name="rti", beta=0.1))
  iv, on = mask & inter, mask & ~inter
  assert iv.sum() > 0 and on.sum() > 0 and frac(iv) > frac(on)
  np.testing.assert_allclose(float(metrics["clip_frac_intervened"]), frac(iv), rtol=1e-6)
  np.testing.assert_allclose(float(metrics["clip_frac_on_policy"]), frac(on), rtol=1e-6)
  np.testing.assert_allclose(float(metrics["clip_frac"]), frac(mask), rtol=1e-6)
  assert float(metrics["intervened_tokens"]) == iv.sum() and float(metrics["on_policy_tokens"]) == on.sum()
  # Chunks of rows combine to the whole batch's fractions.
  parts = []
  for rows in (slice(0, 3), slice(3, None)):
    sub = O.RTIBatch(**{f: (v[rows] if hasattr(v, "ndim") and v.ndim >= 1 else v)
                        for f, v in vars(b).items()})
    parts.append(O.loss_from_batch(lp[rows], sub, O.LossConfig(name="rti", beta=0.1))[1])
  combined = O.combine_chunk_metrics(parts)
  for key in ("clip_frac_intervened", "clip_frac_on_policy", "clip_frac", "cal_weight_mean"):
    np.testing.assert_allclose(combined[key], float(metrics[key]), rtol=1e-5, err_msg=key)
