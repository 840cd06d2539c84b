"""Typed experiment configs: dataclasses + YAML files + command-line overrides (OmegaConf).

A config is built in three layers, later ones winning::

    defaults of the dataclasses  <-  configs/<name>.yaml  <-  command-line ``key=value`` overrides

OmegaConf checks types against the dataclass schema (an unknown key or a string
where a float belongs is an error naming the key); ``validate`` then checks value
ranges and choices. Every error is a ``ConfigError`` that names the offending key.

The library's runtime configs (``objectives.LossConfig``, ``rollout.RolloutConfig``,
``pipeline.InterventionConfig``) are built from an ``ExperimentConfig`` here and only here
(``loss_config``, ``rollout_config``, ``intervention_config``). Where a setting is theirs, the
schema's default is read from them and their own checks are the validation (``validate`` builds
them and names the YAML key of any field they reject), so each default and each range is
written once. Choice lists are imported from the modules that define them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import re
from typing import Any, Optional, Sequence

from omegaconf import MISSING, OmegaConf

from rti_jax import objectives
from rti_jax.envs import registry
from rti_jax.generation.base import SamplingParams
from rti_jax.intervention import pipeline
from rti_jax import rollout as rollout_lib
from rti_jax.config_loading import CONFIG_DIR, ConfigError, config_path, load_structured  # noqa: F401 (re-exported)

@dataclasses.dataclass
class PolicyConfig:
  """Where the policy comes from. ``path`` is a local HF checkpoint directory."""

  path: str = MISSING
  dtype: str = "float32"  # float32 | bfloat16: activations and matmuls
  # float32 | bfloat16 | "" (= dtype): parameters and optimizer moments. Keep float32 (master
  # weights) with dtype bfloat16: updates of lr 1e-6 vanish in bf16 parameters.
  param_dtype: str = "float32"
  # The chat template rollouts are rendered with and the export carries: "" keeps the checkpoint's;
  # qwen3 | qwen3_thinking_2507 (official) | qwen3_append_only (every turn as generated: the prompts a
  # server then renders are the trajectories' own; docs/qwen3_chat_template.md).
  chat_template: str = ""


@dataclasses.dataclass
class EnvConfig:
  """The environment and its task split: the keys every environment reads. Each registered
  environment adds its own typed section ``env.<name>.*`` (``EnvSpec.options``;
  ``rti_jax/envs/registry.py``), part of the schema that ``load_config`` builds."""

  name: str = "navigation"  # a registered environment: python -m rti_jax.envs list
  setting: str = "tiny"  # tiny (CPU default) | paper
  num_train: int = 600
  num_test: int = 150
  seed: int = 0
  max_turns: int = 6
  # The tools reach the model through the chat template's ``tools=`` (a real chat model sees its own
  # tools layout) instead of a tools list in the system message (the tiny policies' layout).
  tools_in_template: bool = False


_ROLLOUT = rollout_lib.RolloutConfig()  # the runtime defaults the schema reads
_LOSS = objectives.LossConfig()
_INTERVENTION = pipeline.InterventionConfig()


@dataclasses.dataclass
class RolloutConfig:
  """Stage 1 of Algorithm 1: on-policy groups (builds ``rollout.RolloutConfig``)."""

  tasks_per_iter: int = 8
  group_size: int = _ROLLOUT.group_size  # G
  temperature: float = _ROLLOUT.sampling.temperature
  top_p: float = _ROLLOUT.sampling.top_p
  top_k: int = _ROLLOUT.sampling.top_k
  max_new_tokens: int = _ROLLOUT.sampling.max_new_tokens  # per assistant turn
  max_context: int = _ROLLOUT.max_context_tokens  # prompt + all turns
  # > 0: the jax sampler keeps each row's KV (MiB in all) and the next turn prefills only what follows
  # (models.sampler.Sampler prefix_cache_bytes; the shipped configs set it). 0: every turn prefills
  # the whole context.
  prefix_cache_mb: int = 0
  backend: str = "jax"  # jax (in-process sampler) | sglang (a server, over HTTP)
  sglang_url: Optional[str] = None  # e.g. http://127.0.0.1:30000 when backend = sglang
  weights_dir: Optional[str] = None  # where policy weights are written for the server to reload


@dataclasses.dataclass
class InterventionConfig:
  """Stage 2 of Algorithm 1 (only for all-fail groups) and its ablation switches (builds
  ``pipeline.InterventionConfig``; ``eps_cal`` goes to ``objectives.LossConfig``)."""

  enabled: bool = _INTERVENTION.enabled
  validator: str = "rules"  # rules | llm
  verifier: str = "rules"  # rules | llm | off  ("w/o Post-Check")
  # the correction prompt p_cal = p_roll + one message: paper (App. A.1's Corrector inputs: draft, the
  # Validator's diagnosis and suggest_next, the evidence l and the rule to conceal it) | feedback (the
  # diagnosis and a visible-only suggestion; the tiny policy's SFT format)
  corrector: str = _INTERVENTION.corrector
  delta: float = _INTERVENTION.ppl_delta  # PPL gate threshold (Eq. 4); inf = gate off, 0 = reject all
  reweight: bool = _INTERVENTION.reweight  # False = rho_cal == 1 ("w/o Reweight")
  eps_cal: float = _LOSS.eps_cal  # Eq. 6
  intervener_url: Optional[str] = None  # None = self-intervention by the policy
  # Or another local HF checkpoint (same tokenizer) sampled in-process: it writes the corrections and
  # answers the LLM judges (e.g. policies/navigation_teacher, the stronger intervener of Fig. 6).
  intervener_path: Optional[str] = None
  max_attempts: int = _INTERVENTION.num_intervened_rollouts  # intervened rollouts tried per all-fail group
  # Corrector samples tried per flagged step (redrawn when a check rejects one)
  correction_attempts: int = _INTERVENTION.correction_attempts
  # LLM judges (validator / verifier = llm; the policy itself, or the model at intervener_url):
  # the answer budget (a thinking model's reasoning included: an answer cut short is malformed);
  # the prompt + answer budget (0: rollout.max_context; a longer judge prompt is not sent, the step
  # is skipped and counted as rti/*_over_context); and the share of malformed answers per LLM role
  # and iteration above which the run stops with an error (judged on at least 8 answers).
  judge_max_new_tokens: int = 1024
  judge_max_context: int = 0
  max_malformed_rate: float = 0.5


@dataclasses.dataclass
class LossConfig:
  """The policy objective (Eq. 2 / Eq. 7) and its conventions (builds ``objectives.LossConfig``)."""

  method: str = _LOSS.name  # grpo | rti (baselines: gspo | aepo | luffy | opd)
  clip_low: float = _LOSS.clip_low  # eps_clip
  clip_high: float = _LOSS.clip_high
  dual_clip: Optional[float] = _LOSS.dual_clip
  beta: float = _LOSS.beta  # KL coefficient (Eq. 2)
  kl_kind: str = _LOSS.kl_kind
  aggregation: Optional[str] = _LOSS.agg  # None: the method's own (objectives.LossConfig.agg); docs/objectives.md
  agg_norm: Optional[float] = _LOSS.agg_norm  # the constant of seq-mean-token-sum-norm / dr-grpo (None: padded length)
  adv_std: str = inspect.signature(objectives.assemble_batch).parameters["advantage_std"].default  # (Eq. 1)
  # old_logp of a Corrector-written token: roll (pi_roll; the ratio starts at 1) | cal (pi_cal, the
  # distribution it was drawn from; the clip binds on unlikely corrections). objectives.assemble_batch.
  intervened_old_logp: str = inspect.signature(objectives.assemble_batch).parameters["intervened_old_logp"].default
  # The ratio's log-probs are of logits / logp_temperature, the policy's and the behaviour's alike (1:
  # the policy; the rollout temperature: the distribution sampled from, verl's convention). The
  # behaviour log-probs: rollout (the backend's, recorded while sampling: at temperature 1 the policy's
  # own; at the rollout temperature those of the distribution sampled from, which the in-process
  # sampler reports with top-k / top-p off, and Corrector-written tokens scored at it) | recompute (a
  # forward pass of the parameters that drew the rollouts, at logp_temperature, before the update).
  logp_temperature: float = _LOSS.logp_temperature
  behaviour_logp: str = "rollout"


@dataclasses.dataclass
class BaselinesConfig:
  """Settings of the baselines (loss.method gspo | aepo | opd | luffy); see ``rti_jax.baselines``."""

  teacher_path: Optional[str] = None  # OPD teacher: an HF checkpoint sharing the policy's tokenizer
  opd_coef: float = _LOSS.opd_coef  # weight of the per-token reverse-KL term folded into the advantage
  luffy_when: str = "all_fail"  # all_fail (RTI paper App. C.3) | always (LUFFY paper): groups given a demo
  luffy_gamma: float = _LOSS.luffy_gamma  # policy-shaping f(p) = p / (p + gamma) of off-policy tokens
  aepo_alpha: float = _LOSS.aepo_alpha  # entropy-aware advantage scale
  # AEPO's entropy-balanced branching rollout (rti_jax/aepo_rollout.py); used when loss.method=aepo
  aepo_branching: bool = True  # false: plain rollout_groups (the update half only)
  aepo_alloc_beta: float = 1.0  # m = clip(round(G * sigmoid(beta * (H_root - H_tool))), 1, G) global rollouts
  aepo_branch_beta: float = 1.0  # branch prob = clip(branch_beta * dH, 0, 1) * (1 - penalty)^consecutive
  aepo_branch_threshold: float = 0.0  # a step is a fork candidate when dH = H_t - H_root exceeds this (nats)
  aepo_branch_penalty: float = 0.5  # consecutive branch penalty, in [0, 1]
  aepo_entropy: str = "exact"  # step entropy: exact (policy forward pass) | surprisal (-logprob of the samples)
  aepo_entropy_tokens: int = 20  # the step entropy averages the first this-many tokens of a turn
  gspo_clip_low: float = _LOSS.gspo_clip_low  # GSPO's sequence-level clip range
  gspo_clip_high: float = _LOSS.gspo_clip_high


@dataclasses.dataclass
class OptimConfig:
  """optax AdamW with a constant learning rate (the paper's setting)."""

  lr: float = 1e-6
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.999
  max_grad_norm: float = 1.0
  minibatches: int = 1  # update steps per rollout batch (disjoint slices of its groups)
  epochs: int = 1  # passes over the minibatches; the behaviour log-probs stay those of the rollouts
  # Each minibatch's rows are sorted by length and split into at most this many equal-size chunks
  # (the largest count that divides the rows, each chunk divisible by the data-parallel degree),
  # each padded to its own bucketed length; their gradients are summed before the one optimizer
  # step (same loss and gradient as one padded batch, less padding). 1 = one batch padded to its
  # longest row.
  length_chunks: int = 1
  # Update lengths are padded to multiples of 128 above 512 tokens (models/shapes.py); with k here,
  # to multiples of at least 1/k of the power of two below the length: fewer distinct lengths (each
  # a compilation) for long episodes, at most 1/k of padding (null: the fixed step).
  length_buckets_per_octave: Optional[int] = None
  # The step's memory model (rti_jax/step_fns.py, docs/benchmarks.md "Memory plan"): per-layer remat
  # (none | full | dots); log-probs vocab_chunk ids at a time (null: full logits); micro-batches of at
  # most tokens_per_device tokens per device, state donated (null: one pass); layers as one scan.
  remat: str = "none"
  vocab_chunk: Optional[int] = None
  tokens_per_device: Optional[int] = None
  scan_layers: bool = False
  # The policy's log-probs (train step, recomputed behaviour, KL reference) at the trained tokens
  # alone: the last decoder layer and the LM head skip prompt and tool-result positions. The same
  # values as every position's up to fp32 rounding (the shipped CPU configs set it; the speed-up is
  # in docs/benchmarks.md).
  trained_positions: bool = False


@dataclasses.dataclass
class MeshConfig:
  """Device mesh axis sizes; -1 on one axis takes the remaining devices. The mesh spans every
  process's devices; multi-host settings: ``rti_jax/distributed.py``."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  # Multi-host: true (or a coordinator) calls jax.distributed.initialize before the mesh is made.
  # Unset values come from RTI_COORDINATOR / RTI_NUM_PROCESSES / RTI_PROCESS_ID, else JAX's own
  # cluster detection (SLURM, Open MPI, Kubernetes, Cloud TPU).
  distributed: bool = False
  coordinator: Optional[str] = None  # host:port of process 0's coordination service
  num_processes: int = 0  # 0 = from the environment / cluster
  process_id: int = -1  # -1 = from the environment / cluster
  # The iteration's tasks are rolled out in this many contiguous slices, slice k seeded by
  # (iteration key, k); each process rolls out its own contiguous block of slices. 0 = one slice per
  # process. A run's results depend on this count, not on how many processes share the slices.
  rollout_slices: int = 0
  # A process that stops sending heartbeats (killed, out of memory, preempted) for this many seconds
  # ends the job: every other process exits non-zero with an error naming it (JAX's coordination
  # service); the restarted job resumes from the last checkpoint.
  heartbeat_timeout_s: int = 100


@dataclasses.dataclass
class TrainConfig:
  """The loop: iterations, evaluation, checkpoints."""

  iterations: int = 20
  eval_every: int = 5
  eval_samples: int = 4
  eval_tasks: int = 0  # periodic evaluation on the first N test tasks (0 = all); monitoring only
  # Validation split: the last N train-split tasks are kept out of RL rollouts and evaluated every
  # eval_every iterations instead of test tasks (0 = none). Tune on these, never on the test split.
  val_tasks: int = 0
  seed: int = 0
  checkpoint_every: int = 5
  keep_checkpoints: int = 2


@dataclasses.dataclass
class ExperimentConfig:
  """A whole experiment."""

  name: str = "navigation"
  policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
  env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
  intervention: InterventionConfig = dataclasses.field(default_factory=InterventionConfig)
  loss: LossConfig = dataclasses.field(default_factory=LossConfig)
  baselines: BaselinesConfig = dataclasses.field(default_factory=BaselinesConfig)
  optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)


_CHOICES = {
    "policy.dtype": ("float32", "bfloat16"),
    "policy.param_dtype": ("float32", "bfloat16", ""),
    "policy.chat_template": ("", "qwen3", "qwen3_thinking_2507", "qwen3_append_only"),
    "rollout.backend": ("jax", "sglang"),
    "env.setting": ("tiny", "paper"),
    "intervention.validator": ("rules", "llm"),
    "intervention.verifier": ("rules", "llm", "off"),
    "intervention.corrector": pipeline.CORRECTORS,
    "loss.method": tuple(objectives.LOSSES),
    "loss.kl_kind": objectives.KL_KINDS,
    "loss.aggregation": (None, *objectives.AGG_MODES),
    "loss.adv_std": objectives.ADVANTAGE_STDS,
    "loss.intervened_old_logp": objectives.INTERVENED_OLD_LOGP,
    "loss.behaviour_logp": ("rollout", "recompute"),
    "baselines.luffy_when": ("all_fail", "always"),
}


def _get(cfg: ExperimentConfig, dotted: str) -> Any:
  obj: Any = cfg
  for part in dotted.split("."):
    obj = getattr(obj, part)
  return obj


#: Float keys that may be infinite (never NaN); every other float must be finite.
_INF_ALLOWED = frozenset({"intervention.delta"})


def _leaves(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
  """``(dotted key, value)`` of every leaf of a config dataclass."""
  out = []
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    key = f"{prefix}{f.name}"
    out.extend(_leaves(value, key + ".") if dataclasses.is_dataclass(value) else [(key, value)])
  return out


def _validate_env_sections(cfg: ExperimentConfig) -> None:
  """``env.name`` is registered; its section passes its own checks; every other environment's
  section keeps its defaults (an option of another environment is a mistake, named by its key)."""
  try:
    active = registry.get(cfg.env.name)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  for spec in registry.specs():
    section = getattr(cfg.env, spec.name, None)
    if section is None or spec.options is None:
      continue
    if spec is active:
      check = getattr(section, "validate", None)
      try:
        if check is not None:
          check()
      except ValueError as e:
        raise ConfigError(f"env.{spec.name}.{e}") from None
      continue
    for f in dataclasses.fields(section):
      value, default = getattr(section, f.name), getattr(spec.default_options(), f.name)
      if value != default:
        raise ConfigError(f"env.{spec.name}.{f.name}: an option of env {spec.name!r}, got {value!r} with "
                          f"env.name={cfg.env.name!r}")


def judge_context(cfg: ExperimentConfig) -> int:
  """The LLM judges' prompt + answer budget in tokens (``intervention.judge_max_context``, 0:
  ``rollout.max_context``)."""
  return cfg.intervention.judge_max_context or cfg.rollout.max_context


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
  """Checks choices and ranges; raises ``ConfigError`` naming the key."""
  for key, value in _leaves(cfg):
    if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and key not in _INF_ALLOWED)):
      raise ConfigError(f"{key}: expected a finite number, got {value}")
  for key, choices in _CHOICES.items():
    value = _get(cfg, key)
    if value not in choices:
      raise ConfigError(f"{key}: expected one of {list(choices)}, got {value!r}")
  positive_ints = [
      "env.num_train", "env.num_test", "env.max_turns", "rollout.tasks_per_iter", "rollout.group_size",
      "rollout.max_new_tokens", "rollout.max_context", "train.iterations", "train.eval_every",
      "train.eval_samples", "train.checkpoint_every", "train.keep_checkpoints", "optim.minibatches",
      "optim.length_chunks", "optim.epochs",
  ]
  for key in positive_ints:
    if _get(cfg, key) < 1:
      raise ConfigError(f"{key}: expected an integer >= 1, got {_get(cfg, key)!r}")
  if cfg.optim.length_buckets_per_octave is not None and cfg.optim.length_buckets_per_octave < 1:
    raise ConfigError(f"optim.length_buckets_per_octave: expected null or an integer >= 1, "
                      f"got {cfg.optim.length_buckets_per_octave!r}")
  if not 0 <= cfg.train.val_tasks < cfg.env.num_train:
    raise ConfigError(f"train.val_tasks: expected in [0, env.num_train={cfg.env.num_train}), got {cfg.train.val_tasks}")
  _validate_env_sections(cfg)
  if cfg.rollout.prefix_cache_mb < 0:
    raise ConfigError(f"rollout.prefix_cache_mb: expected an integer >= 0, got {cfg.rollout.prefix_cache_mb!r}")
  if cfg.rollout.backend == "sglang" and not cfg.rollout.sglang_url:
    raise ConfigError("rollout.sglang_url: required when rollout.backend=sglang (e.g. http://127.0.0.1:30000)")
  if cfg.rollout.group_size < 2:
    raise ConfigError(f"rollout.group_size: GRPO needs at least 2 samples per group, got {cfg.rollout.group_size}")
  if not cfg.loss.logp_temperature > 0:
    raise ConfigError(f"loss.logp_temperature: expected > 0, got {cfg.loss.logp_temperature}")
  sampling_params(cfg)  # the sampling keys' own ranges first, so a bad one is named before any cross-check
  t, r = cfg.loss.logp_temperature, cfg.rollout
  if t != 1.0 and cfg.loss.behaviour_logp == "rollout":
    # The behaviour log-probs are recorded while sampling: the sampled distribution must be the ratio's.
    clash = next((k for k, ok in (("rollout.temperature", r.temperature == t), ("rollout.top_k", r.top_k == 0),
                                  ("rollout.top_p", r.top_p == 1.0), ("rollout.backend", r.backend == "jax")) if not ok),
                 None)
    if clash is not None:
      raise ConfigError(
          f"{clash}: got {_get(cfg, clash)!r}, but loss.logp_temperature={t} with loss.behaviour_logp=rollout takes "
          f"the behaviour log-probs from the sampler, which needs rollout.temperature={t}, top-k and top-p off and "
          f"the in-process sampler; or set loss.behaviour_logp=recompute (or loss.logp_temperature=1)")
  if cfg.loss.intervened_old_logp == "cal" and cfg.loss.logp_temperature != 1.0 and cfg.rollout.backend == "sglang":
    raise ConfigError(f"loss.intervened_old_logp: cal records pi_cal at loss.logp_temperature="
                      f"{cfg.loss.logp_temperature}, which an SGLang server does not score (its prompt log-probs are "
                      "at temperature 1); use roll, or loss.logp_temperature=1")
  o = cfg.optim
  if not o.lr > 0:
    raise ConfigError(f"optim.lr: expected > 0, got {o.lr}")
  if not o.max_grad_norm > 0:
    raise ConfigError(f"optim.max_grad_norm: expected > 0 (the global-norm clip), got {o.max_grad_norm}")
  if not o.weight_decay >= 0:
    raise ConfigError(f"optim.weight_decay: expected >= 0, got {o.weight_decay}")
  if o.remat not in ("none", "full", "dots"):
    raise ConfigError(f"optim.remat: expected one of ['none', 'full', 'dots'], got {o.remat!r}")
  for key in (k for k in ("optim.vocab_chunk", "optim.tokens_per_device") if (_get(cfg, k) or 0) < 0 or _get(cfg, k) == 0):
    raise ConfigError(f"{key}: expected null or an integer >= 1, got {_get(cfg, key)!r}")
  for key in ("optim.b1", "optim.b2"):
    if not 0 <= _get(cfg, key) < 1:
      raise ConfigError(f"{key}: expected a value in [0, 1), got {_get(cfg, key)}")
  for key in ("train.eval_tasks", "train.seed", "env.seed"):
    if _get(cfg, key) < 0:
      raise ConfigError(f"{key}: expected an integer >= 0, got {_get(cfg, key)}")
  if not cfg.rollout.max_context > cfg.rollout.max_new_tokens:
    raise ConfigError(f"rollout.max_context: expected more than one turn (rollout.max_new_tokens="
                      f"{cfg.rollout.max_new_tokens}) plus a prompt, got {cfg.rollout.max_context}")
  axes = ("mesh.data", "mesh.fsdp", "mesh.tensor")
  for key in axes:
    if _get(cfg, key) == 0 or _get(cfg, key) < -1:
      raise ConfigError(f"{key}: expected a positive size or -1, got {_get(cfg, key)}")
  free = [k for k in axes if _get(cfg, k) == -1]
  if len(free) > 1:
    raise ConfigError(f"{free[-1]}: at most one mesh axis may be -1 (the remaining devices), got -1 for {free}")
  for key, low in (("mesh.num_processes", 0), ("mesh.process_id", -1), ("mesh.rollout_slices", 0),
                   ("mesh.heartbeat_timeout_s", 1)):
    if _get(cfg, key) < low:
      raise ConfigError(f"{key}: expected an integer >= {low}, got {_get(cfg, key)}")
  if cfg.mesh.num_processes and cfg.mesh.process_id >= cfg.mesh.num_processes:
    raise ConfigError(f"mesh.process_id: expected < mesh.num_processes={cfg.mesh.num_processes}, "
                      f"got {cfg.mesh.process_id}")
  if cfg.mesh.rollout_slices and cfg.rollout.tasks_per_iter % cfg.mesh.rollout_slices:
    raise ConfigError(f"mesh.rollout_slices: expected a divisor of rollout.tasks_per_iter={cfg.rollout.tasks_per_iter}, "
                      f"got {cfg.mesh.rollout_slices}")
  if cfg.loss.method == "opd" and not cfg.baselines.teacher_path:
    raise ConfigError("baselines.teacher_path: expected a teacher checkpoint dir for loss.method=opd, got None "
                      "(e.g. policies/navigation_teacher)")
  b = cfg.baselines
  if b.aepo_entropy not in ("exact", "surprisal"):
    raise ConfigError(f"baselines.aepo_entropy: expected one of ['exact', 'surprisal'], got {b.aepo_entropy!r}")
  for key in ("baselines.aepo_alloc_beta", "baselines.aepo_branch_beta"):
    if not _get(cfg, key) >= 0:
      raise ConfigError(f"{key}: expected >= 0, got {_get(cfg, key)}")
  if not math.isfinite(b.aepo_branch_threshold):
    raise ConfigError(f"baselines.aepo_branch_threshold: expected a finite number (nats), got {b.aepo_branch_threshold}")
  if not 0 <= b.aepo_branch_penalty <= 1:
    raise ConfigError(f"baselines.aepo_branch_penalty: expected in [0, 1], got {b.aepo_branch_penalty}")
  if b.aepo_entropy_tokens < 1:
    raise ConfigError(f"baselines.aepo_entropy_tokens: expected an integer >= 1, got {b.aepo_entropy_tokens!r}")
  runtime_configs(cfg)  # the runtime classes' own checks, reported by YAML key
  i = cfg.intervention
  if i.intervener_url and i.intervener_path:
    raise ConfigError("intervention.intervener_path: set either it or intervention.intervener_url, not both")
  if i.intervener_path and not os.path.isdir(i.intervener_path):
    raise ConfigError(f"intervention.intervener_path: expected a local HF checkpoint directory, got {i.intervener_path!r}")
  if i.judge_max_new_tokens < 1:
    raise ConfigError(f"intervention.judge_max_new_tokens: expected an integer >= 1, got {i.judge_max_new_tokens}")
  if i.judge_max_context < 0:
    raise ConfigError(f"intervention.judge_max_context: expected 0 (rollout.max_context) or a token count, got "
                      f"{i.judge_max_context}")
  budget = judge_context(cfg)
  if not i.intervener_url and not i.intervener_path and budget > cfg.rollout.max_context:
    raise ConfigError(f"intervention.judge_max_context: the policy judges itself within its sampler's "
                      f"rollout.max_context={cfg.rollout.max_context}, got {budget}")
  if "llm" in (i.validator, i.verifier) and i.judge_max_new_tokens >= budget:
    raise ConfigError(f"intervention.judge_max_new_tokens: expected fewer than the judge's context budget of "
                      f"{budget} tokens (room for the prompt), got {i.judge_max_new_tokens}")
  if not 0 <= i.max_malformed_rate <= 1:
    raise ConfigError(f"intervention.max_malformed_rate: expected a share in [0, 1], got {i.max_malformed_rate}")
  return cfg


#: Runtime field -> the YAML key it is built from (to name the key when a runtime check fails).
_RUNTIME_KEYS: dict[str, dict[str, str]] = {
    "LossConfig": {"name": "loss.method", "clip_low": "loss.clip_low", "clip_high": "loss.clip_high",
                   "dual_clip": "loss.dual_clip", "eps_cal": "intervention.eps_cal", "beta": "loss.beta",
                   "kl_kind": "loss.kl_kind", "agg": "loss.aggregation", "agg_norm": "loss.agg_norm",
                   "gspo_clip_low": "baselines.gspo_clip_low", "gspo_clip_high": "baselines.gspo_clip_high",
                   "luffy_gamma": "baselines.luffy_gamma", "opd_coef": "baselines.opd_coef",
                   "aepo_alpha": "baselines.aepo_alpha", "logp_temperature": "loss.logp_temperature"},
    "SamplingParams": {"max_new_tokens": "rollout.max_new_tokens", "temperature": "rollout.temperature",
                       "top_p": "rollout.top_p", "top_k": "rollout.top_k"},
    "RolloutConfig": {"group_size": "rollout.group_size", "max_context_tokens": "rollout.max_context",
                      "behaviour_temperature": "loss.logp_temperature"},
    "InterventionConfig": {"ppl_delta": "intervention.delta", "num_intervened_rollouts": "intervention.max_attempts",
                           "correction_attempts": "intervention.correction_attempts"},
}


def _build(cls: Any, **kwargs: Any) -> Any:
  """``cls(**kwargs)``; a ValueError from its checks becomes a ``ConfigError`` naming the YAML key."""
  try:
    return cls(**kwargs)
  except (ValueError, TypeError) as e:
    msg = str(e)
    keys = _RUNTIME_KEYS.get(cls.__name__, {})
    field = max((f for f in keys if re.search(rf"\b{f}\b", msg)), key=len, default=None)
    raise ConfigError(f"{keys[field] if field else cls.__name__}: {msg}") from None


def loss_config(cfg: ExperimentConfig) -> objectives.LossConfig:
  """The jitted step's ``objectives.LossConfig`` of ``cfg``."""
  b = cfg.baselines
  return _build(objectives.LossConfig, name=cfg.loss.method, clip_low=cfg.loss.clip_low,
                clip_high=cfg.loss.clip_high, dual_clip=cfg.loss.dual_clip, eps_cal=cfg.intervention.eps_cal,
                beta=cfg.loss.beta, kl_kind=cfg.loss.kl_kind, agg=cfg.loss.aggregation,
                agg_norm=cfg.loss.agg_norm, gspo_clip_low=b.gspo_clip_low, gspo_clip_high=b.gspo_clip_high, luffy_gamma=b.luffy_gamma,
                opd_coef=b.opd_coef, aepo_alpha=b.aepo_alpha, logp_temperature=cfg.loss.logp_temperature)


def sampling_params(cfg: ExperimentConfig) -> SamplingParams:
  """The policy's sampling settings of ``cfg`` (rollouts, Corrector and evaluation)."""
  r = cfg.rollout
  return _build(SamplingParams, max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                top_k=r.top_k)


def rollout_config(cfg: ExperimentConfig) -> rollout_lib.RolloutConfig:
  """Stage 1's ``rollout.RolloutConfig`` of ``cfg``."""
  tempered = cfg.loss.behaviour_logp == "rollout" and cfg.loss.logp_temperature != 1.0
  return _build(rollout_lib.RolloutConfig, group_size=cfg.rollout.group_size, sampling=sampling_params(cfg),
                max_context_tokens=cfg.rollout.max_context,
                behaviour_temperature=cfg.loss.logp_temperature if tempered else 1.0)


def intervention_config(cfg: ExperimentConfig, domain: str = "navigation", success_reward: float = 1.0
                        ) -> pipeline.InterventionConfig:
  """Stage 2's ``pipeline.InterventionConfig`` of ``cfg`` for a registered environment ``domain``
  (its judge prompts) and its success threshold."""
  i = cfg.intervention
  return _build(pipeline.InterventionConfig, enabled=cfg.loss.method == "rti" and i.enabled,
                verifier_enabled=i.verifier != "off", ppl_delta=i.delta, reweight=i.reweight,
                num_intervened_rollouts=i.max_attempts, correction_attempts=i.correction_attempts, domain=domain,
                corrector=i.corrector, success_reward=success_reward,
                intervened_old_logp=cfg.loss.intervened_old_logp,
                # pi_cal is recorded, never recomputed: always at the ratio's temperature
                old_logp_temperature=cfg.loss.logp_temperature if cfg.loss.intervened_old_logp == "cal" else None)


def runtime_configs(cfg: ExperimentConfig, domain: str = "navigation") -> tuple[Any, Any, Any]:
  """``(loss_config, rollout_config, intervention_config)`` of ``cfg``."""
  return loss_config(cfg), rollout_config(cfg), intervention_config(cfg, domain)


def load_config(name_or_path: str | None = None, overrides: Sequence[str] = ()) -> ExperimentConfig:
  """Builds a validated ``ExperimentConfig``.

  name_or_path: a YAML file path, or a name under ``configs/`` (``"navigation"``
    reads ``configs/navigation.yaml``), or None for the dataclass defaults.
  overrides: ``key=value`` strings, e.g. ``["train.iterations=3", "loss.method=grpo"]``.
  """
  path = None if name_or_path is None else config_path(name_or_path)
  return validate(load_structured(schema(), path, overrides))


def schema() -> type[ExperimentConfig]:
  """``ExperimentConfig`` with one typed section ``env.<name>`` per registered environment that has
  options (``EnvSpec.options``): what YAML files and ``key=value`` overrides are checked against."""
  sections = tuple((s.name, s.options) for s in registry.specs() if s.options is not None)
  return _schema(sections)


@functools.lru_cache(maxsize=None)
def _schema(sections: tuple[tuple[str, type], ...]) -> type[ExperimentConfig]:
  env = dataclasses.make_dataclass(
      "EnvConfig", [(name, cls, dataclasses.field(default_factory=cls)) for name, cls in sections], bases=(EnvConfig,))
  env.__doc__, env.__module__ = EnvConfig.__doc__, __name__
  exp = dataclasses.make_dataclass(
      "ExperimentConfig", [("env", env, dataclasses.field(default_factory=env))], bases=(ExperimentConfig,))
  exp.__doc__, exp.__module__ = ExperimentConfig.__doc__, __name__
  return exp


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
  """A plain dict (for JSON records of a run)."""
  return dataclasses.asdict(cfg)


def to_yaml(cfg: ExperimentConfig) -> str:
  return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def current_yaml(stored: str) -> str:
  """A resolved config stored by ``to_yaml`` as the current schema resolves it: fields added to the
  schema since take their defaults (which keep the behaviour the stored run had), so the text
  equals ``to_yaml`` of the same config today. A text the schema cannot take (a field removed or
  retyped since) comes back unchanged."""
  try:
    return OmegaConf.to_yaml(OmegaConf.merge(OmegaConf.structured(schema()), OmegaConf.create(stored)))
  except Exception:  # noqa: BLE001 (any OmegaConf error: the stored text simply matches nothing newer)
    return stored
