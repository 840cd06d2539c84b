"""The baselines the RTI paper compares against (Sec. 5.1, App. C.3), each after its own paper.

GSPO (Zheng et al. 2025), LUFFY (Yan et al.), OPD (on-policy distillation, as folded into the
advantage by slime) and AEPO (Dong et al. 2025, policy-update part). Same conventions as
``core``: ``[B, T]`` arrays, losses are negated objectives, per-token functions return
masked ``[B, T]`` integrands and the ``*_loss`` functions aggregate them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rti_jax.objectives import _checks as C
from rti_jax.objectives.core import (LOG_RATIO_CLAMP, _check_clip, _masked_inputs, aggregate,
                                     grpo_token_loss, surrogate_from_ratio)

# ---------------------------------------------------------------------------------------
# GSPO: sequence-level ratio and clipping
# ---------------------------------------------------------------------------------------


def gspo_token_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array,
                    loss_mask: jax.Array, *, clip_low: float = 3e-4,
                    clip_high: float = 4e-4) -> jax.Array:
  """GSPO integrand (negated), in the GSPO-token form, [B, T].

  Sequence ratio ``s_i = exp(1/|y_i| sum_t (logp - old_logp))`` (length-normalised, GSPO
  Eq. 7); per token ``s_i^t = sg(s_i) * pi_theta(y_t) / sg(pi_theta(y_t))``, which equals
  ``s_i`` in value and, with a per-sequence advantage, gives exactly GSPO's sequence-level
  gradient (GSPO Eq. 13-17). Clipping ``clip(s_i^t, 1 - clip_low, 1 + clip_high)`` is thus a
  sequence-level clip. Defaults 3e-4 / 4e-4 are the GSPO paper's ranges. The log of the
  sequence ratio is clamped to +-20. advantages: [B] (GSPO) or [B, T] (GSPO-token).
  """
  logp = C.check_float("logp", logp, (2,))
  old_logp = C.check_float("old_logp", old_logp, (2,))
  C.check_same_shape("old_logp", old_logp, "logp", logp)
  mask = C.check_mask("loss_mask", loss_mask, tuple(logp.shape))
  adv = C.check_advantages("advantages", advantages, tuple(logp.shape))
  _check_clip(clip_low, clip_high, None)
  logp, old_logp = _masked_inputs(mask, logp, old_logp)
  n = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True).astype(jnp.float32), 1.0)
  seq_log_ratio = jnp.sum(logp - old_logp, axis=-1, keepdims=True) / n
  token_log_ratio = jax.lax.stop_gradient(seq_log_ratio) + logp - jax.lax.stop_gradient(logp)
  ratio = jnp.exp(jnp.clip(token_log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
  return jnp.where(mask, surrogate_from_ratio(ratio, adv, clip_low, clip_high, None), 0.0)


def gspo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, loss_mask: jax.Array, *,
              clip_low: float = 3e-4, clip_high: float = 4e-4,
              agg: str = "seq-mean-token-mean", norm: float | None = None) -> jax.Array:
  """GSPO loss (negated GSPO Eq. 5): ``-1/G sum_i min(s_i A_i, clip(s_i) A_i)``.

  With the default ``seq-mean-token-mean`` aggregation every response weighs 1/G, exactly
  GSPO's sequence-level average. Shapes as ``gspo_token_loss``. Returns a scalar.
  """
  per_token = gspo_token_loss(logp, old_logp, advantages, loss_mask, clip_low=clip_low,
                              clip_high=clip_high)
  return aggregate(per_token, loss_mask, agg, norm=norm)


# ---------------------------------------------------------------------------------------
# LUFFY: mixed-policy GRPO with policy shaping of off-policy (teacher) tokens
# ---------------------------------------------------------------------------------------


def luffy_token_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array,
                     loss_mask: jax.Array, off_policy_mask: jax.Array, *, gamma: float = 0.1,
                     clip_low: float = 0.2, clip_high: float = 0.2,
                     on_policy_clip: bool = True) -> jax.Array:
  """LUFFY integrand (negated), [B, T].

  off_policy_mask: [B, T], non-zero on tokens of teacher trajectories. LUFFY's off-policy
  importance ratio is ``pi_theta / pi_teacher`` with ``pi_teacher`` taken as 1 (teacher
  probabilities are not available), shaped by ``f(p) = p / (p + gamma)`` and *not*
  clipped: ``loss = -f(pi_theta(y_t)) A``. On-policy tokens use the usual clipped surrogate
  against ``old_logp`` (``on_policy_clip=False`` gives the unclipped ``-ratio A`` that
  LUFFY's released training scripts use). Advantages are computed over the mixed group
  beforehand (Eq. 1; LUFFY's scripts use ``std="none"``).
  """
  logp = C.check_float("logp", logp, (2,))
  shape = tuple(logp.shape)
  mask = C.check_mask("loss_mask", loss_mask, shape)
  off = C.check_mask("off_policy_mask", off_policy_mask, shape)
  C.check_scalar("gamma", gamma, low=0.0, low_open=True)
  adv = C.check_advantages("advantages", advantages, shape)
  if on_policy_clip:
    on_loss = grpo_token_loss(logp, old_logp, advantages, loss_mask, clip_low=clip_low,
                              clip_high=clip_high)
  else:
    old = C.check_float("old_logp", old_logp, (2,))
    C.check_same_shape("old_logp", old, "logp", logp)
    lp_m, old_m = _masked_inputs(mask, logp, old)
    on_loss = -adv * jnp.exp(jnp.clip(lp_m - old_m, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
  (logp,) = _masked_inputs(mask, logp)
  p = jnp.exp(logp)
  off_loss = -adv * (p / (p + gamma))
  return jnp.where(mask, jnp.where(off, off_loss, on_loss), 0.0)


def luffy_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, loss_mask: jax.Array,
               off_policy_mask: jax.Array, *, gamma: float = 0.1, clip_low: float = 0.2,
               clip_high: float = 0.2, on_policy_clip: bool = True, agg: str = "token-mean",
               norm: float | None = None) -> jax.Array:
  """LUFFY loss; token-mean aggregation over on- and off-policy tokens (LUFFY's ``1/Z``).

  LUFFY's released scripts instead divide the token sum by the padded length (Dr. GRPO);
  ``agg="dr-grpo"`` is that (``"seq-mean-token-sum-norm"`` too, up to the constant number of rows).
  Shapes as ``luffy_token_loss``. Returns a scalar.
  """
  per_token = luffy_token_loss(logp, old_logp, advantages, loss_mask, off_policy_mask,
                               gamma=gamma, clip_low=clip_low, clip_high=clip_high,
                               on_policy_clip=on_policy_clip)
  return aggregate(per_token, loss_mask, agg, norm=norm)


# ---------------------------------------------------------------------------------------
# OPD: on-policy distillation folded into the advantage
# ---------------------------------------------------------------------------------------


def opd_advantages(advantages: jax.Array, logp_student: jax.Array, logp_teacher: jax.Array,
                   mask: jax.Array, *, coef: float = 1.0) -> jax.Array:
  """Token advantages of on-policy distillation: ``A_t = A - coef * (logp_student - logp_teacher)``.

  advantages: [B] or [B, T] (task advantages; all zero gives pure OPD);
  logp_student: [B, T] the sampling policy's log-probs of its own tokens;
  logp_teacher: [B, T] the teacher's log-probs of the same tokens; mask: [B, T].
  ``logp_student - logp_teacher`` is the per-token reverse-KL sample; subtracting it rewards
  tokens the teacher likes (slime's OPD). Stop-gradient; 0 on masked positions. Returns [B, T].
  """
  student = C.check_float("logp_student", logp_student, (2,))
  teacher = C.check_float("logp_teacher", logp_teacher, (2,))
  C.check_same_shape("logp_teacher", teacher, "logp_student", student)
  m = C.check_mask("mask", mask, tuple(student.shape))
  adv = C.check_advantages("advantages", advantages, tuple(student.shape))
  C.check_scalar("coef", coef, low=0.0)
  student, teacher = _masked_inputs(m, student, teacher)
  token_adv = adv - coef * (student - teacher)
  return jax.lax.stop_gradient(jnp.where(m, token_adv, 0.0))


# ---------------------------------------------------------------------------------------
# AEPO: entropy-balanced policy optimisation (policy-update part)
# ---------------------------------------------------------------------------------------


def entropy_zscore(entropy: jax.Array, mask: jax.Array) -> jax.Array:
  """AEPO's standardised token entropy ``z(H_t) = (H_t - mean) / std``, [B, T], 0 off the mask.

  Mean and Bessel-corrected std over the masked tokens (the AEPO authors' released verl code);
  where that std is 0 or undefined (constant entropies, a single token) ``z = 0``.
  """
  ent = C.check_float("entropy", entropy, (2,))
  m = C.check_mask("mask", mask, tuple(ent.shape))
  (ent,) = _masked_inputs(m, ent)
  n = jnp.sum(m).astype(jnp.float32)
  mean = jnp.sum(ent) / jnp.maximum(n, 1.0)
  var = jnp.sum(jnp.where(m, (ent - mean) ** 2, 0.0)) / jnp.maximum(n - 1.0, 1.0)
  std = jnp.sqrt(var)
  ok = (std > 0) & (n > 1)
  return jnp.where(m & ok, (ent - mean) / jnp.where(ok, std, 1.0), 0.0)


def aepo_advantages(advantages: jax.Array, entropy: jax.Array, mask: jax.Array, *,
                    alpha: float = 0.2, standardized: bool = False) -> jax.Array:
  """Entropy-aware advantages: ``A_t = A * (1 + alpha * z(H_t))``, [B, T], stop-gradient.

  advantages: [B] or [B, T]; entropy: [B, T] per-token policy entropy; mask: [B, T].
  ``z`` is ``entropy_zscore`` over the masked tokens of this batch, so high-uncertainty tokens
  get a larger share of the outcome advantage; ``standardized=True``: ``entropy`` already is
  ``z``, taken over a larger batch than this one (the trainer standardises over the whole
  minibatch before cutting it into length chunks or micro-batches, so the z-score does not
  depend on how the batch is cut). ``alpha = 0.2`` follows the AEPO authors' released code.
  AEPO uses the entropy of the policy being updated (detached); the trainer stores that of the
  parameters that drew the rollouts in ``RTIBatch.entropy``.
  """
  ent = C.check_float("entropy", entropy, (2,))
  shape = tuple(ent.shape)
  m = C.check_mask("mask", mask, shape)
  adv = C.check_advantages("advantages", advantages, shape)
  C.check_scalar("alpha", alpha, low=0.0)
  z = jnp.where(m, ent, 0.0) if standardized else entropy_zscore(ent, m)
  return jax.lax.stop_gradient(jnp.where(m, adv * (1.0 + alpha * z), 0.0))


def aepo_token_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array,
                    loss_mask: jax.Array, *, clip_low: float = 0.2,
                    clip_high: float = 0.2) -> jax.Array:
  """AEPO's entropy-clipping-balanced surrogate (negated), [B, T].

  advantages: [B] or [B, T] (pass ``aepo_advantages`` for the full method). Identical in
  value to the clipped surrogate; the difference is in the gradient of tokens clipped at the
  *upper* bound (A > 0, ratio > 1 + clip_high), which are mostly high-entropy exploratory
  tokens: instead of dropping their gradient, the term is ``(1 + clip_high) * ratio / sg(ratio) * A``
  (stop-gradient in the clipping term), so they keep a gradient of ``(1 + clip_high) A grad log pi``.
  Lower-bound clipping (A < 0) is unchanged. This matches the authors' released verl code
  (``clamp(ratio, 1 - eps_low, (1 + eps_high) / sg(ratio) * ratio)``).
  """
  logp = C.check_float("logp", logp, (2,))
  old_logp = C.check_float("old_logp", old_logp, (2,))
  C.check_same_shape("old_logp", old_logp, "logp", logp)
  mask = C.check_mask("loss_mask", loss_mask, tuple(logp.shape))
  adv = C.check_advantages("advantages", advantages, tuple(logp.shape))
  _check_clip(clip_low, clip_high, None)
  logp, old_logp = _masked_inputs(mask, logp, old_logp)
  ratio = jnp.exp(jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
  standard = surrogate_from_ratio(ratio, adv, clip_low, clip_high, None)
  preserved = -adv * (1.0 + clip_high) * ratio / jax.lax.stop_gradient(ratio)
  high_clipped = (adv > 0) & (ratio > 1.0 + clip_high)
  return jnp.where(mask, jnp.where(high_clipped, preserved, standard), 0.0)


def aepo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, loss_mask: jax.Array, *,
              entropy: jax.Array | None = None, alpha: float = 0.2, clip_low: float = 0.2,
              clip_high: float = 0.2, agg: str = "token-mean",
              norm: float | None = None) -> jax.Array:
  """AEPO loss: entropy-aware advantages (when ``entropy`` [B, T] is given) and the
  gradient-preserving upper clip, token-mean aggregated (AEPO's ``1 / sum_i |y_i|``). Scalar.
  """
  if entropy is not None:
    advantages = aepo_advantages(advantages, entropy, loss_mask, alpha=alpha)
  per_token = aepo_token_loss(logp, old_logp, advantages, loss_mask, clip_low=clip_low,
                              clip_high=clip_high)
  return aggregate(per_token, loss_mask, agg, norm=norm)
