"""Training checkpoints with orbax ``CheckpointManager``.

One checkpoint holds everything a resumed run needs to continue exactly where an
uninterrupted run would be: the train state (any pytree: parameters and optimizer
state, e.g. ``sharding.TrainState``), the PRNG key, and a JSON record (iteration,
data order, anything else the trainer puts in ``meta``). Restoring into a template
state puts every array back with the template's sharding, so a mesh-sharded state
is never gathered on one device. The final policy leaves the project in HF format
through ``models.save_pretrained``; these checkpoints are for resuming.

In a multi-process job (``rti_jax.distributed``) every process calls ``save`` and ``restore``
together on the same directory (a file system all of them see): orbax writes each array shard
once and the metadata from process 0, and restores every process's own shards. The PRNG key,
the same on every process, is stored as a host array there.
"""

from __future__ import annotations

import dataclasses
import pathlib
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from rti_jax import distributed
from rti_jax.reporting import to_jsonable


class _DoesNotFit(ValueError):
  """A checkpoint that reads, but whose arrays do not fit the template (another model or optimizer)."""


@dataclasses.dataclass
class Restored:
  """What ``TrainCheckpointer.restore`` returns."""

  step: int
  state: Any
  key: jax.Array
  meta: dict[str, Any]


class TrainCheckpointer:
  """Saves and restores (state, key, meta) at integer steps.

  directory: where checkpoints go (created if absent).
  max_to_keep: older checkpoints beyond this many are deleted.
  """

  def __init__(self, directory: str | pathlib.Path, max_to_keep: int = 2):
    self.directory = pathlib.Path(directory).resolve()
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
    )

  def save(self, step: int, state: Any, key: jax.Array, meta: dict[str, Any]) -> None:
    """Writes checkpoint ``step`` and waits until it is on disk."""
    item = {"state": state, "key": _key_item(key)}
    self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(item), meta=ocp.args.JsonSave(to_jsonable(meta))),
    )
    self._manager.wait_until_finished()

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, template: Any, step: int | None = None) -> Restored | None:
    """Loads ``step`` (default: the newest intact one) shaped and sharded like ``template``; None if
    there is none.

    Without ``step``, a checkpoint that cannot be read (a damaged or missing part) is skipped with a
    warning naming it and the one restored instead, so a run resumes from the previous intact
    checkpoint. A checkpoint that reads but does not fit ``template`` (another model or optimizer)
    raises ValueError, since no older checkpoint of the same run dir would fit either.
    """
    self._manager.reload()
    steps = sorted(self._manager.all_steps(), reverse=True) if step is None else [step]
    if not steps:
      return None
    failures: list[str] = []
    for s in steps:
      try:
        restored = self._restore_step(template, s)
      except _DoesNotFit:
        raise
      except Exception as e:  # orbax / tensorstore / JSON errors of a damaged checkpoint
        failures.append(f"checkpoint {s} in {self.directory}: {type(e).__name__}: {str(e)[:300]}")
        continue
      if failures:
        warnings.warn("could not read " + "; ".join(failures) + f"; resuming from checkpoint {s} instead",
                      RuntimeWarning, stacklevel=2)
      return restored
    raise ValueError("no checkpoint in " + str(self.directory) + " can be read: " + "; ".join(failures))

  def _restore_step(self, template: Any, step: int) -> Restored:
    item = {"state": template, "key": _key_item(jax.random.key(0))}
    try:
      out = self._manager.restore(
          step,
          args=ocp.args.Composite(state=ocp.args.StandardRestore(item), meta=ocp.args.JsonRestore()),
      )
    except ValueError as e:
      if "shape" in str(e).lower() or "structure" in str(e).lower() or "tree" in str(e).lower():
        raise _DoesNotFit(
            f"checkpoint {step} in {self.directory} does not fit this model and optimizer (resume only with "
            f"the policy and config that wrote it, or use a new run dir): {e}") from e
      raise
    meta = out["meta"]
    if not isinstance(meta, dict):
      raise ValueError(f"meta: expected a JSON object, got {type(meta).__name__}")
    key = jax.random.wrap_key_data(np.asarray(out["state"]["key"]))
    return Restored(step=step, state=out["state"]["state"], key=key, meta=dict(meta))

  def close(self) -> None:
    self._manager.close()


def _key_item(key: jax.Array) -> Any:
  """The key's data as checkpointed: a device array in one process; with several, a host array (a
  process-local device array cannot be saved collectively; the key is the same on every process)."""
  data = jax.random.key_data(key)
  return np.asarray(data) if distributed.multi_process() else data

