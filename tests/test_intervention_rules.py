"""Rule-based Navigation Validator / Verifier: each hard rule on hand-made steps, then against the
real Navigation environment (scripted oracle and naive agents) and through the whole pipeline."""

from __future__ import annotations

import json
import re

import pytest

from rti_jax.envs import navigation as nav
from rti_jax.intervention import (
  InterventionConfig,
  InterventionRoles,
  NavigationRuleValidator,
  NavigationRuleVerifier,
  PolicyCorrector,
  StepContext,
  intervene_groups,
)
from rti_jax.intervention.rules_navigation import coord_key, nav_evidence, route_matches
from rti_jax.policy.tokenizer import byte_tokenizer
from rti_jax.rollout import ChatFormatter, RolloutConfig, rollout_groups
from intervention_doubles import FEEDBACK_MARKER, ScriptedPolicy, scripted_logp, tool_call_text

A, B, C_BJ, C_TP = "121.5012,25.0301", "121.5234,25.0412", "116.3971,39.9169", "121.5409,25.0533"
EVIDENCE = {"route": [A, B, C_TP], "order_level": 4, "places": ["Dajin Park", "Lihui Park", "Yixing Temple"]}
QUERY = "Drive from Dajin Park to Lihui Park, then to Yixing Temple."


def _result(name, city, loc):
  return {"role": "tool", "content": json.dumps({"status": "1", "pois": [{"name": name, "city": city, "location": loc}]})}


SEARCHED = (
  {"role": "user", "content": QUERY},
  {"role": "assistant", "content": "\n".join(tool_call_text("poi_search", address=n) for n in EVIDENCE["places"])},
  _result("Dajin Park", "Taipei", A),
  _result("Lihui Park", "Taipei", B),
  _result("Yixing Temple", "Beijing", C_BJ),
)


def ctx(draft, history=SEARCHED, evidence=EVIDENCE):
  return StepContext(QUERY, tuple(history), draft, (), evidence, "navigation")


V, R = NavigationRuleValidator(), NavigationRuleVerifier()


def test_coordinates_and_routes():
  assert coord_key("121.50,25.0") == coord_key(" 121.5 , 25.000 ") is not None
  assert coord_key("Dajin Park") is None
  # a stop labelled with its place's name (what the scripted agents and the tiny policy write)
  assert coord_key("Dajin Park 121.50,25.0") == coord_key("121.5,25.000")
  assert coord_key("Dajin Park, 121.5,25.0") is None
  ev = nav_evidence({"groundtruth": {"name": "direction", "arguments": {"origin": A, "waypoints": [B], "destination": C_TP}},
                     "order": 2, "ref": [{"name": "x"}, {"name": "y"}, {"name": "z"}]})
  assert ev.stops == tuple(coord_key(s) for s in (A, B, C_TP)) and ev.order_level == 2 and ev.names == ("x", "y", "z")
  with pytest.raises(ValueError, match="route"):
    nav_evidence({"order": 1})
  a, b, c, d = "a", "b", "c", "d"
  assert route_matches([a, c, b, d], [a, b, c, d], 3) and not route_matches([a, c, b, d], [a, b, c, d], 4)
  assert route_matches([b, a, c, d], [a, b, c, d], 2) and not route_matches([b, a, c, d], [a, b, c, d], 1)
  assert route_matches([d, c, b, a], [a, b, c, d], 0) and not route_matches([a, b, c], [a, b, c, d], 0)


def test_searching_is_valid():
  j = V.judge(ctx(SEARCHED[1]["content"], history=SEARCHED[:1]))
  assert j.is_valid and not j.error_types


def test_direction_with_the_wrong_temple_is_premature_with_a_visible_hint():
  j = V.judge(ctx(tool_call_text("direction", origin=A, waypoints=[B], destination=C_BJ)))
  assert not j.is_valid and j.error_types == ("premature_direction",)
  assert j.visible_suggest_next == "Search 'Yixing Temple' again with region Taipei before calling direction."
  assert C_TP not in j.visible_suggest_next + j.diagnosis  # the feedback never carries the hidden coordinate
  assert j.feedback_suggestion == j.visible_suggest_next
  # The paper's suggest_next is built from the evidence: with no city there, the hidden coordinate itself ...
  assert j.suggest_next == f"Search 'Yixing Temple' again (it lies at {C_TP}) before calling direction."
  # ... and with the reference stops' cities, the city the temple really lies in, even one no result shows.
  ref = [{"name": n, "city": c, "location": loc}
         for n, c, loc in zip(EVIDENCE["places"], ("Taipei", "Taipei", "New Taipei"), EVIDENCE["route"])]
  j = V.judge(ctx(tool_call_text("direction", origin=A, waypoints=[B], destination=C_BJ),
                  evidence={"order": 4, "ref": ref, "groundtruth": {"origin": A, "waypoints": [B], "destination": C_TP}}))
  assert j.error_types == ("premature_direction",)
  assert j.suggest_next == "Search 'Yixing Temple' again with region New Taipei before calling direction."
  assert j.visible_suggest_next == "Search 'Yixing Temple' again with region Taipei before calling direction."


def test_suggest_next_from_the_evidence_names_the_reference_route():
  """A direction call over shown coordinates in the wrong order: the visible hint asks for the user's
  order, the paper's names the reference route; other rules give both the same hint."""
  c_tp = _result("Yixing Temple", "Taipei", C_TP)
  history = SEARCHED[:4] + (c_tp,)
  j = V.judge(ctx(tool_call_text("direction", origin=B, waypoints=[A], destination=C_TP), history=history))
  assert j.error_types == ("wrong_critical_call",)
  assert j.visible_suggest_next == "Keep the visiting order the user asked for when calling direction."
  assert j.suggest_next == (f"Call direction through 'Dajin Park' at {A}; 'Lihui Park' at {B}; "
                            f"'Yixing Temple' at {C_TP} in this order.")
  j = V.judge(ctx(tool_call_text("direction", origin=A, waypoints=[B], destination="1.0,2.0"), history=history))
  assert j.error_types[0] == "fabricated_coordinates"
  assert j.suggest_next == j.visible_suggest_next == "Use only coordinates returned by earlier tool calls."


def test_fabricated_coordinates():
  j = V.judge(ctx(tool_call_text("direction", origin=A, waypoints=[B], destination="121.0000,25.0000")))
  assert "fabricated_coordinates" in j.error_types
  j = V.judge(ctx(tool_call_text("around_search", location="120.1,30.2", keyword="temple")))
  assert j.error_types == ("fabricated_coordinates",)


def test_redundant_and_stubborn_searches():
  twice = tool_call_text("poi_search", address="Lihui Park") + "\n" + tool_call_text("poi_search", address="Lihui Park")
  assert V.judge(ctx(twice)).error_types == ("redundant_search",)
  failed = SEARCHED + (
    {"role": "assistant", "content": tool_call_text("poi_search", address="Yixing Temple", region="Tainan")},
    {"role": "tool", "content": "found 0"},
  )
  j = V.judge(ctx(tool_call_text("poi_search", address="Yixing Temple", region="Tainan"), history=failed))
  assert j.error_types == ("stubborn_repeat",)
  # a different argument after a failure is a legitimate retry
  assert V.judge(ctx(tool_call_text("poi_search", address="Yixing Temple", region="Taipei"), history=failed)).is_valid


def test_wrong_order_is_an_irreversible_wrong_call_and_right_order_is_valid():
  full = SEARCHED + (_result("Yixing Temple", "Taipei", C_TP),)
  j = V.judge(ctx(tool_call_text("direction", origin=B, waypoints=[A], destination=C_TP), history=full))
  assert j.error_types == ("wrong_critical_call",)
  assert V.judge(ctx(tool_call_text("direction", origin=A, waypoints=[B], destination=C_TP), history=full)).is_valid
  free = dict(EVIDENCE, order_level=0)
  assert V.judge(ctx(tool_call_text("direction", origin=B, waypoints=[A], destination=C_TP), full, free)).is_valid


def test_answer_before_a_correct_route_is_premature():
  assert V.judge(ctx("Here is your route.")).error_types == ("premature_answer",)
  done = SEARCHED + (
    _result("Yixing Temple", "Taipei", C_TP),
    {"role": "assistant", "content": tool_call_text("direction", origin=A, waypoints=[B], destination=C_TP)},
    {"role": "tool", "content": "route ok"},
  )
  assert V.judge(ctx("Here is your route.", history=done)).is_valid


def test_verifier_accepts_derivable_and_rejects_leaks_and_hallucinations():
  ok = "<think>\nThe temple is far from the parks in Taipei.\n</think>\n\n" + tool_call_text(
    "poi_search", address="Yixing Temple", region="Taipei")
  assert R.judge(ctx(ok), ok).ok
  leak_coord = tool_call_text("direction", origin=A, waypoints=[B], destination=C_TP)
  v = R.judge(ctx(leak_coord), leak_coord)
  assert not v.ok and v.reasons == ("not_derivable",) and C_TP in v.diagnosis
  unseen_region = tool_call_text("poi_search", address="Yixing Temple", region="Kaohsiung")
  assert R.judge(ctx(unseen_region), unseen_region).reasons == ("not_derivable",)
  unseen_place = tool_call_text("poi_search", address="Golden Dragon Pagoda")
  assert R.judge(ctx(unseen_place), unseen_place).reasons == ("not_derivable",)
  wording = "According to the reference route I should search again.\n" + tool_call_text("poi_search", address="Yixing Temple")
  assert R.judge(ctx(wording), wording).reasons == ("leak",)
  fake = "<tool_response>\nfound 1\n</tool_response>"
  assert "hallucinated_tool_result" in R.judge(ctx(fake), fake).reasons


# --- against the real Navigation environment ----------------------------------------------------


@pytest.fixture(scope="module")
def bench():
  return nav.load_benchmark("tiny")


def _episode_contexts(env, agent, task):
  """(StepContext, reward) of every step of a scripted agent's episode."""
  env.reset(task)
  out = []
  while True:
    text = agent.act(env.transcript.messages)
    history = tuple(m for m in env.transcript.messages if m["role"] != "system")
    out.append(StepContext(task.query, history, text, tuple(env.tool_schemas()), env.reward_evidence(), "navigation"))
    result = env.step(text)
    if result.done:
      return out, result.reward


def test_rules_on_the_real_env_oracle_never_flagged_naive_failures_always(bench):
  env = nav.NavigationEnv(bench.world)
  tasks = bench.train[:80]
  for task in tasks:
    steps, reward = _episode_contexts(env, nav.OracleAgent(task), task)
    assert reward == 1.0
    for c in steps:
      assert V.judge(c).is_valid, (task.task_id, c.draft)  # reward-oriented: no false alarms
      assert R.judge(c, c.draft).ok, (task.task_id, c.draft)  # the oracle uses visible info only
  failures = 0
  for task in tasks:
    steps, reward = _episode_contexts(env, nav.NaiveAgent(task), task)
    if reward == 0.0:
      failures += 1
      assert any(not V.judge(c).is_valid for c in steps), task.task_id
  assert failures >= 10


def test_false_claims_about_where_places_were_found_are_rejected(bench):
  """The check line and the oracle's re-search sentence, as the oracle writes them, always hold
  (200 train tasks); each false variant is rejected as ``false_claim`` with a reason."""
  from rti_jax.envs.navigation.agents import search_resolution
  from rti_jax.policy.check_line import CheckedAgent
  from rti_jax.intervention.rules_navigation import claim_errors

  env = nav.NavigationEnv(bench.world)
  seen = {"odd": 0, "plain": 0}
  for task in bench.train[:200]:
    steps, reward = _episode_contexts(env, CheckedAgent(nav.OracleAgent(task)), task)
    assert reward == 1.0
    for c in steps:
      assert claim_errors(c.history, c.draft) == [], (task.task_id, c.draft)
      assert R.judge(c, c.draft).ok, (task.task_id, c.draft)
    second = steps[1]  # the turn right after the first search results: it opens with the line
    line = second.draft.splitlines()[0]
    trip, best, off = search_resolution(list(second.history))
    assert line.startswith("Check: ") and trip is not None
    rest = "\n".join(second.draft.splitlines()[1:])
    if off:
      seen["odd"] += 1
      wrong = [f"Check: all in {trip}.", f"Check: {off[0]} in {trip}."]
      others = [n for n in best if n not in off]
      if others:
        wrong.append(f"Check: {others[0]} in {best[off[0]][0].city}.")  # the wrong stop named
      # the re-search sentence with the wrong city
      assert claim_errors(second.history, f"{off[0]} was found in {trip}, far from the other places in {trip}.")
    else:
      seen["plain"] += 1
      name = next(iter(best))
      wrong = [f"Check: {name} in {best[name][0].city}.", "Check: all in Nowhere.",
               f"{name} was found in {best[name][0].city}, far from the other places in {trip}."]
    for w in wrong:
      bad = w + "\n" + rest if w.startswith("Check: ") else w
      assert claim_errors(second.history, bad), (task.task_id, bad)
      v = R.judge(second, bad)
      assert not v.ok and "false_claim" in v.reasons and "results" in v.diagnosis, (task.task_id, bad, v)
  assert seen["odd"] >= 50 and seen["plain"] >= 50, seen
  # a place the trip does not have is named; a searched place worded otherwise is not judged
  assert claim_errors(second.history, f"Zzyzx Tower was found in Taipei, far from the other places in {trip}.")[0].endswith(
      "which neither the request nor the results show")
  assert claim_errors(second.history, f"The {name} was found in Taipei, far from the other places in {trip}.") == []
  # nothing to read (no parseable result): no claim is judged
  assert claim_errors(SEARCHED, "Check: all in Taipei.") == []


def _parse_chatml(prompt: str) -> list[dict]:
  """Chat messages back out of a decoded ChatML prompt (for the scripted policy below)."""
  msgs = []
  for block in prompt.split("<|im_start|>")[1:]:
    role, _, body = block.partition("\n")
    body = body.split("<|im_end|>")[0]
    if role == "user" and body.startswith("<tool_response>"):
      msgs += [{"role": "tool", "content": t} for t in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", body, re.DOTALL)]
    elif role:
      msgs.append({"role": role, "content": body})
  if msgs and msgs[-1] == {"role": "assistant", "content": ""}:  # the open generation prompt
    msgs.pop()
  return msgs


def test_pipeline_on_the_real_env_turns_naive_failures_into_successes(bench):
  """A naive policy + rule-based roles + a policy Corrector that follows the hint."""
  tok = byte_tokenizer()
  fmt = ChatFormatter(tok)  # the Navigation system prompt already lists the tools
  by_query = {t.query: t for t in bench.train}

  def script(prompt: str) -> str:
    msgs = _parse_chatml(prompt)
    if msgs[-1]["role"] == "user" and FEEDBACK_MARKER in msgs[-1]["content"]:
      m = re.search(r"Search '([^']+)' again with region (\w+)", msgs[-1]["content"])
      assert m, msgs[-1]["content"]
      return "That place does not fit the trip.\n" + tool_call_text("poi_search", address=m.group(1), region=m.group(2))
    task = by_query[next(m["content"] for m in msgs if m["role"] == "user")]
    return nav.NaiveAgent(task).act(msgs)

  policy = ScriptedPolicy(tok, script, scripted_logp(-0.5, -0.3))
  tasks = [t for t in bench.train if t.needs_disambiguation][:3] + [t for t in bench.train if not t.needs_disambiguation][:1]
  rc = RolloutConfig(group_size=2, max_context_tokens=16384)
  groups = rollout_groups(tasks, lambda: nav.NavigationEnv(bench.world), policy, fmt, rc, task_id=lambda t: t.task_id)
  failed = sum(max(t.reward for t in g) == 0 for g in groups)
  assert failed >= 1
  roles = InterventionRoles(V, PolicyCorrector(policy, rc.sampling, fmt.end_of_turn_id), R)
  new, stats = intervene_groups(groups, tasks, lambda: nav.NavigationEnv(bench.world), policy, fmt, roles,
                                InterventionConfig(), rc, task_id=lambda t: t.task_id)
  assert stats.groups_triggered == failed
  assert stats.verifier_rejected == 0 and stats.corrections_applied >= failed
  assert stats.trajectories_success == failed == stats.groups_replaced
  for g_old, g_new in zip(groups, new):
    if max(t.reward for t in g_old) == 0:
      assert g_new[0].intervened and g_new[0].reward == 1.0 and any(g_new[0].intervened_mask)
      assert all(t.reward == 0.0 for t in g_new[1:])
