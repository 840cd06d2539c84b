"""Test doubles for the rollout engine and the intervention pipeline (no model, no network).

Pair them with ``rti_jax.policy.tokenizer.byte_tokenizer()``, the untrained byte-level tokenizer.

* ``BigramBackend``: a ``GenerationBackend`` whose policy is a fixed random bigram
  table, so generate and score are exact and cheap.
* ``MiniNavEnv``: a three-tool navigation environment (poi_search / around_search /
  direction) with one ambiguous place name, scored like the paper's Navigation
  (exact coordinates of the direction call).
* ``ScriptedPolicy``: a backend that answers each prompt with a scripted reply
  chosen from the decoded conversation, with scripted log-probs.
* ``FEEDBACK_MARKER`` / ``PAPER_CORRECTION_MARKER`` and the role markers: the words by which a
  scripted reply tells a correction prompt (feedback-only or the paper Corrector's), and each
  judge prompt, apart.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Sequence

import numpy as np

from rti_jax.envs.base import Environment, StepResult, Transcript
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.generation.base import Completion, SamplingParams


class BigramBackend:
  """A ``GenerationBackend`` whose policy is ``p(next | last) = softmax(W[last] / T)``.

  vocab_size: ``V``; W is ``[V, V]`` standard normal (fixed by ``seed``) times ``scale``.
  ``score`` gives exact log-probs at temperature 1; ``generate`` samples with
  ``numpy.random.default_rng(seed)`` and reports temperature-1 log-probs.
  """

  def __init__(self, vocab_size: int = 300, seed: int = 0, scale: float = 2.0) -> None:
    rng = np.random.default_rng(seed)
    self.W = rng.standard_normal((vocab_size, vocab_size)) * scale
    self.vocab_size = vocab_size
    self.synced: list[Any] = []

  def _logp(self, last: int, temperature: float = 1.0) -> np.ndarray:
    z = self.W[last] / max(temperature, 1e-6)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())

  def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int) -> list[Completion]:
    out = []
    for i, p in enumerate(prompts):
      rng = np.random.default_rng(seed + i)
      last, ids, lps, reason = int(p[-1]), [], [], "length"
      for _ in range(params.max_new_tokens):
        if params.temperature == 0:
          nxt = int(np.argmax(self.W[last]))
        else:
          nxt = int(rng.choice(self.vocab_size, p=np.exp(self._logp(last, params.temperature))))
        ids.append(nxt)
        lps.append(float(self._logp(last)[nxt]))
        last = nxt
        if nxt in params.stop_token_ids:
          reason = "stop"
          break
      out.append(Completion(np.asarray(ids, np.int32), np.asarray(lps, np.float32), reason))
    return out

  def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[np.ndarray]:
    out = []
    for p, r in zip(prompts, responses):
      seq = list(p) + list(r)
      lps = [self._logp(int(seq[len(p) + j - 1]))[int(seq[len(p) + j])] for j in range(len(r))]
      out.append(np.asarray(lps, np.float32))
    return out

  def sync_weights(self, model: Any) -> None:
    self.synced.append(model)


# --- a miniature Navigation environment -------------------------------------------------

NAV_TOOLS = [
  {
    "type": "function",
    "function": {
      "name": "poi_search",
      "description": "Search places by name; returns coordinates.",
      "parameters": {
        "type": "object",
        "properties": {"address": {"type": "string"}, "region": {"type": "string"}},
        "required": ["address"],
      },
    },
  },
  {
    "type": "function",
    "function": {
      "name": "around_search",
      "description": "Search places around a location.",
      "parameters": {
        "type": "object",
        "properties": {
          "location": {"type": "string"},
          "radius": {"type": "integer"},
          "keyword": {"type": "string"},
          "region": {"type": "string"},
        },
        "required": ["location"],
      },
    },
  },
  {
    "type": "function",
    "function": {
      "name": "direction",
      "description": "Plan a route.",
      "parameters": {
        "type": "object",
        "properties": {
          "origin": {"type": "string"},
          "destination": {"type": "string"},
          "waypoints": {"type": "array", "items": {"type": "string"}},
          "mode": {"type": "string"},
        },
        "required": ["origin", "destination"],
      },
    },
  },
]

# name -> list of (city, "lon,lat"); the first entry is what an unqualified search returns.
MINI_MAP: dict[str, list[tuple[str, str]]] = {
  "Dajin Park": [("Taipei", "121.5012,25.0301")],
  "Lihui Park": [("Taipei", "121.5234,25.0412")],
  "Yixing Temple": [("Beijing", "116.3971,39.9169"), ("Taipei", "121.5409,25.0533")],
  "Harbor Museum": [("Taipei", "121.4988,25.0720")],
}


@dataclasses.dataclass(frozen=True)
class MiniNavTask:
  """A route through ``places`` (in order); ``gt`` are the right coordinates."""

  task_id: str
  query: str
  places: tuple[str, ...]
  gt: tuple[str, ...]
  order_level: int = 4


def mini_nav_tasks() -> list[MiniNavTask]:
  """Task 0 is easy (no ambiguity); task 1 has the ambiguous 'Yixing Temple' (Taipei)."""
  easy = ("Dajin Park", "Lihui Park", "Harbor Museum")
  hard = ("Dajin Park", "Lihui Park", "Yixing Temple")
  coords = lambda names, city: tuple(next(c for ct, c in MINI_MAP[n] if ct == city) for n in names)
  return [
    MiniNavTask("easy", "Drive from Dajin Park to Lihui Park, then to Harbor Museum.", easy, coords(easy, "Taipei")),
    MiniNavTask("hard", "Drive from Dajin Park to Lihui Park, then to Yixing Temple.", hard, coords(hard, "Taipei")),
  ]


class MiniNavEnv(Environment):
  """Navigation in miniature: reward 1 iff a direction call matches the gt coordinates (order 4)."""

  max_turns = 6

  def __init__(self) -> None:
    self._t = Transcript(task_id="")
    self._task: MiniNavTask | None = None

  def reset(self, task: MiniNavTask) -> list[dict[str, Any]]:
    self._task = task
    msgs = [
      {"role": "system", "content": "You plan routes. Search every place before calling direction."},
      {"role": "user", "content": task.query},
    ]
    self._t = Transcript(task_id=task.task_id, messages=list(msgs))
    return msgs

  def step(self, assistant_text: str) -> StepResult:
    assert self._task is not None
    t = self._t
    t.messages.append({"role": "assistant", "content": assistant_text})
    t.num_turns += 1
    turn = parse_assistant_turn(assistant_text)
    out: list[dict[str, Any]] = []
    for call in turn.tool_calls:
      out.append({"role": "tool", "content": self._run(call.name, call.arguments)})
    for err in turn.errors:
      out.append({"role": "tool", "content": json.dumps({"error": err})})
    if not out or t.num_turns >= self.max_turns:
      t.done = True
      t.reward = self._score()
      return StepResult(messages=[], done=True, reward=t.reward, info={"calls": len(turn.tool_calls)})
    t.messages.extend(out)
    return StepResult(messages=out, done=False, info={"calls": len(turn.tool_calls)})

  def _run(self, name: str, args: dict[str, Any]) -> str:
    if name == "poi_search":
      cands = MINI_MAP.get(str(args.get("address", "")), [])
      region = args.get("region")
      if region:
        cands = [c for c in cands if c[0] == region]
      if not cands:
        return json.dumps({"status": "0", "pois": []})
      city, loc = cands[0]
      return json.dumps({"status": "1", "pois": [{"name": args["address"], "city": city, "location": loc}]})
    if name == "direction":
      self._t.info.setdefault("direction_calls", []).append(dict(args))
      return json.dumps({"status": "1", "route": "ok"})
    if name == "around_search":
      return json.dumps({"status": "1", "pois": []})
    return json.dumps({"error": f"unknown tool {name}"})

  def _score(self) -> float:
    assert self._task is not None
    calls = self._t.info.get("direction_calls", [])
    if not calls:
      return 0.0
    c = calls[-1]
    route = (c.get("origin"), *list(c.get("waypoints") or []), c.get("destination"))
    return 1.0 if tuple(route) == self._task.gt else 0.0

  @property
  def transcript(self) -> Transcript:
    return self._t

  def tool_schemas(self) -> list[dict[str, Any]]:
    return NAV_TOOLS

  def reward_evidence(self) -> dict[str, Any]:
    assert self._task is not None
    return {
      "places": list(self._task.places),
      "cities": [next(city for city, c in MINI_MAP[n] if c == loc) for n, loc in zip(self._task.places, self._task.gt)],
      "route": list(self._task.gt),
      "order_level": self._task.order_level,
    }


def tool_call_text(name: str, **arguments: Any) -> str:
  return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# --- a scripted policy --------------------------------------------------------------------


class ScriptedPolicy:
  """A ``GenerationBackend`` replying ``script(prompt_text)``.

  script: maps the decoded prompt to the reply text (without the end-of-turn token).
  logp_fn: maps ``(prompt_text, reply_ids)`` to per-token log-probs; used by both
    ``generate`` (behaviour log-probs) and ``score``. At a temperature T other than 1 both report
    ``logp_fn / T`` instead (``Completion.sampling_logprobs``; ``score(..., temperature=T)``), a
    stand-in that tells the two apart, not a tempered distribution.
  """

  def __init__(
    self,
    tokenizer: Any,
    script: Callable[[str], str],
    logp_fn: Callable[[str, Sequence[int]], np.ndarray],
    end_of_turn: str = "<|im_end|>",
  ) -> None:
    self.tokenizer = tokenizer
    self.script = script
    self.logp_fn = logp_fn
    self.eot = int(tokenizer.convert_tokens_to_ids(end_of_turn))
    self.calls: list[str] = []
    self.synced: list[Any] = []
    self.score_temperatures: list[float] = []

  def _decode(self, ids: Sequence[int]) -> str:
    return self.tokenizer.decode([int(t) for t in ids], skip_special_tokens=False)

  def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int) -> list[Completion]:
    out = []
    for p in prompts:
      text = self._decode(p)
      self.calls.append(text)
      reply = self.script(text)
      ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.eot]
      ids = ids[: params.max_new_tokens]
      reason = "stop" if ids and ids[-1] == self.eot else "length"
      lp = np.asarray(self.logp_fn(text, ids), np.float32)
      t = params.temperature
      out.append(Completion(np.asarray(ids, np.int32), lp, reason,
                            sampling_logprobs=(lp / np.float32(t) if t > 0 else np.zeros_like(lp))))
    return out

  def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
            temperature: float = 1.0) -> list[np.ndarray]:
    self.score_temperatures.append(temperature)
    return [np.asarray(self.logp_fn(self._decode(p), list(r)), np.float32) / np.float32(temperature)
            for p, r in zip(prompts, responses)]

  def sync_weights(self, model: Any) -> None:
    self.synced.append(model)


def last_tool_results(prompt_text: str) -> list[dict[str, Any]]:
  """All JSON tool responses visible in a decoded prompt, in order."""
  out = []
  for m in re.finditer(r"<tool_response>\n(.*?)\n</tool_response>", prompt_text, re.DOTALL):
    try:
      out.append(json.loads(m.group(1)))
    except json.JSONDecodeError:
      pass
  return out


FEEDBACK_MARKER = "A supervisor reviewed your planned next step"
PAPER_CORRECTION_MARKER = "[Turn review] Someone who knows how this task has to end"


def is_correction_prompt(prompt: str) -> bool:
  """Whether the last user message of a decoded prompt is a correction message (either kind)."""
  last = prompt.rsplit("<|im_start|>user\n", 1)[-1]
  return FEEDBACK_MARKER in last or PAPER_CORRECTION_MARKER in last
# The opening words of the Validator, Corrector and Verifier prompts (both prompt families), by which a
# scripted judge tells which role it is asked to play.
VALIDATOR_MARKER = "Role: step reviewer"
CORRECTOR_MARKER = "Role: hidden editor"
VERIFIER_MARKER = "Role: final checker"


class MiniNavScript:
  """A naive scripted navigation policy for ``MiniNavEnv``.

  On its own it searches every place without a region, then calls direction with the
  first result of each, then answers: right for the easy task, wrong for the
  ambiguous one. Under a correction prompt (a correction message of either kind after its
  last turn) it follows ``correction``:
    "region": re-searches the place named in the hint with the hinted region (derivable);
    "leak": calls direction with the true coordinates it was never shown (a leak);
    "empty": writes nothing usable (an empty turn);
    "echo": re-searches like "region" but first states a hidden coordinate of the evidence
      (the paper Corrector's prompt shows it) in its reasoning (a leak in the text alone).
  """

  def __init__(self, correction: str = "region") -> None:
    if correction not in ("region", "leak", "empty", "echo"):
      raise ValueError(f"correction: expected 'region', 'leak', 'empty' or 'echo', got {correction!r}")
    self.correction = correction

  def __call__(self, prompt: str) -> str:
    query = prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    names = sorted((n for n in MINI_MAP if n in query), key=query.index)
    if is_correction_prompt(prompt):
      return self._correct(prompt, names)
    results = last_tool_results(prompt)
    if not results:
      return "<think>\nI will look up every place.\n</think>\n\n" + "\n".join(
        tool_call_text("poi_search", address=n) for n in names)
    if any("route" in r for r in results):
      return "Here is your route."
    loc = {}
    for r in results:
      for p in r.get("pois", []):
        loc[p["name"]] = p["location"]
    stops = [loc.get(n, "0.0,0.0") for n in names]
    return "<think>\nI have all coordinates.\n</think>\n\n" + tool_call_text(
      "direction", origin=stops[0], destination=stops[-1], waypoints=stops[1:-1])

  def _correct(self, prompt: str, names: list[str]) -> str:
    if self.correction == "empty":
      return ""
    if self.correction == "leak":
      true = [next(c for city, c in MINI_MAP[n] if city == "Taipei") for n in names]
      return "<think>\nThe reference route is known.\n</think>\n\n" + tool_call_text(
        "direction", origin=true[0], destination=true[-1], waypoints=true[1:-1])
    hint = re.search(r"Search '([^']+)' again with region (\w+)", prompt)
    if hint is None:
      return "<think>\nLet me search again.\n</think>\n\n" + tool_call_text("poi_search", address=names[-1])
    thought = "That result is far from the other stops; I should search it in the same city."
    if self.correction == "echo":
      true = next(c for city, c in MINI_MAP[hint.group(1)] if city == hint.group(2))
      thought = f"{hint.group(1)} should be at {true}; I should search it in the same city."
    return f"<think>\n{thought}\n</think>\n\n" + tool_call_text("poi_search", address=hint.group(1), region=hint.group(2))


def scripted_logp(roll_base: float = -1.0, cal_base: float = -0.2) -> Callable[[str, Sequence[int]], np.ndarray]:
  """Per-token log-probs: ``base - 0.01 * (id % 7)``, with ``cal_base`` when the prompt
  is a correction prompt (holds a correction marker) and ``roll_base`` otherwise."""

  def fn(prompt: str, ids: Sequence[int]) -> np.ndarray:
    base = cal_base if FEEDBACK_MARKER in prompt or PAPER_CORRECTION_MARKER in prompt else roll_base
    return np.asarray([base - 0.01 * (int(t) % 7) for t in ids], np.float32)

  return fn
