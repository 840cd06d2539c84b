"""Several steps per rollout batch (``optim.epochs``) and temperature-consistent log-probs
(``loss.logp_temperature``; ``loss.behaviour_logp`` recomputed or the sampler's), against independent references:
the same steps taken by hand, transformers' tempered log-probs, numpy's tempered softmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import Qwen3ForCausalLM

from models.vocab_logprobs import hidden_token_logprobs
from rti_jax import objectives
from rti_jax.config import ConfigError, load_config
from rti_jax.envs.source import TaskSource
from rti_jax.rollout import rollout_groups
from rti_jax.shapes import UPDATE_BUCKETS, bucket_length
from rti_jax.trainer import Trainer
from trainer_fixtures import ONE_STEP_FROM_SAMPLER, LengthRewardEnv


def _source():
  return TaskSource(train=list(range(8)), test=list(range(100, 102)), env_factory=LengthRewardEnv,
                    task_id=str, subsets={}, domain="navigation")


def _cfg(policy, *extra):
  return load_config("navigation", [
      f"policy.path={policy}", "loss.method=grpo", "rollout.tasks_per_iter=2", "rollout.group_size=4",
      "rollout.max_new_tokens=6", "rollout.max_context=128", "train.iterations=1", "optim.lr=0.05",
      "train.eval_every=100", "train.val_tasks=0", "loss.beta=0", "optim.length_chunks=1",
      *ONE_STEP_FROM_SAMPLER, *extra])  # each test sets what it checks


def _groups(trainer, seed=0):
  src = trainer.source
  return rollout_groups(src.train[:2], src.env_factory, trainer.backend, trainer.formatter, trainer.rollout_config,
                        task_id=src.task_id, seed=seed)


def _batch(trainer, groups):
  """The batch ``Trainer.update`` assembles (one minibatch, one length chunk)."""
  longest = max(len(t.token_ids) for g in groups for t in g)
  max_len = bucket_length(min(longest, trainer.cfg.rollout.max_context), **UPDATE_BUCKETS)
  batch = objectives.assemble_batch(groups, pad_id=trainer.pad_id, reweight=True, max_len=max_len,
                                    advantage_std=trainer.cfg.loss.adv_std)
  batch = objectives.without_empty_intervention(batch)
  (chunk,) = objectives.length_chunks(batch, 1, lambda n: bucket_length(min(n, max_len), **UPDATE_BUCKETS))
  return objectives.with_trained_positions(chunk) if trainer.cfg.optim.trained_positions else chunk


def _transformers_tempered_logp(policy, batch, temperature):
  """log_softmax(logits / temperature) of each next token of ``batch`` under transformers ([B, T - 1],
  float64) and the mask of the trained ones among them (at least 10)."""
  hf = Qwen3ForCausalLM.from_pretrained(policy).eval()
  ids = torch.tensor(np.asarray(batch.input_ids), dtype=torch.long)
  with torch.no_grad():
    logits = hf(input_ids=ids, attention_mask=torch.tensor(np.asarray(batch.attention_mask))).logits.double()
  want = torch.log_softmax(logits / temperature, -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].numpy()
  mask = np.asarray(batch.loss_mask)[:, 1:] > 0
  assert mask.sum() > 10
  return want, mask


def test_epochs_take_the_same_steps_as_repeating_the_step_by_hand(toy_policy, tmp_path):
  """Two epochs over one minibatch equal two hand-made steps on the one placed batch: the second
  step's ratio has moved off 1 (its KL estimate is positive), the behaviour log-probs have not."""
  two = Trainer(_cfg(toy_policy, "optim.epochs=2"), tmp_path / "two", source=_source(), progress=False)
  ref = Trainer(_cfg(toy_policy), tmp_path / "ref", source=_source(), progress=False)
  groups = _groups(two)
  dev = ref._device_batch(_batch(ref, groups))
  s1, o1 = ref.train_step.step(ref.state, dev)
  s2, o2 = ref.train_step.step(s1, dev)
  metrics = two.update(groups)
  for got, want in zip(jax.tree.leaves(two.state.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  assert metrics["loss"] == pytest.approx((float(o1.loss) + float(o2.loss)) / 2, rel=1e-5)
  assert abs(float(o1.metrics["approx_kl_k3"])) < 1e-6 < float(o2.metrics["approx_kl_k3"])


def test_grpo_and_rti_share_the_update_of_a_batch_without_intervened_tokens(toy_policy, tmp_path):
  """A GRPO and an RTI trainer of one config share their jitted update; on the same rollouts
  (no intervened token) two epochs leave exactly the same parameters and metrics."""
  grpo = Trainer(_cfg(toy_policy, "optim.epochs=2"), tmp_path / "grpo", source=_source(), progress=False)
  rti = Trainer(_cfg(toy_policy, "optim.epochs=2", "loss.method=rti"), tmp_path / "rti", source=_source(),
                progress=False)
  assert rti.train_step.step is grpo.train_step.step
  groups = _groups(grpo)
  assert not any(any(t.arrays()["intervened_mask"]) for g in groups for t in g)
  want, got = grpo.update(groups), rti.update(groups)
  assert got == want
  for a, b in zip(jax.tree.leaves(rti.state.params), jax.tree.leaves(grpo.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert want["intervened_tokens"] == 0 and want["on_policy_tokens"] == want["num_tokens"] > 0


def test_recomputed_behaviour_logprobs_are_transformers_tempered_logprobs(toy_policy, tmp_path):
  """behaviour_logp=recompute at temperature 0.5: every trained token's old_logp is
  log_softmax(logits / 0.5) of the checkpoint under transformers; other positions keep theirs."""
  tr = Trainer(_cfg(toy_policy, "rollout.temperature=0.5", "loss.logp_temperature=0.5", "loss.behaviour_logp=recompute"),
               tmp_path / "t", source=_source(), progress=False)
  batch = _batch(tr, _groups(tr))
  got = tr._recompute_behaviour(batch, tr.state.params)
  want, mask = _transformers_tempered_logp(toy_policy, batch, 0.5)
  np.testing.assert_allclose(np.asarray(got.old_logp)[:, 1:][mask], want[mask], atol=2e-5)
  np.testing.assert_array_equal(np.asarray(got.old_logp)[:, 1:][~mask], np.asarray(batch.old_logp)[:, 1:][~mask])
  # the sampler's own log-probs are the temperature-1 ones: they differ from the tempered ones
  assert np.abs(np.asarray(batch.old_logp)[:, 1:][mask] - want[mask]).mean() > 0.05
  # a first step from these behaviour log-probs starts at ratio 1
  _, out = tr.train_step.step(tr.state, tr._device_batch(got))
  assert abs(float(out.metrics["approx_kl_k3"])) < 1e-6 and float(out.metrics["clip_frac"]) == 0.0


def test_sampler_behaviour_logprobs_at_the_rollout_temperature_are_transformers_tempered_logprobs(toy_policy,
                                                                                                 tmp_path):
  """behaviour_logp=rollout with the ratio at the rollout temperature (0.5): every trained token's
  old_logp is the log-prob the sampler drew it with, log_softmax(logits / 0.5) of the checkpoint
  under transformers, and what the recomputing forward pass gives; no pass is needed, and a first
  step from them starts at ratio 1."""
  tr = Trainer(_cfg(toy_policy, "rollout.temperature=0.5", "loss.logp_temperature=0.5", "loss.behaviour_logp=rollout"),
               tmp_path / "t", source=_source(), progress=False)
  assert tr.rollout_config.behaviour_temperature == 0.5
  batch = _batch(tr, _groups(tr))
  want, mask = _transformers_tempered_logp(toy_policy, batch, 0.5)
  old = np.asarray(batch.old_logp)[:, 1:]
  np.testing.assert_allclose(old[mask], want[mask], atol=5e-5)
  recomputed = np.asarray(tr._recompute_behaviour(batch, tr.state.params).old_logp)[:, 1:]
  np.testing.assert_allclose(old[mask], recomputed[mask], atol=5e-5)
  _, out = tr.train_step.step(tr.state, tr._device_batch(batch))
  assert abs(float(out.metrics["approx_kl_k3"])) < 1e-6 and float(out.metrics["clip_frac"]) == 0.0


@pytest.mark.parametrize("temperature", [0.5, 0.8, 2.0])
def test_vocab_chunked_logprobs_at_a_temperature_equal_numpy(temperature):
  rng = np.random.default_rng(0)
  h = rng.normal(size=(2, 5, 8)).astype(np.float32)
  head = rng.normal(size=(8, 12)).astype(np.float32)
  targets = rng.integers(0, 12, (2, 5))
  z = (h.astype(np.float64) @ head) / temperature
  want = np.take_along_axis(z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True),
                            targets[..., None], -1)[..., 0]
  got = hidden_token_logprobs(jnp.asarray(h), jnp.asarray(head), jnp.asarray(targets), chunk=4,
                              precision=jax.lax.Precision.HIGHEST, temperature=temperature)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


@pytest.mark.parametrize("overrides, needle", [
  (["loss.logp_temperature=0.5", "loss.behaviour_logp=rollout"], "behaviour_logp=recompute"),  # sampling at 0.8
  (["loss.behaviour_logp=rollout", "rollout.top_p=0.9"], "^rollout.top_p: got 0.9"),
  (["loss.behaviour_logp=rollout", "rollout.backend=sglang", "rollout.sglang_url=http://127.0.0.1:1"], "sglang"),
  (["loss.logp_temperature=0.8", "loss.behaviour_logp=recompute", "loss.intervened_old_logp=cal", "rollout.backend=sglang",
    "rollout.sglang_url=http://127.0.0.1:1"], "^loss.intervened_old_logp: cal"),
  (["loss.logp_temperature=0"], "loss.logp_temperature"),
  (["loss.behaviour_logp=sampler"], "loss.behaviour_logp"),
  (["optim.epochs=0"], "optim.epochs"),
])
def test_inconsistent_settings_are_refused_by_name(overrides, needle):
  with pytest.raises(ConfigError, match=needle):
    load_config("navigation", overrides)


@pytest.mark.slow  # three trainers; the z-score itself: tests/test_objectives.py (fast)
def test_aepo_update_is_the_same_however_the_minibatch_is_cut(tmp_path):
  """AEPO standardises the token entropy over the whole minibatch before it is cut: one padded
  batch, 4 length chunks and token-budget micro-batches give the same first update. (A policy
  with peaked distributions: near-uniform ones have entropies within 5e-4 of log V, whose
  z-scores are float32 rounding.)"""
  from models.chat import build_tiny_tokenizer
  from trainer_fixtures import WORDS, write_random_qwen

  tok = build_tiny_tokenizer(WORDS, tmp_path / "policy")
  policy = write_random_qwen(tmp_path / "policy", len(tok), seed=0, layers=2, heads=4, kv_heads=2, head_dim=8,
                             max_positions=1024, init_std=0.5)
  src = _source()
  base = ("loss.method=aepo", "loss.aggregation=token-mean", "rollout.tasks_per_iter=2")
  cuts = {"whole": ["optim.length_chunks=1"], "length_chunks": ["optim.length_chunks=4"],
          "budget": ["optim.length_chunks=1", "optim.tokens_per_device=96"]}
  groups, out = None, {}
  for name, extra in cuts.items():
    tr = Trainer(_cfg(policy, *base, *extra), tmp_path / name, source=src, progress=False)
    groups = groups or _groups(tr, seed=3)
    b = _batch(tr, groups)
    raw = np.asarray(tr.hooks.entropy_fn(tr.state.params, b.input_ids, b.attention_mask))[np.asarray(b.loss_mask) > 0]
    out[name] = tr.update(groups), jax.tree.leaves(tr.state.params), raw
  rewards = [t.reward for g in groups for t in g]
  assert len(set(rewards)) > 1  # non-zero advantages: the entropy weighting reaches the gradient
  ent = out["whole"][2]
  assert ent.std() > 0.1, ent.std()
  (m1, p1, _) = out["whole"]
  for name in ("length_chunks", "budget"):
    m, p, _ = out[name]
    # float32 sums in another order: the loss (~2e-2) differs by ~1e-5 relative across cuts
    assert m["loss"] == pytest.approx(m1["loss"], rel=5e-5, abs=1e-7), name
    assert m["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5), name
    # equal gradients up to summation order: Adam's steps agree to a small fraction of lr (0.05)
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(p, p1))
    assert diff <= 0.1 * 0.05, (name, diff)


def test_update_counts_the_batch_shapes_new_to_the_process(toy_policy, tmp_path):
  """``update/new_shapes``: the first update's shapes are all new (one chunk: one shape), the same
  groups again compile nothing new; it is in TIMING_KEYS (a resumed process starts from none)."""
  from rti_jax.trainer import TIMING_KEYS

  trainer = Trainer(_cfg(toy_policy), tmp_path / "t", source=_source(), progress=False)
  groups = _groups(trainer)
  trainer.update(groups)
  assert trainer.new_update_shapes == 1
  trainer.update(groups)
  assert trainer.new_update_shapes == 0
  assert "update/new_shapes" in TIMING_KEYS
  assert trainer.iterate()["update/new_shapes"] in (0, 1)
