"""Pass@k / Pass^k estimators against brute-force enumeration of all k-subsets."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rti_jax import metrics


def _brute_force(row: list[int], k: int) -> tuple[float, float]:
  """Fraction of k-subsets of the rollouts with any success / with all successes."""
  subsets = list(itertools.combinations(row, k))
  any_ok = sum(1 for s in subsets if any(s)) / len(subsets)
  all_ok = sum(1 for s in subsets if all(s)) / len(subsets)
  return any_ok, all_ok


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=1, max_size=9), st.integers(1, 9))
def test_single_task_estimators_equal_subset_enumeration(row, k):
  if k > len(row):
    with pytest.raises(ValueError, match="num_samples"):
      metrics.pass_at_k(len(row), sum(row), k)
    return
  any_ok, all_ok = _brute_force(row, k)
  assert metrics.pass_at_k(len(row), sum(row), k) == pytest.approx(any_ok, abs=1e-12)
  assert metrics.pass_hat_k(len(row), sum(row), k) == pytest.approx(all_ok, abs=1e-12)


def test_paper_summary_against_brute_force():
  rng = np.random.default_rng(3)
  succ = rng.random((37, 6)) < rng.random((37, 1))  # per-task success rates vary
  got = metrics.paper_summary(succ)
  ref_at, ref_hat = {}, {}
  for k in (1, 2, 3, 4):
    pairs = [_brute_force(list(map(int, r)), k) for r in succ]
    ref_at[k] = np.mean([p[0] for p in pairs])
    ref_hat[k] = np.mean([p[1] for p in pairs])
    assert got[f"pass@{k}"] == pytest.approx(ref_at[k])
    assert got[f"pass^{k}"] == pytest.approx(ref_hat[k])
  # p@1 is the mean success rate over all evaluations.
  assert got["p@1"] == pytest.approx(succ.mean())
  assert got["avg p@k"] == pytest.approx(np.mean(list(ref_at.values())))
  assert got["avg pk"] == pytest.approx(np.mean(list(ref_hat.values())))


def test_four_rollouts_worked_example():
  # Task A: 2/4 succeed, task B: 4/4, task C: 0/4.
  succ = np.array([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
  got = metrics.paper_summary(succ)
  # Pass@2 of A = 1 - C(2,2)/C(4,2) = 5/6; Pass^2 of A = C(2,2)/C(4,2) = 1/6.
  assert got["pass@2"] == pytest.approx((5 / 6 + 1 + 0) / 3)
  assert got["pass^2"] == pytest.approx((1 / 6 + 1 + 0) / 3)
  assert got["pass@4"] == pytest.approx(2 / 3)
  assert got["pass^4"] == pytest.approx(1 / 3)
  assert got["p@1"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "args,match",
    [((4, 5, 1), "num_correct"), ((3, 1, 4), "num_samples"), ((4, 1, 0), "k must be")],
)
def test_bad_counts_raise_named_errors(args, match):
  with pytest.raises(ValueError, match=match):
    metrics.pass_at_k(*args)


def test_bad_success_matrix_raises():
  with pytest.raises(ValueError, match="successes"):
    metrics.paper_summary(np.array([1, 0, 1]))
  with pytest.raises(ValueError, match="0/1"):
    metrics.paper_summary(np.array([[0.5, 1.0]]))
  with pytest.raises(ValueError, match="num_samples"):
    metrics.paper_summary(np.array([[1, 0]]))  # n=2 < k=4
