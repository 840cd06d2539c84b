"""A policy continued into a setting with hidden-city places: whole tokens for the new places
(checked against the old tokenizer's encodings and the words themselves), a grown embedding table
(checked against the model it grew from), and correction examples written under the paper's
Corrector message (checked against the message built independently from the replayed step)."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from transformers import AutoTokenizer

from experiments.navigation_sft import whole_place_tokens
from models.qwen import Qwen
from rti_jax.config import ConfigError
from rti_jax.envs import navigation as nav
from rti_jax.envs.navigation.hidden import ASK_USER
from rti_jax.envs.navigation.world import base_size
from rti_jax.intervention.prompting import paper_correction_message
from rti_jax.intervention.rules_navigation import NavigationRuleValidator
from rti_jax.policy import build_config, sft, sft_data
from rti_jax.policy.sft_example import play, step_context
from rti_jax.policy.tokenizer import add_whole_pretokens
from rti_jax.rollout import ChatFormatter

POLICY = "policies/navigation_base"


@pytest.fixture(scope="module")
def worlds():
  """(the shipped policy's tokenizer, the share-0 benchmark, the share-0.3 benchmark)."""
  return (AutoTokenizer.from_pretrained(POLICY, local_files_only=True), nav.load_benchmark("tiny"),
          nav.load_benchmark("tiny", hidden_city_share=0.3))


def _pieces(tok, text):
  return tok.convert_ids_to_tokens(tok.encode(text, add_special_tokens=False))


def test_new_places_become_whole_tokens_and_old_texts_encode_as_before(worlds, tmp_path):
  tok, plain, hidden = worlds
  new_pois = hidden.world.pois[base_size(hidden.world.config):]
  assert new_pois and all(len(_pieces(tok, f"{p.name} {p.location}")) > 2 for p in new_pois)
  texts = [t for p in hidden.world.pois for t in (p.name, f"{p.name} {p.location}")]
  new, ids = add_whole_pretokens(tok, texts)
  for p in new_pois:
    # the layout of every place the policy learned: "Name " then "lon,lat", each one token
    assert _pieces(new, f"{p.name} {p.location}") == [f"{p.name} ".replace(" ", "\u0120"), p.location]
    assert _pieces(new, p.name) == [p.name.replace(" ", "\u0120")]
  assert len(set(ids)) == len(ids) == len(dict.fromkeys(s for t in texts for s, _ in
                                                         tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(t)))
  # every special and markup token keeps its id; the new ids follow the old ones
  for t in tok.get_vocab():
    if t.startswith("<"):
      assert new.convert_tokens_to_ids(t) == tok.convert_tokens_to_ids(t)
  assert sorted(new.get_vocab().values()) == list(range(len(new)))
  # what the policy saw before encodes to the same ids; the new setting's texts round-trip
  old_env, new_env = nav.NavigationEnv(plain.world), nav.NavigationEnv(hidden.world)
  old_texts = sft_data.corpus_texts(plain.train[:25], old_env, check=True)
  assert all(new.encode(s) == tok.encode(s) for s in old_texts)
  hidden_tasks = [t for t in hidden.train if t.hidden_city][:10]
  for s in sft_data.corpus_texts(hidden_tasks, new_env, check=True):
    assert new.decode(new.encode(s)) == s
  new.save_pretrained(tmp_path)
  again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
  assert all(again.encode(s) == new.encode(s) for s in old_texts[:200])


def test_whole_place_tokens_start_new_names_from_the_old_names(worlds):
  tok, plain, hidden = worlds
  assert whole_place_tokens(tok, nav.NavigationEnv(plain.world)) == (tok, {})
  env = nav.NavigationEnv(hidden.world)
  new, like = whole_place_tokens(tok, env)
  assert sorted(like) == list(range(len(tok), len(new)))
  old_names = sft_data.place_name_token_ids(tok, env)
  new_names = set(sft_data.place_name_token_ids(new, env)) - set(old_names)
  assert new_names and all(like[i] == old_names for i in new_names)
  locations = {p.location for p in hidden.world.pois}
  new_coords = [i for i in like if new.convert_ids_to_tokens(i) in locations]
  assert len(new_coords) == len(hidden.world.pois) - base_size(hidden.world.config)
  old_coords = {tok.convert_ids_to_tokens(j) for j in like[new_coords[0]]}
  assert all(like[i] == like[new_coords[0]] for i in new_coords)
  assert old_coords == {p.location for p in plain.world.pois}  # each old place's whole coordinate
  others = set(like) - new_names - set(new_coords)
  assert others and all(len(like[i]) > len(old_names) for i in others)  # partial merges: every ordinary token


def test_grown_model_keeps_every_old_logit_and_starts_new_rows_from_their_likes():
  cfg = sft.tiny_qwen3_config(100, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                              intermediate_size=64, pad_token_id=0, eos_token_id=1)
  model = Qwen(cfg, rngs=nnx.Rngs(0))
  sft.scale_embeddings(model, 1.0, 0.5, seed=3)
  old = np.asarray(model.embed.embedding[...]).copy()
  assert old.shape == (128, 32)  # 100 tokens, rows up to the next multiple of 64
  # a tokenizer of 100 tokens grown to 130: new ids 100..129 (the old padding rows, then new rows)
  grown = sft.grow_vocabulary(model, 130, {100: [7], 101: [3, 4, 5, 6], 129: list(range(10, 60))}, seed=1)
  assert grown.config.vocab_size == 192 and grown.embed.embedding.shape == (192, 32)
  # the model it grew from is untouched (its logits below are an independent reference)
  assert model.config.vocab_size == 128
  np.testing.assert_array_equal(np.asarray(model.embed.embedding[...]), old)
  emb = np.asarray(grown.embed.embedding[...])
  np.testing.assert_array_equal(emb[:100], old[:100])  # every token of the old tokenizer
  np.testing.assert_array_equal(emb[102:128], old[102:128])  # padding rows no new id took
  np.testing.assert_array_equal(emb[100], old[7])  # one like: its row exactly
  for i, group in ((101, old[3:7]), (129, old[10:60])):
    z = (emb[i] - group.mean(0)) / group.std(0)  # the group's mean and spread, not a copy of a row
    assert 0.4 < z.std() < 1.8 and abs(z.mean()) < 0.8
    assert not any(np.allclose(emb[i], r) for r in group)
  assert not np.any(emb[128]) and not np.any(emb[130:])
  ids = jnp.asarray([[5, 9, 40, 3, 70]])
  a = np.asarray(model(ids, jnp.ones_like(ids)))
  b = np.asarray(grown(ids, jnp.ones_like(ids)))
  np.testing.assert_allclose(b[..., :100], a[..., :100], rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="like"):
    sft.grow_vocabulary(model, 130, {100: [500]})
  with pytest.raises(ValueError, match="like"):
    sft.grow_vocabulary(model, 130, {100: []})


def test_paper_correction_examples_carry_the_corrector_message_and_an_honest_target(worlds):
  tok, _, hidden = worlds
  env = nav.NavigationEnv(hidden.world)
  new, _ = whole_place_tokens(tok, env)
  fmt = ChatFormatter(new)
  task = next(t for t in hidden.train if t.hidden_city)
  trusting = play(env, sft_data.scripted(sft_data.TrustingAgent, task, True), task)
  oracle = play(env, sft_data.scripted(nav.OracleAgent, task, True), task)
  k = [i for i, m in enumerate(trusting) if m["role"] == "assistant"][1]
  a1 = [i for i, m in enumerate(oracle) if m["role"] == "assistant"][1]
  target = oracle[a1]["content"]
  assert ASK_USER in target  # on a hidden-city task the honest next step asks the user
  ex = sft_data.correction_example(fmt, env, task, trusting[:k], trusting[k]["content"], target, message="paper")
  assert ex is not None
  # the same step, judged again here: its paper message is the last user turn of p_cal
  env.replay(task, [m["content"] for m in trusting[:k] if m["role"] == "assistant"])
  ctx = step_context(trusting[:k], trusting[k]["content"], env)
  judgement = NavigationRuleValidator().judge(ctx)
  assert not judgement.is_valid
  message = paper_correction_message(ctx, judgement)
  assert task.stops[0].city in json.dumps(ctx.evidence)  # the evidence names the hidden city
  start = ex.loss_mask.index(True)
  prompt, trained = new.decode(list(ex.token_ids[:start])), new.decode(list(ex.token_ids[start:]))
  assert prompt.endswith(f"<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n")
  assert trained == target + "<|im_end|>\n" or trained == target + "<|im_end|>"
  assert all(ex.loss_mask[start:]) and not any(ex.loss_mask[:start])
  feedback = sft_data.correction_example(fmt, env, task, trusting[:k], trusting[k]["content"], target)
  assert feedback is not None and message not in new.decode(list(feedback.token_ids))
  with pytest.raises(ValueError, match="correction"):
    sft_data.MixConfig(correction="oracle")


@pytest.mark.parametrize("override, key", [("data.correction=oracle", "data.correction"),
                                           ("data.hidden_city_share=1.5", "data.hidden_city_share")])
def test_bad_hidden_city_build_settings_are_named(override, key):
  with pytest.raises(ConfigError, match=key):
    build_config.load_navigation("sft_navigation", [override])


@pytest.mark.slow
def test_reading_check_plays_the_held_out_tasks_in_their_own_setting(worlds, nav_policy):
  """The builder's teacher-forced reading check on hidden-city tasks: their places exist only in
  the hidden-city world, so the check must play them there (the tiny setting's world lacks them)."""
  from experiments.navigation_sft import reading_check
  from rti_jax.policy import evaluate as ev

  _, _, hidden = worlds
  model, tok, fmt = ev.load_policy(nav_policy)
  tasks = [t for t in hidden.train if t.hidden_city][:2]
  env = nav.NavigationEnv(hidden.world)
  out = reading_check(model, tok, fmt, 1, tasks, env)
  assert set(out) == {"swapped_first_turns", "episodes"}
  # a word-level tokenizer has no whole-name tokens to score, so the figures are empty, not made up
  assert all(v is None or 0.0 <= v <= 1.0 for part in out.values() for k, v in part.items() if k != "by_search")
  with pytest.raises(KeyError):  # the same tasks in the tiny setting's world: their places are missing
    reading_check(model, tok, fmt, 1, tasks, nav.NavigationEnv(worlds[1].world))
