"""The order-aware reward: hand-built cases per level (with near misses) and a brute-force reference."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rti_jax.envs.navigation.reward import Route, normalize_route, route_matches, score_direction

O, A, B, C, D = ("120.100000,30.100000", "120.200000,30.200000", "120.300000,30.300000",
                 "120.400000,30.400000", "120.500000,30.500000")
TRUTH = Route(origin=O, waypoints=(A, B, C), destination=D)


def _route(stops):
  return Route(origin=stops[0], waypoints=tuple(stops[1:-1]), destination=stops[-1])


def _accepted_orders(truth_stops, level):
  """Brute force: every permutation of the true stops that the level's rule allows."""
  first, last = truth_stops[0], truth_stops[-1]
  out = set()
  for perm in itertools.permutations(truth_stops):
    if level == 1 and perm[0] != first:
      continue
    if level == 2 and perm[-1] != last:
      continue
    if level == 3 and (perm[0] != first or perm[-1] != last):
      continue
    if level == 4 and perm != tuple(truth_stops):
      continue
    out.add(perm)
  return out


@pytest.mark.parametrize("level,pred,expected", [
    # Level 0: any order of the whole set.
    (0, [D, C, B, A, O], True), (0, [O, A, B, C, C], False), (0, [O, A, B, C], False),
    # Level 1: origin fixed.
    (1, [O, D, C, B, A], True), (1, [A, O, B, C, D], False),  # wrong origin
    # Level 2: destination fixed.
    (2, [C, A, O, B, D], True), (2, [O, A, B, D, C], False),
    # Level 3: origin and destination fixed.
    (3, [O, C, A, B, D], True), (3, [D, A, B, C, O], False), (3, [O, A, B, D, C], False),
    # Level 4: exact sequence.
    (4, [O, A, B, C, D], True), (4, [O, B, A, C, D], False),  # a swapped pair
    (4, [O, A, B, C, "120.500001,30.500000"], False),  # one coordinate off in the last digit
    (0, [O, A, B, C, "120.500000,30.500001"], False),
])
def test_hand_built_cases(level, pred, expected):
  assert route_matches(_route(pred), TRUTH, level) is expected


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 6), st.integers(0, 4), st.data())
def test_route_matches_equals_brute_force(n, level, data):
  pool = [f"121.{i:06d},25.000000" for i in range(n + 2)]
  truth = pool[:n]
  # A prediction: a permutation of the truth, sometimes with one stop replaced or dropped.
  pred = list(data.draw(st.permutations(truth)))
  edit = data.draw(st.sampled_from(["none", "replace", "drop", "duplicate"]))
  if edit == "replace":
    pred[data.draw(st.integers(0, n - 1))] = pool[-1]
  elif edit == "drop" and n > 2:
    pred.pop()
  elif edit == "duplicate":
    pred[0] = pred[-1]
  expected = tuple(pred) in _accepted_orders(truth, level)
  assert route_matches(_route(pred), _route(truth), level) is expected


def test_bad_order_level_raises():
  with pytest.raises(ValueError, match="order_level"):
    route_matches(TRUTH, TRUTH, 5)


def test_normalize_route_accepts_equivalent_spellings():
  r = normalize_route("120.1,30.1", ["120.2,30.20", "120.300000,30.3"], " 120.4 , 30.4 ", decimals=6)
  assert r == Route(O, (A, B), C)
  assert normalize_route(O, "120.2,30.2;120.3,30.3", D, decimals=6) == Route(O, (A, B), D)
  assert normalize_route(O, None, D, decimals=6) == Route(O, (), D)
  assert normalize_route(O, [A, "Dajin Park"], D, decimals=6) is None
  assert normalize_route(O, 5, D, decimals=6) is None


def test_score_direction_reasons():
  retrieved = {O, A, B, C, D}
  call = (O, [A, B, C], D)
  assert score_direction(call, TRUTH, 4, 6, retrieved) == (1.0, "match")
  assert score_direction(None, TRUTH, 4, 6, retrieved) == (0.0, "no_direction_call")
  assert score_direction((O, [A, "x"], D), TRUTH, 4, 6, retrieved) == (0.0, "bad_coordinates")
  # The right coordinates, but one was never shown by a tool: fabricated, so it fails.
  assert score_direction(call, TRUTH, 4, 6, retrieved - {B}) == (0.0, "not_retrieved")
  assert score_direction((O, [B, A, C], D), TRUTH, 4, 6, retrieved) == (0.0, "mismatch")
  assert score_direction((O, [B, A, C], D), TRUTH, 3, 6, retrieved) == (1.0, "match")
  # Equivalent spelling of the right coordinates still matches.
  assert score_direction(("120.1,30.1", [A, B, C], D), TRUTH, 4, 6, retrieved) == (1.0, "match")
