"""Rule-based Validator and Verifier for Navigation (App. A.1.2 hard rules, no LLM).

These are the defaults for a small policy that cannot act as a judge. They read
the same inputs as the LLM roles (``StepContext``) and return the same judgements.

Validator (reward-oriented, Sec. 4.1: flags only derailing steps), on the draft u^_k:
  * ``fabricated_coordinates``: a direction / around_search coordinate that no tool
    result (or the user) has shown;
  * ``premature_direction``: direction before every stop of the reward-side route has
    been retrieved;
  * ``redundant_search``: two identical poi_search calls in one turn;
  * ``stubborn_repeat``: a call identical to an earlier one whose result failed
    (error or nothing found);
  * ``wrong_critical_call``: a direction call with retrieved coordinates that do not
    match the reward-side route under its order level (irreversible: the last
    direction call is scored);
  * ``premature_answer``: a final answer (no calls) before any direction call that
    matches the route (ends the episode with reward 0).
  Its ``suggest_next`` is built from the evidence, as the paper's: the stops to search again
  with their reference city (else their reference coordinate), or the reference route; its
  ``visible_suggest_next`` (the feedback-only Corrector's) names only things visible to the
  policy (place names of the user query, cities shown in tool results).

Verifier (integrity, App. A.1.2), on the correction u~_k; rejects:
  * ``leak``: wording that refers to a hidden reference, supervisor or feedback;
  * ``not_derivable``: a coordinate, a region or a searched name that appears neither
    in the user question nor in the visible history (a coordinate as the tools read it:
    ``+121.5,25.0``, ``1.215e2,2.5e1``), or a privileged value in any spelling, anywhere in
    the reply or its arguments (``privileged.navigation_privileged``: the reference stops'
    coordinates, cities and names that the history has not shown; ``leaks``);
  * ``false_claim``: a statement about where a searched place was found that the visible
    search results contradict: the check line (``Check: Nanhu Lake in Wuhan.`` /
    ``Check: all in Chengdu.``, ``rti_jax.policy.check_line``) or ``Nanhu Lake was found in
    Wuhan, far from the other places in Chengdu.`` (the Verifier's second criterion, a key
    fact that follows from neither the question nor the visible history, for the facts this
    module can read off the results; ``claim_errors``);
  * ``hallucinated_tool_result``: the reply writes a tool response itself;
  * ``not_improved``: the reply itself breaks a Validator rule (checked only when the
    reply is otherwise clean).

Reward-side evidence (``Environment.reward_evidence()``) is read leniently: the route
as ``route`` / ``groundtruth`` / ``gt`` (a list of "lon,lat" stops, a dict with
origin / waypoints / destination, or a reference direction call ``{"name",
"arguments"}`` as ``envs.navigation`` gives it), ``order_level`` / ``order`` (0-4) and
the stop names as ``places`` / ``names`` or ``ref[i]["name"]``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Sequence

from rti_jax.envs.navigation.agents import search_resolution
from rti_jax.envs.navigation.world import parse_location, without_label
from rti_jax.envs.tool_calls import ToolCall, parse_assistant_turn
from rti_jax.intervention.judges import StepContext, ValidatorJudgement, VerifierJudgement
from rti_jax.intervention.leaks import LeakScanner, coordinate_pairs, leaves, numbers_in
from rti_jax.intervention.navigation_suggestions import evidence_hint, route_hint
from rti_jax.intervention.privileged import navigation_privileged
from rti_jax.policy.check_line import CHECK_PREFIX

# ASCII digits only ([0-9], not \d): the tool reads no other digits (``world.parse_location``).
_COORD_RE = re.compile(r"(?<![0-9.])(-?[0-9]{1,3}\.[0-9]+)\s*,\s*(-?[0-9]{1,2}\.[0-9]+)(?![0-9.])")
_LEAK_RE = re.compile(
  r"\b(reference|ground[\s_-]?truth|standard answer|answer key|labels?|evaluation criteria|required actions|"
  r"prior draft|previous version|calibrat\w*|supervisor|feedback|hidden (?:answer|route|solution))\b",
  re.IGNORECASE,
)
# The value runs to the next separator (the caller strips it); greedy, so one pass per match.
_FIELD_RE = {f: re.compile(rf"\b{f}\W{{1,4}}([^\W\d][^;,\"\n}}]*)") for f in ("city", "name")}
_WORD_RE = re.compile(r"[^\W_]{2,}", re.UNICODE)
_FOUND_MID, _FOUND_TAIL = " was found in ", ", far from the other places in "
_CLAUSE_END_RE = re.compile(r"[.,;:\n]")
_LETTER_RE = re.compile(r"[^\W\d]")

CoordKey = tuple[Decimal, Decimal]


def found_claims(text: str) -> list[tuple[str, str, str, str]]:
  r"""``(sentence, place, city, trip city)`` of each ``A was found in Y, far from the other places
  in Z.`` in ``text``.

  The matches of ``([^\W\d][^.,;:\n]*?) was found in ([^\W\d][^.,;:\n]*?), far from the other
  places in ([^\W\d][^.,;:\n]*?)\.`` (``finditer``), found in one pass over the clauses between
  ``.,;:`` and newlines: that regex retries every letter of a long clause (quadratic time).
  A match starts at the first letter of a clause, the place ends at the first ``was found in``
  whose city starts with a letter and runs to the clause's end, which must be the tail.
  """
  out: list[tuple[str, str, str, str]] = []
  pos, n = 0, len(text)
  while pos < n:
    stop = _CLAUSE_END_RE.search(text, pos)
    end = stop.start() if stop else n
    first = _LETTER_RE.search(text, pos, end)
    if first is not None and end < n and text.startswith(_FOUND_TAIL, end):
      trip_at = end + len(_FOUND_TAIL)
      trip_stop = _CLAUSE_END_RE.search(text, trip_at)
      if (trip_at < n and _LETTER_RE.match(text, trip_at) and trip_stop is not None
          and trip_stop.start() > trip_at and text[trip_stop.start()] == "."):
        mid = text.find(_FOUND_MID, first.start() + 1, end)
        while mid >= 0 and not _LETTER_RE.match(text, mid + len(_FOUND_MID), end):
          mid = text.find(_FOUND_MID, mid + 1, end)
        if mid >= 0:
          close = trip_stop.start()
          out.append((text[first.start():close + 1], text[first.start():mid], text[mid + len(_FOUND_MID):end],
                      text[trip_at:close]))
          pos = close + 1
          continue
    pos = end + 1
  return out


def check_item(item: str) -> tuple[str, str] | None:
  """``(place, city)`` of a check-line item ``"A in Y"``: ``re.fullmatch(r"(.+?) in ([^,]+)", item)``
  without its quadratic backtracking (the first `` in `` after the last comma splits it)."""
  comma, newline = item.rfind(","), item.find("\n")
  at = item.find(" in ", max(1, comma - 3))
  if at < 0 or at + 4 >= len(item) or 0 <= newline < at:  # "." stops at a newline, "[^,]" does not
    return None
  return item[:at], item[at + 4:]


def coord_key(text: Any) -> CoordKey | None:
  """A "lon,lat" value as exact decimals (so 121.50,25.0 == 121.5,25.00); None if not one."""
  if not isinstance(text, str):
    return None
  m = _COORD_RE.fullmatch(without_label(text).strip())  # "Name lon,lat": the label is ignored, as the tool does
  if m is None:
    return None
  try:
    return Decimal(m.group(1)).normalize(), Decimal(m.group(2)).normalize()
  except InvalidOperation:
    return None


def coords_in(text: str) -> set[CoordKey]:
  """Every "lon,lat" pair mentioned in ``text``."""
  out = set()
  for m in _COORD_RE.finditer(text or ""):
    out.add((Decimal(m.group(1)).normalize(), Decimal(m.group(2)).normalize()))
  return out


@dataclasses.dataclass(frozen=True)
class NavEvidence:
  """The reward-side route: ``stops`` (origin, waypoints..., destination), order level, names."""

  stops: tuple[CoordKey, ...]
  order_level: int
  names: tuple[str, ...] = ()


def nav_evidence(evidence: dict[str, Any]) -> NavEvidence:
  """Reads the route out of ``reward_evidence()``; raises ValueError naming what is missing."""
  raw = next((evidence[k] for k in ("route", "groundtruth", "gt", "truth") if k in evidence), None)
  if isinstance(raw, dict) and isinstance(raw.get("arguments"), dict):  # a reference direction call
    raw = raw["arguments"]
  if isinstance(raw, dict):
    wps = raw.get("waypoints") or []
    if isinstance(wps, str):
      wps = [w for w in wps.split(";") if w.strip()]
    raw = [raw.get("origin"), *wps, raw.get("destination")]
  elif raw is not None and hasattr(raw, "stops"):
    raw = list(raw.stops)
  if not isinstance(raw, (list, tuple)) or len(raw) < 2:
    raise ValueError(f"evidence: expected a route (>= 2 'lon,lat' stops) under 'route', got {raw!r}")
  stops = tuple(coord_key(s) for s in raw)
  if any(s is None for s in stops):
    raise ValueError(f"evidence['route']: expected 'lon,lat' strings, got {raw!r}")
  level = int(evidence.get("order_level", evidence.get("order", 4)))
  names = evidence.get("places", evidence.get("names", ()))
  ref = evidence.get("ref")
  if not names and isinstance(ref, list) and all(isinstance(r, dict) and "name" in r for r in ref):
    names = [r["name"] for r in ref]
  return NavEvidence(stops=stops, order_level=level, names=tuple(str(n) for n in names or ()))  # type: ignore[arg-type]


def route_matches(pred: Sequence[CoordKey], truth: Sequence[CoordKey], order_level: int) -> bool:
  """Order-level-aware route match (App. C.2.1): 0 any order, 1 origin fixed, 2 destination
  fixed, 3 both ends fixed, 4 exact sequence."""
  if len(pred) != len(truth):
    return False
  same = lambda a, b: collections.Counter(a) == collections.Counter(b)  # noqa: E731
  if order_level == 0:
    return same(pred, truth)
  if order_level == 1:
    return pred[0] == truth[0] and same(pred[1:], truth[1:])
  if order_level == 2:
    return pred[-1] == truth[-1] and same(pred[:-1], truth[:-1])
  if order_level == 3:
    return pred[0] == truth[0] and pred[-1] == truth[-1] and same(pred[1:-1], truth[1:-1])
  return list(pred) == list(truth)


def direction_stops(call: ToolCall) -> list[Any]:
  """The raw origin, waypoints..., destination of a direction call."""
  wps = call.arguments.get("waypoints") or []
  if isinstance(wps, str):
    wps = [w for w in wps.split(";") if w.strip()]
  if not isinstance(wps, list):
    wps = [wps]
  return [call.arguments.get("origin"), *wps, call.arguments.get("destination")]


@dataclasses.dataclass(frozen=True)
class _PastCall:
  call: ToolCall
  result: str


def past_calls(history: Sequence[dict[str, Any]]) -> list[_PastCall]:
  """Calls made in ``history`` paired with their tool responses (in order)."""
  out: list[_PastCall] = []
  pending: list[ToolCall] = []
  for m in history:
    role = m.get("role")
    if role == "assistant":
      out.extend(_PastCall(c, "") for c in pending)
      pending = list(parse_assistant_turn(str(m.get("content", ""))).tool_calls)
    elif role == "tool" and pending:
      out.append(_PastCall(pending.pop(0), str(m.get("content", ""))))
  out.extend(_PastCall(c, "") for c in pending)
  return out


def is_failed_result(text: str) -> bool:
  """An error observation or an empty search result."""
  t = text.strip().lower()
  if t.startswith("error") or t.startswith("found 0") or '"error"' in t:
    return True
  try:
    obj = json.loads(text)
  except (ValueError, TypeError, RecursionError):  # not JSON, an over-long integer, too deep
    return False
  if isinstance(obj, dict):
    if "pois" in obj and not obj["pois"]:
      return True
    if str(obj.get("status", "1")) == "0":
      return True
  return False


def _call_key(call: ToolCall) -> str:
  return call.name + json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)


def visible_text(ctx: StepContext) -> str:
  """User question and every non-assistant message of the history (what tools and user showed)."""
  parts = [ctx.user_query] + [str(m.get("content", "")) for m in ctx.history if m.get("role") != "assistant"]
  return "\n".join(parts)


def _offers(tools: Sequence[Any], name: str) -> bool:
  """Whether the tool schemas ``tools`` include a function called ``name``."""
  return any(isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") == name
             for t in tools)


def _field_of(text: str, coord: CoordKey, field: str) -> str | None:
  """The ``field`` ("city" or "name") written next to ``coord`` in a tool result (same
  line or JSON object), e.g. ``name Yixing Temple; city Beijing; location 116.4,39.9``."""
  pattern = _FIELD_RE[field]
  for chunk in re.split(r"\n|\},\s*\{", text):
    if coord in coords_in(chunk):
      m = pattern.search(chunk)
      if m:
        return m.group(1).strip()
  return None


def claim_errors(history: Sequence[dict[str, Any]], text: str) -> list[str]:
  """Statements of ``text`` about where searched places were found that the visible results of
  ``history`` contradict (empty when all hold, or when no search result can be read).

  Read: the check line (``Check: A in Y[, B in Y2].``: each named stop's first exact result lies
  in that city, outside the trip's city; ``Check: all in Z.``: no stop lies outside Z, the trip's
  city; ``Check: all found.``: no stop lies outside the trip's city) and the sentence ``A was
  found in Y, far from the other places in Z.``. The facts are what ``agents.search_resolution``
  reads off the history (the rule the oracle and the check line use), so a line the oracle would
  write always holds.
  """
  trip, best, off = search_resolution(list(history))
  if not best:
    return []
  lower = {name.lower(): (name, cand.city) for name, (cand, _) in best.items()}
  off_lower = {o.lower() for o in off}
  errors: list[str] = []

  visible = "\n".join(str(m.get("content", "")) for m in history if m.get("role") != "assistant").lower()

  def check_off(name: str, city: str, what: str) -> None:
    key = name.strip().lower()
    if key not in lower:
      if key not in visible and not any(n in key for n in lower):  # a place neither the request nor a result names
        errors.append(f"{what} names {name.strip()!r}, which neither the request nor the results show")
      # else: worded otherwise than a searched address ("the Nanhu Lake"); not judged
    elif lower[key][1] != city.strip() or key not in off_lower:
      errors.append(f"{what} says {name.strip()} lies in {city.strip()} apart from the trip, but the results show "
                    f"{lower[key][0]} in {lower[key][1]}" + ("" if key in off_lower else " with the other places"))

  for line in text.splitlines():
    line = line.strip()
    if not line.startswith(CHECK_PREFIX) or not line.endswith("."):
      continue
    body = line[len(CHECK_PREFIX):-1].strip()
    what = f"the line {line!r}"
    if body == "all found" or body.startswith("all in "):
      if off:
        errors.append(f"{what} says all places fit, but the results show {', '.join(off)} outside {trip}")
      elif body != "all found" and trip is not None and body[len("all in "):].strip() != trip:
        errors.append(f"{what} names the trip's city wrongly: the results put it in {trip}")
      continue
    for item in body.split(", "):
      parts = check_item(item)
      if parts is None:
        errors.append(f"{what} cannot be read as 'place in city'")
      else:
        check_off(parts[0], parts[1], what)
  for sentence, place, city, trip_city in found_claims(text):
    what = f"the sentence {sentence!r}"
    check_off(place, city, what)
    if trip is not None and trip_city.strip() != trip:
      errors.append(f"{what} puts the other places in {trip_city.strip()}, but the results put them in {trip}")
  return errors


class NavigationRuleValidator:
  """Rule-based Validator (see module docstring)."""

  def validate(self, ctxs: Sequence[StepContext]) -> list[ValidatorJudgement]:
    return [self.judge(c) for c in ctxs]

  def judge(self, ctx: StepContext) -> ValidatorJudgement:
    ev = nav_evidence(ctx.evidence)
    turn = parse_assistant_turn(ctx.draft)
    seen_text = visible_text(ctx)
    seen = coords_in(seen_text)
    history = past_calls(ctx.history)
    # The user can be asked (hidden-city tasks) and has not been yet: the honest way to a city.
    ask = _offers(ctx.tools, "ask_user") and not any(p.call.name == "ask_user" for p in history)
    errors: list[tuple[str, str, str, str]] = []  # (type, diagnosis, visible suggestion, suggestion from l)

    for call in turn.tool_calls:
      raw = direction_stops(call) if call.name == "direction" else (
        [call.arguments.get("location")] if call.name == "around_search" else [])
      fabricated = [r for r in raw if coord_key(r) is not None and coord_key(r) not in seen]
      if fabricated:
        hint = "Use only coordinates returned by earlier tool calls."
        errors.append(("fabricated_coordinates", f"{call.name} uses coordinates {fabricated} that no tool result has shown.",
                       hint, hint))

    seen_keys = {_call_key(c) for c in turn.tool_calls}
    if len(seen_keys) < len(turn.tool_calls) and any(c.name == "poi_search" for c in turn.tool_calls):
      counts = collections.Counter(_call_key(c) for c in turn.tool_calls if c.name == "poi_search")
      if any(v > 1 for v in counts.values()):
        errors.append(("redundant_search", "The turn repeats an identical poi_search call.",
                       "Search each place once per turn.", "Search each place once per turn."))

    failed = {_call_key(p.call) for p in history if p.result and is_failed_result(p.result)}
    repeats = [c for c in turn.tool_calls if _call_key(c) in failed]
    if repeats:
      hint = "Change the arguments (another name form, or a region) instead of repeating a failed call."
      errors.append(("stubborn_repeat", f"{repeats[0].name} is repeated with the same arguments that already failed.",
                     hint, hint))

    directions = [c for c in turn.tool_calls if c.name == "direction"]
    missing = [i for i, s in enumerate(ev.stops) if s not in seen]
    if directions and missing:
      errors.append(("premature_direction",
                     f"direction is called but {len(missing)} stop(s) of the request have no matching search result yet.",
                     self._search_hint(ev, missing, seen_text, ask), evidence_hint(ctx.evidence, ev, missing)))
    elif directions:
      last = directions[-1]
      keys = [coord_key(r) for r in direction_stops(last)]
      if all(k is not None and k in seen for k in keys) and not route_matches(keys, ev.stops, ev.order_level):  # type: ignore[arg-type]
        wrong = [k for k in keys if k not in set(ev.stops)]
        names = [n for n in (_field_of(seen_text, k, "name") for k in wrong) if n]
        if names:
          hint = self._region_hint(ev, names, seen_text, wrong, ask)
          truth = evidence_hint(ctx.evidence, ev, [i for i, s in enumerate(ev.stops) if s not in set(keys)])
        elif len(keys) != len(ev.stops):
          hint, truth = "Include every place the user asked for, each once, before calling direction.", route_hint(ev)
        else:
          hint, truth = "Keep the visiting order the user asked for when calling direction.", route_hint(ev)
        errors.append(("wrong_critical_call",
                       "The direction call's stops do not form the requested route (wrong place, count or order).", hint,
                       truth))

    if not turn.tool_calls and not turn.errors:
      done = any(
        p.call.name == "direction"
        and all(coord_key(r) is not None for r in direction_stops(p.call))
        and route_matches([coord_key(r) for r in direction_stops(p.call)], ev.stops, ev.order_level)  # type: ignore[misc]
        for p in history
      )
      if not done:
        hint = self._search_hint(ev, missing, seen_text, ask) if missing else (
          "Call direction with the coordinates of all places in the requested order.")
        truth = evidence_hint(ctx.evidence, ev, missing) if missing else route_hint(ev)
        errors.append(("premature_answer", "The reply ends the task before a correct route has been planned.", hint, truth))

    if not errors:
      return ValidatorJudgement(is_valid=True, diagnosis="No hard rule is violated.")
    return ValidatorJudgement(
      is_valid=False,
      error_types=tuple(e[0] for e in errors),
      diagnosis=" ".join(e[1] for e in errors),
      suggest_next=errors[0][3],
      visible_suggest_next=errors[0][2],
    )

  @classmethod
  def _search_hint(cls, ev: NavEvidence, missing: Sequence[int], seen_text: str, ask: bool = False) -> str:
    """A visible-only hint for stops whose right coordinates were not shown yet."""
    names = [ev.names[i] for i in missing if i < len(ev.names)]
    return cls._region_hint(ev, names, seen_text, [ev.stops[i] for i in missing], ask)

  @staticmethod
  def _region_hint(ev: NavEvidence, names: Sequence[str], seen_text: str, bad: Sequence[CoordKey],
                   ask: bool = False) -> str:
    """Which requested places to search again, and the city the correctly resolved stops
    are in (read from the tool results, so the hint holds only visible information). ask: no
    result shows a city and the user can be asked (``ask_user``): the hint says to ask."""
    good = [s for s in ev.stops if s not in set(bad)]
    cities = collections.Counter(c for c in (_field_of(seen_text, s, "city") for s in good) if c)
    if ask and not cities and names:
      listed = ", ".join(repr(n) for n in dict.fromkeys(names))
      return f"Ask the user (ask_user) which city {listed} are in, then search them with that region."
    where = f" with region {cities.most_common(1)[0][0]}" if cities else " with a region that fits the other stops"
    if names:
      return f"Search {', '.join(repr(n) for n in dict.fromkeys(names))} again{where} before calling direction."
    return f"Resolve the remaining places with poi_search{where} before calling direction."


class NavigationRuleVerifier:
  """Rule-based Verifier (see module docstring).

  check_rules: also reject a correction that itself breaks a Validator hard rule
    (``not_improved``: it is not consistent with the gold requirement, Sec. 4.1 (i)).
  """

  def __init__(self, check_rules: bool = True) -> None:
    self.check_rules = check_rules

  def verify(self, ctxs: Sequence[StepContext], corrected: Sequence[str]) -> list[VerifierJudgement]:
    return [self.judge(c, u) for c, u in zip(ctxs, corrected)]

  def judge(self, ctx: StepContext, corrected: str) -> VerifierJudgement:
    reasons: list[str] = []
    notes: list[str] = []
    m = _LEAK_RE.search(corrected)
    if m:
      reasons.append("leak")
      notes.append(f"mentions {m.group(0)!r}, which is not part of the visible conversation.")
    if "<tool_response>" in corrected:
      reasons.append("hallucinated_tool_result")
      notes.append("writes a tool response itself.")
    seen_text = visible_text(ctx)
    seen = coords_in(seen_text) | coordinate_pairs(seen_text)
    low = seen_text.lower()
    unseen = coordinate_pairs(corrected) - seen
    bad: list[str] = [f"coordinate {c}" for c in sorted(f"{a},{b}" for a, b in unseen)]
    turn = parse_assistant_turn(corrected)
    for _, leaf in leaves([c.arguments for c in turn.tool_calls]):  # coordinates as the tools read them
      for piece in leaf.split(";") if isinstance(leaf, str) else ():
        loc = parse_location(piece)
        if loc is not None and (key := (loc[0].normalize(), loc[1].normalize())) not in seen | unseen:
          unseen.add(key)
          bad.append(f"coordinate {piece.strip()!r}")
    tools = json.dumps(list(ctx.tools), default=str)
    privileged = navigation_privileged(ctx.evidence).minus_visible([seen_text, tools])
    scanner = LeakScanner(privileged, (v for v, _ in numbers_in(seen_text)))
    bad += [f"{leak}" for leak in scanner.scan(corrected, [c.arguments for c in turn.tool_calls])]
    for call in turn.tool_calls:
      region = call.arguments.get("region")
      if isinstance(region, str) and region.strip() and region.strip().lower() not in low:
        bad.append(f"region {region!r}")
      if call.name == "poi_search":
        words = _WORD_RE.findall(str(call.arguments.get("address", "")).lower())
        if words and sum(w in low for w in words) * 2 < len(words):
          bad.append(f"place {call.arguments.get('address')!r}")
    if bad:
      reasons.append("not_derivable")
      notes.append("uses " + ", ".join(bad) + " that neither the user question nor the history shows.")
    false = claim_errors(ctx.history, corrected)
    if false:
      reasons.append("false_claim")
      notes.append("; ".join(false) + ".")
    if self.check_rules and not reasons:
      still = NavigationRuleValidator().judge(dataclasses.replace(ctx, draft=corrected))
      if not still.is_valid:
        reasons.append("not_improved")
        notes.append(f"the reply still breaks a hard rule ({', '.join(still.error_types)}).")
    if reasons:
      return VerifierJudgement(ok=False, reasons=tuple(dict.fromkeys(reasons)), diagnosis=" ".join(notes))
    return VerifierJudgement(ok=True, diagnosis="Derivable from the visible history; no leak.")
