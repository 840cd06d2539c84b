"""Teaching a policy its own judges (``rti_jax.policy.judge_sft``): the questions recorded from
intervened rollouts with the rule oracles' answers, the answers as the parsers read them, the SFT
example laid out as the judge is asked, the class balance, the tokenizer growth that leaves the
agent's text as it was, and the agreement figures against a brute-force count."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from rti_jax.intervention.judges import (JudgeLLM, StepContext, ValidatorJudgement, VerifierJudgement, parse_validator,
                                         parse_verifier)
from rti_jax.intervention.prompting import validator_prompt, verifier_prompt
from rti_jax.policy import judge_sft
from rti_jax.policy.judge_sft import JudgeStep

POLICY = "policies/navigation_base"


@pytest.fixture(scope="module")
def nav_tok():
  from transformers import AutoTokenizer

  return AutoTokenizer.from_pretrained(POLICY, local_files_only=True)


def _ctx(draft: str = "I will search.", query: str = "Route from Yuhua Temple to Guiyuan Lake, driving.") -> StepContext:
  evidence = {"order_level": 2, "places": [{"name": "Yuhua Temple", "city": "Chengdu", "location": "104.2355,30.5453"}],
              "gt": {"name": "direction", "arguments": {"origin": "104.2355,30.5453", "destination": "104.0559,30.6154"}}}
  return StepContext(user_query=query, history=({"role": "user", "content": query},), draft=draft, tools=(),
                     evidence=evidence, domain="navigation")


FLAGGED = ValidatorJudgement(is_valid=False, error_types=("premature_direction", "redundant_search"),
                             diagnosis="direction is called too early.", suggest_next="Search 'A' with region Chengdu.",
                             visible_suggest_next="Search 'A' again with a region that fits the other stops.")
FINE = ValidatorJudgement(is_valid=True, diagnosis="No hard rule is violated.")
REJECT = VerifierJudgement(ok=False, reasons=("not_derivable", "leak"), diagnosis="uses region 'Chengdu'.")
ACCEPT = VerifierJudgement(ok=True, diagnosis="Derivable.")


@pytest.mark.parametrize("truth", [FLAGGED, FINE])
@pytest.mark.parametrize("suggestion", ["visible", "evidence"])
def test_validator_answers_read_back_as_the_oracles_verdict(truth, suggestion):
  got = parse_validator(judge_sft.validator_answer(truth, suggestion))
  assert not got.malformed
  assert (got.is_valid, got.error_types, got.diagnosis) == (truth.is_valid, truth.error_types, truth.diagnosis)
  want = "" if truth.is_valid else (truth.visible_suggest_next if suggestion == "visible" else truth.suggest_next)
  assert got.suggest_next == want
  with pytest.raises(ValueError, match="^suggestion: "):
    judge_sft.validator_answer(truth, "hint")


@pytest.mark.parametrize("truth", [REJECT, ACCEPT])
def test_verifier_answers_read_back_as_the_oracles_verdict(truth):
  got = parse_verifier(judge_sft.verifier_answer(truth))
  assert (got.ok, got.reasons, got.diagnosis, got.malformed) == (truth.ok, truth.reasons, truth.diagnosis, False)


def test_an_example_is_the_question_as_the_judge_is_asked_then_the_trained_answer(nav_tok):
  from rti_jax.rollout import ChatFormatter

  jfmt = judge_sft.judge_formatter(ChatFormatter(nav_tok))
  step = JudgeStep("verifier", _ctx(), REJECT, corrected="I will search again.")
  ex = judge_sft.example(jfmt, step)
  asked = jfmt.prompt_ids([{"role": "user", "content": verifier_prompt(step.ctx, step.corrected)}])

  class Capture:
    def generate(self, prompts, params, seed):
      self.prompts = prompts
      return []

  cap = Capture()
  JudgeLLM(cap, jfmt).ask([step.prompt()])
  assert list(cap.prompts[0]) == asked
  n = len(asked)
  assert list(ex.token_ids[:n]) == asked and not any(ex.loss_mask[:n]) and all(ex.loss_mask[n:])
  assert jfmt.decode(list(ex.token_ids[n:])) == judge_sft.verifier_answer(REJECT)
  assert ex.kind == "verifier"
  assert judge_sft.example(jfmt, step, max_len=len(ex.token_ids) - 1) is None
  assert judge_sft.example(jfmt, step, max_len=len(ex.token_ids)) == ex
  assert JudgeStep("validator", _ctx(), FINE).prompt() == validator_prompt(_ctx())


def _steps(flags: list[bool], role: str) -> list[JudgeStep]:
  out = []
  for i, f in enumerate(flags):
    truth = (FLAGGED if f else FINE) if role == "validator" else (REJECT if f else ACCEPT)
    out.append(JudgeStep(role, _ctx(f"draft {i}"), truth, None if role == "validator" else f"fix {i}"))
  return out


@pytest.mark.parametrize("ratio", [0.0, 0.5, 1.0, 3.0])
def test_balanced_keeps_every_objection_and_at_most_ratio_times_as_many_others(ratio):
  rng = np.random.default_rng(0)
  steps = [s for pair in itertools.zip_longest(_steps(list(rng.random(40) < 0.2), "validator"),
                                               _steps(list(rng.random(9) < 0.5), "verifier")) for s in pair if s]
  got = judge_sft.balanced(steps, np.random.default_rng(1), ratio)
  assert [steps.index(s) for s in got] == sorted(steps.index(s) for s in got)  # the order given
  for role in judge_sft.ROLES:
    mine = [s for s in steps if s.role == role]
    objected = [s for s in mine if judge_sft.verdict(s)]
    others = len(mine) - len(objected)
    kept = [s for s in got if s.role == role]
    assert all(s in kept for s in objected)
    assert len(kept) - len(objected) == min(others, int(round(ratio * max(len(objected), 1))))


def test_agreement_counts_as_a_brute_force_confusion_table():
  steps = _steps([True, True, True, False, False, False], "validator") + _steps([True, True, False, False], "verifier")
  bad = "the verdict is yes"
  texts = [judge_sft.validator_answer(FLAGGED),  # flagged, right
           json.dumps({"is_valid": False, "error_types": ["premature_direction"]}),  # flagged, one type of two
           bad,  # flagged, malformed: the pipeline keeps the draft (valid)
           judge_sft.validator_answer(FLAGGED),  # fine, wrongly flagged
           judge_sft.validator_answer(FINE),
           None,  # over the judge's context
           judge_sft.verifier_answer(REJECT),  # reject, right, both reasons
           bad,  # reject, malformed: the fallback rejects
           judge_sft.verifier_answer(VerifierJudgement(ok=False, reasons=("leak",))),  # ok, wrongly rejected
           judge_sft.verifier_answer(ACCEPT)]
  a = judge_sft.agreement(steps, texts)
  v = a["validator"]
  assert (v["questions"], v["over_context"], v["malformed"]) == (6, 1, 1)
  assert v["malformed_rate"] == pytest.approx(1 / 5)
  # asked: truth invalid x3 (predicted invalid, invalid, valid), valid x2 (invalid, valid)
  assert v["invalid"] == {"positives": 3, "predicted": 3, "precision": pytest.approx(2 / 3), "recall": pytest.approx(2 / 3)}
  assert v["by_type"]["premature_direction"]["recall"] == pytest.approx(2 / 3)
  assert v["by_type"]["redundant_search"] == {"positives": 3, "predicted": 2, "precision": pytest.approx(1 / 2),
                                              "recall": pytest.approx(1 / 3)}
  assert v["accuracy"] == pytest.approx(3 / 5)
  r = a["verifier"]
  assert (r["questions"], r["over_context"], r["malformed"]) == (4, 0, 1)
  assert r["reject"] == {"positives": 2, "predicted": 3, "precision": pytest.approx(2 / 3), "recall": 1.0}
  assert r["by_reason"]["not_derivable"] == {"positives": 2, "predicted": 1, "precision": 1.0, "recall": 0.5}
  assert r["by_reason"]["leak"]["predicted"] == 2 and r["by_reason"]["leak"]["precision"] == pytest.approx(1 / 2)
  assert r["accuracy"] == pytest.approx(3 / 4)
  empty = judge_sft.agreement([], [])
  assert math.isnan(empty["validator"]["malformed_rate"]) and math.isnan(empty["verifier"]["reject"]["recall"])


def test_frequent_pretokens_are_those_in_the_given_share_that_split(nav_tok):
  texts = ["the reviewer flags it", "a reviewer", "reviewer reviewer Yuhua Temple", "nothing here"]
  got = judge_sft.frequent_pretokens(nav_tok, texts, 0.5)
  assert "reviewer" in got and got.index("reviewer") == 0  # in 3 of 4 texts (counted once per text)
  split = {p for p in got}
  assert all(len(nav_tok.backend_tokenizer.model.tokenize(
      nav_tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(p)[0][0])) >= 2 for p in split)
  assert "Yuhua Temple" not in got  # one token already, and in a quarter of the texts
  assert judge_sft.frequent_pretokens(nav_tok, texts, 1.0) == []


def test_grown_tokenizer_shortens_judge_prompts_and_leaves_the_agents_text_alone(nav_tok):
  from rti_jax.envs import navigation as nav
  from rti_jax.rollout import ChatFormatter

  bench = nav.load_benchmark("tiny")
  env = nav.NavigationEnv(bench.world)
  messages = env.reset(bench.train[0])
  agent = [m["content"] for m in messages] + ["I will search for each place first, as a reviewer would."]
  prompt = validator_prompt(_ctx())
  cands = judge_sft.frequent_pretokens(nav_tok, [prompt], 1.0)
  new, kept, like = judge_sft.grow_tokenizer(nav_tok, cands, agent)
  assert "reviewer" in cands and "reviewer" not in kept  # the agent's text spells it: its merges would change it
  assert len(kept) > 20 and len(new) > len(nav_tok)
  for text in agent:
    assert new.encode(text, add_special_tokens=False) == nav_tok.encode(text, add_special_tokens=False)
  assert len(new.encode(prompt, add_special_tokens=False)) < 0.8 * len(nav_tok.encode(prompt, add_special_tokens=False))
  assert new.decode(new.encode(prompt, add_special_tokens=False)) == prompt
  vocab = nav_tok.get_vocab()
  for new_id, old_ids in like.items():
    assert new_id >= len(vocab) and all(i < len(vocab) for i in old_ids)
    assert "".join(nav_tok.convert_ids_to_tokens(old_ids)) == new.convert_ids_to_tokens(new_id)
  fmt = ChatFormatter(new)
  assert fmt.decode(fmt.encode_assistant("ok")) == "ok"


def test_recorded_questions_carry_the_oracles_answers_for_the_policys_own_steps():
  from rti_jax import config as config_lib
  from rti_jax.envs import registry
  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.intervention.rules_navigation import NavigationRuleValidator, NavigationRuleVerifier
  from rti_jax.policy.evaluate import load_policy

  cfg = config_lib.load_config("navigation", [])
  source = registry.task_source(cfg)
  tasks = [t for t in source.train if t.needs_disambiguation][:3]
  model, tok, fmt = load_policy(POLICY)
  backend = JaxBackend(model, max_cache_len=2048, pad_id=tok.pad_token_id)
  corrections: list = []
  steps = judge_sft.record_steps(tasks, source.env_factory, backend, fmt, registry.rule_roles("navigation"),
                                 config_lib.intervention_config(cfg, "navigation"), config_lib.rollout_config(cfg),
                                 task_id=source.task_id, seed=3, corrector_temperature=1.0, corrections=corrections)
  val = [s for s in steps if s.role == "validator"]
  ver = [s for s in steps if s.role == "verifier"]
  assert len(val) >= len(tasks) and all(s.corrected is None for s in val)
  assert all(s.truth == NavigationRuleValidator().judge(s.ctx) for s in val)
  assert all(s.truth == NavigationRuleVerifier().judge(s.ctx, s.corrected) for s in ver)
  flagged = sum(not s.truth.is_valid for s in val)
  assert flagged >= 1 and len(ver) <= flagged  # only flagged steps get a rewrite to review
  assert all(s.ctx.history[0]["content"] == s.ctx.user_query for s in steps)
  assert len(corrections) == len(ver)  # every sampled rewrite went to the Verifier
  for (p_cal, ids), s in zip(corrections, ver):
    assert fmt.decode(ids) == s.corrected and "Suggested direction:" in fmt.tokenizer.decode(p_cal)


def test_replays_default_to_one_episode_per_task_and_must_be_at_least_one(capsys):
  from experiments import judge_sft as exp

  assert exp.parse_args(["--replays", "3"]).replays == 3 and exp.parse_args([]).replays == 1
  with pytest.raises(SystemExit):
    exp.parse_args(["--replays", "0"])
  assert "--replays: expected an integer >= 1, got 0" in capsys.readouterr().err


JUDGE = "policies/navigation_judge"


@pytest.mark.slow
def test_the_shipped_judge_reads_the_agents_text_as_its_base_and_judges_scripted_steps(nav_tok):
  """``policies/navigation_judge``: the base policy's episodes encode to the same ids under its
  tokenizer; asked greedily (the card's budget), it flags scripted drafts that plan the route to a
  wrong first result and passes the first searches, in well-formed JSON."""
  from transformers import AutoTokenizer

  from rti_jax.envs import navigation as nav
  from rti_jax.generation.base import SamplingParams
  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.intervention.judges import LLMValidator
  from rti_jax.intervention.rules_navigation import NavigationRuleValidator
  from rti_jax.policy.evaluate import load_policy
  from rti_jax.policy.sft_data import OracleAgent, TrustingAgent, play, scripted, step_context

  build = json.loads(open(f"{JUDGE}/build.json").read())
  tok = AutoTokenizer.from_pretrained(JUDGE, local_files_only=True)
  bench = nav.load_benchmark("tiny")
  env = nav.NavigationEnv(bench.world)
  tasks = [t for t in bench.test if t.needs_disambiguation][:8]
  wrong, first = [], []
  for task in tasks:
    msgs = play(env, scripted(TrustingAgent, task, check=True), task)  # in the policy's format
    for text in (m["content"] for m in msgs):
      assert tok.encode(text, add_special_tokens=False) == nav_tok.encode(text, add_special_tokens=False)
    k = [i for i, m in enumerate(msgs) if m["role"] == "assistant"][1]  # the route after trusting first results
    env.replay(task, [m["content"] for m in msgs[:k] if m["role"] == "assistant"])
    ctx = step_context(msgs[:k], msgs[k]["content"], env)
    if not NavigationRuleValidator().judge(ctx).is_valid:
      wrong.append(ctx)
    oracle = play(env, scripted(OracleAgent, task, check=True), task)
    env.replay(task, [])
    first.append(step_context(oracle[:2], oracle[2]["content"], env))
  assert len(wrong) >= 6
  model, _, fmt = load_policy(JUDGE)
  llm = JudgeLLM(JaxBackend(model, max_cache_len=2048, pad_id=tok.pad_token_id), judge_sft.judge_formatter(fmt),
                 SamplingParams(max_new_tokens=build["judge_max_new_tokens"], temperature=0.0), 2048)
  said = LLMValidator(llm).validate(wrong + first)
  assert not any(j.malformed or j.over_context for j in said)
  flagged = [not j.is_valid for j in said]
  assert sum(flagged[:len(wrong)]) >= len(wrong) - 2 and sum(flagged[len(wrong):]) <= 1, flagged


TELECOM_JUDGE = "policies/telecom_judge"


@pytest.mark.slow
def test_the_shipped_telecom_judge_reads_the_agents_text_as_its_base_and_answers_in_form():
  """``policies/telecom_judge``: the scripted Telecom episodes encode to the same ids under its
  tokenizer as under ``telecom_base``'s; asked greedily (the card's budget) as Validator about the
  mistaken decisive steps of test tasks (each one the rule oracle flags) and as Verifier about the
  checklist's step in their place, every answer is well-formed and within its context."""
  from transformers import AutoTokenizer

  from rti_jax.envs.telecom.checklist_agent import ChecklistAgent
  from rti_jax.envs.telecom.tasks import load_split
  from rti_jax.generation.base import SamplingParams
  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.intervention.judges import LLMValidator, LLMVerifier
  from rti_jax.policy.evaluate import load_policy
  from rti_jax.policy.sft_example import play, step_context
  from rti_jax.policy.telecom_sft_data import MistakeAgent, decisive_index, judge_draft, make_env

  build = json.loads(open(f"{TELECOM_JUDGE}/build.json").read())
  assert build["init"] == "policies/telecom_base" and build["domain"] == "telecom"
  base = AutoTokenizer.from_pretrained(build["init"], local_files_only=True)
  tok = AutoTokenizer.from_pretrained(TELECOM_JUDGE, local_files_only=True)
  assert len(tok) > len(base)
  env = make_env()
  ctxs, fixes = [], []
  for task in load_split("test")[::13]:
    good, bad = play(env, ChecklistAgent(task), task), play(env, MistakeAgent(task), task)
    for text in (m["content"] for m in good + bad):
      assert tok.encode(text, add_special_tokens=False) == base.encode(text, add_special_tokens=False)
    d = decisive_index(good)
    if d is None:
      continue
    env.reset(task)
    ctx = step_context(good[:d], bad[d]["content"], env, "telecom")
    assert not judge_draft(ctx).is_valid
    ctxs.append(ctx)
    fixes.append(good[d]["content"])
  assert len(ctxs) >= 2, len(ctxs)
  model, _, fmt = load_policy(TELECOM_JUDGE)
  llm = JudgeLLM(JaxBackend(model, max_cache_len=4096, pad_id=tok.pad_token_id), judge_sft.judge_formatter(fmt),
                 SamplingParams(max_new_tokens=build["judge_max_new_tokens"], temperature=0.0), 4096)
  said = LLMValidator(llm).validate(ctxs) + LLMVerifier(llm).verify(ctxs, fixes)
  assert not any(j.malformed or j.over_context for j in said), said
