"""Tests of the Theorem-1 check (rti_jax/theory/theorem.py) against independent references."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rti_jax.theory import theorem as T

pytestmark = pytest.mark.usefixtures("optimised_xla")  # long simulation loops: see tests/conftest.py
P = np.array([0.9, 0.5, 0.3, 0.1])
MU = 1.0
SEEDS = 16  # one n_seeds everywhere: one compilation of the simulator for the whole file


def _softmax(x: np.ndarray) -> np.ndarray:
  z = np.exp(x - x.max())
  return z / z.sum()


def _fd_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
  return np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size)])


def test_gradient_matches_finite_differences_of_numpy_objective():
  rng = np.random.default_rng(0)
  for _ in range(5):
    th = rng.normal(size=4) * 2
    fd = _fd_grad(lambda t: T.objective_np(t, P, MU), th)
    got = np.asarray(T.objective_grad(jnp.asarray(th, jnp.float32), jnp.asarray(P, jnp.float32), MU))
    np.testing.assert_allclose(got, fd, atol=2e-5)


def test_hessian_formula_matches_autodiff_hessian():
  rng = np.random.default_rng(1)
  hess = jax.jit(jax.hessian(lambda t: T.objective(t, jnp.asarray(P, jnp.float32), MU)))
  for _ in range(5):
    th = rng.normal(size=4) * 2
    auto = hess(jnp.asarray(th, jnp.float32))
    np.testing.assert_allclose(T.objective_hessian(th, P, MU), np.asarray(auto), atol=2e-5)


def test_certified_smoothness_bounds_hessian_and_is_not_vacuous():
  rng = np.random.default_rng(2)
  for p in (P, np.array([1.0, 0.0, 0.0]), rng.uniform(size=6)):
    cert = T.smoothness_constant(p, 0.3)
    norms = [np.linalg.norm(T.objective_hessian(rng.normal(size=p.size) * s, p, 0.3), 2)
             for s in (0.1, 1.0, 3.0, 10.0) for _ in range(500)]
    assert max(norms) <= cert + 1e-9
  # The sup over theta is at least half the certified constant for the default problem.
  assert T.numeric_smoothness(P, MU, num_samples=1500) >= 0.5 * T.smoothness_constant(P, MU)


def test_optimum_matches_brute_force_grid():
  p = np.array([0.8, 0.4, 0.1])
  j_star, th_star = T.optimum(p, MU)
  g = np.linspace(-1.5, 1.5, 121)
  grid = np.stack(np.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)
  z = np.exp(grid - grid.max(-1, keepdims=True))
  vals = (z / z.sum(-1, keepdims=True)) @ p - 0.5 * MU * np.sum(grid**2, -1)
  assert j_star >= vals.max() - 1e-12
  assert j_star - vals.max() < 2e-3
  assert np.linalg.norm(_fd_grad(lambda t: T.objective_np(t, p, MU), th_star)) < 1e-6


def test_on_policy_direction_is_unbiased():
  th = jnp.asarray([-1.0, 0.5, 0.2, 0.0], jnp.float32)
  keys = jax.random.split(jax.random.PRNGKey(3), 20000)
  fn = jax.jit(jax.vmap(lambda t, k: T.on_policy_direction(t, k, jnp.asarray(P, jnp.float32), MU, 8, 0.2),
                        in_axes=(None, 0)))
  dirs = fn(th, keys)
  dirs = np.asarray(dirs)
  mean, se = dirs.mean(0), dirs.std(0) / math.sqrt(len(dirs))
  want = np.asarray(T.objective_grad(th, jnp.asarray(P, jnp.float32), MU))
  assert np.all(np.abs(mean - want) < 4 * se + 1e-6)
  # Definition 3 on the ball: every per-step direction is within sigma.
  assert np.linalg.norm(dirs, axis=-1).max() <= T.gradient_bound(MU)


def test_intervened_direction_matches_numpy_eq6_weight():
  th = np.array([-2.0, 1.0, 1.0, 0.5])
  for eps_cal, kappa in ((0.2, 1.0), (0.5, 0.1), (0.3, -2.0)):
    pi = _softmax(th)
    boosted = th + kappa * np.eye(4)[0]
    ratio = _softmax(boosted)[0] / pi[0]
    w = min(max(ratio, 1 - eps_cal), 1 + eps_cal)
    want = w * (np.eye(4)[0] - pi) - MU * th
    got = jax.jit(T.intervened_direction, static_argnums=(1,))(jnp.asarray(th, jnp.float32), 0, MU, eps_cal, kappa)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_eq10_is_eq20_at_optimal_c_and_c_minimises_eq20():
  k = T.TheoremConstants(smooth_l=2.0, sigma=3.0, gap=1.5, lam=0.2, eps_clip=0.2, eps_cal=0.2, eta=2.0)
  for n in (10, 1000, 10**6):
    c = T.step_constant(k)
    at_c = T.bound_for_alpha(n, c / math.sqrt(n), k)
    assert at_c == pytest.approx(T.stationarity_bound(n, k), rel=1e-12)
    alphas = np.geomspace(1e-4, 10, 4001) * c / math.sqrt(n)
    assert min(T.bound_for_alpha(n, a, k) for a in alphas) == pytest.approx(at_c, rel=1e-6)
  ks = np.array([10, 100, 1000, 10000])
  assert T.loglog_slope(ks, [T.stationarity_bound(int(n), k) for n in ks]) == pytest.approx(-0.5, abs=1e-12)


def test_surcharge_grows_with_lam_and_eps_cal_and_vanishes_at_lam_zero():
  def make(lam, eps_cal):
    return T.TheoremConstants(smooth_l=2.0, sigma=3.0, gap=1.0, lam=lam, eps_clip=0.2, eps_cal=eps_cal, eta=2.0)

  # Eq. 23: L/2 lam D^2 = 2 L lam eps_cal^2 eta^2 sigma^2.
  assert make(0.3, 0.2).surcharge == pytest.approx(2 * 2.0 * 0.3 * 0.04 * 4.0 * 9.0)
  lams, epss = (0.0, 0.1, 0.2, 0.5), (0.1, 0.2, 0.3)
  table = np.array([[make(l, e).surcharge for l in lams] for e in epss])
  assert np.all(table[:, 0] == 0.0)
  assert np.all(np.diff(table[:, 1:], axis=1) > 0) and np.all(np.diff(table[:, 1:], axis=0) > 0)
  # At lam = 0 the bound is the GRPO-style bound, whatever eps_cal and eta.
  grpo = T.stationarity_bound(1000, make(0.0, 0.1))
  assert T.stationarity_bound(1000, dataclasses.replace(make(0.0, 0.9), eta=50.0)) == grpo
  assert T.stationarity_bound(1000, make(0.1, 0.1)) > grpo


def test_cal_step_schedule_realises_definition_5_budget():
  eps_cal, eta, sigma = 0.2, 2.0, 3.0
  b = T.cal_step_scale(eps_cal, eta)
  partial = b**2 * (1 + eps_cal)**2 * sigma**2 * np.sum(1.0 / np.arange(1, 10**6 + 1)**2)
  d2 = T.d_cal_sq(eps_cal, eta, sigma)
  assert partial <= d2
  assert partial == pytest.approx(d2, rel=1e-5)


@pytest.fixture(scope="module")
def sweep() -> dict[float, list[dict]]:
  problem = T.BanditProblem()
  return {lam: T.sweep_iterations(problem, T.UpdateConfig(lam=lam), [100, 1000, 10000], n_seeds=SEEDS)
          for lam in (0.0, 0.1)}


@pytest.mark.slow
def test_min_grad_norm_stays_under_eq10_bound_and_assumptions_hold(sweep):
  for lam, res in sweep.items():
    for r in res:
      assert r["min_grad_sq"] <= r["bound"], (lam, r)
      assert r["holds_8"] and r["holds_13"] and r["holds_14"] and r["within_ball"], (lam, r)
      assert r["max_segment_l"] <= r["smooth_l"]
      assert 0.0 < r["min_grad_sq"] < 0.5  # a real, non-trivial measurement
    # The minimum falls by more than a decade over the two decades of K.
    assert res[-1]["min_grad_sq"] < 0.1 * res[0]["min_grad_sq"]


@pytest.mark.slow
def test_measured_slope_is_about_minus_one_half_in_noise_dominated_regime():
  res = T.sweep_iterations(T.BanditProblem(), T.UpdateConfig(lam=0.1), [1000, 3000, 10000, 30000], n_seeds=SEEDS)
  slope = T.loglog_slope([r["num_iters"] for r in res], [r["min_grad_sq"] for r in res])
  assert -0.85 < slope < -0.35, slope
  assert all(r["min_grad_sq"] <= r["bound"] for r in res)


def test_alignment_constant_is_one_minus_lam_when_intervention_never_fires():
  # With success probability 1 on every arm no group ever fails: the update is pure on-policy.
  problem = T.BanditProblem(success_prob=(1.0, 1.0, 1.0, 1.0))
  r = T.simulate(problem, T.UpdateConfig(lam=0.25), 200, n_seeds=SEEDS)
  assert r["align_const"] == pytest.approx(0.75, abs=1e-3)
  assert not r["holds_8"]  # 0.75 < 1 - eps_clip = 0.8: reported, not hidden


def test_bad_arguments_raise_named_errors():
  with pytest.raises(ValueError, match="success_prob"):
    T.BanditProblem(success_prob=(1.5, 0.2), theta0=(0.0, 0.0))
  with pytest.raises(ValueError, match="theta0"):
    T.BanditProblem(theta0=(10.0, 0.0, 0.0, 0.0))
  with pytest.raises(ValueError, match="mu"):
    T.BanditProblem(mu=0.0)
  with pytest.raises(ValueError, match="lam"):
    T.TheoremConstants(smooth_l=1.0, sigma=1.0, gap=1.0, lam=1.0, eps_clip=0.2, eps_cal=0.2, eta=1.0)
  with pytest.raises(ValueError, match="eps_cal"):
    T.UpdateConfig(eps_cal=0.0)
  with pytest.raises(ValueError, match="lam"):
    T.UpdateConfig(lam=1.0)
  with pytest.raises(ValueError, match="eta"):
    T.UpdateConfig(eta=-1.0)
  with pytest.raises(ValueError, match="num_iters"):
    T.simulate(T.BanditProblem(), T.UpdateConfig(), 0)
  with pytest.raises(ValueError, match="group_size"):
    T.simulate(T.BanditProblem(), T.UpdateConfig(group_size=1), 10)
  with pytest.raises(ValueError, match="ys"):
    T.loglog_slope([1, 2], [1.0, 0.0])


@pytest.mark.slow
def test_experiment_run_writes_json_and_pngs(tmp_path):
  from experiments import theorem as exp
  cfg = exp.TheoremConfig(iters=(100, 1000), lams=(0.0, 0.1), surcharge_lams=(0.0, 0.2), surcharge_eps_cals=(0.1,),
                          surcharge_iters=100, n_seeds=SEEDS, slope_from=100, method_iters=200,
                          method_alphas=(0.3,), method_epochs=(1, 4), method_seeds=8, method_adv_stds=("population",))
  res = exp.run(cfg, tmp_path)
  saved = json.loads((tmp_path / "results.json").read_text())
  assert set(saved["sweeps"]) == {"0", "0.1"}
  assert (tmp_path / "theorem_k_sweep.png").stat().st_size > 1000
  assert (tmp_path / "theorem_surcharge.png").stat().st_size > 1000
  assert (tmp_path / "theorem_method.png").stat().st_size > 1000
  runs = saved["method"]["runs"]
  assert [(r["epochs"], r["intervene"]) for r in runs] == [(1, True), (1, False), (4, True), (4, False)]
  assert runs[0]["lam"] > 0 and runs[1]["lam"] == 0 and runs[0]["clip_frac"] == 0 and runs[2]["clip_frac"] > 0
  assert all(r["notes"] for r in runs) and len(runs[0]["curves"]["triggered"]) == 200
  assert len(saved["method"]["effect"]) == 2
  sur = {s["lam"]: s["surcharge"] for s in res["surcharge"]}
  assert sur[0.0] == 0.0 and sur[0.2] > 0.0
