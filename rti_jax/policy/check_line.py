"""The check line: the tiny Navigation policy's own statement of what the first search results show.

A policy built with ``data.check_line=true`` (``configs/sft_navigation.yaml``; its ``build.json``
records ``"check_line": true``) starts its turn after the first search results with one line::

    Check: Nanhu Lake in Wuhan.        (a stop whose first exact result lies outside the trip's city)
    Check: all in Chengdu.             (no such stop)

The line names exactly the stops ``OracleAgent`` re-searches (``agents.search_resolution``) and
states nothing else, so the Verifier's rules pass a correction that writes it. It makes the
comparison that tells an ambiguous result from a plain one a hard-labelled output of the policy,
and so gives the re-search decision RL must learn a local cue (docs/tiny_policy.md, "A check line
before the decision"). The environment neither needs nor checks it.

* ``check_line`` / ``check_text``: the line for a conversation.
* ``CheckedAgent``: a scripted agent whose episodes carry the line (the SFT data's format).
* ``check_line_length``: the line's tokens at the start of an encoded turn.
* ``policy_check_line``: whether a policy directory's format writes the line.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from rti_jax.envs.navigation.agents import PLAN_NOW, Candidate, search_resolution

CHECK_PREFIX = "Check: "
#: The sentence of an agent that plans the route although the line names an off stop.
TRUST_FIRST = "Now I plan the route with the first results."


def check_line(messages: list[dict[str, Any]]) -> str | None:
  """The line for the turn after the first search results of ``messages``: ``Check: Nanhu Lake
  in Wuhan.`` (each stop whose unregioned first exact result lies outside the trip's city, with
  that result's city) or ``Check: all in Chengdu.`` (``all found.`` when no city is known); None
  before any search result. A policy may still trust the off result after writing it
  (``CheckedAgent`` over ``TrustingAgent``), so the decision to re-search stays the policy's to
  learn."""
  return check_text(*search_resolution(messages))


def check_text(trip: str | None, best: dict[str, tuple[Candidate, bool]], off: list[str]) -> str | None:
  """The line from ``agents.search_resolution``'s (trip city, best result per address, off addresses)."""
  if not best:
    return None
  if off:
    return CHECK_PREFIX + ", ".join(f"{name} in {best[name][0].city}" for name in off) + "."
  return CHECK_PREFIX + (f"all in {trip}." if trip is not None else "all found.")


class CheckedAgent:
  """``agent`` whose turn right after the first search results starts with :func:`check_line`
  (on its own line); every other turn, and every tool call, is the wrapped agent's.

  When the line names an off stop and the agent plans the route anyway (``TrustingAgent``,
  ``NaiveAgent``), its sentence is ``TRUST_FIRST`` instead of ``PLAN_NOW``. So the first word
  after the line differs between the two contexts in which the base policy plans at once (after
  an off result: ``Now``; after plain results: ``I``), and the policy must carry the line's
  verdict to the decision position: with one shared word there, a push toward a re-search after
  ambiguous results moves the plain context as much (docs/tiny_policy.md).
  """

  def __init__(self, agent: Any):
    self.agent = agent
    self.task = agent.task

  def act(self, messages: list[dict[str, Any]]) -> str:
    text = self.agent.act(messages)
    if sum(m["role"] == "assistant" for m in messages) == 1 and messages[-1]["role"] == "tool":
      trip, best, off = search_resolution(messages)
      line = check_text(trip, best, off)
      if line is not None:
        if off and text.startswith(PLAN_NOW):
          text = TRUST_FIRST + text[len(PLAN_NOW):]
        return f"{line}\n{text}"
    return text


def check_line_length(tokenizer: Any, ids: Sequence[int], start: int, turn_text: str) -> int:
  """The number of tokens of the check line that starts ``turn_text``, encoded at ``ids[start:]``
  (the line and its newline); raises ValueError when the turn does not start with a check line
  that tokenizes as a prefix of the turn."""
  line = turn_text.split("\n", 1)[0] + "\n"
  line_ids = tokenizer.encode(line, add_special_tokens=False)
  if not line.startswith(CHECK_PREFIX) or list(ids[start:start + len(line_ids)]) != line_ids:
    raise ValueError(f"the turn {turn_text[:40]!r} does not start with a check line that tokenizes as its prefix")
  return len(line_ids)


def policy_check_line(path: str | os.PathLike) -> bool:
  """Whether the policy in ``path`` writes the check line after the first search results, as its
  build recorded in ``build.json`` (``"check_line"``); False for a policy dir without one (a
  policy built without the line, or any other checkpoint)."""
  meta = os.path.join(os.fspath(path), "build.json")
  if not os.path.exists(meta):
    return False
  try:
    with open(meta) as f:
      return bool(json.load(f).get("check_line", False))
  except (OSError, ValueError, AttributeError) as e:
    raise ValueError(f"{meta}: expected a JSON object with a boolean 'check_line' ({e})") from e
