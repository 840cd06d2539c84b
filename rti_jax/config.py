"""Typed experiment configs: dataclasses + YAML files + command-line overrides (OmegaConf).

A config is built in three layers, later ones winning::

    defaults of the dataclasses  <-  configs/<name>.yaml  <-  command-line ``key=value`` overrides

OmegaConf checks types against the dataclass schema (an unknown key or a string
where a float belongs is an error naming the key); ``validate`` then checks value
ranges and choices. Every error is a ``ConfigError`` that names the offending key.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any, Optional, Sequence

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
  """A bad config: unknown key, wrong type or out-of-range value (the message names the key)."""


@dataclasses.dataclass
class PolicyConfig:
  """Where the policy comes from. ``path`` is a local HF checkpoint directory."""

  path: str = MISSING
  dtype: str = "float32"  # float32 | bfloat16: activations and matmuls
  # float32 | bfloat16 | "" (= dtype): parameters and optimizer moments. Keep float32 (master
  # weights) with dtype bfloat16: updates of lr 1e-6 vanish in bf16 parameters.
  param_dtype: str = "float32"


@dataclasses.dataclass
class EnvConfig:
  """The environment and its task split."""

  name: str = "navigation"  # navigation | telecom
  setting: str = "tiny"  # tiny (CPU default) | paper
  num_train: int = 600
  num_test: int = 150
  seed: int = 0
  max_turns: int = 6
  # Navigation: leave tasks that a later candidate of the first results already solves
  # (``tasks.listed_alternative``) out of RL rollouts. Validation and test splits are unchanged.
  rl_exclude_listed: bool = False
  # Telecom: the policy text of the system prompt. full = tau2's policy + tech-support manual;
  # condensed = ``envs.telecom.condensed.CONDENSED_POLICY`` (for a tiny policy; what was condensed
  # is listed there). The agent-tool schemas are appended either way.
  policy_text: str = "full"


@dataclasses.dataclass
class RolloutConfig:
  """Stage 1 of Algorithm 1: on-policy groups."""

  tasks_per_iter: int = 8
  group_size: int = 8  # G
  temperature: float = 0.8
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 64  # per assistant turn
  max_context: int = 1024  # prompt + all turns
  # > 0: the jax sampler keeps each row's KV (MiB in all) and the next turn prefills only what follows
  # (models.sampler.Sampler prefix_cache_bytes; for long multi-turn episodes: Telecom). 0: every turn
  # prefills the whole context (the Navigation runs' setting).
  prefix_cache_mb: int = 0
  backend: str = "jax"  # jax (in-process sampler) | sglang (a server, over HTTP)
  sglang_url: Optional[str] = None  # e.g. http://127.0.0.1:30000 when backend = sglang
  weights_dir: Optional[str] = None  # where policy weights are written for the server to reload


@dataclasses.dataclass
class InterventionConfig:
  """Stage 2 of Algorithm 1 (only for all-fail groups) and its ablation switches."""

  enabled: bool = True
  validator: str = "rules"  # rules | llm
  verifier: str = "rules"  # rules | llm | off  ("w/o Post-Check")
  delta: float = 5.0  # PPL gate threshold (Eq. 4); inf = gate off, 0 = reject all
  reweight: bool = True  # False = rho_cal == 1 ("w/o Reweight")
  eps_cal: float = 0.2  # Eq. 6
  intervener_url: Optional[str] = None  # None = self-intervention by the policy
  max_attempts: int = 1  # intervened rollouts tried per all-fail group
  correction_attempts: int = 1  # Corrector samples tried per flagged step (redrawn when a check rejects one)


@dataclasses.dataclass
class LossConfig:
  """The policy objective (Eq. 2 / Eq. 7) and its conventions."""

  method: str = "rti"  # grpo | rti (baselines: gspo | aepo | luffy | opd)
  clip_low: float = 0.2  # eps_clip
  clip_high: float = 0.2
  dual_clip: Optional[float] = None
  beta: float = 0.0  # KL coefficient (Eq. 2)
  kl_kind: str = "k3"
  aggregation: str = "seq-mean-token-mean"
  adv_std: str = "population"  # population (Eq. 1) | unbiased | none


@dataclasses.dataclass
class BaselinesConfig:
  """Settings of the baselines (loss.method gspo | aepo | opd | luffy); see ``rti_jax.baselines``."""

  teacher_path: Optional[str] = None  # OPD teacher: an HF checkpoint sharing the policy's tokenizer
  opd_coef: float = 1.0  # weight of the per-token reverse-KL term folded into the advantage
  luffy_when: str = "all_fail"  # all_fail (RTI paper App. C.3) | always (LUFFY paper): groups given a demo
  luffy_gamma: float = 0.1  # policy-shaping f(p) = p / (p + gamma) of off-policy tokens
  aepo_alpha: float = 0.2  # entropy-aware advantage scale
  # AEPO's entropy-balanced branching rollout (rti_jax/aepo_rollout.py); used when loss.method=aepo
  aepo_branching: bool = True  # false: plain rollout_groups (the update half only)
  aepo_alloc_beta: float = 1.0  # m = clip(round(G * sigmoid(beta * (H_root - H_tool))), 1, G) global rollouts
  aepo_branch_beta: float = 1.0  # branch prob = clip(branch_beta * dH, 0, 1) * (1 - penalty)^consecutive
  aepo_branch_threshold: float = 0.0  # a step is a fork candidate when dH = H_t - H_root exceeds this (nats)
  aepo_branch_penalty: float = 0.5  # consecutive branch penalty, in [0, 1]
  aepo_entropy: str = "exact"  # step entropy: exact (policy forward pass) | surprisal (-logprob of the samples)
  aepo_entropy_tokens: int = 20  # the step entropy averages the first this-many tokens of a turn
  gspo_clip_low: float = 3e-4  # GSPO's sequence-level clip range
  gspo_clip_high: float = 4e-4


@dataclasses.dataclass
class OptimConfig:
  """optax AdamW with a constant learning rate (the paper's setting)."""

  lr: float = 1e-6
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.999
  max_grad_norm: float = 1.0
  minibatches: int = 1  # update steps per rollout batch
  # Each minibatch's rows are sorted by length and split into at most this many equal-size chunks
  # (the largest count that divides the rows, each chunk divisible by the data-parallel degree),
  # each padded to its own bucketed length; their gradients are summed before the one optimizer
  # step (same loss and gradient as one padded batch, less padding). 1 = one batch padded to its
  # longest row.
  length_chunks: int = 1


@dataclasses.dataclass
class MeshConfig:
  """Device mesh axis sizes; -1 on one axis takes the remaining devices."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1


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
  out_dir: str = "runs"
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
    "env.name": ("navigation", "telecom"),
    "rollout.backend": ("jax", "sglang"),
    "env.setting": ("tiny", "paper"),
    "env.policy_text": ("full", "condensed"),
    "intervention.validator": ("rules", "llm"),
    "intervention.verifier": ("rules", "llm", "off"),
    "loss.method": ("grpo", "rti", "gspo", "aepo", "luffy", "opd"),
    "loss.kl_kind": ("k1", "abs", "k2", "k3", "low_var_kl"),
    "loss.aggregation": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"),
    "loss.adv_std": ("population", "unbiased", "none"),
    "baselines.luffy_when": ("all_fail", "always"),
}


def _get(cfg: ExperimentConfig, dotted: str) -> Any:
  obj: Any = cfg
  for part in dotted.split("."):
    obj = getattr(obj, part)
  return obj


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
  """Checks choices and ranges; raises ``ConfigError`` naming the key."""
  for key, choices in _CHOICES.items():
    value = _get(cfg, key)
    if value not in choices:
      raise ConfigError(f"{key}: expected one of {list(choices)}, got {value!r}")
  positive_ints = [
      "env.num_train", "env.num_test", "env.max_turns", "rollout.tasks_per_iter", "rollout.group_size",
      "rollout.max_new_tokens", "rollout.max_context", "train.iterations", "train.eval_every",
      "train.eval_samples", "train.checkpoint_every", "train.keep_checkpoints", "optim.minibatches",
      "optim.length_chunks",
      "intervention.max_attempts", "intervention.correction_attempts",
  ]
  for key in positive_ints:
    if _get(cfg, key) < 1:
      raise ConfigError(f"{key}: expected an integer >= 1, got {_get(cfg, key)!r}")
  if not 0 <= cfg.train.val_tasks < cfg.env.num_train:
    raise ConfigError(f"train.val_tasks: expected in [0, env.num_train={cfg.env.num_train}), got {cfg.train.val_tasks}")
  if cfg.env.rl_exclude_listed and cfg.env.name != "navigation":
    raise ConfigError(f"env.rl_exclude_listed: a Navigation option, got it with env.name={cfg.env.name!r}")
  if cfg.env.policy_text != "full" and cfg.env.name != "telecom":
    raise ConfigError(f"env.policy_text: a Telecom option, got {cfg.env.policy_text!r} with env.name={cfg.env.name!r}")
  if cfg.rollout.prefix_cache_mb < 0:
    raise ConfigError(f"rollout.prefix_cache_mb: expected an integer >= 0, got {cfg.rollout.prefix_cache_mb!r}")
  if cfg.rollout.backend == "sglang" and not cfg.rollout.sglang_url:
    raise ConfigError("rollout.sglang_url: required when rollout.backend=sglang (e.g. http://127.0.0.1:30000)")
  if cfg.rollout.group_size < 2:
    raise ConfigError(f"rollout.group_size: GRPO needs at least 2 samples per group, got {cfg.rollout.group_size}")
  if not cfg.rollout.temperature >= 0:
    raise ConfigError(f"rollout.temperature: expected >= 0, got {cfg.rollout.temperature}")
  if not 0 < cfg.rollout.top_p <= 1:
    raise ConfigError(f"rollout.top_p: expected in (0, 1], got {cfg.rollout.top_p}")
  for key in ("loss.clip_low", "loss.clip_high", "intervention.eps_cal"):
    if not 0 <= _get(cfg, key) < 1:
      raise ConfigError(f"{key}: expected in [0, 1), got {_get(cfg, key)}")
  if cfg.loss.dual_clip is not None and not cfg.loss.dual_clip > 1:
    raise ConfigError(f"loss.dual_clip: expected > 1 or null, got {cfg.loss.dual_clip}")
  if not (cfg.intervention.delta >= 0 or math.isinf(cfg.intervention.delta)):
    raise ConfigError(f"intervention.delta: expected >= 0 (inf allowed), got {cfg.intervention.delta}")
  if cfg.loss.beta < 0:
    raise ConfigError(f"loss.beta: expected >= 0, got {cfg.loss.beta}")
  if not cfg.optim.lr > 0:
    raise ConfigError(f"optim.lr: expected > 0, got {cfg.optim.lr}")
  for key in ("mesh.data", "mesh.fsdp", "mesh.tensor"):
    if _get(cfg, key) == 0 or _get(cfg, key) < -1:
      raise ConfigError(f"{key}: expected a positive size or -1, got {_get(cfg, key)}")
  if sum(_get(cfg, k) == -1 for k in ("mesh.data", "mesh.fsdp", "mesh.tensor")) > 1:
    raise ConfigError("mesh: at most one axis may be -1")
  # --- baselines ---
  if cfg.loss.method == "opd" and not cfg.baselines.teacher_path:
    raise ConfigError("baselines.teacher_path: expected a teacher checkpoint dir for loss.method=opd, got None "
                      "(make one with experiments/navigation_sft.py --resolve-share 1.0 --policy-dir <dir>)")
  for key in ("baselines.opd_coef", "baselines.aepo_alpha"):
    if not _get(cfg, key) >= 0:
      raise ConfigError(f"{key}: expected >= 0, got {_get(cfg, key)}")
  if not cfg.baselines.luffy_gamma > 0:
    raise ConfigError(f"baselines.luffy_gamma: expected > 0, got {cfg.baselines.luffy_gamma}")
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
  if not (0 <= cfg.baselines.gspo_clip_low < 1 and cfg.baselines.gspo_clip_high >= 0):
    raise ConfigError(f"baselines.gspo_clip_low/high: expected low in [0, 1) and high >= 0, got "
                      f"{cfg.baselines.gspo_clip_low}, {cfg.baselines.gspo_clip_high}")
  return cfg


def load_config(name_or_path: str | None = None, overrides: Sequence[str] = ()) -> ExperimentConfig:
  """Builds a validated ``ExperimentConfig``.

  name_or_path: a YAML file path, or a name under ``configs/`` (``"navigation"``
    reads ``configs/navigation.yaml``), or None for the dataclass defaults.
  overrides: ``key=value`` strings, e.g. ``["train.iterations=3", "loss.method=grpo"]``.
  """
  schema = OmegaConf.structured(ExperimentConfig)
  layers = [schema]
  if name_or_path is not None:
    path = pathlib.Path(name_or_path)
    if not path.suffix:
      path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.exists():
      known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
      raise ConfigError(f"config {name_or_path!r}: no file {path}; known configs: {known}")
    layers.append(OmegaConf.load(path))
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r}: expected key=value")
  overrides = [_quote_yaml_words(item) for item in overrides]
  try:
    merged = OmegaConf.merge(*layers, OmegaConf.from_dotlist(list(overrides)))
    cfg = OmegaConf.to_object(merged)
  except OmegaConfBaseException as e:
    key = getattr(e, "full_key", None) or "config"
    raise ConfigError(f"{key}: {str(e).splitlines()[0]}") from None
  assert isinstance(cfg, ExperimentConfig)
  return validate(cfg)


_YAML_BOOL_WORDS = {"on", "off", "yes", "no", "y", "n", "true", "false"}


def _field_type(dotted: str) -> Any:
  """The annotated type of a dotted key of ``ExperimentConfig`` (None if unknown)."""
  cls: Any = ExperimentConfig
  typ: Any = None
  for part in dotted.split("."):
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if part not in fields:
      return None
    typ = fields[part].type
    typ = eval(typ, globals()) if isinstance(typ, str) else typ  # noqa: S307 (our own annotations)
    cls = typ
  return typ


def _quote_yaml_words(item: str) -> str:
  """``intervention.verifier=off`` stays the string "off": YAML would read off/on/yes/no as booleans."""
  key, _, value = item.partition("=")
  if value.strip().lower() in _YAML_BOOL_WORDS and _field_type(key.strip()) in (str, Optional[str]):
    return f"{key}='{value.strip()}'"
  return item


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
  """A plain dict (for JSON records of a run)."""
  return dataclasses.asdict(cfg)


def to_yaml(cfg: ExperimentConfig) -> str:
  return OmegaConf.to_yaml(OmegaConf.structured(cfg))
