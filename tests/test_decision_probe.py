"""The decision probe (experiments/diagnostics/decision_probe.py) against transformers on the shipped policy.

The probe's figures are first-token probabilities of scripted second turns, read off the JAX
model's teacher-forced log-probs of whole encoded episodes. The reference renders each second
turn's prompt with the tokenizer's chat template alone (``add_generation_prompt=True``) and runs
transformers' Qwen3 on it: the two agree only if the turn spans, the alignment of the log-probs
and the model all agree.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from experiments.diagnostics import decision_probe

POLICIES = pathlib.Path(__file__).resolve().parent.parent / "policies"


def test_turn_spans():
  assert decision_probe.turn_spans([False, True, True, False, True, False, False, True]) == [(1, 3), (4, 5), (7, 8)]
  assert decision_probe.turn_spans([]) == [] and decision_probe.turn_spans([True]) == [(0, 1)]


# (policy, whether the scripted episodes carry the check line): the policy's own format, and the
# other one, which the probe must read as faithfully (only the behaviour checks need the former)
@pytest.fixture(scope="module", params=[("navigation_base", True), ("navigation_base", False)], ids=["own", "other"])
def shipped(request):
  from models import from_pretrained
  from rti_jax import objectives
  from rti_jax.envs import navigation as nav
  from rti_jax.envs.navigation.agents import NaiveAgent, OracleAgent
  from rti_jax.policy.check_line import policy_check_line
  from rti_jax.policy.sft_data import play, scripted
  from rti_jax.rollout import ChatFormatter

  name, check = request.param
  policy = str(POLICIES / name)
  own = policy_check_line(policy) == check
  bench = nav.load_benchmark("tiny")
  held = bench.train[-40:]  # the tasks the shipped build held out of SFT
  tasks = [t for t in held if t.needs_disambiguation][:2] + [t for t in held if not t.needs_disambiguation][:2]
  tok = AutoTokenizer.from_pretrained(policy)
  fmt = ChatFormatter(tok)
  model, _ = from_pretrained(policy)
  env = nav.NavigationEnv(bench.world)
  probe = decision_probe.DecisionProbe(tasks, env, fmt, int(tok.pad_token_id), check=check)

  def logp_fn(_params, ids, mask):
    return objectives.next_token_logprobs(model(ids, mask), ids)

  episodes = {(t.task_id, kind): play(env, scripted(agent, t, check), t) for t in tasks
              for kind, agent in (("oracle", OracleAgent), ("naive", NaiveAgent))}
  return tasks, tok, probe, jax.jit(logp_fn), episodes, policy, check, own


def _reference_token_prob(torch_model, tok, messages, word: str | None = None) -> float:
  """P(a token of the second assistant turn | everything before it), by transformers: its first
  token, or with ``word`` the first token after the turn's text up to ``word`` (the check word
  after ``Check: ``, or the decision after the check line's newline)."""
  second = [i for i, m in enumerate(messages) if m["role"] == "assistant"][1]
  prompt = tok.apply_chat_template(messages[:second], add_generation_prompt=True, tokenize=True, return_dict=False)
  full = tok.apply_chat_template(messages[:second + 1], add_generation_prompt=False, tokenize=True, return_dict=False)
  assert full[:len(prompt)] == prompt
  if word is not None:
    text = messages[second]["content"]
    prefix = tok.encode(text[:text.index(word) + len(word)], add_special_tokens=False)
    assert full[len(prompt):len(prompt) + len(prefix)] == prefix
    prompt = full[:len(prompt) + len(prefix)]
  with torch.no_grad():
    logits = torch_model(torch.tensor([prompt])).logits[0, -1].double()
  return float(torch.softmax(logits, -1)[full[len(prompt)]])


@pytest.mark.slow
def test_probe_matches_transformers(shipped):
  tasks, tok, probe, logp_fn, episodes, policy, check, own = shipped
  got = probe.measure(logp_fn, None)
  ref_model = Qwen3ForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
  need = [t for t in tasks if t.needs_disambiguation]
  plain = [t for t in tasks if not t.needs_disambiguation]
  after = "\n" if check else None  # the decision: right after the check line, else the turn's first token
  ref = lambda t, kind, word=after: _reference_token_prob(ref_model, tok, episodes[(t.task_id, kind)], word)  # noqa: E731
  np.testing.assert_allclose(got["p_research"], np.mean([ref(t, "oracle") for t in need]), rtol=2e-3, atol=1e-6)
  np.testing.assert_allclose(got["p_trust"], np.mean([ref(t, "naive") for t in need]), rtol=2e-3, atol=1e-6)
  np.testing.assert_allclose(got["p_plan_plain"], np.mean([ref(t, "oracle") for t in plain]), rtol=2e-3, atol=1e-6)
  # In its own format the shipped policy trusts an ambiguous first result (the base policy's
  # designed mistake) and rarely re-searches on its own.
  assert got["p_trust"] > 0.5 > got["p_research"] or not own
  assert np.isfinite(got["plain_logp"]) and got["plain_logp"] < 0
  if check:
    np.testing.assert_allclose(got["p_check_odd"], np.mean([ref(t, "oracle", "Check: ") for t in need]), rtol=2e-3, atol=1e-6)
    np.testing.assert_allclose(got["p_check_all_plain"], np.mean([ref(t, "oracle", "Check: ") for t in plain]),
                               rtol=2e-3, atol=1e-6)
    # The check line tells the two kinds of result apart (a policy without it cannot: docs/tiny_policy.md).
    assert got["p_check_odd"] > 0.5 and got["p_check_all_plain"] > 0.5 or not own
  else:
    assert "p_check_odd" not in got


def test_probe_rejects_an_empty_task_list():
  with pytest.raises(ValueError, match="at least one validation task"):
    decision_probe.DecisionProbe([], None, None, 0)
