"""LLM-backed roles: tolerant JSON parsing with conservative defaults, the App. A.1 prompt
templates for every domain, and the roles served by a separate endpoint inside the pipeline."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from rti_jax.intervention import (
  InterventionConfig,
  InterventionRoles,
  JudgeLLM,
  LLMCorrector,
  LLMValidator,
  LLMVerifier,
  StepContext,
  ValidatorJudgement,
  intervene_groups,
  parse_corrector,
  parse_json_object,
  parse_validator,
  parse_verifier,
)
from rti_jax.intervention.judges import corrector_prompt, feedback_message, render, validator_prompt, verifier_prompt
from rti_jax.policy.tokenizer import byte_tokenizer
from rti_jax.rollout import ChatFormatter, RolloutConfig, rollout_groups
from intervention_doubles import (
  CORRECTOR_MARKER,
  FEEDBACK_MARKER,
  NAV_TOOLS,
  VALIDATOR_MARKER,
  VERIFIER_MARKER,
  MiniNavEnv,
  MiniNavScript,
  ScriptedPolicy,
  mini_nav_tasks,
  scripted_logp,
)


@pytest.mark.parametrize(
  "text, expected",
  [
    ('{"is_valid": false, "error_types": ["x"]}', {"is_valid": False, "error_types": ["x"]}),
    ('Sure!\n```json\n{"ok": true, "reasons": []}\n```\nHope this helps {not json}', {"ok": True, "reasons": []}),
    ('<think>maybe {"ok": false}</think>\nVerdict: {"ok": true} -- done', {"ok": True}),
    # Thinking-2507: the generation prompt opened the reasoning, so the answer has only its end
    ('maybe {"ok": false} after all</think>\n{"ok": true}', {"ok": True}),
    ("{'ok': True}", None),  # single quotes are not JSON; no silent guessing
    ('prefix {"a": {"b": "}"}} suffix {"c": 1}', {"a": {"b": "}"}}),
    ('{"ok": True, "reasons": None}', {"ok": True, "reasons": None}),  # Python literals
    ("[1, 2, 3]", None),
    ("no json at all", None),
    ('{"ok": tru', None),
  ],
)
def test_parse_json_object(text, expected):
  assert parse_json_object(text) == expected


def test_validator_defaults_to_valid_when_malformed():
  j = parse_validator('```json\n{"diagnosis": "bad", "is_valid": "false", "error_types": "premature_direction", '
                      '"suggest_next": "search again"}\n```')
  assert j == ValidatorJudgement(False, ("premature_direction",), "bad", "search again")
  for bad in ("nothing", '{"diagnosis": "missing the verdict"}', '{"is_valid": "perhaps"}'):
    j = parse_validator(bad)
    assert j.is_valid and j.malformed


def test_verifier_defaults_to_reject_when_malformed():
  v = parse_verifier('{"ok": "yes", "reasons": [], "diagnosis": "fine"}')
  assert v.ok and not v.malformed and v.diagnosis == "fine"
  v = parse_verifier('{"ok": false, "reasons": "leak"}')
  assert not v.ok and v.reasons == ("leak",)
  for bad in ("", "ok!", '{"reasons": []}'):
    v = parse_verifier(bad)
    assert not v.ok and v.malformed


def test_parse_corrector():
  out = parse_corrector('{"reasoning": "r", "tool_calls": [{"name": "poi_search", "arguments": "{\\"address\\": \\"A\\"}"}], '
                        '"content": ""}')
  assert out == ("r", [{"name": "poi_search", "arguments": {"address": "A"}}], "")
  out = parse_corrector('{"reasoning": "r", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}')
  assert out == ("r", [{"name": "f", "arguments": {}}], "")
  assert parse_corrector('{"reasoning": "r", "tool_calls": [], "content": "Please reboot your phone."}')[2] == "Please reboot your phone."
  for bad in ('{"reasoning": "r", "tool_calls": [], "content": ""}', '{"tool_calls": [{"arguments": {}}]}',
              '{"tool_calls": [{"name": "f", "arguments": "not json"}]}', "prose"):
    assert parse_corrector(bad) is None


NAV_EVIDENCE = {"route": ["121.5012,25.0301", "121.5409,25.0533"], "order_level": 4, "places": ["Dajin Park", "Yixing Temple"]}
TELECOM_EVIDENCE = {
  "completion_note": "every required action is done and the user can send an MMS",
  "agent_actions": [{"name": "get_customer_by_phone", "arguments": {"phone_number": "555-123-2002"}}],
  "user_actions": [{"name": "toggle_data", "arguments": {}}],
  "evaluation_criteria": {"actions": [{"requestor": "user", "name": "toggle_data", "arguments": {}}]},
  "user_side_tools": ["toggle_data", "reboot_device"],
  "agent_side_tools": ["get_customer_by_phone"],
}


def _ctx(domain):
  evidence = NAV_EVIDENCE if domain == "navigation" else TELECOM_EVIDENCE
  history = ({"role": "user", "content": "Route from Dajin Park to Yixing Temple, please."},)
  return StepContext("Route from Dajin Park to Yixing Temple, please.", history, "DRAFT-TEXT", tuple(NAV_TOOLS), evidence, domain)


@pytest.mark.parametrize("domain", ["navigation", "telecom", "retail", "airline"])
def test_templates_render_completely(domain):
  ctx = _ctx(domain)
  judgement = ValidatorJudgement(False, ("premature_direction",), "DIAG", "SUGGEST")
  prompts = [validator_prompt(ctx), corrector_prompt(ctx, judgement), verifier_prompt(ctx, "CORRECTED-TEXT")]
  for p in prompts:
    assert not re.search(r"\$[a-z_]+", p), p  # every placeholder was filled
    assert "DRAFT-TEXT" in p
  v, c, r = prompts
  assert v.startswith(VALIDATOR_MARKER) and c.startswith(CORRECTOR_MARKER) and r.startswith(VERIFIER_MARKER)
  assert "JSON object" in v and '"is_valid"' in v and '"suggest_next"' in v
  assert "DIAG" in c and "SUGGEST" in c and '"tool_calls"' in c and "imitate its voice" in c
  assert "CORRECTED-TEXT" in r and '"ok"' in r
  if domain == "navigation":
    assert "121.5409,25.0533" in v and "121.5409,25.0533" in c
    assert "121.5409,25.0533" not in r  # the Navigation Verifier sees visible information only
    assert "Rules the agent was given" in v and "route-planning" in c and "not_derivable" in r
  else:
    assert "every required action is done" in v and "toggle_data" in v and "$120" in r
    assert ("USER_SIDE_DEVICE_ACTION" in v and '["toggle_data", "reboot_device"]' in v) == (domain == "telecom")
    assert ("MISSING_CONFIRMATION" in v) == (domain in ("retail", "airline"))


def test_template_errors_name_the_problem():
  with pytest.raises(KeyError, match="response_text"):
    render("navigation_validator", history_json="[]", order="", ref="", gt="")
  with pytest.raises(FileNotFoundError, match="nope"):
    render("nope")
  with pytest.raises(ValueError, match="unknown environment .chess."):
    validator_prompt(StepContext("q", (), "d", (), {}, "chess"))
  assert "DIAG" in feedback_message(ValidatorJudgement(False, (), "DIAG", "NEXT")) and FEEDBACK_MARKER in feedback_message(
    ValidatorJudgement(False))


class JudgeScript:
  """A separate intervening model: answers the three App. A.1 prompts for the mini map."""

  def __init__(self, corrector_json: str | None = None):
    self.corrector_json = corrector_json

  def __call__(self, prompt: str) -> str:
    if VALIDATOR_MARKER in prompt:
      current = prompt.split("## Proposed step", 1)[1].split("## Rules", 1)[0]
      bad = "116.3971,39.9169" in current  # the Beijing temple
      verdict = {"is_valid": not bad, "error_types": ["premature_direction"] if bad else [],
                 "diagnosis": "Yixing Temple was found in Beijing, far from the parks in Taipei." if bad else "ok",
                 "suggest_next": "Search Yixing Temple again in Taipei." if bad else ""}
      return "<think>\nchecking\n</think>\n```json\n" + json.dumps(verdict) + "\n```"
    if CORRECTOR_MARKER in prompt:
      return self.corrector_json or json.dumps({
        "reasoning": "The temple result is far from the other stops; search it in Taipei.",
        "tool_calls": [{"name": "poi_search", "arguments": {"address": "Yixing Temple", "region": "Taipei"}}],
        "content": ""})
    if VERIFIER_MARKER in prompt:
      return 'Verdict: {"ok": true, "reasons": [], "diagnosis": "derivable"} (end)'
    raise AssertionError(f"unexpected judge prompt: {prompt[:200]}")


@pytest.fixture(scope="module")
def tok():
  return byte_tokenizer()


def _pipeline(tok, judge_script):
  fmt = ChatFormatter(tok, NAV_TOOLS)
  policy = ScriptedPolicy(tok, MiniNavScript(), scripted_logp(-1.0, -0.2))
  judge = ScriptedPolicy(tok, judge_script, scripted_logp())
  llm = JudgeLLM(judge, ChatFormatter(tok))
  rc = RolloutConfig(group_size=2)
  tasks = mini_nav_tasks()
  groups = rollout_groups(tasks, MiniNavEnv, policy, fmt, rc, task_id=lambda t: t.task_id)
  n_policy = len(policy.calls)
  roles = InterventionRoles(LLMValidator(llm), LLMCorrector(llm), LLMVerifier(llm))
  new, stats = intervene_groups(groups, tasks, MiniNavEnv, policy, fmt, roles, InterventionConfig(), rc,
                                task_id=lambda t: t.task_id)
  return groups, new, stats, policy, judge, n_policy


def test_separate_intervening_model_corrects_through_the_pipeline(tok):
  groups, new, stats, policy, judge, n_policy = _pipeline(tok, JudgeScript())
  assert stats.groups_triggered == 1 and stats.steps_flagged == 1 and stats.verifier_accepted == 1
  assert stats.corrections_applied == 1 and stats.trajectories_success == 1 and stats.validator_malformed == 0
  traj = new[1][0]
  turn = next(t for t in traj.turns if t.intervened)
  assert turn.text == ('<think>\nThe temple result is far from the other stops; search it in Taipei.\n</think>\n\n'
                       '<tool_call>\n{"name": "poi_search", "arguments": {"address": "Yixing Temple", "region": "Taipei"}}'
                       '\n</tool_call>')
  # The policy generated only its own drafts; the judge got every role prompt.
  assert all(VALIDATOR_MARKER not in c for c in policy.calls[n_policy:])
  assert stats.steps_total == 4  # search, corrected re-search, direction, answer
  assert sum(VALIDATOR_MARKER in c for c in judge.calls) == stats.steps_total  # one Validator call per step
  # log pi_roll and log pi_cal are the POLICY's scores under p_roll and p_cal (Eq. 5), not the judge's
  a = traj.arrays()
  ids = a["token_ids"][turn.start:turn.end]
  np.testing.assert_allclose(a["roll_logp"][turn.start:turn.end], -1.0 - 0.01 * (ids % 7), atol=1e-6)
  np.testing.assert_allclose(a["cal_logp"][turn.start:turn.end], -0.2 - 0.01 * (ids % 7), atol=1e-6)


def test_malformed_corrector_json_is_counted_and_the_draft_kept(tok):
  groups, new, stats, *_ = _pipeline(tok, JudgeScript(corrector_json="I would search again, I think."))
  assert stats.steps_flagged == 1 and stats.corrector_malformed == 1 and stats.corrections_applied == 0
  assert new[1] == groups[1]


def test_make_roles_self_intervention_and_separate_endpoint(tok):
  from rti_jax.generation.base import SamplingParams
  from rti_jax.intervention import NavigationRuleValidator, NavigationRuleVerifier, PolicyCorrector, make_roles

  fmt = ChatFormatter(tok, NAV_TOOLS)
  policy = ScriptedPolicy(tok, JudgeScript(), scripted_logp())
  sampling = SamplingParams(max_new_tokens=64)
  rules = make_roles("rules", policy, fmt, sampling)
  assert isinstance(rules.validator, NavigationRuleValidator) and isinstance(rules.verifier, NavigationRuleVerifier)
  assert isinstance(rules.corrector, PolicyCorrector)
  ctx = StepContext("q", (), "<tool_call>\n{\"name\": \"direction\", \"arguments\": {\"origin\": \"116.3971,39.9169\"}}\n</tool_call>",
                    (), NAV_EVIDENCE, "navigation")
  own = make_roles("llm", policy, fmt, sampling)  # self-intervention: the policy judges
  assert not own.validator.validate([ctx])[0].is_valid
  assert VALIDATOR_MARKER in policy.calls[-1] and "# Tools" not in policy.calls[-1]  # judge prompt has no tool block
  judge = ScriptedPolicy(tok, JudgeScript(), scripted_logp())
  n = len(policy.calls)
  other = make_roles("llm", policy, fmt, sampling, judge=judge, judge_formatter=ChatFormatter(tok), corrector="llm")
  assert not other.validator.validate([ctx])[0].is_valid and other.verifier.verify([ctx], ["x"])[0].ok
  assert len(policy.calls) == n and len(judge.calls) == 2  # the separate endpoint did the judging
  assert isinstance(other.corrector, LLMCorrector)
  with pytest.raises(ValueError, match="kind"):
    make_roles("oracle", policy, fmt, sampling)
  with pytest.raises(ValueError, match="judge_formatter"):
    make_roles("llm", policy, fmt, sampling, judge=judge)


def test_table6_statistics():
  from rti_jax.intervention import InterventionStats

  s = InterventionStats(groups_total=10, groups_triggered=3, steps_total=20, steps_flagged=8, verifier_accepted=5,
                        verifier_rejected=3, ppl_rejected=1, corrections_applied=4, accepted_ppl_sum=10.0,
                        trajectories_intervened=3, trajectories_with_accepted=2, trajectories_success=1)
  rows = {name: (c, d, r) for name, c, d, r in s.table()}
  assert rows["groups with intervention triggered"] == (3, 10, 0.3)
  assert rows["steps flagged invalid by the Validator"] == (8, 20, 0.4)
  assert rows["corrections accepted by the Verifier"] == (5, 8, 5 / 8)
  assert rows["corrections rejected by the Verifier"] == (3, 8, 3 / 8)
  assert rows["corrections rejected by the PPL gate"] == (1, 5, 0.2)
  assert rows["intervened trajectories with >= 1 accepted correction"] == (2, 3, 2 / 3)
  assert rows["intervened trajectories that reached reward 1"] == (1, 3, 1 / 3)
  assert s.mean_accepted_ppl == 2.5 and s.as_dict()["rti/mean_accepted_ppl"] == 2.5
  m = s.merge(s)
  assert m.groups_total == 20 and m.mean_accepted_ppl == 2.5
  assert "62.50%" in s.format_table()
  empty = InterventionStats()
  assert all(np.isnan(r) for *_, r in empty.table()) and np.isnan(empty.mean_accepted_ppl)


def test_overlong_llm_correction_is_counted_and_the_draft_kept(tok):
  long_json = json.dumps({"reasoning": "x" * 600, "tool_calls": [
    {"name": "poi_search", "arguments": {"address": "Yixing Temple", "region": "Taipei"}}], "content": ""})
  groups, new, stats, *_ = _pipeline(tok, JudgeScript(corrector_json=long_json))
  assert stats.steps_flagged == 1 and stats.corrections_over_context == 1 and stats.corrections_applied == 0
  assert new[1] == groups[1]


def test_templates_with_the_real_telecom_evidence():
  from rti_jax.envs import telecom

  task = next(iter(telecom.load_tasks().values()))
  env = telecom.TelecomEnv()
  msgs = env.reset(task)
  ev = env.reward_evidence()
  draft = '<tool_call>\n{"name": "toggle_data", "arguments": {}}\n</tool_call>'
  ctx = StepContext(msgs[-1]["content"], tuple(m for m in msgs if m["role"] != "system"), draft,
                    tuple(env.tool_schemas()), ev, "telecom")
  judgement = ValidatorJudgement(False, ("USER_SIDE_DEVICE_ACTION",), "toggle_data is user-side", "Ask the user.")
  v, c, r = validator_prompt(ctx), corrector_prompt(ctx, judgement), verifier_prompt(ctx, "Please turn data on.")
  for p in (v, c, r):
    assert not re.search(r"\$[a-z_]+", p)
  assert ev["completion_note"] in v and json.dumps(ev["agent_actions"], ensure_ascii=False) in v
  assert json.dumps(ev["user_actions"], ensure_ascii=False) in v
  assert json.dumps(list(ev["user_side_tools"]), ensure_ascii=False) in v and "User-side tools" in c
  assert json.dumps(ev["evaluation_criteria"], ensure_ascii=False) in r  # the tau2 Verifier sees the criteria


@pytest.mark.parametrize("text", [
    "<think>The step looks wrong, so I will answer {\"ok\": true",  # a think block that never closes
    "<think>" + "hmm " * 5_000,  # cut by the answer budget inside the reasoning
    '{"ok": [true], "is_valid": [false]}', '{"ok": null, "is_valid": null}', '{"ok": {"v": true}, "is_valid": 3}',
    '{"ok": "perhaps", "is_valid": "maybe"}',
    "Sure! Here is my verdict: the correction is fine.",  # prose and no JSON
])
def test_untrusted_judge_text_gets_the_counted_conservative_default(text):
  """Any text that is not the asked-for object: the Validator keeps the draft, the Verifier rejects,
  both flagged malformed (counted per role; a run whose judges are mostly malformed stops)."""
  v, r = parse_validator(text), parse_verifier(text)
  assert v.is_valid and v.malformed
  assert not r.ok and r.malformed
