"""SFT data layout, the SFT loss against a numpy re-derivation, shared-prefix equality,
and a tiny run whose loss decreases (deterministic from its seed)."""

from __future__ import annotations

import collections
import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.qwen import Qwen
from rti_jax.envs import navigation as nav
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.policy import sft, sft_data, sft_swap
from rti_jax.policy.tokenizer import build_tokenizer
from rti_jax.rollout import ChatFormatter


@pytest.fixture(scope="module")
def setup():
  bench = nav.load_benchmark("tiny")
  env = nav.NavigationEnv(bench.world)
  tasks = bench.train[:80]
  tok = build_tokenizer(sft_data.corpus_texts(tasks, env) + list(nav.vocabulary()), 1024)
  fmt = ChatFormatter(tok)
  mix = sft_data.MixConfig(resolve_share=0.2, continue_share=0.5, correction_share=1.0, perturb_share=0.5)
  return bench, env, tok, fmt, tasks, sft_data.build_examples(tasks, env, fmt, mix)


def test_mix_uses_train_tasks_and_each_kind(setup):
  bench, _, _, _, tasks, examples = setup
  ids = {t.task_id for t in tasks}
  assert {e.task_id for e in examples} <= ids
  assert not {e.task_id for e in examples} & {t.task_id for t in bench.test}
  kinds = collections.Counter(e.kind for e in examples)
  own = {"name_swap", "swap_episode", "swap_trusting", "swap_resolve_ctx", "swap_correction", "check_drill",
         "validator", "verifier", "replay", "repeat", "lookup", "retry"}  # made by sft_swap, judge_sft and tau2's builds
  # those are made by their own functions; resolve_tail only with complete_share > 0 (its own test)
  assert set(kinds) == set(sft_data.KINDS) - own - {"resolve_tail"}
  need = [t for t in tasks if t.needs_disambiguation]
  assert kinds["trusting"] + kinds["plain"] == len(tasks)
  assert 0 < kinds["resolve"] < 0.5 * len(need)


def test_trusting_agent_fails_where_disambiguation_is_needed(setup):
  bench, env, _, _, tasks, _ = setup
  need = [t for t in tasks if t.needs_disambiguation and not any(s.hinted for s in t.stops)]
  plain = [t for t in tasks if not t.needs_disambiguation]
  assert need and plain
  rewards = lambda ts: [nav.run_episode(env, sft_data.TrustingAgent(t), t).reward for t in ts]  # noqa: E731
  assert sum(rewards(need)) == 0 and sum(rewards(plain)) == len(plain)


def test_loss_mask_covers_exactly_the_trained_assistant_turns(setup):
  _, _, tok, _, _, examples = setup
  for e in examples:
    text = tok.decode([i for i, m in zip(e.token_ids, e.loss_mask) if m])
    assert text.endswith("<|im_end|>")
    assert "<tool_response>" not in text and "supervisor" not in text and "<|im_start|>" not in text
  resolve_ctx = next(e for e in examples if e.kind == "resolve_ctx")
  full = tok.decode(list(resolve_ctx.token_ids))
  trained = tok.decode([i for i, m in zip(resolve_ctx.token_ids, resolve_ctx.loss_mask) if m])
  assert "I will search it again in" in full and "I will search it again in" not in trained


def test_correction_examples_are_the_pipeline_prompt_and_follow_the_hint(setup):
  """p_cal ends with the feedback user turn (App. A.1 template) and the target re-searches
  the misresolved stop in the city of its true location (read from the task, independently)."""
  _, _, tok, fmt, tasks, examples = setup
  by_id = {t.task_id: t for t in tasks}
  seen = 0
  for e in examples:
    if e.kind != "correction":
      continue
    start = e.loss_mask.index(True)
    prompt = tok.decode(list(e.token_ids[:start]))
    target = tok.decode(list(e.token_ids[start:]))
    assert prompt.endswith("Write your next step again, continuing from the conversation above.\n<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert "<|im_start|>user\nA supervisor reviewed your planned next step and found a problem." in prompt
    calls = parse_assistant_turn(target.removesuffix("<|im_end|>")).tool_calls
    if "again with region" in prompt and all(c.name == "poi_search" for c in calls):
      task = by_id[e.task_id]
      cities = {s.name: s.city for s in task.stops}
      hint = re.search(r"Suggested direction: Search (.+) again with region (\w+) before", prompt)
      assert hint is not None
      assert set(re.findall(r"'([^']+)'", hint[1])) <= {c.arguments["address"] for c in calls}
      for c in calls:
        assert c.arguments["region"] == cities[c.arguments["address"]] == hint[2]
      seen += 1
  assert seen >= 5


def test_masked_nll_matches_numpy():
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((2, 5, 7)).astype(np.float32)
  ids = rng.integers(0, 7, (2, 5))
  mask = np.array([[0, 1, 1, 0, 1], [0, 0, 0, 1, 1]], np.float32)
  total, n = sft.masked_nll(jnp.asarray(logits), jnp.asarray(ids), jnp.asarray(mask))
  ref = 0.0
  for b in range(2):
    for t in range(4):
      if mask[b, t + 1]:
        z = logits[b, t].astype(np.float64)
        ref -= z[ids[b, t + 1]] - np.log(np.exp(z - z.max()).sum()) - z.max()
  assert float(n) == mask[:, 1:].sum()
  np.testing.assert_allclose(float(total), ref, rtol=1e-5)


@pytest.mark.slow
def test_shared_prefix_logits_equal_the_full_forward():
  cfg = sft.tiny_qwen3_config(100, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
  model = Qwen(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  prefix, ids = rng.integers(0, 100, 9), rng.integers(0, 100, (3, 6))
  attn = np.array([[1] * 6, [1] * 3 + [0] * 3, [1] * 5 + [0]])
  # jitted: op-by-op dispatch of the two forward passes was most of this check's time
  got = np.asarray(nnx.jit(sft.shared_prefix_logits)(model, jnp.asarray(prefix), jnp.asarray(ids), jnp.asarray(attn)))
  forward = nnx.jit(lambda m, x: m(x))
  for b in range(3):
    n = int(attn[b].sum())
    row = np.concatenate([prefix, ids[b, :n]])[None]
    want = np.asarray(forward(model, jnp.asarray(row)))[0, 9:]
    np.testing.assert_allclose(got[b, :n], want, atol=1e-5)


def test_turn_accuracy_counts_argmax_hits_on_trained_tokens_against_a_per_example_forward():
  """``sft.turn_accuracy`` against the argmax of one full forward pass per example: a shared
  prefix, examples of several lengths (several batches), and a model trained to copy so that some
  turns are exactly right and some are not."""
  from rti_jax.policy.sft_example import SFTExample

  cfg = sft.tiny_qwen3_config(40, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
  model = Qwen(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(3)
  prefix = [1, 2, 3]
  examples = []
  for i in range(12):
    body = list(rng.integers(5, 40, int(rng.integers(4, 40))))
    n = len(body)
    mask = [False] * (3 + n // 2) + [True] * (n - n // 2)
    examples.append(SFTExample(f"t{i}", "name_swap", tuple(prefix + body), tuple(mask)))
  # four short sequences (no shared prefix with the rest) learned by heart: some turns exactly right
  examples += sft.copy_task_examples(list(range(5, 40)), 4, length=5, seed=1)
  sft.train(model, examples[12:] * 25, sft.SFTConfig(epochs=4.0, lr=1e-2, tokens_per_batch=256, max_len=64,
                                                        len_multiple=32), pad_id=0)
  got = sft.turn_accuracy(model, examples, pad_id=0, tokens_per_batch=128)
  forward = nnx.jit(lambda m, x: m(x))
  hits = total = exact = 0
  for e in examples:
    ids = np.asarray(e.token_ids)
    pred = np.asarray(forward(model, jnp.asarray(ids[None])))[0].argmax(-1)
    m = np.asarray(e.loss_mask[1:])
    h = (pred[:-1] == ids[1:])[m]
    hits, total, exact = hits + h.sum(), total + m.sum(), exact + bool(h.all())
  assert got["tokens"] == pytest.approx(hits / total, abs=1e-6)
  assert got["exact"] == pytest.approx(exact / len(examples), abs=1e-6)
  assert 0 < got["tokens"] < 1 and 0 < got["exact"] < 1


def test_common_prefix_is_the_untrained_system_turn(setup):
  _, _, tok, _, _, examples = setup
  p = sft.common_prefix_len(examples)
  assert all(list(e.token_ids[:p]) == list(examples[0].token_ids[:p]) and not any(e.loss_mask[:p]) for e in examples)
  text = tok.decode(list(examples[0].token_ids[:p]))
  assert text.startswith("<|im_start|>system\nYou are a navigation assistant.")
  assert f"{nav.system_prompt(condensed=True)}<|im_end|>" in text  # the whole system turn is shared


def test_batches_hold_every_example_once(setup):
  _, _, _, _, _, examples = setup
  cfg = sft.SFTConfig(tokens_per_batch=4096, max_len=2048)
  p = sft.common_prefix_len(examples)
  batches = sft.make_batches(examples, cfg, np.random.default_rng(0), 0, p)
  assert sum(float(m.sum()) for _, _, m in batches) == sum(sum(e.loss_mask) for e in examples)
  assert sum(int(a.sum()) for _, a, _ in batches) == sum(len(e.token_ids) - p for e in examples)
  assert all(ids.shape[0] * (ids.shape[1] + p) <= 4096 or ids.shape[0] == 1 for ids, _, _ in batches)


def _tiny_run(examples, steps_epochs, seed=0):
  """SFT of a 2-layer width-32 Qwen3 in batches of at most 3,072 tokens (three per epoch here)."""
  cfg = sft.tiny_qwen3_config(1024, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
  model = Qwen(cfg, rngs=nnx.Rngs(seed))
  scfg = sft.SFTConfig(epochs=steps_epochs, tokens_per_batch=3072, max_len=512, lr=1e-2, warmup_steps=2, seed=seed)
  return model, sft.train(model, examples, scfg, pad_id=0)


@pytest.mark.slow
def test_sft_loss_decreases_and_is_deterministic(setup):
  _, _, _, _, _, examples = setup
  small = [e for e in examples if e.kind in ("plain", "trusting")][:12]
  model, res = _tiny_run(small, 4.0)
  assert res.steps >= 12
  first, last = np.mean(res.losses[:2]), np.mean(res.losses[-2:])
  assert last < 0.8 * first, res.losses
  p = sft.common_prefix_len(small)
  held = sft.evaluate_loss(model, small, sft.SFTConfig(tokens_per_batch=6144, max_len=512), 0)
  assert held < 0.8 * first and p > 0
  _, again = _tiny_run(small, 4.0)
  assert again.losses == res.losses


@pytest.mark.slow
def test_train_stops_early_when_asked_and_only_at_checks(setup):
  _, _, _, _, _, examples = setup
  small = [e for e in examples if e.kind in ("plain", "trusting")][:12]
  cfg = sft.tiny_qwen3_config(1024, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
  scfg = sft.SFTConfig(epochs=3.0, tokens_per_batch=3072, max_len=512, lr=1e-2, warmup_steps=2)
  asked: list[int] = []
  res = sft.train(Qwen(cfg, rngs=nnx.Rngs(0)), small, scfg, 0, stop=lambda k: asked.append(k) or k >= 6, check_every=3)
  assert asked == [3, 6] and res.steps == len(res.losses) == 6
  full = sft.train(Qwen(cfg, rngs=nnx.Rngs(0)), small, scfg, 0)
  assert full.steps > 6 and full.losses[:6] == res.losses  # the same steps up to the stop


@pytest.mark.slow
def test_frozen_token_rows_stay_exact_while_the_others_train(setup):
  _, _, _, _, _, examples = setup
  small = [e for e in examples if e.kind in ("plain", "trusting")][:4]
  used = sorted({t for e in small for t, m in zip(e.token_ids, e.loss_mask) if m})
  frozen, free = used[::2], used[1::2]
  cfg = sft.tiny_qwen3_config(1024, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
  model = Qwen(cfg, rngs=nnx.Rngs(0))
  before = np.asarray(model.embed.embedding[...]).copy()
  scfg = sft.SFTConfig(epochs=2.0, tokens_per_batch=6144, max_len=512, lr=1e-2, warmup_steps=1,
                       frozen_token_ids=tuple(frozen))
  sft.train(model, small, scfg, pad_id=0)
  after = np.asarray(model.embed.embedding[...])
  np.testing.assert_array_equal(after[frozen], before[frozen])  # weight decay included
  assert np.abs(after[free] - before[free]).sum(1).min() > 0
  with pytest.raises(ValueError, match="token_ids"):
    sft.freeze_rows(model, [1024])


def test_bad_settings_are_named():
  with pytest.raises(ValueError, match="epochs"):
    sft.SFTConfig(epochs=0)
  with pytest.raises(ValueError, match="resolve_share"):
    sft_data.MixConfig(resolve_share=1.5)
  with pytest.raises(ValueError, match="vocab_size"):
    build_tokenizer(["a"], 100)
  with pytest.raises(ValueError, match="examples"):
    sft.train(None, [], sft.SFTConfig(), 0)


def test_without_system_turn_drops_only_the_system_turn(setup):
  _, _, tok, fmt, _, examples = setup
  for e in examples[:20]:
    short = sft_data.without_system_turn(fmt, e)
    full_text = tok.decode(list(e.token_ids))
    assert tok.decode(list(short.token_ids)) == full_text.split("<|im_end|>\n", 1)[1]
    assert sum(short.loss_mask) == sum(e.loss_mask)


def test_copy_task_examples_repeat_their_first_half():
  ex = sft.copy_task_examples([5, 6, 7, 8], 3, length=5, seed=1)
  assert len(ex) == 3
  for e in ex:
    assert e.token_ids[:5] == e.token_ids[5:] and set(e.token_ids) <= {5, 6, 7, 8}
    assert e.loss_mask == (False,) * 5 + (True,) * 5
  assert sft.copy_task_examples([5, 6, 7, 8], 3, length=5, seed=1) == ex


def test_scale_embeddings_sets_embedding_std_and_final_norm():
  cfg = sft.tiny_qwen3_config(512, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                              intermediate_size=64, pad_token_id=0, eos_token_id=1)
  model = Qwen(cfg, rngs=nnx.Rngs(0))
  assert float(jnp.std(model.embed.embedding[...])) < 0.05
  sft.scale_embeddings(model, 1.0, 0.03, seed=3)
  emb = np.asarray(model.embed.embedding[...])
  assert abs(emb.std() - 1.0) < 0.02 and abs(emb.mean()) < 0.02
  np.testing.assert_allclose(np.asarray(model.norm.scale[...]), 0.03)
  # the initial logits stay as small as with the usual init: |norm(h)| ~ sqrt(d) * 0.03, |E| ~ sqrt(d)
  ids = jnp.asarray([[5, 6, 7, 8]])
  logits = np.asarray(model(ids, jnp.ones_like(ids)))
  assert np.abs(logits).std() < 1.0  # with the final norm left at 1 it would be ~sqrt(d) = 5.7


def test_add_type_direction_moves_exactly_the_given_rows_by_one_shared_vector():
  cfg = sft.tiny_qwen3_config(512, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                              intermediate_size=64, pad_token_id=0, eos_token_id=1)
  model = Qwen(cfg, rngs=nnx.Rngs(0))
  before = np.asarray(model.embed.embedding[...]).copy()
  sft.add_type_direction(model, [7, 3, 7, 40], 5.0, seed=2)
  delta = np.asarray(model.embed.embedding[...]) - before
  moved = np.flatnonzero(np.abs(delta).sum(1) > 0)
  assert moved.tolist() == [3, 7, 40]  # a repeated id is moved once
  np.testing.assert_allclose(delta[3], delta[40], rtol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(delta[7]), 5.0, rtol=1e-5)
  with pytest.raises(ValueError, match="token_ids"):
    sft.add_type_direction(model, [512], 1.0)


def test_name_swap_examples_swap_the_same_names_in_request_and_searches(setup):
  _, env, tok, fmt, tasks, _ = setup
  ex = sft_swap.name_swap_examples(tasks, env, fmt, 12, seed=4)
  assert len(ex) == 12 and {e.kind for e in ex} == {"name_swap"}
  assert {e.task_id for e in ex} <= {t.task_id for t in tasks}
  by_id = {t.task_id: t for t in tasks}
  names = {p.name for p in env.world.pois}
  for e in ex:
    text = tok.decode(list(e.token_ids))
    request = text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    trained = tok.decode([i for i, m in zip(e.token_ids, e.loss_mask) if m])
    assert trained.endswith("<|im_end|>") and "<|im_start|>" not in trained
    searched = [c.arguments["address"] for c in parse_assistant_turn(trained.replace("<|im_end|>", "")).tool_calls]
    task = by_id[e.task_id]
    assert len(searched) == len(task.stops) and len(set(searched)) == len(searched)
    assert set(searched) <= names
    for name in searched:  # every search names a place that the (swapped) request mentions
      assert name in request
  assert sft_swap.name_swap_examples(tasks, env, fmt, 12, seed=4) == ex
  assert sft_swap.name_swap_examples(tasks, env, fmt, 0) == []


def test_swapped_tasks_are_valid_plain_tasks_that_the_oracle_solves(setup):
  """A train task with its stops swapped: every new stop is named once in the request, the old
  names are gone, the benchmark's Stage-3 filter accepts it, it needs no disambiguation, its order
  cues and hints are the source's, and the oracle episode on it scores 1 (the route of the new
  stops); an excluded stop set is never produced."""
  from rti_jax.envs.navigation.tasks import annotate_order_level, mentioned_names, stage3_reject_reason, template_level

  bench, env, _, _, tasks, _ = setup
  world = env.world
  rng = np.random.default_rng(3)
  source = [t for t in tasks if not t.needs_disambiguation]
  made = []
  for i in range(120):
    src = source[i % len(source)]
    t = sft_swap.swapped_task(src, world, rng)
    if t is None:
      continue
    made.append(t)
    assert len(t.stops) == len(src.stops) and not t.needs_disambiguation
    assert [s.hinted for s in t.stops] == [s.hinted for s in src.stops]
    assert len({s.city for s in t.stops}) == 1 and {s.poi_id for s in t.stops} != {s.poi_id for s in src.stops}
    counts = mentioned_names(world, t.query)
    assert all(counts[s.name.lower()] == 1 for s in t.stops)
    assert set(counts) == {s.name.lower() for s in t.stops}
    assert annotate_order_level(t.query) == src.order_level == t.order_level
    assert stage3_reject_reason(world, t.query, t.stops, template_level(t.template), 2 * world.config.sample_radius_m) is None
    if any(s.hinted for s in t.stops):
      assert t.stops[0].city in t.query
    messages = sft_data.play(env, nav.OracleAgent(t), t)
    assert env.transcript.reward == 1.0, (t.query, messages[-2:])
  assert len(made) >= 30
  taken = frozenset(frozenset(s.poi_id for s in t.stops) for t in made)
  rng = np.random.default_rng(3)
  for i in range(120):
    t = sft_swap.swapped_task(source[i % len(source)], world, rng, exclude=taken)
    assert t is None or frozenset(s.poi_id for s in t.stops) not in taken


def test_swap_episode_examples_are_whole_trained_episodes_of_new_tasks(setup):
  bench, env, tok, fmt, tasks, _ = setup
  taken = frozenset(frozenset(s.poi_id for s in t.stops) for t in bench.train + bench.test)
  ex = sft_swap.swap_episode_examples(tasks, env, fmt, 10, seed=5, exclude=taken)
  assert len(ex) == 10 and {e.kind for e in ex} == {"swap_episode"}
  assert {e.task_id.removesuffix("-swap") for e in ex} <= {t.task_id for t in tasks}
  for e in ex:
    trained = tok.decode([i for i, m in zip(e.token_ids, e.loss_mask) if m])
    assert trained.count("<|im_end|>") == 3  # searches, the direction call, the answer
    assert '"name": "direction"' in trained
  assert sft_swap.swap_episode_examples(tasks, env, fmt, 10, seed=5, exclude=taken) == ex
  assert sft_swap.swap_episode_examples(tasks, env, fmt, 0) == []


def test_swapped_task_can_keep_the_need_for_disambiguation(setup):
  _, env, _, _, tasks, _ = setup
  rng = np.random.default_rng(4)
  source = [t for t in tasks if t.needs_disambiguation]
  made = [t for t in (sft_swap.swapped_task(source[i % len(source)], env.world, rng, disambiguation=True)
                      for i in range(300)) if t is not None]
  assert len(made) >= 10
  for t in made:
    assert t.needs_disambiguation and t.ambiguous
    # the trusting agent fails on it and the oracle, with its re-search, succeeds
    assert nav.run_episode(env, nav.OracleAgent(t), t).reward == 1.0
  unhinted = [t for t in made if not any(s.hinted for s in t.stops)]
  assert unhinted and all(nav.run_episode(env, sft_data.TrustingAgent(t), t).reward == 0.0 for t in unhinted)


def test_swap_disamb_examples_train_the_turns_around_a_re_search_on_new_tasks(setup):
  bench, env, tok, fmt, tasks, _ = setup
  taken = frozenset(frozenset(s.poi_id for s in t.stops) for t in bench.train + bench.test)
  ex = sft_swap.swap_disamb_examples(tasks, env, fmt, 12, seed=6, exclude=taken)
  kinds = collections.Counter(e.kind for e in ex)
  assert kinds["swap_resolve_ctx"] == 12 and kinds["swap_trusting"] >= 1 and kinds["swap_correction"] >= 1
  assert set(kinds) <= {"swap_resolve_ctx", "swap_trusting", "swap_correction"}
  assert {e.task_id.removesuffix("-swap") for e in ex} <= {t.task_id for t in tasks if t.needs_disambiguation}
  for e in ex:
    full = tok.decode(list(e.token_ids))
    trained = tok.decode([i for i, m in zip(e.token_ids, e.loss_mask) if m])
    searches = re.findall(r'"name": "poi_search", "arguments": (\{[^}]*\})', full)
    if e.kind == "swap_resolve_ctx":
      # the re-search (a regioned search) is in the context but not trained; the direction call is
      assert any('"region"' in a for a in searches)
      assert '"region"' not in trained.split('"name": "direction"')[0].split("<|im_end|>", 1)[1]
      assert '"name": "direction"' in trained and trained.count("<|im_end|>") == len(
        re.findall(r"<\|im_start\|>assistant", full)) - 1
    elif e.kind == "swap_correction":
      assert "supervisor" in full and trained.count("<|im_end|>") == 1 and '"region"' in trained
    else:  # the trusting habit: searches, a direction call on the first results, an answer; no re-search
      assert trained.count("<|im_end|>") == 3 and '"name": "direction"' in trained
  again = sft_swap.swap_disamb_examples(tasks, env, fmt, 12, seed=6, exclude=taken)
  assert again == ex and sft_swap.swap_disamb_examples(tasks, env, fmt, 0) == []


def test_place_name_token_ids_are_whole_poi_names(setup):
  bench, env, _, _, tasks, _ = setup
  from rti_jax.policy.tokenizer import NAME_PATTERN
  tok = build_tokenizer(sft_data.corpus_texts(tasks, env) + list(nav.vocabulary()), 2048, pattern=NAME_PATTERN)
  ids = sft_data.place_name_token_ids(tok, env)
  names = {p.name for p in env.world.pois}
  assert len(ids) > 50
  for t in tok.convert_ids_to_tokens(ids):
    assert t.replace("\u0120", " ").rstrip(" ") in names
  # a searched name and the same name before a number (a labelled stop) are both type tokens
  whole = [n for n in sorted(names) if len(tok(n, add_special_tokens=False)["input_ids"]) == 1]
  assert len(whole) > 50
  for n in whole:
    assert tok(n, add_special_tokens=False)["input_ids"][0] in ids
  labelled = [t for t in tok.convert_ids_to_tokens(ids) if t.endswith("\u0120")]
  assert labelled and all(tok.convert_tokens_to_ids(t) in ids for t in labelled)
  others = set(tok.get_vocab().values()) - set(ids)
  assert not any(t.replace("\u0120", " ").strip() in names for t in tok.convert_ids_to_tokens(sorted(others)))


def test_swap_names_uses_placeholders_and_needs_every_name_in_every_text():
  # a new name equal to an old one is not swapped twice
  assert sft_swap.swap_names(["from A to B", "A; B"], ["A", "B"], ["B", "C"]) == ["from B to C", "B; C"]
  assert sft_swap.swap_names(["from A to B", "B"], ["A", "B"], ["X", "Y"]) is None
  assert sft_swap.swap_names(["Hill Park and Hill"], ["Hill Park", "Hill"], ["X", "Y"]) == ["X and Y"]


@pytest.mark.slow
def test_sft_data_does_not_depend_on_the_string_hash_seed():
  """The SFT data (mix, name drills, swapped episodes) is the same in processes with different
  PYTHONHASHSEED: no set iteration order leaks into it (a set of equal-length stop names iterated in
  ``name_swap_examples`` would make two builds with the same seed train on different drills)."""
  import os
  import subprocess
  import sys

  script = (
    "import hashlib\n"
    "from rti_jax.envs import navigation as nav\n"
    "from rti_jax.policy import sft_data, sft_swap\n"
    "from rti_jax.policy.tokenizer import build_tokenizer, NAME_PATTERN\n"
    "from rti_jax.rollout import ChatFormatter\n"
    "b = nav.load_benchmark('tiny'); env = nav.NavigationEnv(b.world); tasks = b.train[:40]\n"
    "tok = build_tokenizer(sft_data.corpus_texts(tasks, env) + list(nav.vocabulary()), 1024, pattern=NAME_PATTERN)\n"
    "fmt = ChatFormatter(tok); h = hashlib.sha256()\n"
    "for e in (sft_data.build_examples(tasks, env, fmt) + sft_swap.name_swap_examples(tasks, env, fmt, 150, seed=1)\n"
    "          + sft_swap.swap_episode_examples(tasks, env, fmt, 10, seed=2)):\n"
    "  h.update(repr((e.task_id, e.kind, e.token_ids, e.loss_mask)).encode())\n"
    "print(h.hexdigest())\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digests = set()
  for seed in ("1", "2"):
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=True)
    digests.add(out.stdout.strip().splitlines()[-1])
  assert len(digests) == 1


def test_check_drills_train_exactly_the_check_line_on_both_kinds_of_task(setup):
  bench, env, tok, fmt, tasks, _ = setup
  taken = frozenset(frozenset(s.poi_id for s in t.stops) for t in bench.train + bench.test)
  ex = sft_swap.check_drill_examples(tasks[:10], env, fmt, 30, seed=3, exclude=taken)
  assert len(ex) == 30 and {e.kind for e in ex} == {"check_drill"}
  assert [e.task_id for e in ex[:10]] == [t.task_id for t in tasks[:10]]
  lines = []
  for e in ex:
    trained = tok.decode([i for i, m in zip(e.token_ids, e.loss_mask) if m])
    full = tok.decode(list(e.token_ids))
    assert re.fullmatch(r"Check: [^\n]+\.\n", trained), trained
    # the line is the start of the last assistant turn, and that turn is the episode's second
    last = full.rsplit("<|im_start|>assistant\n", 1)[1]
    assert last.startswith(trained) and full.count("<|im_start|>assistant") == 2
    lines.append(trained)
  swapped = lines[10:]
  assert sum(not line.startswith("Check: all") for line in swapped) == 10  # alternately needing a re-search
  assert sft_swap.check_drill_examples(tasks[:10], env, fmt, 30, seed=3, exclude=taken) == ex
  assert sft_swap.check_drill_examples(tasks, env, fmt, 0) == []


def test_mix_with_check_line_starts_every_second_turn_with_it(setup):
  bench, env, tok, fmt, tasks, plain_mix = setup
  mix = sft_data.MixConfig(resolve_share=0.2, continue_share=0.5, correction_share=1.0, perturb_share=0.5, check=True)
  ex = sft_data.build_examples(tasks, env, fmt, mix)
  assert [e.kind for e in ex] == [e.kind for e in plain_mix]
  for e, old in zip(ex, plain_mix):
    full, before = tok.decode(list(e.token_ids)), tok.decode(list(old.token_ids))
    turns = full.split("<|im_start|>assistant\n")[1:]
    if e.kind == "correction":  # p_cal and target: the draft and the target carry the line where they are turn 2
      continue
    assert turns[1].startswith("Check: ") and all(not t.startswith("Check: ") for i, t in enumerate(turns) if i != 1)
    # everything but the line (and the trusting sentence after an off verdict) is the mix without it
    from rti_jax.envs.navigation.agents import PLAN_NOW
    from rti_jax.policy.check_line import TRUST_FIRST

    assert re.sub(r"Check: [^\n]*\n", "", full).replace(TRUST_FIRST, PLAN_NOW) == before
    if e.kind == "trusting":
      assert turns[1].split("\n", 1)[1].startswith(TRUST_FIRST) and not turns[1].startswith("Check: all")


@pytest.mark.parametrize("check", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_resolve_tail_trains_the_re_search_turn_but_its_decision_token(setup, check):
  """complete_share: the oracle episode trained whole except one token, the first of the decision
  in the re-search turn (after the check line when there is one); the mix before it is unchanged."""
  bench, env, tok, fmt, tasks, _ = setup
  base = dict(resolve_share=0.2, continue_share=0.5, correction_share=1.0, perturb_share=0.5, check=check)
  old = sft_data.build_examples(tasks, env, fmt, sft_data.MixConfig(**base))
  new = sft_data.build_examples(tasks, env, fmt, sft_data.MixConfig(**base, complete_share=1.0))
  assert [e for e in new if e.kind != "resolve_tail"] == old  # no other example moves
  tails = [e for e in new if e.kind == "resolve_tail"]
  by_id = {t.task_id: t for t in tasks}
  resolved = [t for t in tasks if t.needs_disambiguation
              and len(sft_data.assistant_indices(sft_data.play(env, sft_data.scripted(nav.OracleAgent, t, check), t))) > 3]
  assert len(tails) == len(resolved) > 5
  for e in tails:
    task = by_id[e.task_id]
    oracle = sft_data.play(env, sft_data.scripted(nav.OracleAgent, task, check), task)
    ids, mask = sft_data.encode_messages(fmt, oracle)
    assert list(e.token_ids) == ids
    off = [i for i, (a, b) in enumerate(zip(mask, e.loss_mask)) if a != b]
    assert len(off) == 1 and mask[off[0]] and not e.loss_mask[off[0]]
    # the untrained token opens the re-search: after the turn's prompt (and the check line) comes the name
    before = tok.decode(list(e.token_ids[:off[0]]))
    turn_so_far = before.rsplit("<|im_start|>assistant\n", 1)[1]
    assert before.count("<|im_start|>assistant\n") == 2
    assert turn_so_far == (turn_so_far.split("\n")[0] + "\n" if check else "")
    if check:
      assert turn_so_far.startswith("Check: ") and not turn_so_far.startswith("Check: all")
    rest = tok.decode(list(e.token_ids[off[0]:])).split("<|im_end|>")[0]
    name = task.ambiguous[0] if len(task.ambiguous) == 1 else None
    assert " was found in " in rest and "I will search it again in" in rest
    if name is not None:
      assert rest.startswith(name)
  with pytest.raises(ValueError, match="complete_share"):
    sft_data.MixConfig(complete_share=1.5)
