"""The logical-axis sharding table: the only place the mesh's axis names meet the model's.

The mesh has three axes, ``data`` (pure data parallel), ``fsdp`` (data parallel with sharded
parameters and optimizer state) and ``tensor`` (tensor parallel). Models name their parameter axes
logically (``"vocab"``, ``"embed"``, ``"mlp"``, ...) in the variable metadata key ``logical_axes``,
and their activations' dimensions likewise (``"batch"``, ``"act_heads"``, ...); ``logical_to_spec``
maps names to a ``PartitionSpec`` through ``LOGICAL_AXIS_RULES``. ``constrain`` pins an activation
inside ``activation_sharding(mesh)`` and is the identity elsewhere; ``param_shardings`` lays out a
model's parameters. The trainer's mesh and jitted step (``rti_jax.sharding``) use the same table.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

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
