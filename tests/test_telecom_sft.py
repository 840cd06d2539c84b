"""The tiny Telecom policy's groundwork: condensed policy, checklist agent, SFT data.

* the condensed policy keeps every tool name the tasks need and is what ``TelecomEnv`` and
  ``telecom_source`` (via ``env.telecom.policy_text``) put in the system prompt;
* the checklist agent solves every train and test task, the mistaken agent none;
* each SFT kind trains exactly the intended assistant tokens (decoded and compared as text);
* correction examples carry the correction prompt exactly as the intervention pipeline builds it.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from rti_jax.config import ConfigError, load_config
from rti_jax.envs.telecom import TelecomEnv, load_split, run_episode
from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom.checklist_agent import DEVICE_REQUESTS, ChecklistAgent, steps_of
from rti_jax.envs.telecom.condensed import CONDENSED_POLICY, prompt_stats, required_names
from rti_jax.envs.telecom.env import policy_text, system_prompt
from rti_jax.envs.telecom.source import policy_for, telecom_source
from rti_jax.intervention.judges import feedback_message
from rti_jax.intervention.pipeline import rule_roles, step_context
from rti_jax.intervention.prompting import paper_correction_message
from rti_jax.intervention.rules_telecom import USER_SIDE_DEVICE_ACTION
from rti_jax.policy import telecom_sft_data as td
from rti_jax.policy.sft_example import encode_messages, play, split_train
from rti_jax.policy.tokenizer import build_tokenizer
from rti_jax.rollout import ChatFormatter, Episode

ALL_SHARES = td.TelecomMix(resolve_share=1.0, continue_share=1.0, complete_share=1.0, correction_share=1.0)


@functools.lru_cache(maxsize=1)
def _setup() -> tuple[list, TelecomEnv, ChatFormatter]:
  tasks = load_split("train")[:8]
  env = td.make_env()
  tok = build_tokenizer(td.corpus_texts(tasks, env), 1024, pattern=td.TELECOM_PATTERN)
  return tasks, env, ChatFormatter(tok)


def _trained_spans(fmt: ChatFormatter, ex) -> list[str]:
  """Decoded runs of consecutive trained tokens."""
  spans, cur = [], []
  for t, m in zip(ex.token_ids, ex.loss_mask):
    if m:
      cur.append(t)
    elif cur:
      spans.append(fmt.tokenizer.decode(cur))
      cur = []
  if cur:
    spans.append(fmt.tokenizer.decode(cur))
  return spans


def _turns(messages) -> list[str]:
  return [m["content"] for m in messages if m["role"] == "assistant"]


# --- condensed policy --------------------------------------------------------------------------


def test_condensed_policy_keeps_every_needed_name_and_is_short():
  missing = [n for n in required_names() if n not in CONDENSED_POLICY]
  assert missing == []
  assert all(name in CONDENSED_POLICY for name in dt.DEVICE_TOOLS)  # which side runs each tool
  for value in ("4g_5g_preferred", "messaging", "sms", "storage", "2025-02-25", "###STOP###",
                "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."):
    assert value in CONDENSED_POLICY
  stats = prompt_stats()
  assert stats["condensed_chars"] == len(system_prompt(CONDENSED_POLICY))
  assert stats["full_chars"] == len(system_prompt(policy_text()))
  assert stats["condensed_chars"] < 0.25 * stats["full_chars"]


def test_condensed_policy_in_env_and_source():
  task = load_split("train")[0]
  prompt = TelecomEnv(policy=CONDENSED_POLICY).reset(task)[0]["content"]
  assert prompt == system_prompt(CONDENSED_POLICY)
  assert prompt.startswith(CONDENSED_POLICY) and '"name":"get_customer_by_phone"' in prompt
  cfg = load_config("telecom")
  assert cfg.env.telecom.policy_text == "condensed"
  assert telecom_source(cfg).env_factory().reset(task)[0]["content"] == prompt
  full = load_config("telecom", ["env.telecom.policy_text=full"])
  assert telecom_source(full).env_factory().reset(task)[0]["content"] == system_prompt()
  assert policy_for("condensed") == CONDENSED_POLICY and policy_for("full") is None
  with pytest.raises(ValueError, match="policy_text"):
    policy_for("short")
  with pytest.raises(ConfigError, match="env.telecom.policy_text"):
    load_config("navigation", ["env.telecom.policy_text=condensed"])
  with pytest.raises(ConfigError, match="env.telecom.policy_text"):
    load_config("telecom", ["env.telecom.policy_text=tiny"])


# --- scripted agents ---------------------------------------------------------------------------


def _unjustified_fixes(messages) -> list[str]:
  """The Verifier's ``fix_without_diagnostic`` reasons for every assistant turn of an episode,
  each judged on the conversation before it."""
  from rti_jax.intervention.judges import StepContext
  from rti_jax.intervention.telecom_fixes import unjustified_fixes

  history = [m for m in messages if m["role"] != "system"]
  user = next(m["content"] for m in history if m["role"] == "user")
  return [u.why for k, m in enumerate(history) if m["role"] == "assistant"
          for u in unjustified_fixes(StepContext(user, tuple(history[:k]), m["content"], (), {}, "telecom"), m["content"])]


@pytest.mark.parametrize("split", ["train", "test"])
def test_checklist_solves_every_task_and_the_mistake_fails_every_task_with_a_device_step(split):
  env = TelecomEnv(policy=CONDENSED_POLICY)
  fixes = 0
  for task in load_split(split):
    good = run_episode(env, ChecklistAgent(), task)  # the agent never reads the task
    assert good.reward == 1.0, task.task_id
    assert good.num_turns <= 16  # up to 4 checks or fixes a turn
    # diagnostic first: no fix before a visible output showed its fault, as the Verifier reads it
    assert _unjustified_fixes(good.messages) == [], task.task_id
    single = run_episode(env, ChecklistAgent(grouped=False), task)  # one step per turn: same outcome, longer
    assert single.reward == 1.0, task.task_id
    assert single.num_turns <= 27 and single.num_turns >= good.num_turns
    asked = lambda msgs: [s for m in msgs if m["role"] == "assistant" for s in steps_of(m["content"])]
    fixes += sum(DEVICE_REQUESTS[s][0] in ("toggle_airplane_mode", "reset_apn_settings", "toggle_data",
                                           "grant_app_permission") for s in asked(good.messages))
    # the same fixes in the same order, up to where the one-per-turn episode ends (the user's goal
    # can hold before the last fix of a group)
    n = len(asked(single.messages))
    assert asked(good.messages)[:n] == asked(single.messages)
    bad = run_episode(env, td.MistakeAgent(task), task)
    d = td.decisive_index(good.messages)
    if d is not None:
      assert good.messages[d]["content"] == DEVICE_REQUESTS["sim"][2]  # the one decision, on every such task
      assert bad.reward == 0.0, task.task_id
      assert bad.info["user_device_calls_by_agent"] == 1 and bad.info["termination"] == "agent_stop"
      assert td.first_device_step(bad.messages) == "mistake"
      assert td.first_device_step(good.messages) == "asked"
    else:  # a suspended line whose contract ended: look-up, transfer, nothing on the phone (no mistake to make)
      assert bad.messages == good.messages
      assert td.first_device_step(good.messages) == "none"
      assert good.info["termination"] == "transfer"
  assert fixes > len(load_split(split))  # the checks do lead to fixes


def test_fix_first_checklist_asks_every_fix_of_a_stage_and_still_solves_the_train_tasks():
  """``checks=False``: no checks, every fix of each stage (the Verifier's rule finds most of them
  unjustified); the same decisive turn, and reward 1 on every train task."""
  env = TelecomEnv(policy=CONDENSED_POLICY)
  unjustified = 0
  for task in load_split("train"):
    ep = run_episode(env, ChecklistAgent(checks=False), task)
    assert ep.reward == 1.0 and ep.num_turns <= 14, task.task_id
    steps = [s for m in ep.messages if m["role"] == "assistant" for s in steps_of(m["content"])]
    assert not any(DEVICE_REQUESTS[s][0].startswith("check_") and s != "sim" for s in steps)
    d = td.decisive_index(ep.messages)
    assert d is None or ep.messages[d]["content"] == DEVICE_REQUESTS["sim"][2]
    unjustified += len(_unjustified_fixes(ep.messages))
  assert unjustified > 300


def test_sft_config_names_the_checklist():
  from rti_jax.policy.build_config import load_telecom
  assert load_telecom(None, ["data.checklist=fix_first"]).data.checklist == "fix_first"
  with pytest.raises(ConfigError, match="data.checklist"):
    load_telecom(None, ["data.checklist=sometimes"])


def test_decisive_turn_is_the_first_device_request():
  env = td.make_env()
  task = load_split("train")[0]
  good = play(env, ChecklistAgent(), task)
  d = td.decisive_index(good)
  assert good[d]["content"] == DEVICE_REQUESTS["sim"][2]
  assert all(steps_of(m["content"]) == [] for m in good[:d] if m["role"] == "assistant")
  bad = play(env, td.MistakeAgent(), task)
  assert bad[:d] == good[:d]
  assert bad[d]["content"] == '<tool_call>\n{"name": "check_sim_status", "arguments": {}}\n</tool_call>'
  assert bad[d + 1]["role"] == "tool" and bad[d + 1]["content"].startswith("Error: check_sim_status is a tool on the user")
  assert bad[d + 2]["content"] == td.MISTAKE_END and len(bad) == d + 3


# --- SFT examples: loss masks ------------------------------------------------------------------


def test_kinds_train_exactly_the_intended_tokens():
  tasks, env, fmt = _setup()
  examples = td.build_examples(tasks, env, fmt, ALL_SHARES)
  eot = "<|im_end|>"
  task = tasks[0]
  good = play(env, ChecklistAgent(), task)
  bad = play(env, td.MistakeAgent(), task)
  d = td.decisive_index(good)
  j = _turns(good[:d + 1]).__len__() - 1  # the decisive turn's index among assistant turns
  by_kind = {e.kind: e for e in examples if e.task_id == task.task_id}
  assert set(by_kind) == {"trusting", "resolve", "correction", "resolve_tail"}  # resolve wins over resolve_ctx

  assert _trained_spans(fmt, by_kind["trusting"]) == [t + eot for t in _turns(bad)]
  assert _trained_spans(fmt, by_kind["resolve"]) == [t + eot for t in _turns(good)]
  assert list(by_kind["resolve"].token_ids) == encode_messages(fmt, good)[0]

  tail = by_kind["resolve_tail"]
  full_ids, full_mask = encode_messages(fmt, good)
  assert list(tail.token_ids) == full_ids
  off = [i for i, (a, b) in enumerate(zip(full_mask, tail.loss_mask)) if a != b]
  assert len(off) == 1 and fmt.tokenizer.decode([tail.token_ids[off[0]]]) == "Please"
  spans = _trained_spans(fmt, tail)
  assert spans[j] == good[d]["content"].removeprefix("Please") + eot
  assert spans[:j] + spans[j + 1:] == [t + eot for k, t in enumerate(_turns(good)) if k != j]

  ctx_mix = td.TelecomMix(resolve_share=0.0, continue_share=1.0, complete_share=0.0, correction_share=0.0)
  ctx = [e for e in td.build_examples(tasks[:1], env, fmt, ctx_mix) if e.kind == "resolve_ctx"][0]
  assert _trained_spans(fmt, ctx) == [t + eot for k, t in enumerate(_turns(good)) if k != j]


@pytest.mark.parametrize("message", ["feedback", "paper"])
def test_correction_prompt_equals_the_pipelines(message):
  tasks, env, fmt = _setup()
  task = tasks[0]
  examples = td.build_examples([task], env, fmt, dataclasses.replace(ALL_SHARES, correction=message))
  ex = next(e for e in examples if e.kind == "correction")
  good = play(env, ChecklistAgent(), task)
  bad = play(env, td.MistakeAgent(), task)
  d = td.decisive_index(good)
  # What the pipeline does at step d of an intervened rollout (intervened_step): p_roll is the
  # episode's context, the rule-based Validator judges the draft, p_cal adds its feedback.
  ep = Episode(td.make_env(), task, task.task_id, fmt)
  for text in _turns(good[:d]):
    ids = fmt.encode_assistant(text)
    ep.apply_turn(fmt, ids, [0.0] * len(ids), "stop", 8192)
  validator, verifier = rule_roles("telecom")
  ctx = step_context(ep, bad[d]["content"], "telecom")
  judgement = validator.validate([ctx])[0]
  assert not judgement.is_valid and judgement.error_types == (USER_SIDE_DEVICE_ACTION,)
  assert "ask the user to run check_sim_status()" in judgement.feedback_suggestion  # what p_cal shows
  if message == "feedback":
    text = feedback_message(judgement)
  else:  # the paper's Corrector: the draft, the diagnosis, suggest_next and the backend records
    text = paper_correction_message(ctx, judgement)
    assert ctx.evidence and bad[d]["content"] in text and judgement.suggest_next in text
  p_cal = fmt.with_extra_user_message(ep.context(), text)
  n = len(p_cal)
  assert list(ex.token_ids[:n]) == p_cal
  assert not any(ex.loss_mask[:n]) and all(ex.loss_mask[n:])
  assert _trained_spans(fmt, ex) == [good[d]["content"] + "<|im_end|>"]
  assert verifier.judge(ctx, good[d]["content"]).ok


def test_mix_is_deterministic_and_shares_checked():
  tasks, env, fmt = _setup()
  a = td.build_examples(tasks, env, fmt, td.TelecomMix(seed=3))
  b = td.build_examples(tasks, env, fmt, td.TelecomMix(seed=3))
  assert a == b
  assert sum(e.kind == "trusting" for e in a) == sum(td.decisive_index(play(env, ChecklistAgent(), t)) is not None
                                                   for t in tasks)
  with pytest.raises(ValueError, match="resolve_share"):
    td.TelecomMix(resolve_share=1.5)
  with pytest.raises(ValueError, match="holdout"):
    split_train(load_split("train"), 74)
  sft, held = split_train(load_split("train"), 10)
  assert len(sft) == 64 and [t.task_id for t in held] == [t.task_id for t in load_split("train")[-10:]]


def test_tokenizer_round_trips_and_keeps_tool_names_whole():
  _, _, fmt = _setup()
  tok = fmt.tokenizer
  for text in (CONDENSED_POLICY, "Please run get_data_usage(C1001): 15.1 GB  \n\t{\"a\": 1}"):
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
  assert tok.convert_ids_to_tokens(tok.encode("get_customer_by_phone", add_special_tokens=False)) == [
    "get_customer_by_phone"]


def test_first_device_step_reads_free_text():
  msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
          {"role": "assistant", "content": "Could you give me your phone number?"},
          {"role": "user", "content": "555-123-2002"},
          {"role": "assistant", "content": "Please run toggle_airplane_mode() on your phone."}]
  assert td.first_device_step(msgs) == "asked"
  msgs[-1] = {"role": "assistant", "content": '<tool_call>\n{"name": "reboot_device", "arguments": {}}\n</tool_call>'}
  assert td.first_device_step(msgs) == "mistake"
  assert td.first_device_step(msgs[:4]) == "none"
  msgs[-1] = {"role": "assistant", "content": '<tool_call>\n{"name": "check_sim_status", "arguments": {"summary": "x}\n'}
  assert td.first_device_step(msgs) == "malformed"


def test_validator_never_flags_the_checklist_and_flags_the_mistake():
  from rti_jax.intervention.telecom_diagnostics import firing_rates

  good = firing_rates(ChecklistAgent, load_split("train"))
  assert good["mean_reward"] == 1.0 and good["flagged"] == 0
  bad = firing_rates(td.MistakeAgent, load_split("train"))
  # 72 of 74 train tasks reach the phone: the device call, then the early stop, are flagged
  assert bad["by_rule"] == {USER_SIDE_DEVICE_ACTION: 72, "PREMATURE_TERMINATION": 72}
  assert bad["episodes_flagged"] == 72 and bad["mean_reward"] == 2 / 74


# --- the builder's config ----------------------------------------------------------------------


def test_telecom_build_config_rejects_bad_keys_and_values_naming_them(tmp_path):
  from experiments import telecom_sft
  from rti_jax.policy import build_config

  for override, key in (("data.rounds=2", "data.rounds"), ("data.phrasings=0", "data.phrasings"),
                        ("eval.max_turns=40", "eval.max_turns"), ("train.epochs=-1", "train.epochs"),
                        ("data.correction=oracle", "data.correction")):
    with pytest.raises(ConfigError, match=key):
      build_config.load_telecom(overrides=[override])
    with pytest.raises(SystemExit, match=key):
      telecom_sft.main(["--quick", "--out", str(tmp_path), override])
  cfg = build_config.load_telecom(overrides=["data.recombined=128", "data.phrasings=2", "train.epochs=1.5"])
  assert (cfg.data.recombined, cfg.data.phrasings, cfg.train.epochs, cfg.eval.tasks) == (128, 2, 1.5, None)
