"""Tiny random Qwen3 / Qwen2 checkpoints written by transformers (torch CPU, fp32).

Every parameter (biases and norm scales included) is drawn at random, so a wrongly
mapped tensor changes the logits; the spread is wide enough that greedy decoding has
clear argmax margins.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
from transformers import (Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

VOCAB = 96


def tiny_hf_model(family: str = "qwen3", *, tie: bool = False, seed: int = 0,
                  rope: dict | None = None, vocab_size: int = VOCAB) -> torch.nn.Module:
  """A random 2-layer GQA model (4 query heads, 2 kv heads, head_dim 8) in eval mode."""
  torch.manual_seed(seed)
  common = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie,
                rope_parameters=rope or {"rope_type": "default", "rope_theta": 1e6},
                max_position_embeddings=512, rms_norm_eps=1e-6)
  if family == "qwen3":
    model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))
  elif family == "qwen2":
    model = Qwen2ForCausalLM(Qwen2Config(**common))
  elif family == "qwen3_moe":  # 4 experts, top-2, layer 1 dense
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
      head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
      norm_topk_prob=True, mlp_only_layers=[1], **common))
  else:
    raise ValueError(f"family: expected 'qwen3', 'qwen2' or 'qwen3_moe', got {family!r}")
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * noise)
      elif name.endswith("bias"):
        p.copy_(0.3 * noise)
      else:
        p.copy_(0.25 * noise)
  return model.eval()


def write_checkpoint(path: str | os.PathLike, family: str = "qwen3", *, tie: bool = False,
                     seed: int = 0, dtype: torch.dtype = torch.float32,
                     max_shard_size: str | None = None, rope: dict | None = None) -> torch.nn.Module:
  """Saves a tiny model to ``path`` (optionally cast / sharded); returns the fp32 torch model."""
  model = tiny_hf_model(family, tie=tie, seed=seed, rope=rope)
  to_save = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
  kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
  to_save.save_pretrained(os.fspath(path), **kw)
  return model


def torch_logits(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Reference logits [B, T, V] with positions cumsum(mask) - 1 (as our module derives them)."""
  pos = np.clip(np.cumsum(mask, -1) - 1, 0, None)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(pos, dtype=torch.long))
  return out.logits.float().numpy()


def padded_batch(seed: int = 0, vocab: int = VOCAB) -> tuple[np.ndarray, np.ndarray]:
  """ids, mask: [4, 9]; rows: left-padded, right-padded, full, single token (left-padded)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, vocab, (4, 9))
  mask = np.ones((4, 9), np.int64)
  mask[0, :4] = 0
  mask[1, 6:] = 0
  mask[3, :8] = 0
  return ids, mask


@pytest.fixture(scope="module")
def qwen3_ckpt(tmp_path_factory) -> tuple[str, torch.nn.Module]:
  path = tmp_path_factory.mktemp("qwen3")
  return os.fspath(path), write_checkpoint(path, "qwen3")


@pytest.fixture(scope="module")
def qwen2_tied_ckpt(tmp_path_factory) -> tuple[str, torch.nn.Module]:
  path = tmp_path_factory.mktemp("qwen2_tied")
  return os.fspath(path), write_checkpoint(path, "qwen2", tie=True, seed=1)


@pytest.fixture(scope="module")
def qwen3_moe_ckpt(tmp_path_factory) -> tuple[str, torch.nn.Module]:
  path = tmp_path_factory.mktemp("qwen3_moe")
  return os.fspath(path), write_checkpoint(path, "qwen3_moe", seed=2)
