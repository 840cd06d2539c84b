"""Task construction by the paper's inverse protocol (Appendix C.2.1, Stages 1-3).

Stage 1: an anchor POI drawn uniformly from the world, an around-search of 50 km
  for scenic spots, and a random subset of ``n`` of them in a random order: the
  reference route (origin, waypoints, destination).
Stage 2: a colloquial query from varied templates that mentions every stop exactly
  once (some with a city hint), then the order level (0-4) annotated from the
  query's surface ordering cues alone (``annotate_order_level``). A share of the
  pairs is deliberately flawed (a missing or spurious place, a stop from another
  city), as an LLM's output would be.
Stage 3: a filter applying the paper's rejection criteria (spurious, missing,
  geographically implausible, unclear), plus "unresolvable": an ambiguous name
  with no way for the agent to tell which city is meant.

With ``hidden_city_share > 0`` a share of each split is made of hidden-city tasks instead
(``hidden.py``, docs/navigation.md): tasks that "unresolvable" would reject, on purpose, whose
city only the user can tell (the ``ask_user`` tool).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from rti_jax.envs.navigation import words
from rti_jax.envs.navigation.reward import Route
from rti_jax.envs.navigation.tools import around, rank_text_search
from rti_jax.envs.navigation.world import POI, World, base_world, haversine_m


@dataclasses.dataclass(frozen=True)
class Stop:
  """One stop of the ground-truth route. ``hinted``: the query names its city."""

  name: str
  city: str
  location: str
  poi_id: str
  hinted: bool = False


@dataclasses.dataclass(frozen=True)
class NavTask:
  """One benchmark instance.

  stops: the reference route in order (origin, waypoints..., destination).
  order_level: 0-4, see ``reward.ORDER_RULES``.
  ambiguous: names of stops whose unregioned ``poi_search`` ranks another POI first.
  hidden_city: a hidden-city task (``hidden.py``): no search result tells which city the stops are
    in and the query names none; the user does, when asked (the ``ask_user`` tool).
  """

  task_id: str
  query: str
  order_level: int
  stops: tuple[Stop, ...]
  mode: str
  template: str
  ambiguous: tuple[str, ...] = ()
  hidden_city: bool = False

  @property
  def needs_disambiguation(self) -> bool:
    """Trusting the first unregioned search result gets at least one stop wrong."""
    return bool(self.ambiguous)

  @property
  def truth(self) -> Route:
    locs = [s.location for s in self.stops]
    return Route(origin=locs[0], waypoints=tuple(locs[1:-1]), destination=locs[-1])

  @property
  def city(self) -> str:
    return self.stops[0].city

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["stops"] = [dataclasses.asdict(s) for s in self.stops]
    d["ambiguous"] = list(self.ambiguous)
    if not self.hidden_city:  # the files of settings without hidden-city tasks stay as they were
      del d["hidden_city"]
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "NavTask":
    return cls(**{**d, "stops": tuple(Stop(**s) for s in d["stops"]), "ambiguous": tuple(d["ambiguous"])})


# ----------------------------------------------------------------------------- Stage 2: queries

def join_names(items: Sequence[str]) -> str:
  """"A", "A and B", "A, B and C"."""
  if len(items) <= 1:
    return "".join(items)
  return ", ".join(items[:-1]) + " and " + items[-1]


def mention(stop: Stop) -> str:
  return f"{stop.name} in {stop.city}" if stop.hinted else stop.name


# A template renders (mentions in route order, mode verb) -> query text, mentioning each stop
# exactly once. Each entry: (name, order level, minimum number of stops, render function).
_Render = Callable[[list[str], str], str]


def _seq_a(m: list[str], v: str) -> str:
  return f"How do I {v} from {m[0]} to {m[1]}" + "".join(f", then to {x}" for x in m[2:]) + "? Please keep this order."


def _seq_b(m: list[str], v: str) -> str:
  mid = "".join(f", then {x}" for x in m[1:-1])
  return f"First {m[0]}{mid}, and finally {m[-1]}. Can you plan this route for me?"


def _seq_c(m: list[str], v: str) -> str:
  return f"I want to visit these places in this order: {join_names(m)}. How should I {v}?"


def _seq_d(m: list[str], v: str) -> str:
  mid = "".join(f", after that {x}" for x in m[1:-1])
  return f"Please plan a route: start from {m[0]}{mid}, and finally {m[-1]}."


def _fixed_both_a(m: list[str], v: str) -> str:
  if len(m) == 2:
    return f"I will start at {m[0]} and end at {m[1]}. How should I {v}?"
  return f"I will start at {m[0]} and end at {m[-1]}. On the way I want to stop by {join_names(m[1:-1])}, in any order."


def _fixed_both_b(m: list[str], v: str) -> str:
  return (f"Plan a trip that starts at {m[0]} and ends at {m[-1]}, passing {join_names(m[1:-1])}. "
          f"The order of the stops in between does not matter.")


def _fixed_end_a(m: list[str], v: str) -> str:
  return f"I want to see {join_names(m[:-1])} in any order, and finish at {m[-1]}. How should I {v}?"


def _fixed_end_b(m: list[str], v: str) -> str:
  return f"My last stop must be {m[-1]}. Before that, I want to visit {join_names(m[:-1])}, any order is fine."


def _fixed_start_a(m: list[str], v: str) -> str:
  return f"Starting from {m[0]}, I want to {v} to {join_names(m[1:])} in any order."


def _fixed_start_b(m: list[str], v: str) -> str:
  return f"I am at {m[0]} now. Help me plan a route to {join_names(m[1:])}, any order is fine."


def _free_a(m: list[str], v: str) -> str:
  return f"Help me plan a route that passes {join_names(m)}, in any order."


def _free_b(m: list[str], v: str) -> str:
  return f"I want to visit {join_names(m)} today. The order does not matter, how should I {v}?"


def _free_c(m: list[str], v: str) -> str:
  return f"Can you plan a route covering {join_names(m)}? I would like to {v}."


TEMPLATES: tuple[tuple[str, int, int, _Render], ...] = (
    ("seq_a", 4, 2, _seq_a), ("seq_b", 4, 2, _seq_b), ("seq_c", 4, 2, _seq_c), ("seq_d", 4, 2, _seq_d),
    ("both_a", 3, 2, _fixed_both_a), ("both_b", 3, 3, _fixed_both_b),
    ("end_a", 2, 2, _fixed_end_a), ("end_b", 2, 2, _fixed_end_b),
    ("start_a", 1, 2, _fixed_start_a), ("start_b", 1, 2, _fixed_start_b),
    ("free_a", 0, 2, _free_a), ("free_b", 0, 2, _free_b), ("free_c", 0, 2, _free_c),
)
PREFIXES: tuple[str, ...] = ("", "Hi! ", "Hey, ", "Quick question. ")
SUFFIXES: tuple[str, ...] = ("", " Thanks!", " Could you give me a detailed route?")

_FREE_CUES = re.compile(r"any order|does not matter")
_SEQ_CUES = re.compile(r"\bthen\b|in this order|keep this order|after that|\bfinally\b")
_START_CUES = re.compile(r"\bstart(s|ing)? (at|from)\b|\bi am at\b")
_END_CUES = re.compile(r"\bends? at\b|\bfinish(es)? at\b|\blast stop\b")


def annotate_order_level(query: str) -> int:
  """The order level implied by the query's surface ordering cues alone (Stage 2).

  Sequence cues ("first ... then ...", "in this order") without a free-order cue give 4;
  otherwise a start cue and an end cue give 3, a start cue alone 1, an end cue alone 2,
  and no cue ("passes A, B and C") 0.
  """
  q = query.lower()
  if _SEQ_CUES.search(q) and not _FREE_CUES.search(q):
    return 4
  start, end = bool(_START_CUES.search(q)), bool(_END_CUES.search(q))
  if start and end:
    return 3
  if start:
    return 1
  if end:
    return 2
  return 0


def render_query(template: str, stops: Sequence[Stop], mode: str, prefix: str = "", suffix: str = "") -> str:
  """The query of ``template`` for ``stops`` (route order) and ``mode``."""
  for name, _, min_stops, fn in TEMPLATES:
    if name == template:
      if len(stops) < min_stops:
        raise ValueError(f"template {template!r} needs at least {min_stops} stops, got {len(stops)}")
      return prefix + fn([mention(s) for s in stops], words.MODE_VERBS[mode]) + suffix
  raise ValueError(f"template must be one of {[t[0] for t in TEMPLATES]}, got {template!r}")


def template_level(template: str) -> int:
  return next(level for name, level, _, _ in TEMPLATES if name == template)


# ----------------------------------------------------------------------------- Stage 3: filter

def mentioned_names(world: World, query: str) -> collections.Counter[str]:
  """How often each world POI name occurs in ``query`` as whole words (lower-case keys)."""
  text = " ".join(re.sub(r"[^a-z0-9]+", " ", query.lower()).split())
  return collections.Counter(m.group(1) for m in world.name_regex.finditer(text))


def unregioned_misses(world: World, stops: Sequence[Stop]) -> tuple[str, ...]:
  """Names of stops whose unregioned text search does not rank them first."""
  return tuple(s.name for s in stops if rank_text_search(world, s.name, None)[0].poi_id != s.poi_id)


def listed_alternative(world: World, task: NavTask) -> bool:
  """The task needs disambiguation, yet the first (unregioned) search of every ambiguous stop the
  query gives no city for already lists the right place, below a namesake in another city
  (within ``world.config.max_results``). Such a task can be solved without the re-search the
  benchmark is about, by routing through a later candidate (see docs/tiny_policy.md)."""
  amb = [s for s in task.stops if s.name in task.ambiguous and not s.hinted]
  k = world.config.max_results
  return bool(amb) and all(any(p.poi_id == s.poi_id for p in rank_text_search(world, s.name, None)[:k]) for s in amb)


def stage3_reject_reason(world: World, query: str, stops: Sequence[Stop], intended_level: int,
                         max_span_m: float) -> str | None:
  """Why a (query, reference) pair is invalid, or None if it is kept.

  Criteria (Appendix C.2.1, Stage 3): 1) "spurious": the query names a place that is
  not a stop; 2) "missing": a stop is not mentioned exactly once; 3) "implausible":
  the stops span several cities or more than ``max_span_m``; 4) "unclear": the order
  cues do not give the intended level, or two stops share a name. Added for an
  offline world: "unresolvable": an ambiguous stop, but the query gives no city hint
  and no stop has a unique name, so nothing tells the agent which city is meant.
  """
  counts = mentioned_names(world, query)
  names = {s.name.lower() for s in stops}
  if any(n not in names for n in counts):
    return "spurious"
  if any(counts.get(s.name.lower(), 0) != 1 for s in stops):
    return "missing"
  if len({s.city for s in stops}) > 1:
    return "implausible"
  for i, a in enumerate(stops):
    for b in stops[i + 1:]:
      if haversine_m(*_lonlat(a), *_lonlat(b)) > max_span_m:
        return "implausible"
  if len(names) != len(stops) or annotate_order_level(query) != intended_level:
    return "unclear"
  if any(world.is_ambiguous(s.name) for s in stops):
    if not any(s.hinted for s in stops) and all(world.is_ambiguous(s.name) for s in stops):
      return "unresolvable"
  return None


def _lonlat(stop: Stop) -> tuple[float, float]:
  lon, lat = stop.location.split(",")
  return float(lon), float(lat)


# ----------------------------------------------------------------------------- the pipeline

def stop_at(p: POI, hinted: bool) -> Stop:
  return Stop(name=p.name, city=p.city, location=p.location, poi_id=p.poi_id, hinted=hinted)


@dataclasses.dataclass
class GenerationReport:
  """Counts of the construction pipeline: candidates drawn and why each was dropped."""

  drawn: int = 0
  kept: int = 0
  rejected: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def generate_pool(world: World, num_tasks: int, rng: np.random.Generator,
                  report: GenerationReport | None = None) -> list[NavTask]:
  """``num_tasks`` valid tasks with distinct stop sets, by Stages 1-3."""
  cfg = world.config
  report = report if report is not None else GenerationReport()
  seen: set[frozenset[str]] = set()
  tasks: list[NavTask] = []
  max_draws = 50 * num_tasks + 1000
  while len(tasks) < num_tasks:
    if report.drawn >= max_draws:
      raise RuntimeError(f"generated only {len(tasks)} of num_tasks={num_tasks} after {max_draws} draws; "
                         f"rejections: {dict(report.rejected)}")
    report.drawn += 1
    # Stage 1: anchor, 50 km scenic-spot search, random subset in random order.
    anchor = world.pois[int(rng.integers(len(world.pois)))]
    hits = [p for p, _ in around(world, anchor.lon, anchor.lat, cfg.sample_radius_m, words.SCENIC_TYPE)]
    n = int(rng.integers(cfg.min_stops, cfg.max_stops + 1))
    if len(hits) < n:
      report.rejected["too_few_candidates"] += 1
      continue
    chosen = [hits[i] for i in rng.choice(len(hits), size=n, replace=False)]
    stops = [stop_at(p, bool(rng.random() < cfg.hint_prob)) for p in chosen]
    # Stage 2: query from a template of a random order level, with occasional flaws.
    mentioned = list(stops)
    if rng.random() < cfg.noise_prob:
      flaw = int(rng.integers(3))
      if flaw == 0 and len(stops) > 2:  # the query paraphrases a stop away
        mentioned.pop(int(rng.integers(len(mentioned))))
      elif flaw == 1:  # the query adds a place that is not in the reference set
        extra = world.pois[int(rng.integers(len(world.pois)))]
        mentioned.insert(int(rng.integers(len(mentioned) + 1)), stop_at(extra, False))
      else:  # the reference set holds an outlier from another city
        far = [p for p in world.pois if p.city != anchor.city and p.is_scenic]
        odd = stop_at(far[int(rng.integers(len(far)))], False)
        i = int(rng.integers(len(stops)))
        stops[i] = mentioned[i] = odd
    template, mode, query = draw_query(rng, mentioned)
    # Stage 3.
    reason = stage3_reject_reason(world, query, stops, template_level(template), 2 * cfg.sample_radius_m)
    key = frozenset(s.poi_id for s in stops)
    if reason is None and key in seen:
      reason = "duplicate"
    if reason is not None:
      report.rejected[reason] += 1
      continue
    seen.add(key)
    report.kept += 1
    tasks.append(NavTask(task_id="", query=query, order_level=annotate_order_level(query), stops=tuple(stops),
                         mode=mode, template=template, ambiguous=unregioned_misses(world, stops)))
  return tasks


def draw_query(rng: np.random.Generator, mentioned: Sequence[Stop]) -> tuple[str, str, str]:
  """(template, mode, query) of a random order level, template, mode, prefix and suffix."""
  level = int(rng.integers(0, 5))
  options = [t for t in TEMPLATES if t[1] == level and len(mentioned) >= t[2]]
  template = options[int(rng.integers(len(options)))][0]
  mode = words.MODES[int(rng.integers(len(words.MODES)))]
  prefix = PREFIXES[int(rng.integers(len(PREFIXES)))]
  suffix = SUFFIXES[int(rng.integers(len(SUFFIXES)))]
  return template, mode, render_query(template, mentioned, mode, prefix, suffix)


def hidden_count(share: float, n: int) -> int:
  """How many of a split's ``n`` tasks are hidden-city tasks: ``share * n`` rounded half up."""
  return int(math.floor(share * n + 0.5))


def build_splits(world: World, report: GenerationReport | None = None) -> dict[str, list[NavTask]]:
  """The deterministic train/test split of ``world.config`` (test drawn first, then train).

  With ``hidden_city_share > 0``, each split of n tasks holds ``hidden_count(share, n)``
  hidden-city tasks (``hidden.generate_hidden``, their own random stream; ids
  ``nav-<setting>-<split>-hidden-<i>``) and the first n - that many tasks of the split the share 0
  gives (drawn on the world without the hidden-city places, ids kept), shuffled together.
  """
  cfg = world.config
  rng = np.random.default_rng([cfg.seed, 202])
  pool = generate_pool(base_world(world), cfg.num_test + cfg.num_train, rng, report)
  splits = {"test": pool[: cfg.num_test], "train": pool[cfg.num_test:]}
  splits = {split: [dataclasses.replace(t, task_id=f"nav-{cfg.name}-{split}-{i:04d}") for i, t in enumerate(ts)]
            for split, ts in splits.items()}
  if cfg.hidden_city_share > 0:
    splits = _with_hidden(world, splits, report)
  return splits


def _with_hidden(world: World, splits: dict[str, list[NavTask]],
                 report: GenerationReport | None) -> dict[str, list[NavTask]]:
  from rti_jax.envs.navigation.hidden import generate_hidden

  cfg = world.config
  counts = {split: hidden_count(cfg.hidden_city_share, len(splits[split])) for split in ("test", "train")}
  seen = {frozenset(s.poi_id for s in t.stops) for ts in splits.values() for t in ts}
  hidden = generate_hidden(world, counts["test"] + counts["train"], np.random.default_rng([cfg.seed, 203]), seen,
                           report)
  parts = {"test": hidden[:counts["test"]], "train": hidden[counts["test"]:]}
  mix = np.random.default_rng([cfg.seed, 204])
  out = {}
  for split in ("test", "train"):
    tasks = splits[split][:len(splits[split]) - counts[split]] + [
        dataclasses.replace(t, task_id=f"nav-{cfg.name}-{split}-hidden-{i:04d}") for i, t in enumerate(parts[split])]
    out[split] = [tasks[int(i)] for i in mix.permutation(len(tasks))]
  return out


def save_tasks(tasks: Iterable[NavTask], path: str | Path) -> None:
  """Writes one JSON task per line."""
  with open(path, "w", encoding="utf-8") as f:
    for t in tasks:
      f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")


def load_tasks(path: str | Path) -> list[NavTask]:
  with open(path, encoding="utf-8") as f:
    return [NavTask.from_dict(json.loads(line)) for line in f if line.strip()]
