"""Hidden-city tasks and the user who answers ``ask_user`` (settings with ``hidden_city_share > 0``).

A hidden-city task is a trip in one city X whose every stop has namesakes in other cities
(``world.hidden_city_pois``: places added only in these settings, under names no other place has)
and whose query names no city:

* an unregioned ``poi_search`` of any stop lists ``max_results`` namesakes and never the stop in X
  (so the first results never show X, and trusting them gets every stop wrong);
* at least one other city holds every stop's name too (``candidate_cities`` >= 2), so no set of
  searches, with or without a region, tells which of those cities is meant;
* the query gives no city ("X" appears nowhere in it).

The reward-side evidence (``NavigationEnv.reward_evidence``) holds X, so a correction written from
it (``poi_search(name, region=X)``) finds every stop and earns reward 1; a policy cannot learn that
step, since at test time nothing it sees names X. What a policy can learn is the honest path: the
user knows their own plan, and the ``ask_user(question)`` tool (offered in these settings only)
returns the city of every stop the question names (``user_reply``); then a regioned search finds
the stops. ``OracleAgent`` asks when no search result tells the trip's city (every stop is listed
in several cities), so it solves these tasks without the evidence; ``NaiveAgent`` fails them.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np

from rti_jax.envs.navigation.tasks import (GenerationReport, NavTask, Stop, draw_query, join_names, stage3_reject_reason,
                                           stop_at, template_level, unregioned_misses, annotate_order_level)
from rti_jax.envs.navigation.tools import rank_text_search
from rti_jax.envs.navigation.world import POI, World, base_size

ASK_USER = "ask_user"
NO_PLACE = "Which place do you mean? Please name a place of my request."
_TOLD = re.compile(r"^(?P<names>.+?) (?:is|are) in (?P<city>[^.]+)\.$")


def candidate_cities(world: World, names: Sequence[str]) -> set[str]:
  """The cities in which every name of ``names`` has a place: the trip cities that any number of
  searches (with or without a region) leaves possible."""
  sets = [{p.city for p in world.instances(n)} for n in names]
  return set.intersection(*sets) if sets else set()


def hides_city(world: World, poi: POI) -> bool:
  """An unregioned search of ``poi``'s name lists ``max_results`` places, none of them in its city."""
  top = rank_text_search(world, poi.name, None)[: world.config.max_results]
  return len(top) == world.config.max_results and all(p.city != poi.city for p in top)


def hidden_pois(world: World) -> dict[str, list[POI]]:
  """Per city, its hidden-city places (``world.hidden_city_pois``) that an unregioned search hides
  behind namesakes elsewhere."""
  out: dict[str, list[POI]] = {}
  for p in world.pois[base_size(world.config):]:
    if p.is_scenic and len(world.instances(p.name)) > 1 and hides_city(world, p):
      out.setdefault(p.city, []).append(p)
  return out


def is_hidden_city_task(world: World, task: NavTask) -> bool:
  """The defining checks (see the module docstring), read off the world and the task."""
  names = [s.name for s in task.stops]
  city = task.stops[0].city
  query = task.query.lower()
  return (all(s.city == city and not s.hinted for s in task.stops)
          and all(hides_city(world, world.poi(s.poi_id)) for s in task.stops)
          and len(candidate_cities(world, names)) >= 2
          and not any(re.search(rf"\b{re.escape(c.lower())}\b", query) for c in world.cities))


def generate_hidden(world: World, num_tasks: int, rng: np.random.Generator, seen: set[frozenset[str]],
                    report: GenerationReport | None = None) -> list[NavTask]:
  """``num_tasks`` hidden-city tasks with stop sets distinct from each other and from ``seen``.

  Each draw: a city with enough hiding spots, a random number of them in a random order, a query
  of a random template (``tasks.draw_query``, the same phrasing as the other tasks), then the
  Stage-3 filter (an "unresolvable" verdict is what these tasks are) and ``is_hidden_city_task``.
  Rejections are counted in ``report`` under ``hidden_<reason>``.
  """
  cfg = world.config
  report = report if report is not None else GenerationReport()
  pools = {c: ps for c, ps in sorted(hidden_pois(world).items()) if len(ps) >= cfg.min_stops}
  if num_tasks and not pools:
    raise RuntimeError(f"no city has {cfg.min_stops} scenic spots hidden behind namesakes; "
                       f"hidden-city tasks need the places that hidden_city_share > 0 adds")
  cities = list(pools)
  capacity = sum(math.comb(len(ps), n) for ps in pools.values()
                 for n in range(cfg.min_stops, min(cfg.max_stops, len(ps)) + 1))
  if num_tasks > capacity:
    raise RuntimeError(f"{num_tasks} hidden-city tasks requested, but the hidden-city places allow at most "
                       f"{capacity} distinct stop sets; lower hidden_city_share or the split sizes")
  seen = set(seen)
  tasks: list[NavTask] = []
  draws, max_draws = 0, 50 * num_tasks + 1000
  while len(tasks) < num_tasks:
    if draws >= max_draws:
      raise RuntimeError(f"generated only {len(tasks)} of {num_tasks} hidden-city tasks after {max_draws} draws; "
                         f"rejections: {dict(report.rejected)}")
    draws += 1
    report.drawn += 1
    pool = pools[cities[int(rng.integers(len(cities)))]]
    n = int(rng.integers(cfg.min_stops, min(cfg.max_stops, len(pool)) + 1))
    stops = [stop_at(pool[int(i)], False) for i in rng.choice(len(pool), size=n, replace=False)]
    template, mode, query = draw_query(rng, stops)
    reason = stage3_reject_reason(world, query, stops, template_level(template), 2 * cfg.sample_radius_m)
    key = frozenset(s.poi_id for s in stops)
    if reason == "unresolvable":
      reason = None
    if reason is None and key in seen:
      reason = "duplicate"
    task = NavTask(task_id="", query=query, order_level=annotate_order_level(query), stops=tuple(stops), mode=mode,
                   template=template, ambiguous=unregioned_misses(world, stops), hidden_city=True)
    if reason is None and not is_hidden_city_task(world, task):
      reason = "not_hidden"
    if reason is not None:
      report.rejected[f"hidden_{reason}"] += 1
      continue
    seen.add(key)
    report.kept += 1
    tasks.append(task)
  return tasks


def named_stops(task: NavTask, question: str) -> list[Stop]:
  """The stops whose whole name ``question`` contains (case-insensitive), in route order."""
  q = question.lower()
  return [s for s in task.stops if re.search(rf"(?<![a-z0-9]){re.escape(s.name.lower())}(?![a-z0-9])", q)]


def user_reply(task: NavTask, args: dict[str, Any]) -> tuple[str, bool]:
  """(reply, error) of ``ask_user`` in ``task``: the user knows their own plan and tells the city of
  every stop the question names ("Dajin Park and Baita Temple are in Wuhan."); a question that
  names no stop gets ``NO_PLACE``. Nothing else (no coordinates, no order) is revealed."""
  question = args.get("question")
  if not isinstance(question, str) or not question.strip():
    text = question if isinstance(question, str) else repr(question)
    return f"error: question of ask_user must be a non-empty string, got {text[:60]!r}", True
  stops = named_stops(task, question)
  if not stops:
    return NO_PLACE, False
  by_city: dict[str, list[str]] = {}
  for s in stops:
    by_city.setdefault(s.city, []).append(s.name)
  return " ".join(f"{join_names(ns)} {'is' if len(ns) == 1 else 'are'} in {c}." for c, ns in by_city.items()), False


def told_cities(reply: str) -> dict[str, str]:
  """{place name (lower case): city} of a ``user_reply`` text (empty for ``NO_PLACE`` or an error)."""
  out: dict[str, str] = {}
  for sentence in re.split(r"(?<=\.) ", reply.strip()):
    m = _TOLD.match(sentence)
    if m:
      names = re.split(r", | and ", m["names"])
      out.update({n.strip().lower(): m["city"].strip() for n in names})
  return out
