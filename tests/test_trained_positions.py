"""Log-probs at the trained positions alone (``RTIBatch.trained_positions``) against the full pass.

The positions a batch trains on are listed per row on the host; the model then runs its last layer
and LM head there only. Checked: the listing against a brute-force scan of the loss mask, the
log-probs and their gradient against ``next_token_logprobs`` of the full logits, the train step
(plain and with the memory model) and the trainer's forward passes against the same step without
positions.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from models.config import QwenConfig
from models.qwen import Qwen
from models.scoring import token_logprobs_at
from rti_jax import objectives as O
from rti_jax import sharding as S

V = 96


def tiny(tie: bool = False, seed: int = 0) -> Qwen:
  cfg = QwenConfig(model_type="qwen3", vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=tie)
  return Qwen(cfg, rngs=nnx.Rngs(seed))


def rti_batch(rows: int = 4, t: int = 160, seed: int = 0) -> O.RTIBatch:
  """Right-padded rows of different lengths whose trained tokens are scattered runs (as the
  assistant turns of a multi-turn rollout), one row with none."""
  rng = np.random.default_rng(seed)
  lengths = np.resize(np.array([t, t - 37, 40, t - 3]), rows)
  real = np.arange(t)[None] < lengths[:, None]
  turn = (np.arange(t)[None] // 9 + np.arange(rows)[:, None]) % 3 == 1  # every third 9-token run
  loss_mask = (real & turn).astype(np.float32)
  loss_mask[2] = 0  # a row with nothing to train
  loss_mask[:, 0] = 0  # the first token is never a response token
  inter = np.zeros((rows, t), np.float32)
  inter[1] = loss_mask[1] * (np.arange(t) < 60)
  old = (-2.0 + 0.3 * rng.normal(size=(rows, t))).astype(np.float32)
  return O.RTIBatch(input_ids=rng.integers(0, V, (rows, t)).astype(np.int32), attention_mask=real.astype(np.int32),
                    loss_mask=loss_mask, old_logp=old, advantages=rng.normal(size=rows).astype(np.float32),
                    roll_logp=old, cal_logp=(old + 0.2 * rng.normal(size=(rows, t))).astype(np.float32),
                    intervened_mask=inter, ref_logp=(old - 0.1).astype(np.float32))


def test_positions_list_every_trained_token_of_each_row_in_order() -> None:
  rng = np.random.default_rng(3)
  mask = (rng.random((5, 64)) < 0.3).astype(np.float32)
  mask[0, 0] = 1  # position 0 predicts nothing (its log-prob is 0 by convention)
  mask[3] = 0
  b = dataclasses.replace(rti_batch(5, 64), loss_mask=mask)
  pos = np.asarray(O.with_trained_positions(b).trained_positions)
  counts = [int(mask[i, 1:].sum()) for i in range(5)]
  assert pos.shape == (5, O.trained_width(max(counts), 64)) and pos.dtype == np.int32
  for i in range(5):
    want = [t for t in range(1, 64) if mask[i, t] != 0]
    assert pos[i, :len(want)].tolist() == want and not pos[i, len(want):].any()
  assert [O.trained_width(c, 768) for c in (0, 1, 192, 193, 577, 700, 768)] == [192, 192, 192, 384, 768, 768, 768]
  assert O.trained_width(3, 5) == 3
  with pytest.raises(ValueError, match="trained_positions"):
    dataclasses.replace(b, trained_positions=np.zeros((5, 65), np.int32)).check()
  with pytest.raises(ValueError, match="trained_positions"):
    dataclasses.replace(b, trained_positions=np.zeros((5, 4), np.float32)).check()


def test_chunks_and_padding_keep_positions_that_match_their_rows() -> None:
  b = O.with_trained_positions(rti_batch())
  for c in O.length_chunks(b, 2, lambda n: -(-n // 32) * 32):
    assert c.trained_positions is not None
    np.testing.assert_array_equal(c.trained_positions, O.with_trained_positions(c).trained_positions)
  padded = O.batch._pad_batch(b, 192)  # noqa: SLF001
  assert padded.input_ids.shape == (4, 192)
  np.testing.assert_array_equal(padded.trained_positions, b.trained_positions)


@pytest.mark.parametrize("tie, vocab_chunk", [(False, None), pytest.param(True, 20, marks=pytest.mark.slow)])
def test_logprobs_at_positions_equal_the_full_pass_there_value_and_gradient(tie, vocab_chunk) -> None:
  model = tiny(tie, seed=1)
  b = O.with_trained_positions(rti_batch())
  ids, mask, pos = (jnp.asarray(x) for x in (b.input_ids, b.attention_mask, b.trained_positions))
  weight = jnp.asarray(b.loss_mask) * jnp.linspace(0.5, 1.5, ids.shape[1])[None]
  graphdef, params = nnx.split(model, nnx.Param)

  def full(p):
    net = nnx.merge(graphdef, p)
    return O.next_token_logprobs(net(ids, mask) / 0.8, ids)

  def at(p):
    return token_logprobs_at(nnx.merge(graphdef, p), ids, mask, pos, vocab_chunk=vocab_chunk, right_padded=True,
                             temperature=0.8)

  want, got = np.asarray(jax.jit(full)(params)), np.asarray(jax.jit(at)(params))
  trained = np.asarray(b.loss_mask) != 0
  assert np.abs(want[trained]).min() > 1e-3  # real log-probs
  np.testing.assert_allclose(got[trained], want[trained], atol=2e-5)
  assert not got[~trained].any()  # 0 wherever nothing is trained
  g_want = jax.jit(jax.grad(lambda p: jnp.sum(weight * full(p))))(params)
  g_got = jax.jit(jax.grad(lambda p: jnp.sum(weight * at(p))))(params)
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g_want))
  for x, y in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-5 * scale)


@pytest.mark.parametrize("lean", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_step_at_positions_equals_the_step_over_every_position(lean: bool) -> None:
  mesh = S.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  b = rti_batch()
  tx = optax.adamw(1e-2, eps=1e-3)  # eps: see tests/test_memory_model.py
  cfg = O.LossConfig(name="rti", beta=0.1, logp_temperature=0.8)
  kw = dict(remat="full", vocab_chunk=20, tokens_per_device=320) if lean else {}
  outs = []
  for batch in (b, O.with_trained_positions(b)):
    step = S.make_train_step(tiny(seed=3), tx, mesh, cfg, **kw)
    state, out = step.step(step.state, step.shard_batch(batch))
    outs.append((state, out))
  (s0, o0), (s1, o1) = outs
  assert float(o1.loss) == pytest.approx(float(o0.loss), rel=1e-5) and abs(float(o0.loss)) > 1e-4
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(o0.grads))
  for x, y in zip(jax.tree.leaves(o1.grads), jax.tree.leaves(o0.grads)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5 * scale)
  for key, value in o0.metrics.items():
    assert float(o1.metrics[key]) == pytest.approx(float(value), rel=1e-4, abs=1e-6), key
  assert max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s0.params))) \
      <= 1e-4  # a hundredth of one AdamW step at lr 1e-2


def test_forward_passes_at_positions_equal_the_full_pass_there() -> None:
  """The recomputed behaviour and KL reference log-probs (``rti_jax.step_fns.forward_logp``) at the
  positions, in one pass and rows two at a time, with and without vocab chunks."""
  from rti_jax.step_fns import forward_logp

  graphdef, params, rest = nnx.split(tiny(seed=2), nnx.Param, ...)
  b = O.with_trained_positions(rti_batch())
  ids, mask, pos = (jnp.asarray(x) for x in (b.input_ids, b.attention_mask, b.trained_positions))
  trained = np.asarray(b.loss_mask) != 0
  want = np.asarray(forward_logp(graphdef, params, rest, ids, mask, temperature=0.8))
  for chunk, k in ((None, 1), (20, 2)):
    got = np.asarray(forward_logp(graphdef, params, rest, ids, mask, chunk, k, False, 0.8, pos))
    np.testing.assert_allclose(got[trained], want[trained], atol=2e-5)
    assert not got[~trained].any()


def test_a_model_without_hidden_states_is_told_why() -> None:
  class Logits(nnx.Module):
    def __init__(self):
      self.w = nnx.Param(jnp.zeros((V, V)))

    def __call__(self, ids, mask):
      return jax.nn.one_hot(ids, V) @ self.w[...]

  mesh = S.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  step = S.make_train_step(Logits(), optax.sgd(0.1), mesh, O.LossConfig(name="grpo"))
  with pytest.raises(ValueError, match="trained_positions: needs a model with hidden_states"):
    step.step(step.state, step.shard_batch(O.with_trained_positions(rti_batch(t=32))))


@pytest.mark.slow
def test_trainer_update_at_positions_equals_the_update_over_every_position(toy_policy, tmp_path) -> None:
  """One update with the navigation config's regime (two epochs, the KL reference pass, length
  chunks) and the behaviour log-probs recomputed at the sampling temperature, with and without
  ``optim.trained_positions``: the same metrics and parameters up to fp32 rounding."""
  from rti_jax.config import load_config
  from rti_jax.envs.source import TaskSource
  from rti_jax.rollout import rollout_groups
  from rti_jax.trainer import Trainer
  from trainer_fixtures import LengthRewardEnv

  def trainer(flag: str) -> Trainer:
    cfg = load_config("navigation", [
        f"policy.path={toy_policy}", "rollout.tasks_per_iter=2", "rollout.group_size=4", "rollout.max_new_tokens=6",
        "rollout.max_context=128", "optim.lr=0.01", "train.eval_every=100", "train.val_tasks=0",
        "optim.length_chunks=2", f"optim.trained_positions={flag}", "loss.behaviour_logp=recompute"])
    src = TaskSource(train=list(range(8)), test=list(range(100, 102)), env_factory=LengthRewardEnv, task_id=str,
                     subsets={}, domain="navigation")
    return Trainer(cfg, tmp_path / flag, source=src, progress=False)

  on, off = trainer("true"), trainer("false")
  src = on.source
  groups = rollout_groups(src.train[:2], src.env_factory, on.backend, on.formatter, on.rollout_config,
                          task_id=src.task_id, seed=0)
  assert len({t.reward for g in groups for t in g}) > 1  # a non-zero advantage to learn from
  m_on, m_off = on.update(groups), off.update(groups)
  assert set(m_on) == set(m_off) and m_off["approx_kl_k3"] > 0
  for key, value in m_off.items():
    assert m_on[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(on.state.params),
                                                            jax.tree.leaves(off.state.params)))
  assert 0 < diff <= 0.01 * 0.01  # a hundredth of one Adam step at lr 0.01
