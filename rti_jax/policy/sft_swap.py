"""SFT data for the tiny Navigation policy on tasks made from train tasks by swapping names or stops.

* ``name_swap`` (``name_swap_examples``): first-turn drills. A train task's request with its stop
  names swapped for other places of the map, and the oracle's first turn (the searches) with the
  same swap; only that turn is trained. They teach reading the stop names out of the request
  instead of writing names seen often.
* ``swap_episode`` (``swap_episode_examples``): whole oracle episodes of plain tasks made from
  train tasks by swapping their stops for other nearby places of the map (``swapped_task``: same
  template, order cues, hints and mode; checked by the benchmark's own Stage-3 filter). The
  direction call must then copy names and coordinates from this episode's results instead of
  recalling those of a trained task.
* ``swap_trusting`` / ``swap_resolve_ctx`` / ``swap_correction`` (``swap_disamb_examples``): the
  disambiguation kinds of ``sft_data`` on tasks that need disambiguation, made by the same stop
  swap. Once a corrected re-search is in the context, the direction call must copy the
  re-searched stop and the other stops from this episode's results (without them the policy
  recalls stops of trained routes after a re-search).
* ``check_drill`` (``check_drill_examples``): the check line alone (``rti_jax.policy.check_line``),
  trained after the first search results of train tasks and of swapped-stop tasks, half of them
  needing disambiguation.

Every generator is deterministic for its seed. ``exclude`` takes the stop sets of every benchmark
task, the test split's included, so that no generated task repeats one (nothing else of the test
split is read).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rti_jax.envs.navigation import NavigationEnv, NavTask, OracleAgent
from rti_jax.envs.navigation.tasks import stage3_reject_reason, stop_at, template_level, unregioned_misses
from rti_jax.envs.navigation.tools import around
from rti_jax.envs.navigation.words import SCENIC_TYPE
from rti_jax.policy.check_line import CHECK_PREFIX, check_line_length
from rti_jax.policy.sft_data import TrustingAgent, correction_example, scripted
from rti_jax.policy.sft_example import SFTExample, assistant_indices, encode_messages, play
from rti_jax.rollout import ChatFormatter

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
    # on the process's string-hash seed (PYTHONHASHSEED) and would make the drills differ per run.
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
