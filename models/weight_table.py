"""The declarative Qwen weight table: HF tensor name <-> Flax parameter path, layout, logical axes.

One row per HF tensor (``{i}``: layer index, ``{j}``: expert index). Three readers, so they cannot
drift apart: ``models.weights`` loads and saves HF checkpoints from it, and ``models.qwen`` attaches
each row's logical axes to its parameter (variable metadata ``logical_axes``), which
``rti_jax.sharding`` maps to mesh axes. The fused projections keep HF's flattened layout:
``q_proj`` is ``[embed, heads * head_dim]`` (head-major), so its second dimension is named
``heads`` (split over whole heads), ``k_proj`` / ``v_proj`` likewise ``kv_heads``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, NamedTuple

from models.config import QwenConfig

Axes = tuple[str | None, ...]


@dataclasses.dataclass(frozen=True)
class WeightSpec:
  """One HF tensor <-> one Flax leaf (or, for experts, one slice of a stacked leaf).

  hf: HF name; ``{i}`` stands for the layer index, ``{j}`` for the expert index.
  flax: dotted Flax path, same ``{i}``. With ``{j}`` in ``hf`` the Flax leaf stacks all
    experts on axis 0 and HF tensor j is ``leaf[j]``.
  transpose: HF stores ``[out, in]``, Flax ``[in, out]`` (per expert for stacked leaves).
  axes: logical axes of the Flax leaf (same rank).
  when: (config, layer index or None) -> whether this tensor exists.
  """

  hf: str
  flax: str
  transpose: bool
  axes: Axes
  when: Callable[[QwenConfig, int | None], bool] = lambda c, i: True

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.hf

  @property
  def per_expert(self) -> bool:
    return "{j}" in self.hf


class TableEntry(NamedTuple):
  """One concrete HF tensor of a given config: its name, Flax path, row and expert index."""

  hf: str
  path: tuple[str | int, ...]
  spec: WeightSpec
  expert: int | None


def _dense_mlp(c: QwenConfig, i: int | None) -> bool:
  return not c.is_moe_layer(i)


def _moe(c: QwenConfig, i: int | None) -> bool:
  return c.is_moe_layer(i)


_L = "model.layers.{i}."
_F = "layers.{i}."
WEIGHT_TABLE: tuple[WeightSpec, ...] = (
  WeightSpec("model.embed_tokens.weight", "embed.embedding", False, ("vocab", "embed")),
  WeightSpec("model.norm.weight", "norm.scale", False, ("norm",)),
  WeightSpec("lm_head.weight", "lm_head", True, ("embed", "vocab"),
             when=lambda c, i: not c.tie_word_embeddings),
  WeightSpec(_L + "input_layernorm.weight", _F + "input_norm.scale", False, ("norm",)),
  WeightSpec(_L + "post_attention_layernorm.weight", _F + "post_attn_norm.scale", False, ("norm",)),
  WeightSpec(_L + "self_attn.q_proj.weight", _F + "attn.q_proj.kernel", True, ("embed", "heads")),
  WeightSpec(_L + "self_attn.k_proj.weight", _F + "attn.k_proj.kernel", True, ("embed", "kv_heads")),
  WeightSpec(_L + "self_attn.v_proj.weight", _F + "attn.v_proj.kernel", True, ("embed", "kv_heads")),
  WeightSpec(_L + "self_attn.o_proj.weight", _F + "attn.o_proj.kernel", True, ("heads", "embed")),
  WeightSpec(_L + "self_attn.q_proj.bias", _F + "attn.q_proj.bias", False, ("heads",),
             when=lambda c, i: c.qkv_bias),
  WeightSpec(_L + "self_attn.k_proj.bias", _F + "attn.k_proj.bias", False, ("kv_heads",),
             when=lambda c, i: c.qkv_bias),
  WeightSpec(_L + "self_attn.v_proj.bias", _F + "attn.v_proj.bias", False, ("kv_heads",),
             when=lambda c, i: c.qkv_bias),
  WeightSpec(_L + "self_attn.o_proj.bias", _F + "attn.o_proj.bias", False, ("embed",),
             when=lambda c, i: c.o_bias),
  WeightSpec(_L + "self_attn.q_norm.weight", _F + "attn.q_norm.scale", False, ("head_dim",),
             when=lambda c, i: c.qk_norm),
  WeightSpec(_L + "self_attn.k_norm.weight", _F + "attn.k_norm.scale", False, ("head_dim",),
             when=lambda c, i: c.qk_norm),
  WeightSpec(_L + "mlp.gate_proj.weight", _F + "mlp.gate_proj.kernel", True, ("embed", "mlp"),
             when=_dense_mlp),
  WeightSpec(_L + "mlp.up_proj.weight", _F + "mlp.up_proj.kernel", True, ("embed", "mlp"),
             when=_dense_mlp),
  WeightSpec(_L + "mlp.down_proj.weight", _F + "mlp.down_proj.kernel", True, ("mlp", "embed"),
             when=_dense_mlp),
  WeightSpec(_L + "mlp.gate.weight", _F + "mlp.router", True, ("embed", "experts"), when=_moe),
  WeightSpec(_L + "mlp.experts.{j}.gate_proj.weight", _F + "mlp.gate_proj", True,
             ("experts", "embed", "mlp"), when=_moe),
  WeightSpec(_L + "mlp.experts.{j}.up_proj.weight", _F + "mlp.up_proj", True,
             ("experts", "embed", "mlp"), when=_moe),
  WeightSpec(_L + "mlp.experts.{j}.down_proj.weight", _F + "mlp.down_proj", True,
             ("experts", "mlp", "embed"), when=_moe),
)


def expand_table(config: QwenConfig) -> Iterator[TableEntry]:
  """Yields a :class:`TableEntry` for every HF tensor this config's model has."""
  for spec in WEIGHT_TABLE:
    for i in (range(config.num_layers) if spec.per_layer else [None]):
      if not spec.when(config, i):
        continue
      flax = spec.flax.format(i=i)
      path = tuple(int(p) if p.isdigit() else p for p in flax.split("."))
      for j in (range(config.num_experts) if spec.per_expert else [None]):
        yield TableEntry(spec.hf.format(i=i, j=j), path, spec, j)


def axis_units(spec: WeightSpec, config: QwenConfig) -> tuple[int, ...]:
  """Per dimension of ``spec``'s leaf, the blocks it may be split into: ``head_dim`` for the fused
  ``heads`` / ``kv_heads`` dimensions (a device holds whole heads), 1 elsewhere."""
  return tuple(config.head_dim if a in ("heads", "kv_heads") else 1 for a in spec.axes)
