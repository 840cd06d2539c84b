"""The tiny tau2-Retail / tau2-Airline policies' SFT data (``rti_jax.policy.tau2_sft_data``), their
builder (``experiments/tau2_sft.py``), and the reward audit that checks a run's episodes against
tau2's own evaluator (``Tau2Env(audit_share=...)``, ``trainer.reward_audits``)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

pytest.importorskip("tau2", reason='tau2-bench is not installed (the tau2 extra: pip install -e ".[tau2]")')

from rti_jax.config import ConfigError  # noqa: E402
from rti_jax.envs.tau2 import bridge  # noqa: E402
from rti_jax.envs.tau2.agents import DoNothingAgent, GoldAgent, run_episode  # noqa: E402
from rti_jax.envs.tau2.env import Tau2Env  # noqa: E402
from rti_jax.envs.tau2.source import split_tasks  # noqa: E402
from rti_jax.policy import build_config  # noqa: E402
from rti_jax.policy import tau2_sft_data as td  # noqa: E402
from rti_jax.policy.sft_example import encode_messages  # noqa: E402

DOMAINS = ("retail", "airline")


@pytest.fixture(scope="module")
def episodes():
  """Each domain's env and the gold / mistaken episodes of its first 12 generated training tasks."""
  out = {}
  for domain in DOMAINS:
    train, _ = split_tasks(domain, "generated", 600)
    env = td.make_env(domain)
    out[domain] = (env, td.play_episodes(train[:12], env))
  return out


@pytest.fixture(scope="module")
def formatter(episodes):
  from rti_jax.policy.telecom_sft_data import TELECOM_PATTERN
  from rti_jax.policy.tokenizer import build_tokenizer
  from rti_jax.rollout import ChatFormatter

  env, eps = episodes["retail"]
  return ChatFormatter(build_tokenizer(td.corpus_texts(eps, env), 2048, pattern=TELECOM_PATTERN))


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_mistake_is_a_transfer_at_the_first_confirmation_and_tau2_scores_it_zero(episodes, domain):
  env, eps = episodes[domain]
  with_decision = [ep for ep in eps if ep.decisive is not None]
  assert len(with_decision) >= 6 and all(ep.ok for ep in eps)
  for n, ep in enumerate(with_decision):
    d = ep.decisive
    assert ep.good[d]["content"].startswith("To confirm, I will")
    assert ep.bad[:d] == ep.good[:d]  # the same episode up to the decision
    assert ep.bad[d]["content"].startswith("<tool_call>") and td.TRANSFER in ep.bad[d]["content"]
    assert len(ep.bad) == d + 2 and ep.bad[-1]["role"] == "tool"  # the transfer ended the episode
    if n >= 3:  # the fast reward that scored them is checked against tau2's evaluator in test_tau2_domains
      continue
    # tau2's own evaluator on the mistaken episode, replayed: 0; on the gold one: 1
    for messages, want in ((ep.bad, 0.0), (ep.good, 1.0)):
      env.reset(ep.task)
      for m in messages[2:]:
        if m["role"] == "assistant":
          env.step(m["content"])
      assert env.score("tau2").reward == want
  refusals = [ep for ep in eps if ep.decisive is None]
  assert all(not (set(ep.task.request_types) - {"refusal"}) for ep in refusals)


@pytest.mark.parametrize("domain", DOMAINS)
def test_first_derailment_points_at_the_transfer_and_at_nothing_on_the_gold_path(episodes, domain):
  env, eps = episodes[domain]
  for ep in eps:
    assert td.first_derailment(env, ep.task, ep.good) is None
    if ep.bad is not None:
      where = td.first_derailment(env, ep.task, ep.bad)
      turn = [i for i, m in enumerate(ep.bad) if m["role"] == "assistant"].index(ep.decisive)
      assert where == {"turn": turn, "kind": "transfer", "errors": ["premature_end"]}


def test_first_derailment_names_a_wrong_write(episodes):
  env, eps = episodes["retail"]
  ep = next(e for e in eps if e.decisive is not None)
  write = next(i for i in range(ep.decisive + 1, len(ep.good)) if ep.good[i]["role"] == "assistant")
  call = json.loads(ep.good[write]["content"].split("\n")[1])
  first_key = next(iter(call["arguments"]))
  call["arguments"][first_key] = "#W0000000" if first_key == "order_id" else "x"
  wrong = [*ep.good[:write], {"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"}]
  where = td.first_derailment(env, ep.task, wrong)
  assert where["kind"] == "write" and where["errors"] == ["off_path_write"]


def test_step_kinds():
  writes = bridge.tool_info("retail")[1]
  call = '<tool_call>\n{"name": "%s", "arguments": {}}\n</tool_call>'
  assert td.step_kind(call % td.TRANSFER, writes) == "transfer"
  assert td.step_kind(call % "cancel_pending_order", writes) == "write"
  assert td.step_kind(call % "get_order_details", writes) == "call"
  assert td.step_kind("<tool_call>\n{oops\n</tool_call>", writes) == "malformed"
  assert td.step_kind("Bye. ###STOP###", writes) == "stop"
  assert td.step_kind("To confirm, I will cancel it. Yes?", writes) == "confirm"
  assert td.step_kind("Hello", writes) == "message"


def test_the_mix_trains_what_each_kind_says(episodes, formatter):
  env, eps = episodes["retail"]
  tok = formatter.tokenizer
  examples, counts = td.build_examples(eps, env, formatter, td.Tau2Mix(correction_share=1.0, complete_share=1.0,
                                                                       continue_share=1.0, resolve_share=0.0))
  n_decision = sum(ep.decisive is not None for ep in eps)
  kinds = [e.kind for e in examples]
  assert kinds.count("trusting") == n_decision and kinds.count("resolve_tail") == n_decision
  assert kinds.count("plain") == len(eps) - n_decision
  assert kinds.count("correction") + counts["corrections_rejected"] == n_decision and kinds.count("correction") >= 1
  by_task = {ep.task.task_id: ep for ep in eps}
  for ex in examples:
    ep = by_task[ex.task_id]
    trained = [t for t, m in zip(ex.token_ids, ex.loss_mask) if m]
    if ex.kind == "correction":  # only the confirmation is trained, after the Validator's feedback
      assert trained == formatter.encode_assistant(ep.good[ep.decisive]["content"])
      assert "supervisor" in tok.decode(ex.token_ids[:ex.loss_mask.index(True)]).lower()
    elif ex.kind == "resolve_tail":  # every assistant token but the decision's first
      ids, mask = encode_messages(formatter, ep.good)
      pos = len(encode_messages(formatter, ep.good[:ep.decisive])[0])
      assert list(ex.token_ids) == ids and [a != b for a, b in zip(mask, ex.loss_mask)].count(True) == 1
      assert mask[pos] and not ex.loss_mask[pos]
    elif ex.kind == "trusting":
      assert list(ex.token_ids) == encode_messages(formatter, ep.bad)[0] and all(
          m == b for m, b in zip(ex.loss_mask, encode_messages(formatter, ep.bad)[1]))


@pytest.mark.parametrize("domain", DOMAINS)
def test_copy_drills_swap_every_copied_value_and_train_one_turn(episodes, formatter, domain):
  env, eps = episodes[domain]
  tok = formatter.tokenizer
  drills = td.copy_drills(eps, formatter, 40, seed=3)
  assert len(drills) == 40 and drills == td.copy_drills(eps, formatter, 40, seed=3)
  originals = {ep.task.task_id: ep for ep in eps}
  swapped = 0
  for ex in drills:
    text = tok.decode(list(ex.token_ids))
    assert "<|im_start|>system" not in text and ex.kind == "name_swap"
    first = ex.loss_mask.index(True)
    assert all(ex.loss_mask[first:])  # one trained turn, at the end
    turn = tok.decode(list(ex.token_ids[first:]))
    context = tok.decode(list(ex.token_ids[:first]))
    call = td._turn_call(turn.replace("<|im_end|>", ""))
    if call is None:  # a confirmation: its values are listed in the text
      continue
    values = [v for _, v in td._copied_values(call)]
    # every value the turn writes can be read in the conversation before it
    assert all(v in context for v in values), (turn, context[-400:])
    ep = originals[ex.task_id]
    gold_texts = " ".join(str(m["content"]) for m in ep.good)
    swapped += any(v not in gold_texts for v in values)
  assert swapped >= 10  # most drills carry values of another task


def _answer_to(env, task, gold_turns, right, wrong):
  """The message that answers ``wrong`` in ``env`` when it is sent in place of the gold turn
  ``right``, after the gold turns before it."""
  env.reset(task)
  for turn in gold_turns[:gold_turns.index(right)]:
    env.step(turn)
  env.step(wrong)
  return env.transcript.messages[-1]


@pytest.mark.parametrize("domain", DOMAINS)
def test_retries_answer_the_tools_own_error_with_the_gold_call(episodes, formatter, domain):
  """A retry: a read call with one value wrong, the tool's error for it (replayed here through a
  fresh env, independently of the builder), then the gold call, the only trained turn."""
  env, eps = episodes[domain]
  tok = formatter.tokenizer
  retries, skipped = td.retry_examples(eps, env, formatter, 30, seed=2)
  assert len(retries) + skipped == 30 and len(retries) >= 25
  assert td.retry_examples(eps, env, formatter, 30, seed=2) == (retries, skipped)
  gold_calls = {ep.task.task_id: [m["content"] for m in ep.good if m["role"] == "assistant"] for ep in eps}
  writes = set(bridge.tool_info(domain)[1])
  fresh = td.make_env(domain)
  tasks = {ep.task.task_id: ep.task for ep in eps}
  for ex in retries:
    text = tok.decode(list(ex.token_ids))
    assert ex.kind == "retry" and "<|im_start|>system" not in text
    first = ex.loss_mask.index(True)
    assert all(ex.loss_mask[first:])  # one trained turn, at the end
    right = tok.decode(list(ex.token_ids[first:])).replace("<|im_end|>", "").strip()
    assert right in gold_calls[ex.task_id]
    calls = re.findall(r"<tool_call>.*?</tool_call>", text, flags=re.S)
    wrong = calls[-2]
    assert wrong != right and td._turn_call(wrong)[0] == td._turn_call(right)[0] not in writes
    # the tool refuses the wrong call: played after the same gold prefix in a fresh env
    reply = _answer_to(fresh, tasks[ex.task_id], gold_calls[ex.task_id], right, wrong)
    assert str(reply["content"]).startswith("Error"), reply
  assert td.retry_examples(eps, env, formatter, 0, seed=2) == ([], 0)


@pytest.mark.parametrize("domain", DOMAINS)
def test_confirmation_retries_follow_the_users_refusal_with_the_gold_confirmation(episodes, formatter, domain):
  """A confirmation retry: the write's confirmation with one value wrong, the scripted user's
  refusal (replayed in a fresh env), then the gold confirmation, the only trained turn; the read
  retries drawn before them are the same as without them."""
  env, eps = episodes[domain]
  tok = formatter.tokenizer
  reads, _ = td.retry_examples(eps, env, formatter, 10, seed=2)
  both, skipped = td.retry_examples(eps, env, formatter, 10, seed=2, confirmations=20)
  assert both[:len(reads)] == reads
  confirms = both[len(reads):]
  assert len(confirms) + skipped >= 20 and len(confirms) >= 15
  gold_turns = {ep.task.task_id: [m["content"] for m in ep.good if m["role"] == "assistant"] for ep in eps}
  tasks = {ep.task.task_id: ep.task for ep in eps}
  fresh = td.make_env(domain)
  for ex in confirms:
    first = ex.loss_mask.index(True)
    assert all(ex.loss_mask[first:])
    right = tok.decode(list(ex.token_ids[first:])).replace("<|im_end|>", "").strip()
    assert right.startswith(td.CONFIRM_PREFIX) and right in gold_turns[ex.task_id]
    context = tok.decode(list(ex.token_ids[:first]))
    wrong = context.split("<|im_start|>assistant\n")[-2].split("<|im_end|>")[0]  # the turn before the trained one
    assert wrong.startswith(td.CONFIRM_PREFIX) and wrong != right
    reply = _answer_to(fresh, tasks[ex.task_id], gold_turns[ex.task_id], right, wrong)
    assert reply["role"] == "user" and reply["content"].startswith("No") and reply["content"] in context


def test_a_confirmation_retry_may_get_a_cancellations_reason_wrong(formatter):
  """The reason of a cancellation is picked from tau2's two phrases, not copied: confirmation
  retries propose the other one (or a misspelt one), which the user refuses, then the right one."""
  train, _ = split_tasks("retail", "generated", 600)
  reason = lambda t: next((a["reason"] for n, a in t.required_actions if n == "cancel_pending_order"), None)  # noqa: E731
  cancels = ([t for t in train[:300] if reason(t) == "no longer needed"][:2]
             + [t for t in train[:300] if reason(t) == "ordered by mistake"][:2])
  env = td.make_env("retail")
  eps = td.play_episodes(cancels, env)
  retries, _ = td.retry_examples(eps, env, formatter, 0, seed=5, confirmations=60)
  texts = [formatter.tokenizer.decode(list(e.token_ids)) for e in retries]
  swapped = [t for t in texts if 'reason: "ordered by mistake"' in t and 'reason: "no longer needed"' in t]
  assert len(cancels) == 4 and len(swapped) >= 5
  for t in swapped:
    right = t.split("<|im_start|>assistant\n")[-1]
    assert right.startswith(td.CONFIRM_PREFIX) and "<|im_start|>user\nNo" in t


def test_a_wrong_value_differs_from_the_right_one_and_keeps_its_shape():
  import numpy as np

  rng = np.random.default_rng(0)
  for v in ["#W2378156", "Ethan", "mia_garcia_4516", "77243"]:
    for _ in range(50):
      w = td._wrong_value(v, [], rng)
      assert w != v and len(w) == len(v)
      assert sum(a != b for a, b in zip(v, w)) == 1
      assert [c.isdigit() for c in w] == [c.isdigit() for c in v] and [c.isupper() for c in w] == [c.isupper() for c in v]
  picks = {td._wrong_value("Ethan", ["Ethan", "Mia", "Yusuf"], rng) for _ in range(200)}
  assert {"Mia", "Yusuf"} <= picks and "Ethan" not in picks


@pytest.mark.parametrize("domain", DOMAINS)
def test_short_copy_drills_keep_the_last_messages_that_show_every_copied_value(episodes, formatter, domain):
  """copy_stage.context: the same drills (same turns, same swaps) on a suffix of the conversation
  that still shows every value the turn copies and starts at a user turn, none later would do
  (context 0); context 1 keeps at least as much."""
  _, eps = episodes[domain]
  tok = formatter.tokenizer
  full = td.copy_drills(eps, formatter, 40, seed=3)
  short, longer = (td.copy_drills(eps, formatter, 40, seed=3, context=k) for k in (0, 1))
  start = tok.convert_tokens_to_ids("<|im_start|>")
  shorter = 0
  for f, s0, s1 in zip(full, short, longer):
    assert (f.task_id, f.kind) == (s0.task_id, s0.kind) == (s1.task_id, s1.kind)
    for s in (s0, s1):  # a token suffix: the same messages, the same trained turn
      assert list(f.token_ids[len(f.token_ids) - len(s.token_ids):]) == list(s.token_ids) and s.token_ids[0] == start
      assert list(f.loss_mask[len(f.loss_mask) - len(s.loss_mask):]) == list(s.loss_mask)
    first = s0.loss_mask.index(True)
    turn, context = tok.decode(list(s0.token_ids[first:])), tok.decode(list(s0.token_ids[:first]))
    call = td._turn_call(turn.replace("<|im_end|>", ""))
    if call is None or len(s0.token_ids) == len(f.token_ids):
      continue
    values = [v for _, v in td._copied_values(call)]
    assert all(v in context for v in values), (turn, context)
    messages = context.split("<|im_start|>")[1:]  # the kept messages before the turn
    is_user = [m.startswith("user\n") and not m.startswith("user\n<tool_response>") for m in messages]
    assert is_user[0]
    later = [k for k in range(1, len(messages)) if is_user[k]]
    if later:  # a shorter conversation starting at a user turn would lose a value
      assert not all(v in "".join(messages[later[0]:]) for v in values), (values, messages)
    assert len(s1.token_ids) >= len(s0.token_ids)
    shorter += 1
  assert shorter >= 20 and sum(len(s.token_ids) for s in short) < sum(len(f.token_ids) for f in full)


@pytest.mark.parametrize("domain", DOMAINS)
def test_cut_copy_drills_keep_only_the_request_and_the_messages_that_show_the_values(episodes, formatter, domain):
  """copy_stage.cut: the same drills (same turns, same swaps) on the opening request, the messages
  that last show each copied value (a tool result or user reply with the agent turn it answers)
  and the turn, in the conversation's order; context 1 keeps at least as much; shorter than the
  suffix drills."""
  _, eps = episodes[domain]
  tok = formatter.tokenizer
  full = td.copy_drills(eps, formatter, 40, seed=3)
  suffix = td.copy_drills(eps, formatter, 40, seed=3, context=0)
  cut, cut1 = (td.copy_drills(eps, formatter, 40, seed=3, context=k, cut=True) for k in (0, 1))

  def turns(ex):  # the decoded messages of an example, each from <|im_start|> to its <|im_end|>
    return [("<|im_start|>" + m).strip() for m in tok.decode(list(ex.token_ids)).split("<|im_start|>")[1:]]

  checked = 0
  for f, c0, c1 in zip(full, cut, cut1):
    assert (f.task_id, f.kind) == (c0.task_id, c0.kind) == (c1.task_id, c1.kind)
    whole, kept, kept1 = turns(f), turns(c0), turns(c1)
    assert kept[-1] == whole[-1] and sum(c0.loss_mask) == sum(f.loss_mask)  # the same trained turn, only it
    assert all(c0.loss_mask[c0.loss_mask.index(True):])
    assert kept[0] == whole[0] and kept[0].startswith("<|im_start|>user")  # the opening request
    pos = [whole.index(m) for m in kept]
    assert pos == sorted(set(pos))  # a subsequence of the conversation, in order
    assert set(pos) <= {whole.index(m) for m in kept1}  # context 1 keeps at least these
    call = td._turn_call(tok.decode(list(f.token_ids[f.loss_mask.index(True):])).replace("<|im_end|>", ""))
    if call is None or len(kept) == len(whole):
      continue
    values = [v for _, v in td._copied_values(call)]
    for v in values:  # the latest message showing each value is kept
      last = max(k for k in range(len(whole) - 1) if v in whole[k])
      assert last in pos, (v, last, pos)
    for k, m in zip(pos, kept):  # agent and environment turns alternate as in the episode
      if k > 0 and m.startswith("<|im_start|>user"):  # a tool result or user reply, after what it answers
        assert k - 1 in pos, (k, pos)
      if m.startswith("<|im_start|>assistant") and k != pos[-1]:  # an agent turn, before what answers it
        assert k + 1 in pos, (k, pos)
      if m.startswith("<|im_start|>user\n<tool_response>"):
        assert "<tool_call>" in whole[k - 1]
    checked += 1
  assert checked >= 12, checked
  assert sum(len(c.token_ids) for c in cut) < sum(len(s.token_ids) for s in suffix)


def test_repeat_strings_train_the_second_copy_of_a_random_string():
  ids = [5, 9, 11, 40, 41]
  reps = td.repeat_strings(30, 6, ids, seed=2)
  assert len(reps) == 30 and {e.kind for e in reps} == {"repeat"}
  for e in reps:
    x = e.token_ids
    assert len(x) == 12 and x[:6] == x[6:] and set(x) <= set(ids)
    assert e.loss_mask == (False,) * 7 + (True,) * 5  # the repeat from its second token
  assert len({e.token_ids for e in reps}) == 30  # 5 ** 6 strings: no two drawn alike here
  assert [e.token_ids for e in td.repeat_strings(30, 6, ids, seed=2)] == [e.token_ids for e in reps]
  assert [e.token_ids for e in td.repeat_strings(30, 6, ids, seed=3)] != [e.token_ids for e in reps]
  varied = td.repeat_strings(200, 6, ids, seed=2, min_length=3, gap=4)
  sizes, gaps = set(), set()
  for e in varied:  # x, up to 4 random tokens, x again; the second x trained from its second token
    size = sum(e.loss_mask) + 1
    x, gap = e.token_ids[:size], len(e.token_ids) - 2 * size
    assert e.token_ids[-size:] == x and e.loss_mask == (False,) * (size + gap + 1) + (True,) * (size - 1)
    sizes.add(size)
    gaps.add(gap)
  assert sizes == {3, 4, 5, 6} and gaps == {0, 1, 2, 3, 4}
  with pytest.raises(ValueError, match="min_length"):
    td.repeat_strings(1, 4, ids, min_length=5)
  with pytest.raises(ValueError, match="gap"):
    td.repeat_strings(1, 4, ids, gap=-1)
  with pytest.raises(ValueError, match="length"):
    td.repeat_strings(1, 1, ids)
  with pytest.raises(ValueError, match="token_ids"):
    td.repeat_strings(1, 4, [3, 3])


def test_lookup_strings_train_each_value_after_its_key_comes_again():
  ids = list(range(3, 23))
  looks = td.lookup_strings(25, 4, 2, 3, ids, seed=1)
  assert len(looks) == 25 and {e.kind for e in looks} == {"lookup"}
  for e in looks:
    x, m = e.token_ids, e.loss_mask
    assert len(x) == len(m) == 2 * 4 * 5 and not any(m[:20]) and set(x) <= set(ids)
    table = {x[i:i + 2]: x[i + 2:i + 5] for i in range(0, 20, 5)}
    assert len(table) == 4  # distinct keys
    queries = [x[i:i + 5] for i in range(20, 40, 5)]
    assert sorted(q[:2] for q in queries) == sorted(table) and all(q[2:] == table[q[:2]] for q in queries)
    assert m[20:] == (False, False, True, True, True) * 4  # the values trained, not the keys
  assert any(e.token_ids[20:22] != e.token_ids[:2] for e in looks)  # queries come in another order
  assert [e.token_ids for e in td.lookup_strings(25, 4, 2, 3, ids, seed=1)] == [e.token_ids for e in looks]
  with pytest.raises(ValueError, match="pairs"):
    td.lookup_strings(1, 0, 2, 3, ids)
  with pytest.raises(ValueError, match="too few keys"):
    td.lookup_strings(1, 3, 1, 3, [3, 4])


def test_the_copy_stage_warms_up_on_repeats_then_mixes_them_into_the_drills(episodes, formatter, monkeypatch):
  """copy_stage.warmup_steps on the repeats alone, then the drills with the repeats mixed in; each
  check scores the held-out drills and fresh repeats (episodes of 8 tasks train, 4 others check)."""
  from experiments import tau2_sft
  from rti_jax.policy import sft

  _, eps = episodes["retail"]
  monkeypatch.setattr(tau2_sft, "cached_episodes", lambda domain, tasks, env: eps[8:])
  cfg = build_config.load_tau2(None, ["copy_stage.steps=2", "copy_stage.examples=6", "copy_stage.check_every=1",
                                      "copy_stage.check_examples=3", "copy_stage.repeats=40", "copy_stage.repeat_len=8",
                                      "copy_stage.lookups=10", "copy_stage.lookup_pairs=3",
                                      "copy_stage.warmup_steps=2", "copy_stage.target=2"], quick=True)
  tok = formatter.tokenizer
  model, _ = sft.new_tiny_policy(tok, cfg.model, 4096, 0)
  logs: list[str] = []
  out = tau2_sft.run_copy_stage(model, cfg, {"episodes": eps[:8], "fmt": formatter, "domain": "retail",
                                             "held": ["held-out"]}, tok.pad_token_id or 0, logs.append)
  assert out["warmup"]["steps"] == 2 and len(out["warmup"]["losses"]) == 2
  assert out["steps"] == 2 and out["examples"] == 6 + 40 + 10 and out["repeats"] == 40 and out["lookups"] == 10
  assert out["check_examples"] == 3 and [c["step"] for c in out["held_out"]] == [1, 2]
  assert all(0 <= c["repeats"] <= 1 and 0 <= c["lookups"] <= 1 and 0 <= c["exact"] <= c["tokens"] <= 1
             for c in out["held_out"])
  assert set(out["warmup"]["fresh_right"]) == {"repeats", "repeats_varied", "lookups"}
  assert any(line.startswith("warm-up on random strings: 2 steps") for line in logs)
  assert build_config.load_tau2(None, ["copy_stage.warmup_steps=5", "copy_stage.lookups=1"]).copy_stage.lookups == 1


@pytest.mark.parametrize("domain", ["retail"])
def test_every_token_trained_keeps_the_drills_and_trains_each_token_after_the_first(episodes, formatter, domain):
  """copy_stage.loss=all: the same token ids, the loss on every token that has one before it (the
  copying turn among them), and the values the drill's earlier messages repeat are trained too."""
  _, eps = episodes[domain]
  drills = td.copy_drills(eps, formatter, 20, seed=4)
  every = td.every_token_trained(drills)
  tok = formatter.tokenizer
  repeated = 0
  for d, e in zip(drills, every):
    assert (e.token_ids, e.task_id, e.kind) == (d.token_ids, d.task_id, d.kind)
    assert e.loss_mask == (False,) + (True,) * (len(d.token_ids) - 1)
    first = d.loss_mask.index(True)
    assert sum(d.loss_mask) < sum(e.loss_mask) and all(e.loss_mask[first:])
    call = td._turn_call(tok.decode(list(d.token_ids[first:])).replace("<|im_end|>", ""))
    before = tok.decode(list(d.token_ids[:first]))
    repeated += call is not None and any(before.count(v) >= 2 for _, v in td._copied_values(call))
  assert repeated >= 1  # some value shows twice before its copying turn: an earlier copy, now trained


def test_mix_and_config_errors_name_the_field():
  with pytest.raises(ValueError, match="continue_share"):
    td.Tau2Mix(continue_share=1.5)
  with pytest.raises(ValueError, match="correction"):
    td.Tau2Mix(correction="oracle")
  bad = [("data.holdout", ["data.holdout=600"]), ("eval.max_turns", ["eval.max_turns=0"]),
         ("data.repeats", ["data.repeats=-1"]), ("data.nope", ["data.nope=1"]),
         ("tokenizer.pattern", ["tokenizer.pattern=bytes"]), ("copy_stage.cut", ["copy_stage.cut=maybe"]),
         ("copy_stage.loss", ["copy_stage.loss=values"]), ("tokenizer.value_type_init", ["tokenizer.value_type_init=-1"]),
         ("copy_stage.warmup_steps", ["copy_stage.warmup_steps=5"]),
         ("copy_stage.repeat_min_len", ["copy_stage.repeat_min_len=64"]),
         ("copy_stage.repeat_gap", ["copy_stage.repeat_gap=-2"]),
         ("copy_stage.lookup_key_len", ["copy_stage.lookup_key_len=0"]),
         ("copy_stage.repeat_len", ["copy_stage.repeats=5", "copy_stage.repeat_len=1"])]
  for key, overrides in bad:
    with pytest.raises(ConfigError, match=re.escape(key)):
      build_config.load_tau2(None, overrides)
  assert build_config.load_tau2(None, ["copy_stage.cut=true"]).copy_stage.cut is True
  assert build_config.load_tau2(None, ["copy_stage.loss=all"]).copy_stage.loss == "all"
  cfg = build_config.load_tau2(None, ["train.epochs=1.5"], quick=True)
  assert cfg.train.epochs == 1.5 and cfg.model.hidden == 32 and cfg.data.holdout == 40
  assert cfg.tokenizer.pattern == "words" and build_config.load_tau2(None, ["tokenizer.pattern=digits"]).tokenizer.pattern == "digits"


def test_the_digits_pattern_gives_every_digit_of_an_id_its_own_token(episodes):
  """``tokenizer.pattern=digits``: a tokenizer trained on the episodes' texts has one token per
  digit of every order, user and item id (none merged across digits, whatever BPE learned), and
  decodes every text back exactly; under the default pattern the same ids are fewer, longer pieces."""
  import re

  from rti_jax.policy.telecom_sft_data import TELECOM_PATTERN
  from rti_jax.policy.tokenizer import build_tokenizer

  env, played = episodes["retail"]
  texts = td.corpus_texts(played, env, "feedback")
  digits = build_tokenizer(texts, 4096, pattern=td.DIGIT_PATTERN)
  words = build_tokenizer(texts, 4096, pattern=TELECOM_PATTERN)
  ids = sorted({m for t in texts for m in re.findall(r"#W[0-9]{7}|[a-z]+_[a-z]+_[0-9]{4}|[0-9]{10}", t)})
  assert len(ids) > 20
  for text in texts[:50] + ids:
    assert digits.decode(digits.encode(text, add_special_tokens=False)) == text
  pieces = {i: [digits.decode([t]) for t in digits.encode(" " + i, add_special_tokens=False)] for i in ids}
  for i, p in pieces.items():
    numerals = [q.strip() for q in p if any(c.isdigit() for c in q)]
    assert numerals == [c for c in i if c.isdigit()], (i, p)
  assert sum(len(words.encode(" " + i, add_special_tokens=False)) for i in ids) < sum(map(len, pieces.values()))


def test_the_spaced_pattern_writes_a_value_with_the_same_tokens_where_it_is_said_and_where_it_is_copied(episodes):
  """``tokenizer.pattern=spaced``: every value a gold call copies is, token for token, a run of the
  tokens of the latest earlier message that shows it (the user's sentence or a tool's reply), so a
  copy is a look-up; under ``DIGIT_PATTERN`` names, zip codes and emails are not (their first token
  carries the space before them in the sentence, the quote in the call)."""
  from rti_jax.policy.tokenizer import build_tokenizer

  env, played = episodes["retail"]
  texts = td.corpus_texts(played, env, "feedback")
  for pattern, spaced in ((td.SPACED_PATTERN, True), (td.DIGIT_PATTERN, False)):
    tok = build_tokenizer(texts, 4096, pattern=pattern)
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    found, missed = 0, []
    for ep in played:
      for k, m in enumerate(ep.good):
        call = td._turn_call(str(m["content"])) if m["role"] == "assistant" else None
        for key, v in td._copied_values(call) if call else []:
          shown = td._latest_showing(ep.good[:k + 1], v)
          if shown is None:
            continue
          in_call = re.search(r'"%s": "(%s)"' % (key, re.escape(v)), str(m["content"]))
          if in_call is None:  # a list's items
            continue
          text = str(m["content"])
          value_ids = enc(text)[len(enc(text[:in_call.start(1)])):len(enc(text[:in_call.end(1)]))]
          source = enc(str(ep.good[shown]["content"]))
          hit = any(source[i:i + len(value_ids)] == value_ids for i in range(len(source)))
          found += hit
          if not hit:
            missed.append((key, v))
    if spaced:
      assert found > 40 and not missed, missed[:5]
      for text in texts[:50]:
        assert tok.decode(enc(text)) == text
    else:
      assert {"first_name", "last_name", "zip"} <= {k for k, _ in missed}


def test_the_values_pattern_makes_every_database_value_one_token_wherever_it_appears(episodes):
  """``tokenizer.pattern=values``: with the Retail database's values added whole, every value the
  episodes' calls copy is one token, the same token in the user's or tool's text as in the call's
  JSON; the pre-tokens are Python's ``re`` matches of the same pattern; every text decodes back."""
  import re

  from tokenizers import Regex, pre_tokenizers

  from rti_jax.policy.tokenizer import add_whole_pretokens, build_tokenizer

  env, played = episodes["retail"]
  texts = td.corpus_texts(played, env, "feedback")
  values = td.database_values("retail")
  assert len(values) > 4000 and {"#W2378156", "mia_garcia_4516", "Yusuf", "80218"} <= set(values)
  tok, ids = add_whole_pretokens(build_tokenizer(texts, 4096, pattern=td.VALUE_PATTERN), values)
  assert len(ids) == len(values) and len(set(ids)) == len(values)
  split = pre_tokenizers.Split(Regex(td.VALUE_PATTERN), behavior="isolated")
  for text in texts[:80]:
    assert [t for t, _ in split.pre_tokenize_str(text)] == re.findall(td.VALUE_PATTERN, text)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
  copied = 0
  for ep in played:
    for m in ep.good:
      call = td._turn_call(str(m["content"])) if m["role"] == "assistant" else None
      for _, v in td._copied_values(call) if call else []:
        if v not in values:
          continue
        one = tok.encode(v, add_special_tokens=False)
        assert len(one) == 1 and tok.encode(f' "{v}", ', add_special_tokens=False)[1] == one[0], v
        assert one[0] in tok.encode(f"My id is {v}.", add_special_tokens=False), v
        copied += 1
  assert copied > 20


# ----------------------------------------------------------------------------- the reward audit


def test_the_audit_scores_drawn_episodes_with_taus_evaluator_too(monkeypatch):
  from rti_jax.rollout import Trajectory, TurnRecord
  from rti_jax.trainer import reward_audits

  train, _ = split_tasks("retail", "generated", 600)
  task = train[0]
  env = Tau2Env("retail", audit_share=1.0)
  gold = run_episode(env, GoldAgent(task), task)
  assert gold.reward == 1.0 and gold.info["reward_audits"] == 1 and gold.info["reward_audit_mismatches"] == 0
  nothing = run_episode(env, DoNothingAgent(), task)
  assert nothing.reward == 0.0 and nothing.info["reward_audit_mismatches"] == 0
  assert "reward_audits" not in run_episode(Tau2Env("retail"), GoldAgent(task), task).info
  # a fast reward that disagrees with tau2's evaluator is counted
  real = bridge.fast_reward
  monkeypatch.setattr(bridge, "fast_reward", lambda *a, **k: dataclasses.replace(real(*a, **k), reward=0.0))
  wrong = run_episode(env, GoldAgent(task), task)
  assert wrong.reward == 0.0 and wrong.info["reward_audit_mismatches"] == 1
  # the draw is a function of the episode: a share of 0.5 draws the same episode the same way
  half = [run_episode(Tau2Env("retail", audit_share=0.5), DoNothingAgent(), t).info.get("reward_audits", 0)
          for t in (train[1], train[1], train[2], train[2])]
  assert half[0] == half[1] and half[2] == half[3]
  with pytest.raises(ValueError, match="audit_share"):
    Tau2Env("retail", audit_share=1.5)

  def traj(info):
    return Trajectory("t", [], [], [], [], [], [], 0, [], turns=[TurnRecord(0, 0, 0, "", "stop", env_info=info)])

  groups = [[traj({"reward_audits": 1, "reward_audit_mismatches": 1}), traj({})],
            [traj({"reward_audits": 1, "reward_audit_mismatches": 0})]]
  assert reward_audits(groups) == {"reward_audit/checked": 2, "reward_audit/mismatched": 1}
  assert reward_audits([[traj({})]]) == {}


@pytest.fixture(scope="module")
def quick_build(tmp_path_factory):
  """``--exp=tau2_sft --env retail --quick`` (with its held-out checks): the build's output dir."""
  from experiments import tau2_sft

  out = tmp_path_factory.mktemp("tau2_quick") / "rsft"
  assert tau2_sft.main(["--env", "retail", "--quick", "--out", str(out)]) == 0
  return out


@pytest.mark.slow
def test_quick_build_writes_a_policy_its_card_and_the_held_out_checks(quick_build, tmp_path):
  from experiments import tau2_sft
  from models import from_pretrained

  out = quick_build
  policy = out / "policy"
  build = json.loads((policy / "build.json").read_text())
  assert build["domain"] == "retail" and build["builder"] == "tau2_sft" and build["config"]["data"]["max_tasks"] == 8
  _, cfg = from_pretrained(str(policy))
  assert cfg.num_layers == 1
  metrics = json.loads((out / "metrics.json").read_text())
  assert metrics["decision"]["tasks"] >= 30 and 0 <= metrics["decision"]["p_right_first_token"] <= 1
  sampled = metrics["eval"]["sampled"]
  failed = sum(r < 1 for g in sampled["rewards"] for r in g)
  assert sum(sampled["derailed"].values()) == failed
  card = (policy / "README.md").read_text()
  assert "tau2-Retail" in card and "first derailment" in card
  assert metrics["sft"]["fresh_right"] == {}  # no random strings trained, none checked
  # a build that continues it (OPD's teacher) keeps its tokenizer and shape; repeats kept in its mix
  out2 = tmp_path / "teacher"
  assert tau2_sft.main(["--env", "retail", "--quick", "--no-eval", "--out", str(out2), f"init={policy}",
                        "data.resolve_share=1.0", "data.repeats=12", "copy_stage.repeat_len=8", "data.lookups=5"]) == 0
  m2 = json.loads((out2 / "metrics.json").read_text())
  assert m2["data"]["kinds"]["repeat"] == 12 and m2["data"]["kinds"]["lookup"] == 5
  assert set(m2["sft"]["fresh_right"]) == {"repeats", "repeats_varied", "lookups"} and all(0 <= v <= 1 for v in m2["sft"]["fresh_right"].values())
  assert (out2 / "policy" / "tokenizer.json").read_text() == (policy / "tokenizer.json").read_text()
  _, cfg2 = from_pretrained(str(out2 / "policy"))
  assert cfg2 == cfg


@pytest.mark.slow
def test_a_compare_run_checks_its_episodes_against_taus_evaluator(quick_build, tmp_path):
  """The smoke-built Retail policy through ``--exp=compare --quick`` (RTI, whose iteration holds every
  rollout GRPO's does) with every episode audited: the training records and the evaluations count
  their checks, and tau2's evaluate_simulation agrees with every reward the run used. (Airline's
  rewards go through the same adapter and audit; its fast reward is checked against tau2's evaluator
  in tests/test_tau2_domains.py.)"""
  from experiments import compare

  domain = "retail"
  out = tmp_path / "cmp"
  assert compare.main(["--env", domain, "--quick", "--no-progress", "--out", str(out), "--test-tasks", "2",
                       "--methods", "rti", f"policy.path={quick_build / 'policy'}", f"env.{domain}.audit_share=1.0",
                       "env.max_turns=8"]) == 0
  results = json.loads((out / "results.json").read_text())
  run = results["runs"]["0"]
  for method in ("rti",):
    records = [json.loads(line) for line in (out / "seed0" / method / "metrics.jsonl").read_text().splitlines()]
    # --quick: one iteration of 2 tasks x G = 2
    assert [(r["reward_audit/checked"], r["reward_audit/mismatched"]) for r in records] == [(4, 0)]
    # the test split's evaluation: 2 tasks x 2 samples
    assert (run[method]["reward_audit/checked"], run[method]["reward_audit/mismatched"]) == (4, 0)
  cols = results["table"]["columns"]
  assert cols[-1] == "reward checks (off)" and all(r[-1].endswith("(0)") for r in results["table"]["rows"][1:])


def test_copy_errors_puts_each_trained_token_in_its_value_tool_or_format_class():
  """``experiments/diagnostics/copy_errors.classify``: a call's tokens fall in the class of the
  argument value, tool name or JSON they carry, numbered within each value."""
  from experiments.diagnostics.copy_errors import classify
  from rti_jax.envs.tau2.agents import tool_call_text
  from rti_jax.policy.tokenizer import build_tokenizer

  turn = tool_call_text("get_order_details", {"order_id": "#W2378156"})
  tok = build_tokenizer([turn] * 20 + ["a few other words"] * 5, 512, pattern=td.DIGIT_PATTERN)
  ids = tok.encode("Hello " + turn, add_special_tokens=False)
  start = len(tok.encode("Hello ", add_special_tokens=False))
  assert tok.decode(ids[start:]) == turn
  call = td._turn_call(turn)
  classes = classify(tok, ids, start, call, td._copied_values(call))
  pieces = [tok.decode([i]) for i in ids[start:]]
  assert len(classes) == len(pieces)
  value = [(p, k) for p, (c, k) in zip(pieces, classes) if c == "value:order_id"]
  assert "".join(p for p, _ in value).strip(' "') == "#W2378156" and [k for _, k in value] == list(range(len(value)))
  assert len(value) >= 8  # "#", "W" and seven digits: a digit is never merged with another
  assert "".join(p for p, (c, _) in zip(pieces, classes) if c == "tool name").strip(' "') == "get_order_details"
  assert all(k == -1 for c, k in classes if not c.startswith("value:"))
  assert "".join(p for p, (c, _) in zip(pieces, classes) if c == "other").startswith("<tool_call>")
