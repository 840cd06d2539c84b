"""The sampler's copy of a policy's parameters: cast to the compute dtype, laid out for decoding.

A trainer keeps fp32 master weights split for training (``rti_jax.sharding.LOGICAL_AXIS_RULES``:
``embed`` over ``fsdp``); the sampler decodes from a copy in the compute dtype (bf16 for a
bf16 policy), laid out by ``rti_jax.sharding.DECODE_AXIS_RULES`` (whole along ``embed``, split
along heads / mlp / vocab), made by one jitted cast whose output shardings are that layout: the
all-gathers and the cast run on the devices, nothing passes through the host. A policy whose
parameters already have that dtype and layout (an fp32 policy on one device) is used as it is,
without a copy.

Casting before the matmul gives the numbers a module computing in that dtype gets anyway
(``nnx.Linear`` and ``nnx.Embed`` cast their parameters to ``dtype`` before use).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from models.axes import DECODE_AXIS_RULES, MESH_AXES, param_shardings


def state_mesh(state: Any) -> Mesh | None:
  """The mesh a state's arrays are spread over, if any array spans more than one device; else None.

  Raises ValueError if that mesh lacks the axes of ``rti_jax.sharding.MESH_AXES``.
  """
  for leaf in jax.tree.leaves(state):
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
      mesh = sharding.mesh
      if not set(MESH_AXES) <= set(mesh.axis_names):
        raise ValueError(f"model: expected parameters on a mesh with axes {MESH_AXES} "
                         f"(rti_jax.sharding.make_mesh), got axes {tuple(mesh.axis_names)}")
      return mesh
  return None


def _cast(state: Any, dtype: Any) -> Any:
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)


class DecodeCopy:
  """Makes the decode copy of states shaped like ``state`` (same graph, any values).

  mesh: the decoding mesh (None: no resharding, the arrays stay where they are). dtype: the
  copy's floating-point dtype.
  """

  def __init__(self, state: Any, *, mesh: Mesh | None, dtype: Any):
    self.mesh = mesh
    self.dtype = jnp.dtype(dtype)
    self.shardings = None if mesh is None else param_shardings(state, mesh, rules=DECODE_AXIS_RULES)
    kw = {} if self.shardings is None else {"out_shardings": self.shardings}
    self._copy = jax.jit(_cast, static_argnames=("dtype",), **kw)

  def _in_place(self, state: Any) -> bool:
    """Whether ``state`` already has the copy's dtype and layout (so no copy is needed)."""
    leaves = jax.tree.leaves(state)
    if any(jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != self.dtype for x in leaves):
      return False
    if self.shardings is None:
      return True
    return all(isinstance(x, jax.Array) and x.sharding.is_equivalent_to(s, x.ndim)
               for x, s in zip(leaves, jax.tree.leaves(self.shardings)))

  def __call__(self, state: Any) -> Any:
    """``state`` cast to ``dtype`` and placed on the decode layout (``state`` itself if it already is)."""
    if self._in_place(state):
      return state
    return self._copy(state, dtype=self.dtype)
