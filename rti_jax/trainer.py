"""The RTI trainer: Algorithm 1 end to end.

One iteration reads top to bottom::

    tasks      = the next ``tasks_per_iter`` train tasks (a seeded permutation per epoch)
    groups     = rollout_groups(tasks)                      # stage 1: G on-policy episodes each
    groups     = intervene_groups(groups)                   # stage 2: only all-fail groups (RTI)
    batch      = assemble_batch(groups)                     # advantages (Eq. 1), masks, cached logps
    state      = train_step(state, minibatch) x minibatches # jitted, mesh-sharded rti_loss (Eq. 7)
    backend.sync_weights(policy)                            # the generator samples the new policy

and every ``eval_every`` iterations the policy is evaluated on held-out tasks
(Pass@k / Pass^k). Metrics go to ``metrics.jsonl`` (one record per iteration) and
checkpoints to ``ckpt/`` (orbax), so a killed run resumes where it stopped.

``method="grpo"`` is the same loop with intervention off; RTI's ablations are the
``intervention`` switches of the config (Verifier off, gate off, reweighting off).
The baselines are the same loop with another registered loss (``loss.method`` gspo | aepo |
opd | luffy) and that method's ``baselines.MethodHooks``, called at three fixed points: its own
stage 1 (AEPO's entropy-balanced branching rollout), the groups after stage 2 (LUFFY's oracle
demonstrations mixed into all-fail groups) and per-token signals of each batch before the jitted
step (AEPO's sampling-policy entropy, OPD's teacher log-probs).

With several processes (``mesh.distributed``) each rolls out its own slices of the iteration's tasks
and process 0 writes the files; ``rti_jax/distributed.py`` says how.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from rti_jax import baselines, distributed, jit_maps, objectives, reporting
from rti_jax.checkpoint import TrainCheckpointer
from rti_jax import config as config_lib
from rti_jax.config import ExperimentConfig
from rti_jax.envs import registry
from rti_jax.envs.source import TaskSource
from rti_jax.generation.base import GenerationBackend, SamplingParams
from rti_jax.intervention import pipeline
from rti_jax.metrics import paper_summary
from rti_jax.rollout import ChatFormatter, Trajectory, rollout_groups, turn_counts
from rti_jax.shapes import UPDATE_BUCKETS, bucket_length
from rti_jax.sharding import ShardedTrainStep, TrainState, make_mesh, make_train_step
from rti_jax.step_fns import MemoryModel, forward_logp, tree_add

#: Per-iteration metric keys that depend on wall-clock time or on the process (excluded when comparing
#: runs): ``update/new_shapes`` counts the update's batch shapes (rows, length, trained width) this
#: process had not yet seen, each a compilation of the step (unless the persistent cache holds it).
TIMING_KEYS = ("time/rollout_s", "time/intervention_s", "time/update_s", "time/iteration_s", "time/total_s",
               "tokens_per_s", "time/eval_s", "update/new_shapes")


def seed_from_key(key: jax.Array) -> int:
  """A non-negative int31 seed drawn from a JAX key (for host-side samplers)."""
  return int(jax.random.randint(key, (), 0, 2**31 - 1))


def resolve_mesh_shape(data: int, fsdp: int, tensor: int, num_devices: int) -> tuple[int, int, int]:
  """Replaces the (at most one) -1 axis so that the product equals ``num_devices``."""
  sizes = [data, fsdp, tensor]
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"mesh: {num_devices} devices are not divisible by the fixed axes' product {known}")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f"mesh: data*fsdp*tensor must equal the {num_devices} devices, got {sizes}")
  return tuple(sizes)  # type: ignore[return-value]


class Trainer:
  """Runs Algorithm 1 for one config (``grpo`` or ``rti`` and its ablations).

  cfg: the experiment config. run_dir: where metrics, checkpoints and the exported policy go.
  source: the tasks (default: from ``cfg.env``). progress: show tqdm bars (``bar_line``: the
  terminal line of its bars when several trainers share a terminal, each on its own two lines).
  """

  def __init__(self, cfg: ExperimentConfig, run_dir: str | pathlib.Path, *, source: TaskSource | None = None,
               progress: bool = True):
    from models import from_pretrained
    from rti_jax.generation.jax_backend import JaxBackend
    from transformers import AutoTokenizer

    self.cfg = cfg
    distributed.initialize(cfg.mesh)  # multi-host: before any device is touched (rti_jax/distributed.py)
    self.run_dir = pathlib.Path(run_dir)
    self.run_dir.mkdir(parents=True, exist_ok=True)
    self.progress = progress
    self.bar_line: int | None = None
    self.source = source or registry.task_source(cfg)
    # Validation split (train.val_tasks): the last N train tasks, kept out of RL rollouts.
    n_val = cfg.train.val_tasks
    self.val: list[Any] = []
    if n_val:
      train = list(self.source.train)
      if not 0 < n_val < len(train):
        raise ValueError(f"train.val_tasks: expected fewer than the {len(train)} train tasks, got {n_val}")
      self.val, train = train[-n_val:], train[:-n_val]
      self.source = dataclasses.replace(self.source, train=train)
    if self.source.rl_exclude is not None:  # after the validation split, which it never changes
      kept = [t for t in self.source.train if not self.source.rl_exclude(t)]
      if not kept:
        raise ValueError("env: every RL train task is excluded (the source's rl_exclude, e.g. env.navigation.rl_exclude_listed); nothing to train on")
      self.source = dataclasses.replace(self.source, train=kept)
    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    dtype = self.compute_dtype = dtypes[cfg.policy.dtype]
    shape = resolve_mesh_shape(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, jax.device_count())
    self.mesh = make_mesh(*shape)
    self.rollout_mesh = distributed.local_mesh(self.mesh)  # each process samples its own rollouts
    # Shard-on-load: each device reads only its slices; the train state below holds the only fp32 copy.
    model, self.model_config = from_pretrained(
        cfg.policy.path, dtype=dtype, param_dtype=dtypes.get(cfg.policy.param_dtype, dtype), mesh=self.mesh)
    self.tokenizer = AutoTokenizer.from_pretrained(cfg.policy.path)
    if cfg.policy.chat_template:
      from models.chat import qwen3_chat_template

      self.tokenizer.chat_template = qwen3_chat_template(cfg.policy.chat_template)
    self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
    # the padded lengths of the update's chunks (and of AEPO's entropy pass), by optim.length_buckets_per_octave
    self.update_buckets = {**UPDATE_BUCKETS, "per_octave": cfg.optim.length_buckets_per_octave}
    self._update_shapes: set[tuple[Any, ...]] = set()  # batch shapes the update has compiled (update/new_shapes)
    self.new_update_shapes = 0
    self.formatter = ChatFormatter(self.tokenizer, self.source.tool_schemas)
    self.backend: GenerationBackend
    if cfg.rollout.backend == "sglang" and distributed.multi_process():
      raise ValueError("rollout.backend=sglang: one server per job, not supported with several processes")
    if cfg.rollout.backend == "sglang":
      from rti_jax.generation.jax_backend import qwen_save_fn
      from rti_jax.generation.sglang_http import SGLangHTTPBackend

      self.backend = SGLangHTTPBackend(cfg.rollout.sglang_url, weights_dir=cfg.rollout.weights_dir, save_fn=qwen_save_fn)
      self.backend.check_server(max_context=cfg.rollout.max_context)
      self.backend.sync_weights(model)
      # The loss needs temperature-1 behaviour log-probs: refuse a server that reports scaled ones.
      self.backend.check_behaviour_logprobs(self.formatter.prompt_ids([{"role": "user", "content": "Hello."}]))
    else:
      # The sampler decodes on this process's devices (the global mesh in one process).
      self.backend = JaxBackend(distributed.process_local(model, self.rollout_mesh),
                                max_cache_len=cfg.rollout.max_context, pad_id=self.pad_id,
                                prefix_cache_bytes=cfg.rollout.prefix_cache_mb << 20, mesh=self.rollout_mesh)
    self.sampling = config_lib.sampling_params(cfg)
    self.rollout_config = config_lib.rollout_config(cfg)
    self.intervention_config = config_lib.intervention_config(cfg, self.source.domain,
                                                              self.source.success_threshold)
    # Only RTI intervenes: GRPO and the baselines build no roles (an environment needs none for them).
    self.roles = self._build_roles() if self.intervention_config.enabled else None
    # Mesh-sharded, jitted update of the configured loss (Eq. 2 / Eq. 7).
    self.loss_config = config_lib.loss_config(cfg)
    o = cfg.optim
    self.tx = optax.chain(
        optax.clip_by_global_norm(o.max_grad_norm),
        optax.adamw(o.lr, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay),
    )
    # tx_key: trainers with the same optimizer, model, mesh and loss (the next seed, an ablation variant)
    # share the compiled update programs. GRPO's steps are RTI's: its batches never hold an
    # intervened token, so ``update`` drops their intervention fields, and LOSSES["rti"] of such a
    # batch is LOSSES["grpo"] (objectives.without_empty_intervention); GRPO and RTI trainers then
    # share the programs of every batch without intervened tokens.
    # With a tokens-per-device budget the state is donated to the step (its buffers become the new
    # state's), unless the KL reference holds the old parameters across the step. The rollout
    # policy's signals of every minibatch are computed before the first step (``update``).
    donate = o.tokens_per_device is not None and cfg.loss.beta == 0
    step_loss = (dataclasses.replace(self.loss_config, name="rti") if self.loss_config.name == "grpo"
                 else self.loss_config)
    self.train_step: ShardedTrainStep = make_train_step(
        model, self.tx, self.mesh, step_loss,
        tx_key=("clip_by_global_norm+adamw", o.max_grad_norm, o.lr, o.b1, o.b2, o.weight_decay),
        remat=o.remat, vocab_chunk=o.vocab_chunk, tokens_per_device=o.tokens_per_device, scan_layers=o.scan_layers,
        donate=donate)
    self.state: TrainState = self.train_step.state
    self.ref_params = self.state.params if cfg.loss.beta > 0 else None
    self.hooks = baselines.method_hooks(self)  # what the configured method adds (rti_jax/baselines.py)
    self.rollout_slices = distributed.num_rollout_slices(cfg.mesh, cfg.rollout.tasks_per_iter)
    distributed.check_sliced_method(self.hooks, self.rollout_slices)
    self.checkpointer = TrainCheckpointer(self.run_dir / "ckpt", max_to_keep=cfg.train.keep_checkpoints)
    self.key = jax.random.key(cfg.train.seed)
    self.iteration = 0
    self.order = self._permutation(0)
    self.cursor = 0
    self.epoch = 0
    self.metrics_path = self.run_dir / "metrics.jsonl"
    self.eval_path = self.run_dir / "eval.jsonl"

  # --- set-up ------------------------------------------------------------------------------

  def _build_roles(self) -> pipeline.InterventionRoles:
    """The roles through ``pipeline.make_roles``: self-intervention by default (the policy's own
    backend, its tokenizer, a chat without tools for the judges), or the model at
    ``intervention.intervener_url`` (a server) or ``intervention.intervener_path`` (in-process) judging and
    writing the corrections (same tokenizer family).
    The Corrector samples u~_k from p_cal = p_roll + the message of intervention.corrector (paper:
    App. A.1's inputs with the evidence, to be concealed; feedback: diagnosis + visible-only hint),
    which the pipeline builds and scores log pi_cal under (Eq. 5); see pipeline.intervened_step."""
    icfg = self.cfg.intervention
    judge = judge_formatter = None
    if icfg.intervener_url:
      from rti_jax.generation.sglang_http import SGLangHTTPBackend

      judge = SGLangHTTPBackend(icfg.intervener_url)
    elif icfg.intervener_path:
      from models import from_pretrained
      from rti_jax.generation.jax_backend import JaxBackend

      other, _ = from_pretrained(icfg.intervener_path, dtype=self.compute_dtype, mesh=self.mesh)
      judge = JaxBackend(distributed.process_local(other, self.rollout_mesh),
                         max_cache_len=max(self.cfg.rollout.max_context, config_lib.judge_context(self.cfg)),
                         pad_id=self.pad_id, mesh=self.rollout_mesh)
    if judge is not None:
      judge_formatter = ChatFormatter(self.tokenizer, end_of_turn=self.formatter.end_of_turn)
    return pipeline.make_roles(
        icfg.validator, self.backend, self.formatter, self.sampling, validator=icfg.validator,
        verifier=icfg.verifier, judge=judge, judge_formatter=judge_formatter,
        judge_sampling=SamplingParams(max_new_tokens=icfg.judge_max_new_tokens, temperature=0.0),
        judge_max_context_tokens=config_lib.judge_context(self.cfg),
        corrector="policy" if judge is None else "intervener", domain=self.source.domain,
        rule_options=registry.options_of(self.cfg, self.source.domain))

  def _permutation(self, epoch: int) -> np.ndarray:
    rng = np.random.default_rng([self.cfg.train.seed, epoch])
    return rng.permutation(len(self.source.train))

  def _logp_fn(self, params: Any, ids: jax.Array, mask: jax.Array, positions: Any = None) -> jax.Array:
    """Per-token log-probs [B, T] of ``ids`` under ``params`` (jitted; compiles shared across trainers);
    with ``positions`` ([B, W], ``RTIBatch.trained_positions``) at those alone, 0 elsewhere."""
    o = self.cfg.optim
    k = MemoryModel(tokens_per_device=o.tokens_per_device).count(ids.shape[0], ids.shape[1],
                                                                  self.train_step.data_parallel_degree)
    scan = o.scan_layers and (o.vocab_chunk is not None or positions is not None)
    return forward_logp(self.train_step.graphdef, params, self.state.rest, ids, mask, o.vocab_chunk, k,
                        scan, self.loss_config.logp_temperature, positions)

  # --- data ----------------------------------------------------------------------------------

  def next_tasks(self) -> list[Any]:
    """The next ``tasks_per_iter`` train tasks; a new seeded permutation each epoch."""
    out = []
    n = self.cfg.rollout.tasks_per_iter
    while len(out) < n:
      if self.cursor >= len(self.order):
        self.epoch += 1
        self.order = self._permutation(self.epoch)
        self.cursor = 0
      out.append(self.source.train[int(self.order[self.cursor])])
      self.cursor += 1
    return out

  # --- one iteration -------------------------------------------------------------------------

  def policy(self) -> nnx.Module:
    """The current policy as an NNX module."""
    return self.train_step.merge(self.state)

  def iterate(self) -> dict[str, Any]:
    """One iteration of Algorithm 1; returns its metrics record."""
    t0 = time.perf_counter()
    self.key, k_roll, k_int = jax.random.split(self.key, 3)
    tasks = self.next_tasks()
    src = self.source
    if self.rollout_slices > 1:  # slices over processes (rti_jax/distributed.py); every process gets all groups
      n = self.rollout_slices
      groups, rewards_before, istats, dt_roll, dt_int = distributed.sliced_stages(
          self, tasks, [seed_from_key(k) for k in distributed.slice_keys(k_roll, n)],
          [seed_from_key(k) for k in distributed.slice_keys(k_int, n)])
      rollout_stats, mixed_stats = {}, {}
      t_roll, t_int = t0 + dt_roll, t0 + dt_roll + dt_int
    else:
      seed = seed_from_key(k_roll)
      hooked = self.hooks.rollout(tasks, seed)  # a method's own stage 1 (AEPO's branching rollout), if any
      groups, rollout_stats = hooked if hooked is not None else (
          rollout_groups(tasks, src.env_factory, self.backend, self.formatter, self.rollout_config,
                         task_id=src.task_id, seed=seed), {})
      t_roll = time.perf_counter()
      rewards_before = np.asarray([[t.reward for t in g] for g in groups], np.float32)
      groups, istats = pipeline.intervene_groups(
          groups, tasks, src.env_factory, self.backend, self.formatter, self.roles, self.intervention_config,
          self.rollout_config, task_id=src.task_id, seed=seed_from_key(k_int),
      )
      groups, mixed_stats = self.hooks.after_intervention(groups, tasks)  # e.g. LUFFY's demonstrations
      t_int = time.perf_counter()
    rewards_after = np.asarray([[t.reward for t in g] for g in groups], np.float32)
    icfg = self.cfg.intervention
    # Judges that write nothing usable stop the run here, before the update (the batch is discarded).
    pipeline.check_malformed(istats, [r for r, kind in (("validator", icfg.validator), ("verifier", icfg.verifier))
                                      if kind == "llm"], icfg.max_malformed_rate)
    update_metrics = self.update(groups)
    self.backend.sync_weights(distributed.process_local(self.policy(), self.rollout_mesh))
    t_end = time.perf_counter()
    self.iteration += 1
    num_tokens = sum(len(t.token_ids) for g in groups for t in g)
    turns = turn_counts(groups)
    record: dict[str, Any] = {
        "iteration": self.iteration,
        "reward_mean": float(rewards_before.mean()),
        "reward_mean_after_intervention": float(rewards_after.mean()),
        "all_fail_group_frac": float(np.mean(rewards_before.max(axis=1) < src.success_threshold)),
        "all_fail_group_frac_after": float(np.mean(rewards_after.max(axis=1) < src.success_threshold)),
        "turns_mean": float(turns.mean()),
        "turn_hist": np.bincount(turns, minlength=self.cfg.env.max_turns + 1).tolist(),
        "truncated_frac": float(np.mean([t.truncated for g in groups for t in g])),
        "length_cut_turns": int(sum(t.info.get("length_cut_turns", 0) for g in groups for t in g)),
        "tokens": num_tokens,
        "time/rollout_s": t_roll - t0,
        "time/intervention_s": t_int - t_roll,
        "time/update_s": t_end - t_int,
        "time/iteration_s": t_end - t0,
        "tokens_per_s": num_tokens / max(t_end - t0, 1e-9),
        "update/new_shapes": self.new_update_shapes,
    }
    record.update(reward_audits(groups))
    record.update(istats.as_dict())
    record.update(mixed_stats)
    record.update(rollout_stats)
    record.update(update_metrics)
    if jit_maps.relieve():  # many compiled shapes: stay under the kernel's mapping limit
      record["jit/programs_dropped"] = 1
    return record

  def update(self, groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
    """Advantages, then ``epochs`` passes of ``minibatches`` jitted steps of the configured loss.

    Every minibatch is assembled and placed before the first step, with the behaviour log-probs
    (recomputed, with ``loss.behaviour_logp=recompute``) and the reference / baseline signals of
    the parameters that drew the rollouts; later steps see a policy that has moved, so the ratio
    and its clip act from the second step on."""
    longest = max(len(t.token_ids) for grp in groups for t in grp)
    max_len = bucket_length(min(longest, self.cfg.rollout.max_context), **self.update_buckets)
    m, epochs = self.cfg.optim.minibatches, self.cfg.optim.epochs
    if len(groups) % m:
      raise ValueError(f"optim.minibatches: expected a divisor of rollout.tasks_per_iter={len(groups)}, got {m}")
    per = len(groups) // m
    sums: dict[str, float] = {}
    sampling_params = self.state.params  # the policy that drew the rollouts (AEPO's entropy)
    prepared = []
    for j in range(m):
      batch = objectives.assemble_batch(
          groups[j * per:(j + 1) * per], pad_id=self.pad_id, reweight=self.cfg.intervention.reweight,
          max_len=max_len, advantage_std=self.cfg.loss.adv_std,
          # the pipeline recorded each Corrector-written token's behaviour log-prob as chosen by
          # loss.intervened_old_logp (pi_roll or pi_cal, at the behaviour temperature): used as recorded
          intervened_old_logp="roll",
      )
      batch = objectives.without_empty_intervention(batch)  # no intervened token: GRPO's program
      if self.loss_config.name == "grpo" and batch.intervened_mask is not None:
        raise RuntimeError("a GRPO batch holds intervened tokens")  # its step is RTI's (see __init__)
      rows = batch.input_ids.shape[0]
      dp = self.train_step.data_parallel_degree
      n = max((c for c in range(1, self.cfg.optim.length_chunks + 1) if rows % c == 0 and (rows // c) % dp == 0),
              default=1)
      bucket = lambda length: bucket_length(min(length, max_len), **self.update_buckets)  # noqa: E731
      chunks = objectives.length_chunks(batch, n, bucket)
      if self.cfg.optim.trained_positions:
        chunks = [objectives.with_trained_positions(c) for c in chunks]
      if self.cfg.loss.behaviour_logp == "recompute":
        chunks = [self._recompute_behaviour(c, sampling_params) for c in chunks]
      chunks = self.hooks.batch_signals(chunks, sampling_params)  # e.g. AEPO's entropy, OPD's teacher log-probs
      prepared.append([self._device_batch(c) for c in chunks])
    shapes = {(c.input_ids.shape, None if c.trained_positions is None else c.trained_positions.shape)
              for chunks in prepared for c in chunks}
    self.new_update_shapes = len(shapes - self._update_shapes)
    self._update_shapes |= shapes
    for _ in range(epochs):
      for chunks in prepared:
        if len(chunks) == 1:
          self.state, out = self.train_step.step(self.state, chunks[0])
          vals = {"loss": out.loss, **out.metrics}
        else:
          # Gradients of the length-sorted chunks (each padded to its own bucket) are summed, then one
          # optimizer step: the same loss and gradient as the single padded batch.
          # A running sum: one gradient tree beside the accumulator, never a list of them.
          g, num, den, chunk_metrics = None, 0.0, 0.0, []
          for c in chunks:
            g_c, num_c, den_c, m_c = self.train_step.grads(self.state, c)
            g = g_c if g is None else tree_add(g, g_c)
            num, den = num + num_c, den + den_c
            chunk_metrics.append(m_c)
          self.state, out = self.train_step.apply(self.state, g, num, den)
          vals = {"loss": out.loss, **objectives.combine_chunk_metrics(chunk_metrics),
                  "grad_norm": out.metrics["grad_norm"]}
        for k, v in vals.items():
          sums[k] = sums.get(k, 0.0) + float(v) / (m * epochs)
    return sums

  def _recompute_behaviour(self, batch: objectives.RTIBatch, params: Any) -> objectives.RTIBatch:
    """``old_logp`` of every trained token from ``params`` at ``loss.logp_temperature`` (intervened
    tokens under the rollout context: pi_roll, as ``loss.intervened_old_logp=roll``; with ``cal``
    their recorded pi_cal is kept)."""
    logp = np.asarray(self._logp_fn(params, batch.input_ids, batch.attention_mask, batch.trained_positions))
    redo = np.asarray(batch.loss_mask) > 0
    if self.cfg.loss.intervened_old_logp == "cal" and batch.intervened_mask is not None:
      redo &= np.asarray(batch.intervened_mask) == 0  # pi_cal needs p_cal: the recorded one (same parameters)
    old = np.where(redo, logp, np.asarray(batch.old_logp)).astype(np.float32)
    return dataclasses.replace(batch, old_logp=old)

  def _device_batch(self, batch: objectives.RTIBatch) -> objectives.RTIBatch:
    """A host batch with the reference log-probs, on the mesh."""
    if self.ref_params is not None:
      batch = dataclasses.replace(batch, ref_logp=self._logp_fn(self.ref_params, batch.input_ids, batch.attention_mask,
                                                                batch.trained_positions))
    return distributed.place_batch(self.train_step, batch)  # train_step.shard_batch in one process

  # --- evaluation ----------------------------------------------------------------------------

  def evaluate(self, tasks: Sequence[Any], samples: int, seed: int, desc: str = "eval") -> dict[str, Any]:
    """Pass@k / Pass^k (paper Sec. 5.1) on ``tasks`` with ``samples`` rollouts each, overall and per subset."""
    cfg = dataclasses.replace(self.rollout_config, group_size=samples)
    chunk = max(1, self.cfg.rollout.tasks_per_iter * self.cfg.rollout.group_size // samples)
    successes = np.zeros((len(tasks), samples), np.float32)
    audits = np.zeros(2, np.int64)
    bar = tqdm(total=len(tasks), desc=desc, disable=not self.progress, leave=False,
               position=None if self.bar_line is None else 2 * self.bar_line + 1)
    for start in distributed.owned(range(0, len(tasks), chunk)):  # all chunks in one process
      part = list(tasks[start:start + chunk])
      groups = rollout_groups(part, self.source.env_factory, self.backend, self.formatter, cfg,
                              task_id=self.source.task_id, seed=seed + start)
      successes[start:start + len(part)] = [[float(t.reward >= self.source.success_threshold) for t in g]
                                            for g in groups]
      checked = reward_audits(groups)
      audits += [checked.get("reward_audit/checked", 0), checked.get("reward_audit/mismatched", 0)]
      bar.update(len(part))
    bar.close()
    successes = distributed.sum_over_processes(successes)
    ks = tuple(k for k in (1, 2, 3, 4) if k <= samples)
    out: dict[str, Any] = {"all": paper_summary(successes, ks), "num_tasks": len(tasks)}
    for name, pred in self.source.subsets.items():
      sel = np.asarray([pred(t) for t in tasks], bool)
      if sel.any():
        out[name] = paper_summary(successes[sel], ks)
        out[f"num_{name}"] = int(sel.sum())
      if (~sel).any():
        out[f"not_{name}"] = paper_summary(successes[~sel], ks)
    out["successes"] = successes.astype(int).tolist()
    audits = distributed.sum_over_processes(audits)
    if audits[0]:
      out["reward_audit/checked"], out["reward_audit/mismatched"] = int(audits[0]), int(audits[1])
    return out

  # --- the loop ------------------------------------------------------------------------------

  def _meta(self) -> dict[str, Any]:
    return {"iteration": self.iteration, "epoch": self.epoch, "cursor": self.cursor, "order": self.order.tolist()}

  def save(self) -> None:
    self.checkpointer.save(self.iteration, self.state, self.key, self._meta())

  def maybe_resume(self) -> bool:
    """Restores the latest checkpoint of this run dir, if any; True when it did."""
    restored = self.checkpointer.restore(self.state)
    if restored is None:  # a fresh run, or one killed before its first checkpoint: it starts from 0
      _truncate_jsonl(self.metrics_path, 0)
      _truncate_jsonl(self.eval_path, 0)
      return False
    self.state = restored.state
    self.key = restored.key
    meta = restored.meta
    self.iteration = int(meta["iteration"])
    self.epoch = int(meta["epoch"])
    self.cursor = int(meta["cursor"])
    self.order = np.asarray(meta["order"], np.int64)
    self.backend.sync_weights(distributed.process_local(self.policy(), self.rollout_mesh))
    _truncate_jsonl(self.metrics_path, self.iteration)
    _truncate_jsonl(self.eval_path, self.iteration)
    return True

  def monitor_tasks(self) -> list[Any]:
    """The tasks evaluated every ``eval_every`` iterations: the validation split when
    ``train.val_tasks`` > 0, else the first ``train.eval_tasks`` test tasks (monitoring only)."""
    if self.val:
      return list(self.val)
    test = self.source.test
    return list(test[: self.cfg.train.eval_tasks] if self.cfg.train.eval_tasks else test)

  def train(self, *, eval_tasks: Sequence[Any] | None = None, stop_after: int | None = None) -> list[dict[str, Any]]:
    """Runs (or resumes) the configured iterations; returns all metric records of the run.

    eval_tasks: evaluated every ``eval_every`` iterations (default: none; ``monitor_tasks()`` gives
      the validation split when there is one; the test split is evaluated by the experiment after
      training, never used to pick anything).
    stop_after: stop after this many iterations of this call (to simulate a killed run in tests).
    """
    tc = self.cfg.train
    self.maybe_resume()
    start = self.iteration
    bar = tqdm(total=tc.iterations, initial=start, desc=f"{self.cfg.name}:{self.cfg.loss.method}",
               disable=not self.progress, position=None if self.bar_line is None else 2 * self.bar_line)
    t_start = time.perf_counter()
    while self.iteration < tc.iterations:
      if stop_after is not None and self.iteration - start >= stop_after:
        break
      record = self.iterate()
      record["time/total_s"] = time.perf_counter() - t_start
      if eval_tasks is not None and (self.iteration % tc.eval_every == 0 or self.iteration == tc.iterations):
        t0 = time.perf_counter()
        ev = self.evaluate(eval_tasks, tc.eval_samples, seed=tc.seed + 7919 * self.iteration, desc="eval")
        ev.pop("successes", None)
        record["eval"] = ev
        record["time/eval_s"] = time.perf_counter() - t0
      reporting.append_jsonl(self.metrics_path, record)
      if self.iteration % tc.checkpoint_every == 0 or self.iteration == tc.iterations:
        self.save()
      bar.update(1)
      bar.set_postfix(reward=f"{record['reward_mean']:.2f}", allfail=f"{record['all_fail_group_frac']:.2f}",
                      fixed=record.get("rti/groups_replaced", 0))
    bar.close()
    # Only process 0 writes metrics.jsonl (reporting.append_jsonl); every process returns its records.
    return distributed.from_writer(
        lambda: reporting.read_jsonl(self.metrics_path) if self.metrics_path.exists() else [])

  def export(self, path: str | pathlib.Path) -> None:
    """Writes the current policy as an HF checkpoint (with the tokenizer and a generation config that
    stops on the end-of-turn id) for transformers / SGLang / vLLM, in the dtype of the checkpoint it
    started from (fp32 master weights are rounded to it)."""
    from models import save_pretrained, save_tokenizer

    stops = [*self.formatter.turn_end_ids, self.tokenizer.eos_token_id]  # Qwen3: <|im_end|>, <|endoftext|>
    policy = distributed.host_model(self.policy())  # collective gather with several processes
    if not distributed.is_writer():
      return
    save_pretrained(policy, self.model_config, str(path), dtype=self.model_config.dtype,
                    eos_token_ids=[int(t) for t in dict.fromkeys(stops) if t is not None])
    save_tokenizer(self.tokenizer, path)


def reward_audits(groups: Sequence[Sequence[Trajectory]]) -> dict[str, int]:
  """``{"reward_audit/checked", "reward_audit/mismatched"}``: the episodes of ``groups`` whose
  environment also scored them by a reference evaluator (final ``info`` ``reward_audits``, e.g.
  ``Tau2Env(audit_share=...)``) and how many of those disagreed; ``{}`` when none was checked."""
  finals = [t.turns[-1].env_info for g in groups for t in g if t.turns]
  checked = sum(int(i.get("reward_audits", 0)) for i in finals)
  if not checked:
    return {}
  return {"reward_audit/checked": checked,
          "reward_audit/mismatched": sum(int(i.get("reward_audit_mismatches", 0)) for i in finals)}


def _truncate_jsonl(path: pathlib.Path, iteration: int) -> None:
  """Drops records written after the checkpoint we resume from (they will be recomputed, identically),
  and a torn last line; atomic, so a kill during the rewrite loses nothing."""
  if not path.exists():
    return
  keep = [r for r in reporting.read_jsonl(path) if int(r.get("iteration", 0)) <= iteration]
  reporting.write_jsonl(path, keep)
