"""SFT data for the tiny Navigation policy: scripted trajectories -> token sequences.

Every example is laid out exactly as the rollout engine lays out an episode
(``rollout.ChatFormatter``): the prompt ids, then per assistant turn
``encode_assistant(text)`` (ends with ``<|im_end|>``), then ``continuation_ids`` of
the env messages that follow. ``loss_mask`` is True only on assistant tokens that are
trained (prompt, tool responses and feedback messages never are).

The mix (train split only) shapes the base policy like the paper's backbone:

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
  comes out whole (docs/tiny_policy.md, tenth session).
* ``correction``: the correction prompt p_cal exactly as the intervention pipeline
  builds it (the conversation up to a flawed draft, plus the feedback user message the
  rule-based Validator gives on that draft), and the oracle's next turn as target.
  Drafts: the trusting direction call, and perturbed oracle direction calls (wrong
  order, a coordinate that no result showed).
* ``swap_episode`` (``swap_episode_examples``, optional): whole oracle episodes of plain tasks
  made from train tasks by swapping their stops for other nearby places of the map (same
  template, order cues, hints and mode; checked by the benchmark's own Stage-3 filter). The
  direction call must then copy names and coordinates from this episode's results instead of
  recalling those of a trained task.
* ``swap_trusting`` / ``swap_resolve_ctx`` / ``swap_correction`` (``swap_disamb_examples``,
  optional): the three disambiguation kinds above on tasks that need disambiguation, made from
  train tasks by the same stop swap. Once a corrected re-search is in the context, the direction
  call must copy the re-searched stop and the other stops from this episode's results (without
  them the policy recalls stops of trained routes after a re-search).
* ``check_drill`` (``check_drill_examples``, optional): the check line alone (``check=True``,
  below), trained after the first search results of train tasks and of swapped-stop tasks, half
  of them needing disambiguation.
* ``name_swap`` (``name_swap_examples``, optional): first-turn drills. A train task's
  request with its stop names swapped for other places of the map, and the oracle's first
  turn (the searches) with the same swap; only that turn is trained. They teach reading the
  stop names out of the request instead of writing names seen often.

``check=True`` (every builder takes it): every scripted episode's turn after the first search
results starts with the check line (``agents.check_line``: ``Check: Nanhu Lake in Wuhan.`` or
``Check: all in Chengdu.``), the trusting agent's included. The line makes the comparison that
tells an ambiguous result from a plain one an explicit, hard-labelled output of the policy, so
that the re-search decision RL must learn has a local cue (docs/tiny_policy.md).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import numpy as np

from rti_jax.envs.navigation import NavigationEnv, NavTask, OracleAgent
from rti_jax.envs.navigation.tasks import stage3_reject_reason, stop_at, template_level, unregioned_misses
from rti_jax.envs.navigation.tools import around
from rti_jax.envs.navigation.words import SCENIC_TYPE
from rti_jax.envs.navigation.agents import (CHECK_PREFIX, PLAN_NOW, SEARCH_FIRST, Candidate, CheckedAgent,
                                            _direction_call, _direction_done, _final_answer, direction_call,
                                            mention_order, observed_searches, parse_candidates, render_turn)
from rti_jax.envs.tool_calls import ToolCall, parse_assistant_turn
from rti_jax.intervention.judges import StepContext, feedback_message
from rti_jax.intervention.rules_navigation import NavigationRuleValidator, NavigationRuleVerifier
from rti_jax.rollout import ChatFormatter

Message = dict[str, Any]
KINDS = ("plain", "trusting", "resolve", "resolve_ctx", "resolve_tail", "correction", "name_swap", "swap_episode",
         "swap_trusting", "swap_resolve_ctx", "swap_correction", "check_drill")


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


@dataclasses.dataclass(frozen=True)
class MixConfig:
  """Shares of the SFT mix (see the module docstring); all from the train split.

  resolve_share: share of disambiguation tasks whose decisive re-search is trained.
  continue_share: share of disambiguation tasks with the re-search as context only.
  complete_share: share of disambiguation tasks with the re-search turn trained except its
    decision token (``resolve_tail``); drawn independently of the two above.
  correction_share: share of disambiguation tasks with a correction example on the
    trusting draft; perturb_share: share of all tasks with a correction example on a
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

  def __post_init__(self) -> None:
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


def play(env: NavigationEnv, agent: Any, task: NavTask) -> list[Message]:
  """The messages of one scripted episode (system, user, then turns and observations)."""
  messages = env.reset(task)
  while True:
    result = env.step(agent.act(messages))
    messages = env.transcript.messages
    if result.done:
      return list(messages)


def scripted(agent_cls: Any, task: NavTask, check: bool = False) -> Any:
  """``agent_cls(task)``, wrapped in ``CheckedAgent`` when ``check`` (the policy's format writes
  the check line after the first search results)."""
  agent = agent_cls(task)
  return CheckedAgent(agent) if check else agent


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


def correction_example(formatter: ChatFormatter, env: NavigationEnv, task: NavTask, prefix: Sequence[Message],
                       draft: str, target: str, kind: str = "correction") -> SFTExample | None:
  """p_cal (``prefix`` + the Validator's feedback on ``draft``) -> ``target``, trained on the target only.

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
  p_cal = formatter.with_extra_user_message(p_roll, feedback_message(judgement))
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


def assistant_indices(messages: Sequence[Message]) -> list[int]:
  """Indices of the assistant messages in ``messages``."""
  return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


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
          ex = correction_example(formatter, env, task, trusting[:k], trusting[k]["content"], oracle[a_idx[1]]["content"])
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
          ex = correction_example(formatter, env, task, oracle[:d], draft, oracle[d]["content"])
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


def swap_names(texts: Sequence[str], old: Sequence[str], new: Sequence[str]) -> list[str] | None:
  """``texts`` with ``old[i]`` replaced by ``new[i]`` (longer old names first, so a name inside
  another is not replaced partially; placeholders first, so a new name equal to an old one is
  safe), or None when some text does not mention every old name."""
  out = list(texts)
  for i in sorted(range(len(old)), key=lambda i: -len(old[i])):  # stable: ties keep the order given
    out = [t.replace(old[i], f"\x00{i}\x00") for t in out]
  if any(f"\x00{i}\x00" not in t for t in out for i in range(len(old))):
    return None
  for i, name in enumerate(new):
    out = [t.replace(f"\x00{i}\x00", name) for t in out]
  return out


def name_swap_examples(tasks: Sequence[NavTask], env: NavigationEnv, formatter: ChatFormatter, num: int,
                       seed: int = 0) -> list[SFTExample]:
  """``num`` first-turn drills (kind ``name_swap``, see the module docstring) from ``tasks``
  (pass the train split only); deterministic for ``seed``.

  Each stop's name is replaced, in the request and in the oracle's first turn alike, by a
  distinct random POI name of the map; a task whose first turn or request does not mention
  every stop name verbatim is skipped.
  """
  if num <= 0 or not tasks:
    return []
  rng = np.random.default_rng(seed)
  names = sorted({p.name for p in env.world.pois})
  out: list[SFTExample] = []
  for _ in range(50 * num):
    if len(out) == num:
      break
    task = tasks[int(rng.integers(len(tasks)))]
    messages = env.reset(task)
    first = OracleAgent(task).act(list(messages))
    # A fixed order of the stop names (which new name replaces which): not set order, which depends
    # on the process's string-hash seed (PYTHONHASHSEED) and made earlier builds' drills differ per run.
    stops = sorted({s.name for s in task.stops}, key=lambda n: (-len(n), n))
    new = [str(x) for x in rng.choice(names, size=len(stops), replace=False)]
    swapped = swap_names([messages[1]["content"], first], stops, new)
    if swapped is None:
      continue
    user, turn = swapped
    ids, mask = encode_messages(formatter, [messages[0], {"role": "user", "content": user},
                                            {"role": "assistant", "content": turn}])
    out.append(SFTExample(task.task_id, "name_swap", tuple(ids), tuple(mask)))
  return out


def swapped_task(task: NavTask, world: Any, rng: np.random.Generator,
                 exclude: frozenset[frozenset[str]] = frozenset(), disambiguation: bool = False) -> NavTask | None:
  """``task`` with its stops replaced by other scenic places around a random anchor of the map
  (as the benchmark's Stage 1 draws them), names swapped in the request (and the city, when the
  request hints one), or None when the result fails the benchmark's Stage-3 filter, its stop set
  is in ``exclude`` (pass the stop sets of every benchmark task), or its need of disambiguation
  is not ``disambiguation``.
  """
  cfg = world.config
  anchor = world.pois[int(rng.integers(len(world.pois)))]
  hits = [p for p, _ in around(world, anchor.lon, anchor.lat, cfg.sample_radius_m, SCENIC_TYPE)]
  n = len(task.stops)
  if len(hits) < n or len({s.city for s in task.stops}) != 1:
    return None
  chosen = [hits[i] for i in rng.choice(len(hits), size=n, replace=False)]
  stops = tuple(stop_at(p, old.hinted) for p, old in zip(chosen, task.stops))
  if frozenset(s.poi_id for s in stops) in exclude or len({s.city for s in stops}) != 1:
    return None
  old_names = [s.name for s in task.stops]
  new_names = [s.name for s in stops]
  if any(s.hinted for s in task.stops):
    old_names.append(task.stops[0].city)
    new_names.append(stops[0].city)
  swapped = swap_names([task.query], old_names, new_names)
  if swapped is None:
    return None
  query = swapped[0]
  if stage3_reject_reason(world, query, stops, template_level(task.template), 2 * cfg.sample_radius_m) is not None:
    return None
  new = dataclasses.replace(task, task_id=f"{task.task_id}-swap", query=query, stops=stops,
                            ambiguous=unregioned_misses(world, stops))
  return new if new.needs_disambiguation == disambiguation else None


def swap_episode_examples(tasks: Sequence[NavTask], env: NavigationEnv, formatter: ChatFormatter, num: int,
                          seed: int = 0, exclude: frozenset[frozenset[str]] = frozenset(),
                          check: bool = False) -> list[SFTExample]:
  """``num`` whole oracle episodes (kind ``swap_episode``) of plain tasks made from ``tasks`` (pass
  the train split only) by :func:`swapped_task`; deterministic for ``seed``. ``exclude``: stop
  sets (POI ids) no generated task may have; pass those of every benchmark task, the test
  split's included, so that no generated task repeats one (decontamination; nothing else of
  the test split is read)."""
  if num <= 0 or not tasks:
    return []
  rng = np.random.default_rng(seed)
  source = [t for t in tasks if not t.needs_disambiguation]
  out: list[SFTExample] = []
  seen: set[frozenset[str]] = set()
  for _ in range(200 * num):
    if len(out) == num or not source:
      break
    task = swapped_task(source[int(rng.integers(len(source)))], env.world, rng, exclude)
    if task is None or frozenset(s.poi_id for s in task.stops) in seen:
      continue
    seen.add(frozenset(s.poi_id for s in task.stops))
    ids, mask = encode_messages(formatter, play(env, scripted(OracleAgent, task, check), task))
    out.append(SFTExample(task.task_id, "swap_episode", tuple(ids), tuple(mask)))
  return out


def swap_disamb_examples(tasks: Sequence[NavTask], env: NavigationEnv, formatter: ChatFormatter, num: int,
                         seed: int = 0, exclude: frozenset[frozenset[str]] = frozenset(),
                         trusting_share: float = 0.5, correction_share: float = 0.6,
                         check: bool = False) -> list[SFTExample]:
  """Disambiguation kinds on ``num`` new tasks that need a re-search, made from ``tasks`` (pass the
  train split only) by :func:`swapped_task`; deterministic for ``seed``; ``exclude`` as for
  :func:`swap_episode_examples`.

  Per task: ``swap_resolve_ctx`` (the oracle's episode, its re-search turn as context only and
  every other turn trained), with probability ``trusting_share`` ``swap_trusting`` (the trusting
  agent's episode: the habit stays on new stops) and with probability ``correction_share``
  ``swap_correction`` (p_cal on the trusting direction call -> the oracle's re-search). Tasks
  whose hints alone resolve every stop (no re-search turn) are skipped.
  """
  if num <= 0 or not tasks:
    return []
  rng = np.random.default_rng(seed)
  source = [t for t in tasks if t.needs_disambiguation]
  out: list[SFTExample] = []
  seen: set[frozenset[str]] = set()
  for _ in range(400 * num):
    if len(seen) == num or not source:
      break
    task = swapped_task(source[int(rng.integers(len(source)))], env.world, rng, exclude, disambiguation=True)
    if task is None or frozenset(s.poi_id for s in task.stops) in seen:
      continue
    oracle = play(env, scripted(OracleAgent, task, check), task)
    a_idx = assistant_indices(oracle)
    if len(a_idx) <= 3 or env.transcript.reward != 1.0:  # no re-search turn (or, defensively, no success)
      continue
    seen.add(frozenset(s.poi_id for s in task.stops))
    ids, mask = encode_messages(formatter, oracle, [j != 1 for j in range(len(a_idx))])
    out.append(SFTExample(task.task_id, "swap_resolve_ctx", tuple(ids), tuple(mask)))
    u = rng.random(2)
    trusting = play(env, scripted(TrustingAgent, task, check), task)
    if u[0] < trusting_share:
      ids, mask = encode_messages(formatter, trusting)
      out.append(SFTExample(task.task_id, "swap_trusting", tuple(ids), tuple(mask)))
    if u[1] < correction_share:
      t_idx = assistant_indices(trusting)
      if len(t_idx) >= 2:
        k = t_idx[1]
        ex = correction_example(formatter, env, task, trusting[:k], trusting[k]["content"], oracle[a_idx[1]]["content"],
                                kind="swap_correction")
        if ex is not None:
          out.append(ex)
  return out


def check_line_length(tokenizer: Any, ids: Sequence[int], start: int, turn_text: str) -> int:
  """The number of tokens of the check line that starts ``turn_text``, encoded at ``ids[start:]``
  (the line and its newline); raises ValueError when the turn does not start with a check line
  that tokenizes as a prefix of the turn."""
  line = turn_text.split("\n", 1)[0] + "\n"
  line_ids = tokenizer.encode(line, add_special_tokens=False)
  if not line.startswith(CHECK_PREFIX) or list(ids[start:start + len(line_ids)]) != line_ids:
    raise ValueError(f"the turn {turn_text[:40]!r} does not start with a check line that tokenizes as its prefix")
  return len(line_ids)


def check_drill_examples(tasks: Sequence[NavTask], env: NavigationEnv, formatter: ChatFormatter, num: int,
                         seed: int = 0, exclude: frozenset[frozenset[str]] = frozenset()) -> list[SFTExample]:
  """``num`` check-line drills (kind ``check_drill``) from ``tasks`` (pass the train split only);
  deterministic for ``seed``; ``exclude`` as for :func:`swap_episode_examples`.

  Each drill is an oracle episode up to and including its turn after the first search results,
  with only the check line trained (the rest of the turn is context, so the drill does not
  change what follows the line). Every task of ``tasks`` gives one drill, then new tasks made by
  :func:`swapped_task` (alternately needing disambiguation and not) until ``num``.
  """
  if num <= 0 or not tasks:
    return []
  rng = np.random.default_rng(seed)
  source = {True: [t for t in tasks if t.needs_disambiguation], False: [t for t in tasks if not t.needs_disambiguation]}
  out: list[SFTExample] = []
  seen: set[frozenset[str]] = set()

  def add(task: NavTask) -> bool:
    messages = play(env, scripted(OracleAgent, task, True), task)
    a_idx = assistant_indices(messages)
    if len(a_idx) < 2 or not messages[a_idx[1]]["content"].startswith(CHECK_PREFIX):
      return False
    turn = messages[a_idx[1]]["content"]
    ids, mask = encode_messages(formatter, messages[:a_idx[1] + 1])
    start = len(ids) - len(formatter.encode_assistant(turn))
    n = check_line_length(formatter.tokenizer, ids, start, turn)
    trained = [False] * len(ids)
    trained[start:start + n] = [True] * n
    out.append(SFTExample(task.task_id, "check_drill", tuple(ids), tuple(trained)))
    return True

  for task in tasks:
    if len(out) == num:
      return out
    add(task)
  want = True
  for _ in range(400 * num):
    if len(out) == num or not source[want]:
      break
    task = swapped_task(source[want][int(rng.integers(len(source[want])))], env.world, rng, exclude,
                        disambiguation=want)
    if task is None or frozenset(s.poi_id for s in task.stops) in seen:
      continue
    if add(task):
      seen.add(frozenset(s.poi_id for s in task.stops))
      want = not want
  return out


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
