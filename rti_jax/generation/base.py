"""The one small interface every generation backend implements.

Token ids in, token ids and per-token log-probs out. Chat templating and tool-call
parsing happen above this layer (the rollout engine), so a backend only sees ids.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Sampling settings. ``temperature == 0`` means greedy."""

  max_new_tokens: int = 256
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0  # 0 = off
  stop_token_ids: tuple[int, ...] = ()

  def __post_init__(self) -> None:
    if isinstance(self.max_new_tokens, bool) or not int(self.max_new_tokens) >= 1:
      raise ValueError(f"max_new_tokens: expected an integer >= 1, got {self.max_new_tokens!r}")
    if not (math.isfinite(self.temperature) and self.temperature >= 0):
      raise ValueError(f"temperature: expected a finite number >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p: expected a value in (0, 1], got {self.top_p}")
    if isinstance(self.top_k, bool) or not int(self.top_k) >= 0:
      raise ValueError(f"top_k: expected an integer >= 0 (0 = off), got {self.top_k!r}")


@dataclasses.dataclass(frozen=True)
class Completion:
  """One sampled continuation.

  token_ids: [n] the generated ids (including the stop token if one was hit).
  logprobs: [n] float32 log-prob of each generated id under the policy at temperature 1
    (see the backend's docs).
  finish_reason: "stop" (a stop id was produced) or "length".
  sampling_logprobs: [n] float32 log-prob of each id under the distribution it was drawn from
    (after temperature, top-k and top-p; 0 for greedy rows), or None where the backend does
    not report it.
  """

  token_ids: np.ndarray
  logprobs: np.ndarray
  finish_reason: str
  sampling_logprobs: np.ndarray | None = None


class GenerationBackend(Protocol):
  """Generates and scores token sequences with the current policy."""

  def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int) -> list[Completion]:
    """Samples one completion per prompt (batched)."""
    ...

  def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
            temperature: float = 1.0) -> list[np.ndarray]:
    """Per-token log-probs ``[len(response)]`` of each response given its prompt, of the logits
    divided by ``temperature`` (callers pass it only when it is not 1)."""
    ...

  def sync_weights(self, model) -> None:
    """Makes the backend generate with ``model``'s current parameters."""
    ...
