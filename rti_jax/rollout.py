"""Multi-turn rollout engine: tasks x G episodes, turn by turn, batched across live episodes.

The data path (paper Sec. 3, Algorithm 1 line 4): for each task, ``G`` environments
are reset; at every turn the prompts of all live episodes go to the backend in one
``generate`` call; each completion is handed to its environment; tool responses
(and user turns) are appended as context; an episode ends when its environment
says ``done``.

Every episode is kept as one token sequence (``Trajectory``):

* ``token_ids: [L]`` the initial prompt, then assistant turns and env messages;
* ``loss_mask: [L]`` True only on tokens the policy generated (assistant turns);
  prompt and tool-response tokens are masked out, as the paper does (App. C.1);
* ``behaviour_logp: [L]`` log-prob of each generated token under the policy that
  produced it (0 where masked);
* ``roll_logp / cal_logp: [L]`` log pi_roll and log pi_cal of intervened tokens
  (Eq. 5; 0 elsewhere) and ``intervened_mask: [L]``.

All chat formatting (``tokenizer.apply_chat_template`` with the env's tool schemas)
lives in ``ChatFormatter``; nothing else in the project renders chat messages.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

import numpy as np

from rti_jax.envs.base import Environment, StepResult
from rti_jax.generation.base import Completion, GenerationBackend, SamplingParams

Message = dict[str, Any]

# A fixed conversation used to find where the template's per-message blocks begin
# and end; its content never reaches a trajectory.
_BASE: list[Message] = [
  {"role": "system", "content": "base"},
  {"role": "user", "content": "base"},
  {"role": "assistant", "content": "base"},
]


class ChatFormatter:
  """The one place that turns chat messages into token ids (and back).

  tokenizer: a transformers tokenizer with a chat template.
  tool_schemas: the env's tool schemas, passed as ``tools=`` to the template.
  end_of_turn: the text that ends an assistant turn (``<|im_end|>`` for Qwen).
  template_kwargs: extra template arguments (e.g. ``{"enable_thinking": True}``).
  eos_token_ids: ids that also end an assistant turn when a server stops on them by itself, as
    SGLang does on the generation config's EOS (Qwen3: ``<|endoftext|>`` 151643 besides
    ``<|im_end|>``). None: ``<|endoftext|>`` when the tokenizer has it as one token.
  """

  def __init__(
    self,
    tokenizer: Any,
    tool_schemas: Sequence[dict[str, Any]] | None = None,
    *,
    end_of_turn: str = "<|im_end|>",
    template_kwargs: dict[str, Any] | None = None,
    eos_token_ids: Sequence[int] | None = None,
  ) -> None:
    self.tokenizer = tokenizer
    self.tool_schemas = list(tool_schemas) if tool_schemas else None
    self.template_kwargs = dict(template_kwargs or {})
    eot = tokenizer.convert_tokens_to_ids(end_of_turn)
    if not isinstance(eot, int) or eot == tokenizer.unk_token_id or eot is None:
      raise ValueError(f"end_of_turn: expected a single token of the tokenizer, got {end_of_turn!r}")
    self.end_of_turn = end_of_turn
    self.end_of_turn_id = int(eot)
    if eos_token_ids is None:
      eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
      eos_token_ids = [eos] if isinstance(eos, int) and eos != tokenizer.unk_token_id else []
    bad = [t for t in eos_token_ids if not isinstance(t, (int, np.integer)) or not 0 <= int(t) < len(tokenizer)]
    if bad:
      raise ValueError(f"eos_token_ids: expected ids of the tokenizer in [0, {len(tokenizer)}), got {bad}")
    #: every id that ends a finished assistant turn: the end-of-turn id, then ``eos_token_ids``
    self.turn_end_ids = tuple(dict.fromkeys([self.end_of_turn_id, *(int(t) for t in eos_token_ids)]))
    base_closed = self._render(_BASE, add_generation_prompt=False)
    base_open = self._render(_BASE, add_generation_prompt=True)
    if base_open[: len(base_closed)] != base_closed:
      raise ValueError("tokenizer: chat template is not prefix-stable under add_generation_prompt")
    #: ids the template appends to open an assistant turn, e.g. "<|im_start|>assistant\n"
    self.generation_prompt_ids = base_open[len(base_closed) :]
    if self.end_of_turn_id not in base_closed:
      raise ValueError(f"end_of_turn: {end_of_turn!r} does not appear in the rendered chat template")
    #: end-of-turn tokens up to and including the base assistant turn's
    self._base_eots = base_closed.count(self.end_of_turn_id)
    after = self._after_base(base_closed)
    #: what the template writes after a closed turn's end-of-turn token (e.g. "\n")
    self._turn_tail = base_closed[after:]

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    return (self.end_of_turn_id,)

  def _render(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
    out = self.tokenizer.apply_chat_template(
      list(messages),
      tools=self.tool_schemas,
      add_generation_prompt=add_generation_prompt,
      tokenize=True,
      return_dict=False,
      **self.template_kwargs,
    )
    if hasattr(out, "keys") and "input_ids" in out:  # some tokenizers return a BatchEncoding
      out = out["input_ids"]
    return [int(t) for t in out]

  def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
    """The initial prompt (system + tools + user), ending with the generation prompt."""
    return self._render(messages, add_generation_prompt=True)

  def _after_base(self, ids: Sequence[int]) -> int:
    """Index just after the base assistant turn's end-of-turn token in a rendering of
    ``_BASE + more``. Found by counting end-of-turn tokens, so templates that render
    the base turn differently once it is no longer last (Qwen3 drops an empty think
    block) still split at the right place."""
    seen = 0
    for i, t in enumerate(ids):
      if t == self.end_of_turn_id:
        seen += 1
        if seen == self._base_eots:
          return i + 1
    raise ValueError(f"tokenizer: rendered template has fewer than {self._base_eots} end-of-turn tokens")

  def continuation_ids(self, new_messages: Sequence[Message]) -> list[int]:
    """Ids that follow an assistant turn's end-of-turn token: ``new_messages`` then the generation prompt."""
    full = self._render(_BASE + list(new_messages), add_generation_prompt=True)
    return full[self._after_base(full) :]

  def message_block_ids(self, new_messages: Sequence[Message]) -> list[int]:
    """Ids of complete message blocks (after a closed turn), then the generation prompt."""
    cont = self.continuation_ids(new_messages)
    n = len(self._turn_tail)
    if cont[:n] != self._turn_tail:
      raise ValueError("tokenizer: chat template separates turns inconsistently; cannot insert a message")
    return cont[n:]

  def with_extra_user_message(self, context_ids: Sequence[int], text: str) -> list[int]:
    """``context_ids`` (ending with the generation prompt) with a user message inserted before it.

    This builds the correction prompt p_cal from the rollout prompt p_roll (Eq. 5):
    the same history plus the validator feedback.
    """
    g = self.generation_prompt_ids
    ctx = list(context_ids)
    if ctx[-len(g) :] != g:
      raise ValueError("context_ids: expected ids ending with the generation prompt")
    return ctx[: -len(g)] + self.message_block_ids([{"role": "user", "content": text}])

  def decode(self, ids: Sequence[int]) -> str:
    """Text of an assistant turn; the end-of-turn token is dropped, and so is an EOS id ending it."""
    ids = [int(t) for t in ids if int(t) != self.end_of_turn_id]
    if ids and ids[-1] in self.turn_end_ids:
      ids = ids[:-1]
    return self.tokenizer.decode(ids, skip_special_tokens=False)

  def encode_assistant(self, text: str) -> list[int]:
    """Ids of an assistant turn written as ``text`` (plus the end-of-turn token)."""
    ids = self.tokenizer.encode(text, add_special_tokens=False)
    return [int(t) for t in ids] + [self.end_of_turn_id]

  @staticmethod
  def assistant_text(reasoning: str, tool_calls: Sequence[dict[str, Any]], content: str) -> str:
    """Writes a structured reply (Corrector output) in the Qwen agent format.

    ``<think>`` reasoning, then either ``<tool_call>`` blocks or the content.
    """
    parts = []
    if reasoning.strip():
      parts.append(f"<think>\n{reasoning.strip()}\n</think>\n\n")
    if tool_calls:
      blocks = []
      for call in tool_calls:
        body = {"name": call.get("name", ""), "arguments": call.get("arguments", {})}
        blocks.append("<tool_call>\n" + json.dumps(body, ensure_ascii=False) + "\n</tool_call>")
      if content.strip():
        parts.append(content.strip() + "\n")
      parts.append("\n".join(blocks))
    else:
      parts.append(content.strip())
    return "".join(parts)


@dataclasses.dataclass
class TurnRecord:
  """One assistant turn, kept for inspection and plots.

  start / end: the turn's token span ``[start, end)`` in ``Trajectory.token_ids``.
  intervened: the turn is an accepted correction u~_k (Sec. 4.1).
  """

  index: int
  start: int
  end: int
  text: str
  finish_reason: str
  intervened: bool = False
  env_info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Trajectory:
  """One episode as a token sequence (all arrays ``[L]``; see the module docstring)."""

  task_id: str
  token_ids: list[int]
  loss_mask: list[bool]
  behaviour_logp: list[float]
  roll_logp: list[float]
  cal_logp: list[float]
  intervened_mask: list[bool]
  prompt_len: int
  messages: list[Message]
  turns: list[TurnRecord] = dataclasses.field(default_factory=list)
  reward: float = 0.0
  done: bool = False
  truncated: bool = False
  intervened: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def num_turns(self) -> int:
    return len(self.turns)

  def append_context(self, ids: Sequence[int]) -> None:
    """Non-trainable ids (prompt, tool responses, user turns)."""
    n = len(ids)
    self.token_ids.extend(int(t) for t in ids)
    self.loss_mask.extend([False] * n)
    self.behaviour_logp.extend([0.0] * n)
    self.roll_logp.extend([0.0] * n)
    self.cal_logp.extend([0.0] * n)
    self.intervened_mask.extend([False] * n)

  def append_generated(
    self,
    ids: Sequence[int],
    logp: Sequence[float],
    *,
    roll_logp: Sequence[float] | None = None,
    cal_logp: Sequence[float] | None = None,
  ) -> None:
    """Trainable ids of an assistant turn; ``roll_logp``/``cal_logp`` mark it intervened."""
    n = len(ids)
    if len(logp) != n:
      raise ValueError(f"logp: expected {n} values (one per id), got {len(logp)}")
    intervened = roll_logp is not None
    if intervened and (cal_logp is None or len(roll_logp) != n or len(cal_logp) != n):
      raise ValueError(f"roll_logp/cal_logp: expected {n} values each for an intervened turn")
    self.token_ids.extend(int(t) for t in ids)
    self.loss_mask.extend([True] * n)
    self.behaviour_logp.extend(float(x) for x in logp)
    self.roll_logp.extend(float(x) for x in (roll_logp if intervened else [0.0] * n))
    self.cal_logp.extend(float(x) for x in (cal_logp if intervened else [0.0] * n))
    self.intervened_mask.extend([intervened] * n)

  def arrays(self) -> dict[str, np.ndarray]:
    """The token-level arrays as numpy (``[L]`` each)."""
    return {
      "token_ids": np.asarray(self.token_ids, np.int32),
      "loss_mask": np.asarray(self.loss_mask, bool),
      "behaviour_logp": np.asarray(self.behaviour_logp, np.float32),
      "roll_logp": np.asarray(self.roll_logp, np.float32),
      "cal_logp": np.asarray(self.cal_logp, np.float32),
      "intervened_mask": np.asarray(self.intervened_mask, bool),
    }


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Rollout settings.

  group_size: G samples per task (paper: 8).
  sampling: policy sampling (paper: temperature 0.8); stop ids default to the formatter's.
  max_context_tokens: the most tokens a generate call may touch (prompt + new tokens);
    an episode whose next prompt would leave less than ``sampling.max_new_tokens`` free
    ends, truncated, with reward 0 (``Trajectory.truncated``).
  behaviour_temperature: the temperature of the behaviour log-prob recorded per generated token
    (``Trajectory.behaviour_logp``): 1, the policy's own (``Completion.logprobs``), or the
    sampling temperature, the log-prob of the distribution each token was drawn from
    (``Completion.sampling_logprobs``; needs top-k and top-p off, so that it is the tempered
    policy's). Corrector-written tokens are then scored at it under the rollout prompt.
  """

  group_size: int = 8
  sampling: SamplingParams = SamplingParams(max_new_tokens=512, temperature=0.8)
  max_context_tokens: int = 8192
  seed: int = 0
  behaviour_temperature: float = 1.0

  def __post_init__(self) -> None:
    t = self.behaviour_temperature
    if t != 1.0:
      s = self.sampling
      if t != s.temperature or s.top_k != 0 or s.top_p != 1.0:
        raise ValueError(f"behaviour_temperature={t!r}: expected 1 or the sampling temperature with top-k and "
                         f"top-p off, got temperature={s.temperature!r}, top_k={s.top_k!r}, top_p={s.top_p!r}")

  def behaviour_logprobs(self, c: Completion) -> np.ndarray:
    """The behaviour log-probs of ``c``'s tokens at ``behaviour_temperature``."""
    if self.behaviour_temperature == 1.0:
      return c.logprobs
    if c.sampling_logprobs is None:
      raise ValueError(f"behaviour_temperature={self.behaviour_temperature!r}: the generation backend reports no "
                       "sampling log-probs (Completion.sampling_logprobs); recompute the behaviour log-probs instead")
    return c.sampling_logprobs

  @property
  def max_prompt_tokens(self) -> int:
    """The longest prompt that still leaves room for a full turn."""
    return self.max_context_tokens - self.sampling.max_new_tokens


class Episode:
  """A live episode: an environment and the trajectory being written."""

  def __init__(
    self, env: Environment, task: Any, task_id: str, formatter: ChatFormatter, max_prompt_tokens: int | None = None
  ) -> None:
    self.env = env
    messages = env.reset(task)
    ids = formatter.prompt_ids(messages)
    self.traj = Trajectory(
      task_id=task_id,
      token_ids=[],
      loss_mask=[],
      behaviour_logp=[],
      roll_logp=[],
      cal_logp=[],
      intervened_mask=[],
      prompt_len=len(ids),
      messages=list(messages),
    )
    self.traj.append_context(ids)
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
      self.traj.done = self.traj.truncated = True

  @property
  def live(self) -> bool:
    return not self.traj.done

  def context(self) -> list[int]:
    return list(self.traj.token_ids)

  def apply_turn(
    self,
    formatter: ChatFormatter,
    ids: Sequence[int],
    logp: Sequence[float],
    finish_reason: str,
    max_prompt_tokens: int,
    *,
    roll_logp: Sequence[float] | None = None,
    cal_logp: Sequence[float] | None = None,
  ) -> StepResult:
    """Appends one assistant turn, steps the env and appends its messages."""
    traj = self.traj
    start = len(traj.token_ids)
    traj.append_generated(ids, logp, roll_logp=roll_logp, cal_logp=cal_logp)
    if finish_reason == "length" or not ids or int(ids[-1]) not in formatter.turn_end_ids:
      # The turn was cut off: close it in the context (not trainable) and count it.
      traj.append_context([formatter.end_of_turn_id])
      traj.info["length_cut_turns"] = traj.info.get("length_cut_turns", 0) + 1
    elif int(ids[-1]) != formatter.end_of_turn_id:
      # Finished on an EOS id (e.g. <|endoftext|>): close the turn as the chat template does.
      traj.append_context([formatter.end_of_turn_id])
      traj.info["eos_ended_turns"] = traj.info.get("eos_ended_turns", 0) + 1
    text = formatter.decode(ids)
    traj.messages.append({"role": "assistant", "content": text})
    result = self.env.step(text)
    traj.turns.append(
      TurnRecord(
        index=len(traj.turns),
        start=start,
        end=start + len(ids),
        text=text,
        finish_reason=finish_reason,
        intervened=roll_logp is not None,
        env_info=dict(result.info),
      )
    )
    if result.done:
      traj.done = True
      traj.reward = float(result.reward)
      return result
    traj.messages.extend(result.messages)
    cont = formatter.continuation_ids(result.messages)
    if len(traj.token_ids) + len(cont) > max_prompt_tokens:
      traj.done = True
      traj.truncated = True
      traj.reward = 0.0
      return result
    traj.append_context(cont)
    return result


def sampling_with_stops(params: SamplingParams, formatter: ChatFormatter) -> SamplingParams:
  """``params`` with the formatter's end-of-turn id among the stop ids."""
  stops = tuple(dict.fromkeys(tuple(params.stop_token_ids) + formatter.stop_token_ids))
  return dataclasses.replace(params, stop_token_ids=stops)


def generate_turns(
  episodes: Sequence[Episode],
  backend: GenerationBackend,
  params: SamplingParams,
  seed: int,
) -> list[Completion]:
  """One batched ``generate`` over the contexts of ``episodes``."""
  if not episodes:
    return []
  comps = backend.generate([e.context() for e in episodes], params, seed)
  if len(comps) != len(episodes):
    raise RuntimeError(f"backend.generate: expected {len(episodes)} completions, got {len(comps)}")
  return comps


def run_episodes(
  episodes: Sequence[Episode],
  backend: GenerationBackend,
  formatter: ChatFormatter,
  config: RolloutConfig,
  seed: int,
  on_turn: Callable[[Sequence[Episode], Sequence[Completion]], None] | None = None,
) -> None:
  """Drives ``episodes`` turn by turn until all are done (no intervention).

  on_turn: called with the live episodes and their completions of each turn before the
  turns are applied (so ``episode.context()`` is still the context each was generated from).
  """
  params = sampling_with_stops(config.sampling, formatter)
  turn = 0
  while True:
    live = [e for e in episodes if e.live]
    if not live:
      return
    comps = generate_turns(live, backend, params, seed + 1_000_003 * turn)
    if on_turn is not None:
      on_turn(live, comps)
    for ep, c in zip(live, comps):
      ep.apply_turn(formatter, c.token_ids.tolist(), config.behaviour_logprobs(c).tolist(), c.finish_reason,
                    config.max_prompt_tokens)
    turn += 1


def rollout_groups(
  tasks: Sequence[Any],
  env_factory: Callable[[], Environment],
  backend: GenerationBackend,
  formatter: ChatFormatter,
  config: RolloutConfig,
  *,
  task_id: Callable[[Any], str] = lambda t: str(getattr(t, "task_id", t)),
  seed: int | None = None,
) -> list[list[Trajectory]]:
  """Algorithm 1 line 4: ``G`` on-policy episodes per task, batched across all of them.

  Returns ``groups[n][i]``: the i-th trajectory of task n.
  """
  if config.group_size < 1:
    raise ValueError(f"config.group_size: expected >= 1, got {config.group_size}")
  seed = config.seed if seed is None else seed
  groups = [
    [Episode(env_factory(), task, task_id(task), formatter, config.max_prompt_tokens) for _ in range(config.group_size)]
    for task in tasks
  ]
  run_episodes([e for g in groups for e in g], backend, formatter, config, seed)
  return [[e.traj for e in g] for g in groups]


def turn_counts(groups: Sequence[Sequence[Trajectory]]) -> np.ndarray:
  """``[N * G]`` number of assistant turns per trajectory (for the paper's Fig. 5b)."""
  return np.asarray([t.num_turns for g in groups for t in g], np.int32)
