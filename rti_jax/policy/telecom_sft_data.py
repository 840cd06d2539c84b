"""SFT data for the tiny Telecom policy: scripted episodes -> token sequences.

Every example is laid out exactly as the rollout engine lays out an episode
(``sft_example.encode_messages``: prompt ids, then per assistant turn ``encode_assistant(text)``,
then ``continuation_ids`` of the env messages that follow); ``loss_mask`` is True only on
assistant tokens that are trained. Episodes are played through ``TelecomEnv`` (the condensed
policy by default) with the scripted user, on the tasks passed in (pass the train split only,
without its held-out validation tail).

Which agent. The gold replay (``scripted_agents.GoldAgent`` / ``DescribedGoldAgent``) asks for
the task's gold actions, which follow the task's hidden faults, in the gold order: no message
of the conversation says which comes next, so a policy can only memorise it per train task.
The base policy imitates ``checklist_agent.ChecklistAgent`` instead (the condensed policy's
checklist, every branch read from a received message; it solves 74/74 train and 40/40 test
tasks with the scripted user).

The decision (the paper's Fig. 1 / App. D.1 failure). The *decisive turn* of an episode is its
first device step (``checklist_agent.device_step_of``): on every task that reaches the phone it
is "Please check your SIM card status and tell me what it shows." right after the line look-up.
Its typical mistake is calling the device tool itself (``check_sim_status``): the env answers with
an error observation, and the mistaken agent then apologises and stops (``MISTAKE_END``), reward 0
on every such task (a transfer would pass the tasks that need one). The right turn and the mistake
differ in the turn's first token (``Please`` vs ``<tool_call>``), so RL has to move one token.
Tasks without a device step (a suspended line whose contract ended: 2 of 74 train tasks) have no
decision and give ``plain`` examples only.

The mix (kinds reuse ``sft_example.KINDS`` names; ``TelecomMix`` holds the shares):

* ``trusting`` (the habit): on every task with a decisive turn, the mistaken episode, all turns
  trained.
* ``plain``: tasks without a device step (a suspended line whose contract ended: look-up,
  transfer), the checklist episode, all trained.
* ``resolve`` (share ``resolve_share``): the checklist episode, all trained (the right decision
  is in the repertoire but rarely sampled).
* ``resolve_ctx`` (share ``continue_share``): the checklist episode with the decisive turn as
  context only, the turns after it trained: once the right request is in the context (an
  accepted correction), the policy continues the checklist.
* ``resolve_tail`` (share ``complete_share``, its own random stream): the checklist episode,
  every assistant token trained except the decisive turn's first token: the policy can finish
  the turn once it has started it (as ``resolve_tail`` in ``sft_data``), but does not learn to start it.
* ``correction`` (share ``correction_share``): the correction prompt p_cal exactly as the
  intervention pipeline builds it (``pipeline.rule_roles("telecom")`` Validator on the mistaken
  draft, hard rule ``USER_SIDE_DEVICE_ACTION``; ``formatter.with_extra_user_message(p_roll,
  correction_message(mix.correction, ctx, judgement))``: the Validator's feedback, or the paper's
  Corrector inputs), target the checklist's decisive turn, trained on the target
  only; skipped if the Validator accepts the draft or the rule-based Verifier rejects the target.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rti_jax.envs.telecom.checklist_agent import DEVICE_REQUESTS, ChecklistAgent, device_step_of
from rti_jax.envs.telecom.condensed import CONDENSED_POLICY
from rti_jax.envs.telecom.env import AGENT_STOP, TelecomEnv
from rti_jax.envs.telecom.scripted_agents import tool_call_text
from rti_jax.envs.telecom.tasks import TelecomTask
from rti_jax.intervention.judges import ValidatorJudgement
from rti_jax.intervention.prompting import CORRECTORS, correction_message
from rti_jax.policy.sft_example import SFTExample, assistant_indices, encode_messages, play, step_context
from rti_jax.rollout import ChatFormatter

Message = dict[str, Any]
SYSTEM_REPEATS = 4
#: pre-tokenizer for the telecom tokenizer: a word or identifier takes the space before it
#: (``Ġplease``), identifiers keep ``_`` and digits (``get_customer_by_phone``, ``C1001`` can each
#: become one token), numbers, punctuation runs, whitespace: the condensed system prompt takes about a
#: third fewer tokens than with ``tokenizer.PRE_TOKENIZER_PATTERN`` (spaces as tokens, ``_`` splits).
TELECOM_PATTERN = r" ?[A-Za-z_][A-Za-z0-9_]*| ?[0-9]+(?:\.[0-9]+)?| ?[^\sA-Za-z0-9_]+|\s+"
MISTAKE_END = f"I'm sorry, I cannot do that from here. {AGENT_STOP}"


class MistakeAgent:
  """The checklist until its first device step, which it runs itself as a tool call (an error
  observation follows); then ``MISTAKE_END``."""

  def __init__(self, task: Any = None, checks: bool = True):
    self.checklist = ChecklistAgent(task, checks=checks)

  def act(self, messages: list[Message]) -> str:
    if any(m.get("role") == "assistant" and _is_device_call(str(m.get("content", ""))) for m in messages):
      return MISTAKE_END
    text = self.checklist.act(messages)
    step = device_step_of(text)
    if step is None:
      return text
    tool, args, _ = DEVICE_REQUESTS[step]
    return tool_call_text(tool, args)


def _is_device_call(text: str) -> bool:
  return any(text == tool_call_text(tool, args) for tool, args, _ in DEVICE_REQUESTS.values())


def make_env(policy: str | None = CONDENSED_POLICY, seed: int = 0) -> TelecomEnv:
  """The env the examples are played in (condensed policy by default; max turns 30)."""
  return TelecomEnv(policy=policy, seed=seed)


def decisive_index(messages: Sequence[Message]) -> int | None:
  """Index in ``messages`` of the first assistant turn that is a device step, or None."""
  return next((i for i, m in enumerate(messages)
               if m.get("role") == "assistant" and device_step_of(str(m.get("content", ""))) is not None), None)


@dataclasses.dataclass(frozen=True)
class MixShares:
  """Shares of a decision-centred SFT mix (this module's docstring; also ``tau2_sft_data``), each
  in [0, 1], the mix's seed and the correction examples' message."""

  resolve_share: float = 0.06
  continue_share: float = 0.35
  complete_share: float = 0.5
  correction_share: float = 0.6
  seed: int = 0
  correction: str = "feedback"  # the correction examples' user message (prompting.correction_message)

  def __post_init__(self) -> None:
    if self.correction not in CORRECTORS:
      raise ValueError(f"correction: expected one of {CORRECTORS}, got {self.correction!r}")
    for name in ("resolve_share", "continue_share", "complete_share", "correction_share"):
      v = getattr(self, name)
      if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name}: expected a share in [0, 1], got {v}")


@dataclasses.dataclass(frozen=True)
class TelecomMix(MixShares):
  """The Telecom mix's shares (``MixShares``) and which checklist it imitates."""

  checks: bool = True  # the checklist imitated checks before it fixes (False: fix-first)


def judge_draft(ctx: Any) -> ValidatorJudgement:
  """The rule-based Validator's judgement (the pipeline's ``rule_roles("telecom")``) of the step
  ``ctx`` (``sft_example.step_context``)."""
  from rti_jax.intervention.pipeline import rule_roles

  validator, _ = rule_roles("telecom")
  return validator.judge(ctx)


def correction_example(formatter: ChatFormatter, env: Any, task: Any, prefix: Sequence[Message],
                       draft: str, target: str, message: str = "feedback", domain: str = "telecom",
                       ) -> SFTExample | None:
  """p_cal (``prefix`` + the correction message on ``draft``: the Validator's feedback, or with
  ``message="paper"`` the paper's Corrector inputs with the backend records) -> ``target``, trained
  on the target only; None when ``domain``'s rule Validator accepts the draft or its rule Verifier
  rejects the target (any registered domain; ``env`` is that domain's)."""
  from rti_jax.intervention.pipeline import rule_roles

  env.reset(task)  # the evidence is the task's
  validator, verifier = rule_roles(domain)
  ctx = step_context(prefix, draft, env, domain)
  judgement = validator.judge(ctx)
  if judgement.is_valid or not verifier.judge(ctx, target).ok:
    return None
  p_roll, _ = encode_messages(formatter, list(prefix))
  p_cal = formatter.with_extra_user_message(p_roll, correction_message(message, ctx, judgement))
  turn = formatter.encode_assistant(target)
  return SFTExample(task.task_id, "correction", tuple(p_cal + turn), tuple([False] * len(p_cal) + [True] * len(turn)))


def tail_example(formatter: ChatFormatter, task: Any, messages: Sequence[Message], turn: int) -> SFTExample:
  """``messages`` (kind ``resolve_tail``) with every assistant token trained except the first
  token of the turn ``messages[turn]``."""
  ids, mask = encode_messages(formatter, messages)
  pos = len(encode_messages(formatter, messages[:turn])[0])  # the layout is prefix-consistent
  if not mask[pos]:
    raise ValueError(f"task {task.task_id}: the decision token at {pos} is not an assistant token")
  mask[pos] = False
  return SFTExample(task.task_id, "resolve_tail", tuple(ids), tuple(mask))


def build_examples(tasks: Sequence[TelecomTask], env: TelecomEnv, formatter: ChatFormatter,
                   mix: TelecomMix = TelecomMix()) -> list[SFTExample]:
  """The SFT mix over ``tasks`` (pass train-split tasks only); deterministic for ``mix.seed``.

  Raises ValueError if a checklist episode does not reach reward 1 or a mistaken one does not
  end with reward 0 (the data would then teach something other than intended).
  """
  rng = np.random.default_rng(mix.seed)
  tail_rng = np.random.default_rng([mix.seed, 1])
  out: list[SFTExample] = []

  def add(task: TelecomTask, kind: str, messages: Sequence[Message], trained: Sequence[bool] | None = None) -> None:
    ids, mask = encode_messages(formatter, messages, trained)
    out.append(SFTExample(task.task_id, kind, tuple(ids), tuple(mask)))

  for task in tasks:
    good = play(env, ChecklistAgent(task, checks=mix.checks), task)
    if env.transcript.reward != 1.0:
      raise ValueError(f"task {task.task_id}: the checklist episode got reward {env.transcript.reward}, expected 1")
    d = decisive_index(good)
    if d is None:
      add(task, "plain", good)
      continue
    bad = play(env, MistakeAgent(task, checks=mix.checks), task)
    if env.transcript.reward != 0.0:
      raise ValueError(f"task {task.task_id}: the mistaken episode got reward {env.transcript.reward}, expected 0")
    add(task, "trusting", bad)
    a_idx = assistant_indices(good)
    j = a_idx.index(d)
    u = rng.random(3)
    if u[0] < mix.resolve_share:
      add(task, "resolve", good)
    elif u[1] < mix.continue_share:
      add(task, "resolve_ctx", good, [k != j for k in range(len(a_idx))])
    if u[2] < mix.correction_share:
      ex = correction_example(formatter, env, task, good[:d], bad[d]["content"], good[d]["content"], mix.correction)
      if ex is not None:
        out.append(ex)
    if tail_rng.random() < mix.complete_share:
      out.append(tail_example(formatter, task, good, d))
  return out


def corpus_texts(tasks: Sequence[TelecomTask], env: TelecomEnv, checks: bool = True,
                 correction: str = "feedback") -> list[str]:
  """Texts the tokenizer is trained on: the system prompt (``SYSTEM_REPEATS`` times, so that
  BPE, which merges pairs seen at least twice, learns its words), every message of the checklist and
  mistaken episodes of ``tasks``, and the correction message (``correction``) on each mistaken
  decisive turn."""
  texts = [env.reset(tasks[0])[0]["content"]] * SYSTEM_REPEATS if tasks else []
  for task in tasks:
    good = play(env, ChecklistAgent(task, checks=checks), task)
    texts += [m["content"] for m in good[1:]]
    bad = play(env, MistakeAgent(task, checks=checks), task)
    texts += [m["content"] for m in bad[1:]]
    d = decisive_index(good)
    if d is not None:
      env.reset(task)
      ctx = step_context(good[:d], bad[d]["content"], env, "telecom")
      texts.append(correction_message(correction, ctx, judge_draft(ctx)))
  return texts


def first_device_step(messages: Sequence[Message]) -> str:
  """How an episode's first device step went: "mistake" (the agent called a user-device tool
  itself), "asked" (it asked the user to do something on the phone, by tool name or in words),
  "malformed" (before either, a turn with a tool-call block that does not parse: the step was
  botched, not decided), or "none" (no device step in the episode)."""
  from rti_jax.envs.telecom import device_tools as dt
  from rti_jax.envs.tool_calls import parse_assistant_turn
  from rti_jax.intervention.rules_telecom import device_requests

  for m in messages:
    if m.get("role") != "assistant":
      continue
    turn = parse_assistant_turn(str(m.get("content", "")))
    if any(c.name in dt.DEVICE_TOOLS for c in turn.tool_calls):
      return "mistake"
    if turn.errors:
      return "malformed"
    if not turn.tool_calls and turn.content and device_requests(turn.content):
      return "asked"
  return "none"
