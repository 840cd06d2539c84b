"""World construction: determinism, coordinates, clustering, name collisions, normalisation."""

import collections
import math

import pytest

from rti_jax.envs.navigation import words
from rti_jax.envs.navigation.config import PAPER, TINY, get_config
from rti_jax.envs.navigation.world import CITY_RADIUS_KM, build_world, haversine_m, normalize_location


def _equirect_m(lon1, lat1, lon2, lat2):
  """Independent small-distance reference: equirectangular projection."""
  x = math.radians(lon2 - lon1) * math.cos(math.radians((lat1 + lat2) / 2))
  y = math.radians(lat2 - lat1)
  return 6_371_000.0 * math.hypot(x, y)


@pytest.mark.parametrize("cfg", [TINY, PAPER], ids=["tiny", "paper"])
def test_world_is_deterministic_and_well_formed(cfg):
  a, b = build_world(cfg), build_world(cfg)
  assert a.pois == b.pois
  assert len(a.pois) == cfg.num_cities * cfg.pois_per_city
  assert build_world(get_config(cfg.name, seed=1)).pois != a.pois
  centres = {c: (lon, lat) for c, lon, lat in words.CITIES}
  for p in a.pois:
    lon_s, lat_s = p.location.split(",")
    assert len(lon_s.split(".")[1]) == cfg.decimals and len(lat_s.split(".")[1]) == cfg.decimals
    assert 73 < p.lon < 136 and 18 < p.lat < 54  # China's extent
    assert haversine_m(*centres[p.city], p.lon, p.lat) <= CITY_RADIUS_KM * 1000 + 50
    assert p.name.split()[1] == p.category
    assert (p.type == words.SCENIC_TYPE) == (p.category in words.SCENIC_CATEGORIES)
  assert len({p.location for p in a.pois}) == len(a.pois)
  # Names are unique within a city.
  assert len({(p.city, p.name) for p in a.pois}) == len(a.pois)


@pytest.mark.parametrize("cfg", [TINY, PAPER], ids=["tiny", "paper"])
def test_deliberate_name_collisions_across_cities(cfg):
  world = build_world(cfg)
  cities_of = collections.defaultdict(set)
  for p in world.pois:
    cities_of[p.name].add(p.city)
  shared = [n for n, cs in cities_of.items() if len(cs) > 1]
  assert len(shared) >= cfg.shared_names // 2
  assert all(world.is_ambiguous(n) for n in shared)
  assert max(len(cities_of[n]) for n in shared) >= 3
  assert not world.is_ambiguous(next(n for n, cs in cities_of.items() if len(cs) == 1))


def test_cities_are_far_apart_so_trips_stay_in_one_city():
  cities = words.CITIES
  for i, (_, lon1, lat1) in enumerate(cities):
    for _, lon2, lat2 in cities[i + 1:]:
      assert haversine_m(lon1, lat1, lon2, lat2) > 2 * CITY_RADIUS_KM * 1000 + 100_000


def test_haversine_matches_small_distance_reference():
  for lon1, lat1, lon2, lat2 in [(116.4, 39.9, 116.5, 39.95), (121.5, 25.0, 121.52, 25.1), (87.6, 43.8, 87.7, 43.7)]:
    assert haversine_m(lon1, lat1, lon2, lat2) == pytest.approx(_equirect_m(lon1, lat1, lon2, lat2), rel=1e-3)


@pytest.mark.parametrize("text,decimals,expected", [
    ("121.560000,25.040000", 6, "121.560000,25.040000"),
    (" 121.56 , 25.04 ", 6, "121.560000,25.040000"),
    ("121.5600,25.0400", 4, "121.5600,25.0400"),
    ("-0.5,0", 2, "-0.50,0.00"),
    ("121.5600001,25.04", 6, None),  # extra precision is not rounded onto a point
    ("121.56;25.04", 6, None),
    ("121.56,25.04,3", 6, None),
    ("abc,25.04", 6, None),
    ("200.0,25.0", 6, None),
    ("121.0,95.0", 6, None),
    ("nan,1", 6, None),
    (None, 6, None),
    (121.56, 6, None),
    # a stop labelled with its place's name: the label is ignored, the coordinates must still be exact
    ("Shimen Hill 121.56,25.04", 4, "121.5600,25.0400"),
    ("Yixing Temple (Taipei) 121.56, 25.04", 2, "121.56,25.04"),
    ("Shimen Hill 121.56001,25.04", 4, None),
    ("Shimen Hill, 121.56,25.04", 4, None),  # a comma in the label: not a stop
    ("Hill121.56,25.04", 4, None),  # no space between label and coordinates
    ("7 121.56,25.04", 4, None),  # a label needs a letter
    ("Shimen Hill", 4, None),
])
def test_normalize_location(text, decimals, expected):
  assert normalize_location(text, decimals) == expected


def test_last_digit_changes_the_normalised_string():
  assert normalize_location("121.560001,25.040000", 6) != normalize_location("121.560000,25.040000", 6)
