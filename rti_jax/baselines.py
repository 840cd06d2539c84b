"""Trainer-side support of the baselines (paper Sec. 5.1, App. C.3): what their losses need
beyond an on-policy GRPO batch.

* AEPO (Dong et al.): ``RTIBatch.entropy`` [B, T], the per-token entropy of the sampling
  policy (the parameters that drew the rollouts, at temperature 1, the same distribution
  whose log-probs are ``old_logp``), read by ``objectives.aepo_advantages``. Its rollout half,
  the entropy-balanced branching rollout, is ``rti_jax.aepo_rollout``; the exact step entropy
  it branches on is ``make_turn_entropy_fn``.
* OPD (on-policy distillation, slime's form): ``RTIBatch.teacher_logp`` [B, T], the log-probs
  a teacher checkpoint (``baselines.teacher_path``) gives the student's own tokens, folded
  into the advantage by ``objectives.opd_advantages``.
* LUFFY (Yan et al.): successful off-policy demonstrations mixed into the rollout groups. The
  demonstrator here is the scripted Navigation oracle (``envs.navigation.OracleAgent``): its
  turns are tokenized with the policy's chat template exactly as a rollout is laid out, and
  its assistant tokens are marked off-policy (``intervened_mask``), which ``luffy_loss`` trains
  with the shaped, unclipped ``f(pi_theta) = pi / (pi + gamma)`` term. A demonstration replaces
  one on-policy member of a group (the last), as LUFFY mixes 1 off-policy + (G-1) on-policy
  samples. ``when="all_fail"`` (default) does so only for groups in which every rollout
  failed, the protocol of the RTI paper's App. C.3; ``when="always"`` mixes one into every
  group, as the LUFFY paper does.

GSPO needs nothing here: it is a loss over the ordinary batch (``objectives.gspo_loss``).
Everything in this module is host-side or a jitted forward pass at the trainer's boundary.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rti_jax import objectives
from rti_jax.envs import registry
from rti_jax.envs.base import Environment
from rti_jax.generation.base import GenerationBackend
from rti_jax.rollout import ChatFormatter, Episode, Trajectory
from rti_jax.shapes import UPDATE_BUCKETS, bucket_length

LUFFY_WHEN = ("all_fail", "always")

# ---------------------------------------------------------------------------------------
# AEPO: per-token entropy of the sampling policy
# ---------------------------------------------------------------------------------------


#: the overrides each method is trained with beside ``loss.method`` (each baseline as its paper sets it)
METHOD_OVERRIDES: dict[str, tuple[str, ...]] = {
    "aepo": ("loss.aggregation=token-mean",),
    "luffy": ("loss.aggregation=token-mean",),
}


def method_variants(methods: Sequence[str], teacher: str | None, teacher_hint: str = "",
                    ) -> tuple[dict[str, list[str]], dict[str, str]]:
  """label -> overrides for each of ``methods`` (``loss.method`` values), and label -> why for each
  left out: OPD without a teacher checkpoint at ``teacher`` (``teacher_hint`` says how to make one)."""
  variants, skipped = {}, {}
  for m in methods:
    extra = list(METHOD_OVERRIDES.get(m, ()))
    if m == "opd":
      if not teacher or not (pathlib.Path(teacher) / "config.json").exists():
        skipped[m] = f"no teacher checkpoint at {teacher!r}" + (f"; {teacher_hint}" if teacher_hint else "")
        continue
      extra.append(f"baselines.teacher_path={teacher}")
    variants[m] = [f"loss.method={m}", *extra]
  return variants, skipped


def token_entropy(logits: jax.Array) -> jax.Array:
  """Entropy of each next-token distribution, aligned like ``objectives.next_token_logprobs``.

  logits: [B, T, V] where ``logits[:, t]`` predicts token ``t + 1``. Returns [B, T] float32
  with ``out[:, t] = H(softmax(logits[:, t - 1]))`` for ``t >= 1`` and ``out[:, 0] = 0``, i.e.
  ``out[:, t]`` is the entropy of the distribution token ``t`` was drawn from (nats).
  """
  if logits.ndim != 3:
    raise ValueError(f"logits: expected rank 3 [B, T, V], got shape {tuple(logits.shape)}")
  logz = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  ent = -jnp.sum(jnp.exp(logz) * logz, axis=-1)
  return jnp.pad(ent, ((0, 0), (1, 0)))


def make_entropy_fn(graphdef: Any, rest: Any) -> Callable[[Any, jax.Array, jax.Array], jax.Array]:
  """Jitted ``(params, input_ids [B, T], attention_mask [B, T]) -> entropy [B, T]`` of the model
  ``nnx.merge(graphdef, params, rest)`` (the trainer's policy)."""
  from flax import nnx

  @jax.jit
  def entropy_fn(params: Any, ids: jax.Array, mask: jax.Array) -> jax.Array:
    net = nnx.merge(graphdef, params, rest)
    return token_entropy(net(ids, mask)) * (mask != 0)

  return entropy_fn


def make_turn_entropy_fn(entropy_fn: Callable[[Any, jax.Array, jax.Array], jax.Array], params: Callable[[], Any],
                         *, pad_id: int = 0, num_tokens: int = 20, buckets: dict[str, Any] | None = None,
                         ) -> Callable[[Sequence[Sequence[int]], Sequence[Any]], np.ndarray]:
  """AEPO's step entropy for the branching rollout (``aepo_rollout.TurnEntropyFn``), exactly.

  ``(contexts, completions) -> [n]``: the mean entropy (nats, temperature 1) of the
  distributions the first ``num_tokens`` tokens of each completion were drawn from, by one
  forward pass of ``entropy_fn`` (``make_entropy_fn``) at ``params()`` (the sampling policy)
  over ``context + completion``. Rows are right-padded with ``pad_id`` to
  ``shapes.bucket_length`` with ``buckets`` (the trainer's ``update_buckets``; default
  ``UPDATE_BUCKETS``), and the batch with empty rows to a
  power of two, so jit compiles few shapes. An empty completion gives 0.
  """
  if num_tokens < 1:
    raise ValueError(f"num_tokens: expected >= 1, got {num_tokens}")

  def fn(contexts: Sequence[Sequence[int]], completions: Sequence[Any]) -> np.ndarray:
    out = np.zeros(len(completions), np.float64)
    rows = [(list(ctx), [int(t) for t in np.asarray(c.token_ids)[:num_tokens]]) for ctx, c in zip(contexts, completions)]
    if not rows:
      return out
    longest = max(len(a) + len(b) for a, b in rows)
    length, batch = bucket_length(longest, **(UPDATE_BUCKETS if buckets is None else buckets)), 1
    while batch < len(rows):
      batch *= 2
    ids = np.full((batch, length), pad_id, np.int32)
    mask = np.zeros((batch, length), np.int32)
    for i, (a, b) in enumerate(rows):
      ids[i, :len(a) + len(b)] = a + b
      mask[i, :len(a) + len(b)] = 1
    ent = np.asarray(entropy_fn(params(), jnp.asarray(ids), jnp.asarray(mask)), np.float64)
    for i, (a, b) in enumerate(rows):
      if b:
        out[i] = ent[i, len(a):len(a) + len(b)].mean()
    return out

  return fn


# ---------------------------------------------------------------------------------------
# OPD: teacher log-probs of the student's tokens
# ---------------------------------------------------------------------------------------


def _vocab(tokenizer: Any) -> dict[str, int]:
  return dict(tokenizer.get_vocab())


def load_teacher(path: str | pathlib.Path, policy_tokenizer: Any, policy_vocab_size: int,
                 dtype: Any = jnp.float32) -> Any:
  """The OPD teacher as an NNX model; it must share the policy's tokenizer.

  path: a local HF checkpoint dir with its tokenizer (e.g. ``policies/navigation_teacher``,
  made by ``navigation_sft`` with ``data.resolve_share=1.0``, e.g. ``policies/navigation_teacher``). Raises
  ValueError naming ``baselines.teacher_path`` when it is missing or its vocabulary differs.
  """
  from models import from_pretrained
  from transformers import AutoTokenizer

  p = pathlib.Path(path)
  if not (p / "config.json").exists():
    raise ValueError(f"baselines.teacher_path: expected an HF checkpoint dir with config.json, got {str(path)!r}")
  teacher, tcfg = from_pretrained(str(p), dtype=dtype)
  ttok = AutoTokenizer.from_pretrained(str(p))
  if _vocab(ttok) != _vocab(policy_tokenizer):
    raise ValueError(f"baselines.teacher_path: expected a teacher with the policy's tokenizer "
                     f"({len(_vocab(policy_tokenizer))} tokens), got one with {len(_vocab(ttok))} "
                     f"different or differently numbered tokens at {str(path)!r}")
  if int(tcfg.vocab_size) != int(policy_vocab_size):
    raise ValueError(f"baselines.teacher_path: expected vocab_size {policy_vocab_size} (the policy's), "
                     f"got {tcfg.vocab_size}")
  return teacher


def make_teacher_logp_fn(teacher: Any) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """Jitted ``(input_ids [B, T], attention_mask [B, T]) -> teacher_logp [B, T]`` (aligned like
  ``next_token_logprobs``; 0 on padding)."""
  from flax import nnx

  graphdef, state = nnx.split(teacher)

  @jax.jit
  def logp_fn(state: Any, ids: jax.Array, mask: jax.Array) -> jax.Array:
    net = nnx.merge(graphdef, state)
    return objectives.next_token_logprobs(net(ids, mask), ids) * (mask != 0)

  return lambda ids, mask: logp_fn(state, ids, mask)


def add_policy_signals(batch: objectives.RTIBatch, *, entropy: jax.Array | None = None,
                       teacher_logp: jax.Array | None = None) -> objectives.RTIBatch:
  """``batch`` with ``entropy`` / ``teacher_logp`` ([B, T] float32 each) filled in and checked."""
  changes: dict[str, Any] = {}
  if entropy is not None:
    changes["entropy"] = jnp.asarray(entropy, jnp.float32)
  if teacher_logp is not None:
    changes["teacher_logp"] = jnp.asarray(teacher_logp, jnp.float32)
  return dataclasses.replace(batch, **changes).check() if changes else batch


def minibatch_zscore(values: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> list[np.ndarray]:
  """``objectives.entropy_zscore`` over several arrays at once (a minibatch's length chunks, of
  different widths): one mean and Bessel std over the masked entries of all of them (float64);
  z = 0 off the masks, and everywhere when that std is 0 or there is at most one entry."""
  picked = np.concatenate([np.asarray(v, np.float64)[m] for v, m in zip(values, masks)])
  std = float(np.std(picked, ddof=1)) if picked.size > 1 else 0.0
  mean = float(picked.mean()) if picked.size else 0.0
  if not std > 0:
    return [np.zeros(np.shape(v), np.float32) for v in values]
  return [np.where(m, (np.asarray(v, np.float64) - mean) / std, 0.0).astype(np.float32) for v, m in zip(values, masks)]


# ---------------------------------------------------------------------------------------
# LUFFY: off-policy demonstrations mixed into groups
# ---------------------------------------------------------------------------------------


def demonstrator_for(domain: str, check_line: bool = False) -> Callable[[Any], Any]:
  """``task -> agent`` (with ``act(messages) -> str``) writing LUFFY's off-policy demonstrations:
  the one environment ``domain`` registers (``EnvSpec.demonstrator``; Navigation's is the scripted
  ``OracleAgent``); ``check_line``: a policy whose format writes the check line
  (``<policy>/build.json``), so the demonstrations are in the policy's own format. An environment
  without one is a ``ValueError`` naming those that have one."""
  return registry.demonstrator(domain, check_line)


@dataclasses.dataclass
class LuffyStats:
  """Counters of one iteration's mixing (``as_dict`` -> ``luffy/*`` metric keys)."""

  groups_eligible: int = 0
  groups_mixed: int = 0
  demos_failed: int = 0
  demos_error: int = 0
  demo_tokens: int = 0

  def as_dict(self) -> dict[str, int]:
    return {f"luffy/{k}": v for k, v in dataclasses.asdict(self).items()}


def demonstration_trajectories(
  tasks: Sequence[Any],
  env_factory: Callable[[], Environment],
  agent_factory: Callable[[Any], Any],
  backend: GenerationBackend,
  formatter: ChatFormatter,
  max_prompt_tokens: int,
  *,
  task_id: Callable[[Any], str],
  max_turns: int = 64,
  behaviour_temperature: float = 1.0,
) -> list[Trajectory | None]:
  """One demonstration episode per task, laid out exactly as a rollout (``rollout.Episode``).

  Each assistant turn is ``formatter.encode_assistant(agent.act(messages))``; its tokens are
  trainable and marked off-policy (``intervened_mask``). ``behaviour_logp`` (and the unused
  ``roll_logp = cal_logp``) is the current policy's teacher-forced log-prob of the token
  (``backend.score``, at ``behaviour_temperature``, the rollouts' ``RolloutConfig.behaviour_temperature``),
  so the batch's clip / KL metrics stay meaningful; LUFFY's off-policy term does not read it. A
  demonstrator that raises, or runs past ``max_turns``, yields None.
  """
  episodes: list[Episode | None] = []
  agents = []
  for task in tasks:
    episodes.append(Episode(env_factory(), task, task_id(task), formatter, max_prompt_tokens))
    agents.append(agent_factory(task))
  failed: set[int] = set()
  for _ in range(max_turns):
    live = [i for i, e in enumerate(episodes) if e is not None and e.live and i not in failed]
    if not live:
      break
    turns: dict[int, list[int]] = {}
    for i in live:
      try:
        turns[i] = formatter.encode_assistant(agents[i].act(list(episodes[i].traj.messages)))
      except Exception:  # noqa: BLE001 - a broken demonstration is counted, never fatal
        failed.add(i)
    order = sorted(turns)
    kw = {} if behaviour_temperature == 1.0 else {"temperature": behaviour_temperature}
    scores = backend.score([episodes[i].context() for i in order], [turns[i] for i in order], **kw)
    for i, lp in zip(order, scores):
      lp = np.asarray(lp, np.float32).tolist()
      episodes[i].apply_turn(formatter, turns[i], lp, "stop", max_prompt_tokens, roll_logp=lp, cal_logp=lp)
  out: list[Trajectory | None] = []
  for i, e in enumerate(episodes):
    if e is None or i in failed or e.live:
      out.append(None)
    else:
      e.traj.info["off_policy"] = True
      out.append(e.traj)
  return out


def mix_demonstrations(
  groups: Sequence[Sequence[Trajectory]],
  tasks: Sequence[Any],
  env_factory: Callable[[], Environment],
  agent_factory: Callable[[Any], Any],
  backend: GenerationBackend,
  formatter: ChatFormatter,
  max_prompt_tokens: int,
  *,
  task_id: Callable[[Any], str],
  when: str = "all_fail",
  success_reward: float = 1.0,
  behaviour_temperature: float = 1.0,
) -> tuple[list[list[Trajectory]], LuffyStats]:
  """LUFFY's mixed groups: a successful demonstration replaces the last member of each eligible group.

  groups[n]: the G on-policy trajectories of tasks[n]. when: "all_fail" (groups whose every
  reward is <= 0; RTI paper App. C.3) or "always" (every group; LUFFY paper). A demonstration
  that errors or does not reach ``success_reward`` is counted (``demos_error`` / ``demos_failed``)
  and the group is left on-policy. Returns the new groups and the counters.
  """
  if when not in LUFFY_WHEN:
    raise ValueError(f"when: expected one of {list(LUFFY_WHEN)}, got {when!r}")
  if len(groups) != len(tasks):
    raise ValueError(f"tasks: expected {len(groups)} (one per group), got {len(tasks)}")
  out = [list(g) for g in groups]
  eligible = [n for n, g in enumerate(groups) if when == "always" or max(t.reward for t in g) <= 0.0]
  stats = LuffyStats(groups_eligible=len(eligible))
  if not eligible:
    return out, stats
  demos = demonstration_trajectories([tasks[n] for n in eligible], env_factory, agent_factory, backend, formatter,
                                     max_prompt_tokens, task_id=task_id, behaviour_temperature=behaviour_temperature)
  for n, demo in zip(eligible, demos):
    if demo is None:
      stats.demos_error += 1
    elif demo.reward < success_reward:
      stats.demos_failed += 1
    else:
      out[n][-1] = demo
      stats.groups_mixed += 1
      stats.demo_tokens += int(sum(demo.loss_mask))
  return out, stats


# ---------------------------------------------------------------------------------------
# The trainer's one plug-in point for a method
# ---------------------------------------------------------------------------------------


class MethodHooks:
  """What a method adds to the trainer's loop at its three fixed points; this base is GRPO / RTI /
  GSPO, which add nothing (GSPO is a loss over the ordinary batch).

  rollout: stage 1 in place of ``rollout.rollout_groups`` (None: the default rollout).
  after_intervention: the groups after stage 2 (e.g. with demonstrations mixed in).
  batch_signals: per-token signals attached to the host batches of one minibatch (its length
    chunks, each padded to its own length) before the jitted steps.
  Each returns its metric counters as a dict (merged into the iteration's record).
  """

  def __init__(self, trainer: Any) -> None:
    self.trainer = trainer

  def rollout(self, tasks: Sequence[Any], seed: int) -> tuple[list[list[Trajectory]], dict[str, Any]] | None:
    return None

  def after_intervention(self, groups: list[list[Trajectory]], tasks: Sequence[Any]
                         ) -> tuple[list[list[Trajectory]], dict[str, Any]]:
    return groups, {}

  def batch_signals(self, chunks: list[objectives.RTIBatch], sampling_params: Any) -> list[objectives.RTIBatch]:
    return chunks


class AEPOHooks(MethodHooks):
  """AEPO: the entropy-balanced branching rollout (``baselines.aepo_branching``) and the sampling
  policy's per-token entropy for ``objectives.aepo_advantages``."""

  def __init__(self, trainer: Any) -> None:
    super().__init__(trainer)
    from rti_jax import aepo_rollout

    bcfg = trainer.cfg.baselines
    self.entropy_fn = make_entropy_fn(trainer.train_step.graphdef, trainer.state.rest)
    self.branching = None
    if bcfg.aepo_branching:
      self.branching = aepo_rollout.BranchingConfig(
          alloc_beta=bcfg.aepo_alloc_beta, branch_beta=bcfg.aepo_branch_beta,
          threshold=bcfg.aepo_branch_threshold, penalty=bcfg.aepo_branch_penalty,
      )
      self.turn_entropy = (
          make_turn_entropy_fn(self.entropy_fn, lambda: trainer.state.params, pad_id=trainer.pad_id,
                               num_tokens=bcfg.aepo_entropy_tokens, buckets=trainer.update_buckets)
          if bcfg.aepo_entropy == "exact" else aepo_rollout.surprisal_entropy(bcfg.aepo_entropy_tokens)
      )

  def rollout(self, tasks: Sequence[Any], seed: int) -> tuple[list[list[Trajectory]], dict[str, Any]] | None:
    if self.branching is None:
      return None
    from rti_jax import aepo_rollout

    t, src = self.trainer, self.trainer.source
    groups, branched = aepo_rollout.aepo_rollout_groups(
        tasks, src.env_factory, t.backend, t.formatter, t.rollout_config, self.branching, self.turn_entropy,
        task_id=src.task_id, seed=seed,
    )
    return groups, branched.as_dict()

  def batch_signals(self, chunks: list[objectives.RTIBatch], sampling_params: Any) -> list[objectives.RTIBatch]:
    """Each chunk's token entropy, standardised over the trained tokens of all of them (the
    minibatch), so the z-score does not depend on the length chunks or micro-batches."""
    raw = [np.asarray(self.entropy_fn(sampling_params, c.input_ids, c.attention_mask), np.float64) for c in chunks]
    masks = [np.asarray(c.loss_mask) > 0 for c in chunks]
    z = minibatch_zscore(raw, masks)
    return [add_policy_signals(c, entropy=zc) for c, zc in zip(chunks, z)]


class OPDHooks(MethodHooks):
  """OPD: the teacher's log-probs of the student's tokens (``baselines.teacher_path``)."""

  def __init__(self, trainer: Any) -> None:
    super().__init__(trainer)
    teacher = load_teacher(trainer.cfg.baselines.teacher_path, trainer.tokenizer, trainer.model_config.vocab_size,
                           trainer.compute_dtype)
    self.teacher_logp_fn = make_teacher_logp_fn(teacher)

  def batch_signals(self, chunks: list[objectives.RTIBatch], sampling_params: Any) -> list[objectives.RTIBatch]:
    return [add_policy_signals(c, teacher_logp=self.teacher_logp_fn(c.input_ids, c.attention_mask)) for c in chunks]


class LuffyHooks(MethodHooks):
  """LUFFY: successful off-policy demonstrations mixed into the groups after stage 2."""

  def __init__(self, trainer: Any) -> None:
    super().__init__(trainer)
    from rti_jax.policy.check_line import policy_check_line

    self.demonstrator = demonstrator_for(trainer.source.domain, policy_check_line(trainer.cfg.policy.path))

  def after_intervention(self, groups: list[list[Trajectory]], tasks: Sequence[Any]
                         ) -> tuple[list[list[Trajectory]], dict[str, Any]]:
    t = self.trainer
    groups, mixed = mix_demonstrations(
        groups, tasks, t.source.env_factory, self.demonstrator, t.backend, t.formatter,
        t.rollout_config.max_prompt_tokens, task_id=t.source.task_id, when=t.cfg.baselines.luffy_when,
        behaviour_temperature=t.rollout_config.behaviour_temperature,
    )
    return groups, mixed.as_dict()


#: loss.method -> its hooks (methods not listed use ``MethodHooks``).
METHOD_HOOKS: dict[str, type[MethodHooks]] = {"aepo": AEPOHooks, "opd": OPDHooks, "luffy": LuffyHooks}


def method_hooks(trainer: Any) -> MethodHooks:
  """The hooks of ``trainer.cfg.loss.method``."""
  return METHOD_HOOKS.get(trainer.cfg.loss.method, MethodHooks)(trainer)
