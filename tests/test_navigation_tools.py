"""The three tools: schemas, ranking with and without region, route summaries, error observations."""

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rti_jax.envs.navigation import tools
from rti_jax.envs.navigation.config import PAPER, TINY
from rti_jax.envs.navigation.world import build_world
from rti_jax.envs.tool_calls import ToolCall

WORLD = build_world(PAPER)
TINY_WORLD = build_world(TINY)


def _call(name, **args):
  return tools.execute(WORLD, ToolCall(name, args))


def _lines(text):
  return [dict(kv.split(" ", 1) for kv in line.split(". ", 1)[1].split("; ")) for line in text.splitlines()[1:]]


def _ambiguous_case(world):
  """A name in several cities and a city whose instance an unregioned search does not rank first."""
  for name in world.names:
    inst = world.instances(name)
    if len({p.city for p in inst}) > 1:
      top = max(inst, key=lambda p: p.popularity)
      other = next(p for p in inst if p.city != top.city)
      return name, top, other
  raise AssertionError("no ambiguous name")


def test_schemas_are_function_calling_json():
  for terse in (False, True):
    schemas = tools.tool_schemas(terse)
    assert [s["function"]["name"] for s in schemas] == ["poi_search", "around_search", "direction"]
    for s in schemas:
      assert s["type"] == "function"
      params = s["function"]["parameters"]
      assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
  direction = tools.tool_schemas()[2]["function"]["parameters"]["properties"]
  assert direction["mode"]["enum"] == ["driving", "walking", "bicycling", "electrobike", "transit"]
  assert "description" not in str(tools.tool_schemas(terse=True))


def test_unregioned_search_can_rank_a_far_instance_first_and_region_resolves_it():
  name, top, other = _ambiguous_case(WORLD)
  out = _call("poi_search", address=name)
  rows = _lines(out.text)
  assert not out.error and rows[0]["name"] == name and rows[0]["city"] == top.city
  assert rows[0]["location"] == top.location
  assert len(rows) <= PAPER.max_results
  regioned = _lines(_call("poi_search", address=name, region=other.city.lower()).text)
  assert regioned[0]["name"] == name and regioned[0]["location"] == other.location
  assert all(r["city"] == other.city for r in regioned)


def test_search_fields_and_terse_fields():
  p = WORLD.pois[5]
  row = _lines(_call("poi_search", address=p.name, region=p.city).text)[0]
  assert row == {"name": p.name, "city": p.city, "address": p.address, "location": p.location,
                 "type": p.type, "rating": p.rating, "hours": p.hours}
  q = TINY_WORLD.pois[5]
  row = _lines(tools.execute(TINY_WORLD, ToolCall("poi_search", {"address": q.name, "region": q.city})).text)[0]
  assert row == {"name": q.name, "city": q.city, "location": q.location, "type": q.type}
  assert _call("poi_search", address=p.address).text.splitlines()[1].split("; ")[0].endswith(p.name)
  assert _call("poi_search", address="Nowhere Land").text == "found 0"


def test_around_search_radius_keyword_region():
  p = next(p for p in WORLD.pois if p.is_scenic)
  out = _call("around_search", location=p.location, radius=50000, keyword="scenic spot")
  rows = _lines(out.text)
  assert rows[0]["name"] == p.name and rows[0]["distance"] == "0 m"
  dists = [int(r["distance"].split()[0]) for r in rows]
  assert dists == sorted(dists) and len(rows) == PAPER.max_results
  assert all(r["type"] == "scenic spot" for r in rows)
  # Brute force over the world: the nearest matches within the radius.
  ref = sorted((tools.haversine_m(p.lon, p.lat, q.lon, q.lat), q.name) for q in WORLD.pois
               if q.is_scenic and tools.haversine_m(p.lon, p.lat, q.lon, q.lat) <= 50000)
  assert [r["name"] for r in rows] == [n for _, n in ref[:PAPER.max_results]]
  museums = _lines(_call("around_search", location=p.location, radius=50000, keyword="museum").text)
  assert museums and all(r["name"].endswith("Museum") for r in museums)
  assert _lines(_call("around_search", location=p.location, radius=0, keyword="").text)[0]["name"] == p.name
  other_city = next(c for c in WORLD.cities if c != p.city)
  assert _call("around_search", location=p.location, radius=50000, region=other_city).text == "found 0"


def test_direction_summary_is_computed_from_coordinates():
  a, b, c = WORLD.pois[0], WORLD.pois[1], WORLD.pois[2]
  for mode, (factor, speed, wait) in tools.MODE_PROFILE.items():
    out = _call("direction", origin=a.location, destination=c.location, waypoints=[b.location], mode=mode)
    m = re.fullmatch(r"route ok; mode (\w+); stops 3; distance ([\d.]+) km; time (\d+) min", out.text)
    assert m and m[1] == mode and out.route == (a.location, (b.location,), c.location)
    # Independent reference: spherical law of cosines.
    def leg(p, q):
      phi1, phi2 = math.radians(p.lat), math.radians(q.lat)
      cosang = math.sin(phi1) * math.sin(phi2) + math.cos(phi1) * math.cos(phi2) * math.cos(math.radians(q.lon - p.lon))
      return 6371.0 * math.acos(min(1.0, cosang))
    km = (leg(a, b) + leg(b, c)) * factor
    assert float(m[2]) == pytest.approx(km, abs=0.06)
    assert int(m[3]) == pytest.approx(km / speed * 60 + 2 * wait, abs=1)
  assert _call("direction", origin=a.location, destination=c.location).text.startswith("route ok; mode driving")
  # Labelled stops ("Name lon,lat") route exactly like bare coordinates.
  bare = _call("direction", origin=a.location, destination=c.location, waypoints=[b.location])
  labelled = _call("direction", origin=f"{a.name} {a.location}", destination=f"{c.name} {c.location}",
                   waypoints=[f"{b.name} {b.location}"])
  assert labelled.text == bare.text


@pytest.mark.parametrize("name,args,fragment", [
    ("direction", {"origin": "1,1", "destination": "2,2", "mode": "flying"}, "mode of direction must be one of"),
    ("direction", {"origin": "1,1", "destination": "2,2", "waypoints": ["3,3"] * 17}, "at most 16 waypoints, got 17"),
    ("direction", {"origin": "Dajin Park", "destination": "2,2"}, "origin of direction must be lon,lat"),
    ("direction", {"origin": "1,1", "destination": "2,2", "waypoints": ["1,x"]}, "waypoint 1 of direction"),
    ("direction", {"origin": "1,1", "destination": "2,2", "waypoints": 7}, "waypoints of direction must be a list"),
    ("direction", {"origin": "1,1"}, "missing argument destination of direction"),
    ("around_search", {"location": "1,1", "radius": 50001}, "radius of around_search must be an integer from 0"),
    ("around_search", {"location": "1,1", "radius": -1}, "radius of around_search"),
    ("around_search", {"location": "1,1", "radius": "far"}, "radius of around_search"),
    ("around_search", {"location": "1;1"}, "location of around_search must be lon,lat"),
    ("poi_search", {"address": ""}, "address of poi_search must be a non-empty string"),
    ("poi_search", {"address": "Dajin Park", "region": "Atlantis"}, "unknown region"),
    ("poi_search", {"address": "Dajin Park", "city": "Taipei"}, "unexpected argument"),
    ("geocode", {"address": "Dajin Park"}, "unknown tool"),
])
def test_bad_arguments_give_error_observations(name, args, fragment):
  out = _call(name, **args)
  assert out.error and out.text.startswith("error: ") and fragment in out.text
  assert out.pois == () and out.route is None


def test_sixteen_waypoints_are_allowed():
  out = _call("direction", origin="1,1", destination="2,2", waypoints=["1.5,1.5"] * 16)
  assert not out.error and "stops 18" in out.text


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                     max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["poi_search", "around_search", "direction", "x"]),
       st.dictionaries(st.sampled_from(["address", "region", "location", "radius", "keyword", "origin",
                                        "destination", "mode", "waypoints", "other"]), _json, max_size=5))
def test_arbitrary_arguments_never_raise(name, args):
  out = tools.execute(TINY_WORLD, ToolCall(name, args))
  assert isinstance(out.text, str) and out.text
