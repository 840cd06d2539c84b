"""The LLM roles' prompts: the templates in ``prompts/`` (the inputs, rules and JSON output of
App. A.1, in the project's own words) rendered for one step (``StepContext``), and the correction
messages that turn the rollout prompt p_roll into the correction prompt p_cal (``correction_message``:
the feedback-only one, or the paper Corrector's)."""

from __future__ import annotations

import functools
import json
import re
import string
from importlib import resources
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
  from rti_jax.intervention.judges import StepContext, ValidatorJudgement

Message = dict[str, Any]

DOMAINS = ("navigation", "telecom", "retail", "airline")

def _as_str(value: Any) -> str:
  if value is None:
    return ""
  return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)



# --- templates -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def load_template(name: str) -> string.Template:
  """A prompt template from ``prompts/<name>.txt`` (``$placeholders``)."""
  path = resources.files("rti_jax.intervention") / "prompts" / f"{name}.txt"
  if not path.is_file():
    raise FileNotFoundError(f"name: no prompt template {name!r} at {path}")
  return string.Template(path.read_text(encoding="utf-8"))


def render(name: str, **values: Any) -> str:
  """Renders template ``name``; a missing placeholder value raises ``KeyError`` naming it."""
  tpl = load_template(name)
  try:
    return tpl.substitute({k: _as_str(v) for k, v in values.items()})
  except KeyError as e:
    raise KeyError(f"template {name!r}: no value for placeholder {e.args[0]!r}") from None


def _domain_block(domain: str, role: str, evidence: dict[str, Any]) -> str:
  if domain == "navigation":
    return ""
  text = load_template(f"tau2_domain_{domain}").template
  sections = dict(re.findall(r"^### (\w+)\n(.*?)(?=^### |\Z)", text, re.DOTALL | re.MULTILINE))
  block = sections.get(role, "").strip()
  return string.Template(block).safe_substitute(
    user_side_tools=json.dumps(list(evidence.get("user_side_tools", [])), ensure_ascii=False),
    agent_side_tools=json.dumps(list(evidence.get("agent_side_tools", [])), ensure_ascii=False),
  )


def history_json(history: Sequence[Message]) -> str:
  """The observable history as a JSON list of ``{role, content}``."""
  return json.dumps([{"role": m.get("role"), "content": m.get("content")} for m in history], ensure_ascii=False, indent=1)


def tools_json(tools: Sequence[dict[str, Any]]) -> str:
  return json.dumps(list(tools), ensure_ascii=False)


def _nav_reference(evidence: dict[str, Any]) -> dict[str, str]:
  return {
    "order": _as_str(evidence.get("order_level", evidence.get("order", ""))),
    "ref": _as_str(evidence.get("ref", evidence.get("places", ""))),
    "gt": _as_str(evidence.get("groundtruth", evidence.get("route", evidence.get("gt", "")))),
  }


def _tau2_reference(evidence: dict[str, Any]) -> dict[str, str]:
  user_actions = evidence.get("user_actions")
  block = ""
  if user_actions:
    block = "User-side actions (the agent must guide the user to perform these on their device):\n" + _as_str(user_actions)
  return {
    "completion_note": _as_str(evidence.get("completion_note", "every required action is done")),
    "agent_actions": _as_str(evidence.get("agent_actions", evidence.get("actions", []))),
    "user_actions_block": block,
    "evaluation_criteria": _as_str(evidence.get("evaluation_criteria", evidence)),
  }


def validator_prompt(ctx: StepContext) -> str:
  """The Validator prompt (App. A.1) for ``ctx.domain``."""
  if ctx.domain == "navigation":
    return render(
      "navigation_validator", history_json=history_json(ctx.history), response_text=ctx.draft, **_nav_reference(ctx.evidence)
    )
  _check_domain(ctx.domain)
  return render(
    "tau2_validator",
    history_json=history_json(ctx.history),
    response_text=json.dumps({"response": ctx.draft}, ensure_ascii=False),
    domain_rule=_domain_block(ctx.domain, "validator", ctx.evidence) or "(no domain-specific rule)",
    **_tau2_reference(ctx.evidence),
  )


def corrector_prompt(ctx: StepContext, judgement: ValidatorJudgement) -> str:
  """The Corrector prompt (App. A.1: history, tools, evidence, prior draft, feedback)."""
  feedback = json.dumps(
    {"error_types": list(judgement.error_types), "diagnosis": judgement.diagnosis, "suggest_next": judgement.suggest_next},
    ensure_ascii=False,
  )
  common = dict(history=history_json(ctx.history), tools=tools_json(ctx.tools), original_response=ctx.draft, feedback_json=feedback)
  if ctx.domain == "navigation":
    return render("navigation_corrector", **common, **_nav_reference(ctx.evidence))
  _check_domain(ctx.domain)
  ref = _tau2_reference(ctx.evidence)
  return render(
    "tau2_corrector",
    **common,
    evaluation_criteria=ref["evaluation_criteria"],
    domain_rule=_domain_block(ctx.domain, "corrector", ctx.evidence),
  )


def verifier_prompt(ctx: StepContext, corrected: str) -> str:
  """The Verifier prompt (App. A.1: visible info, prior draft, calibrated reply)."""
  common = dict(
    user_prompt=ctx.user_query, tools=tools_json(ctx.tools), history=history_json(ctx.history), original=ctx.draft, corrected=corrected
  )
  if ctx.domain == "navigation":
    return render("navigation_verifier", **common)
  _check_domain(ctx.domain)
  return render("tau2_verifier", **common, evaluation_criteria=_tau2_reference(ctx.evidence)["evaluation_criteria"])


def feedback_message(judgement: ValidatorJudgement) -> str:
  """The feedback-only correction message: the Validator's diagnosis and its visible-only
  suggestion (``ValidatorJudgement.feedback_suggestion``), no evidence."""
  return render("correction_feedback", diagnosis=judgement.diagnosis or "-",
                suggest_next=judgement.feedback_suggestion or "-")


def _correction_evidence(ctx: StepContext) -> str:
  """The reward-side evidence l as the paper's Corrector reads it (App. A.1): Navigation's
  reference stops, order level and reference call; tau2's required actions and criteria."""
  ev = ctx.evidence
  if ctx.domain == "navigation":
    notes = {"stops": ev.get("ref", ev.get("places", [])), "order_level": ev.get("order_level", ev.get("order", "")),
             "route": ev.get("groundtruth", ev.get("route", ev.get("gt", "")))}
    if "order_rule" in ev:
      notes["order_rule"] = ev["order_rule"]
    return json.dumps(notes, ensure_ascii=False, indent=1, default=str)
  _check_domain(ctx.domain)
  return json.dumps({"goal": ev.get("completion_note", ""), "agent_actions": ev.get("agent_actions", []),
                     "user_actions": ev.get("user_actions", []),
                     "evaluation_criteria": ev.get("evaluation_criteria", {})}, ensure_ascii=False, indent=1, default=str)


def paper_correction_message(ctx: StepContext, judgement: ValidatorJudgement) -> str:
  """The paper's correction message (App. A.1 Corrector): the draft u^_k, the Validator's
  diagnosis and ``suggest_next`` (built from l), the evidence l and the rule to conceal it.

  It is appended to the rollout prompt as one user message (``ChatFormatter.with_extra_user_message``),
  so the correction prompt p_cal holds the observable history and the tool schemas as the policy
  sees them in p_roll, and the policy answers in its own turn format (Eq. 5 scores u~_k there).
  """
  return render(
    "paper_correction",
    draft=ctx.draft or "-",
    diagnosis=judgement.diagnosis or "-",
    suggest_next=judgement.suggest_next or "-",
    evidence=_correction_evidence(ctx),
    domain_rule=_domain_block(ctx.domain, "policy_corrector", ctx.evidence),
  )


#: The Corrector variants (``InterventionConfig.corrector``) and the correction message each appends to p_roll.
CORRECTORS = ("feedback", "paper")


def correction_message(kind: str, ctx: StepContext, judgement: ValidatorJudgement) -> str:
  """The user message that turns the rollout prompt p_roll into the correction prompt p_cal:
  ``feedback`` (diagnosis and visible-only suggestion) or ``paper`` (App. A.1's Corrector inputs)."""
  if kind == "feedback":
    return feedback_message(judgement)
  if kind == "paper":
    return paper_correction_message(ctx, judgement)
  raise ValueError(f"corrector: expected one of {CORRECTORS}, got {kind!r}")


def _check_domain(domain: str) -> None:
  if domain not in DOMAINS:
    raise ValueError(f"domain: expected one of {DOMAINS}, got {domain!r}")
