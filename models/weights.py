"""HF checkpoints in and out: one declarative table, read by both loading and saving.

Each row of :data:`WEIGHT_TABLE` (``models.weight_table``; ``models.qwen`` reads its logical axes
into each parameter's metadata) says: this HF tensor name is that Flax parameter path,
stored transposed or not, with these logical axes (for sharding), present when the
config says so. Qwen3-MoE expert rows (``{j}`` in the HF name) map the HF per-expert
tensors onto one Flax leaf stacked over experts. :func:`from_pretrained` and
:func:`save_pretrained` walk the same rows, so the two directions cannot drift apart.

Logical axes map to mesh axes through the one sharding table, ``rti_jax.sharding.LOGICAL_AXIS_RULES``
(the trainer's); a dimension that its mesh axes do not divide, or whose mesh axes an earlier
dimension already uses, is replicated and counted in ``LoadReport.replicated``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from safetensors import safe_open
from safetensors.numpy import save_file

from models.config import QwenConfig
from models.qwen import Qwen
from models.weight_table import (WEIGHT_TABLE, Axes, TableEntry, WeightSpec, axis_units,  # noqa: F401 (re-exported)
                                  expand_table)
from models.axes import LOGICAL_AXIS_RULES, Rules, logical_to_spec

#: HF tensors that may appear in a checkpoint and carry no parameters we need.
_IGNORED_HF_SUFFIXES: tuple[str, ...] = ("rotary_emb.inv_freq",)

_DTYPES: dict[str, Any] = {
  "float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16,
}


@dataclasses.dataclass
class LoadReport:
  """What loading did beyond the plain table: counted fallbacks, kept for logging."""

  ignored: list[str] = dataclasses.field(default_factory=list)
  replicated: list[str] = dataclasses.field(default_factory=list)


def _resolve_dtype(dtype: Any) -> jnp.dtype:
  if isinstance(dtype, str):
    if dtype not in _DTYPES:
      raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    return jnp.dtype(_DTYPES[dtype])
  dt = jnp.dtype(dtype)
  if dt not in [jnp.dtype(v) for v in _DTYPES.values()]:
    raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dt}")
  return dt


def _hf_shape(flax_shape: tuple[int, ...], spec: WeightSpec) -> tuple[int, ...]:
  return tuple(reversed(flax_shape)) if spec.transpose else tuple(flax_shape)


def _checkpoint_files(path: str) -> dict[str, str]:
  """hf_name -> safetensors file, from model.safetensors or model.safetensors.index.json."""
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.isfile(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      return {str(k): os.path.join(path, str(v)) for k, v in weight_map.items()}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
      raise ValueError(f"{index}: not a readable safetensors index ({type(e).__name__}: {e})") from None
  if os.path.isfile(single):
    with _open_safetensors(single) as f:
      return {k: single for k in f.keys()}
  raise FileNotFoundError(
    f"path: expected model.safetensors or model.safetensors.index.json in {path!r}, found neither")


#: On-disk dtypes a checkpoint's tensors may have (safetensors names); anything else is refused.
_FLOAT_DTYPES = frozenset({"F32", "BF16", "F16"})


def _open_safetensors(fname: str) -> Any:
  """``safe_open(fname)``; a missing, truncated or garbage file raises ValueError naming it."""
  try:
    return safe_open(fname, framework="numpy")
  except Exception as e:  # safetensors raises its own error types (and OSError) for bad files
    raise ValueError(f"{fname}: not a readable safetensors file ({type(e).__name__}: {e})") from None


def partition_spec(spec: WeightSpec, shape: tuple[int, ...], mesh: Mesh,
                   rules: Rules = LOGICAL_AXIS_RULES, config: QwenConfig | None = None) -> tuple[PartitionSpec, bool]:
  """The PartitionSpec of a Flax leaf; second value is True if a dim fell back to replicated.

  config: given, fused head dimensions are split only between whole heads (as the trainer's
  ``param_shardings`` splits them: ``models.weight_table.axis_units``).
  """
  fallbacks: list[str] = []
  units = None if config is None else axis_units(spec, config)
  pspec = logical_to_spec(spec.axes, mesh=mesh, shape=shape, rules=rules, fallbacks=fallbacks, name=spec.hf,
                          units=units)
  return pspec, bool(fallbacks)


def abstract_model(config: QwenConfig, dtype: Any = jnp.float32, param_dtype: Any | None = None,
                   precision: jax.lax.Precision | None = None) -> Qwen:
  """The model with ShapeDtypeStruct leaves (no memory), via ``nnx.eval_shape``."""
  dt = _resolve_dtype(dtype)
  pdt = _resolve_dtype(param_dtype) if param_dtype is not None else dt
  return nnx.eval_shape(
    lambda: Qwen(config, dtype=dt, param_dtype=pdt, precision=precision, rngs=nnx.Rngs(0)))


def from_pretrained(path: str | os.PathLike, *, dtype: Any = jnp.float32, param_dtype: Any | None = None,
                    mesh: Mesh | None = None, rules: Rules = LOGICAL_AXIS_RULES,
                    precision: jax.lax.Precision | None = None,
                    report: LoadReport | None = None) -> tuple[Qwen, QwenConfig]:
  """Loads a local HF Qwen2/Qwen3 checkpoint into a Flax model.

  dtype: parameter and activation dtype ("float32", "bfloat16", "float16" or a jnp dtype);
    on-disk tensors of any of these dtypes are cast to it. Logits are always fp32.
  param_dtype: the parameters' dtype when it differs from the activations' (default ``dtype``):
    ``dtype=bfloat16, param_dtype=float32`` keeps fp32 master weights (and fp32 Adam moments)
    with bf16 matmuls. Training in pure bf16 loses small updates: a step of lr 1e-6 is far below
    bf16's resolution (8 bits of mantissa) for weights of size 1e-2.
  mesh: if given, each parameter is created directly with its ``NamedSharding`` (per-shard
    reads from the safetensors file; no device ever holds the whole model).
  rules: logical axis -> mesh axes, default ``rti_jax.sharding.LOGICAL_AXIS_RULES``.
  precision: matmul precision; default HIGHEST for float32 (matches torch's fp32 numbers on
    GPUs too, where the default would use TF32), DEFAULT for bf16 / fp16.
  report: filled with ignored tensors and replicated fallbacks.

  Raises ValueError naming the tensor on a missing, unexpected or mis-shaped key.
  """
  path = os.fspath(path)
  config = QwenConfig.from_pretrained(path)
  report = report if report is not None else LoadReport()
  dt = _resolve_dtype(dtype)
  pdt = _resolve_dtype(param_dtype) if param_dtype is not None else dt
  model = abstract_model(config, dt, pdt, precision=precision)
  graphdef, state = nnx.split(model)
  leaves = dict(nnx.to_flat_state(state))
  files = _checkpoint_files(path)

  entries = list(expand_table(config))
  expected = {e.hf for e in entries}
  unexpected = []
  for name in files:
    if name in expected:
      continue
    if name.endswith(_IGNORED_HF_SUFFIXES) or (name == "lm_head.weight" and config.tie_word_embeddings):
      report.ignored.append(name)
      continue
    unexpected.append(name)
  if unexpected:
    raise ValueError(f"checkpoint {path!r} has unexpected tensors (not in the weight table for "
                     f"{config.architecture}): {sorted(unexpected)[:10]}")
  missing = sorted(hf for hf in expected if hf not in files)
  if missing:
    raise ValueError(f"checkpoint {path!r} is missing tensors: {missing[:10]}"
                     f"{' (and more)' if len(missing) > 10 else ''}")

  by_leaf: dict[tuple[str | int, ...], list[TableEntry]] = {}
  for e in entries:
    by_leaf.setdefault(e.path, []).append(e)
  with contextlib.ExitStack() as stack:
    handles: dict[str, Any] = {}
    for flax_path, group in by_leaf.items():
      var = leaves[flax_path]
      shape = tuple(var.shape)
      spec = group[0].spec
      want = _hf_shape(shape[1:] if spec.per_expert else shape, spec)
      tensors = []
      for e in group:  # one entry, or one per expert in expert order
        fname = files[e.hf]
        if fname not in handles:
          handles[fname] = stack.enter_context(_open_safetensors(fname))
        try:
          tensor = handles[fname].get_slice(e.hf)
        except Exception as err:  # the index names a tensor its file does not hold, or the file is damaged
          raise ValueError(f"tensor {e.hf!r}: cannot be read from {fname} ({type(err).__name__}: {err})") from None
        if tensor.get_dtype() not in _FLOAT_DTYPES:
          raise ValueError(f"tensor {e.hf!r} in {fname}: expected a float dtype ({sorted(_FLOAT_DTYPES)}), "
                           f"got {tensor.get_dtype()}")
        got = tuple(tensor.get_shape())
        if got != want:
          raise ValueError(f"tensor {e.hf!r}: expected shape {want}, got {got}")
        tensors.append(tensor)
      var.set_value(_load_leaf(tensors, spec, shape, pdt, mesh, rules, group[0].hf, report, config))
  return nnx.merge(graphdef, state), config


def _load_leaf(tensors: list[Any], spec: WeightSpec, shape: tuple[int, ...], dt: jnp.dtype,
               mesh: Mesh | None, rules: Rules, hf: str,
               report: LoadReport, config: QwenConfig) -> jax.Array:
  """Reads one leaf (whole, or shard by shard with a mesh): transposes, stacks experts, casts."""

  def read_one(tensor: Any, index: tuple[slice, ...]) -> np.ndarray:
    arr = np.asarray(tensor[tuple(reversed(index)) if spec.transpose else index])
    return arr.T if spec.transpose else arr

  def read(index: tuple[slice, ...]) -> np.ndarray:
    if spec.per_expert:
      arr = np.stack([read_one(tensors[j], index[1:]) for j in range(len(tensors))[index[0]]])
    else:
      arr = read_one(tensors[0], index)
    return np.ascontiguousarray(arr.astype(dt))

  full = tuple(slice(None) for _ in shape)
  if mesh is None:
    return jnp.asarray(read(full))
  pspec, fell_back = partition_spec(spec, shape, mesh, rules, config)
  if fell_back:
    report.replicated.append(hf)
  sharding = NamedSharding(mesh, pspec)
  return jax.make_array_from_callback(
    shape, sharding, lambda idx: read(tuple(s if isinstance(s, slice) else slice(s, s + 1) for s in idx)))


def _parse_size(size: int | str) -> int:
  if isinstance(size, int):
    return size
  units = {"KB": 10**3, "MB": 10**6, "GB": 10**9}
  s = size.strip().upper()
  for u, m in units.items():
    if s.endswith(u):
      return int(float(s[:-len(u)]) * m)
  return int(s)


def write_generation_config(path: str | os.PathLike, hf_config: dict[str, Any],
                            eos_token_ids: Sequence[int] | None = None) -> None:
  """``generation_config.json``: the ids a server stops on (``eos_token_ids`` first, then the
  config's ``eos_token_id``), and the config's bos / pad ids when it has them."""
  eos: list[int] = [int(t) for t in (eos_token_ids or ())]
  cfg_eos = hf_config.get("eos_token_id")
  for t in (cfg_eos if isinstance(cfg_eos, list) else [cfg_eos]):
    if isinstance(t, int) and not isinstance(t, bool) and t not in eos:
      eos.append(t)
  gen: dict[str, Any] = {"_from_model_config": False}
  if eos:
    gen["eos_token_id"] = eos if len(eos) > 1 else eos[0]
  for key in ("bos_token_id", "pad_token_id"):
    if isinstance(hf_config.get(key), int):
      gen[key] = hf_config[key]
  with open(os.path.join(os.fspath(path), "generation_config.json"), "w") as f:
    json.dump(gen, f, indent=2, sort_keys=True)


#: tokenizer classes transformers 5 writes that 4.x does not know -> the 4.x class with the same files
_PORTABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def save_tokenizer(tokenizer: Any, path: str | os.PathLike) -> None:
  """``tokenizer.save_pretrained(path)`` in a form transformers 4.x loads too: a transformers-5
  class name in ``tokenizer_config.json`` (``TokenizersBackend``) becomes the 4.x name of the same
  fast tokenizer (``PreTrainedTokenizerFast``), which 5.x also reads."""
  tokenizer.save_pretrained(os.fspath(path))
  cfg_path = os.path.join(os.fspath(path), "tokenizer_config.json")
  if not os.path.isfile(cfg_path):
    return
  with open(cfg_path) as f:
    cfg = json.load(f)
  cls = cfg.get("tokenizer_class")
  if cls in _PORTABLE_TOKENIZER_CLASSES:
    cfg["tokenizer_class"] = _PORTABLE_TOKENIZER_CLASSES[cls]
    with open(cfg_path, "w") as f:
      json.dump(cfg, f, indent=2, ensure_ascii=False)


def save_pretrained(model: Qwen, config: QwenConfig, path: str | os.PathLike, *,
                    dtype: str | None = None, max_shard_size: int | str = "5GB",
                    eos_token_ids: Sequence[int] | None = None) -> None:
  """Writes HF safetensors + config.json that ``AutoModelForCausalLM.from_pretrained`` loads.

  dtype: on-disk dtype ("float32", "bfloat16", "float16"); default: the model's parameter
    dtype. Checkpoints larger than ``max_shard_size`` are split, with
    ``model.safetensors.index.json``. Tied embeddings write no ``lm_head.weight``.
  eos_token_ids: the ids generation stops on, written to ``generation_config.json`` (with the
    config's own ``eos_token_id``). ``config.json`` carries both the transformers-5 fields
    (``rope_parameters``, ``dtype``) and the 4.x ones (``rope_theta``, ``rope_scaling``,
    ``torch_dtype``), so either version loads it with the same rope and dtype.
  """
  path = os.fspath(path)
  os.makedirs(path, exist_ok=True)
  leaves = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  limit = _parse_size(max_shard_size)
  shards: list[dict[str, np.ndarray]] = [{}]
  shard_bytes = 0
  if dtype is not None and dtype not in _DTYPES:
    raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
  out_dtype: Any = _DTYPES[dtype] if dtype is not None else None
  for hf, flax_path, spec, expert in expand_table(config):
    if flax_path not in leaves:
      raise ValueError(f"model has no parameter {'.'.join(map(str, flax_path))!r} for tensor {hf!r}")
    arr = leaves[flax_path].get_value()
    arr = np.asarray(jax.device_get(arr if expert is None else arr[expert]))
    out_dtype = arr.dtype if out_dtype is None else out_dtype
    arr = np.ascontiguousarray((arr.T if spec.transpose else arr).astype(out_dtype))
    if shards[-1] and shard_bytes + arr.nbytes > limit:
      shards.append({})
      shard_bytes = 0
    shards[-1][hf] = arr
    shard_bytes += arr.nbytes
  dtype_name = {np.dtype(v): k for k, v in _DTYPES.items()}[np.dtype(out_dtype)]
  hf_config = config.to_hf_dict()
  hf_config["dtype"] = hf_config["torch_dtype"] = dtype_name
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
  write_generation_config(path, hf_config, eos_token_ids)
  meta = {"format": "pt"}
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"), metadata=meta)
    return
  weight_map: dict[str, str] = {}
  total = 0
  for n, shard in enumerate(shards, start=1):
    name = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(path, name), metadata=meta)
    weight_map.update({k: name for k in shard})
    total += sum(a.nbytes for a in shard.values())
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
