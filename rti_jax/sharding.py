"""Device mesh, the logical->physical sharding table, and the jitted, mesh-sharded train step.

The mesh has three axes, ``data`` (pure data parallel), ``fsdp`` (data parallel with sharded
parameters and optimizer state) and ``tensor`` (tensor parallel). ``LOGICAL_AXIS_RULES`` is
the only place these physical names appear: models name their parameter axes logically
(``"vocab"``, ``"embed"``, ``"mlp"``, ...), via the variable metadata key ``logical_axes``::

  nnx.Linear(d, v, kernel_init=nnx.with_metadata(init, logical_axes=("embed", "vocab")), ...)

and ``logical_to_spec`` maps them to a ``PartitionSpec``. ``models.Qwen`` takes its parameters'
axes from its weight table (``models.weight_table``); parameters of other modules without that
metadata fall back to the ``"fallback"`` rule (largest dimension divisible by the axis size). A
dimension that does not divide the mesh axes it is mapped to is replicated instead (a
documented, counted fallback: ``ShardedTrainStep.fallbacks``).

Activations are named the same way (``"batch"``, ``"act_heads"``, ``"act_mlp"``, ...): inside
``activation_sharding(mesh)`` (the train step and the sampler enter it while tracing),
``constrain(x, axes)`` adds a sharding constraint; elsewhere, and on one device, it is the
identity. ``DECODE_AXIS_RULES`` is the sampler's variant of the table (weights whole along
``embed``).

The train step is ``jax.jit`` with ``NamedSharding`` in/out shardings (no ``pjit``): it runs
``logits = model(input_ids, attention_mask)`` [B, T, V], ``logp = logp_fn(logits, input_ids)``
[B, T], the registered loss (``LossConfig.name``, e.g. Eq. 7 for ``"rti"``), ``value_and_grad``
and an optax update.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import math
from typing import Any, Callable, Hashable, Iterator, Mapping, NamedTuple, Sequence

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from rti_jax.objectives import LossConfig, RTIBatch, next_token_logprobs

MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")

LOGICAL_AXIS_RULES: Mapping[str, tuple[str, ...] | None] = {
    # activations
    "batch": ("data", "fsdp"),
    "seq": None,
    "act_embed": None,
    "act_heads": ("tensor",),
    "act_kv_heads": ("tensor",),
    "act_mlp": ("tensor",),
    "act_vocab": ("tensor",),
    # parameters
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "mlp": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "experts": ("tensor",),
    "head_dim": None,
    "norm": None,
    "layers": None,
    # parameters without ``logical_axes`` metadata: largest divisible dimension
    "fallback": ("fsdp",),
}
"""Logical axis name -> tuple of mesh axes (or None = replicated). The single sharding table."""

Rules = Mapping[str, "tuple[str, ...] | None"]
"""The type of a sharding table."""

DECODE_AXIS_RULES: Rules = {**LOGICAL_AXIS_RULES, "embed": None}
"""The sampler's table: as the trainer's, but parameters are not split over ``embed`` (each decode
step would otherwise gather every weight); the batch still splits as ``"batch"`` says."""

LOGICAL_AXES_KEY = "logical_axes"
"""Variable metadata key holding a parameter's logical axis names (one per dimension)."""

LOGICAL_UNITS_KEY = "logical_units"
"""Optional variable metadata key: per dimension, the size of the blocks it may be split into (a
fused ``heads * head_dim`` dimension is split only between heads: unit ``head_dim``)."""


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, *,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ``(data, fsdp, tensor)`` mesh with Auto axis types over ``devices`` (default: all).

  The product of the axis sizes must equal the number of devices used.
  """
  sizes = dict(zip(MESH_AXES, (data, fsdp, tensor)))
  for name, size in sizes.items():
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
      raise ValueError(f"{name}: expected a positive int mesh axis size, got {size!r}")
  devs = list(jax.devices() if devices is None else devices)
  if data * fsdp * tensor != len(devs):
    raise ValueError(f"data*fsdp*tensor: expected {len(devs)} (the number of devices), got "
                     f"{data}*{fsdp}*{tensor}={data * fsdp * tensor}")
  return jax.make_mesh((data, fsdp, tensor), MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=devs)


def _entry_axes(entry: Any) -> tuple[str, ...]:
  """Mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def _axes_size(mesh: Mesh, axes: Any) -> int:
  return math.prod(mesh.shape[a] for a in _entry_axes(axes))


def logical_to_spec(logical_axes: Sequence[str | None], *, mesh: Mesh | None = None,
                    shape: Sequence[int] | None = None,
                    rules: Mapping[str, tuple[str, ...] | None] = LOGICAL_AXIS_RULES,
                    fallbacks: list[str] | None = None, name: str = "array",
                    units: Sequence[int] | None = None) -> PartitionSpec:
  """PartitionSpec for an array whose dimensions carry ``logical_axes`` (None = replicated).

  With ``mesh`` and ``shape``, a dimension whose size is not divisible by its mesh axes (times
  its entry of ``units``, default 1: the blocks it may be split into), or whose mesh axes are
  already used by an earlier dimension, is replicated and a note is appended to ``fallbacks``.
  Unknown logical names raise ValueError.
  """
  if shape is not None and len(logical_axes) != len(shape):
    raise ValueError(f"{name}: expected {len(shape)} logical axes (one per dimension of shape "
                     f"{tuple(shape)}), got {tuple(logical_axes)}")
  used: set[str] = set()
  spec: list[tuple[str, ...] | None] = []
  for i, logical in enumerate(logical_axes):
    if logical is None:
      spec.append(None)
      continue
    if logical not in rules:
      raise ValueError(f"{name}: logical axis {logical!r} is not in the sharding rules {sorted(rules)}")
    axes = rules[logical]
    if not axes:
      spec.append(None)
      continue
    axes = tuple(axes)
    if mesh is not None:
      problem = None
      if used & set(axes):
        problem = f"mesh axes {axes} already used"
      elif shape is not None and shape[i] % (_axes_size(mesh, axes) * (units[i] if units else 1)) != 0:
        problem = f"size {shape[i]} not divisible by {axes}={_axes_size(mesh, axes)}"
        problem += f" blocks of {units[i]}" if units and units[i] > 1 else ""
      if problem:
        if fallbacks is not None:
          fallbacks.append(f"{name} dim {i} ({logical}): {problem}; replicated")
        spec.append(None)
        continue
      axes = tuple(a for a in axes if mesh.shape[a] > 1) or None
    if axes:
      used |= set(axes)
    spec.append(axes)
  return PartitionSpec(*spec)


_ACTIVATION_MESH: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
    "activation_mesh", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh | None, rules: Rules = LOGICAL_AXIS_RULES) -> Iterator[None]:
  """While active, :func:`constrain` pins activations to ``mesh`` through ``rules``.

  Enter it inside the function being traced (the train step and the sampler do), so each jitted
  program's constraints follow the mesh it was built for. ``mesh`` None or of one device: no
  constraints at all (the single-device program is unchanged).
  """
  token = _ACTIVATION_MESH.set(None if mesh is None or mesh.size == 1 else (mesh, rules))
  try:
    yield
  finally:
    _ACTIVATION_MESH.reset(token)


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
  """``x`` with a sharding constraint from its dimensions' logical names (one per dimension) under
  the active :func:`activation_sharding`; ``x`` unchanged outside one. A dimension its mesh axes do
  not divide (a batch of one row while decoding) is left unconstrained (replicated)."""
  active = _ACTIVATION_MESH.get()
  if active is None:
    return x
  mesh, rules = active
  spec = logical_to_spec(tuple(logical_axes), mesh=mesh, shape=x.shape, rules=rules, name="activation")
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def _fallback_spec(shape: tuple[int, ...], mesh: Mesh,
                   rules: Mapping[str, tuple[str, ...] | None]) -> PartitionSpec:
  """Shards the largest dimension divisible by the ``fallback`` axes; replicated otherwise."""
  axes = tuple(rules.get("fallback") or ())
  size = _axes_size(mesh, axes) if axes else 1
  if size <= 1 or not shape:
    return PartitionSpec()
  for i in sorted(range(len(shape)), key=lambda j: -shape[j]):
    if shape[i] % size == 0:
      spec: list[Any] = [None] * len(shape)
      spec[i] = axes
      return PartitionSpec(*spec)
  return PartitionSpec()


def _is_var(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def param_shardings(params: Any, mesh: Mesh, *,
                    rules: Mapping[str, tuple[str, ...] | None] = LOGICAL_AXIS_RULES,
                    fallbacks: list[str] | None = None) -> Any:
  """NamedSharding for every parameter of an ``nnx.State`` (same tree structure as ``params``).

  Uses each variable's ``logical_axes`` metadata through ``rules``; variables without it use
  the ``"fallback"`` rule.
  """

  def one(path: tuple, var: Any) -> Any:
    name = jax.tree_util.keystr(path)
    if not _is_var(var):
      return NamedSharding(mesh, PartitionSpec())
    shape = tuple(np.shape(var.get_value()))
    logical = var.get_metadata().get(LOGICAL_AXES_KEY)
    if logical is None:
      spec = _fallback_spec(shape, mesh, rules)
    else:
      spec = logical_to_spec(tuple(logical), mesh=mesh, shape=shape, rules=rules,
                             fallbacks=fallbacks, name=name, units=var.get_metadata().get(LOGICAL_UNITS_KEY))
    return var.replace(NamedSharding(mesh, spec))

  return jax.tree_util.tree_map_with_path(one, params, is_leaf=_is_var)


def _opt_state_shardings(opt_state_shape: Any, params: Any, params_shardings: Any, mesh: Mesh) -> Any:
  """Optimizer-state leaves whose key path ends with a parameter's path and that have its
  shape get that parameter's sharding (Adam moments, ...); everything else is replicated."""
  by_path: dict[tuple, tuple[tuple[int, ...], Any]] = {}
  for (path, sh), p in zip(jax.tree_util.tree_leaves_with_path(params_shardings),
                           jax.tree.leaves(params)):
    by_path[tuple(str(k) for k in path)] = (tuple(np.shape(p)), sh)
  replicated = NamedSharding(mesh, PartitionSpec())

  def one(path: tuple, leaf: Any) -> Any:
    keys = tuple(str(k) for k in path)
    for n in range(len(keys), 0, -1):
      hit = by_path.get(keys[-n:])
      if hit is not None and hit[0] == tuple(getattr(leaf, "shape", ())):
        return hit[1]
    return replicated

  return jax.tree_util.tree_map_with_path(one, opt_state_shape)


def batch_sharding(mesh: Mesh, *,
                   rules: Mapping[str, tuple[str, ...] | None] = LOGICAL_AXIS_RULES) -> NamedSharding:
  """Sharding of every batch array: leading (batch) dimension over the ``"batch"`` rule's axes."""
  return NamedSharding(mesh, logical_to_spec(("batch",), mesh=mesh, rules=rules))


class StepOutput(NamedTuple):
  """loss: float32 scalar; grads: like params (before the optax update); metrics: dict of scalars."""

  loss: jax.Array
  grads: Any
  metrics: dict


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  """params: ``nnx.State`` of the model's ``nnx.Param`` variables; rest: its other state
  (read-only in the step); opt_state: the optax state."""

  params: Any
  rest: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class ShardedTrainStep:
  """What ``make_train_step`` builds.

  step(state, batch) -> (new_state, StepOutput): the jitted train step.
  grads(state, batch) -> (numerator gradients, numerator, denominator, metrics) and
  apply(state, grads, numerator, denominator) -> (new_state, StepOutput): the same step in two
    jitted halves, so gradients of several batches of different shapes (rows packed by length)
    can be summed before one optimizer update (``step(state, b)`` ==
    ``apply(state, *grads(state, b)[:3])``).
  state: the initial ``TrainState``, placed on the mesh.
  graphdef: rebuild the model with ``merge(state)``.
  fallbacks: parameter dimensions that were replicated instead of sharded, with the reason.
  """

  step: Callable[[TrainState, RTIBatch], tuple[TrainState, StepOutput]]
  state: TrainState
  graphdef: Any
  mesh: Mesh
  state_shardings: TrainState
  batch_sharding: NamedSharding
  fallbacks: tuple[str, ...]
  micro_batches: int = 1
  grads: Callable[[TrainState, RTIBatch], tuple[Any, jax.Array, jax.Array, dict]] | None = None
  apply: Callable[[TrainState, Any, jax.Array, jax.Array], tuple[TrainState, StepOutput]] | None = None

  def merge(self, state: TrainState) -> nnx.Module:
    """The NNX model holding ``state``'s parameters."""
    return nnx.merge(self.graphdef, state.params, state.rest)

  @property
  def data_parallel_degree(self) -> int:
    """Devices the batch dimension is split over."""
    return _axes_size(self.mesh, self.batch_sharding.spec[0] if self.batch_sharding.spec else None)

  def check_batch(self, batch: RTIBatch) -> None:
    """``batch.check()``, and B divisible by the data-parallel degree x micro-batches."""
    batch.check()
    b = batch.shape[0]
    n = self.data_parallel_degree
    if b % (n * self.micro_batches) != 0:
      raise ValueError(f"batch.input_ids: expected a batch size divisible by the data-parallel "
                       f"degree {n} x micro_batches {self.micro_batches}, got B={b}")

  def shard_batch(self, batch: RTIBatch) -> RTIBatch:
    """Places a host batch on the mesh (batch dimension split); checks B divides evenly."""
    self.check_batch(batch)
    return jax.device_put(batch, self.batch_sharding)


LogpFn = Callable[[jax.Array, jax.Array], jax.Array]

#: Jitted (step, grads, apply) of ``make_train_step`` calls given a ``tx_key``, newest last: a second
#: trainer of the same model, optimizer, mesh and loss (the next seed, an ablation variant) reuses the
#: compiled programs instead of compiling every batch shape again.
_STEP_CACHE: collections.OrderedDict[Hashable, tuple[Callable, Callable, Callable]] = collections.OrderedDict()
_STEP_CACHE_SIZE = 8


def make_train_step(model: nnx.Module, tx: optax.GradientTransformation, mesh: Mesh,
                    loss_cfg: LossConfig, *, logp_fn: LogpFn = next_token_logprobs,
                    rules: Mapping[str, tuple[str, ...] | None] = LOGICAL_AXIS_RULES,
                    micro_batches: int = 1, donate: bool = False,
                    tx_key: Hashable | None = None, remat: str = "none", vocab_chunk: int | None = None,
                    tokens_per_device: int | None = None, scan_layers: bool = False) -> ShardedTrainStep:
  """Builds the sharded train step for any NNX model with ``logits = model(input_ids, attention_mask)``.

  model: an NNX module returning logits [B, T, V]; tx: optax transformation; mesh: from
  ``make_mesh``; loss_cfg: which registered loss and its settings; logp_fn(logits [B, T, V],
  input_ids [B, T]) -> logp [B, T] aligned with ``input_ids`` (default ``next_token_logprobs``).
  micro_batches: k > 1 runs the forward/backward on k micro-batches of B/k rows (rows
  ``j, j+k, j+2k, ...`` form micro-batch j, so each device keeps its rows) in a ``lax.scan``
  and sums the loss numerators, denominators and numerator gradients; the loss and gradients
  then equal the full-batch ones exactly (up to float summation order). Metrics are the mean
  over micro-batches. donate: donate the input state buffers to the step.
  tx_key: a hashable description of ``tx`` (e.g. its name and hyperparameters); given, the jitted
  functions (and so their compiled programs) are shared with earlier calls of the same model graph,
  mesh, loss, ``tx_key`` and options. Two different ``tx`` must never be given the same key.
  Gradients take each parameter's dtype, so a step returns a state of the same dtypes (bf16
  parameters keep bf16 moments; keep fp32 parameters for fp32 master weights).
  Parameters and optimizer moments are sharded by ``param_shardings``; the batch dimension by
  the ``"batch"`` rule; loss and metrics are replicated.
  The memory model (``rti_jax.step_fns``): remat: each decoder layer's rematerialisation policy
  (``models.qwen.REMAT_POLICIES``); vocab_chunk: log-probs by ``model.token_logprobs`` from hidden
  states, this many vocabulary ids at a time, so the [B, T, V] logits never exist (a model with
  that method; ``logp_fn`` must be the default); tokens_per_device: micro-batches sized so that each
  device runs at most this many tokens (``batch rows / devices`` rows split evenly, at least one row
  each), their numerator gradients, numerators and denominators summed in the scan's carry;
  scan_layers: the decoder layers as one ``lax.scan`` over a stacked view of their parameters.
  """
  if not isinstance(loss_cfg, LossConfig):
    raise ValueError(f"loss_cfg: expected a LossConfig, got {type(loss_cfg).__name__}")
  if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
    raise ValueError(f"micro_batches: expected a positive int, got {micro_batches!r}")
  from rti_jax.step_fns import MemoryModel, jit_step_functions  # the step's body; it imports this module
  memory = MemoryModel.of(model, logp_fn, remat=remat, vocab_chunk=vocab_chunk, tokens_per_device=tokens_per_device,
                          micro_batches=micro_batches, scan_layers=scan_layers)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  fallbacks: list[str] = []
  p_sh = param_shardings(params, mesh, rules=rules, fallbacks=fallbacks)
  replicated = NamedSharding(mesh, PartitionSpec())
  r_sh = jax.tree.map(lambda _: replicated, rest)
  params = jax.device_put(params, p_sh)
  rest = jax.device_put(rest, r_sh)
  o_sh = _opt_state_shardings(jax.eval_shape(tx.init, params), params, p_sh, mesh)
  opt_state = jax.jit(tx.init, out_shardings=o_sh)(params)
  state_sh = TrainState(p_sh, r_sh, o_sh)
  b_sh = batch_sharding(mesh, rules=rules)
  logits_sh = NamedSharding(mesh, logical_to_spec(("batch", "seq", "act_vocab"), mesh=mesh,
                                                  rules=rules))
  key = None if tx_key is None else (tx_key, graphdef, mesh, loss_cfg, logp_fn, micro_batches, donate,
                                     tuple(sorted(rules.items())), memory)
  if key is not None and key in _STEP_CACHE:
    _STEP_CACHE.move_to_end(key)
    jitted, jit_grads, jit_apply = _STEP_CACHE[key]
  else:
    jitted, jit_grads, jit_apply = jit_step_functions(graphdef, tx, mesh, loss_cfg, logp_fn, micro_batches, donate,
                                                      state_sh, b_sh, logits_sh, p_sh, replicated, rules, memory)
    if key is not None:
      _STEP_CACHE[key] = (jitted, jit_grads, jit_apply)
      while len(_STEP_CACHE) > _STEP_CACHE_SIZE:
        _STEP_CACHE.popitem(last=False)
  return ShardedTrainStep(step=jitted, state=TrainState(params, rest, opt_state),
                          graphdef=graphdef, mesh=mesh, state_shardings=state_sh,
                          batch_sharding=b_sh, fallbacks=tuple(fallbacks), micro_batches=micro_batches,
                          grads=jit_grads, apply=jit_apply)
