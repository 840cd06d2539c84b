"""Navigation's LLM-role prompts: the evidence l (reference stops, order level, ground-truth route)
in the route-planning templates ``intervention/prompts/navigation_*.txt``."""

from __future__ import annotations

import json
from typing import Any

from rti_jax.intervention.prompting import JudgePrompts, _as_str, _feedback_json, history_json, render, tools_json


def _reference(evidence: dict[str, Any]) -> dict[str, str]:
  return {
    "order": _as_str(evidence.get("order_level", evidence.get("order", ""))),
    "ref": _as_str(evidence.get("ref", evidence.get("places", ""))),
    "gt": _as_str(evidence.get("groundtruth", evidence.get("route", evidence.get("gt", "")))),
  }


class NavigationPrompts(JudgePrompts):
  """The route-planning reviewer, editor and checker of App. A.1."""

  def validator(self, ctx: Any) -> str:
    return render("navigation_validator", history_json=history_json(ctx.history), response_text=ctx.draft,
                  **_reference(ctx.evidence))

  def corrector(self, ctx: Any, judgement: Any) -> str:
    return render("navigation_corrector", history=history_json(ctx.history), tools=tools_json(ctx.tools),
                  original_response=ctx.draft, feedback_json=_feedback_json(judgement), **_reference(ctx.evidence))

  def verifier(self, ctx: Any, corrected: str) -> str:
    return render("navigation_verifier", user_prompt=ctx.user_query, tools=tools_json(ctx.tools),
                  history=history_json(ctx.history), original=ctx.draft, corrected=corrected)

  def correction_evidence(self, ctx: Any) -> str:
    ev = ctx.evidence
    notes = {"stops": ev.get("ref", ev.get("places", [])), "order_level": ev.get("order_level", ev.get("order", "")),
             "route": ev.get("groundtruth", ev.get("route", ev.get("gt", "")))}
    if "order_rule" in ev:
      notes["order_rule"] = ev["order_rule"]
    return json.dumps(notes, ensure_ascii=False, indent=1, default=str)
