"""Training checkpoints with orbax ``CheckpointManager``.

One checkpoint holds everything a resumed run needs to continue exactly where an
uninterrupted run would be: model parameters, optimizer state, the PRNG key, and a
JSON record (iteration, data order, anything else the trainer puts in ``meta``).
The final policy leaves the project in HF format through ``models.save_pretrained``;
these checkpoints are for resuming.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx


@dataclasses.dataclass
class Restored:
  """What ``TrainCheckpointer.restore`` returns (the model and optimizer are updated in place)."""

  step: int
  key: jax.Array
  meta: dict[str, Any]


class TrainCheckpointer:
  """Saves and restores (model, optimizer, key, meta) at integer steps.

  directory: where checkpoints go (created if absent).
  max_to_keep: older checkpoints beyond this many are deleted.
  """

  def __init__(self, directory: str | pathlib.Path, max_to_keep: int = 2):
    self.directory = pathlib.Path(directory).resolve()
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
    )

  @staticmethod
  def _pure_state(model: nnx.Module, optimizer: nnx.Optimizer, key: jax.Array) -> dict[str, Any]:
    return {
        "model": nnx.to_pure_dict(nnx.state(model, nnx.Param)),
        "optimizer": nnx.to_pure_dict(nnx.state(optimizer)),
        "key": jax.random.key_data(key),
    }

  def save(self, step: int, model: nnx.Module, optimizer: nnx.Optimizer, key: jax.Array, meta: dict[str, Any]) -> None:
    """Writes checkpoint ``step`` and waits until it is on disk."""
    state = self._pure_state(model, optimizer, key)
    self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(_jsonable(meta))),
    )
    self._manager.wait_until_finished()

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, model: nnx.Module, optimizer: nnx.Optimizer, step: int | None = None) -> Restored | None:
    """Loads ``step`` (default: the latest) into ``model`` and ``optimizer``; None if there is none."""
    step = self._manager.latest_step() if step is None else step
    if step is None:
      return None
    template = self._pure_state(model, optimizer, jax.random.key(0))
    out = self._manager.restore(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardRestore(template), meta=ocp.args.JsonRestore()),
    )
    state = out["state"]
    model_state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(model_state, state["model"])
    nnx.update(model, model_state)
    opt_state = nnx.state(optimizer)
    nnx.replace_by_pure_dict(opt_state, state["optimizer"])
    nnx.update(optimizer, opt_state)
    key = jax.random.wrap_key_data(np.asarray(state["key"]))
    return Restored(step=step, key=key, meta=dict(out["meta"]))

  def close(self) -> None:
    self._manager.close()


def _jsonable(obj: Any) -> Any:
  if isinstance(obj, dict):
    return {str(k): _jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_jsonable(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  if isinstance(obj, (np.integer,)):
    return int(obj)
  if isinstance(obj, (np.floating,)):
    return float(obj)
  return obj
