"""AEPO's dynamic entropy-balanced rollout (Dong et al., arXiv 2510.14545, Sec. "Dynamic
Entropy-Balanced Rollout"): the rollout half of the AEPO baseline.

For each task the group budget ``G`` is split into ``m`` global rollouts (full, independent
episodes) and ``G - m`` branched rollouts (a partial trajectory continued with fresh samples
from a high-entropy tool-call step). The result is still exactly ``G`` ordinary
``rollout.Trajectory`` objects per task, so the group advantage and the loss path are those
of every other method.

1. Entropy pre-monitoring. One probe rollout per task is run first. ``H_root`` is the step
   entropy of its first (question-level) turn, ``H_tool`` the mean step entropy of its turns
   that follow a tool observation (turns 1, 2, ...). The number of global rollouts is

       m = clip(floor(G * sigmoid(beta * (H_root - H_tool)) + 1/2), 1, G)        (AEPO Eq. "m")

   (AEPO: ``m = k * sigma(beta * (H_root - mean_i H_tool_i))``; rounding and the clip to
   [1, G] are ours). A probe without tool turns has no ``H_tool``: the gap is taken as 0.
   The probe is one of the ``m`` global rollouts.

2. Entropy-balanced branching. Turn ``t >= 1`` of a trajectory (it follows a tool
   observation) with step entropy ``H_t`` and ``dH_t = H_t - H_root(trajectory)`` forks when
   ``dH_t > threshold`` and a uniform draw is below

       p_t = clip(branch_beta * dH_t, 0, 1) * (1 - penalty) ** c_t              (branch penalty)

   where ``c_t`` is the number of consecutive steps directly before ``t`` at which this
   lineage forked (it resets at a step that does not fork). A fork copies the context up to
   the start of turn ``t`` (the prompt, turns ``< t`` and their observations) and continues it
   with fresh samples from turn ``t``; the child inherits ``H_root`` and ``c_t + 1``, and its
   own turns after ``t`` may fork again. Forks are made until the task's ``G - m`` branch
   budget is spent; whatever is left when no trajectory can fork any more goes to extra
   global rollouts (``fill``), so every group has exactly ``G`` members.

Forks are realised by replay: a fresh environment is reset and stepped with the parent's
recorded assistant turns, so no environment needs to be copyable. The replayed prefix must
equal the parent's tokens (environments here are deterministic); a fork whose replay differs
is dropped and counted (``aepo/replay_mismatch``). A branched member therefore shares its
prefix token-for-token with its parent, ``behaviour_logp`` included: every generated token's
log-prob is the sampling policy's, as in ``rollout_groups``.

Step entropy: ``H_t`` is the mean entropy (nats, temperature 1) of the first ``k`` tokens of
turn ``t`` (ARPO/AEPO measure the first tokens after a tool call). It comes from a
``TurnEntropyFn``; ``surprisal_entropy`` estimates it from the sampled tokens' log-probs
(``-log p`` is an unbiased one-sample estimate of the entropy at temperature 1), and
``baselines.make_turn_entropy_fn`` computes it exactly with a policy forward pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from rti_jax.envs.base import Environment
from rti_jax.generation.base import Completion, GenerationBackend
from rti_jax.rollout import ChatFormatter, Episode, RolloutConfig, Trajectory, rollout_groups, run_episodes

#: ``(contexts, completions) -> [n]`` float step entropy of each completion given its context.
TurnEntropyFn = Callable[[Sequence[Sequence[int]], Sequence[Completion]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class BranchingConfig:
  """Knobs of the entropy-balanced rollout (``baselines.aepo_*`` in the experiment config).

  alloc_beta: ``beta`` of the global/branch split (sigmoid sensitivity), >= 0.
  branch_beta: slope of the branch probability in ``dH``, >= 0.
  threshold: ``dH`` must exceed this for a step to be a fork candidate (nats).
  penalty: consecutive branch penalty in [0, 1]; 0 = ARPO-style branching without penalty.
  """

  alloc_beta: float = 1.0
  branch_beta: float = 1.0
  threshold: float = 0.0
  penalty: float = 0.5

  def __post_init__(self) -> None:
    if not self.alloc_beta >= 0:
      raise ValueError(f"alloc_beta: expected >= 0, got {self.alloc_beta}")
    if not self.branch_beta >= 0:
      raise ValueError(f"branch_beta: expected >= 0, got {self.branch_beta}")
    if not np.isfinite(self.threshold):
      raise ValueError(f"threshold: expected a finite number, got {self.threshold}")
    if not 0 <= self.penalty <= 1:
      raise ValueError(f"penalty: expected in [0, 1], got {self.penalty}")


@dataclasses.dataclass
class BranchingStats:
  """Counters of one call (``as_dict`` -> ``aepo/*`` metric keys)."""

  global_rollouts: int = 0  # members that are full episodes (probe + planned + fill)
  planned_global: int = 0  # sum over tasks of m
  fill_rollouts: int = 0  # global rollouts added because the branch budget could not be spent
  branches: int = 0  # members forked from another member
  fork_candidates: int = 0  # steps with dH > threshold that were considered
  replay_mismatch: int = 0  # forks dropped because the replayed prefix differed

  def as_dict(self) -> dict[str, int]:
    return {f"aepo/{k}": v for k, v in dataclasses.asdict(self).items()}


def surprisal_entropy(num_tokens: int = 20) -> TurnEntropyFn:
  """Step entropy estimated from the sampled tokens: mean ``-logprob`` of the first ``num_tokens``.

  ``Completion.logprobs`` are temperature-1 log-probs, so this is an unbiased estimate of the
  temperature-1 entropy when sampling at temperature 1. An empty completion gives 0.
  """
  if num_tokens < 1:
    raise ValueError(f"num_tokens: expected >= 1, got {num_tokens}")

  def fn(contexts: Sequence[Sequence[int]], completions: Sequence[Completion]) -> np.ndarray:
    out = np.zeros(len(completions), np.float64)
    for i, c in enumerate(completions):
      lp = np.asarray(c.logprobs, np.float64)[:num_tokens]
      if lp.size:
        out[i] = -lp.mean()
    return out

  return fn


def global_rollout_count(group_size: int, h_root: float, h_tool: float | None, beta: float) -> int:
  """``m = clip(floor(G * sigmoid(beta * (H_root - H_tool)) + 1/2), 1, G)``; ``h_tool=None`` -> gap 0.

  Non-finite entropies are treated as a zero gap.
  """
  gap = 0.0 if h_tool is None else float(h_root) - float(h_tool)
  if not np.isfinite(gap):
    gap = 0.0
  share = 1.0 / (1.0 + np.exp(-beta * gap))
  return int(np.clip(np.floor(group_size * share + 0.5), 1, group_size))


def branch_probability(delta_h: float, consecutive: int, branch_beta: float, penalty: float) -> float:
  """``p = clip(branch_beta * dH, 0, 1) * (1 - penalty) ** consecutive``."""
  return float(np.clip(branch_beta * delta_h, 0.0, 1.0) * (1.0 - penalty) ** consecutive)


@dataclasses.dataclass
class _Member:
  """A group member being written: its episode, per-turn step entropy and lineage."""

  episode: Episode
  task_index: int
  root_entropy: float | None = None  # H_root of the lineage (its first turn's, inherited by forks)
  turn_entropy: list[float] = dataclasses.field(default_factory=list)
  fork_turn: int = 0  # turns < fork_turn are the parent's (replayed); 0 for a global rollout
  consecutive: int = 0  # c at fork_turn (forks directly before, this fork included)
  parent: int | None = None  # index of the parent in its group


def _finite(x: float) -> float:
  return float(x) if np.isfinite(x) else 0.0


def _drive(members: Sequence[_Member], backend: GenerationBackend, formatter: ChatFormatter, config: RolloutConfig,
           entropy_fn: TurnEntropyFn, seed: int) -> None:
  """``rollout.run_episodes`` over the members' episodes, recording each turn's step entropy."""
  by_episode = {id(m.episode): m for m in members}

  def record(live: Sequence[Episode], comps: Sequence[Completion]) -> None:
    ents = np.asarray(entropy_fn([e.context() for e in live], comps), np.float64).reshape(-1)
    if ents.shape[0] != len(live):
      raise RuntimeError(f"entropy_fn: expected {len(live)} step entropies, got {ents.shape[0]}")
    for e, h in zip(live, ents):
      m = by_episode[id(e)]
      m.turn_entropy.append(_finite(h))
      if m.root_entropy is None:
        m.root_entropy = m.turn_entropy[0]

  run_episodes([m.episode for m in members], backend, formatter, config, seed, on_turn=record)


def _fork(parent: _Member, turn: int, consecutive: int, parent_index: int, env_factory: Callable[[], Environment],
          task: Any, task_id: str, formatter: ChatFormatter, config: RolloutConfig) -> _Member | None:
  """A member whose first ``turn`` turns are the parent's (replayed), live at turn ``turn``; None on mismatch."""
  ep = Episode(env_factory(), task, task_id, formatter, config.max_prompt_tokens)
  src = parent.episode.traj
  for rec in src.turns[:turn]:
    if not ep.live:
      return None
    ep.apply_turn(formatter, src.token_ids[rec.start:rec.end], src.behaviour_logp[rec.start:rec.end],
                  rec.finish_reason, config.max_prompt_tokens)
  n = len(ep.traj.token_ids)
  if not ep.live or ep.traj.token_ids != src.token_ids[:n] or ep.traj.behaviour_logp != src.behaviour_logp[:n]:
    return None
  ep.traj.info["aepo_parent"] = parent_index
  ep.traj.info["aepo_fork_turn"] = turn
  return _Member(episode=ep, task_index=parent.task_index, root_entropy=parent.root_entropy,
                 turn_entropy=list(parent.turn_entropy[:turn]), fork_turn=turn, consecutive=consecutive,
                 parent=parent_index)


def aepo_rollout_groups(
  tasks: Sequence[Any],
  env_factory: Callable[[], Environment],
  backend: GenerationBackend,
  formatter: ChatFormatter,
  config: RolloutConfig,
  branching: BranchingConfig | None,
  entropy_fn: TurnEntropyFn,
  *,
  task_id: Callable[[Any], str] = lambda t: str(getattr(t, "task_id", t)),
  seed: int | None = None,
) -> tuple[list[list[Trajectory]], BranchingStats]:
  """AEPO's rollout: ``groups[n]`` holds exactly ``config.group_size`` trajectories of ``tasks[n]``.

  branching: None -> exactly ``rollout.rollout_groups`` (same seed, same output), all global.
  Members are ordered: global rollouts (probe, planned, fill), then branches in creation order.
  Branched trajectories carry ``info["aepo_parent"]`` (index of the parent in the group) and
  ``info["aepo_fork_turn"]`` (the first turn they sampled themselves).
  """
  g = config.group_size
  if g < 1:
    raise ValueError(f"config.group_size: expected >= 1, got {g}")
  seed = config.seed if seed is None else seed
  stats = BranchingStats()
  if branching is None:
    groups = rollout_groups(tasks, env_factory, backend, formatter, config, task_id=task_id, seed=seed)
    stats.global_rollouts = stats.planned_global = sum(len(grp) for grp in groups)
    return groups, stats
  ids = [task_id(t) for t in tasks]

  def new_globals(counts: Sequence[int]) -> list[_Member]:
    return [_Member(Episode(env_factory(), tasks[n], ids[n], formatter, config.max_prompt_tokens), n)
            for n, k in enumerate(counts) for _ in range(k)]

  # 1. entropy pre-monitoring: one probe per task, then m per task.
  globals_: list[list[_Member]] = [[] for _ in tasks]
  probes = new_globals([1] * len(tasks))
  _drive(probes, backend, formatter, config, entropy_fn, seed)
  for p in probes:
    globals_[p.task_index].append(p)
  planned = []
  for p in probes:
    tool = p.turn_entropy[1:]
    h_root = p.root_entropy if p.root_entropy is not None else 0.0
    planned.append(global_rollout_count(g, h_root, float(np.mean(tool)) if tool else None, branching.alloc_beta))
  stats.planned_global = sum(planned)
  rest = new_globals([m - 1 for m in planned])
  _drive(rest, backend, formatter, config, entropy_fn, seed + 7_919)
  for r in rest:
    globals_[r.task_index].append(r)

  # 2. branching rounds: scan the newest members' turns, fork, run the forks; repeat.
  members = [list(gl) for gl in globals_]
  budget = [g - m for m in planned]
  frontier = [list(range(len(gl))) for gl in members]  # indices (per task) not yet scanned
  rng = np.random.default_rng([seed & 0x7FFFFFFF, 0xAE90])
  rnd = 0
  while any(budget[n] > 0 and frontier[n] for n in range(len(tasks))):
    rnd += 1
    forks: list[_Member] = []
    for n, task in enumerate(tasks):
      order = list(frontier[n])
      frontier[n] = []
      rng.shuffle(order)
      for j in order:
        mem = members[n][j]
        consecutive = mem.consecutive
        for t in range(max(mem.fork_turn + 1, 1), len(mem.turn_entropy)):
          if budget[n] <= 0:
            break
          dh = mem.turn_entropy[t] - (mem.root_entropy or 0.0)
          if not dh > branching.threshold:
            consecutive = 0
            continue
          stats.fork_candidates += 1
          if rng.random() >= branch_probability(dh, consecutive, branching.branch_beta, branching.penalty):
            consecutive = 0
            continue
          child = _fork(mem, t, consecutive + 1, j, env_factory, task, ids[n], formatter, config)
          if child is None:
            stats.replay_mismatch += 1
            consecutive = 0
            continue
          budget[n] -= 1
          forks.append(child)
          consecutive += 1
    if not forks:
      break
    _drive(forks, backend, formatter, config, entropy_fn, seed + 7_919 * (rnd + 1))
    for child in forks:
      n = child.task_index
      frontier[n].append(len(members[n]))
      members[n].append(child)
      stats.branches += 1

  # 3. an unspent branch budget goes to extra global rollouts, so each group has G members.
  fill = new_globals(budget)
  _drive(fill, backend, formatter, config, entropy_fn, seed + 7_919 * (rnd + 2))
  stats.fill_rollouts = len(fill)
  out: list[list[Trajectory]] = []
  for n in range(len(tasks)):
    glob = globals_[n] + [f for f in fill if f.task_index == n]
    branches = members[n][len(globals_[n]):]
    # Parent indices refer to ``members[n]``; re-index them to the output order (fill goes in between).
    pos = {id(m): i for i, m in enumerate(glob + branches)}
    for b in branches:
      b.episode.traj.info["aepo_parent"] = pos[id(members[n][b.parent])]
    out.append([m.episode.traj for m in glob + branches])
    if len(out[-1]) != g:
      raise AssertionError(f"aepo_rollout_groups: task {ids[n]!r} got {len(out[-1])} members, expected {g}")
  stats.global_rollouts = sum(len(globals_[n]) for n in range(len(tasks))) + len(fill)
  return out, stats
