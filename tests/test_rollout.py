"""The multi-turn rollout engine: token trajectories, masks, behaviour log-probs, batching."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rti_jax.generation.base import SamplingParams
from rti_jax.policy.tokenizer import byte_tokenizer
from rti_jax.rollout import ChatFormatter, RolloutConfig, rollout_groups, turn_counts
from intervention_doubles import NAV_TOOLS, MiniNavEnv, MiniNavScript, ScriptedPolicy, mini_nav_tasks, scripted_logp


@pytest.fixture(scope="module")
def tok():
  return byte_tokenizer()


@pytest.fixture(scope="module")
def fmt(tok):
  return ChatFormatter(tok, NAV_TOOLS)


class CountingBackend:
  """Wraps a backend and records the batch size of every generate call."""

  def __init__(self, inner):
    self.inner = inner
    self.batches: list[int] = []

  def generate(self, prompts, params, seed):
    self.batches.append(len(prompts))
    return self.inner.generate(prompts, params, seed)

  def score(self, prompts, responses):
    return self.inner.score(prompts, responses)

  def sync_weights(self, model):
    self.inner.sync_weights(model)


def _run(tok, fmt, group_size=3, **cfg):
  policy = CountingBackend(ScriptedPolicy(tok, MiniNavScript(), scripted_logp(roll_base=-0.7)))
  config = RolloutConfig(group_size=group_size, **cfg)
  groups = rollout_groups(mini_nav_tasks(), MiniNavEnv, policy, fmt, config, task_id=lambda t: t.task_id)
  return policy, groups


def test_groups_rewards_and_batched_turns(tok, fmt):
  policy, groups = _run(tok, fmt)
  assert [[t.task_id for t in g] for g in groups] == [["easy"] * 3, ["hard"] * 3]
  assert [[t.reward for t in g] for g in groups] == [[1.0] * 3, [0.0] * 3]
  # search, direction, answer: 3 turns; every turn is one generate call over all 6 live episodes
  assert policy.batches == [6, 6, 6]
  np.testing.assert_array_equal(turn_counts(groups), [3] * 6)


def test_tokens_equal_the_chat_template_of_the_transcript(tok, fmt):
  _, groups = _run(tok, fmt, group_size=1)
  for traj in (groups[0][0], groups[1][0]):
    rendered = tok.apply_chat_template(traj.messages, tools=NAV_TOOLS, tokenize=True, return_dict=False)
    # The trajectory stops right after the last end-of-turn token; the template adds a newline.
    assert traj.token_ids == list(rendered[: len(traj.token_ids)])
    assert tok.decode(rendered[len(traj.token_ids) :]) == "\n"
    assert traj.prompt_len == len(fmt.prompt_ids(traj.messages[:2]))


def test_loss_mask_covers_assistant_turns_only(tok, fmt):
  _, groups = _run(tok, fmt, group_size=1)
  traj = groups[1][0]
  a = traj.arrays()
  mask = a["loss_mask"]
  spans = np.zeros_like(mask)
  for turn in traj.turns:
    spans[turn.start : turn.end] = True
    assert tok.decode(a["token_ids"][turn.start : turn.end]) == turn.text + "<|im_end|>"
  np.testing.assert_array_equal(mask, spans)
  assert not mask[: traj.prompt_len].any()
  trained = tok.decode(a["token_ids"][mask])
  context = tok.decode(a["token_ids"][~mask])
  assert "<tool_response>" not in trained and "Beijing" not in trained
  assert context.count("<tool_response>") == 4  # 3 searches + 1 direction, all masked out
  assert not a["intervened_mask"].any()


def test_behaviour_logp_is_the_policy_logp_of_each_generated_token(tok, fmt):
  _, groups = _run(tok, fmt, group_size=1)
  a = groups[0][0].arrays()
  ids, mask, lp = a["token_ids"], a["loss_mask"], a["behaviour_logp"]
  expected = np.where(mask, -0.7 - 0.01 * (ids % 7), 0.0)
  np.testing.assert_allclose(lp, expected, atol=1e-6)
  assert not a["roll_logp"].any() and not a["cal_logp"].any()


def test_length_cut_turn_is_closed_as_context_and_counted(tok, fmt):
  sampling = SamplingParams(max_new_tokens=40, temperature=1.0)
  _, groups = _run(tok, fmt, group_size=1, sampling=sampling)
  traj = groups[0][0]
  first = traj.turns[0]
  assert first.finish_reason == "length" and first.end - first.start == 40
  assert traj.token_ids[first.end] == fmt.end_of_turn_id and not traj.loss_mask[first.end]
  assert traj.info["length_cut_turns"] == traj.num_turns


def test_context_limit_truncates_with_reward_zero(tok, fmt):
  sampling = SamplingParams(max_new_tokens=300)
  _, groups = _run(tok, fmt, group_size=1, max_context_tokens=1600, sampling=sampling)
  traj = groups[0][0]
  assert traj.truncated and traj.done and traj.reward == 0.0
  # every prompt handed to the backend left room for a full turn
  assert all(turn.start + 300 <= 1600 for turn in traj.turns)
  assert traj.num_turns == 1
  _, groups = _run(tok, fmt, group_size=1, max_context_tokens=400, sampling=sampling)
  assert groups[0][0].truncated and groups[0][0].num_turns == 0  # the initial prompt alone is too long


def test_formatter_rejects_bad_input(tok, fmt):
  with pytest.raises(ValueError, match="end_of_turn"):
    ChatFormatter(tok, NAV_TOOLS, end_of_turn="not a token")
  with pytest.raises(ValueError, match="context_ids"):
    fmt.with_extra_user_message([1, 2, 3], "x")
  with pytest.raises(ValueError, match="group_size"):
    rollout_groups([], MiniNavEnv, None, fmt, dataclasses.replace(RolloutConfig(), group_size=0))


def test_correction_prompt_is_the_rollout_prompt_plus_a_user_message(tok, fmt):
  msgs = MiniNavEnv().reset(mini_nav_tasks()[1])
  p_roll = fmt.prompt_ids(msgs)
  p_cal = fmt.with_extra_user_message(p_roll, "FEEDBACK")
  rendered = tok.apply_chat_template(msgs + [{"role": "user", "content": "FEEDBACK"}], tools=NAV_TOOLS,
                                     add_generation_prompt=True, tokenize=True, return_dict=False)
  assert p_cal == list(rendered)
  text = fmt.assistant_text("why", [{"name": "poi_search", "arguments": {"address": "A"}}], "")
  assert text == '<think>\nwhy\n</think>\n\n<tool_call>\n{"name": "poi_search", "arguments": {"address": "A"}}\n</tool_call>'


@pytest.mark.slow
def test_jax_backend_end_to_end_batch_matches_model_logprobs(tok):
  """Real sampler: rollouts + intervention + batch; old_logp equals the model's own log-probs."""
  import jax.numpy as jnp
  from flax import nnx

  from models.config import QwenConfig
  from models.qwen import Qwen
  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.intervention import (InterventionConfig, InterventionRoles, NavigationRuleValidator,
                                    NavigationRuleVerifier, PolicyCorrector, intervene_groups)
  from rti_jax.objectives import LossConfig, assemble_batch, loss_from_batch, next_token_logprobs

  cfg = QwenConfig(model_type="qwen3", vocab_size=272, hidden_size=32, intermediate_size=48, num_layers=1,
                   num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=1024)
  model = Qwen(cfg, rngs=nnx.Rngs(1))
  backend = JaxBackend(model, max_cache_len=512)
  fmt_plain = ChatFormatter(tok)  # no tool block: keeps prompts short for the CPU test
  rc = RolloutConfig(group_size=2, sampling=SamplingParams(max_new_tokens=8, temperature=1.0), max_context_tokens=512)
  tasks = mini_nav_tasks()
  groups = rollout_groups(tasks, MiniNavEnv, backend, fmt_plain, rc, task_id=lambda t: t.task_id, seed=3)
  assert all(t.reward == 0.0 for g in groups for t in g)  # a random policy never plans a route
  roles = InterventionRoles(NavigationRuleValidator(), PolicyCorrector(backend, rc.sampling, fmt_plain.end_of_turn_id),
                            NavigationRuleVerifier())
  new, stats = intervene_groups(groups, tasks, MiniNavEnv, backend, fmt_plain, roles, InterventionConfig(), rc,
                                task_id=lambda t: t.task_id, seed=5)
  assert stats.groups_triggered == 2 and stats.steps_total >= 2
  assert stats.steps_flagged + stats.validator_malformed >= 1
  batch = assemble_batch(new)
  logp = nnx.jit(lambda m, ids, mask: next_token_logprobs(m(ids, mask), ids))(model, batch.input_ids,
                                                                               batch.attention_mask)
  lm = np.asarray(batch.loss_mask, bool)
  assert lm.sum() > 0
  np.testing.assert_allclose(np.asarray(logp)[lm], np.asarray(batch.old_logp)[lm], atol=2e-4)
  loss, metrics = loss_from_batch(logp, batch, LossConfig(name="rti"))
  assert np.isfinite(float(loss)) and float(metrics["clip_frac"]) == 0.0


# A template that, like Qwen3's, renders the last assistant turn with an (empty) think block but
# earlier reasoning-free turns without one, so earlier turns re-render differently as messages grow.
THINK_LAST_TEMPLATE = r"""
{%- for m in messages -%}
{%- if m.role == 'assistant' and loop.last and '</think>' not in m.content -%}
{{- '<|im_start|>assistant\n<think>\n\n</think>\n\n' + m.content + '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{%- if messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + m.content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


def test_formatter_handles_templates_that_rerender_earlier_turns():
  tok = byte_tokenizer()
  tok.chat_template = THINK_LAST_TEMPLATE
  fmt = ChatFormatter(tok)
  cont = fmt.continuation_ids([{"role": "tool", "content": "A"}])
  assert tok.decode(cont) == "\n<|im_start|>user\n<tool_response>\nA\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
  block = fmt.message_block_ids([{"role": "user", "content": "F"}])
  assert tok.decode(block) == "<|im_start|>user\nF<|im_end|>\n<|im_start|>assistant\n"
  policy = ScriptedPolicy(tok, MiniNavScript(), scripted_logp())
  groups = rollout_groups(mini_nav_tasks(), MiniNavEnv, policy, fmt, RolloutConfig(group_size=1),
                          task_id=lambda t: t.task_id)
  assert [g[0].reward for g in groups] == [1.0, 0.0]
  traj = groups[0][0]
  for turn in traj.turns:  # every turn was generated right after the generation prompt
    g = fmt.generation_prompt_ids
    assert traj.token_ids[turn.start - len(g) : turn.start] == g
