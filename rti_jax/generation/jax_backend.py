"""The in-process JAX backend (default): ``models.sampler.Sampler`` behind ``GenerationBackend``.

``generate`` returns, per token, the policy's log-prob at temperature 1, whatever
temperature was sampled with, and the log-prob under the distribution sampled from
(``Completion.sampling_logprobs``); ``score`` is teacher-forced, at temperature 1 or another.
``sync_weights`` swaps in a model's current parameters (same architecture) without
recompiling: the sampler's copy of them (compute dtype, decode layout on ``mesh``) is made on
the devices by one jitted cast, no host round trip.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from models.sampler import Sampler
from rti_jax.generation.base import Completion, SamplingParams


class JaxBackend:
  """A ``GenerationBackend`` over the project's Qwen module.

  model: a ``models.Qwen``. max_cache_len: the most tokens (prompt + new) one row may
  use (default: the model's ``max_position_embeddings``). pad_id: the padding id.
  prefix_cache_bytes: > 0 keeps each row's KV so the next turn of an episode prefills only what
  follows its stored prefix (``models.sampler.Sampler``); 0 (default): every prompt prefilled whole.
  mesh: the devices to decode on (default: those the model's parameters are spread over).
  """

  def __init__(self, model: Any, *, max_cache_len: int | None = None, pad_id: int = 0,
               prefix_cache_bytes: int = 0, mesh: Any = None) -> None:
    self.sampler = Sampler(model, max_cache_len=max_cache_len, prefix_cache_bytes=prefix_cache_bytes, mesh=mesh)
    self.pad_id = int(pad_id)

  def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int) -> list[Completion]:
    """One batched decode; ``seed`` fixes the sampling key."""
    if not prompts:
      return []
    out = self.sampler.generate(
      [list(map(int, p)) for p in prompts],
      key=jax.random.key(int(seed)),
      max_new_tokens=params.max_new_tokens,
      temperature=params.temperature,
      top_p=params.top_p,
      top_k=params.top_k,
      stop_token_ids=params.stop_token_ids,
      pad_id=self.pad_id,
    )
    return [
      Completion(token_ids=np.asarray(t, np.int32), logprobs=np.asarray(lp, np.float32), finish_reason=r,
                 sampling_logprobs=np.asarray(slp, np.float32))
      for t, lp, slp, r in zip(out.tokens, out.logprobs, out.sampling_logprobs, out.finish_reasons)
    ]

  def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
            temperature: float = 1.0) -> list[np.ndarray]:
    """Per-token log-probs ``[len(response)]`` under the current parameters, of the logits
    divided by ``temperature``."""
    if not prompts and not responses:
      return []
    return [np.asarray(x, np.float32) for x in self.sampler.score(prompts, responses, temperature)]

  def sync_weights(self, model: Any) -> None:
    """The sampler decodes with ``model``'s parameters from now on (a device-side copy)."""
    self.sampler.sync_weights(model)


def qwen_save_fn(model: Any, path: str) -> None:
  """``save_fn`` for ``SGLangHTTPBackend.sync_weights``: writes an HF checkpoint of a ``models.Qwen``
  in its checkpoint's dtype (``config.dtype``: bf16 for Qwen3-8B even when the trainer keeps fp32
  master weights, so each sync writes half the bytes)."""
  from models.weights import save_pretrained

  save_pretrained(model, model.config, path, dtype=model.config.dtype)
