"""SFT examples of any domain: one encoded conversation with the mask of its trained tokens.

Every example is laid out exactly as the rollout engine lays out an episode
(``rollout.ChatFormatter``): the prompt ids, then per assistant turn
``encode_assistant(text)`` (ends with ``<|im_end|>``), then ``continuation_ids`` of
the env messages that follow. ``loss_mask`` is True only on assistant tokens that are
trained (prompt, tool responses and feedback messages never are). The mixes that fill
them are ``sft_data`` (Navigation), ``sft_swap`` (Navigation, on tasks made by a stop
swap) and ``telecom_sft_data``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from rti_jax.intervention.judges import StepContext
from rti_jax.rollout import ChatFormatter

Message = dict[str, Any]
KINDS = ("validator", "verifier", "replay", "plain", "trusting", "resolve", "resolve_ctx", "resolve_tail", "correction", "name_swap", "swap_episode",
         "swap_trusting", "swap_resolve_ctx", "swap_correction", "check_drill", "repeat",
         "lookup", "retry")


@dataclasses.dataclass(frozen=True)
class SFTExample:
  """One training sequence. token_ids, loss_mask: ``[L]``; kind: one of ``KINDS``."""

  task_id: str
  kind: str
  token_ids: tuple[int, ...]
  loss_mask: tuple[bool, ...]

  def __post_init__(self) -> None:
    if len(self.token_ids) != len(self.loss_mask):
      raise ValueError(f"loss_mask: expected {len(self.token_ids)} entries, got {len(self.loss_mask)}")
    if self.kind not in KINDS:
      raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")


def without_system_turn(formatter: ChatFormatter, example: SFTExample) -> SFTExample:
  """``example`` with its leading system turn removed (for a short-context warm-up stage:
  with ~400 fewer tokens of distraction, a tiny model learns to copy names and coordinates
  from the user turn and tool results in far fewer steps)."""
  ids = list(example.token_ids)
  start = formatter.tokenizer.convert_tokens_to_ids("<|im_start|>")
  eot = formatter.end_of_turn_id
  if not ids or ids[0] != start or eot not in ids:
    raise ValueError(f"example {example.task_id}: expected ids starting with a system turn")
  cut = ids.index(eot) + 1
  while cut < len(ids) and ids[cut] != start:  # the "\n" after <|im_end|>
    cut += 1
  if any(example.loss_mask[:cut]):
    raise ValueError(f"example {example.task_id}: the system turn holds trained tokens")
  return dataclasses.replace(example, token_ids=tuple(ids[cut:]), loss_mask=tuple(example.loss_mask[cut:]))


def play(env: Any, agent: Any, task: Any) -> list[Message]:
  """The messages of one scripted episode of ``agent`` on ``task`` in ``env`` (any domain): system,
  user, then turns and observations."""
  messages = env.reset(task)
  while True:
    result = env.step(agent.act(messages))
    messages = env.transcript.messages
    if result.done:
      return list(messages)


def encode_messages(formatter: ChatFormatter, messages: Sequence[Message], trained: Sequence[bool] | None = None,
                    ) -> tuple[list[int], list[bool]]:
  """Token ids and loss mask of a conversation, laid out as the rollout engine does.

  messages: system, user, then assistant turns each followed by zero or more env
  messages (tool or user). trained[j]: whether the j-th assistant turn is trained
  (default all). Returns ``ids: [L]`` and ``mask: [L]``.
  """
  if len(messages) < 2 or messages[0]["role"] != "system" or messages[1]["role"] != "user":
    raise ValueError(f"messages: expected system and user first, got roles {[m['role'] for m in messages[:2]]}")
  ids = list(formatter.prompt_ids(messages[:2]))
  mask = [False] * len(ids)
  j, i = 0, 2
  while i < len(messages):
    m = messages[i]
    if m["role"] != "assistant":
      raise ValueError(f"messages[{i}]: expected an assistant turn, got role {m['role']!r}")
    turn = formatter.encode_assistant(m["content"])
    ids += turn
    mask += [True if trained is None else bool(trained[j])] * len(turn)
    j += 1
    i += 1
    env_msgs = []
    while i < len(messages) and messages[i]["role"] != "assistant":
      env_msgs.append(messages[i])
      i += 1
    if env_msgs:
      cont = formatter.continuation_ids(env_msgs)
      ids += cont
      mask += [False] * len(cont)
  return ids, mask


def step_context(messages: Sequence[Message], draft: str, env: Any, domain: str = "navigation") -> StepContext:
  """The roles' view of a step (as ``intervention.pipeline.step_context``) for ``env``'s task
  (``env`` reset or replayed on it; any domain's env: its tools and reward evidence)."""
  history = tuple(m for m in messages if m.get("role") != "system")
  user = next(m["content"] for m in messages if m["role"] == "user")
  return StepContext(user_query=str(user), history=history, draft=draft, tools=tuple(env.tool_schemas()),
                     evidence=dict(env.reward_evidence()), domain=domain)


def assistant_indices(messages: Sequence[Message]) -> list[int]:
  """Indices of the assistant messages in ``messages``."""
  return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def summary(examples: Sequence[SFTExample]) -> dict[str, Any]:
  """Counts per kind, trained tokens and the longest sequence."""
  kinds = {k: sum(e.kind == k for e in examples) for k in KINDS}
  return {"examples": len(examples), "kinds": kinds, "trained_tokens": int(sum(sum(e.loss_mask) for e in examples)),
          "tokens": int(sum(len(e.token_ids) for e in examples)),
          "max_len": max((len(e.token_ids) for e in examples), default=0)}


def split_train(train: Sequence[Any], holdout: int) -> tuple[list[Any], list[Any]]:
  """(SFT tasks, held-out tasks) of any domain: the last ``holdout`` train-split tasks are kept out of
  SFT (the RL config's ``train.val_tasks`` should equal it: they are its validation split). The test
  split is never read by a build. Raises ValueError unless ``0 <= holdout < len(train)``."""
  if not 0 <= holdout < len(train):
    raise ValueError(f"holdout: expected 0 <= holdout < {len(train)}, got {holdout}")
  return list(train[:len(train) - holdout]), list(train[len(train) - holdout:])
