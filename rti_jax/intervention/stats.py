"""Per-iteration intervention statistics, as in the paper's Table 6 (App. D.3).

One ``InterventionStats`` is filled by the pipeline per training iteration;
``table()`` gives the Table-6 rows as ``(statistic, count, denominator, ratio)``
and ``as_dict()`` a flat dict for JSONL metrics.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass
class InterventionStats:
  """Counters of one iteration (all ints unless noted).

  groups_total / groups_triggered: rollout groups, and those whose whole group failed.
  steps_total: steps of intervened rollouts; steps_flagged: flagged invalid by the Validator.
  corrections_generated: Corrector outputs that were usable (the rest: ``corrector_malformed``,
    or ``corrections_unchanged`` when identical to the draft); ``corrections_over_context``:
    flagged steps whose correction prompt, or whose correction, does not fit the context
    budget (draft kept).
  verifier_accepted / verifier_rejected: Verifier verdicts (``verifier_skipped`` when it is off).
  ppl_rejected: corrections the Verifier accepted but the PPL gate (Eq. 4) dropped.
  corrections_applied: corrections that replaced the draft (passed both checks).
  trajectories_intervened / trajectories_with_accepted / trajectories_success: intervened
    rollouts, those with >= 1 applied correction, and those that reached reward 1.
  groups_replaced: groups in which an intervened trajectory replaced a failed member.
  trajectories_success_unintervened: successful intervened rollouts with no applied correction
    (every draft kept); they are plain re-samples and never enter a group.
  accepted_ppl_sum: sum of PPL_roll (Eq. 3) over applied corrections (float).
  correction_retries: Corrector samples redrawn after a failed attempt
    (``InterventionConfig.correction_attempts`` > 1); their outcomes are counted in the
    generated / rejected / applied fields like first attempts.
  verifier_reasons: rejections per Verifier reason (e.g. ``not_derivable``, ``leak``); a
    rejection with several reasons counts under each.
  *_malformed: LLM judgements that needed the conservative default.
  corrected_* / original_*: tool calls and characters of the assistant turns, summed over the
    intervened trajectories with >= 1 applied correction and over the on-policy rollouts of the
    triggered groups (``*_trajectories`` of each), for Table 6's averages per trajectory.
  validator_over_context / verifier_over_context: steps an LLM judge was not asked because its
    prompt did not fit the judge's context budget (the draft kept / the correction rejected).
  """

  groups_total: int = 0
  groups_triggered: int = 0
  steps_total: int = 0
  steps_flagged: int = 0
  corrections_generated: int = 0
  corrections_unchanged: int = 0
  corrections_over_context: int = 0
  verifier_accepted: int = 0
  verifier_rejected: int = 0
  verifier_skipped: int = 0
  ppl_rejected: int = 0
  corrections_applied: int = 0
  trajectories_intervened: int = 0
  trajectories_with_accepted: int = 0
  trajectories_success: int = 0
  groups_replaced: int = 0
  trajectories_success_unintervened: int = 0
  accepted_ppl_sum: float = 0.0
  correction_retries: int = 0
  validator_malformed: int = 0
  corrector_malformed: int = 0
  verifier_malformed: int = 0
  validator_over_context: int = 0
  verifier_over_context: int = 0
  corrected_trajectories: int = 0
  corrected_tool_calls: int = 0
  corrected_chars: int = 0
  original_trajectories: int = 0
  original_tool_calls: int = 0
  original_chars: int = 0
  verifier_reasons: dict[str, int] = dataclasses.field(default_factory=dict)

  @property
  def mean_accepted_ppl(self) -> float:
    """Mean PPL_roll of applied (accepted and gated-in) intervened steps; NaN if none (Fig. 5a)."""
    return self.accepted_ppl_sum / self.corrections_applied if self.corrections_applied else math.nan

  def malformed_rates(self) -> dict[str, tuple[int, int]]:
    """Per role, ``(malformed answers, answers)`` of the iteration (answers: the steps the
    Validator judged, the Corrector samples drawn, the corrections the Verifier judged)."""
    drawn = self.corrections_generated + self.corrections_unchanged + self.corrections_over_context
    return {"validator": (self.validator_malformed, self.steps_total - self.validator_over_context),
            "corrector": (self.corrector_malformed, drawn + self.corrector_malformed),
            "verifier": (self.verifier_malformed,
                         self.verifier_accepted + self.verifier_rejected - self.verifier_over_context)}

  def merge(self, other: "InterventionStats") -> "InterventionStats":
    """Field-wise sum (e.g. over data-parallel workers)."""
    out = {f.name: getattr(self, f.name) + getattr(other, f.name)
           for f in dataclasses.fields(self) if f.name != "verifier_reasons"}
    reasons = dict(self.verifier_reasons)
    for k, v in other.verifier_reasons.items():
      reasons[k] = reasons.get(k, 0) + v
    return InterventionStats(**out, verifier_reasons=reasons)

  def table(self) -> list[tuple[str, float, float, float]]:
    """Table-6 rows: ``(statistic, count, denominator, ratio)``; ratio NaN on a 0 denominator."""
    judged = self.verifier_accepted + self.verifier_rejected
    rows = [
      ("groups with intervention triggered", self.groups_triggered, self.groups_total),
      ("steps flagged invalid by the Validator", self.steps_flagged, self.steps_total),
      ("corrections accepted by the Verifier", self.verifier_accepted, judged),
      ("corrections rejected by the Verifier", self.verifier_rejected, judged),
      ("corrections rejected by the PPL gate", self.ppl_rejected, self.verifier_accepted + self.verifier_skipped),
      ("intervened trajectories with >= 1 accepted correction", self.trajectories_with_accepted, self.trajectories_intervened),
      ("intervened trajectories that reached reward 1", self.trajectories_success, self.trajectories_intervened),
    ]
    return [(name, c, d, c / d if d else math.nan) for name, c, d in rows]

  def averages(self) -> list[tuple[str, float, float, float]]:
    """Table 6's per-trajectory averages: ``(statistic, total, trajectories, mean)``; NaN on none."""
    rows = [
      ("tool calls per corrected trajectory", self.corrected_tool_calls, self.corrected_trajectories),
      ("tool calls per original trajectory", self.original_tool_calls, self.original_trajectories),
      ("characters per corrected trajectory", self.corrected_chars, self.corrected_trajectories),
      ("characters per original trajectory", self.original_chars, self.original_trajectories),
    ]
    return [(name, c, d, c / d if d else math.nan) for name, c, d in rows]

  def as_dict(self, prefix: str = "rti/") -> dict[str, Any]:
    out: dict[str, Any] = {f"{prefix}{f.name}": getattr(self, f.name)
                           for f in dataclasses.fields(self) if f.name != "verifier_reasons"}
    out.update({f"{prefix}verifier_rejected/{k}": v for k, v in sorted(self.verifier_reasons.items())})
    out[f"{prefix}mean_accepted_ppl"] = self.mean_accepted_ppl
    for role, (bad, n) in self.malformed_rates().items():
      out[f"{prefix}{role}_malformed_rate"] = bad / n if n else 0.0
    return out

  def format_table(self) -> str:
    """Table 6 as text (for logs)."""
    lines = [f"{'statistic':<56}{'count':>14}{'ratio':>10}"]
    for name, c, d, r in self.table():
      lines.append(f"{name:<56}{f'{int(c)} / {int(d)}':>14}{'' if math.isnan(r) else f'{100 * r:.2f}%':>10}")
    for name, _, d, mean in self.averages():
      lines.append(f"{name:<56}{f'n = {int(d)}':>14}{'' if math.isnan(mean) else f'{mean:.1f}':>10}")
    lines.append(f"{'mean PPL of accepted intervened steps':<56}{self.mean_accepted_ppl:>14.3f}")
    if self.verifier_reasons:
      why = ", ".join(f"{k} {v}" for k, v in sorted(self.verifier_reasons.items(), key=lambda kv: -kv[1]))
      lines.append(f"{'Verifier rejections by reason':<56}{why}")
    return "\n".join(lines)
