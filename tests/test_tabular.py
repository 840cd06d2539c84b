"""Tests of the tabular RTI model (rti_jax/theory/tabular.py) and its experiment script."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rti_jax import metrics
from rti_jax.theory import tabular as TB

pytestmark = pytest.mark.usefixtures("optimised_xla")  # long simulation loops: see tests/conftest.py
WORLD = TB.TabularWorld()


def _softmax(x: np.ndarray) -> np.ndarray:
  z = np.exp(x - x.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def _params(**kw) -> dict[str, jax.Array]:
  return {k: jnp.asarray(v[0]) for k, v in TB._stack_params([TB.Variant("v", **kw)]).items()}


def test_world_is_deterministic_and_matches_its_description():
  correct, theta0 = WORLD.build()
  c2, t2 = WORLD.build()
  np.testing.assert_array_equal(correct, c2)
  np.testing.assert_array_equal(theta0, t2)
  pi = _softmax(theta0.astype(np.float64))
  np.testing.assert_allclose(pi.sum(-1), 1.0, atol=1e-6)
  p_dec = np.take_along_axis(pi[:, 0, :], correct[:, :1], -1)[:, 0]
  assert np.all((p_dec >= WORLD.decisive_prob[0] * 0.999) & (p_dec <= WORLD.decisive_prob[1] * 1.001))
  p_later = np.take_along_axis(pi[:, 1:, :], correct[:, 1:, None], -1)[..., 0]
  assert np.all((p_later >= WORLD.later_prob[0] * 0.999) & (p_later <= WORLD.later_prob[1] * 1.001))
  np.testing.assert_allclose(pi[:, 0, WORLD.leak_token], WORLD.leak_prob0, rtol=1e-3)
  assert np.all(correct < WORLD.num_actions)
  assert not np.array_equal(dataclasses.replace(WORLD, world_seed=1).build()[0], correct)


def test_success_probability_matches_brute_force_enumeration():
  correct, theta0 = WORLD.build()
  rng = np.random.default_rng(0)
  theta = theta0 + rng.normal(size=theta0.shape).astype(np.float32)
  got = np.asarray(TB.success_probability(jnp.asarray(theta), jnp.asarray(correct)))
  pi = _softmax(theta.astype(np.float64))
  v1 = WORLD.num_actions + 1
  for m in range(4):
    total = 0.0
    for seq in itertools.product(range(v1), repeat=WORLD.horizon):
      if list(seq) == list(correct[m]):
        total += np.prod([pi[m, h, a] for h, a in enumerate(seq)])
    assert got[m] == pytest.approx(total, rel=1e-5)


def test_exact_pass_metrics_match_sampled_unbiased_estimators():
  p = np.array([0.0, 0.05, 0.3, 0.7, 1.0])
  exact = {k: float(v) for k, v in TB.exact_pass_metrics(jnp.asarray(p, jnp.float32)).items()}
  rng = np.random.default_rng(1)
  succ = rng.random((len(p), 20000)) < p[:, None]
  for k in TB.PAPER_KS:
    assert exact[f"pass@{k}"] == pytest.approx(metrics.mean_pass_at_k(succ, k), abs=0.01)
    assert exact[f"pass^{k}"] == pytest.approx(metrics.mean_pass_hat_k(succ, k), abs=0.01)


def _one_task_world() -> tuple[np.ndarray, np.ndarray]:
  theta = np.log(np.array([[[0.01, 0.5, 0.2, 0.24, 0.05], [0.1, 0.6, 0.1, 0.1, 1e-6], [0.2, 0.2, 0.5, 0.1, 1e-6]]]))
  return np.array([[0, 1, 2]], np.int32), theta.astype(np.float32)


def test_oracle_correction_fixes_every_derailing_step_with_eq3_perplexity():
  correct, theta = _one_task_world()
  rollout = jnp.asarray([[1, 1, 3]])  # derails at steps 0 and 2
  out = jax.jit(lambda k: TB.intervene(jnp.asarray(theta), jnp.asarray(correct), rollout, k,
                                       _params(p_leak=0.0, delta=5.0), WORLD))(jax.random.key(0, impl="rbg"))
  np.testing.assert_array_equal(np.asarray(out["tokens"]), correct)
  np.testing.assert_array_equal(np.asarray(out["mask"]), [[True, False, True]])
  r = WORLD.reason_len
  ppl = [math.exp(-(r * math.log(WORLD.q_plain) + math.log(p)) / (r + 1)) for p in (0.01, 0.5)]
  assert float(out["ppl"][0]) == pytest.approx(max(ppl), rel=1e-5)
  assert bool(out["gated"][0]) == (max(ppl) <= 5.0)
  assert bool(out["verified"][0]) and not bool(out["leaked"][0])
  strict = jax.jit(lambda k: TB.intervene(jnp.asarray(theta), jnp.asarray(correct), rollout, k,
                                          _params(p_leak=0.0, delta=1.5), WORLD))(jax.random.key(0, impl="rbg"))
  assert not bool(strict["gated"][0])  # 1.5 < PPL: rejected by Eq. 4


def test_leaking_correction_writes_shortcut_and_verifier_catches_it():
  correct, theta = _one_task_world()
  rollout = jnp.asarray([[0, 3, 3]])  # step 0 right, derails at step 1
  run = jax.jit(lambda k, p: TB.intervene(jnp.asarray(theta), jnp.asarray(correct), rollout, k, p, WORLD))
  r = WORLD.reason_len
  # The step-1 shortcut has policy probability ~1e-6 and n in 0..R quoted reasoning tokens (Eq. 3).
  pi_leak = _softmax(theta[0, 1].astype(np.float64))[WORLD.leak_token]
  possible = [math.exp(-(n * math.log(WORLD.q_quote) + (r - n) * math.log(WORLD.q_plain) + math.log(pi_leak)) / (r + 1))
              for n in range(r + 1)]
  seen = set()
  for seed in range(8):
    key = jax.random.key(seed, impl="rbg")
    out = run(key, _params(p_leak=1.0, v_detect=1.0, delta=math.inf))
    tok = np.asarray(out["tokens"])[0]
    assert tok[0] == 0 and tok[1] == WORLD.leak_token and 0 <= tok[2] < WORLD.num_actions
    np.testing.assert_array_equal(np.asarray(out["mask"])[0], [False, True, True])
    assert bool(out["leaked"][0]) and not bool(out["verified"][0])
    rel = [abs(float(out["ppl"][0]) - p) / p for p in possible]
    assert min(rel) < 1e-4
    seen.add(int(np.argmin(rel)))
    assert bool(run(key, _params(p_leak=1.0, v_detect=0.0))["verified"][0])  # no Post-Check
  assert len(seen) >= 2  # the number of quoted tokens varies


def _numpy_update(policy: dict[str, np.ndarray], batch: dict[str, np.ndarray], eps_cal: float,
                  train: TB.TrainConfig) -> tuple[dict[str, np.ndarray], int]:
  """Independent re-derivation of the Eq. 7 gradient steps for a tabular softmax, in float64.

  Returns the new policy and the number of (token, epoch) pairs the Eq. 2 clip zeroed.
  """
  task, shared = policy["task"].astype(np.float64), policy["shared"].astype(np.float64)
  tokens = batch["tokens"]
  m, g, h = tokens.shape
  b = m * g
  adv = batch["advantages"].reshape(m, g)
  old = batch["old_logp"].reshape(m, g, h)
  w = np.where(batch["weight_mask"].reshape(m, g, h) > 0,
               np.clip(np.exp(batch["cal_logp"].reshape(m, g, h) - old), 1 - eps_cal, 1 + eps_cal), 1.0)
  n_clipped = 0
  for _ in range(train.n_epochs):
    pi = _softmax(task + shared[None])  # [M, H, V+1]
    grad = np.zeros_like(task)
    for i, j, t in itertools.product(range(m), range(g), range(h)):
      a = tokens[i, j, t]
      ratio = np.exp(np.log(pi[i, t, a]) - old[i, j, t])
      clipped = (adv[i, j] > 0 and ratio > 1 + train.eps_clip) or (adv[i, j] < 0 and ratio < 1 - train.eps_clip)
      if clipped:
        n_clipped += 1
        continue
      dlogp = -pi[i, t].copy()
      dlogp[a] += 1.0
      grad[i, t] += -(m / (b * h)) * w[i, j, t] * adv[i, j] * ratio * dlogp
    task = task - train.lr * grad
    shared = shared - train.lr * train.shared_lr_scale * grad.sum(0)
  return dict(task=task, shared=shared), n_clipped


@pytest.mark.parametrize("n_epochs", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_policy_update_matches_numpy_eq7_gradient_steps(n_epochs):
  world = dataclasses.replace(WORLD, num_tasks=3)
  correct, theta0 = world.build()
  rng = np.random.default_rng(2)
  policy = dict(task=jnp.asarray(theta0 + rng.normal(size=theta0.shape).astype(np.float32)),
                shared=jnp.asarray(rng.normal(size=theta0.shape[1:]).astype(np.float32) * 0.3))
  train = TB.TrainConfig(lr=0.8, n_epochs=n_epochs, group_size=4)
  params = _params(delta=math.inf, p_leak=0.5, v_detect=0.0, eps_cal=0.2)
  logits = TB.policy_logits(policy)
  batch = jax.jit(lambda k: TB.collect_batch(logits, k, params, jnp.asarray(correct), world, 4))(
      jax.random.key(3, impl="rbg"))
  got = jax.jit(lambda p, bt: TB.policy_update(p, bt, params["eps_cal"], train))(policy, batch)
  npb = jax.tree.map(np.asarray, batch)
  assert npb["weight_mask"].sum() > 0  # the test exercises intervened rows
  want, n_clipped = _numpy_update(jax.tree.map(np.asarray, policy), npb, 0.2, train)
  assert (n_clipped > 0) == (n_epochs > 1)  # epoch 1 has ratio 1; later epochs hit the clip
  for k in ("task", "shared"):
    np.testing.assert_allclose(np.asarray(got[k]), want[k], atol=2e-5)
  moved = np.abs(np.asarray(got["task"]) - np.asarray(policy["task"])).max()
  assert moved > 1e-3


def test_collect_batch_replaces_rollout_zero_only_in_all_fail_groups():
  correct, theta0 = WORLD.build()
  params = _params(delta=math.inf, p_leak=0.0)
  batch = jax.jit(lambda k: TB.collect_batch(jnp.asarray(theta0), k, params, jnp.asarray(correct), WORLD, 8))(
      jax.random.key(4, impl="rbg"))
  bt = jax.tree.map(np.asarray, batch)
  rewards = bt["rewards"].reshape(WORLD.num_tasks, 8)
  np.testing.assert_array_equal(bt["accepted"], bt["all_fail"])  # oracle, no gate: every all-fail group fixed
  assert bt["accepted"].sum() > 20
  np.testing.assert_array_equal(rewards[bt["accepted"], 0], 1.0)
  np.testing.assert_array_equal(rewards[bt["accepted"], 1:], 0.0)
  np.testing.assert_array_equal(bt["tokens"][bt["accepted"], 0], correct[bt["accepted"]])
  wm = bt["weight_mask"].reshape(WORLD.num_tasks, 8, WORLD.horizon)
  assert wm[:, 1:].sum() == 0 and wm[~bt["accepted"]].sum() == 0
  # Eq. 1 on the replaced group: one success among G = 8 -> (1 - 1/8) / sqrt(1/8 * 7/8).
  adv = bt["advantages"].reshape(WORLD.num_tasks, 8)
  assert adv[bt["accepted"], 0] == pytest.approx(np.full(bt["accepted"].sum(), math.sqrt(7.0)), rel=1e-4)


def test_bad_configuration_raises_named_errors():
  with pytest.raises(ValueError, match="quote_dist"):
    TB.TabularWorld(quote_dist=(0.5, 0.5))
  with pytest.raises(ValueError, match="decisive_prob"):
    TB.TabularWorld(decisive_prob=(0.1, 0.01))
  with pytest.raises(ValueError, match="num_tasks"):
    TB.TabularWorld(num_tasks=0)
  with pytest.raises(ValueError, match="delta"):
    TB.Variant("x", delta=-1.0)
  with pytest.raises(ValueError, match="p_leak"):
    TB.Variant("x", p_leak=1.5)
  with pytest.raises(ValueError, match="eps_cal"):
    TB.Variant("x", eps_cal=0.0)
  with pytest.raises(ValueError, match="group_size"):
    TB.TrainConfig(group_size=1)
  with pytest.raises(ValueError, match="lr"):
    TB.TrainConfig(lr=0.0)
  with pytest.raises(ValueError, match="variants"):
    TB.train_variants([TB.Variant("a"), TB.Variant("a")])
  with pytest.raises(ValueError, match="variants"):
    TB.train_variants([])


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
  from experiments import tabular as exp
  out = tmp_path_factory.mktemp("tabular")
  return exp, exp.run(exp.TabularConfig(), out), out


@pytest.mark.slow
def test_experiment_writes_json_and_pngs(experiment):
  _, res, out = experiment
  saved = json.loads((out / "results.json").read_text())
  assert set(saved["summaries"]) >= {"GRPO", "RTI", "RTI w/o Post-Check", "delta=inf"}
  for name in ("tabular_ablation.png", "tabular_delta_sweep.png", "tabular_dynamics.png"):
    assert (out / name).stat().st_size > 1000
  assert all(saved["orderings"].values())
  assert saved["delta0_equals_grpo"] is True
  assert res["summaries"]["RTI"]["pass@1"] == pytest.approx(saved["summaries"]["RTI"]["pass@1"])


@pytest.mark.slow
def test_delta_zero_reproduces_grpo_exactly(experiment):
  _, res, _ = experiment
  hist = res["history"]
  for k in TB.POLICY_METRICS:
    np.testing.assert_array_equal(hist["delta=0"][k], hist["GRPO"][k])
  assert hist["delta=0"]["accepted"].sum() == 0 and hist["delta=0"]["gate_rejected"].sum() > 0
  assert hist["GRPO"]["triggered"].sum() == 0
  assert not np.array_equal(hist["delta=5"]["pass@1"], hist["GRPO"]["pass@1"])


@pytest.mark.slow
def test_grpo_stalls_and_rti_with_oracle_gate_and_reweighting_learns(experiment):
  _, res, _ = experiment
  s = res["summaries"]
  p0 = res["history"]["GRPO"]["pass@1"][:, 0].mean()
  assert p0 < 0.01  # the decisive early action is rarely sampled
  assert s["GRPO"]["pass@1"] < 0.35
  assert s["RTI (oracle, no leaks)"]["pass@1"] > 0.9
  assert s["RTI"]["pass@1"] > s["GRPO"]["pass@1"] + 0.3
  assert s["RTI"]["total_accepted"] > 100


@pytest.mark.slow
def test_leaking_corrector_without_verifier_harms_learning(experiment):
  _, res, _ = experiment
  s, hist = res["summaries"], res["history"]
  assert s["RTI w/o Post-Check"]["total_leaks_accepted"] > 3 * s["RTI"]["total_leaks_accepted"]
  assert s["RTI w/o Post-Check"]["leak_mass"] > 3 * s["RTI"]["leak_mass"]
  diff = hist["RTI"]["pass@1"][:, -10:].mean(1) - hist["RTI w/o Post-Check"]["pass@1"][:, -10:].mean(1)
  assert diff.mean() > 0.1 and np.all(diff > 0)  # worse on every seed, by 10 points on average
  assert s["RTI w/o Post-Check"]["pass@1"] < s["RTI (oracle, no leaks)"]["pass@1"] - 0.3


@pytest.mark.slow
def test_delta_sweep_has_the_papers_shape(experiment):
  _, res, _ = experiment
  hist = res["history"]
  final = {d: hist[f"delta={d}"]["pass@1"][:, -10:].mean(1) for d in ("0", "3", "5", "20", "inf")}
  means = {d: v.mean() for d, v in final.items()}
  assert means["0"] < means["3"] < means["5"]
  assert means["20"] < means["5"] and means["inf"] < means["5"]
  # Paired over seeds, the moderate gate beats both extremes by several standard errors.
  for other in ("3", "20", "inf"):
    d = final["5"] - final[other]
    assert d.mean() > 3 * d.std(ddof=1) / math.sqrt(len(d)), other
  assert res["summaries"]["RTI w/o PPL Gating"]["pass@1"] == res["summaries"]["delta=inf"]["pass@1"]


@pytest.mark.slow
def test_training_is_deterministic_for_a_fixed_seed(experiment):
  exp, res, _ = experiment
  again = TB.train_variants(TB.ablation_variants() + TB.delta_variants(), exp.TabularConfig().world,
                            exp.TabularConfig().train)
  for name in ("RTI", "GRPO", "delta=20"):
    for k in ("pass@1", "accepted", "leaks_accepted"):
      np.testing.assert_array_equal(again[name][k], res["history"][name][k])
