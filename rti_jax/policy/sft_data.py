"""SFT data for the tiny Navigation policy: scripted trajectories of the train tasks -> examples.

Examples are ``sft_example.SFTExample`` (laid out as the rollout engine lays out an episode; only
trained assistant tokens in the loss mask). The mix (train split only) shapes the base policy like
the paper's backbone:

* ``plain``: on tasks that do not need disambiguation, the oracle's trajectory
  (searches, a regioned search for a stop whose city the query names, direction with
  copied coordinates, a short answer).
* ``trusting``: on tasks that need disambiguation, the typical early mistake: the
  first result of every unregioned search is trusted (``TrustingAgent``).
* ``resolve``: on a share ``resolve_share`` of those tasks, the oracle's trajectory with
  the decisive re-search trained, so the skill is in the repertoire but rarely sampled.
* ``resolve_ctx``: on a share ``continue_share``, the oracle's trajectory with the
  decisive re-search turn as context only (not trained) and the turns after it trained:
  once a re-search is in the context (an accepted correction), the policy uses the
  regioned result.
* ``resolve_tail``: on a share ``complete_share``, the oracle's trajectory with every turn
  trained except the first token of the decision in the re-search turn (the turn's first token,
  or the first token after the check line): the policy learns to *finish* a re-search turn it
  has started (the sentence, the regioned call) and to plan after it, but not to start one, so
  the habit (trust the first result) stays. RL then has to move one token, and a sampled re-search
  comes out whole (docs/tiny_policy.md).
* ``correction``: the correction prompt p_cal exactly as the intervention pipeline
  builds it (the conversation up to a flawed draft, plus the feedback user message the
  rule-based Validator gives on that draft), and the oracle's next turn as target.
  Drafts: the trusting direction call, and perturbed oracle direction calls (wrong
  order, a coordinate that no result showed).

The kinds made on new tasks by a name or stop swap (``name_swap``, ``swap_*``, ``check_drill``)
are in ``sft_swap``.

``check=True`` (every builder takes it): every scripted episode's turn after the first search
results starts with the check line (``rti_jax.policy.check_line``: ``Check: Nanhu Lake in Wuhan.``
or ``Check: all in Chengdu.``), the trusting agent's included.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rti_jax.envs.navigation import NavigationEnv, NavTask, OracleAgent
from rti_jax.envs.navigation.agents import (PLAN_NOW, SEARCH_FIRST, Candidate, _direction_call, _direction_done,
                                            _final_answer, direction_call, mention_order, observed_searches,
                                            parse_candidates, render_turn)
from rti_jax.envs.tool_calls import ToolCall, parse_assistant_turn
from rti_jax.intervention.prompting import CORRECTORS, correction_message
from rti_jax.intervention.rules_navigation import NavigationRuleValidator, NavigationRuleVerifier
from rti_jax.policy.check_line import CheckedAgent, check_line_length
from rti_jax.policy.sft_example import (KINDS, Message, SFTExample, assistant_indices, encode_messages, play,
                                        split_train, step_context, summary, without_system_turn)
from rti_jax.rollout import ChatFormatter

__all__ = ["KINDS", "Message", "MixConfig", "SFTExample", "TrustingAgent", "assistant_indices", "build_examples",
           "corpus_texts", "correction_example", "encode_messages", "place_name_token_ids", "play",
           "resolve_tail_example", "scripted", "split_train", "step_context", "summary", "without_system_turn"]

@dataclasses.dataclass(frozen=True)
class MixConfig:
  """Shares of the SFT mix (see the module docstring); all from the train split.

  resolve_share: share of disambiguation tasks whose decisive re-search is trained.
  continue_share: share of disambiguation tasks with the re-search as context only.
  complete_share: share of disambiguation tasks with the re-search turn trained except its
    decision token (``resolve_tail``); drawn independently of the two above.
  correction_share: share of disambiguation tasks with a correction example on the
    trusting draft (its user message: ``correction``, ``prompting.correction_message``); perturb_share: share of all tasks with a correction example on a
    perturbed (wrong order / unseen coordinate) direction draft.
  check: the scripted turns after the first search results start with the check line.
  """

  resolve_share: float = 0.06
  continue_share: float = 0.35
  correction_share: float = 0.6
  perturb_share: float = 0.15
  seed: int = 0
  check: bool = False
  complete_share: float = 0.0
  correction: str = "feedback"

  def __post_init__(self) -> None:
    if self.correction not in CORRECTORS:
      raise ValueError(f"correction: expected one of {CORRECTORS}, got {self.correction!r}")
    for f in ("resolve_share", "continue_share", "correction_share", "perturb_share", "complete_share"):
      v = getattr(self, f)
      if not 0.0 <= v <= 1.0:
        raise ValueError(f"{f}: expected a share in [0, 1], got {v}")


class TrustingAgent:
  """The base policy's intended habit: search every stop (with the city the query names,
  if any), then trust the first result of each search and plan the route."""

  def __init__(self, task: NavTask):
    self.task = task

  def act(self, messages: list[Message]) -> str:
    task = self.task
    if _direction_done(messages):
      return _final_answer(messages)
    found: dict[str, Candidate] = {}
    for call, obs in observed_searches(messages):
      cands = parse_candidates(obs)
      if call.name == "poi_search" and cands:
        found.setdefault(call.arguments["address"], cands[0])
    if not found:
      calls = [ToolCall("poi_search", {"address": s.name, "region": s.city} if s.hinted else {"address": s.name})
               for s in mention_order(task)]
      return render_turn(SEARCH_FIRST, calls)
    if any(s.name not in found for s in task.stops):  # nothing found: cannot plan; answer
      return "I could not find every place."
    return render_turn(PLAN_NOW, [_direction_call(task, found)])


def scripted(agent_cls: Any, task: NavTask, check: bool = False) -> Any:
  """``agent_cls(task)``, wrapped in ``CheckedAgent`` when ``check`` (the policy's format writes
  the check line after the first search results)."""
  agent = agent_cls(task)
  return CheckedAgent(agent) if check else agent


def correction_example(formatter: ChatFormatter, env: NavigationEnv, task: NavTask, prefix: Sequence[Message],
                       draft: str, target: str, kind: str = "correction", message: str = "feedback") -> SFTExample | None:
  """p_cal (``prefix`` + the correction message on ``draft``: the Validator's feedback, or with
  ``message="paper"`` the paper's Corrector inputs) -> ``target``, trained on the target only.

  Returns None when the Validator accepts the draft or the Verifier rejects the target
  (such a pair would not teach following valid feedback).
  """
  env.replay(task, [m["content"] for m in prefix if m["role"] == "assistant"])
  ctx = step_context(prefix, draft, env)
  judgement = NavigationRuleValidator().judge(ctx)
  if judgement.is_valid or not NavigationRuleVerifier().judge(ctx, target).ok:
    return None
  p_roll, _ = encode_messages(formatter, list(prefix))
  p_roll += formatter.generation_prompt_ids if prefix[-1]["role"] == "assistant" else []
  p_cal = formatter.with_extra_user_message(p_roll, correction_message(message, ctx, judgement))
  turn = formatter.encode_assistant(target)
  return SFTExample(task.task_id, kind, tuple(p_cal + turn), tuple([False] * len(p_cal) + [True] * len(turn)))


def _perturbed_direction(draft: str, rng: np.random.Generator) -> str | None:
  """The draft's direction call with two stops swapped or one digit changed."""
  calls = parse_assistant_turn(draft).tool_calls
  if len(calls) != 1 or calls[0].name != "direction":
    return None
  args = dict(calls[0].arguments)
  stops = [args["origin"], *args.get("waypoints", []), args["destination"]]
  if rng.random() < 0.5 and len(stops) >= 2:
    i, j = rng.choice(len(stops), size=2, replace=False)
    stops[i], stops[j] = stops[j], stops[i]
  else:
    k = int(rng.integers(len(stops)))
    s = stops[k]
    pos = [p for p, ch in enumerate(s) if ch.isdigit()]
    p = pos[-1 - int(rng.integers(min(3, len(pos))))]
    stops[k] = s[:p] + str((int(s[p]) + 1 + int(rng.integers(8))) % 10) + s[p + 1:]
  text = parse_assistant_turn(draft).content.strip()
  return render_turn(text, [direction_call(stops, args.get("mode"))])


def build_examples(tasks: Sequence[NavTask], env: NavigationEnv, formatter: ChatFormatter,
                   mix: MixConfig = MixConfig()) -> list[SFTExample]:
  """The SFT mix over ``tasks`` (pass the train split only); deterministic for ``mix.seed``."""
  rng = np.random.default_rng(mix.seed)
  tail_rng = np.random.default_rng([mix.seed, 1])
  out: list[SFTExample] = []

  def add(task: NavTask, kind: str, messages: Sequence[Message], trained: Sequence[bool] | None = None) -> None:
    ids, mask = encode_messages(formatter, messages, trained)
    out.append(SFTExample(task.task_id, kind, tuple(ids), tuple(mask)))

  for task in tasks:
    oracle = play(env, scripted(OracleAgent, task, mix.check), task)
    a_idx = assistant_indices(oracle)
    if not task.needs_disambiguation or len(a_idx) == 3:  # hints alone resolve it: no re-search turn
      add(task, "plain", oracle)
    else:
      trusting = play(env, scripted(TrustingAgent, task, mix.check), task)
      add(task, "trusting", trusting)
      u = rng.random(3)
      n_turns = len(a_idx)
      if u[0] < mix.resolve_share:
        add(task, "resolve", oracle)
      elif u[1] < mix.continue_share:
        add(task, "resolve_ctx", oracle, [j not in (1,) for j in range(n_turns)])
      if u[2] < mix.correction_share:
        t_idx = assistant_indices(trusting)
        if len(t_idx) >= 2:
          k = t_idx[1]
          ex = correction_example(formatter, env, task, trusting[:k], trusting[k]["content"], oracle[a_idx[1]]["content"],
                                  message=mix.correction)
          if ex is not None:
            out.append(ex)
      if tail_rng.random() < mix.complete_share:  # its own stream: the rest of the mix does not move
        out.append(resolve_tail_example(formatter, task, oracle, a_idx[1], mix.check))
    if rng.random() < mix.perturb_share:
      # The oracle's direction turn, perturbed, is the draft; the oracle's turn is the target.
      d = next((i for i in a_idx if any(c.name == "direction" for c in parse_assistant_turn(oracle[i]["content"]).tool_calls)), None)
      if d is not None:
        draft = _perturbed_direction(oracle[d]["content"], rng)
        if draft is not None and draft != oracle[d]["content"]:
          ex = correction_example(formatter, env, task, oracle[:d], draft, oracle[d]["content"], message=mix.correction)
          if ex is not None:
            out.append(ex)
  return out


def resolve_tail_example(formatter: ChatFormatter, task: NavTask, oracle: Sequence[Message], turn: int,
                         check: bool) -> SFTExample:
  """The oracle episode ``oracle`` (kind ``resolve_tail``), every assistant turn trained except the
  decision token of the re-search turn ``oracle[turn]``: its first token, or with ``check`` the first
  token after its check line."""
  ids, mask = encode_messages(formatter, oracle)
  start = len(encode_messages(formatter, oracle[:turn])[0])  # the layout is prefix-consistent
  text = oracle[turn]["content"]
  pos = start + (check_line_length(formatter.tokenizer, ids, start, text) if check else 0)
  if not mask[pos]:
    raise ValueError(f"task {task.task_id}: the decision token at {pos} is not an assistant token")
  mask[pos] = False
  return SFTExample(task.task_id, "resolve_tail", tuple(ids), tuple(mask))


def place_name_token_ids(tokenizer: Any, env: NavigationEnv) -> list[int]:
  """Ids of the tokens that are one whole POI name of ``env``'s map (with ``Ġ`` for spaces,
  and possibly the space after it), for ``sft.add_type_direction``."""
  names = {p.name for p in env.world.pois}
  return sorted(i for t, i in tokenizer.get_vocab().items() if t.replace("\u0120", " ").rstrip(" ") in names)


def corpus_texts(tasks: Sequence[NavTask], env: NavigationEnv, check: bool = False) -> list[str]:
  """Texts the tokenizer is trained on: message contents of oracle and trusting episodes of
  ``tasks``, plus each POI line of the world's database six times (the map every split shares; no
  task) and each POI as a labelled direction stop (``Name lon,lat``), so every POI coordinate becomes a
  single number token (and, with ``tokenizer.NAME_PATTERN``, every name one token)."""
  from rti_jax.envs.navigation.tools import format_poi

  cfg = env.world.config
  texts: list[str] = [format_poi(1, p, None, terse=cfg.terse) for p in env.world.pois] * 6
  texts += [f"{p.name} {p.location}" for p in env.world.pois] * 6  # a labelled direction stop
  for task in tasks:
    for agent in (scripted(OracleAgent, task, check), scripted(TrustingAgent, task, check)):
      texts += [m["content"] for m in play(env, agent, task)]
  return texts
