"""Pass@k and Pass^k, and the paper's summary numbers (Section 5.1).

From ``n`` independent rollouts of one task, ``c`` of which succeed, the unbiased
estimators over a uniformly drawn k-subset of those rollouts are

    Pass@k = 1 - C(n - c, k) / C(n, k)   (at least one of k rollouts succeeds)
    Pass^k = C(c, k) / C(n, k)           (all k rollouts succeed)

averaged over tasks. Pass@1 = Pass^1 = c / n. Section 5.1 reports, for k = 1..4:

    p@1       = Pass@1, the mean success rate over the four evaluations (rollouts),
    avg p@k   = mean over k = 1..4 of Pass@k,
    avg pk    = mean over k = 1..4 of Pass^k.

All values here are fractions in [0, 1]; multiply by 100 for the paper's tables.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

PAPER_KS: tuple[int, ...] = (1, 2, 3, 4)


def _check_counts(num_samples: int, num_correct: int, k: int) -> None:
  if not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"k must be an integer >= 1, got {k!r}")
  if num_samples < k:
    raise ValueError(f"num_samples must be >= k={k}, got num_samples={num_samples}")
  if not 0 <= num_correct <= num_samples:
    raise ValueError(f"num_correct must lie in [0, num_samples={num_samples}], got {num_correct}")


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
  """Unbiased Pass@k of one task: P(a random k-subset of the n rollouts has a success)."""
  _check_counts(num_samples, num_correct, k)
  return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def pass_hat_k(num_samples: int, num_correct: int, k: int) -> float:
  """Unbiased Pass^k of one task: P(every rollout of a random k-subset succeeds)."""
  _check_counts(num_samples, num_correct, k)
  return math.comb(num_correct, k) / math.comb(num_samples, k)


def _as_success_matrix(successes: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
  arr = np.asarray(successes)
  if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
    raise ValueError(f"successes must be a non-empty [num_tasks, num_samples] array, got shape {arr.shape}")
  if not np.all((arr == 0) | (arr == 1)):
    raise ValueError("successes must hold only 0/1 (or bool) rewards; got other values")
  return arr.astype(bool)


def mean_pass_at_k(successes: np.ndarray, k: int) -> float:
  """Pass@k averaged over tasks. successes: [num_tasks, n] bool, one row per task."""
  arr = _as_success_matrix(successes)
  n = arr.shape[1]
  return float(np.mean([pass_at_k(n, int(c), k) for c in arr.sum(axis=1)]))


def mean_pass_hat_k(successes: np.ndarray, k: int) -> float:
  """Pass^k averaged over tasks. successes: [num_tasks, n] bool, one row per task."""
  arr = _as_success_matrix(successes)
  n = arr.shape[1]
  return float(np.mean([pass_hat_k(n, int(c), k) for c in arr.sum(axis=1)]))


def paper_summary(successes: np.ndarray, ks: Sequence[int] = PAPER_KS) -> dict[str, float]:
  """The Section 5.1 metrics from per-rollout binary rewards.

  successes: [num_tasks, n] with n >= max(ks) rollouts per task (the paper uses n = 4).
  Returns ``pass@k`` and ``pass^k`` for each k, plus ``p@1``, ``avg p@k`` and ``avg pk``
  (fractions in [0, 1]).
  """
  arr = _as_success_matrix(successes)
  if not ks:
    raise ValueError("ks must name at least one k, got an empty sequence")
  out: dict[str, float] = {}
  for k in ks:
    out[f"pass@{k}"] = mean_pass_at_k(arr, k)
    out[f"pass^{k}"] = mean_pass_hat_k(arr, k)
  out["p@1"] = mean_pass_at_k(arr, 1)
  out["avg p@k"] = float(np.mean([out[f"pass@{k}"] for k in ks]))
  out["avg pk"] = float(np.mean([out[f"pass^{k}"] for k in ks]))
  return out
