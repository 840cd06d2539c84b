"""A fast tabular model of the whole RTI method (Section 4, Eq. 1-7), in seconds on a CPU.

The world
---------
``num_tasks`` tasks; for each, the policy writes ``horizon`` steps. Each step is one *decision
token* (one of ``num_actions`` actions, or the shortcut token ``LEAK = num_actions``) preceded
by ``reason_len`` reasoning tokens. A trajectory succeeds iff every decision equals the task's
correct action (``correct: [M, H]``). The policy is a table of logits ``theta: [M, H, V+1]``
(``V = num_actions``), one softmax per (task, step); reasoning tokens are not learned: under
the policy a plain reasoning token has log-probability ``log q_plain`` and a token that quotes
the reward-side evidence has ``log q_quote`` (the policy never quotes what it cannot see).

At the start the *decisive* first step's correct action is rare (probability drawn
log-uniformly in ``decisive_prob``), the later steps are likely (``later_prob``), so GRPO sees
a success in few groups and stalls.

RTI (Section 4), only for groups in which all G rollouts failed:

* Validator + Corrector (an oracle): replays rollout 0 of the group and rewrites every
  derailing decision to the correct one (reasoning tokens plain). With probability ``p_leak``
  the Corrector *leaks* instead: at the first derailing step it writes the shortcut token
  ``LEAK`` (copying the reward-side answer), with ``n ~ quote_dist`` of its reasoning tokens
  quoting the evidence. The leaked trajectory scores 1 at training time (the copied answer
  is right), but the shortcut is unlearnable: when the policy itself emits ``LEAK`` it has
  nothing to copy and fails (reward 0), at training and at evaluation.
* Verifier (post-check): rejects a leaked correction with probability ``v_detect``; an
  oracle correction is always accepted. ``v_detect = 0`` is "RTI w/o Post-Check".
* PPL gate, Eq. 3-4: each corrected step (its reasoning tokens and decision) is rescored
  under the rollout policy; the correction is kept iff every corrected step has
  ``PPL <= delta``. ``delta = 0`` rejects all (the GRPO run, exactly), ``delta = inf`` none.
* The accepted trajectory replaces rollout 0 (reward 1); Eq. 1 advantages; the loss is the
  library's Eq. 7 ``rti_loss`` whose calibration weights (Eq. 5-6) compare the corrector's
  distribution ``pi_cal = softmax(theta + kappa e_written)`` with ``pi_roll = softmax(theta)``
  on the intervened decision tokens (``reweight = 0`` gives weight 1: "w/o Reweight").

Training is ``n_epochs`` SGD steps per iteration on the same batch (``old_logp`` fixed, so the
Eq. 2 clip acts from the second epoch). Evaluation is exact: a task's success probability is
``P_m = prod_h pi(correct_mh)`` and ``Pass@k = mean_m 1 - (1 - P_m)^k``, ``Pass^k = mean_m P_m^k``
(the expectations of the unbiased estimators in ``rti_jax.metrics``).

Everything numerical about a variant is a traced array, so all variants and seeds run in one
jitted, vmapped ``lax.scan``; the same seed gives the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rti_jax.objectives import group_advantages, ppl_gate, rti_loss, sequence_perplexity

PAPER_KS = (1, 2, 3, 4)
POLICY_METRICS = tuple([f"pass@{k}" for k in PAPER_KS] + [f"pass^{k}" for k in PAPER_KS]
                       + ["group_success_pre", "group_success_post", "leak_mass", "all_fail_groups"])
"""Metrics of the policy and the training batches (not intervention bookkeeping): equal for GRPO and delta = 0."""


# ---------------------------------------------------------------------------------------
# World and variants
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TabularWorld:
  """Static description of the tasks (see the module docstring). All fields are plain numbers."""

  num_tasks: int = 32
  horizon: int = 3
  num_actions: int = 4
  reason_len: int = 7
  decisive_prob: tuple[float, float] = (0.0002, 0.02)
  later_prob: tuple[float, float] = (0.55, 0.8)
  leak_prob0: float = 0.05
  q_plain: float = 0.9
  q_quote: float = 0.002
  quote_dist: tuple[float, ...] = (0.3, 0.1, 0.2, 0.2, 0.05, 0.05, 0.05, 0.05)
  world_seed: int = 0

  def __post_init__(self) -> None:
    for name in ("num_tasks", "horizon", "num_actions", "reason_len"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")
    if self.num_actions < 2:
      raise ValueError(f"num_actions: expected >= 2, got {self.num_actions}")
    for name in ("decisive_prob", "later_prob"):
      lo, hi = getattr(self, name)
      if not 0 < lo <= hi < 1:
        raise ValueError(f"{name}: expected 0 < low <= high < 1, got {getattr(self, name)}")
    for name in ("leak_prob0", "q_plain", "q_quote"):
      v = getattr(self, name)
      if not 0 < v < 1:
        raise ValueError(f"{name}: expected a probability in (0, 1), got {v!r}")
    if self.decisive_prob[1] + self.leak_prob0 >= 1:
      raise ValueError(f"decisive_prob: expected high + leak_prob0 < 1, got {self.decisive_prob} and {self.leak_prob0}")
    q = np.asarray(self.quote_dist, np.float64)
    if q.shape != (self.reason_len + 1,) or np.any(q < 0) or abs(q.sum() - 1) > 1e-6:
      raise ValueError(f"quote_dist: expected {self.reason_len + 1} probabilities summing to 1 "
                       f"(P[n quoted reasoning tokens], n = 0..reason_len), got {self.quote_dist}")

  @property
  def leak_token(self) -> int:
    return self.num_actions

  def build(self) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(correct: [M, H] int32, theta0: [M, H, V+1] float32)``, deterministic in world_seed."""
    rng = np.random.default_rng(self.world_seed)
    m, h, v = self.num_tasks, self.horizon, self.num_actions
    correct = rng.integers(0, v, size=(m, h)).astype(np.int32)
    lo, hi = np.log(self.decisive_prob[0]), np.log(self.decisive_prob[1])
    p_correct = np.empty((m, h))
    p_correct[:, 0] = np.exp(rng.uniform(lo, hi, size=m))
    p_correct[:, 1:] = rng.uniform(*self.later_prob, size=(m, h - 1))
    probs = np.empty((m, h, v + 1))
    leak = np.zeros((m, h))
    leak[:, 0] = self.leak_prob0
    rest = (1.0 - p_correct - leak) / (v - 1)
    probs[..., :v] = rest[..., None]
    np.put_along_axis(probs[..., :v], correct[..., None], p_correct[..., None], axis=-1)
    probs[..., v] = np.where(leak > 0, leak, 1e-6)
    probs /= probs.sum(-1, keepdims=True)
    return correct, np.log(probs).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Variant:
  """One training recipe. enabled=False is GRPO (no intervention at all).

  delta: PPL gate threshold (Eq. 4; inf = no gate); v_detect: P(Verifier rejects a leak);
  p_leak: P(Corrector leaks); reweight: apply the Eq. 6 weights; eps_cal: Eq. 6 clip;
  kappa: logit boost of the written token under pi_cal.
  """

  name: str
  enabled: bool = True
  delta: float = 5.0
  v_detect: float = 0.8
  p_leak: float = 0.8
  reweight: bool = True
  eps_cal: float = 0.2
  kappa: float = 1.0

  def __post_init__(self) -> None:
    if not (isinstance(self.delta, (int, float)) and (self.delta >= 0)):
      raise ValueError(f"delta: expected a number >= 0 (inf allowed), got {self.delta!r}")
    for name in ("v_detect", "p_leak"):
      v = getattr(self, name)
      if not (isinstance(v, (int, float)) and 0 <= v <= 1):
        raise ValueError(f"{name}: expected a probability in [0, 1], got {v!r}")
    if not (isinstance(self.eps_cal, (int, float)) and 0 < self.eps_cal < 1):
      raise ValueError(f"eps_cal: expected a number in (0, 1), got {self.eps_cal!r}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimisation: iterations, group size G, SGD learning rate, epochs per batch, Eq. 2 clip, seeds."""

  iterations: int = 150
  group_size: int = 8
  lr: float = 0.5
  n_epochs: int = 2
  eps_clip: float = 0.2
  n_seeds: int = 16
  seed: int = 0
  shared_lr_scale: float = 0.3

  def __post_init__(self) -> None:
    for name in ("iterations", "group_size", "n_epochs", "n_seeds"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")
    if self.group_size < 2:
      raise ValueError(f"group_size: expected >= 2, got {self.group_size}")
    if not (isinstance(self.lr, (int, float)) and self.lr > 0):
      raise ValueError(f"lr: expected a number > 0, got {self.lr!r}")
    if not (isinstance(self.shared_lr_scale, (int, float)) and self.shared_lr_scale >= 0):
      raise ValueError(f"shared_lr_scale: expected a number >= 0, got {self.shared_lr_scale!r}")
    if not (isinstance(self.eps_clip, (int, float)) and 0 < self.eps_clip < 1):
      raise ValueError(f"eps_clip: expected a number in (0, 1), got {self.eps_clip!r}")


def ablation_variants() -> list[Variant]:
  """GRPO, RTI with a non-leaking oracle, and RTI with a leaking corrector and its Table-3 ablations."""
  return [
      Variant("GRPO", enabled=False),
      Variant("RTI (oracle, no leaks)", p_leak=0.0),
      Variant("RTI"),
      Variant("RTI w/o Post-Check", v_detect=0.0),
      Variant("RTI w/o PPL Gating", delta=math.inf),
      Variant("RTI w/o Reweight", reweight=False),
  ]


def delta_variants(deltas: Sequence[float] = (0.0, 3.0, 5.0, 20.0, math.inf)) -> list[Variant]:
  """The Section 5.4 sweep: RTI with each gate threshold."""
  return [Variant(f"delta={d:g}", delta=float(d)) for d in deltas]


# ---------------------------------------------------------------------------------------
# One iteration: rollouts -> rewards -> intervention (all-fail groups) -> batch -> update
# ---------------------------------------------------------------------------------------


def policy_logits(params: Mapping[str, jax.Array]) -> jax.Array:
  """Logits [M, H, V+1] = per-task table ``task: [M, H, V+1]`` + shared table ``shared: [H, V+1]``.

  The shared table stands for what an LLM's weights share across tasks: a habit learned on
  some tasks (e.g. emitting the shortcut) moves every task.
  """
  return params["task"] + params["shared"][None]


def success_probability(theta: jax.Array, correct: jax.Array) -> jax.Array:
  """P_m = prod_h pi(correct_mh). theta: [M, H, V+1] logits, correct: [M, H] -> [M]."""
  logp = jax.nn.log_softmax(theta, axis=-1)
  return jnp.exp(jnp.sum(logp * jax.nn.one_hot(correct, theta.shape[-1], dtype=logp.dtype), (-1, -2)))


def exact_pass_metrics(p_success: jax.Array, ks: Sequence[int] = PAPER_KS) -> dict[str, jax.Array]:
  """Pass@k = mean 1 - (1 - P)^k and Pass^k = mean P^k over tasks; p_success: [M] -> scalars."""
  out = {}
  for k in ks:
    out[f"pass@{k}"] = jnp.mean(1.0 - (1.0 - p_success)**k)
    out[f"pass^{k}"] = jnp.mean(p_success**k)
  return out


def _token_logp(theta: jax.Array, tokens: jax.Array) -> jax.Array:
  """log pi(tokens). theta: [M, H, V+1]; tokens: [M, G, H] -> [M, G, H]."""
  logp = jax.nn.log_softmax(theta, axis=-1)[:, None]  # [M, 1, H, V+1]
  return jnp.sum(logp * jax.nn.one_hot(tokens, theta.shape[-1], dtype=logp.dtype), -1)


def intervene(theta: jax.Array, correct: jax.Array, rollout: jax.Array, key: jax.Array,
              params: Mapping[str, jax.Array], world: TabularWorld) -> dict[str, jax.Array]:
  """Validator + Corrector + Verifier + PPL gate on one rollout per task.

  theta: [M, H, V+1]; correct, rollout: [M, H]. Returns ``tokens: [M, H]`` (the intervened
  trajectory), ``mask: [M, H]`` (tokens written by the Corrector), ``leaked, verified, gated:
  [M]`` bool and ``ppl: [M]`` (largest step perplexity). Random draws do not depend on
  ``params`` beyond thresholds, so every variant consumes the same randomness.
  """
  m, h = correct.shape
  k_leak, k_quote, k_verify, k_fill = jax.random.split(key, 4)
  derail = rollout != correct  # [M, H]
  first = jnp.argmax(derail, axis=-1)  # first derailing step (0 if none)
  steps = jnp.arange(h)[None, :]
  leaked = jax.random.bernoulli(k_leak, params["p_leak"], (m,)) & jnp.any(derail, -1)
  n_quote = jax.random.categorical(k_quote, jnp.log(jnp.asarray(world.quote_dist, jnp.float32)), shape=(m,))
  at_first = steps == first[:, None]
  # Oracle correction: every derailing decision -> correct. Leak: LEAK at the first derailing
  # step (earlier steps were correct and stay), later decisions filled in arbitrarily by the
  # Corrector (uniform actions): the copied answer makes them irrelevant to the reward.
  after = steps > first[:, None]
  filler = jax.random.randint(k_fill, (m, h), 0, world.num_actions)
  leak_tokens = jnp.where(at_first, world.leak_token, jnp.where(after, filler, rollout))
  tokens = jnp.where(leaked[:, None], leak_tokens, jnp.where(derail, correct, rollout))
  mask = jnp.where(leaked[:, None], at_first | after, derail)
  # Eq. 3 per corrected step: [reasoning tokens..., decision] rescored under the rollout policy.
  dec_logp = jnp.sum(jax.nn.log_softmax(theta, -1) * jax.nn.one_hot(tokens, theta.shape[-1]), -1)  # [M, H]
  r = world.reason_len
  quoted = (jnp.arange(r)[None, None, :] < jnp.where(leaked, n_quote, 0)[:, None, None])  # [M, 1, R]
  reason_logp = jnp.where(quoted & at_first[..., None], math.log(world.q_quote), math.log(world.q_plain))
  reason_logp = jnp.broadcast_to(reason_logp, (m, h, r))
  step_logp = jnp.concatenate([reason_logp, dec_logp[..., None]], -1).reshape(m * h, r + 1)
  ppl = sequence_perplexity(step_logp, jnp.ones_like(step_logp)).reshape(m, h)
  gate_ok = jnp.all(jnp.where(mask, ppl_gate(ppl, params["delta"]), True), -1)
  caught = jax.random.bernoulli(k_verify, params["v_detect"], (m,))
  verified = ~(leaked & caught)
  return dict(tokens=tokens, mask=mask, leaked=leaked, verified=verified, gated=gate_ok,
              ppl=jnp.max(jnp.where(mask, ppl, 0.0), -1))


def collect_batch(theta: jax.Array, key: jax.Array, params: Mapping[str, jax.Array], correct: jax.Array,
                  world: TabularWorld, group_size: int) -> dict[str, jax.Array]:
  """Rollouts -> rewards -> intervention (all-fail groups only) -> the Eq. 7 training batch.

  theta: [M, H, V+1] logits of the rollout policy. Returns, with B = M * G rows of H tokens:
  ``tokens: [M, G, H]``, ``rewards: [B]``, ``advantages: [B]`` (Eq. 1), ``old_logp: [B, H]``
  (rollout policy, also Eq. 5's pi_roll), ``cal_logp: [B, H]`` (Eq. 5's pi_cal),
  ``weight_mask: [B, H]`` (intervened tokens that get the Eq. 6 weight), and the per-group
  bookkeeping ``all_fail, accepted, leaked, verified, gated: [M]``, ``ppl: [M]``.
  """
  m, h = correct.shape
  g = group_size
  k_roll, k_int = jax.random.split(key)
  tokens = jax.random.categorical(k_roll, theta[:, None], shape=(m, g, h))  # [M, G, H]
  success = jnp.all(tokens == correct[:, None], -1)  # LEAK never equals a correct action
  all_fail = ~jnp.any(success, -1)  # [M]
  fix = intervene(theta, correct, tokens[:, 0], k_int, params, world)
  accepted = (params["enabled"] > 0) & all_fail & fix["verified"] & fix["gated"]
  tokens = tokens.at[:, 0].set(jnp.where(accepted[:, None], fix["tokens"], tokens[:, 0]))
  rewards = success.at[:, 0].set(success[:, 0] | accepted).astype(jnp.float32)
  imask = jnp.zeros((m, g, h), bool).at[:, 0].set(accepted[:, None] & fix["mask"])
  b = m * g
  written = jax.nn.one_hot(tokens, theta.shape[-1])  # [M, G, H, V+1]
  cal_logits = theta[:, None] + params["kappa"] * written
  return dict(
      tokens=tokens, rewards=rewards.reshape(b), advantages=group_advantages(rewards.reshape(b), g),
      old_logp=_token_logp(theta, tokens).reshape(b, h),
      cal_logp=jnp.sum(jax.nn.log_softmax(cal_logits, -1) * written, -1).reshape(b, h),
      weight_mask=(imask.reshape(b, h) & (params["reweight"] > 0)).astype(jnp.float32),
      all_fail=all_fail, accepted=accepted, leaked=fix["leaked"], verified=fix["verified"], gated=fix["gated"],
      ppl=fix["ppl"])


def batch_loss(policy: Mapping[str, jax.Array], batch: Mapping[str, jax.Array], eps_cal: jax.Array | float,
               eps_clip: float) -> jax.Array:
  """The library's Eq. 7 ``rti_loss`` on the batch, times M (a per-task sum, so a task's step
  does not depend on the number of tasks). policy: see ``policy_logits``. Returns a scalar."""
  tokens = batch["tokens"]
  m = tokens.shape[0]
  b, h = batch["old_logp"].shape
  logp = _token_logp(policy_logits(policy), tokens).reshape(b, h)
  loss = rti_loss(logp, batch["old_logp"], batch["advantages"], jnp.ones((b, h), jnp.float32), batch["cal_logp"],
                  batch["old_logp"], batch["weight_mask"], eps_cal=eps_cal, clip_low=eps_clip, clip_high=eps_clip)
  return loss * m


def policy_update(policy: dict[str, jax.Array], batch: Mapping[str, jax.Array], eps_cal: jax.Array | float,
                  train: TrainConfig) -> dict[str, jax.Array]:
  """``n_epochs`` SGD steps on ``batch_loss`` (old_logp fixed: the Eq. 2 clip acts from epoch 2).

  The shared table's learning rate is ``lr * shared_lr_scale``.
  """
  lrs = dict(task=train.lr, shared=train.lr * train.shared_lr_scale)
  new = dict(policy)
  for _ in range(train.n_epochs):
    grads = jax.grad(batch_loss)(new, batch, eps_cal, train.eps_clip)
    new = {k: new[k] - lrs[k] * grads[k] for k in new}
  return new


def rti_iteration(policy: dict[str, jax.Array], key: jax.Array, params: Mapping[str, jax.Array],
                  correct: jax.Array, world: TabularWorld, train: TrainConfig
                  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
  """One RTI (or GRPO) iteration for all tasks: ``collect_batch`` then ``policy_update``.

  policy: see ``policy_logits``. Returns (new policy, metrics of this iteration).
  """
  batch = collect_batch(policy_logits(policy), key, params, correct, world, train.group_size)
  new = policy_update(policy, batch, params["eps_cal"], train)
  new_logits = policy_logits(new)
  all_fail, accepted = batch["all_fail"], batch["accepted"]
  tried = (params["enabled"] > 0) & all_fail
  metrics = dict(
      **exact_pass_metrics(success_probability(new_logits, correct)),
      group_success_pre=jnp.mean(~all_fail), group_success_post=jnp.mean(~all_fail | accepted),
      triggered=jnp.sum(tried), accepted=jnp.sum(accepted), leaks_accepted=jnp.sum(accepted & batch["leaked"]),
      verifier_rejected=jnp.sum(tried & ~batch["verified"]),
      gate_rejected=jnp.sum(tried & batch["verified"] & ~batch["gated"]),
      accepted_ppl=jnp.sum(jnp.where(accepted, batch["ppl"], 0.0)) / jnp.maximum(jnp.sum(accepted), 1),
      leak_mass=jnp.mean(jax.nn.softmax(new_logits, -1)[:, 0, world.leak_token]),
      all_fail_groups=jnp.sum(all_fail),
  )
  return new, metrics


# XLA's backend optimisation level 1 compiles this small scan about twice as fast as the default
# level, and the compiled program runs as fast.
@partial(jax.jit, static_argnames=("world", "train"), compiler_options={"xla_backend_optimization_level": 1})
def _train_all(params: dict[str, jax.Array], correct: jax.Array, theta0: jax.Array, key: jax.Array,
               world: TabularWorld, train: TrainConfig) -> dict[str, jax.Array]:
  """params: dict of [n_variants] arrays. Returns metrics [n_variants, n_seeds, iterations]."""
  seed_keys = jax.random.split(key, train.n_seeds)

  def one_run(p: dict[str, jax.Array], k: jax.Array) -> dict[str, jax.Array]:
    def step(theta, it_key):
      return rti_iteration(theta, it_key, p, correct, world, train)

    policy0 = dict(task=theta0, shared=jnp.zeros(theta0.shape[1:], theta0.dtype))
    _, hist = jax.lax.scan(step, policy0, jax.random.split(k, train.iterations))
    return hist

  per_seed = jax.vmap(one_run, in_axes=(None, 0))
  return jax.vmap(per_seed, in_axes=(0, None))(params, seed_keys)


def _stack_params(variants: Sequence[Variant]) -> dict[str, jax.Array]:
  f = lambda attr: jnp.asarray([float(getattr(v, attr)) for v in variants], jnp.float32)
  return dict(enabled=f("enabled"), delta=f("delta"), v_detect=f("v_detect"), p_leak=f("p_leak"),
              reweight=f("reweight"), eps_cal=f("eps_cal"), kappa=f("kappa"))


def train_variants(variants: Sequence[Variant], world: TabularWorld = TabularWorld(),
                   train: TrainConfig = TrainConfig()) -> dict[str, dict[str, np.ndarray]]:
  """Trains every variant for ``train.n_seeds`` seeds (same seeds for all variants).

  Returns ``{variant name: {metric: [n_seeds, iterations] numpy array}}``; metrics are those
  of ``rti_iteration`` (exact Pass@k / Pass^k after each update, intervention counts, ...).
  """
  if not variants:
    raise ValueError("variants: expected at least one Variant, got an empty sequence")
  names = [v.name for v in variants]
  if len(set(names)) != len(names):
    raise ValueError(f"variants: expected distinct names, got {names}")
  correct, theta0 = world.build()
  # The "rbg" generator compiles several times faster than threefry on CPU; same seed, same numbers.
  key = jax.random.key(train.seed, impl="rbg")
  hist = _train_all(_stack_params(variants), jnp.asarray(correct), jnp.asarray(theta0), key,
                    world=world, train=train)
  hist = jax.tree.map(np.asarray, hist)
  return {name: {k: v[i] for k, v in hist.items()} for i, name in enumerate(names)}


def summarize(history: Mapping[str, np.ndarray], last: int = 10) -> dict[str, float]:
  """Seed-mean of each metric averaged over the last ``last`` iterations (and its seed std for pass@1)."""
  out: dict[str, float] = {}
  for k, v in history.items():
    tail = v[:, -last:].mean(axis=1)  # [n_seeds]
    out[k] = float(tail.mean())
    if k in ("pass@1", "pass@4", "pass^4"):
      out[f"{k}_std"] = float(tail.std())
  for key in ("triggered", "accepted", "leaks_accepted", "verifier_rejected", "gate_rejected"):
    out[f"total_{key}"] = float(history[key].sum(axis=1).mean())
  p = [out[f"pass@{k}"] for k in PAPER_KS if f"pass@{k}" in out]
  q = [out[f"pass^{k}"] for k in PAPER_KS if f"pass^{k}" in out]
  out["avg p@k"] = float(np.mean(p))
  out["avg pk"] = float(np.mean(q))
  return out
