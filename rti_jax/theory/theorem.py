"""Numerical check of Theorem 1 (paper Appendix B, Eq. 8-23).

Objective (smooth, non-concave in ``theta``, with an interior maximiser):

    J(theta) = sum_a pi_a(theta) p_a - mu/2 ||theta||^2,   pi = softmax(theta),   theta: [A]

a softmax policy on an A-armed Bernoulli bandit (arm ``a`` succeeds with probability ``p_a``)
with an L2 penalty. Everything Theorem 1 needs is known in closed form or certified:

* L (Definition 2): ``||hess J|| <= 5/4 (max p - min p) + mu`` (``smoothness_constant``; the
  derivation is in its docstring and a test checks it against ``jax.hessian``).
* sigma (Definition 3): every iterate stays in the ball ``||theta|| <= R = 2 sqrt(2) / mu``
  (``invariant_radius``), on which every per-sample gradient has norm ``<= sqrt(2) + mu R``.
* J* (Theorem 1's ``sup J``): found by multi-start ascent (``optimum``); a test compares it
  with a brute-force grid.

The mixed update of Theorem 1 is ``dtheta_k = lam dtheta_cal^k + (1 - lam) dtheta_grpo^k``:

* ``dtheta_grpo^k = alpha_k * (-grad of the Eq. 2 clipped surrogate)`` on a fresh on-policy
  group of G pulls with leave-one-out advantages (``G / (G-1)`` times Eq. 1 with ``std="none"``),
  minus the penalty gradient ``mu theta``. Its expectation is exactly ``alpha grad J``, so the
  alignment (8) holds with constant ``1 - lam`` from this term alone.
* ``dtheta_cal^k = beta_k * (-grad of the Eq. 7 loss)`` on the oracle's intervened pull of the
  best arm (advantage 1) reweighted by the Eq. 6 weight ``clip(pi_cal / pi_roll, 1 +- eps_cal)``
  (the corrector's distribution ``pi_cal = softmax(theta + kappa e_best)``), minus ``mu theta``.
  Definition 5's cumulative bound (13), ``sum_k E||dtheta_cal^k||^2 <= D_cal^2 = 4 eta^2
  eps_cal^2 sigma^2``, is an *assumption* of the theorem, not a consequence of Eq. 7; it is
  realised here with the square-summable step ``beta_k = b / (k + 1)``,
  ``b = 2 eta eps_cal sqrt(6) / (pi (1 + eps_cal))``, so that (13) holds for every K.

``simulate`` runs the update for ``n_seeds`` independent seeds (vmapped, one ``fori_loop``)
with ``alpha = c / sqrt(K)`` (Eq. 9) and measures ``min_k E||grad J(theta_k)||^2`` (the left
side of Eq. 10, E estimated by the seed mean) and each assumption: the alignment constant of
(8), the second moments (13) and (14), and L on the visited segments.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rti_jax.objectives import group_advantages, grpo_loss, rti_loss

SQRT2 = math.sqrt(2.0)


# ---------------------------------------------------------------------------------------
# The objective
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BanditProblem:
  """The bandit of the module docstring.

  success_prob: [A] Bernoulli success probability of each arm, in [0, 1];
  mu: L2 penalty (> 0); theta0: [A] initial logits (``||theta0|| <= invariant_radius``).
  """

  success_prob: tuple[float, ...] = (0.9, 0.5, 0.3, 0.1)
  mu: float = 1.0
  theta0: tuple[float, ...] = (-2.0, 1.0, 1.0, 0.5)

  def __post_init__(self) -> None:
    p = np.asarray(self.success_prob, np.float64)
    if p.ndim != 1 or p.size < 2 or np.any(p < 0) or np.any(p > 1):
      raise ValueError(f"success_prob: expected >= 2 probabilities in [0, 1], got {self.success_prob}")
    if not (isinstance(self.mu, (int, float)) and self.mu > 0):
      raise ValueError(f"mu: expected a number > 0, got {self.mu!r}")
    t0 = np.asarray(self.theta0, np.float64)
    if t0.shape != p.shape:
      raise ValueError(f"theta0: expected shape {p.shape} (one logit per arm), got {t0.shape}")
    if np.linalg.norm(t0) > invariant_radius(self.mu):
      raise ValueError(f"theta0: expected ||theta0|| <= R = 2 sqrt(2) / mu = {invariant_radius(self.mu):.4f}, "
                       f"got {np.linalg.norm(t0):.4f}")

  @property
  def num_arms(self) -> int:
    return len(self.success_prob)

  @property
  def best_arm(self) -> int:
    return int(np.argmax(self.success_prob))

  def arrays(self) -> tuple[jax.Array, jax.Array]:
    return jnp.asarray(self.success_prob, jnp.float32), jnp.asarray(self.theta0, jnp.float32)


def objective(theta: jax.Array, success_prob: jax.Array, mu: float) -> jax.Array:
  """J(theta) = softmax(theta) . p - mu/2 ||theta||^2. theta: [..., A], p: [A]; returns [...]."""
  pi = jax.nn.softmax(theta, axis=-1)
  return jnp.sum(pi * success_prob, axis=-1) - 0.5 * mu * jnp.sum(theta**2, axis=-1)


def objective_np(theta: Any, success_prob: Any, mu: float) -> float:
  """``objective`` in numpy float64 for one theta: [A] -> float."""
  th = np.asarray(theta, np.float64)
  z = np.exp(th - th.max())
  return float((z / z.sum()) @ np.asarray(success_prob, np.float64) - 0.5 * mu * th @ th)


def objective_grad(theta: jax.Array, success_prob: jax.Array, mu: float) -> jax.Array:
  """Exact gradient of ``objective``: ``pi * (p - pi . p) - mu theta``. theta: [..., A] -> [..., A]."""
  pi = jax.nn.softmax(theta, axis=-1)
  value = jnp.sum(pi * success_prob, axis=-1, keepdims=True)
  return pi * (success_prob - value) - mu * theta


def objective_hessian(theta: np.ndarray, success_prob: np.ndarray, mu: float) -> np.ndarray:
  """Closed-form Hessian, numpy float64. theta: [A] -> [A, A].

  With ``g = pi * (p - J0)`` (``J0 = pi . p``): ``H = diag(g) - pi g^T - g pi^T - mu I``.
  """
  theta = np.asarray(theta, np.float64)
  z = np.exp(theta - theta.max())
  pi = z / z.sum()
  g = pi * (np.asarray(success_prob, np.float64) - pi @ success_prob)
  return np.diag(g) - np.outer(pi, g) - np.outer(g, pi) - mu * np.eye(theta.size)


def smoothness_constant(success_prob: Any, mu: float) -> float:
  """Certified L of Definition 2 for ``objective``: ``5/4 (max p - min p) + mu``.

  With ``d = max p - min p``: ``|g_a| = pi_a |p_a - J0| <= pi_a (1 - pi_a) d <= d/4`` and
  ``||g||^2 = sum pi_a^2 (p_a - J0)^2 <= Var_pi(p) <= d^2/4``, so ``||diag(g)|| <= d/4``,
  ``||pi g^T + g pi^T|| <= 2 ||pi|| ||g|| <= d``, and ``||H|| <= 5d/4 + mu``.
  """
  p = np.asarray(success_prob, np.float64)
  return 1.25 * float(p.max() - p.min()) + float(mu)


def numeric_smoothness(success_prob: Any, mu: float, *, num_samples: int = 20000, seed: int = 0) -> float:
  """Largest ``||hess J(theta)||_2`` over logits drawn at random (for comparison with the certified L)."""
  rng = np.random.default_rng(seed)
  p = np.asarray(success_prob, np.float64)
  best = 0.0
  for scale in (0.5, 2.0, 6.0):
    thetas = rng.normal(size=(num_samples // 3, p.size)) * scale
    for th in thetas:
      best = max(best, float(np.linalg.norm(objective_hessian(th, p, mu), 2)))
  return best


def invariant_radius(mu: float) -> float:
  """R = 2 sqrt(2) / mu: the ball ``||theta|| <= R`` that the mixed update never leaves.

  Each step is ``theta' = (1 - mu s) theta + v`` with ``s = lam beta_k + (1 - lam) alpha`` and
  ``||v|| <= s (1 + eps_cal) sqrt(2) <= 2 sqrt(2) s`` (advantages in [-1, 1], Eq. 6 weights
  <= 1 + eps_cal < 2, ``||e_a - pi|| <= sqrt(2)``); so ``||theta|| <= R`` is kept while
  ``mu s <= 1``.
  """
  return 2.0 * SQRT2 / float(mu)


def gradient_bound(mu: float) -> float:
  """sigma of Definition 3 on the invariant ball: ``||A (e_a - pi) - mu theta|| <= sqrt(2) + mu R = 3 sqrt(2)``."""
  return SQRT2 + float(mu) * invariant_radius(mu)


def optimum(success_prob: Any, mu: float, *, num_starts: int = 32, steps: int = 4000,
            seed: int = 0) -> tuple[float, np.ndarray]:
  """J* = sup J and its maximiser, by multi-start gradient ascent (float64 numpy).

  Returns ``(J*, theta*)``; the final gradient norm is below 1e-9 for the defaults.
  """
  p = np.asarray(success_prob, np.float64)
  rng = np.random.default_rng(seed)
  lr = 1.0 / smoothness_constant(p, mu)

  def grad(th: np.ndarray) -> np.ndarray:
    z = np.exp(th - th.max(axis=-1, keepdims=True))
    pi = z / z.sum(axis=-1, keepdims=True)
    return pi * (p - (pi @ p)[:, None]) - mu * th

  th = rng.normal(size=(num_starts, p.size)) * 2.0
  for _ in range(steps):
    th = th + lr * grad(th)
  z = np.exp(th - th.max(axis=-1, keepdims=True))
  pi = z / z.sum(axis=-1, keepdims=True)
  vals = pi @ p - 0.5 * mu * np.sum(th**2, axis=-1)
  i = int(np.argmax(vals))
  return float(vals[i]), th[i]


# ---------------------------------------------------------------------------------------
# Constants and bounds of Theorem 1
# ---------------------------------------------------------------------------------------


def d_cal_sq(eps_cal: float, eta: float, sigma: float) -> float:
  """Cumulative intervened second-moment budget, Definition 5 / Eq. 13: ``4 eta^2 eps_cal^2 sigma^2``."""
  return 4.0 * eta**2 * eps_cal**2 * sigma**2


def intervention_surcharge(smooth_l: float, lam: float, dcal_sq: float) -> float:
  """The additive constant of Eq. 23: ``L/2 lam D_cal^2`` (= ``2 L lam eps_cal^2 eta^2 sigma^2``)."""
  return 0.5 * smooth_l * lam * dcal_sq


@dataclasses.dataclass(frozen=True)
class TheoremConstants:
  """The constants of Eq. 9-10. gap = J* - J(theta0) >= 0; lam in [0, 1); eps_clip in [0, 1)."""

  smooth_l: float
  sigma: float
  gap: float
  lam: float
  eps_clip: float
  eps_cal: float
  eta: float

  def __post_init__(self) -> None:
    for name, lo, hi in (("smooth_l", 0.0, math.inf), ("sigma", 0.0, math.inf), ("gap", 0.0, math.inf),
                         ("lam", 0.0, 1.0), ("eps_clip", 0.0, 1.0), ("eps_cal", 0.0, 1.0),
                         ("eta", 0.0, math.inf)):
      v = getattr(self, name)
      if not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v and (v < hi or hi == math.inf)):
        raise ValueError(f"{name}: expected a finite number in [{lo}, {hi}), got {v!r}")

  @property
  def dcal_sq(self) -> float:
    return d_cal_sq(self.eps_cal, self.eta, self.sigma)

  @property
  def surcharge(self) -> float:
    return intervention_surcharge(self.smooth_l, self.lam, self.dcal_sq)


def step_constant(k: TheoremConstants) -> float:
  """c of Eq. 9: ``sqrt(2 [J* - J(theta0) + L/2 lam D_cal^2] / (L (1 + eps_clip)^2 sigma^2))``."""
  return math.sqrt(2.0 * (k.gap + k.surcharge) / (k.smooth_l * (1.0 + k.eps_clip)**2 * k.sigma**2))


def bound_for_alpha(num_iters: int, alpha: float, k: TheoremConstants) -> float:
  """Right side of Eq. 20 for a constant step alpha over K = num_iters iterations."""
  first = (k.gap + k.surcharge) / (num_iters * alpha * (1.0 - k.eps_clip))
  second = k.smooth_l * alpha * (1.0 + k.eps_clip)**2 * k.sigma**2 / (2.0 * (1.0 - k.eps_clip))
  return first + second


def stationarity_bound(num_iters: int, k: TheoremConstants) -> float:
  """Right side of Eq. 10: ``sqrt(2 [gap + L/2 lam D^2] L (1 + eps_clip)^2 sigma^2 / K) / (1 - eps_clip)``."""
  return math.sqrt(2.0 * (k.gap + k.surcharge) * k.smooth_l * (1.0 + k.eps_clip)**2 * k.sigma**2
                   / num_iters) / (1.0 - k.eps_clip)


def cal_step_scale(eps_cal: float, eta: float) -> float:
  """b of ``beta_k = b / (k + 1)``: ``sum_k beta_k^2 (1 + eps_cal)^2 sigma^2 <= 4 eta^2 eps_cal^2 sigma^2``."""
  return 2.0 * eta * eps_cal * math.sqrt(6.0) / (math.pi * (1.0 + eps_cal))


# ---------------------------------------------------------------------------------------
# The stochastic mixed update (jitted)
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
  """Hyper-parameters of the mixed update. group_size G >= 2; kappa: logit boost of pi_cal."""

  lam: float = 0.1
  eps_clip: float = 0.2
  eps_cal: float = 0.2
  eta: float = 2.0
  group_size: int = 8
  kappa: float = 1.0

  def __post_init__(self) -> None:
    for name, lo, hi in (("lam", 0.0, 1.0), ("eps_clip", 0.0, 1.0), ("eps_cal", 0.0, 1.0)):
      v = getattr(self, name)
      if not (isinstance(v, (int, float)) and lo <= v < hi and (name == "lam" or v > 0)):
        raise ValueError(f"{name}: expected a number in {'[' if name == 'lam' else '('}{lo}, {hi}), got {v!r}")
    if not (isinstance(self.eta, (int, float)) and self.eta > 0 and math.isfinite(self.eta)):
      raise ValueError(f"eta: expected a finite number > 0, got {self.eta!r}")
    if not (isinstance(self.kappa, (int, float)) and math.isfinite(self.kappa)):
      raise ValueError(f"kappa: expected a finite number, got {self.kappa!r}")


def on_policy_direction(theta: jax.Array, key: jax.Array, success_prob: jax.Array, mu: float,
                        group_size: int, eps_clip: float) -> jax.Array:
  """Stochastic ``grad J_i``: G pulls, leave-one-out advantages, Eq. 2 surrogate gradient, penalty.

  theta: [A]. Returns [A] with ``E[...] = grad J(theta)`` exactly.
  """
  k_act, k_rew = jax.random.split(key)
  arms = jax.random.categorical(k_act, theta, shape=(group_size,))
  rewards = jax.random.bernoulli(k_rew, success_prob[arms]).astype(jnp.float32)
  # Eq. 1 with std="none" is r - mean; times G/(G-1) it is r_i - mean_{j != i} r_j (unbiased).
  adv = group_advantages(rewards, group_size, std="none") * (group_size / (group_size - 1))

  def loss(th: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(th)[arms][:, None]
    return grpo_loss(logp, jax.lax.stop_gradient(logp), adv, jnp.ones_like(logp),
                     clip_low=eps_clip, clip_high=eps_clip, agg="seq-mean-token-mean")

  return -jax.grad(loss)(theta) - mu * theta


def intervened_direction(theta: jax.Array, best_arm: int, mu: float, eps_cal: float, kappa: float) -> jax.Array:
  """Direction of the intervened pull of the best arm: ``-grad`` of Eq. 7 (advantage 1), penalty.

  The Eq. 6 weight compares ``pi_cal = softmax(theta + kappa e_best)`` with ``pi_roll = pi``.
  theta: [A]. Returns [A] = ``w (e_best - pi) - mu theta`` with ``w`` in [1 - eps_cal, 1 + eps_cal].
  """
  boost = kappa * jax.nn.one_hot(best_arm, theta.shape[0])
  cal_logp = jax.nn.log_softmax(theta + boost)[best_arm].reshape(1, 1)
  mask = jnp.ones((1, 1), jnp.float32)

  def loss(th: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(th)[best_arm].reshape(1, 1)
    roll = jax.lax.stop_gradient(logp)
    return rti_loss(logp, roll, jnp.ones((1,), jnp.float32), mask, cal_logp, roll, mask, eps_cal=eps_cal)

  return -jax.grad(loss)(theta) - mu * theta


@partial(jax.jit, static_argnames=("best_arm", "group_size", "n_seeds"))
def _simulate(key: jax.Array, num_iters: jax.Array, alpha: jax.Array, success_prob: jax.Array,
              theta0: jax.Array, mu: jax.Array, lam: jax.Array, beta_scale: jax.Array,
              eps_clip: jax.Array, eps_cal: jax.Array, kappa: jax.Array, *, best_arm: int,
              group_size: int, n_seeds: int) -> dict[str, jax.Array]:
  """All seeds advance together; statistics are seed means per iteration, reduced over k."""
  theta = jnp.broadcast_to(theta0, (n_seeds,) + theta0.shape)
  on_dir = jax.vmap(on_policy_direction, in_axes=(0, 0, None, None, None, None))
  cal_dir = jax.vmap(intervened_direction, in_axes=(0, None, None, None, None))

  def body(k, carry):
    theta, key, stats = carry
    key, sub = jax.random.split(key)
    keys = jax.random.split(sub, n_seeds)
    grad = objective_grad(theta, success_prob, mu)  # [S, A]
    gnorm2 = jnp.sum(grad**2, axis=-1)
    beta = beta_scale / (k + 1.0)
    d_grpo = alpha * on_dir(theta, keys, success_prob, mu, group_size, eps_clip)
    d_cal_full = beta * cal_dir(theta, best_arm, mu, eps_cal, kappa)
    # RTI intervenes only on groups where all G pulls failed: P = (1 - pi . p)^G.
    pi = jax.nn.softmax(theta, axis=-1)
    p_all_fail = (1.0 - jnp.sum(pi * success_prob, -1)) ** group_size  # [S]
    k_trig = jax.random.split(sub)[0]
    fired = jax.random.bernoulli(k_trig, p_all_fail).astype(jnp.float32)[:, None]
    d_cal = fired * d_cal_full
    step = lam * d_cal + (1.0 - lam) * d_grpo
    new = theta + step
    # Eq. 8 in expectation over this step's sampling: E[step | theta] = (1 - lam) alpha grad + lam P d_cal.
    expected = (1.0 - lam) * alpha * grad + lam * p_all_fail[:, None] * d_cal_full
    align = jnp.mean(jnp.sum(grad * expected, -1)) / (alpha * jnp.mean(gnorm2))
    dgrad = objective_grad(new, success_prob, mu) - grad
    seg_l = jnp.sqrt(jnp.sum(dgrad**2, -1)) / jnp.maximum(jnp.sqrt(jnp.sum(step**2, -1)), 1e-12)
    stats = dict(
        min_grad_sq=jnp.minimum(stats["min_grad_sq"], jnp.mean(gnorm2)),
        cal_sq_sum=stats["cal_sq_sum"] + jnp.sum(d_cal**2, -1),
        max_grpo_second=jnp.maximum(stats["max_grpo_second"], jnp.mean(jnp.sum(d_grpo**2, -1))),
        min_align=jnp.minimum(stats["min_align"], align),
        max_seg_l=jnp.maximum(stats["max_seg_l"], jnp.max(jnp.where(jnp.sum(step**2, -1) > 1e-20, seg_l, 0.0))),
        max_norm=jnp.maximum(stats["max_norm"], jnp.max(jnp.sqrt(jnp.sum(new**2, -1)))),
        max_mu_step=jnp.maximum(stats["max_mu_step"], mu * (lam * beta + (1.0 - lam) * alpha)),
    )
    return new, key, stats

  stats0 = dict(min_grad_sq=jnp.inf, cal_sq_sum=jnp.zeros((n_seeds,)), max_grpo_second=0.0,
                min_align=jnp.inf, max_seg_l=0.0, max_norm=jnp.max(jnp.sqrt(jnp.sum(theta**2, -1))),
                max_mu_step=0.0)
  stats0 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), stats0)
  theta, _, stats = jax.lax.fori_loop(0, num_iters, body, (theta, key, stats0))
  final_grad = objective_grad(theta, success_prob, mu)
  stats["final_grad_sq"] = jnp.mean(jnp.sum(final_grad**2, -1))
  stats["final_value"] = jnp.mean(objective(theta, success_prob, mu))
  stats["cal_sq_sum"] = jnp.mean(stats["cal_sq_sum"])
  return stats


def simulate(problem: BanditProblem, update: UpdateConfig, num_iters: int, *, n_seeds: int = 64,
             seed: int = 0, alpha: float | None = None) -> dict[str, float]:
  """Runs K = num_iters mixed updates for ``n_seeds`` seeds and checks Theorem 1 at this K.

  alpha defaults to ``c / sqrt(K)`` with c of Eq. 9. Returns plain floats:
  ``min_grad_sq`` (left side of Eq. 10), ``bound`` (right side of Eq. 10, or of Eq. 20 when
  alpha is given), ``alpha``, ``c``, ``align_const`` (smallest seed-mean ratio
  ``E<grad J, dtheta> / (alpha E||grad J||^2)``; (8) needs ``>= 1 - eps_clip``),
  ``cal_sq_sum`` (seed mean of ``sum_k ||dtheta_cal^k||^2``; (13) needs ``<= D_cal^2``),
  ``grpo_second_ratio`` (largest ``E||dtheta_grpo||^2 / (alpha^2 (1+eps_clip)^2 sigma^2)``;
  (14) needs ``<= 1``), ``max_segment_l`` (largest ``||grad J(theta') - grad J(theta)|| /
  ||theta' - theta||`` on visited steps; <= L), ``max_norm`` (<= R), the constants and flags.
  """
  if not isinstance(num_iters, int) or num_iters < 1:
    raise ValueError(f"num_iters: expected a positive int, got {num_iters!r}")
  if not isinstance(n_seeds, int) or n_seeds < 1:
    raise ValueError(f"n_seeds: expected a positive int, got {n_seeds!r}")
  if not isinstance(update.group_size, int) or update.group_size < 2:
    raise ValueError(f"group_size: expected an int >= 2, got {update.group_size!r}")
  p, theta0 = problem.arrays()
  smooth_l = smoothness_constant(problem.success_prob, problem.mu)
  sigma = gradient_bound(problem.mu)
  j_star, _ = optimum(problem.success_prob, problem.mu)
  j0 = objective_np(problem.theta0, problem.success_prob, problem.mu)
  consts = TheoremConstants(smooth_l=smooth_l, sigma=sigma, gap=max(j_star - j0, 0.0), lam=update.lam,
                            eps_clip=update.eps_clip, eps_cal=update.eps_cal, eta=update.eta)
  c = step_constant(consts)
  use_alpha = c / math.sqrt(num_iters) if alpha is None else float(alpha)
  if not use_alpha > 0:
    raise ValueError(f"alpha: expected a number > 0, got {alpha!r}")
  beta_scale = cal_step_scale(update.eps_cal, update.eta)
  # The "rbg" generator compiles several times faster than threefry on CPU; same seed, same numbers.
  stats = _simulate(jax.random.key(seed, impl="rbg"), jnp.int32(num_iters), jnp.float32(use_alpha), p, theta0,
                    jnp.float32(problem.mu), jnp.float32(update.lam), jnp.float32(beta_scale),
                    jnp.float32(update.eps_clip), jnp.float32(update.eps_cal), jnp.float32(update.kappa),
                    best_arm=problem.best_arm, group_size=update.group_size, n_seeds=n_seeds)
  out = {k: float(v) for k, v in stats.items()}
  bound = stationarity_bound(num_iters, consts) if alpha is None else bound_for_alpha(num_iters, use_alpha, consts)
  out.update(
      num_iters=num_iters, alpha=use_alpha, c=c, bound=bound, smooth_l=smooth_l, sigma=sigma,
      j_star=j_star, j0=j0, dcal_sq=consts.dcal_sq, surcharge=consts.surcharge, lam=update.lam,
      eps_cal=update.eps_cal, eps_clip=update.eps_clip, radius=invariant_radius(problem.mu),
      align_const=out.pop("min_align"),
      grpo_second_ratio=out.pop("max_grpo_second") / (use_alpha**2 * (1 + update.eps_clip)**2 * sigma**2),
      max_segment_l=out.pop("max_seg_l"),
  )
  out["holds_8"] = out["align_const"] >= 1.0 - update.eps_clip
  out["holds_13"] = out["cal_sq_sum"] <= consts.dcal_sq
  out["holds_14"] = out["grpo_second_ratio"] <= 1.0
  out["within_ball"] = out["max_norm"] <= out["radius"] and out["max_mu_step"] <= 1.0
  out["under_bound"] = out["min_grad_sq"] <= bound
  return out


def loglog_slope(xs: Any, ys: Any) -> float:
  """Least-squares slope of ``log y`` against ``log x``."""
  x = np.asarray(xs, np.float64)
  y = np.asarray(ys, np.float64)
  if x.shape != y.shape or x.size < 2 or not (np.all(np.isfinite(y)) and np.all(y > 0) and np.all(x > 0)):
    raise ValueError(f"ys: expected >= 2 positive finite values matching xs, got xs={xs!r}, ys={ys!r}")
  lx, ly = np.log(x), np.log(y)
  return float(np.polyfit(lx, ly, 1)[0])


def sweep_iterations(problem: BanditProblem, update: UpdateConfig, iters: Any, *, n_seeds: int = 64,
                     seed: int = 0) -> list[dict[str, float]]:
  """``simulate`` at each K in ``iters`` (alpha = c / sqrt(K) each time)."""
  return [simulate(problem, update, int(k), n_seeds=n_seeds, seed=seed) for k in iters]
