"""The Navigation rule Validator's ``suggest_next`` as the paper's Validator writes it: built from
the reward-side evidence l, so it may name what the policy has not seen (the city a stop really
lies in, its coordinates, the reference route). Only the paper's Corrector reads it, told to
conceal it; the feedback-only Corrector gets the visible-only hint instead
(``NavigationRuleValidator``'s ``visible_suggest_next``)."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
  from rti_jax.intervention.rules_navigation import NavEvidence


def _decimal(d: Decimal) -> str:
  return format(d, "f")


def evidence_hint(evidence: dict[str, Any], ev: NavEvidence, stops: Sequence[int]) -> str:
  """The paper's ``suggest_next`` for stops not resolved yet, read from the evidence l: each one
  to search again with its reference city (``ref[i]["city"]`` or ``cities[i]``), else with its
  reference coordinate. Privileged: the Corrector that reads it must conceal it."""
  ref = evidence.get("ref")
  cities = ([str(r.get("city") or "") if isinstance(r, dict) else "" for r in ref] if isinstance(ref, list)
            else [str(c or "") for c in evidence.get("cities") or ()])
  items = []
  for i in stops:
    name = repr(ev.names[i]) if i < len(ev.names) else f"stop {i + 1}"
    city = cities[i] if i < len(cities) else ""
    lon, lat = ev.stops[i]
    items.append(f"{name} again with region {city}" if city else f"{name} again (it lies at {_decimal(lon)},{_decimal(lat)})")
  return f"Search {', '.join(items)} before calling direction." if items else route_hint(ev)


def route_hint(ev: NavEvidence) -> str:
  """The reference route of the evidence l as a next step (privileged)."""
  stops = [f"{repr(ev.names[i]) + ' at ' if i < len(ev.names) else ''}{_decimal(s[0])},{_decimal(s[1])}"
           for i, s in enumerate(ev.stops)]
  return "Call direction through " + "; ".join(stops) + (" in this order." if ev.order_level else ".")
