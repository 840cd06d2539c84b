"""An offline, seeded, Amap-like map: cities with clustered POIs and name collisions.

Every POI lies within ``CITY_RADIUS_KM`` of its city's real centre, so any set of
POIs sampled within 50 km of an anchor is one coherent trip. Some literal names
("Yixing Temple") are placed in several cities on purpose: searching such a name
without a region returns the most popular instance first, which is often in
another city (Appendix D.4).
"""

from __future__ import annotations

import dataclasses
import math
import re
from decimal import Decimal, InvalidOperation
from typing import Sequence

import numpy as np

from rti_jax.envs.navigation import words
from rti_jax.envs.navigation.config import NavConfig

CITY_RADIUS_KM = 18.0
EARTH_RADIUS_M = 6_371_000.0


@dataclasses.dataclass(frozen=True)
class POI:
  """One place. ``location`` is the canonical "lon,lat" string (fixed decimals)."""

  poi_id: str
  name: str
  category: str  # last word of the name, e.g. "Temple"
  type: str  # business type, e.g. "scenic spot"
  city: str
  address: str
  location: str
  lon: float
  lat: float
  popularity: float  # ranking score of unregioned searches, in (0, 1)
  rating: str  # business info, e.g. "4.5"
  hours: str  # business info, e.g. "8-17"

  @property
  def is_scenic(self) -> bool:
    return self.type == words.SCENIC_TYPE


@dataclasses.dataclass(frozen=True)
class World:
  """All POIs plus lookup tables. Build with ``build_world``."""

  config: NavConfig
  pois: tuple[POI, ...]
  cities: tuple[str, ...]

  def __post_init__(self) -> None:
    by_name: dict[str, list[POI]] = {}
    for p in self.pois:
      by_name.setdefault(p.name.lower(), []).append(p)
    object.__setattr__(self, "_by_name", by_name)
    object.__setattr__(self, "_by_id", {p.poi_id: p for p in self.pois})
    object.__setattr__(self, "_city_lookup", {c.lower(): c for c in self.cities})
    by_first: dict[str, list[POI]] = {}
    by_address: dict[str, list[POI]] = {}
    for p in self.pois:
      by_first.setdefault(p.name.lower().split(" ")[0], []).append(p)
      by_address.setdefault(p.address.lower(), []).append(p)
    object.__setattr__(self, "_by_first", by_first)
    object.__setattr__(self, "_by_address", by_address)
    object.__setattr__(self, "_lower_names", [(p.name.lower(), p) for p in self.pois])
    object.__setattr__(self, "lons", np.array([p.lon for p in self.pois]))
    object.__setattr__(self, "lats", np.array([p.lat for p in self.pois]))
    names = sorted(by_name, key=len, reverse=True)
    object.__setattr__(self, "name_regex", re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b"))

  def poi(self, poi_id: str) -> POI:
    return self._by_id[poi_id]  # type: ignore[attr-defined]

  def instances(self, name: str) -> list[POI]:
    """Every POI whose name equals ``name`` (case-insensitive)."""
    return list(self._by_name.get(name.strip().lower(), []))  # type: ignore[attr-defined]

  def text_matches(self, query: str) -> tuple[list[POI], list[POI]]:
    """(exact, partial) matches of a normalised lower-case query, in world order.

    exact: the name or the address equals the query; partial: the name shares the
    query's first word or contains the query.
    """
    exact = self._by_name.get(query, []) + self._by_address.get(query, [])  # type: ignore[attr-defined]
    seen = {p.poi_id for p in exact}
    first = query.split(" ")[0]
    partial = {p.poi_id: p for p in self._by_first.get(first, []) if p.poi_id not in seen}  # type: ignore[attr-defined]
    for lower, p in self._lower_names:  # type: ignore[attr-defined]
      if query in lower and p.poi_id not in seen:
        partial[p.poi_id] = p
    return exact, sorted(partial.values(), key=lambda p: p.poi_id)

  def is_ambiguous(self, name: str) -> bool:
    """The literal name exists in more than one city."""
    return len({p.city for p in self.instances(name)}) > 1

  def canonical_city(self, region: str) -> str | None:
    """The city called ``region`` (case-insensitive), or None."""
    return self._city_lookup.get(region.strip().lower())  # type: ignore[attr-defined]

  @property
  def names(self) -> list[str]:
    return sorted({p.name for p in self.pois})


def haversine_m(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
  """Great-circle distance in metres."""
  p1, p2 = math.radians(lat1), math.radians(lat2)
  dphi, dlmb = p2 - p1, math.radians(lon2 - lon1)
  h = math.sin(dphi / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dlmb / 2) ** 2
  return 2 * EARTH_RADIUS_M * math.asin(math.sqrt(min(1.0, h)))


def haversine_many_m(lon: float, lat: float, lons: np.ndarray, lats: np.ndarray) -> np.ndarray:
  """Great-circle distances in metres from one point to many: [N]."""
  p1, p2 = np.radians(lat), np.radians(lats)
  h = np.sin((p2 - p1) / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(np.radians(lons - lon) / 2) ** 2
  return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.minimum(1.0, h)))


def format_location(lon: float, lat: float, decimals: int) -> str:
  """The canonical "lon,lat" string with exactly ``decimals`` decimals."""
  return f"{lon:.{decimals}f},{lat:.{decimals}f}"


def _new_location(rng: np.random.Generator, clon: float, clat: float, decimals: int, seen: set[str]) -> str:
  """A formatted location drawn uniformly within ``CITY_RADIUS_KM`` of a city centre, distinct from
  every location in ``seen`` (redrawn until it is); added to ``seen``."""
  while True:
    r = CITY_RADIUS_KM * math.sqrt(rng.random())
    theta = 2 * math.pi * rng.random()
    lon, lat = _offset(clon, clat, r * math.cos(theta), r * math.sin(theta))
    loc = format_location(lon, lat, decimals)
    if loc not in seen:
      seen.add(loc)
      return loc


def _street(rng: np.random.Generator) -> str:
  """A street address: a house number, a name stem and a street kind."""
  return (f"{int(rng.integers(1, 200))} {words.STEMS[int(rng.integers(len(words.STEMS)))]} "
          f"{words.STREET_KINDS[int(rng.integers(len(words.STREET_KINDS)))]}")


_COORD_CHARS = frozenset("-+0123456789.")


def _label_split(text: str) -> int | None:
  """Where the coordinates of a labelled stop ``"Name Words lon,lat"`` start, or None.

  A labelled stop is: a label holding an ASCII letter and no comma, whitespace, then
  ``lon`` and ``lat`` (runs of ``-+0-9.``) around the only comma, spaces allowed around
  the comma and at both ends. The same strings as the regex
  ``^\\s*[^,]*?[A-Za-z][^,]*?\\s+(?P<coords>[-+0-9.]+\\s*,\\s*[-+0-9.]+)\\s*$``, read in one
  pass (that regex backtracks cubically: 13 s on 2,000 characters without a comma).
  """
  comma = text.find(",")
  if comma < 0 or text.find(",", comma + 1) >= 0:
    return None
  if not (lat := text[comma + 1:].strip()) or not _COORD_CHARS.issuperset(lat):
    return None
  lon_end = len(text[:comma].rstrip())
  start = lon_end
  while start > 0 and text[start - 1] in _COORD_CHARS:
    start -= 1
  if start == lon_end or start == 0 or not text[start - 1].isspace():
    return None
  if not any("A" <= c <= "Z" or "a" <= c <= "z" for c in text[:start]):
    return None
  return start


def without_label(text: str) -> str:
  """The coordinate part of a labelled stop (``"Shimen Hill 1.5,2.5"`` -> ``"1.5,2.5"``); other text as is."""
  start = _label_split(text)
  return text if start is None else text[start:].rstrip()


def parse_location(text: object) -> tuple[Decimal, Decimal] | None:
  """Parses "lon,lat" into exact decimals; None if malformed or out of range.

  A stop may carry its place's name before the coordinates, "Shimen Hill 109.0145,34.4338":
  the label is ignored (routing and scoring use the coordinates only). It lets a policy write
  each coordinate right after the name it belongs to.
  """
  if not isinstance(text, str):
    return None
  parts = without_label(text).strip().split(",")
  if len(parts) != 2 or not all(p.isascii() for p in parts):  # Decimal would read "٣" as 3
    return None
  try:
    lon, lat = (Decimal(p.strip()) for p in parts)
  except InvalidOperation:
    return None
  if not (lon.is_finite() and lat.is_finite()):
    return None
  if not (-180 <= lon <= 180 and -90 <= lat <= 90):
    return None
  return lon, lat


def normalize_location(text: object, decimals: int) -> str | None:
  """The canonical string of a "lon,lat" value, or None.

  "121.5600,25.0400" and " 121.56 , 25.04 " normalise to the same string; a value
  with non-zero digits beyond ``decimals`` is not rounded onto a canonical point
  (it returns None), so only exactly copied coordinates can match.
  """
  parsed = parse_location(text)
  if parsed is None:
    return None
  quantum = Decimal(1).scaleb(-decimals)
  out = []
  for v in parsed:
    q = v.quantize(quantum)
    if q != v:
      return None
    out.append(f"{q:.{decimals}f}")
  return ",".join(out)


def _offset(lon: float, lat: float, dx_km: float, dy_km: float) -> tuple[float, float]:
  return lon + dx_km / (111.32 * math.cos(math.radians(lat))), lat + dy_km / 111.32


def build_world(config: NavConfig) -> World:
  """The deterministic world of ``config`` (same seed, same world)."""
  rng = np.random.default_rng([config.seed, 101])
  cities = [c for c in words.CITIES[: config.num_cities]]
  city_names = tuple(c[0] for c in cities)
  categories = list(words.SCENIC_CATEGORIES) + list(words.OTHER_CATEGORIES)
  pool = [f"{s} {c}" for s in words.STEMS for c in categories]
  order = rng.permutation(len(pool))
  scenic_pool = [pool[i] for i in order if pool[i].split()[1] in words.SCENIC_CATEGORIES]
  other_pool = [pool[i] for i in order if pool[i].split()[1] not in words.SCENIC_CATEGORIES]

  # Names placed in several cities (2..4), each instance in a different city.
  per_city_names: dict[str, list[str]] = {c: [] for c in city_names}
  shared = [scenic_pool.pop() for _ in range(config.shared_names)]
  for name in shared:
    k = int(rng.integers(2, min(4, config.num_cities) + 1))
    for ci in rng.choice(config.num_cities, size=k, replace=False):
      if len(per_city_names[city_names[ci]]) < config.pois_per_city // 3:
        per_city_names[city_names[ci]].append(name)
  for city in city_names:
    while len(per_city_names[city]) < config.pois_per_city:
      src = scenic_pool if rng.random() < 0.7 else other_pool
      if not src:
        raise ValueError(f"the name inventory is too small for pois_per_city={config.pois_per_city} "
                         f"and num_cities={config.num_cities}")
      per_city_names[city].append(src.pop())

  pois: list[POI] = []
  seen_locations: set[str] = set()
  for (city, clon, clat) in cities:
    for name in per_city_names[city]:
      loc = _new_location(rng, clon, clat, config.decimals, seen_locations)
      lon_s, lat_s = loc.split(",")
      category = name.split()[1]
      street = _street(rng)
      open_h = int(rng.integers(6, 10))
      pois.append(POI(
          poi_id=f"P{len(pois):04d}",
          name=name,
          category=category,
          type=words.OTHER_CATEGORIES.get(category, words.SCENIC_TYPE),
          city=city,
          address=street,
          location=loc,
          lon=float(lon_s),
          lat=float(lat_s),
          popularity=float(rng.random()),
          rating=f"{rng.integers(30, 50) / 10:.1f}",
          hours=f"{open_h}-{open_h + int(rng.integers(8, 13))}",
      ))
  if config.hidden_city_share > 0:
    pois += hidden_city_pois(config, pois, city_names, seen_locations)
  return World(config=config, pois=tuple(pois), cities=city_names)


def base_size(config: NavConfig) -> int:
  """How many POIs ``build_world`` places before any hidden-city places (every city gets exactly
  ``pois_per_city``)."""
  return config.num_cities * config.pois_per_city


def base_world(world: World) -> World:
  """``world`` without its hidden-city places (the world of ``hidden_city_share = 0``)."""
  n = base_size(world.config)
  return world if len(world.pois) == n else World(config=world.config, pois=world.pois[:n], cities=world.cities)


def hidden_city_pois(config: NavConfig, pois: list[POI], cities: Sequence[str],
                     seen_locations: set[str]) -> list[POI]:
  """Places that let a city hide (only with ``hidden_city_share > 0``; own random stream).

  The cities are drawn into groups of ``max_results + 1``. Each city of a group gets
  ``max_stops + 2`` scenic names that no other place has (fewer when the name inventory runs
  short), each placed in every city of the group, the home city's place less popular than all its
  namesakes. An unregioned search for such a name then lists ``max_results`` namesakes and never
  the home city's place, and every city of the group holds every name its cities got, so a trip
  made of one city's new names is consistent with each city of the group (``hidden.py`` builds
  such trips). The names are new, so the other places' exact search results do not change.
  """
  rng = np.random.default_rng([config.seed, 103])
  size = config.max_results + 1
  order = [cities[i] for i in rng.permutation(len(cities))]
  groups = [order[g * size:(g + 1) * size] for g in range(len(order) // size)]
  used = {p.name for p in pois}
  free = [f"{s} {c}" for s in words.STEMS for c in words.SCENIC_CATEGORIES if f"{s} {c}" not in used]
  free = [free[i] for i in rng.permutation(len(free))]
  per_city = min(config.max_stops + 2, len(free) // max(1, size * len(groups)))
  if per_city < config.min_stops:
    raise ValueError(f"the name inventory is too small for hidden-city places: {len(free)} free names for "
                     f"{size * len(groups)} cities of min_stops={config.min_stops} each")
  centres = {c[0]: (c[1], c[2]) for c in words.CITIES}
  out: list[POI] = []
  for group in groups:
    for home in group:
      for _ in range(per_city):
        name = free.pop()
        category = name.split()[1]
        others = sorted(float(rng.random()) for _ in range(size - 1))
        popularity = {home: others[0] * (0.05 + 0.9 * float(rng.random()))}
        popularity.update(zip([c for c in group if c != home], (o for o in others)))
        open_h = int(rng.integers(6, 10))
        rating, hours = f"{rng.integers(30, 50) / 10:.1f}", f"{open_h}-{open_h + int(rng.integers(8, 13))}"
        for city in group:
          clon, clat = centres[city]
          loc = _new_location(rng, clon, clat, config.decimals, seen_locations)
          lon_s, lat_s = loc.split(",")
          street = _street(rng)
          out.append(POI(poi_id=f"P{len(pois) + len(out):04d}", name=name, category=category, type=words.SCENIC_TYPE,
                         city=city, address=street, location=loc, lon=float(lon_s), lat=float(lat_s),
                         popularity=popularity[city], rating=rating, hours=hours))
  return out
