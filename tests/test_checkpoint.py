"""Orbax checkpoints: save -> restore gives back the train state, key and meta exactly."""

import pathlib
import shutil

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from rti_jax.checkpoint import TrainCheckpointer


class _Tiny(nnx.Module):

  def __init__(self, rngs: nnx.Rngs):
    self.a = nnx.Linear(3, 5, rngs=rngs)
    self.b = nnx.Linear(5, 2, rngs=rngs)

  def __call__(self, x):
    return self.b(jax.nn.tanh(self.a(x)))


def _setup(seed):
  graphdef, params = nnx.split(_Tiny(nnx.Rngs(seed)), nnx.Param)
  tx = optax.adam(1e-2)
  return graphdef, tx, {"params": params, "opt": tx.init(params)}


def _train(graphdef, tx, state, n, seed):
  x = jax.random.normal(jax.random.key(seed), (4, 3))
  for _ in range(n):
    grads = jax.grad(lambda p: (nnx.merge(graphdef, p)(x) ** 2).mean())(state["params"])
    updates, opt = tx.update(grads, state["opt"], state["params"])
    state = {"params": optax.apply_updates(state["params"], updates), "opt": opt}
  return state


@pytest.mark.slow
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
  graphdef, tx, state = _setup(0)
  state = _train(graphdef, tx, state, 3, seed=1)
  key = jax.random.key(42)
  TrainCheckpointer(tmp_path / "ckpt").save(3, state, key, {"iteration": 3, "order": np.arange(5)[::-1]})
  expected = _train(graphdef, tx, state, 2, seed=2)  # the uninterrupted run goes on

  _, _, fresh = _setup(7)  # a different init: everything must come from the checkpoint
  restored = TrainCheckpointer(tmp_path / "ckpt").restore(fresh)
  assert restored is not None and restored.step == 3
  assert restored.meta == {"iteration": 3, "order": [4, 3, 2, 1, 0]}
  np.testing.assert_array_equal(jax.random.key_data(restored.key), jax.random.key_data(key))
  resumed = _train(graphdef, tx, restored.state, 2, seed=2)
  for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_restore_without_checkpoint_returns_none(tmp_path):
  _, _, state = _setup(0)
  assert TrainCheckpointer(tmp_path / "empty").restore(state) is None


def test_keeps_only_the_newest(tmp_path):
  _, _, state = _setup(0)
  ckpt = TrainCheckpointer(tmp_path / "c", max_to_keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, state, jax.random.key(step), {"iteration": step})
  assert ckpt.latest_step() == 3
  assert sorted(int(p.name) for p in (tmp_path / "c").iterdir() if p.name.isdigit()) == [2, 3]


def test_a_checkpoint_of_another_model_is_named_not_half_loaded(tmp_path):
  _, _, state = _setup(0)
  TrainCheckpointer(tmp_path / "c").save(1, state, jax.random.key(0), {"iteration": 1})
  other = jax.tree.map(lambda x: jax.numpy.zeros((x.shape[0] + 1,) + x.shape[1:], x.dtype) if x.ndim else x, state)
  with pytest.raises(ValueError, match="does not fit this model"):
    TrainCheckpointer(tmp_path / "c").restore(other)


def _damage(step_dir: pathlib.Path, how: str) -> None:
  files = sorted(f for f in step_dir.rglob("*") if f.is_file())
  if how == "delete_state":
    shutil.rmtree(step_dir / "state")
  elif how == "delete_meta":
    shutil.rmtree(step_dir / "meta")
  elif how == "garbage_every_file":
    for f in files:
      f.write_bytes(b"\x00garbage" * 7)
  elif how == "truncate_every_file":
    for f in files:
      f.write_bytes(f.read_bytes()[: max(0, f.stat().st_size // 3)])
  elif how == "meta_not_an_object":
    for f in (step_dir / "meta").rglob("*"):
      if f.is_file():
        f.write_text("[1, 2, 3]")


@pytest.mark.parametrize("how", ["delete_state", "delete_meta", "garbage_every_file", "truncate_every_file",
                                 "meta_not_an_object"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_intact_one(tmp_path, how):
  _, _, state = _setup(0)
  ckpt = TrainCheckpointer(tmp_path / "c", max_to_keep=3)
  for step in (1, 2):
    ckpt.save(step, jax.tree.map(lambda x, s=step: x + s if x.dtype.kind == "f" else x, state), jax.random.key(step),
              {"iteration": step})
  _damage(tmp_path / "c" / "2", how)
  with pytest.warns(RuntimeWarning, match=r"checkpoint 2 in .*resuming from checkpoint 1"):
    restored = TrainCheckpointer(tmp_path / "c", max_to_keep=3).restore(state)
  assert restored.step == 1 and restored.meta == {"iteration": 1}
  want = jax.tree.map(lambda x: x + 1 if x.dtype.kind == "f" else x, state)
  for a, b in zip(jax.tree.leaves(restored.state), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(jax.random.key_data(restored.key), jax.random.key_data(jax.random.key(1)))


def test_no_readable_checkpoint_is_an_error_naming_each(tmp_path):
  _, _, state = _setup(0)
  ckpt = TrainCheckpointer(tmp_path / "c", max_to_keep=3)
  for step in (1, 2):
    ckpt.save(step, state, jax.random.key(step), {"iteration": step})
  for step in (1, 2):
    _damage(tmp_path / "c" / str(step), "delete_state")
  with pytest.raises(ValueError, match=r"no checkpoint in .* can be read: checkpoint 2 .*checkpoint 1"):
    TrainCheckpointer(tmp_path / "c").restore(state)
