"""Multi-host training: several processes (one per host, each with its local devices) run one job.

JAX's multi-controller model: every process runs the same program; jitted steps over the global
mesh (``rti_jax.sharding.make_mesh`` spans every process's devices) are collective, and every
process must call them in the same order with the same shapes. What each process does alone:

* rollouts: the iteration's tasks are cut into ``mesh.rollout_slices`` contiguous slices (0: one
  per process), slice ``k`` seeded by ``fold_in(iteration key, k)`` (slice 0 by the key itself, so
  one slice is exactly the single-process loop); each process rolls out a contiguous block of
  slices with its own sampler on its local devices (``local_mesh``, ``process_local``). The groups
  are then gathered (``allgather_objects``) so every process holds the same, complete iteration in
  slice order: metrics, advantages and batch layout are the same on all of them and the same as a
  single process with the same slice count.
* the batch: each process hands only the rows its devices hold to
  ``jax.make_array_from_process_local_data`` (``place_batch``).
* evaluation chunks are spread over the processes and their successes summed (``owned``,
  ``sum_over_processes``).
* files: only process 0 writes metrics, results, plots and the exported policy (``is_writer``);
  orbax checkpoints are saved and restored by all processes together (``rti_jax.checkpoint``).

Every helper is the identity (or the plain single-process call) when ``jax.distributed`` was not
initialised, so a single-process run is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
from typing import Any, Callable, Sequence, TypeVar

import jax
import numpy as np

T = TypeVar("T")

ENV_COORDINATOR = "RTI_COORDINATOR"
ENV_NUM_PROCESSES = "RTI_NUM_PROCESSES"
ENV_PROCESS_ID = "RTI_PROCESS_ID"


def wanted(mesh_cfg: Any) -> bool:
  """Whether the config (or the environment) asks for ``jax.distributed``."""
  return bool(mesh_cfg.distributed or mesh_cfg.coordinator or os.environ.get(ENV_COORDINATOR))


def initialize(mesh_cfg: Any) -> bool:
  """Calls ``jax.distributed.initialize`` once when ``mesh.distributed`` (or a coordinator) is set;
  True when this process is part of a multi-process job. Must run before anything touches a JAX
  device (JAX refuses to initialise after its backends start).

  Unset settings come from ``RTI_COORDINATOR`` / ``RTI_NUM_PROCESSES`` / ``RTI_PROCESS_ID``, and
  what is still unset from JAX's own cluster detection (SLURM, Open MPI, Kubernetes, Cloud TPU).

  A lost process: when one process stops sending heartbeats for ``mesh.heartbeat_timeout_s``
  seconds (killed, out of memory, preempted), JAX's coordination service ends every other process
  (non-zero exit, "The following tasks are unhealthy (stopped sending heartbeats): <process ids>",
  or, when process 0 is the one lost, "Failed to send RPC to coordination service ... the leader
  task ... died"), whether it was waiting in a collective, a barrier or working alone. Nothing
  partial is kept: metrics lines are appended whole per finished iteration and checkpoints are
  renamed into place once complete, so restarting every process resumes from the last checkpoint.
  """
  if jax.distributed.is_initialized():
    return jax.process_count() > 1
  if not wanted(mesh_cfg):
    return False
  coordinator = mesh_cfg.coordinator or os.environ.get(ENV_COORDINATOR) or None
  num = mesh_cfg.num_processes or _env_int(ENV_NUM_PROCESSES, 0)
  pid = mesh_cfg.process_id if mesh_cfg.process_id >= 0 else _env_int(ENV_PROCESS_ID, -1)
  if coordinator is not None and (num < 1 or pid < 0):
    raise ValueError(f"mesh.coordinator={coordinator!r}: also needs mesh.num_processes and mesh.process_id (or "
                     f"{ENV_NUM_PROCESSES} / {ENV_PROCESS_ID}), got {num} and {pid}")
  if num and pid >= num:
    raise ValueError(f"mesh.process_id: expected < mesh.num_processes={num}, got {pid}")
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=num or None,
                             process_id=pid if pid >= 0 else None,
                             heartbeat_timeout_seconds=int(getattr(mesh_cfg, "heartbeat_timeout_s", 100)))
  return jax.process_count() > 1


def _env_int(name: str, default: int) -> int:
  raw = os.environ.get(name, "").strip()
  if not raw:
    return default
  try:
    return int(raw)
  except ValueError:
    raise ValueError(f"{name}: expected an integer, got {raw!r}") from None


def process_count() -> int:
  """Processes of the job (1 without ``jax.distributed``; never starts a JAX backend then)."""
  return jax.process_count() if jax.distributed.is_initialized() else 1


def process_index() -> int:
  """This process's index (0 without ``jax.distributed``)."""
  return jax.process_index() if jax.distributed.is_initialized() else 0


def multi_process() -> bool:
  return process_count() > 1


def is_writer() -> bool:
  """True on the one process that writes files (process 0; always true in a single process)."""
  return process_index() == 0


# --- slicing -------------------------------------------------------------------------------------


def slice_bounds(n: int, parts: int, k: int) -> tuple[int, int]:
  """``[lo, hi)`` of contiguous part ``k`` of ``range(n)`` cut into ``parts`` near-equal parts (the
  first ``n % parts`` one longer)."""
  if parts < 1 or not 0 <= k < parts:
    raise ValueError(f"slice_bounds: expected 0 <= k < parts, got k={k}, parts={parts}")
  base, extra = divmod(n, parts)
  lo = k * base + min(k, extra)
  return lo, lo + base + (k < extra)


def owned(items: Sequence[T]) -> list[T]:
  """This process's contiguous share of ``items`` (all of them in a single process)."""
  lo, hi = slice_bounds(len(items), process_count(), process_index())
  return list(items[lo:hi])


def num_rollout_slices(mesh_cfg: Any, tasks_per_iter: int) -> int:
  """``mesh.rollout_slices`` (0: one per process), checked against the process count and the tasks."""
  n = mesh_cfg.rollout_slices or process_count()
  if n % process_count():
    raise ValueError(f"mesh.rollout_slices: expected a multiple of the {process_count()} processes, got {n}")
  if tasks_per_iter % n:
    raise ValueError(f"mesh.rollout_slices: expected a divisor of rollout.tasks_per_iter={tasks_per_iter}, got {n}")
  return n


def slice_keys(key: jax.Array, n: int) -> list[jax.Array]:
  """The keys of ``n`` rollout slices: ``key`` itself for slice 0, ``fold_in(key, k)`` for slice k."""
  return [key] + [jax.random.fold_in(key, k) for k in range(1, n)]


# --- host objects across processes ---------------------------------------------------------------


def allgather_objects(obj: Any) -> list[Any]:
  """Every process's ``obj`` (picklable), in process order; ``[obj]`` in a single process."""
  if not multi_process():
    return [obj]
  from jax.experimental import multihost_utils

  data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int64))).reshape(-1)
  padded = np.zeros((1 << int(sizes.max() - 1).bit_length(),), np.uint8)  # few distinct shapes to compile
  padded[:data.size] = data
  every = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
  return [pickle.loads(every[i, :int(s)].tobytes()) for i, s in enumerate(sizes)]


def from_writer(fn: Callable[[], T]) -> T:
  """``fn()`` computed on process 0 (e.g. reading a file only it wrote) and handed to every process."""
  if not multi_process():
    return fn()
  return allgather_objects(fn() if is_writer() else None)[0]


def sum_over_processes(x: np.ndarray) -> np.ndarray:
  """Elementwise sum of every process's ``x`` (same shape on all); ``x`` in a single process."""
  if not multi_process():
    return x
  return np.sum(np.stack(allgather_objects(np.asarray(x))), axis=0).astype(np.asarray(x).dtype)


def barrier(name: str) -> None:
  """Waits until every process reached the barrier ``name`` (no-op in a single process)."""
  if multi_process():
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def merge_counters(parts: Sequence[T]) -> T:
  """Field-wise sum of counter dataclasses (ints, floats, and dicts of counts)."""
  first = parts[0]
  out = {}
  for f in dataclasses.fields(first):  # type: ignore[arg-type]
    vals = [getattr(p, f.name) for p in parts]
    if isinstance(vals[0], dict):
      merged: dict[Any, Any] = {}
      for d in vals:
        for k, v in d.items():
          merged[k] = merged.get(k, 0) + v
      out[f.name] = merged
    else:
      out[f.name] = sum(vals[1:], vals[0])
  return dataclasses.replace(first, **out)  # type: ignore[type-var]


# --- arrays across processes ---------------------------------------------------------------------


def place_batch(train_step: Any, batch: Any) -> Any:
  """A host batch (the same on every process) on the train step's mesh: ``train_step.shard_batch``
  in a single process; with several, each process passes only the rows its devices hold to
  ``jax.make_array_from_process_local_data``."""
  if not multi_process():
    return train_step.shard_batch(batch)
  train_step.check_batch(batch)
  sharding = train_step.batch_sharding

  def one(x: Any) -> Any:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:  # already global (e.g. reference log-probs)
      return jax.device_put(x, sharding)
    host = np.asarray(x)
    lo, hi = local_rows(sharding, host.shape)
    return jax.make_array_from_process_local_data(sharding, host[lo:hi], host.shape)

  return jax.tree.map(one, batch)


def local_rows(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> tuple[int, int]:
  """``[lo, hi)``: the leading-dimension rows this process's devices hold under ``sharding``."""
  rows = set()
  for index in sharding.addressable_devices_indices_map(tuple(shape)).values():
    lo, hi, _ = index[0].indices(shape[0]) if index else (0, shape[0], 1)
    rows.update(range(lo, hi))
  lo, hi = min(rows), max(rows) + 1
  if len(rows) != hi - lo:
    raise ValueError(f"batch sharding {sharding}: this process's rows are not contiguous ({sorted(rows)})")
  return lo, hi


def local_mesh(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  """A mesh over this process's devices with the global mesh's axis names (the rollout sampler's):
  ``mesh`` itself in a single process; else the first of data, fsdp, tensor that the process count
  divides is cut by it."""
  if not multi_process():
    return mesh
  from rti_jax.sharding import make_mesh

  sizes = [int(mesh.shape[a]) for a in mesh.axis_names]
  n = process_count()
  for i, s in enumerate(sizes):
    if s % n == 0:
      sizes[i] = s // n
      break
  else:
    sizes = [jax.local_device_count(), 1, 1]
  if int(np.prod(sizes)) != jax.local_device_count():
    sizes = [jax.local_device_count(), 1, 1]
  return make_mesh(*sizes, devices=jax.local_devices())


@functools.lru_cache(maxsize=8)
def _replicate_fn(mesh: jax.sharding.Mesh) -> Callable[[Any], Any]:
  """One jitted identity per mesh whose outputs are fully replicated (traced once per tree shape)."""
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.jit(lambda tree: tree, out_shardings=sharding)


def _global_leaves_mesh(tree: Any) -> jax.sharding.Mesh | None:
  for leaf in jax.tree.leaves(tree):
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      return getattr(leaf.sharding, "mesh", None)
  return None


def _replicated(tree: Any) -> Any:
  """``tree`` with its process-spanning arrays fully replicated (collective: every process calls it)."""
  mesh = _global_leaves_mesh(tree)
  if mesh is None:
    return tree
  is_global = lambda x: isinstance(x, jax.Array) and not x.is_fully_addressable  # noqa: E731
  globals_ = [x for x in jax.tree.leaves(tree) if is_global(x)]
  done = iter(_replicate_fn(mesh)(globals_))
  return jax.tree.map(lambda x: next(done) if is_global(x) else x, tree)


def process_local(model: Any, mesh: jax.sharding.Mesh) -> Any:
  """An NNX module whose arrays are this process's own full copy, replicated over ``mesh`` (the local
  mesh), for a sampler that decodes this process's rollouts alone. Collective in a multi-process
  job (every process calls it at the same point); ``model`` itself in a single process."""
  if not multi_process():
    return model
  from flax import nnx

  graphdef, state = nnx.split(model)
  state = _replicated(state)
  target = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def one(x: Any) -> Any:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      x = x.addressable_data(0)
    return jax.device_put(x, target) if isinstance(x, (jax.Array, np.ndarray)) else x

  return nnx.merge(graphdef, jax.tree.map(one, state))


def host_arrays(tree: Any) -> Any:
  """``tree`` with every process-spanning array gathered (collective) into a host numpy array;
  ``tree`` itself in a single process."""
  if not multi_process():
    return tree
  tree = _replicated(tree)
  return jax.tree.map(
      lambda x: np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array) and not x.is_fully_addressable else x,
      tree)


def host_model(model: Any) -> Any:
  """``model`` with its parameters gathered on the host (for export); ``model`` in a single process."""
  if not multi_process():
    return model
  from flax import nnx

  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, host_arrays(state))


# --- the trainer's sliced stages 1-2 -------------------------------------------------------------


def check_sliced_method(hooks: Any, slices: int) -> None:
  """Rollout slices run the default stage 1 and no after-intervention hook, and several processes
  attach no per-token batch signals: refuse methods that need them (AEPO's branching rollout and
  entropies, LUFFY's demonstrations, OPD's teacher log-probs) with a clear error."""
  from rti_jax.baselines import MethodHooks

  names = ("rollout", "after_intervention") if slices > 1 else ()
  names += ("batch_signals",) if multi_process() else ()
  own = [name for name in names if getattr(type(hooks), name) is not getattr(MethodHooks, name)]
  if own:
    raise ValueError(f"mesh.rollout_slices={slices} over {process_count()} process(es): this loss.method's "
                     f"{own} hooks are not supported there; use grpo, rti or gspo, or one process with "
                     "mesh.rollout_slices=1")


def sliced_stages(trainer: Any, tasks: Sequence[Any], roll_seeds: Sequence[int], int_seeds: Sequence[int]
                  ) -> tuple[list[list[Any]], np.ndarray, Any, float, float]:
  """Stages 1 (rollout) and 2 (intervention) of one iteration in ``len(roll_seeds)`` contiguous task
  slices, slice k with ``roll_seeds[k]`` / ``int_seeds[k]``; this process runs its own block of slices
  and every process gets all of them back, in slice order.

  Returns the groups, the rewards before intervention ``[tasks, G]``, the summed intervention stats,
  and this process's rollout and intervention seconds.
  """
  import time

  from rti_jax.intervention import pipeline
  from rti_jax.rollout import rollout_groups

  n = len(roll_seeds)
  src = trainer.source
  mine = []
  t_roll = t_int = 0.0
  for k in owned(list(range(n))):
    lo, hi = slice_bounds(len(tasks), n, k)
    part = list(tasks[lo:hi])
    t0 = time.perf_counter()
    groups = rollout_groups(part, src.env_factory, trainer.backend, trainer.formatter, trainer.rollout_config,
                            task_id=src.task_id, seed=roll_seeds[k])
    before = [[t.reward for t in g] for g in groups]
    t1 = time.perf_counter()
    groups, stats = pipeline.intervene_groups(
        groups, part, src.env_factory, trainer.backend, trainer.formatter, trainer.roles,
        trainer.intervention_config, trainer.rollout_config, task_id=src.task_id, seed=int_seeds[k])
    t_roll += t1 - t0
    t_int += time.perf_counter() - t1
    mine.append((groups, before, stats))
  every = [s for per_process in allgather_objects(mine) for s in per_process]
  groups = [g for s in every for g in s[0]]
  before = np.asarray([r for s in every for r in s[1]], np.float32)
  return groups, before, merge_counters([s[2] for s in every]), t_roll, t_int
