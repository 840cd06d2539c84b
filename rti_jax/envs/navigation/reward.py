"""The order-aware, binary Navigation reward (Appendix C.2.1, Evaluation Protocol).

An episode earns 1 iff its final ``direction`` call matches the ground-truth call
at coordinate level under the task's order level, and every coordinate it passes
was retrieved by an earlier tool call; otherwise 0, with no partial credit.

Order levels (constraints on the visiting sequence):
  0: the set {origin, waypoints, destination} in any order;
  1: origin fixed, the rest in any order;
  2: destination fixed, the rest in any order;
  3: origin and destination fixed, waypoints in any order;
  4: the exact sequence.
"""

from __future__ import annotations

import collections
import dataclasses

from rti_jax.envs.navigation.world import normalize_location

ORDER_RULES: dict[int, str] = {
    0: "any order of all stops",
    1: "origin fixed, the rest in any order",
    2: "destination fixed, the rest in any order",
    3: "origin and destination fixed, waypoints in any order",
    4: "exact sequence",
}


@dataclasses.dataclass(frozen=True)
class Route:
  """A direction call's stops as canonical "lon,lat" strings."""

  origin: str
  waypoints: tuple[str, ...]
  destination: str

  @property
  def stops(self) -> tuple[str, ...]:
    return (self.origin, *self.waypoints, self.destination)


def normalize_route(origin: object, waypoints: object, destination: object, decimals: int) -> Route | None:
  """The canonical ``Route`` of raw call arguments, or None if any coordinate is not canonical-able."""
  if isinstance(waypoints, str):
    waypoints = [w for w in waypoints.split(";") if w.strip()]
  if waypoints is None:
    waypoints = []
  if not isinstance(waypoints, (list, tuple)):
    return None
  stops = [normalize_location(s, decimals) for s in (origin, *waypoints, destination)]
  if any(s is None for s in stops):
    return None
  return Route(origin=stops[0], waypoints=tuple(stops[1:-1]), destination=stops[-1])


def route_matches(pred: Route, truth: Route, order_level: int) -> bool:
  """Whether ``pred`` satisfies ``truth`` under ``order_level`` (0-4); exact string matching."""
  if order_level not in ORDER_RULES:
    raise ValueError(f"order_level must be one of 0..4, got {order_level!r}")
  if len(pred.stops) != len(truth.stops):
    return False
  same = lambda a, b: collections.Counter(a) == collections.Counter(b)  # noqa: E731
  if order_level == 0:
    return same(pred.stops, truth.stops)
  if order_level == 1:
    return pred.origin == truth.origin and same(pred.stops[1:], truth.stops[1:])
  if order_level == 2:
    return pred.destination == truth.destination and same(pred.stops[:-1], truth.stops[:-1])
  if order_level == 3:
    return (pred.origin == truth.origin and pred.destination == truth.destination
            and same(pred.waypoints, truth.waypoints))
  return pred.stops == truth.stops


def score_direction(call: tuple[object, object, object] | None, truth: Route, order_level: int,
                    decimals: int, retrieved: set[str]) -> tuple[float, str]:
  """Reward and its reason for an episode whose final direction call was ``call``.

  call: (origin, waypoints, destination) as passed, or None if the episode made no
    valid direction call.
  retrieved: canonical locations that tool observations had shown before the call.
  Reasons: "match", "no_direction_call", "bad_coordinates", "not_retrieved", "mismatch".
  """
  if call is None:
    return 0.0, "no_direction_call"
  pred = normalize_route(*call, decimals=decimals)
  if pred is None:
    return 0.0, "bad_coordinates"
  if any(s not in retrieved for s in pred.stops):
    return 0.0, "not_retrieved"
  if not route_matches(pred, truth, order_level):
    return 0.0, "mismatch"
  return 1.0, "match"
