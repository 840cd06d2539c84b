"""The three Amap-like tools (Appendix C.2.1) over an offline ``World``.

``poi_search(address, region=None)``, ``around_search(location, radius, keyword,
region)`` and ``direction(origin, destination, mode, waypoints)``. Every tool
returns a ``ToolOutput`` whose ``text`` is the terse observation shown to the
agent; bad arguments give an error observation (``error=True``), never an
exception. Observations list one candidate per line::

    found 2
    1. name Yixing Temple; city Beijing; address 12 Baita Road; location 116.4012,39.9123; type scenic spot; rating 4.5; hours 8-17
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from rti_jax.envs.navigation import words
import numpy as np

from rti_jax.envs.navigation.world import POI, World, haversine_m, haversine_many_m, parse_location
from rti_jax.envs.tool_calls import ToolCall

MAX_RADIUS_M = 50_000
MAX_WAYPOINTS = 16
DEFAULT_RADIUS_M = 5_000
DEFAULT_MODE = "driving"
# Road-distance factor over the straight line, speed in km/h, and fixed minutes per leg.
MODE_PROFILE: dict[str, tuple[float, float, float]] = {
    "driving": (1.3, 35.0, 0.0),
    "walking": (1.2, 4.5, 0.0),
    "bicycling": (1.25, 14.0, 0.0),
    "electrobike": (1.25, 20.0, 0.0),
    "transit": (1.35, 22.0, 6.0),
}
assert set(MODE_PROFILE) == set(words.MODES)

TOOL_NAMES: tuple[str, ...] = ("poi_search", "around_search", "direction")


@dataclasses.dataclass(frozen=True)
class ToolOutput:
  """One executed call.

  text: the observation shown to the agent.
  error: the call was rejected (bad tool, bad arguments).
  pois: the POIs the observation revealed (their coordinates count as retrieved).
  route: for a successful ``direction`` call, (origin, waypoints, destination) as passed.
  """

  text: str
  error: bool = False
  pois: tuple[POI, ...] = ()
  route: tuple[str, tuple[str, ...], str] | None = None


ASK_USER_SCHEMA: dict[str, Any] = {"type": "function", "function": {
    "name": "ask_user",
    "description": "Ask the user a question about their request, for example which city a place is in.",
    "parameters": {"type": "object", "properties": {
        "question": {"type": "string", "description": "the question, naming the places it is about"},
    }, "required": ["question"]}}}


def tool_schemas(terse: bool = False, ask_user: bool = False) -> list[dict[str, Any]]:
  """OpenAI/Qwen function-calling schemas of the three tools (``terse``: without descriptions);
  ``ask_user``: a fourth, ``ask_user(question)``, answered by the env's user (settings with
  hidden-city tasks, ``hidden.py``)."""
  schemas = [
      {"type": "function", "function": {
          "name": "poi_search",
          "description": "Search places by name or address. Returns name, city, address, location and business info.",
          "parameters": {"type": "object", "properties": {
              "address": {"type": "string", "description": "place name or address"},
              "region": {"type": "string", "description": "city to search in"},
          }, "required": ["address"]}}},
      {"type": "function", "function": {
          "name": "around_search",
          "description": "Search places within a radius of a location.",
          "parameters": {"type": "object", "properties": {
              "location": {"type": "string", "description": "center as lon,lat"},
              "radius": {"type": "integer", "description": "radius in meters, 0 to 50000"},
              "keyword": {"type": "string", "description": "type or name, for example scenic spot"},
              "region": {"type": "string", "description": "city to search in"},
          }, "required": ["location"]}}},
      {"type": "function", "function": {
          "name": "direction",
          "description": "Plan a route from origin to destination through waypoints in the given order.",
          "parameters": {"type": "object", "properties": {
              "origin": {"type": "string", "description": "start as lon,lat"},
              "destination": {"type": "string", "description": "end as lon,lat"},
              "mode": {"type": "string", "enum": list(words.MODES)},
              "waypoints": {"type": "array", "items": {"type": "string"},
                            "description": "stops between origin and destination as lon,lat, at most 16"},
          }, "required": ["origin", "destination"]}}},
  ]
  if ask_user:
    schemas.append(ASK_USER_SCHEMA)
  return [_strip_descriptions(s) for s in schemas] if terse else schemas


def _strip_descriptions(node: Any) -> Any:
  if isinstance(node, dict):
    return {k: _strip_descriptions(v) for k, v in node.items() if k != "description"}
  if isinstance(node, list):
    return [_strip_descriptions(v) for v in node]
  return node


def _error(text: str) -> ToolOutput:
  return ToolOutput(text=f"error: {text}", error=True)


def _show(value: Any) -> str:
  """A model-supplied value quoted for an error message (kept short)."""
  text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
  return json.dumps(text[:60], ensure_ascii=False)


def format_poi(index: int, poi: POI, distance_m: float | None = None, terse: bool = False) -> str:
  """One candidate line of an observation (``terse``: without address, rating and hours)."""
  if terse:
    line = f"{index}. name {poi.name}; city {poi.city}; location {poi.location}; type {poi.type}"
  else:
    line = (f"{index}. name {poi.name}; city {poi.city}; address {poi.address}; location {poi.location}; "
            f"type {poi.type}; rating {poi.rating}; hours {poi.hours}")
  if distance_m is not None:
    line += f"; distance {int(round(distance_m))} m"
  return line


def _listing(world: World, pois: list[POI], distances: list[float] | None = None) -> ToolOutput:
  if not pois:
    return ToolOutput(text="found 0")
  lines = [f"found {len(pois)}"]
  for i, p in enumerate(pois):
    lines.append(format_poi(i + 1, p, None if distances is None else distances[i], world.config.terse))
  return ToolOutput(text="\n".join(lines), pois=tuple(pois))


def _resolve_region(world: World, region: Any) -> tuple[str | None, ToolOutput | None]:
  if region is None or (isinstance(region, str) and not region.strip()):
    return None, None
  if not isinstance(region, str):
    return None, _error(f"region must be a city name, got {_show(region)}")
  city = world.canonical_city(region)
  if city is None:
    return None, _error(f"unknown region {_show(region)}; region must be a city name")
  return city, None


def rank_text_search(world: World, text: str, city: str | None) -> list[POI]:
  """Candidates of a text search, best first (no truncation).

  Exact name (or address) matches come first, most popular first, so without a
  region an ambiguous name can rank another city's instance first; then names
  sharing the query's first word or containing it.
  """
  q = " ".join(text.lower().split())
  exact, partial = world.text_matches(q)
  if city is not None:
    exact = [p for p in exact if p.city == city]
    partial = [p for p in partial if p.city == city]
  exact = sorted(exact, key=lambda p: -p.popularity)
  partial = sorted(partial, key=lambda p: -p.popularity)
  return exact + partial


def poi_search(world: World, args: dict[str, Any]) -> ToolOutput:
  """Text search; ``region`` restricts the search to one city."""
  address = args.get("address")
  if not isinstance(address, str) or not address.strip():
    return _error(f"address of poi_search must be a non-empty string, got {_show(address)}")
  city, err = _resolve_region(world, args.get("region"))
  if err is not None:
    return err
  return _listing(world, rank_text_search(world, address, city)[: world.config.max_results])


def keyword_matches(poi: POI, keyword: str) -> bool:
  """A keyword matches a POI's type ("scenic spot"), category ("temple") or name."""
  k = " ".join(keyword.lower().split())
  return not k or k in poi.type or k == poi.category.lower() or k in poi.name.lower()


def around(world: World, lon: float, lat: float, radius_m: float, keyword: str = "",
           city: str | None = None) -> list[tuple[POI, float]]:
  """All POIs within ``radius_m`` of (lon, lat) matching ``keyword``, nearest first."""
  dist = haversine_many_m(lon, lat, world.lons, world.lats)
  hits = [(world.pois[i], float(dist[i])) for i in np.flatnonzero(dist <= radius_m)]
  hits = [(p, d) for p, d in hits if (city is None or p.city == city) and keyword_matches(p, keyword)]
  hits.sort(key=lambda pd: (pd[1], pd[0].poi_id))
  return hits


def _as_radius(value: Any) -> int | None:
  """A JSON integer (not a bool), an integral float or a string of ASCII digits; else None.

  ``str.isdigit`` alone would accept "²" (which ``int`` rejects) and "٣" (which it reads
  as 3). A digit string too long to be in range is None rather than a huge ``int``
  (past Python's int-string limit ``int`` raises).
  """
  if isinstance(value, bool):
    return None
  if isinstance(value, int):
    return value
  if isinstance(value, float) and value.is_integer():
    return int(value)
  if isinstance(value, str):
    digits = value.strip()
    if digits.isascii() and digits.isdigit():
      significant = digits.lstrip("0") or "0"
      return int(significant) if len(significant) <= len(str(MAX_RADIUS_M)) else None
  return None


def around_search(world: World, args: dict[str, Any]) -> ToolOutput:
  """Nearby search around ``location`` within ``radius`` metres (0..50000)."""
  center = parse_location(args.get("location"))
  if center is None:
    return _error(f"location of around_search must be lon,lat coordinates, got {_show(args.get('location'))}")
  radius = _as_radius(args.get("radius", DEFAULT_RADIUS_M))
  if radius is None or not 0 <= radius <= MAX_RADIUS_M:
    return _error(f"radius of around_search must be an integer from 0 to {MAX_RADIUS_M}, "
                  f"got {_show(args.get('radius'))}")
  keyword = args.get("keyword", "")
  if keyword is None:
    keyword = ""
  if not isinstance(keyword, str):
    return _error(f"keyword of around_search must be a string, got {_show(keyword)}")
  city, err = _resolve_region(world, args.get("region"))
  if err is not None:
    return err
  hits = around(world, float(center[0]), float(center[1]), radius, keyword, city)[: world.config.max_results]
  return _listing(world, [p for p, _ in hits], [d for _, d in hits])


def _as_waypoints(value: Any) -> list[Any] | None:
  if value is None:
    return []
  if isinstance(value, str):
    return [w for w in value.split(";") if w.strip()]
  if isinstance(value, list):
    return value
  return None


def direction(world: World, args: dict[str, Any]) -> ToolOutput:
  """A route summary computed from the coordinates (straight legs times a road factor).

  A stop is ``"lon,lat"`` or a labelled ``"Name lon,lat"`` (``world.without_label``); the label is
  ignored here and by the reward.
  """
  for role in ("origin", "destination"):
    if parse_location(args.get(role)) is None:
      return _error(f"{role} of direction must be lon,lat coordinates, got {_show(args.get(role))}")
  mode = args.get("mode", DEFAULT_MODE)
  if mode is None:
    mode = DEFAULT_MODE
  if not isinstance(mode, str) or mode not in MODE_PROFILE:  # a list or dict is not hashable
    return _error(f"mode of direction must be one of {', '.join(words.MODES)}, got {_show(mode)}")
  waypoints = _as_waypoints(args.get("waypoints"))
  if waypoints is None:
    return _error(f"waypoints of direction must be a list of lon,lat strings, got {_show(args.get('waypoints'))}")
  if len(waypoints) > MAX_WAYPOINTS:
    return _error(f"direction accepts at most {MAX_WAYPOINTS} waypoints, got {len(waypoints)}")
  for i, w in enumerate(waypoints):
    if parse_location(w) is None:
      return _error(f"waypoint {i + 1} of direction must be lon,lat coordinates, got {_show(w)}")
  raw = [args["origin"], *waypoints, args["destination"]]
  points = [parse_location(r) for r in raw]
  factor, speed_kmh, leg_min = MODE_PROFILE[mode]
  km = sum(haversine_m(float(a[0]), float(a[1]), float(b[0]), float(b[1]))
           for a, b in zip(points[:-1], points[1:])) * factor / 1000.0
  minutes = km / speed_kmh * 60.0 + leg_min * (len(points) - 1)
  text = f"route ok; mode {mode}; stops {len(points)}; distance {km:.1f} km; time {int(round(minutes))} min"
  route = (str(args["origin"]), tuple(str(w) for w in waypoints), str(args["destination"]))
  return ToolOutput(text=text, route=route)


_TOOLS: dict[str, tuple[Callable[[World, dict[str, Any]], ToolOutput], frozenset[str], frozenset[str]]] = {
    "poi_search": (poi_search, frozenset({"address"}), frozenset({"address", "region"})),
    "around_search": (around_search, frozenset({"location"}), frozenset({"location", "radius", "keyword", "region"})),
    "direction": (direction, frozenset({"origin", "destination"}),
                  frozenset({"origin", "destination", "mode", "waypoints"})),
}


def execute(world: World, call: ToolCall) -> ToolOutput:
  """Runs one parsed call; unknown tools and bad arguments give error observations."""
  if call.name not in _TOOLS:
    return _error(f"unknown tool {_show(call.name)}; tools are {', '.join(TOOL_NAMES)}")
  fn, required, allowed = _TOOLS[call.name]
  missing = sorted(required - set(call.arguments))
  if missing:
    return _error(f"missing argument {missing[0]} of {call.name}")
  extra = sorted(set(call.arguments) - allowed)
  if extra:
    return _error(f"unexpected argument {_show(extra[0])} of {call.name}")
  return fn(world, call.arguments)
