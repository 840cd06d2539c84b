"""Device mesh, the logical->physical sharding table, and the jitted, mesh-sharded train step.

The mesh has three axes, ``data`` (pure data parallel), ``fsdp`` (data parallel with sharded
parameters and optimizer state) and ``tensor`` (tensor parallel). ``LOGICAL_AXIS_RULES``
(``models/axes.py``, re-exported here) is the only place these physical names appear: models name their parameter axes logically
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
import dataclasses
from typing import Any, Callable, Hashable, Mapping, Sequence

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

# The logical-axis table and its helpers live beside the model that names the axes (models/axes.py);
# re-exported here, where the trainer's mesh and step use them.
from models.axes import (  # noqa: F401
    DECODE_AXIS_RULES, LOGICAL_AXES_KEY, LOGICAL_AXIS_RULES, LOGICAL_UNITS_KEY, MESH_AXES, Rules, _axes_size,
    _entry_axes, _fallback_spec, _is_var, activation_sharding, constrain, logical_to_spec, param_shardings,
)
from rti_jax.objectives import LossConfig, RTIBatch, next_token_logprobs
from rti_jax.step_fns import MemoryModel, StepOutput, TrainState, jit_step_functions  # noqa: F401 (types re-exported)


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
