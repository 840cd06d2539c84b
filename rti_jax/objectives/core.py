"""GRPO and RTI loss math (paper Eq. 1-7), as pure, jit-able ``jax.numpy`` functions.

Conventions used throughout:

* ``[B, T]``: B responses x T token positions. Groups of ``group_size`` consecutive rows
  share one prompt (rows ``g*G .. g*G+G-1`` form group ``g``).
* ``logp``, ``old_logp``, ... hold the log-probability of the token *at* each position
  (see ``next_token_logprobs``); ``loss_mask`` marks the positions that are trained
  (policy-generated response tokens; environment feedback is masked out, as in the paper).
* Every function returns the quantity to *minimise*: the negative of the paper's objective.
* Arguments are checked at trace time (shape, rank, dtype); bad input raises ``ValueError``
  naming the argument. Nothing branches on traced values.
* Computation is in float32 (inputs of lower precision are upcast).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from models import vocab_logprobs
from rti_jax.objectives import _checks as C

LOG_RATIO_CLAMP = 20.0
"""Log importance ratios are clamped to +-20 before ``exp`` (verl / slime convention)."""

ADVANTAGE_STDS = ("population", "unbiased", "none")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
             "dr-grpo")
KL_KINDS = ("k1", "abs", "k2", "k3", "low_var_kl")


# ---------------------------------------------------------------------------------------
# Log-probabilities
# ---------------------------------------------------------------------------------------


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Log-probability of ``targets`` under ``softmax(logits)`` at the same position.

  logits: [B, T, V] (any float dtype; computed in float32); targets: [B, T] integer ids.
  Returns [B, T] float32, ``log_softmax(logits)[b, t, targets[b, t]]``, computed stably as
  ``logits[target] - logsumexp(logits)`` (the same value, without materialising the
  [B, T, V] log_softmax). Ids outside ``[0, V)`` cannot be detected under jit; jax clamps them.
  """
  logits = C.check_float("logits", logits, (3,))
  targets = C.as_array("targets", targets)
  if not jnp.issubdtype(targets.dtype, jnp.integer):
    raise ValueError(f"targets: expected an integer dtype, got {targets.dtype}")
  if tuple(targets.shape) != tuple(logits.shape[:2]):
    raise ValueError(f"targets: expected shape {tuple(logits.shape[:2])} (logits' [B, T]), got {tuple(targets.shape)}")
  return vocab_logprobs.token_logprobs(logits, targets)


def next_token_logprobs(logits: jax.Array, input_ids: jax.Array) -> jax.Array:
  """Causal-LM log-probs aligned with ``input_ids``.

  logits: [B, T, V] where ``logits[:, t]`` predicts ``input_ids[:, t + 1]``; input_ids: [B, T].
  Returns [B, T] float32 with ``out[:, t] = log p(input_ids[:, t] | input_ids[:, :t])`` for
  ``t >= 1`` and ``out[:, 0] = 0`` (the first token is never a response token). This is the
  alignment every ``[B, T]`` field of ``RTIBatch`` uses.
  """
  logits = C.check_float("logits", logits, (3,))
  input_ids = C.as_array("input_ids", input_ids)
  if tuple(input_ids.shape) != tuple(logits.shape[:2]):
    raise ValueError(f"input_ids: expected shape {tuple(logits.shape[:2])} (logits' [B, T]), got {tuple(input_ids.shape)}")
  lp = token_logprobs(logits[:, :-1], input_ids[:, 1:])
  return jnp.pad(lp, ((0, 0), (1, 0)))


# ---------------------------------------------------------------------------------------
# Eq. 1: group-relative advantages
# ---------------------------------------------------------------------------------------


def group_advantages(rewards: jax.Array, group_size: int, *, std: str = "population",
                     eps: float = 1e-6) -> jax.Array:
  """Group-normalised advantages, Eq. 1: ``A_i = (r_i - mu_r) / (sigma_r + eps)``.

  rewards: [B] (float, int or bool), groups are consecutive rows of ``group_size``.
  std: ``"population"`` is the paper's ``sigma_r = sqrt(1/G sum (r - mu)^2)``;
    ``"unbiased"`` divides by ``G - 1`` (Bessel; the torch ``.std()`` used by verl/TRL/slime,
    needs ``group_size >= 2``); ``"none"`` returns ``r - mu`` (Dr. GRPO).
  Groups whose rewards are all equal get exactly 0 (not ``0 / eps`` rounding noise).
  Returns [B] float32.
  """
  rewards = C.check_real("rewards", rewards, (1,))
  g = C.check_positive_int("group_size", group_size)
  C.check_choice("std", std, ADVANTAGE_STDS)
  C.check_scalar("eps", eps, low=0.0)
  b = rewards.shape[0]
  if b % g != 0:
    raise ValueError(f"group_size: expected a divisor of the batch size B={b}, got {g}")
  if std == "unbiased" and g < 2:
    raise ValueError(f"group_size: std='unbiased' needs group_size >= 2, got {g}")
  r = rewards.reshape(b // g, g)
  centered = r - r.mean(axis=-1, keepdims=True)
  if std == "none":
    adv = centered
  else:
    ddof = 1 if std == "unbiased" else 0
    sigma = jnp.sqrt(jnp.sum(centered**2, axis=-1, keepdims=True) / (g - ddof))
    adv = centered / (sigma + eps)
  flat = jnp.max(r, axis=-1, keepdims=True) == jnp.min(r, axis=-1, keepdims=True)
  return jnp.where(flat, 0.0, adv).reshape(b)


# ---------------------------------------------------------------------------------------
# Eq. 2: clipped surrogate
# ---------------------------------------------------------------------------------------


def _check_clip(clip_low: Any, clip_high: Any, dual_clip: Any) -> None:
  C.check_scalar("clip_low", clip_low, low=0.0, high=1.0, high_open=True)
  C.check_scalar("clip_high", clip_high, low=0.0)
  if dual_clip is not None:
    C.check_scalar("dual_clip", dual_clip, low=1.0, low_open=True)


def surrogate_from_ratio(ratio: jax.Array, adv: jax.Array, clip_low: float, clip_high: float,
                         dual_clip: float | None) -> jax.Array:
  """``-min(ratio A, clip(ratio, 1-clip_low, 1+clip_high) A)`` with optional dual clip; no checks.

  ratio: [B, T]; adv: [B, 1] or [B, T]. Dual clip (Ye et al. 2020, as in verl): for A < 0 the
  loss is further capped at ``-dual_clip * A``.

  Written as an explicit selection rather than ``max(.., clip(..))`` so that the gradient at
  a ratio *exactly* on a bound is the unclipped one (a clipped token is one strictly outside
  ``[1 - clip_low, 1 + clip_high]`` on the side its advantage pushes towards), the same as
  torch's ``max(-A r, -A clamp(r))`` used by verl/TRL; ``jnp.clip``/``jnp.maximum`` would
  split the gradient at ties. Values are identical to the max/clip form.
  """
  upper = 1.0 + clip_high
  lower = 1.0 - clip_low
  # A > 0: the objective is A min(r, upper); A < 0: A max(r, lower).
  clipped_hi = (adv > 0) & (ratio > upper)
  clipped_lo = (adv < 0) & (ratio < lower)
  loss = jnp.where(clipped_hi, -adv * upper, jnp.where(clipped_lo, -adv * lower, -adv * ratio))
  if dual_clip is not None:
    # A < 0 and r > c: the loss -A r is capped at -A c (constant, no gradient).
    loss = jnp.where((adv < 0) & (ratio > dual_clip), -adv * dual_clip, loss)
  return loss


def clipped_surrogate(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, *,
                      clip_low: float = 0.2, clip_high: float = 0.2,
                      dual_clip: float | None = None) -> jax.Array:
  """Per-token PPO/GRPO clipped surrogate loss, the integrand of Eq. 2 (negated).

  logp: [B, T] current policy; old_logp: [B, T] behaviour policy (``pi_old`` of Eq. 2);
  advantages: [B] or [B, T].
  ``rho = exp(clamp(logp - old_logp, -20, 20))``;
  ``loss = -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)``; ``clip_low != clip_high``
  gives DAPO's clip-higher. ``dual_clip = c > 1`` caps the loss of A < 0 tokens at ``-c A``.
  Returns [B, T] float32 (unmasked; aggregate with ``aggregate``).
  """
  logp = C.check_float("logp", logp, (2,))
  old_logp = C.check_float("old_logp", old_logp, (2,))
  C.check_same_shape("old_logp", old_logp, "logp", logp)
  adv = C.check_advantages("advantages", advantages, tuple(logp.shape))
  _check_clip(clip_low, clip_high, dual_clip)
  ratio = jnp.exp(jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
  return surrogate_from_ratio(ratio, adv, clip_low, clip_high, dual_clip)


# ---------------------------------------------------------------------------------------
# Eq. 5-6: calibration (reasoning-shift) weights
# ---------------------------------------------------------------------------------------


def calibration_weights(cal_logp: jax.Array, roll_logp: jax.Array, intervened_mask: jax.Array, *,
                        eps_cal: float = 0.2) -> jax.Array:
  """Reasoning-shift-aware token weights, Eq. 5-6 (with the stop-gradient of Eq. 11).

  cal_logp: [B, T] log pi_cal (token scored under the correction prompt p_cal);
  roll_logp: [B, T] log pi_theta^roll (same token under the rollout prompt p_roll);
  intervened_mask: [B, T], non-zero on tokens written by the Corrector.
  ``rho^t = exp(cal_logp - roll_logp)`` (Eq. 5, log-ratio clamped to +-20),
  ``w = clip(rho^t, 1 - eps_cal, 1 + eps_cal)`` (Eq. 6) on intervened tokens and exactly 1
  elsewhere (Algorithm 1, lines 6 and 26). Wrapped in ``stop_gradient``: no gradient
  reaches ``cal_logp`` or ``roll_logp``. eps_cal in (0, 1). Returns [B, T] float32.
  """
  cal_logp = C.check_float("cal_logp", cal_logp, (2,))
  roll_logp = C.check_float("roll_logp", roll_logp, (2,))
  C.check_same_shape("roll_logp", roll_logp, "cal_logp", cal_logp)
  mask = C.check_mask("intervened_mask", intervened_mask, tuple(cal_logp.shape))
  C.check_scalar("eps_cal", eps_cal, low=0.0, high=1.0, low_open=True, high_open=True)
  log_rho = jnp.where(mask, cal_logp - roll_logp, 0.0)
  rho = jnp.exp(jnp.clip(log_rho, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
  w = jnp.where(mask, jnp.clip(rho, 1.0 - eps_cal, 1.0 + eps_cal), 1.0)
  return jax.lax.stop_gradient(w)


# ---------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------


def aggregate_parts(per_token: jax.Array, mask: jax.Array, mode: str, *,
                    norm: float | None = None) -> tuple[jax.Array, jax.Array]:
  """Numerator and denominator of ``aggregate``; ``aggregate = num / max(den, 1)``.

  per_token: [B, T] float; mask: [B, T] (non-zero = counted). With ``n_i = sum_t mask[i, t]``:

  * ``"token-mean"`` (DAPO): num = sum_{i,t} x m, den = sum_i n_i. Every token weighs the same.
  * ``"seq-mean-token-mean"`` (the paper's Eq. 2/7, ``1/G sum_i 1/|tau_i| sum_t``):
    num = sum_{i: n_i>0} (sum_t x m) / n_i, den = #{i: n_i > 0}.
  * ``"seq-mean-token-sum"``: num = sum_i sum_t x m, den = #{i: n_i > 0}.
  * ``"seq-mean-token-sum-norm"`` (verl's mode of that name): num = sum_i sum_t x m / norm,
    den = 0, so the loss is the batch's token sum divided by the constant ``norm`` alone (default
    T, the padded length), with no division by the number of rows.
  * ``"dr-grpo"`` (Dr. GRPO; TRL's ``loss_type="dr_grpo"``): num = sum_i sum_t x m / norm,
    den = #{i: n_i > 0}: the token sum over rows x ``norm`` (default T), so the per-token weight
    depends neither on the response's length nor on the batch's mix of lengths.

  docs/objectives.md sets these names beside verl's ``loss_agg_mode`` and TRL's ``loss_type``.
  Rows with no counted token contribute nothing to num or den. Summing num and den over
  micro-batches and dividing once reproduces the full-batch value exactly. Masked entries
  are selected out with ``where``, so inf/NaN there cannot leak. Returns two float32 scalars.
  """
  x = C.check_float("per_token", per_token, (2,))
  m = C.check_mask("mask", mask, tuple(x.shape))
  C.check_choice("mode", mode, AGG_MODES)
  if norm is not None:
    C.check_scalar("norm", norm, low=0.0, low_open=True)
  xm = jnp.where(m, x, 0.0)
  n_i = jnp.sum(m, axis=-1).astype(jnp.float32)
  row_sum = jnp.sum(xm, axis=-1)
  nonempty = (n_i > 0).astype(jnp.float32)
  if mode == "token-mean":
    return jnp.sum(row_sum), jnp.sum(n_i)
  if mode == "seq-mean-token-mean":
    return jnp.sum(row_sum / jnp.maximum(n_i, 1.0)), jnp.sum(nonempty)
  if mode == "seq-mean-token-sum":
    return jnp.sum(row_sum), jnp.sum(nonempty)
  scale = float(x.shape[1]) if norm is None else norm
  if mode == "seq-mean-token-sum-norm":
    return jnp.sum(row_sum) / scale, jnp.zeros((), jnp.float32)
  return jnp.sum(row_sum) / scale, jnp.sum(nonempty)


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str = "seq-mean-token-mean", *,
              norm: float | None = None) -> jax.Array:
  """Reduces a per-token loss [B, T] to a scalar; see ``aggregate_parts`` for each mode.

  An all-masked batch gives 0 (not NaN).
  """
  num, den = aggregate_parts(per_token, mask, mode, norm=norm)
  return num / jnp.maximum(den, 1.0)


# ---------------------------------------------------------------------------------------
# KL penalty (the beta KL term of Eq. 2)
# ---------------------------------------------------------------------------------------


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kind: str = "low_var_kl") -> jax.Array:
  """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled by pi_theta (Schulman's k-estimators).

  logp, ref_logp: [B, T]. With ``d = logp - ref_logp``:
  ``"k1"``: d; ``"abs"``: |d|; ``"k2"``: d^2 / 2;
  ``"k3"`` == ``"low_var_kl"``: ``exp(-d) + d - 1`` with ``-d`` clamped to [-20, 20] and the
  result clamped to [-10, 10] (the GRPO paper's estimator, clamped as in verl).
  Returns [B, T] float32.
  """
  logp = C.check_float("logp", logp, (2,))
  ref_logp = C.check_float("ref_logp", ref_logp, (2,))
  C.check_same_shape("ref_logp", ref_logp, "logp", logp)
  C.check_choice("kind", kind, KL_KINDS)
  d = logp - ref_logp
  if kind == "k1":
    return d
  if kind == "abs":
    return jnp.abs(d)
  if kind == "k2":
    return 0.5 * d**2
  neg = jnp.clip(-d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jnp.clip(jnp.exp(neg) - neg - 1.0, -10.0, 10.0)


# ---------------------------------------------------------------------------------------
# Eq. 3-4: perplexity gate
# ---------------------------------------------------------------------------------------


def sequence_perplexity(logp: jax.Array, mask: jax.Array) -> jax.Array:
  """Per-response perplexity, Eq. 3: ``PPL = exp(-1/T_k sum_t logp_t)`` over masked tokens.

  logp: [B, T] log pi_theta^roll of the intervened response tokens (rescored under the
  rollout prompt); mask: [B, T] marks the T_k tokens of each response. Returns [B] float32.
  A row without tokens has no perplexity; it gets +inf, so any finite gate rejects it.
  Very unlikely responses overflow to +inf as well (float32 ``exp`` above ~88).
  """
  logp = C.check_float("logp", logp, (2,))
  m = C.check_mask("mask", mask, tuple(logp.shape))
  n = jnp.sum(m, axis=-1).astype(jnp.float32)
  nll = -jnp.sum(jnp.where(m, logp, 0.0), axis=-1) / jnp.maximum(n, 1.0)
  return jnp.where(n > 0, jnp.exp(nll), jnp.inf)


def ppl_gate(ppl: jax.Array, delta: float) -> jax.Array:
  """Distribution gate, Eq. 4: keep a correction iff ``PPL <= delta``.

  ppl: [B] (or any shape); delta >= 0 (the paper uses 5). ``delta = 0`` rejects everything,
  ``delta = inf`` accepts everything (including +inf / NaN perplexities). Returns bool, shape of ppl.
  """
  ppl = C.check_float("ppl", ppl, (0, 1, 2))
  C.check_scalar("delta", delta, low=0.0, allow_inf=True)
  delta = jnp.asarray(delta, jnp.float32)
  return jnp.where(jnp.isposinf(delta), True, (ppl <= delta) & (delta > 0))


# ---------------------------------------------------------------------------------------
# Eq. 2 and Eq. 7: the GRPO and RTI losses
# ---------------------------------------------------------------------------------------


def _masked_inputs(loss_mask: jax.Array, *xs: jax.Array) -> list[jax.Array]:
  """Zeroes masked positions so that inf/NaN padding yields neither NaN values nor NaN grads."""
  return [jnp.where(loss_mask, x, 0.0) for x in xs]


def _check_kl_args(beta: Any, ref_logp: Any, kl_kind: str) -> None:
  C.check_scalar("beta", beta, low=0.0)
  C.check_choice("kl_kind", kl_kind, KL_KINDS)
  if ref_logp is None and not (isinstance(beta, (int, float)) and beta == 0):
    raise ValueError(f"ref_logp: expected a [B, T] array when beta != 0, got None (beta={beta!r})")


def grpo_token_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array,
                    loss_mask: jax.Array, *, clip_low: float = 0.2, clip_high: float = 0.2,
                    dual_clip: float | None = None, ref_logp: jax.Array | None = None,
                    beta: float = 0.0, kl_kind: str = "low_var_kl",
                    token_weights: jax.Array | None = None) -> jax.Array:
  """Per-token integrand of Eq. 2 / Eq. 7 (negated): ``w * surrogate + beta * KL``.

  logp, old_logp: [B, T]; advantages: [B] or [B, T]; loss_mask: [B, T];
  ref_logp: [B, T] (needed when beta != 0); token_weights: [B, T] stop-gradient weights
  (the RTI calibration weights; None = 1). Masked positions hold 0. Returns [B, T] float32.
  """
  logp = C.check_float("logp", logp, (2,))
  shape = tuple(logp.shape)
  mask = C.check_mask("loss_mask", loss_mask, shape)
  _check_kl_args(beta, ref_logp, kl_kind)
  old_logp = C.check_float("old_logp", old_logp, (2,))
  C.check_same_shape("old_logp", old_logp, "logp", logp)
  logp, old_logp = _masked_inputs(mask, logp, old_logp)
  loss = clipped_surrogate(logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high,
                           dual_clip=dual_clip)
  if token_weights is not None:
    w = C.check_float("token_weights", token_weights, (2,))
    C.check_same_shape("token_weights", w, "logp", logp)
    loss = jax.lax.stop_gradient(w) * loss
  if ref_logp is not None and not (isinstance(beta, (int, float)) and beta == 0):
    ref = C.check_float("ref_logp", ref_logp, (2,))
    C.check_same_shape("ref_logp", ref, "logp", logp)
    (ref,) = _masked_inputs(mask, ref)
    loss = loss + beta * kl_penalty(logp, ref, kl_kind)
  return jnp.where(mask, loss, 0.0)


def grpo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, loss_mask: jax.Array, *,
              clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
              ref_logp: jax.Array | None = None, beta: float = 0.0, kl_kind: str = "low_var_kl",
              agg: str = "seq-mean-token-mean", norm: float | None = None) -> jax.Array:
  """GRPO loss, Eq. 2 (negated): ``-[1/G sum_i 1/|tau_i| sum_t min(rho A, clip(rho) A)] + beta KL``.

  logp, old_logp: [B, T]; advantages: [B] (Eq. 1) or [B, T]; loss_mask: [B, T];
  ref_logp: [B, T] when beta > 0. The KL term is added per token and aggregated with the
  surrogate (as verl does), which equals Eq. 2's separate ``beta KL`` for every ``agg``
  mode. Default aggregation is the paper's ``seq-mean-token-mean``. Returns a scalar.
  """
  per_token = grpo_token_loss(logp, old_logp, advantages, loss_mask, clip_low=clip_low,
                              clip_high=clip_high, dual_clip=dual_clip, ref_logp=ref_logp,
                              beta=beta, kl_kind=kl_kind)
  return aggregate(per_token, loss_mask, agg, norm=norm)


def rti_token_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array,
                   loss_mask: jax.Array, cal_logp: jax.Array, roll_logp: jax.Array,
                   intervened_mask: jax.Array, *, eps_cal: float = 0.2, clip_low: float = 0.2,
                   clip_high: float = 0.2, dual_clip: float | None = None,
                   ref_logp: jax.Array | None = None, beta: float = 0.0,
                   kl_kind: str = "low_var_kl") -> jax.Array:
  """Per-token integrand of Eq. 7 (negated): ``rho_cal^t * surrogate + beta * KL``, [B, T]."""
  logp = C.check_float("logp", logp, (2,))
  C.check_mask("loss_mask", loss_mask, tuple(logp.shape))
  cal_logp = C.check_float("cal_logp", cal_logp, (2,))
  C.check_same_shape("cal_logp", cal_logp, "logp", logp)
  w = calibration_weights(cal_logp, roll_logp, intervened_mask, eps_cal=eps_cal)
  return grpo_token_loss(logp, old_logp, advantages, loss_mask, clip_low=clip_low,
                         clip_high=clip_high, dual_clip=dual_clip, ref_logp=ref_logp, beta=beta,
                         kl_kind=kl_kind, token_weights=w)


def rti_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, loss_mask: jax.Array,
             cal_logp: jax.Array, roll_logp: jax.Array, intervened_mask: jax.Array, *,
             eps_cal: float = 0.2, clip_low: float = 0.2, clip_high: float = 0.2,
             dual_clip: float | None = None, ref_logp: jax.Array | None = None, beta: float = 0.0,
             kl_kind: str = "low_var_kl", agg: str = "seq-mean-token-mean",
             norm: float | None = None) -> jax.Array:
  """RTI loss, Eq. 7 (negated), plus the optional ``beta`` KL of Eq. 2.

  ``J_RTI = 1/G sum_i 1/|tau_i| sum_t rho_cal^t min(rho_i^t A_i, clip(rho_i^t, 1-eps_clip, 1+eps_clip) A_i)``.
  Eq. 7 as printed clips to ``(-eps_clip, +eps_clip)``; that is a misprint of Eq. 2's
  ``1 +- eps_clip`` (Eq. 12 and Appendix B use ``1 +- eps_clip``), which we use.

  logp: [B, T] current policy; old_logp: [B, T] ``pi_old`` of each token; on intervened
  tokens pass the rollout-prompt rescoring (= ``roll_logp``), see ``RTIBatch``;
  advantages: [B] or [B, T]; loss_mask: [B, T];
  cal_logp, roll_logp, intervened_mask: [B, T], see ``calibration_weights`` (Eq. 5-6);
  rows without intervened tokens get weight 1, so this equals ``grpo_loss`` when
  ``intervened_mask`` is all 0. The weight multiplies the surrogate only, not the KL.
  Returns a scalar.
  """
  per_token = rti_token_loss(logp, old_logp, advantages, loss_mask, cal_logp, roll_logp,
                             intervened_mask, eps_cal=eps_cal, clip_low=clip_low,
                             clip_high=clip_high, dual_clip=dual_clip, ref_logp=ref_logp,
                             beta=beta, kl_kind=kl_kind)
  return aggregate(per_token, loss_mask, agg, norm=norm)
