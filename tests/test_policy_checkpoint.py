"""The shipped tiny policy (``policies/navigation_base``, the default): transformers loads it with the
same logits as our Flax Qwen3, and its measured behaviour has the intended shape on a few tasks."""

from __future__ import annotations

import numpy as np
import pytest

from rti_jax.envs import navigation as nav
from rti_jax.policy import DEFAULT_POLICY_DIR
from rti_jax.policy import evaluate as ev
from rti_jax.policy.tokenizer import CHAT_TEMPLATE

POLICY = DEFAULT_POLICY_DIR


@pytest.fixture(scope="module")
def bench():
  return nav.load_benchmark("tiny")


@pytest.fixture(scope="module")
def policy():
  assert (POLICY / "model.safetensors").is_file(), f"shipped checkpoint missing under {POLICY}"
  return ev.load_policy(POLICY)


def test_checkpoint_is_small_and_complete():
  files = {p.name for p in POLICY.iterdir()}
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
  assert sum(p.stat().st_size for p in POLICY.iterdir()) < 10 * 2**20


@pytest.mark.slow
def test_transformers_logits_equal_flax_logits(bench, policy):
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  model, tok, fmt = policy
  hf_tok = AutoTokenizer.from_pretrained(str(POLICY), local_files_only=True)
  assert hf_tok.chat_template == CHAT_TEMPLATE
  env = nav.NavigationEnv(bench.world)
  task = bench.test[0]
  msgs = [m for m in nav.run_episode(env, nav.OracleAgent(task), task).messages]
  ids = hf_tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
  assert len(ids) > 600
  hf = AutoModelForCausalLM.from_pretrained(str(POLICY), local_files_only=True, dtype=torch.float32).eval()
  with torch.no_grad():
    want = hf(torch.tensor([ids])).logits[0].numpy()
  got = np.asarray(model(np.asarray([ids], np.int32)))[0]
  np.testing.assert_allclose(got[:, :want.shape[-1]], want, atol=2e-4, rtol=1e-4)


@pytest.mark.slow
def test_behaviour_shape_on_test_tasks(bench, policy):
  """Greedy: solves tasks without an ambiguous name, trusts the first result on tasks with
  one; given the Validator's feedback it re-searches with the region and then succeeds."""
  from rti_jax.generation.jax_backend import JaxBackend

  model, tok, fmt = policy
  backend = JaxBackend(model, max_cache_len=2048, pad_id=tok.pad_token_id)
  plain = [t for t in bench.test if not t.needs_disambiguation][:4]
  need = [t for t in bench.test if t.needs_disambiguation and not any(s.hinted for s in t.stops)][:4]
  out = ev.rollout_behaviour(backend, fmt, bench.world, plain + need, 1, 0.0)
  assert out["plain"]["pass_rate"] >= 0.75
  assert out["disambiguation"]["pass_rate"] <= 0.25
  iv = ev.intervention_behaviour(backend, fmt, bench.world, need, temperature=0.0)
  assert iv["research_suggestions"] >= 2
  assert iv["follows_research_suggestion"] >= 0.5
  assert iv["corrections_applied"] >= 2 and iv["mean_applied_ppl"] <= 5.0
  assert iv["success_rate"] >= 0.5


@pytest.mark.slow
def test_shipped_build_copies_coordinates_and_reads_names_teacher_forced():
  """The build's measured properties (model card): given the right name, it copies that place's
  coordinate out of the tool results; its searches read the request's names, and the direction
  call's names follow the results more often than not (``diagnostics.name_copy_check`` on
  episodes of the 40 train tasks the build held out)."""
  from experiments.diagnostics import name_copy_check

  out = name_copy_check.measure(str(POLICY), episodes=6)
  assert out["coordinates"]["n"] >= 15
  assert out["coordinates"]["copied"] >= 0.9
  assert out["search names"]["n"] >= 12
  assert out["search names"]["argmax is a request name"] >= 0.8
  assert out["search names"]["copied"] >= 0.8  # a random one of the request's 2-4 names: ~0.35
  assert out["per search (copied)"]["search 1"] >= 0.8
  assert out["names after results"]["copied"] >= 0.85
