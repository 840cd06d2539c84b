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

from rti_jax.envs import registry

if TYPE_CHECKING:
  from rti_jax.intervention.judges import StepContext, ValidatorJudgement

Message = dict[str, Any]


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


def history_json(history: Sequence[Message]) -> str:
  """The observable history as a JSON list of ``{role, content}``."""
  return json.dumps([{"role": m.get("role"), "content": m.get("content")} for m in history], ensure_ascii=False, indent=1)


def tools_json(tools: Sequence[dict[str, Any]]) -> str:
  return json.dumps(list(tools), ensure_ascii=False)


def _feedback_json(judgement: ValidatorJudgement) -> str:
  return json.dumps(
    {"error_types": list(judgement.error_types), "diagnosis": judgement.diagnosis, "suggest_next": judgement.suggest_next},
    ensure_ascii=False,
  )


class JudgePrompts:
  """How an environment's evidence l enters the LLM roles' prompts (App. A.1's inputs).

  This base class is the generic form, for any tool-use environment: its templates
  (``prompts/generic_*.txt``) show l as JSON (``evidence_text``). An environment registers a
  subclass (``EnvSpec.prompts``) to render l in its own terms or to use its own templates.
  """

  def evidence_text(self, ctx: StepContext) -> str:
    """The evidence l as the roles read it."""
    return json.dumps(ctx.evidence, ensure_ascii=False, indent=1, default=str)

  def validator(self, ctx: StepContext) -> str:
    return render("generic_validator", history_json=history_json(ctx.history), response_text=ctx.draft,
                  evidence=self.evidence_text(ctx))

  def corrector(self, ctx: StepContext, judgement: ValidatorJudgement) -> str:
    return render("generic_corrector", history=history_json(ctx.history), tools=tools_json(ctx.tools),
                  original_response=ctx.draft, feedback_json=_feedback_json(judgement), evidence=self.evidence_text(ctx))

  def verifier(self, ctx: StepContext, corrected: str) -> str:
    return render("generic_verifier", user_prompt=ctx.user_query, tools=tools_json(ctx.tools),
                  history=history_json(ctx.history), original=ctx.draft, corrected=corrected,
                  evidence=self.evidence_text(ctx))

  def correction_evidence(self, ctx: StepContext) -> str:
    """l in the paper Corrector's correction message (``paper_correction_message``)."""
    return self.evidence_text(ctx)

  def policy_corrector_rule(self, ctx: StepContext) -> str:
    """An environment's own extra rule for the policy as Corrector ("" = none)."""
    return ""


class ServiceAgentPrompts(JudgePrompts):
  """The customer-service agent's prompts (tau2's domains): l as the actions the task still needs,
  the agent's own and the user's, and the task's evaluation criteria; ``rules`` names a template
  ``prompts/<rules>.txt`` with the domain's own rule per role (sections ``### validator``,
  ``### corrector``, ``### policy_corrector``), None for none."""

  def __init__(self, rules: str | None = None) -> None:
    self.rules = rules

  def _rule(self, role: str, evidence: dict[str, Any]) -> str:
    if self.rules is None:
      return ""
    text = load_template(self.rules).template
    sections = dict(re.findall(r"^### (\w+)\n(.*?)(?=^### |\Z)", text, re.DOTALL | re.MULTILINE))
    block = sections.get(role, "").strip()
    return string.Template(block).safe_substitute(
      user_side_tools=json.dumps(list(evidence.get("user_side_tools", [])), ensure_ascii=False),
      agent_side_tools=json.dumps(list(evidence.get("agent_side_tools", [])), ensure_ascii=False),
    )

  @staticmethod
  def _reference(evidence: dict[str, Any]) -> dict[str, str]:
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

  def validator(self, ctx: StepContext) -> str:
    return render(
      "tau2_validator",
      history_json=history_json(ctx.history),
      response_text=json.dumps({"response": ctx.draft}, ensure_ascii=False),
      domain_rule=self._rule("validator", ctx.evidence) or "(no domain-specific rule)",
      **self._reference(ctx.evidence),
    )

  def corrector(self, ctx: StepContext, judgement: ValidatorJudgement) -> str:
    return render("tau2_corrector", history=history_json(ctx.history), tools=tools_json(ctx.tools),
                  original_response=ctx.draft, feedback_json=_feedback_json(judgement),
                  evaluation_criteria=self._reference(ctx.evidence)["evaluation_criteria"],
                  domain_rule=self._rule("corrector", ctx.evidence))

  def verifier(self, ctx: StepContext, corrected: str) -> str:
    return render("tau2_verifier", user_prompt=ctx.user_query, tools=tools_json(ctx.tools),
                  history=history_json(ctx.history), original=ctx.draft, corrected=corrected,
                  evaluation_criteria=self._reference(ctx.evidence)["evaluation_criteria"])

  def correction_evidence(self, ctx: StepContext) -> str:
    ev = ctx.evidence
    return json.dumps({"goal": ev.get("completion_note", ""), "agent_actions": ev.get("agent_actions", []),
                       "user_actions": ev.get("user_actions", []),
                       "evaluation_criteria": ev.get("evaluation_criteria", {})}, ensure_ascii=False, indent=1, default=str)

  def policy_corrector_rule(self, ctx: StepContext) -> str:
    return self._rule("policy_corrector", ctx.evidence)


GENERIC = JudgePrompts()


def prompts_for(domain: str) -> JudgePrompts:
  """The registered ``JudgePrompts`` of environment ``domain`` (the generic ones when it registers
  none); an unknown name is a ``ValueError`` listing the registered ones."""
  prompts = registry.prompts_for(domain)
  return GENERIC if prompts is None else prompts


def validator_prompt(ctx: StepContext) -> str:
  """The Validator prompt (App. A.1) of ``ctx.domain``."""
  return prompts_for(ctx.domain).validator(ctx)


def corrector_prompt(ctx: StepContext, judgement: ValidatorJudgement) -> str:
  """The Corrector prompt (App. A.1: history, tools, evidence, prior draft, feedback)."""
  return prompts_for(ctx.domain).corrector(ctx, judgement)


def verifier_prompt(ctx: StepContext, corrected: str) -> str:
  """The Verifier prompt (App. A.1: visible info, prior draft, calibrated reply)."""
  return prompts_for(ctx.domain).verifier(ctx, corrected)


def feedback_message(judgement: ValidatorJudgement) -> str:
  """The feedback-only correction message: the Validator's diagnosis and its visible-only
  suggestion (``ValidatorJudgement.feedback_suggestion``), no evidence."""
  return render("correction_feedback", diagnosis=judgement.diagnosis or "-",
                suggest_next=judgement.feedback_suggestion or "-")


def paper_correction_message(ctx: StepContext, judgement: ValidatorJudgement) -> str:
  """The paper's correction message (App. A.1 Corrector): the draft u^_k, the Validator's
  diagnosis and ``suggest_next`` (built from l), the evidence l and the rule to conceal it.

  It is appended to the rollout prompt as one user message (``ChatFormatter.with_extra_user_message``),
  so the correction prompt p_cal holds the observable history and the tool schemas as the policy
  sees them in p_roll, and the policy answers in its own turn format (Eq. 5 scores u~_k there).
  """
  prompts = prompts_for(ctx.domain)
  return render(
    "paper_correction",
    draft=ctx.draft or "-",
    diagnosis=judgement.diagnosis or "-",
    suggest_next=judgement.suggest_next or "-",
    evidence=prompts.correction_evidence(ctx),
    domain_rule=prompts.policy_corrector_rule(ctx),
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
