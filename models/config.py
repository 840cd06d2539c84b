"""A typed config for the Qwen family, built from a checkpoint's ``config.json``.

Qwen3 dense and Qwen2/Qwen2.5 share one module; the differences are switches here:

  ============  =============  ==========  ===========
  family        q/k/v bias     o bias      q/k RMSNorm
  ============  =============  ==========  ===========
  qwen2         yes            no          no
  qwen3         attention_bias attention_  yes
                (default no)   bias
  qwen3_moe     as qwen3       as qwen3    yes
  ============  =============  ==========  ===========

qwen3_moe replaces the MLP of layer i by a top-k mixture of experts when
``num_experts > 0``, ``i not in mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

#: HF ``architectures`` entry -> our family name.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
  "Qwen3ForCausalLM": "qwen3",
  "Qwen2ForCausalLM": "qwen2",
  "Qwen3MoeForCausalLM": "qwen3_moe",
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("qwen3", "qwen2", "qwen3_moe")
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear")
SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


class UnsupportedModelError(ValueError):
  """A checkpoint whose architecture or feature this package does not implement."""


@dataclasses.dataclass(frozen=True)
class QwenConfig:
  """Everything the Flax module needs; built by :meth:`from_hf_dict`.

  ``hf_extra`` keeps the config.json keys we do not model (token ids, etc.), so
  :meth:`to_hf_dict` writes a config that transformers loads unchanged.
  """

  model_type: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_type: str = "default"
  rope_factor: float = 1.0  # only for rope_type == "linear"
  tie_word_embeddings: bool = False
  qkv_bias: bool = False
  o_bias: bool = False
  qk_norm: bool = True
  max_position_embeddings: int = 32768
  num_experts: int = 0  # qwen3_moe only
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  dtype: str = "float32"  # dtype on disk / preferred compute dtype
  hf_extra: tuple[tuple[str, Any], ...] = ()

  def __post_init__(self) -> None:
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise UnsupportedModelError(
        f"model_type: expected one of {SUPPORTED_MODEL_TYPES}, got {self.model_type!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim: expected an even number for RoPE, got {self.head_dim}")
    if self.rope_type not in SUPPORTED_ROPE_TYPES:
      raise UnsupportedModelError(
        f"rope_parameters.rope_type: expected one of {SUPPORTED_ROPE_TYPES}, got {self.rope_type!r}")
    if self.dtype not in SUPPORTED_DTYPES:
      raise ValueError(f"dtype: expected one of {SUPPORTED_DTYPES}, got {self.dtype!r}")
    if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
      raise ValueError(f"num_experts_per_tok: expected in [1, {self.num_experts}], "
                       f"got {self.num_experts_per_tok}")

  def is_moe_layer(self, i: int) -> bool:
    """Whether decoder layer ``i`` uses the mixture of experts (as transformers decides it)."""
    return (self.model_type == "qwen3_moe" and self.num_experts > 0
            and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0)

  @property
  def architecture(self) -> str:
    return {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}[self.model_type]

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any]) -> "QwenConfig":
    """Builds the config from a parsed ``config.json``; raises on unsupported models."""
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    unknown = [a for a in archs if a not in SUPPORTED_ARCHITECTURES]
    if unknown or model_type not in SUPPORTED_MODEL_TYPES:
      raise UnsupportedModelError(
        f"architectures={archs!r}, model_type={model_type!r} is not supported; supported "
        f"architectures: {sorted(SUPPORTED_ARCHITECTURES)} (model_type {list(SUPPORTED_MODEL_TYPES)})")
    if hf.get("use_sliding_window"):
      raise UnsupportedModelError("use_sliding_window=True is not supported (expected False)")
    layer_types = hf.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
      raise UnsupportedModelError(
        f"layer_types: expected only 'full_attention', got {sorted(set(layer_types))}")
    if hf.get("hidden_act", "silu") != "silu":
      raise UnsupportedModelError(f"hidden_act: expected 'silu', got {hf.get('hidden_act')!r}")
    rope = dict(hf.get("rope_parameters") or {})
    # transformers < 5 kept these at the top level / in rope_scaling.
    if not rope:
      rope = dict(hf.get("rope_scaling") or {})
      rope.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    num_heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    head_dim = hf.get("head_dim") or hidden // num_heads
    qwen3 = model_type in ("qwen3", "qwen3_moe")
    moe = model_type == "qwen3_moe"
    attention_bias = bool(hf.get("attention_bias", False))
    dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    modelled = {
      "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
      "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
      "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta", "tie_word_embeddings",
      "attention_bias", "max_position_embeddings", "dtype", "torch_dtype", "transformers_version",
      "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
      "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
    }
    extra = tuple(sorted((k, _freeze(v)) for k, v in hf.items() if k not in modelled))
    return cls(
      model_type=model_type,
      vocab_size=int(hf["vocab_size"]),
      hidden_size=hidden,
      intermediate_size=int(hf["intermediate_size"]),
      num_layers=int(hf["num_hidden_layers"]),
      num_heads=num_heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
      head_dim=int(head_dim),
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      rope_theta=float(rope.get("rope_theta", 10000.0)),
      rope_type=rope_type,
      rope_factor=float(rope.get("factor", 1.0)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=attention_bias if qwen3 else True,
      o_bias=attention_bias if qwen3 else False,
      qk_norm=qwen3,
      max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
      num_experts=int(hf.get("num_experts", hf.get("num_local_experts", 0)) or 0) if moe else 0,
      num_experts_per_tok=int(hf.get("num_experts_per_tok", 0) or 0) if moe else 0,
      moe_intermediate_size=int(hf.get("moe_intermediate_size", 0) or 0) if moe else 0,
      norm_topk_prob=bool(hf.get("norm_topk_prob", False)) if moe else False,
      decoder_sparse_step=int(hf.get("decoder_sparse_step", 1) or 1) if moe else 1,
      mlp_only_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()) if moe else (),
      dtype=str(dtype),
      hf_extra=extra,
    )

  @classmethod
  def from_pretrained(cls, path: str | os.PathLike) -> "QwenConfig":
    """Reads ``<path>/config.json``."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
      raise FileNotFoundError(f"path: expected a directory with config.json, got {str(path)!r}")
    try:
      with open(cfg_path) as f:
        hf = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
      raise ValueError(f"{cfg_path}: not a readable JSON config ({e})") from None
    if not isinstance(hf, dict):
      raise ValueError(f"{cfg_path}: expected a JSON object, got {type(hf).__name__}")
    try:
      return cls.from_hf_dict(hf)
    except (KeyError, TypeError, ValueError) as e:
      if isinstance(e, UnsupportedModelError):
        raise
      raise ValueError(f"{cfg_path}: invalid config ({type(e).__name__}: {e})") from None

  def to_hf_dict(self) -> dict[str, Any]:
    """The config.json transformers expects for this model."""
    out: dict[str, Any] = {k: _thaw(v) for k, v in self.hf_extra}
    rope: dict[str, Any] = {"rope_theta": self.rope_theta, "rope_type": self.rope_type}
    if self.rope_type == "linear":
      rope["factor"] = self.rope_factor
    out.update({
      "architectures": [self.architecture],
      "model_type": self.model_type,
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_layers,
      "num_attention_heads": self.num_heads,
      "num_key_value_heads": self.num_kv_heads,
      "head_dim": self.head_dim,
      "rms_norm_eps": self.rms_norm_eps,
      "rope_parameters": rope,
      # transformers 4.x (what SGLang and vLLM releases pin) reads these instead of rope_parameters
      # and dtype: without them it would use rope_theta 10000 and no dtype.
      "rope_theta": self.rope_theta,
      "rope_scaling": {"type": "linear", "rope_type": "linear", "factor": self.rope_factor}
                      if self.rope_type == "linear" else None,
      "tie_word_embeddings": self.tie_word_embeddings,
      "max_position_embeddings": self.max_position_embeddings,
      "dtype": self.dtype,
      "torch_dtype": self.dtype,
      "hidden_act": "silu",
    })
    if self.model_type in ("qwen3", "qwen3_moe"):
      out["attention_bias"] = self.qkv_bias
    if self.model_type == "qwen3_moe":
      out.update({
        "num_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok,
        "moe_intermediate_size": self.moe_intermediate_size, "norm_topk_prob": self.norm_topk_prob,
        "decoder_sparse_step": self.decoder_sparse_step, "mlp_only_layers": list(self.mlp_only_layers),
      })
    return out

  def replace(self, **kw: Any) -> "QwenConfig":
    return dataclasses.replace(self, **kw)


def _freeze(v: Any) -> Any:
  """Makes JSON values hashable so the config stays a frozen, hashable dataclass."""
  if isinstance(v, dict):
    return ("__dict__", tuple(sorted((k, _freeze(x)) for k, x in v.items())))
  if isinstance(v, list):
    return ("__list__", tuple(_freeze(x) for x in v))
  return v


def _thaw(v: Any) -> Any:
  if isinstance(v, tuple) and len(v) == 2 and v[0] == "__dict__":
    return {k: _thaw(x) for k, x in v[1]}
  if isinstance(v, tuple) and len(v) == 2 and v[0] == "__list__":
    return [_thaw(x) for x in v[1]]
  return v
