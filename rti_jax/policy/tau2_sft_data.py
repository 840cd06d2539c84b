"""SFT data for the tiny tau2-Retail and tau2-Airline policies: scripted episodes -> token sequences.

Examples are laid out exactly as the rollout engine lays out an episode (``sft_example.encode_messages``)
and played through ``Tau2Env`` (condensed policy text, compact observations, the scripted user) on the
tasks passed in: pass the generated training tasks only, without the RL validation tail.

Which agent. ``agents.GoldAgent``: it asks the user to identify themself, runs the identification
and look-up calls, lists the write's exact details and asks for a yes, runs the write, then closes.
Every id and value it uses was said by the user or returned by an earlier call, so a policy can learn
to read them off the conversation (the generated tasks' gold calls all succeed).

The decision (the paper's "small early error at a task-critical step"). The *decisive turn* of an
episode is the first confirmation of a write ("To confirm, I will ..."), right after the look-ups.
Its mistake is handing the customer to a person: a ``transfer_to_human_agents`` call
(``MistakeAgent``), which ends the episode with every write undone, reward 0 (the rule Validator
flags it ``premature_end``). The right turn and the mistake differ in the turn's first token
(``To`` vs ``<tool_call>``). Tasks without a write (refusals) have no decision and give ``plain``
examples only.

The mix (``sft_example.KINDS`` names; ``Tau2Mix`` holds the shares), as for Telecom
(``telecom_sft_data``): ``trusting`` (the mistaken episode, every task with a decision: the habit),
``plain``, ``resolve`` (the gold episode, all trained), ``resolve_ctx`` (the decisive turn as
context, the turns after it trained: after an accepted correction the policy goes on), ``resolve_tail``
(every assistant token trained but the decisive turn's first), and ``correction`` (p_cal as the
intervention pipeline builds it with the rule Validator's verdict on the mistaken draft -> the
gold confirmation, trained on the target only).

Retries (``retry_examples``, kind ``retry``): the gold episodes never show a tool error, and a tiny
policy's first wrong look-up (a name or a zip code one token off) left it writing broken calls
until the turn limit. A retry is a gold prefix up to a read call, that call first sent with one
copied value wrong (another of its kind, or one character changed) and answered by the tool's own
error, then the gold call, the only turn trained; likewise a write's confirmation with one value
wrong, refused by the scripted user, then the gold confirmation.

Copy drills (``copy_drills``, kind ``name_swap``): a tiny model trained on the mix alone writes
names, zip codes and ids it has seen in training instead of the ones in front of it (the first build's
samples called ``find_user_id_by_name_zip`` with another customer's name). A drill is a gold prefix,
without the system turn, in which every value the next turn copies is swapped for another of its
kind, with only that turn trained: the turn is right only if it is read off the conversation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rti_jax.envs.tau2 import bridge
from rti_jax.envs.tau2.agents import GoldAgent, describe_call, tool_call_text
from rti_jax.envs.tau2.condensed import TRANSFER_MESSAGE
from rti_jax.envs.tau2.env import Tau2Env
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.intervention.prompting import correction_message
from rti_jax.policy.sft_example import (SFTExample, assistant_indices, encode_messages, play, step_context,
                                        without_system_turn)
from rti_jax.policy.telecom_sft_data import MixShares, correction_example, tail_example
from rti_jax.rollout import ChatFormatter

Message = dict[str, Any]
SYSTEM_REPEATS = 4
#: The ``digits`` pre-tokenizer of the tau2 builds (``tokenizer.pattern=digits``): runs of letters
#: (with a leading space), every digit alone, underscores alone, other symbols in runs, whitespace.
#: tau2's ids then have one token per character class step: ``#W2378156`` is ``#``, ``W`` and seven
#: digits, ``mia_garcia_4516`` is ``mia _ garcia _ 4 5 1 6``, and every id is copied one digit at a
#: time, against ``TELECOM_PATTERN``'s BPE pieces of varying length (``W 23 78 156``).
DIGIT_PATTERN = r" ?[A-Za-z]+| ?[0-9]|_| ?[^\sA-Za-z0-9_]+|\s+"
_ID = r"(?=[#A-Za-z0-9_.@\-]*[0-9])#?[A-Za-z0-9_]+(?:[.@\-][A-Za-z0-9_]+)*"
_CAPITALISED = r"[A-Z][a-z]+(?![A-Za-z0-9_])"
#: The ``values`` pre-tokenizer (``tokenizer.pattern=values``): a run of id characters with a digit
#: in it (``#W2378156``, ``mia_garcia_4516``, ``mia.garcia4516@example.com``, ``2024-05-19``,
#: ``HAT006``) and a capitalised word are each one pre-token without the space before them (the
#: space is one of its own), so a value is the same pre-token in a user's sentence, a tool reply
#: and a call's JSON; the rest as ``TELECOM_PATTERN``, but ``#`` never joins the symbols before it.
#: With every database value made one token (``database_values``), copying a value is one
#: attention step to one token, as for Navigation's place names (docs/tiny_policy.md).
VALUE_PATTERN = (rf"{_ID}|{_CAPITALISED}| (?={_ID}|{_CAPITALISED})"
                 r"| ?[A-Za-z_][A-Za-z0-9_]*| ?[0-9]+(?:\.[0-9]+)?| ?[^\sA-Za-z0-9_#]+| ?#|\s+")
#: The ``spaced`` pre-tokenizer (``tokenizer.pattern=spaced``): ``DIGIT_PATTERN`` with the space
#: before a value (a run of id characters with a digit in it, or a capitalised word) a token of its
#: own, and ``#`` never joined to the symbols before it. Under ``DIGIT_PATTERN`` a value's first token
#: differs between where it is said and where a call writes it: ``ĠJuan`` in "My name is Juan" but
#: ``Juan`` after the call's quote, ``Ġ7`` against ``7`` for a zip code, ``Ġ#`` against ``Ġ"#`` for an
#: order id, so the first token of every value is a mapping to learn, not a copy. Here a value is
#: the same tokens wherever it appears.
SPACED_PATTERN = rf" (?={_ID}|{_CAPITALISED})| ?[A-Za-z]+| ?[0-9]|_| ?[^\sA-Za-z0-9_#]+| ?#|\s+"
CONFIRM_PREFIX = "To confirm, I will"
TRANSFER_SUMMARY = "The customer needs help with a change I could not complete."
TRANSFER = "transfer_to_human_agents"


class MistakeAgent:
  """The gold replay until its first write confirmation, where it transfers the customer instead
  (the episode ends there); then ``TRANSFER_MESSAGE`` if the episode goes on."""

  def __init__(self, task: Any) -> None:
    self.gold = GoldAgent(task)
    self.transferred = False

  def act(self, messages: list[Message]) -> str:
    if self.transferred:
      return TRANSFER_MESSAGE
    text = self.gold.act(messages)
    if text.startswith(CONFIRM_PREFIX):
      self.transferred = True
      return tool_call_text(TRANSFER, {"summary": TRANSFER_SUMMARY})
    return text


def make_env(domain: str, max_turns: int = 30) -> Tau2Env:
  """The env the examples are played in: the condensed policy, compact observations, scripted user."""
  return Tau2Env(domain, policy_text="condensed", max_turns=max_turns)


def decisive_index(messages: Sequence[Message]) -> int | None:
  """Index in ``messages`` of the first assistant turn that confirms a write, or None."""
  return next((i for i, m in enumerate(messages)
               if m.get("role") == "assistant" and str(m.get("content", "")).startswith(CONFIRM_PREFIX)), None)


@dataclasses.dataclass(frozen=True)
class Tau2Mix(MixShares):
  """Shares of the SFT mix (module docstring; ``telecom_sft_data.MixShares``)."""


@dataclasses.dataclass(frozen=True)
class Episodes:
  """One task's scripted episodes: ``good`` (the gold replay) and ``bad`` (the mistaken one; None
  when the gold episode has no decisive turn), ``decisive`` (its index in both) and whether the gold
  episode scored 1 (``ok``)."""

  task: Any
  good: list[Message]
  bad: list[Message] | None
  decisive: int | None
  ok: bool


def play_episodes(tasks: Sequence[Any], env: Tau2Env) -> list[Episodes]:
  """Each task's gold and mistaken episodes, played once (playing is most of a build's data time).

  Raises ValueError if a mistaken episode scores above 0 (the data would teach something else).
  """
  out = []
  for task in tasks:
    good = play(env, GoldAgent(task), task)
    ok = env.transcript.reward >= 1.0
    d = decisive_index(good) if ok else None
    bad = None
    if d is not None:
      bad = play(env, MistakeAgent(task), task)
      if env.transcript.reward != 0.0:
        raise ValueError(f"task {task.task_id}: the mistaken episode got reward {env.transcript.reward}, expected 0")
    out.append(Episodes(task, good, bad, d, ok))
  return out


def build_examples(episodes: Sequence[Episodes], env: Tau2Env, formatter: ChatFormatter, mix: Tau2Mix = Tau2Mix(),
                   ) -> tuple[list[SFTExample], dict[str, int]]:
  """The SFT mix over ``episodes`` (of training tasks only); deterministic for ``mix.seed``. Also
  returns counts: ``dropped_gold`` (tasks whose gold episode did not score 1 through the text
  interface: left out), ``corrections_rejected`` (correction examples the rule roles would not
  produce: the Validator accepted the draft or the Verifier rejected the target)."""
  rng = np.random.default_rng(mix.seed)
  tail_rng = np.random.default_rng([mix.seed, 1])
  out: list[SFTExample] = []
  counts = {"dropped_gold": 0, "corrections_rejected": 0}

  def add(task: Any, kind: str, messages: Sequence[Message], trained: Sequence[bool] | None = None) -> None:
    ids, mask = encode_messages(formatter, messages, trained)
    out.append(SFTExample(task.task_id, kind, tuple(ids), tuple(mask)))

  for ep in episodes:
    task, good, bad, d = ep.task, ep.good, ep.bad, ep.decisive
    if not ep.ok:
      counts["dropped_gold"] += 1
      continue
    if d is None or bad is None:
      add(task, "plain", good)
      continue
    add(task, "trusting", bad)
    a_idx = assistant_indices(good)
    j = a_idx.index(d)
    u = rng.random(3)
    if u[0] < mix.resolve_share:
      add(task, "resolve", good)
    elif u[1] < mix.continue_share:
      add(task, "resolve_ctx", good, [k != j for k in range(len(a_idx))])
    if u[2] < mix.correction_share:
      ex = correction_example(formatter, env, task, good[:d], bad[d]["content"], good[d]["content"],
                              mix.correction, domain=task.domain)
      if ex is None:
        counts["corrections_rejected"] += 1
      else:
        out.append(ex)
    if tail_rng.random() < mix.complete_share:
      out.append(tail_example(formatter, task, good, d))
  return out, counts


def database_values(domain: str) -> list[str]:
  """Every string of the domain's initial tau2 database (keys and values, nested) that
  ``VALUE_PATTERN`` keeps whole as an id or a capitalised word: the values a call copies (ids, names,
  zip codes, emails, dates, flight numbers ...), sorted. About 4,900 for Retail, 7,700 for Airline."""
  import re

  from rti_jax.envs.tau2 import bridge

  whole = re.compile(f"{_ID}|{_CAPITALISED}")
  found: set[str] = set()
  stack: list[Any] = [bridge._pristine(domain)[1]]  # the parsed contents tau2's loader gave, read only
  while stack:
    x = stack.pop()
    if isinstance(x, dict):
      stack.extend(x.keys())
      stack.extend(x.values())
    elif isinstance(x, (list, tuple)):
      stack.extend(x)
    elif isinstance(x, str) and whole.fullmatch(x):
      found.add(x)
  return sorted(found)


def corpus_texts(episodes: Sequence[Episodes], env: Tau2Env, correction: str = "feedback") -> list[str]:
  """Texts the tokenizer is trained on: the system prompt (``SYSTEM_REPEATS`` times), every message
  of the gold and mistaken episodes, and the correction message on each mistaken decisive turn."""
  from rti_jax.intervention.pipeline import rule_roles

  texts = [episodes[0].good[0]["content"]] * SYSTEM_REPEATS if episodes else []
  for ep in episodes:
    texts += [m["content"] for m in ep.good[1:]]
    if ep.bad is None or ep.decisive is None:
      continue
    texts += [m["content"] for m in ep.bad[1:]]
    env.reset(ep.task)
    ctx = step_context(ep.good[:ep.decisive], ep.bad[ep.decisive]["content"], env, ep.task.domain)
    texts.append(correction_message(correction, ctx, rule_roles(ep.task.domain)[0].judge(ctx)))
  return texts


def step_kind(text: str, writes: frozenset[str] | set[str]) -> str:
  """What an assistant turn does: ``transfer``, ``write`` (a call to one of ``writes``), ``call``
  (a look-up), ``malformed`` (a call block that does not parse), ``stop`` (``###STOP###``),
  ``confirm`` (a write confirmation) or ``message``."""
  turn = parse_assistant_turn(text)
  names = [c.name for c in turn.tool_calls]
  if TRANSFER in names:
    return "transfer"
  if any(n in writes for n in names):
    return "write"
  if names:
    return "call"
  if turn.errors:
    return "malformed"
  if "###STOP###" in text:
    return "stop"
  return "confirm" if text.strip().startswith(CONFIRM_PREFIX) else "message"


def first_derailment(env: Tau2Env, task: Any, messages: Sequence[Message]) -> dict[str, Any] | None:
  """Where an episode left every path to the gold outcome: the first assistant turn the domain's rule
  Validator flags (judged on the history before it), as ``{"turn": its 0-based assistant index,
  "kind": step_kind, "errors": the Validator's error types}``; None when no turn is flagged."""
  from rti_jax.envs.tau2 import bridge
  from rti_jax.intervention.pipeline import rule_roles

  validator, _ = rule_roles(task.domain)
  writes = frozenset(bridge.tool_info(task.domain)[1])
  env.reset(task)
  for n, i in enumerate(assistant_indices(messages)):
    draft = str(messages[i].get("content", ""))
    verdict = validator.judge(step_context(messages[:i], draft, env, task.domain))
    if not verdict.is_valid:
      return {"turn": n, "kind": step_kind(draft, writes), "errors": list(verdict.error_types)}
  return None


#: argument keys whose values a turn copies from the conversation (what a copy drill swaps)
COPY_KEYS = frozenset({
    "first_name", "last_name", "zip", "email", "user_id", "order_id", "item_ids", "new_item_ids", "product_id",
    "payment_method_id", "address1", "address2", "city", "state", "country", "reservation_id", "flight_number",
    "date", "dob", "cabin", "origin", "destination", "payment_id",
})


#: argument keys of a write whose value the request picks from a fixed set rather than copies
#: (tau2 Retail's cancellation reason: "no longer needed" or "ordered by mistake", which the user says
#: in words of their own); a confirmation retry may get one wrong
CHOSEN_KEYS = frozenset({"reason"})


def _copied_values(name_args: tuple[str, Any]) -> list[tuple[str, str]]:
  """(key, value) of every string leaf under a ``COPY_KEYS`` key of a call's arguments."""
  out: list[tuple[str, str]] = []

  def walk(key: str, v: Any) -> None:
    if isinstance(v, dict):
      for k, x in v.items():
        walk(k, x)
    elif isinstance(v, list):
      for x in v:
        walk(key, x)
    elif isinstance(v, str) and key in COPY_KEYS and len(v) >= 2:
      out.append((key, v))

  walk("", name_args[1])
  return out


def _turn_call(text: str) -> tuple[str, Any] | None:
  turn = parse_assistant_turn(text)
  return (turn.tool_calls[0].name, turn.tool_calls[0].arguments) if len(turn.tool_calls) == 1 else None


def _latest_showing(messages: list[dict[str, Any]], value: str) -> int | None:
  """The index of the latest message between the system turn and the last message whose text
  holds ``value``; None when none does."""
  return next((k for k in range(len(messages) - 2, 0, -1) if value in str(messages[k]["content"])), None)


def _last_messages_showing(messages: list[dict[str, Any]], values: Sequence[str], context: int) -> list[dict[str, Any]]:
  """The system turn, then the messages from the latest that shows the value seen least recently,
  ``context`` messages earlier, back to the user turn that opens that exchange (a conversation
  starts with the user); all of them when a value is not shown."""
  start = len(messages) - 1
  for v in values:
    k = _latest_showing(messages, v)
    if k is None:
      return messages
    start = min(start, k)
  start = max(1, start - context)
  while start > 1 and messages[start]["role"] != "user":
    start -= 1
  return messages[:1] + messages[start:]


def _only_messages_showing(messages: list[dict[str, Any]], values: Sequence[str], context: int
                           ) -> list[dict[str, Any]]:
  """The system turn, the opening request, and for each value the latest message that shows it
  with ``context`` messages before it, back to the agent turn that a tool result or user reply
  answers, then the last message; everything else dropped, the order kept. A kept agent turn keeps
  the messages that answer it, so that agent and environment turns alternate as in an episode. All
  of them when a value is not shown."""
  last = len(messages) - 1
  keep = {1}
  for v in values:
    k = _latest_showing(messages, v)
    if k is None:
      return messages
    lo = max(1, k - context)
    while lo > 1 and messages[lo]["role"] != "assistant":
      lo -= 1
    keep.update(range(lo, k + 1))
  for a in sorted(k for k in keep if messages[k]["role"] == "assistant"):
    k = a + 1
    while k < last and messages[k]["role"] != "assistant":
      keep.add(k)
      k += 1
  return messages[:1] + [messages[k] for k in sorted(keep)] + messages[-1:]


def every_token_trained(examples: Sequence[SFTExample]) -> list[SFTExample]:
  """``examples`` with every token but the first trained: a language-model loss over the whole
  conversation, in which every value that a message repeats from an earlier one (a call's id
  echoed by its result, a user's zip code in the agent's call) is a copy to learn, not only the
  copying turn of a drill."""
  return [dataclasses.replace(e, loss_mask=(False,) + (True,) * (len(e.token_ids) - 1)) for e in examples]


def repeat_strings(n: int, length: int, token_ids: Sequence[int], seed: int = 0, min_length: int | None = None,
                   gap: int = 0) -> list[SFTExample]:
  """``n`` strings of ``min_length``..``length`` tokens (each length equally likely; all ``length``
  by default) drawn uniformly from ``token_ids``, each written twice with 0..``gap`` random tokens
  between the copies, the second copy trained from its second token on (its first does not follow
  from anything before it). Predicting the repeat takes the look-up a copy needs (attend to where
  the current token occurred before, write the token after it), on data dense enough for a tiny
  model to learn within a few hundred steps. With one length and no gap a repeat can also be
  predicted from a fixed distance back, which a tiny model learns instead and which copies nothing
  else (the research log, 2026-12-07); varied lengths or gaps leave only the look-up. Deterministic
  for ``seed``."""
  lo = length if min_length is None else min_length
  if not 2 <= lo <= length:
    raise ValueError(f"length, min_length: expected 2 <= min_length <= length, got {lo}, {length}")
  if gap < 0:
    raise ValueError(f"gap: expected an integer >= 0, got {gap}")
  ids = np.asarray(sorted(set(int(i) for i in token_ids)))
  if len(ids) < 2:
    raise ValueError(f"token_ids: expected at least 2 distinct ids, got {len(ids)}")
  rng = np.random.default_rng([seed, 11])
  varied = lo < length or gap > 0  # one length, no gap: draw nothing more, so earlier builds' strings stay the same
  out = []
  for k in range(n):
    size = int(rng.integers(lo, length + 1)) if varied else length
    x = tuple(int(i) for i in rng.choice(ids, size=size))
    fill = tuple(int(i) for i in rng.choice(ids, size=int(rng.integers(0, gap + 1)))) if varied else ()
    mask = (False,) * (size + len(fill) + 1) + (True,) * (size - 1)
    out.append(SFTExample(f"repeat_{k}", "repeat", x + fill + x, mask))
  return out


def lookup_strings(n: int, pairs: int, key_len: int, value_len: int, token_ids: Sequence[int],
                   seed: int = 0) -> list[SFTExample]:
  """``n`` associative-recall strings: ``pairs`` random keys of ``key_len`` tokens, each followed by
  a random value of ``value_len`` tokens, then every key again in another order, each followed by its
  value, trained. A value's first token follows only from its key's earlier occurrence (find the
  key, write what came after it), the step a copy of an id or a name out of a conversation begins
  with; its later tokens follow from the value's own earlier tokens, as in ``repeat_strings``.
  Tokens drawn uniformly from ``token_ids``; keys distinct within a string. Deterministic for
  ``seed``."""
  if pairs < 1 or key_len < 1 or value_len < 1:
    raise ValueError(f"pairs, key_len, value_len: expected integers >= 1, got {pairs}, {key_len}, {value_len}")
  ids = np.asarray(sorted(set(int(i) for i in token_ids)))
  if len(ids) ** key_len < 2 * pairs:
    raise ValueError(f"token_ids: {len(ids)} distinct ids give too few keys of {key_len} tokens for {pairs} pairs")
  rng = np.random.default_rng([seed, 13])
  out = []
  for k in range(n):
    keys: list[tuple[int, ...]] = []
    while len(keys) < pairs:
      key = tuple(int(i) for i in rng.choice(ids, size=key_len))
      if key not in keys:
        keys.append(key)
    values = [tuple(int(i) for i in rng.choice(ids, size=value_len)) for _ in range(pairs)]
    x: list[int] = [t for key, v in zip(keys, values) for t in key + v]
    mask = [False] * len(x)
    for j in rng.permutation(pairs):
      x += keys[j] + values[j]
      mask += [False] * key_len + [True] * value_len
    out.append(SFTExample(f"lookup_{k}", "lookup", tuple(x), tuple(mask)))
  return out


def copy_drills(episodes: Sequence[Episodes], formatter: ChatFormatter, n: int, seed: int = 0,
                context: int = -1, cut: bool = False) -> list[SFTExample]:
  """``n`` short examples (no system turn, kind ``name_swap``) that train one gold turn which copies
  values from the conversation: a call, or the confirmation that lists the next write's details.
  Each takes a gold episode's prefix up to that turn and swaps every value the turn copies
  (names, zip codes, emails and every id, address and date) for another value of the same key seen in
  the training episodes, everywhere in the prefix at once, so the turn can only be right by reading
  the conversation; only that turn is trained. Deterministic for ``seed``.

  ``context`` >= 0 shortens the prefix: it keeps the last messages that together show every value
  the turn copies (from the latest message that shows the value seen least recently), ``context``
  messages before them, and those back to the user turn they follow; -1 keeps the whole
  conversation. A value no earlier message shows keeps the whole conversation too.

  ``cut`` keeps less: the opening request and only the messages that last show each value (a tool
  result or user reply with the agent turn it answers), each with ``context`` messages before it
  (``max(context, 0)``), the messages between them dropped."""
  import re

  rng = np.random.default_rng([seed, 7])
  targets: list[tuple[Episodes, int, list[tuple[str, str]]]] = []
  pool: dict[str, set[str]] = {}
  for ep in episodes:
    if not ep.ok:
      continue
    idx = assistant_indices(ep.good)
    for j, i in enumerate(idx):
      text = str(ep.good[i]["content"])
      call = _turn_call(text)
      if call is None and text.startswith(CONFIRM_PREFIX) and j + 1 < len(idx):
        call = _turn_call(str(ep.good[idx[j + 1]]["content"]))
      if call is None or call[0] == TRANSFER:
        continue
      values = _copied_values(call)
      for key, v in values:
        pool.setdefault(key, set()).add(v)
      if values:
        targets.append((ep, i, values))
  pools = {k: sorted(v) for k, v in pool.items()}
  out: list[SFTExample] = []
  for _ in range(n if targets else 0):
    ep, i, values = targets[int(rng.integers(len(targets)))]
    swap: dict[str, str] = {}
    for key, v in values:
      if v not in swap and len(pools[key]) > 1:
        new = v
        while new == v:
          new = pools[key][int(rng.integers(len(pools[key])))]
        swap[v] = new
    pattern = re.compile("|".join(re.escape(v) for v in sorted(swap, key=len, reverse=True))) if swap else None
    messages = [dict(m, content=pattern.sub(lambda mt: swap[mt.group(0)], str(m["content"])) if pattern and k > 0
                     else m["content"]) for k, m in enumerate(ep.good[:i + 1])]
    if cut:
      messages = _only_messages_showing(messages, [swap.get(v, v) for _, v in values], max(context, 0))
    elif context >= 0:
      messages = _last_messages_showing(messages, [swap.get(v, v) for _, v in values], context)
    trained = [k == len(assistant_indices(messages)) - 1 for k in range(len(assistant_indices(messages)))]
    ids, mask = encode_messages(formatter, messages, trained)
    out.append(without_system_turn(formatter, SFTExample(ep.task.task_id, "name_swap", tuple(ids), tuple(mask))))
  return out


def _wrong_value(v: str, pool: Sequence[str], rng: np.random.Generator) -> str:
  """A wrong stand-in for ``v``: half the time another value of its kind from ``pool`` (if there is
  one), else ``v`` with one letter or digit changed to another of its class (case kept)."""
  others = [x for x in pool if x != v]
  if others and rng.random() < 0.5:
    return others[int(rng.integers(len(others)))]
  spots = [i for i, c in enumerate(v) if c.isalnum() and c.isascii()]
  if not spots:
    return v + "0"
  i = spots[int(rng.integers(len(spots)))]
  c = v[i]
  alphabet = "0123456789" if c.isdigit() else "abcdefghijklmnopqrstuvwxyz"
  new = c
  while new.lower() == c.lower():
    new = alphabet[int(rng.integers(len(alphabet)))]
  return v[:i] + (new.upper() if c.isupper() else new) + v[i + 1:]


def _replace_leaf(args: Any, old: str, new: str) -> Any:
  if isinstance(args, dict):
    return {k: _replace_leaf(x, old, new) for k, x in args.items()}
  if isinstance(args, list):
    return [_replace_leaf(x, old, new) for x in args]
  return new if args == old else args


class RetryAgent:
  """``GoldAgent`` whose ``at``-th plan step (a call or a confirmation) is sent first as ``wrong``,
  then as planned."""

  def __init__(self, task: Any, at: int, wrong: str) -> None:
    self.gold = GoldAgent(task)
    self.at, self.wrong, self.sent = at, wrong, False

  def act(self, messages: list[Message]) -> str:
    if self.gold._i == self.at and not self.sent:  # _i: the index of the gold plan's next step
      self.sent = True
      return self.wrong
    return self.gold.act(messages)


def retry_examples(episodes: Sequence[Episodes], env: Tau2Env, formatter: ChatFormatter, n: int, seed: int = 0,
                   confirmations: int = 0) -> tuple[list[SFTExample], int]:
  """``n`` examples (no system turn, kind ``retry``; module docstring) of a read call that the tool
  refused, then the gold call, the only trained turn; each played through ``env`` so the error is
  the tool's own. Then ``confirmations`` more of a write's confirmation with one value wrong, which
  the scripted user refuses (restating the request), then the gold confirmation. A wrong value the
  tool or the user accepts (another customer's order id, say) is drawn again, at most 8 times, then
  the draw is skipped. Returns the examples and the skipped draws. Deterministic for ``seed``."""
  rng = np.random.default_rng([seed, 17])
  writes = set(bridge.tool_info(env.domain)[1])
  calls: list[tuple[Episodes, int, tuple[str, Any], list[tuple[str, str]]]] = []
  confirms: list[tuple[Episodes, int, tuple[str, Any], list[tuple[str, str]]]] = []
  pool: dict[bool, dict[str, set[str]]] = {False: {}, True: {}}  # values of read calls / of writes
  for ep in episodes:
    if not ep.ok:
      continue
    plan = GoldAgent(ep.task).plan
    for k, (kind, what) in enumerate(plan):
      if kind != "call" or what[0] == TRANSFER:
        continue
      values = _copied_values(what)
      if what[0] in writes:  # and the values a write chooses from a fixed set (a cancellation's reason)
        values += [(key, v) for key, v in what[1].items() if key in CHOSEN_KEYS and isinstance(v, str)]
      for key, v in values:
        pool[what[0] in writes].setdefault(key, set()).add(v)
      if not values:
        continue
      if what[0] not in writes:
        calls.append((ep, k, what, values))
      elif k > 0 and plan[k - 1][0] == "say" and str(plan[k - 1][1]).startswith(CONFIRM_PREFIX):
        confirms.append((ep, k - 1, what, values))
  pools = {w: {k: sorted(v) for k, v in p.items()} for w, p in pool.items()}
  out: list[SFTExample] = []
  skipped = 0
  draws = [(calls, "Error")] * (n if calls else 0) + [(confirms, "No")] * (confirmations if confirms else 0)
  for targets, refusal in draws:
    ep, k, (name, args), values = targets[int(rng.integers(len(targets)))]
    for _try in range(8):
      key, v = values[int(rng.integers(len(values)))]
      wrong_args = _replace_leaf(args, v, _wrong_value(v, pools[refusal == "No"][key], rng))
      wrong = (tool_call_text(name, wrong_args) if refusal == "Error"
               else f"{CONFIRM_PREFIX} {describe_call(name, wrong_args)}. Shall I proceed (yes/no)?")
      messages = play_until_retry(env, RetryAgent(ep.task, k, wrong), ep.task, refusal)
      if messages is not None:
        break
    else:
      skipped += 1
      continue
    trained = [False] * (len(assistant_indices(messages)) - 1) + [True]
    ids, mask = encode_messages(formatter, messages, trained)
    out.append(without_system_turn(formatter, SFTExample(ep.task.task_id, "retry", tuple(ids), tuple(mask))))
  return out, skipped


def play_until_retry(env: Tau2Env, agent: RetryAgent, task: Any, refusal: str = "Error") -> list[Message] | None:
  """The messages of ``agent``'s episode up to its retry (the gold turn after the wrong one), or
  None when the answer to the wrong turn (the tool's or the user's) does not start with ``refusal``."""
  messages = env.reset(task)
  while True:
    text = agent.act(messages)
    result = env.step(text)
    messages = env.transcript.messages
    if agent.sent and text == agent.wrong:
      if not str(messages[-1]["content"]).startswith(refusal):
        return None
      continue
    if agent.sent:
      last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
      return list(messages[:last + 1])
    if result.done:
      return None
