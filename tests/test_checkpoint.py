"""Orbax checkpoints: save -> restore gives back params, optimizer state, key and meta exactly."""

import jax
import numpy as np
import optax
from flax import nnx

from rti_jax.checkpoint import TrainCheckpointer


class _Tiny(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    self.a = nnx.Linear(3, 5, rngs=rngs)
    self.b = nnx.Linear(5, 2, rngs=rngs)

  def __call__(self, x):
    return self.b(jax.nn.tanh(self.a(x)))


def _train_steps(model, opt, n, seed):
  x = jax.random.normal(jax.random.key(seed), (4, 3))
  for _ in range(n):
    grads = nnx.grad(lambda m: (m(x) ** 2).mean())(model)
    opt.update(model, grads)


def _params(model):
  return jax.tree.leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
  model = _Tiny(nnx.Rngs(0))
  opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  _train_steps(model, opt, 3, seed=1)
  ckpt = TrainCheckpointer(tmp_path / "ckpt")
  key = jax.random.key(42)
  ckpt.save(3, model, opt, key, {"iteration": 3, "order": np.arange(5)[::-1]})

  _train_steps(model, opt, 2, seed=2)  # the uninterrupted run goes on
  expected = _params(model)

  fresh = _Tiny(nnx.Rngs(7))  # different init: everything must come from the checkpoint
  fresh_opt = nnx.Optimizer(fresh, optax.adam(1e-2), wrt=nnx.Param)
  restored = TrainCheckpointer(tmp_path / "ckpt").restore(fresh, fresh_opt)
  assert restored is not None and restored.step == 3
  assert restored.meta == {"iteration": 3, "order": [4, 3, 2, 1, 0]}
  np.testing.assert_array_equal(jax.random.key_data(restored.key), jax.random.key_data(key))
  assert int(fresh_opt.step[...]) == 3
  _train_steps(fresh, fresh_opt, 2, seed=2)
  for a, b in zip(_params(fresh), expected):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_restore_without_checkpoint_returns_none(tmp_path):
  model = _Tiny(nnx.Rngs(0))
  opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  assert TrainCheckpointer(tmp_path / "empty").restore(model, opt) is None


def test_keeps_only_the_newest(tmp_path):
  model = _Tiny(nnx.Rngs(0))
  opt = nnx.Optimizer(model, optax.sgd(1e-2), wrt=nnx.Param)
  ckpt = TrainCheckpointer(tmp_path / "c", max_to_keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, model, opt, jax.random.key(step), {"iteration": step})
  assert ckpt.latest_step() == 3
  assert sorted(int(p.name) for p in (tmp_path / "c").iterdir() if p.name.isdigit()) == [2, 3]
