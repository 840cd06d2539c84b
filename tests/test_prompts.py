"""The intervention prompt files: their own wording (no long run of words shared with the paper's
App. A.1 text), the placeholders the code fills in, and complete rendering through the real loaders."""

from __future__ import annotations

import dataclasses
import re
import string
from importlib import resources
from pathlib import Path

import pytest

from rti_jax.envs import registry
from rti_jax.intervention.judges import (
  StepContext,
  ValidatorJudgement,
  corrector_prompt,
  feedback_message,
  load_template,
  paper_correction_message,
  validator_prompt,
  verifier_prompt,
)

#: Every registered environment (each renders its evidence through its own or the generic prompts).
DOMAINS = tuple(registry.names())
PAPER = Path(__file__).resolve().parents[1].parent / "shared" / "paper" / "rti-2610.13438.txt"
MAX_SHARED_RUN = 12  # the longest run of consecutive words a prompt may share with the paper

PROMPT_DIR = resources.files("rti_jax.intervention") / "prompts"
PROMPT_FILES = sorted(p.name for p in PROMPT_DIR.iterdir() if p.name.endswith(".txt"))

# The placeholders each template holds: exactly the keys that judges.py passes to it.
PLACEHOLDERS = {
  "correction_feedback": {"diagnosis", "suggest_next"},
  "paper_correction": {"draft", "diagnosis", "suggest_next", "evidence", "domain_rule"},
  "navigation_validator": {"history_json", "response_text", "order", "ref", "gt"},
  "navigation_corrector": {"history", "tools", "original_response", "feedback_json", "order", "ref", "gt"},
  "navigation_verifier": {"user_prompt", "tools", "history", "original", "corrected"},
  "tau2_validator": {"completion_note", "history_json", "response_text", "agent_actions", "user_actions_block",
                     "domain_rule", "evaluation_criteria"},
  "tau2_corrector": {"history", "tools", "evaluation_criteria", "original_response", "feedback_json", "domain_rule"},
  "tau2_verifier": {"user_prompt", "evaluation_criteria", "tools", "history", "original", "corrected"},
  "tau2_domain_telecom": {"user_side_tools", "agent_side_tools"},
  "tau2_domain_retail": set(),
  "tau2_domain_airline": set(),
  "generic_validator": {"history_json", "response_text", "evidence"},
  "generic_corrector": {"history", "tools", "original_response", "feedback_json", "evidence"},
  "generic_verifier": {"user_prompt", "evidence", "tools", "history", "original", "corrected"},
}


def words(text: str) -> list[str]:
  """Lower-cased alphanumeric words; everything else separates them."""
  return [w for w in re.split(r"[^0-9a-z]+", text.lower()) if w]


def longest_shared_run(a: list[str], b: list[str]) -> tuple[int, str]:
  """The longest run of consecutive words that occurs in both ``a`` and ``b``, and its text."""
  where: dict[str, list[int]] = {}
  for j, w in enumerate(b):
    where.setdefault(w, []).append(j)
  best, end = 0, 0
  prev: dict[int, int] = {}
  for i, w in enumerate(a):
    cur = {j: prev.get(j - 1, 0) + 1 for j in where.get(w, ())}
    for n in cur.values():
      if n > best:
        best, end = n, i + 1
    prev = cur
  return best, " ".join(a[end - best:end])


def placeholders(tpl: string.Template) -> set[str]:
  return {m.group("named") or m.group("braced") for m in tpl.pattern.finditer(tpl.template)
          if m.group("named") or m.group("braced")}


@pytest.fixture(scope="module")
def paper_words():
  if not PAPER.is_file():
    pytest.skip(f"the paper's text is not at {PAPER}; the shared-wording check needs it")
  return words(PAPER.read_text(encoding="utf-8"))


def test_longest_shared_run_counts_words():
  assert longest_shared_run(words("a b c d"), words("x B-c d y")) == (3, "b c d")
  assert longest_shared_run(words("one"), words("two")) == (0, "")


def test_every_prompt_file_is_known():
  assert {f.removesuffix(".txt") for f in PROMPT_FILES} == set(PLACEHOLDERS)


@pytest.mark.parametrize("name", PROMPT_FILES)
def test_prompt_shares_no_long_run_of_words_with_the_paper(name, paper_words):
  n, run = longest_shared_run(words((PROMPT_DIR / name).read_text(encoding="utf-8")), paper_words)
  assert n <= MAX_SHARED_RUN, f"{name} shares {n} consecutive words with the paper: {run!r}"


def _contexts():
  """One StepContext per domain whose every field is a distinct sentinel string."""
  history = ({"role": "user", "content": "HISTORY-SENTINEL"},)
  tools = ({"type": "function", "function": {"name": "TOOLS-SENTINEL"}},)
  nav = {"order_level": "ORDER-SENTINEL", "places": "REF-SENTINEL", "route": "GT-SENTINEL"}
  tau2 = {"completion_note": "NOTE-SENTINEL", "agent_actions": ["AGENT-ACTIONS-SENTINEL"],
          "user_actions": ["USER-ACTIONS-SENTINEL"], "evaluation_criteria": {"CRITERIA-SENTINEL": 1},
          "user_side_tools": ["USER-SIDE-SENTINEL"], "agent_side_tools": ["AGENT-SIDE-SENTINEL"]}
  return {d: StepContext("QUERY-SENTINEL", history, "DRAFT-SENTINEL", tools, nav if d == "navigation" else tau2, d)
          for d in DOMAINS}


JUDGEMENT = ValidatorJudgement(False, ("ERROR-SENTINEL",), "DIAG-SENTINEL", "NEXT-SENTINEL")
NAV_REFERENCE = {"ORDER-SENTINEL", "REF-SENTINEL", "GT-SENTINEL"}
TAU2_REFERENCE = {"NOTE-SENTINEL", "AGENT-ACTIONS-SENTINEL", "USER-ACTIONS-SENTINEL"}


@pytest.mark.parametrize("name", sorted(PLACEHOLDERS))
def test_template_holds_the_placeholders_the_code_fills(name):
  assert placeholders(load_template(name)) == PLACEHOLDERS[name]


@pytest.mark.parametrize("domain", DOMAINS)
def test_prompts_render_every_field_the_code_passes(domain):
  ctx = _contexts()[domain]
  v, c, r = validator_prompt(ctx), corrector_prompt(ctx, JUDGEMENT), verifier_prompt(ctx, "CORRECTED-SENTINEL")
  for p in (v, c, r):
    assert not re.search(r"\$\{?[A-Za-z_]", p), p  # no placeholder left unfilled
  common = {"HISTORY-SENTINEL", "DRAFT-SENTINEL"}
  if domain == "navigation":
    expect_v = common | NAV_REFERENCE
    expect_c = common | NAV_REFERENCE | {"TOOLS-SENTINEL", "DIAG-SENTINEL", "NEXT-SENTINEL", "ERROR-SENTINEL"}
    hidden_r = NAV_REFERENCE | {"CRITERIA-SENTINEL"}
  else:
    expect_v = common | TAU2_REFERENCE | {"CRITERIA-SENTINEL"}
    expect_c = common | {"TOOLS-SENTINEL", "DIAG-SENTINEL", "NEXT-SENTINEL", "ERROR-SENTINEL", "CRITERIA-SENTINEL"}
    hidden_r = TAU2_REFERENCE
    if domain == "telecom":
      expect_v |= {"USER-SIDE-SENTINEL", "AGENT-SIDE-SENTINEL"}
      expect_c |= {"USER-SIDE-SENTINEL", "AGENT-SIDE-SENTINEL"}
  expect_r = common | {"QUERY-SENTINEL", "TOOLS-SENTINEL", "CORRECTED-SENTINEL"}
  if domain != "navigation":
    expect_r |= {"CRITERIA-SENTINEL"}  # the tau2 Verifier checks arguments against the criteria
  for prompt, expected in ((v, expect_v), (c, expect_c), (r, expect_r)):
    assert {s for s in expected if s not in prompt} == set()
  assert {s for s in hidden_r if s in r} == set()  # the Verifier sees visible information only


@pytest.mark.parametrize("domain", DOMAINS)
def test_rendered_prompts_share_no_long_run_of_words_with_the_paper(domain, paper_words):
  """With every field empty, the text around each placeholder joins up; it must stay our own too."""
  ctx = StepContext("", (), "", (), {}, domain)
  blank = ValidatorJudgement(False)
  for p in (validator_prompt(ctx), corrector_prompt(ctx, blank), verifier_prompt(ctx, ""),
            paper_correction_message(ctx, blank)):
    n, run = longest_shared_run(words(p), paper_words)
    assert n <= MAX_SHARED_RUN, f"{domain}: {n} consecutive words shared with the paper: {run!r}"


def test_feedback_message_fills_both_fields():
  text = feedback_message(JUDGEMENT)
  assert "DIAG-SENTINEL" in text and "NEXT-SENTINEL" in text and "$" not in text
  # A rule Validator's visible-only suggestion replaces the one built from the evidence.
  text = feedback_message(ValidatorJudgement(False, (), "DIAG-SENTINEL", "NEXT-SENTINEL", visible_suggest_next="SEEN-SENTINEL"))
  assert "SEEN-SENTINEL" in text and "NEXT-SENTINEL" not in text


@pytest.mark.parametrize("domain", DOMAINS)
def test_paper_correction_message_holds_the_correctors_inputs(domain):
  """App. A.1's Corrector inputs beyond p_roll: the draft, the diagnosis, the suggestion built from the
  evidence (not the visible-only one), the evidence itself and, per tau2 domain, its rule."""
  ctx = _contexts()[domain]
  judgement = dataclasses.replace(JUDGEMENT, visible_suggest_next="SEEN-SENTINEL")
  text = paper_correction_message(ctx, judgement)
  assert not re.search(r"\$\{?[A-Za-z_]", text), text
  expected = {"DRAFT-SENTINEL", "DIAG-SENTINEL", "NEXT-SENTINEL"}
  if domain == "navigation":
    expected |= NAV_REFERENCE
  else:
    expected |= TAU2_REFERENCE | {"CRITERIA-SENTINEL"}
  if domain == "telecom":
    expected |= {"USER-SIDE-SENTINEL", "AGENT-SIDE-SENTINEL"}
  assert {s for s in expected if s not in text} == set()
  assert "SEEN-SENTINEL" not in text


@pytest.fixture
def unprompted_env():
  """An environment registered without prompts of its own (the generic ones render its l)."""
  from rti_jax.envs.source import TaskSource

  spec = registry.register(registry.EnvSpec("prompt_probe", source=lambda cfg: TaskSource([], [], None, str, {}, "prompt_probe")))
  yield spec.name
  registry.unregister(spec.name)


def test_an_environment_without_prompts_gets_the_generic_ones_with_its_evidence(unprompted_env, paper_words):
  ctx = StepContext("QUERY-SENTINEL", ({"role": "user", "content": "HISTORY-SENTINEL"},), "DRAFT-SENTINEL",
                    ({"type": "function", "function": {"name": "TOOLS-SENTINEL"}},), {"answer": "EVIDENCE-SENTINEL"},
                    unprompted_env)
  v, c, r = validator_prompt(ctx), corrector_prompt(ctx, JUDGEMENT), verifier_prompt(ctx, "CORRECTED-SENTINEL")
  m = paper_correction_message(ctx, JUDGEMENT)
  for p in (v, c, r, m):
    assert not re.search(r"\$\{?[A-Za-z_]", p), p
    assert "EVIDENCE-SENTINEL" in p and "DRAFT-SENTINEL" in p
    assert longest_shared_run(words(p), paper_words)[0] <= MAX_SHARED_RUN
  assert "TOOLS-SENTINEL" in c and "CORRECTED-SENTINEL" in r and "QUERY-SENTINEL" in r


def test_an_unknown_domain_is_an_error_naming_the_registered_ones():
  ctx = StepContext("", (), "", (), {}, "no_such_env")
  with pytest.raises(ValueError, match=r"unknown environment 'no_such_env'; registered: \[.*'navigation'"):
    validator_prompt(ctx)
