"""The training batch (one frozen pytree), the loss config, the loss registry, and the host-side
assembly of batches from trajectories (``assemble_batch``, ``length_chunks``).

``LOSSES[name](logp, batch, cfg)`` returns ``LossParts(numerator, denominator, metrics)``;
``loss = numerator / max(denominator, 1)``. Keeping the two parts lets a trainer sum them over
micro-batches and divide once, which reproduces the full-batch loss exactly.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rti_jax.objectives import _checks as C
from rti_jax.objectives import baselines as BL
from rti_jax.objectives import core

if TYPE_CHECKING:
  from rti_jax.rollout import Trajectory


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RTIBatch:
  """One training batch; every ``[B, T]`` field is aligned with ``input_ids`` (see
  ``next_token_logprobs``) and groups are consecutive rows.

  input_ids: [B, T] int32 prompt + response tokens (right padded).
  attention_mask: [B, T] 1 on real tokens, 0 on padding.
  loss_mask: [B, T] 1 on trained tokens (policy-written response tokens; environment feedback,
    prompt and padding are 0).
  old_logp: [B, T] float32 log-prob of each token under the behaviour policy ``pi_old`` (Eq. 2).
    On intervened tokens this is the rollout-prompt rescoring, i.e. equal to ``roll_logp``:
    Eq. 7's ``rho_grpo`` compares the current policy with the policy that held the rollout
    context (Algorithm 1 caches exactly these log-probs), and the shift between correction
    and rollout prompt is carried by ``rho_cal`` alone.
  advantages: [B] (Eq. 1) or [B, T] float32.
  roll_logp: [B, T] log pi_theta^roll of intervened tokens under the rollout prompt (Eq. 5).
  cal_logp: [B, T] log pi_cal of intervened tokens under the correction prompt (Eq. 5).
  intervened_mask: [B, T] 1 on Corrector-written tokens (RTI) / teacher tokens (LUFFY).
  ref_logp: [B, T] reference-policy log-probs (needed when ``beta > 0``).
  teacher_logp: [B, T] teacher log-probs (OPD).
  entropy: [B, T] AEPO's standardised sampling-policy entropy per token (``entropy_zscore`` over the
    trained tokens of the whole minibatch, taken before it is cut into chunks or micro-batches).
  trained_positions: [B, W] int32, each row's trained positions (``loss_mask != 0``, t >= 1) in
    order, then 0s (``with_trained_positions``): the train step then takes the policy's log-probs
    at these positions alone (``models.scoring.token_logprobs_at``; the same values, and the loss
    reads no other position).
  The last seven are optional (None); RTI treats missing intervention fields as "nothing intervened".
  """

  input_ids: jax.Array
  attention_mask: jax.Array
  loss_mask: jax.Array
  old_logp: jax.Array
  advantages: jax.Array
  roll_logp: jax.Array | None = None
  cal_logp: jax.Array | None = None
  intervened_mask: jax.Array | None = None
  ref_logp: jax.Array | None = None
  teacher_logp: jax.Array | None = None
  entropy: jax.Array | None = None
  trained_positions: jax.Array | None = None

  @property
  def shape(self) -> tuple[int, int]:
    return tuple(self.input_ids.shape)  # type: ignore[return-value]

  def check(self) -> "RTIBatch":
    """Validates ranks, dtypes and shapes (trace-time); returns self. Raises ValueError."""
    ids = C.as_array("batch.input_ids", self.input_ids)
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
      raise ValueError(f"batch.input_ids: expected a rank-2 integer array, got shape {tuple(ids.shape)} dtype {ids.dtype}")
    shape = tuple(ids.shape)
    C.check_mask("batch.attention_mask", self.attention_mask, shape)
    C.check_mask("batch.loss_mask", self.loss_mask, shape)
    for name in ("old_logp", "roll_logp", "cal_logp", "ref_logp", "teacher_logp", "entropy"):
      value = getattr(self, name)
      if value is not None:
        arr = C.check_float(f"batch.{name}", value, (2,))
        if tuple(arr.shape) != shape:
          raise ValueError(f"batch.{name}: expected shape {shape}, got {tuple(arr.shape)}")
    C.check_advantages("batch.advantages", self.advantages, shape)
    present = [getattr(self, n) is not None for n in ("roll_logp", "cal_logp", "intervened_mask")]
    if any(present) and not all(present):
      raise ValueError("batch.roll_logp/cal_logp/intervened_mask: expected all three or none, "
                       f"got present={dict(zip(('roll_logp', 'cal_logp', 'intervened_mask'), present))}")
    if self.intervened_mask is not None:
      C.check_mask("batch.intervened_mask", self.intervened_mask, shape)
    if self.trained_positions is not None:
      pos = C.as_array("batch.trained_positions", self.trained_positions)
      if pos.ndim != 2 or pos.shape[0] != shape[0] or pos.shape[1] > shape[1] or not jnp.issubdtype(pos.dtype, jnp.integer):
        raise ValueError(f"batch.trained_positions: expected an integer [B, W] array with B={shape[0]}, W <= {shape[1]}, "
                         f"got shape {tuple(pos.shape)} dtype {pos.dtype}")
    return self


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Static loss settings (hashable; safe as a jit static argument).

  name: a key of ``LOSSES``. agg: aggregation mode; None picks the method's own default
  (``seq-mean-token-mean`` for grpo/rti/gspo/opd, ``token-mean`` for luffy/aepo).
  Paper defaults (Sec. 5.1): clip 0.2, eps_cal 0.2, beta 0. logp_temperature: the train step takes
  the policy's log-probs from ``logits / logp_temperature`` (1: the policy itself; the sampling
  temperature: the distribution the rollouts were drawn from, as verl does); the behaviour
  log-probs ``old_logp`` must be taken at the same temperature (``rti_jax.trainer``'s
  ``loss.behaviour_logp: recompute``).
  """

  name: str = "rti"
  clip_low: float = 0.2
  clip_high: float = 0.2
  dual_clip: float | None = None
  eps_cal: float = 0.2
  beta: float = 0.0
  kl_kind: str = "k3"  # low_var_kl is the same estimator (verl's name)
  agg: str | None = None
  agg_norm: float | None = None
  gspo_clip_low: float = 3e-4
  gspo_clip_high: float = 4e-4
  luffy_gamma: float = 0.1
  luffy_on_policy_clip: bool = True
  opd_coef: float = 1.0
  aepo_alpha: float = 0.2
  logp_temperature: float = 1.0

  def __post_init__(self) -> None:
    C.check_scalar("LossConfig.logp_temperature", self.logp_temperature, low=0.0, low_open=True)
    C.check_choice("LossConfig.name", self.name, tuple(LOSSES))
    C.check_choice("LossConfig.kl_kind", self.kl_kind, core.KL_KINDS)
    if self.agg is not None:
      C.check_choice("LossConfig.agg", self.agg, core.AGG_MODES)
    C.check_scalar("LossConfig.eps_cal", self.eps_cal, low=0.0, high=1.0, low_open=True, high_open=True)
    C.check_scalar("LossConfig.beta", self.beta, low=0.0)
    core._check_clip(self.clip_low, self.clip_high, self.dual_clip)  # noqa: SLF001
    C.check_scalar("LossConfig.gspo_clip_low", self.gspo_clip_low, low=0.0, high=1.0, high_open=True)
    C.check_scalar("LossConfig.gspo_clip_high", self.gspo_clip_high, low=0.0)
    C.check_scalar("LossConfig.luffy_gamma", self.luffy_gamma, low=0.0, low_open=True)
    C.check_scalar("LossConfig.opd_coef", self.opd_coef, low=0.0)
    C.check_scalar("LossConfig.aepo_alpha", self.aepo_alpha, low=0.0)
    if self.agg_norm is not None:
      C.check_scalar("LossConfig.agg_norm", self.agg_norm, low=0.0, low_open=True)

  def agg_mode(self, default: str) -> str:
    return default if self.agg is None else self.agg


class LossParts(NamedTuple):
  """numerator, denominator: float32 scalars; metrics: dict of float32 scalars."""

  numerator: jax.Array
  denominator: jax.Array
  metrics: dict


def _kl_args(batch: RTIBatch, cfg: LossConfig) -> dict:
  ref = batch.ref_logp if cfg.beta != 0 else None
  if cfg.beta != 0 and ref is None:
    raise ValueError(f"batch.ref_logp: expected a [B, T] array because LossConfig.beta={cfg.beta}, got None")
  return dict(ref_logp=ref, beta=cfg.beta, kl_kind=cfg.kl_kind)


def _common_metrics(logp: jax.Array, batch: RTIBatch, cfg: LossConfig) -> dict:
  """Clip fraction and the k1 / k3 estimates of KL(pi_old || pi_theta) over loss tokens; with an
  intervened mask, the clip fraction also over the intervened and the on-policy tokens apart."""
  mask = batch.loss_mask != 0
  d = jnp.where(mask, logp.astype(jnp.float32) - batch.old_logp.astype(jnp.float32), 0.0)
  ratio = jnp.exp(jnp.clip(d, -core.LOG_RATIO_CLAMP, core.LOG_RATIO_CLAMP))
  clipped = ((ratio < 1.0 - cfg.clip_low) | (ratio > 1.0 + cfg.clip_high)).astype(jnp.float32)
  out = {
      "clip_frac": core.aggregate(clipped, mask, "token-mean"),
      "approx_kl_k1": core.aggregate(-d, mask, "token-mean"),
      "approx_kl_k3": core.aggregate(ratio - 1.0 - d, mask, "token-mean"),
      "num_tokens": jnp.sum(mask).astype(jnp.float32),
  }
  if batch.intervened_mask is not None:
    iv = mask & (batch.intervened_mask != 0)
    on = mask & ~iv
    out["clip_frac_intervened"] = core.aggregate(clipped, iv, "token-mean")
    out["clip_frac_on_policy"] = core.aggregate(clipped, on, "token-mean")
    out["intervened_tokens"] = jnp.sum(iv).astype(jnp.float32)
    out["on_policy_tokens"] = jnp.sum(on).astype(jnp.float32)
  else:  # every loss token is on-policy
    out["clip_frac_intervened"] = jnp.zeros((), jnp.float32)
    out["clip_frac_on_policy"] = out["clip_frac"]
    out["intervened_tokens"] = jnp.zeros((), jnp.float32)
    out["on_policy_tokens"] = out["num_tokens"]
  return out


def _parts(per_token: jax.Array, batch: RTIBatch, cfg: LossConfig, default_agg: str,
           metrics: dict) -> LossParts:
  num, den = core.aggregate_parts(per_token, batch.loss_mask, cfg.agg_mode(default_agg),
                                  norm=cfg.agg_norm)
  return LossParts(num, den, metrics)


def _grpo(logp: jax.Array, batch: RTIBatch, cfg: LossConfig) -> LossParts:
  per_token = core.grpo_token_loss(logp, batch.old_logp, batch.advantages, batch.loss_mask,
                                   clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                   dual_clip=cfg.dual_clip, **_kl_args(batch, cfg))
  return _parts(per_token, batch, cfg, "seq-mean-token-mean", _common_metrics(logp, batch, cfg))


def _rti(logp: jax.Array, batch: RTIBatch, cfg: LossConfig) -> LossParts:
  if batch.intervened_mask is None:
    return _grpo(logp, batch, cfg)
  per_token = core.rti_token_loss(logp, batch.old_logp, batch.advantages, batch.loss_mask,
                                  batch.cal_logp, batch.roll_logp, batch.intervened_mask,
                                  eps_cal=cfg.eps_cal, clip_low=cfg.clip_low,
                                  clip_high=cfg.clip_high, dual_clip=cfg.dual_clip,
                                  **_kl_args(batch, cfg))
  metrics = _common_metrics(logp, batch, cfg)
  w = core.calibration_weights(batch.cal_logp, batch.roll_logp, batch.intervened_mask,
                               eps_cal=cfg.eps_cal)
  iv = (batch.intervened_mask != 0) & (batch.loss_mask != 0)
  metrics["cal_weight_mean"] = core.aggregate(w, iv, "token-mean")
  return _parts(per_token, batch, cfg, "seq-mean-token-mean", metrics)


def _gspo(logp: jax.Array, batch: RTIBatch, cfg: LossConfig) -> LossParts:
  per_token = BL.gspo_token_loss(logp, batch.old_logp, batch.advantages, batch.loss_mask,
                                 clip_low=cfg.gspo_clip_low, clip_high=cfg.gspo_clip_high)
  return _parts(per_token, batch, cfg, "seq-mean-token-mean", _common_metrics(logp, batch, cfg))


def _luffy(logp: jax.Array, batch: RTIBatch, cfg: LossConfig) -> LossParts:
  off = batch.intervened_mask if batch.intervened_mask is not None else jnp.zeros(batch.shape, bool)
  per_token = BL.luffy_token_loss(logp, batch.old_logp, batch.advantages, batch.loss_mask, off,
                                  gamma=cfg.luffy_gamma, clip_low=cfg.clip_low,
                                  clip_high=cfg.clip_high, on_policy_clip=cfg.luffy_on_policy_clip)
  return _parts(per_token, batch, cfg, "token-mean", _common_metrics(logp, batch, cfg))


def _opd(logp: jax.Array, batch: RTIBatch, cfg: LossConfig) -> LossParts:
  if batch.teacher_logp is None:
    raise ValueError("batch.teacher_logp: expected a [B, T] array for LossConfig.name='opd', got None")
  adv = BL.opd_advantages(batch.advantages, batch.old_logp, batch.teacher_logp, batch.loss_mask,
                          coef=cfg.opd_coef)
  per_token = core.grpo_token_loss(logp, batch.old_logp, adv, batch.loss_mask,
                                   clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                   dual_clip=cfg.dual_clip, **_kl_args(batch, cfg))
  return _parts(per_token, batch, cfg, "seq-mean-token-mean", _common_metrics(logp, batch, cfg))


def _aepo(logp: jax.Array, batch: RTIBatch, cfg: LossConfig) -> LossParts:
  adv = batch.advantages
  if batch.entropy is not None:
    adv = BL.aepo_advantages(adv, batch.entropy, batch.loss_mask, alpha=cfg.aepo_alpha, standardized=True)
  per_token = BL.aepo_token_loss(logp, batch.old_logp, adv, batch.loss_mask,
                                 clip_low=cfg.clip_low, clip_high=cfg.clip_high)
  return _parts(per_token, batch, cfg, "token-mean", _common_metrics(logp, batch, cfg))


LossFn = Callable[[jax.Array, RTIBatch, LossConfig], LossParts]

LOSSES: dict[str, LossFn] = {
    "grpo": _grpo,
    "rti": _rti,
    "gspo": _gspo,
    "luffy": _luffy,
    "opd": _opd,
    "aepo": _aepo,
}
"""Loss registry: a config string picks the loss. Each entry maps
``(logp [B, T], batch, cfg) -> LossParts``."""


def get_loss(name: str) -> LossFn:
  """``LOSSES[name]``, or a ValueError listing the known names."""
  return LOSSES[C.check_choice("name", name, tuple(LOSSES))]


def loss_from_batch(logp: jax.Array, batch: RTIBatch, cfg: LossConfig) -> tuple[jax.Array, dict]:
  """Scalar loss ``numerator / max(denominator, 1)`` of ``cfg.name`` and its metrics.

  logp: [B, T] current-policy log-probs aligned with ``batch.input_ids``.
  """
  if not isinstance(batch, RTIBatch):
    raise ValueError(f"batch: expected an RTIBatch, got {type(batch).__name__}")
  if not isinstance(cfg, LossConfig):
    raise ValueError(f"cfg: expected a LossConfig, got {type(cfg).__name__}")
  batch.check()
  logp = C.check_float("logp", logp, (2,))
  if tuple(logp.shape) != batch.shape:
    raise ValueError(f"logp: expected shape {batch.shape} (batch.input_ids), got {tuple(logp.shape)}")
  parts = get_loss(cfg.name)(logp, batch, cfg)
  return parts.numerator / jnp.maximum(parts.denominator, 1.0), parts.metrics


# --- host-side assembly: trajectories -> RTIBatch, and length chunks of a batch ----------------

#: choices of ``assemble_batch(intervened_old_logp=...)`` (config ``loss.intervened_old_logp``).
INTERVENED_OLD_LOGP = ("roll", "cal")


def assemble_batch(
  groups: Sequence[Sequence[Trajectory]],
  *,
  pad_id: int = 0,
  reweight: bool = True,
  max_len: int | None = None,
  pad_multiple: int = 1,
  advantage_std: str = "population",
  intervened_old_logp: str = "roll",
) -> RTIBatch:
  """Groups -> ``RTIBatch`` (consecutive rows per group, right padded).

  Every field is ``[B, T]`` aligned with ``input_ids`` (``field[:, t]`` is about token t),
  which is ``objectives.next_token_logprobs``' alignment. advantages: ``[B]`` (Eq. 1).
  max_len: sequences longer than this are cut (their tail leaves the loss).
  intervened_old_logp: the behaviour log-prob ``old_logp`` of a Corrector-written token.
    ``"roll"`` (default): pi_roll, its probability under the rollout context it stands in (Eq. 3),
    so the PPO ratio starts at 1 and the calibration weight pi_cal / pi_roll (Eq. 5-6) alone carries
    the off-policy correction. ``"cal"``: pi_cal, the distribution the token was drawn from
    (Eq. 5), so the ratio pi_theta / pi_cal is off-policy from the first step and the clip binds
    where the correction is unlikely under the policy (what Sec. 4.2's PPL gate guards against).
  """
  C.check_choice("intervened_old_logp", intervened_old_logp, INTERVENED_OLD_LOGP)
  sizes = {len(g) for g in groups}
  if len(sizes) != 1 or 0 in sizes:
    raise ValueError(f"groups: expected equal, non-zero group sizes, got {sorted(sizes)}")
  trajs = [t for g in groups for t in g]
  longest = max(len(t.token_ids) for t in trajs)
  T = longest if max_len is None else min(longest, max_len)
  T = -(-T // pad_multiple) * pad_multiple
  B = len(trajs)
  ids = np.full((B, T), pad_id, np.int32)
  attn = np.zeros((B, T), np.int32)
  fields = {k: np.zeros((B, T), np.float32) for k in ("old_logp", "roll_logp", "cal_logp")}
  loss_mask = np.zeros((B, T), np.int32)
  iv = np.zeros((B, T), np.int32)
  for b, t in enumerate(trajs):
    a = t.arrays()
    n = min(len(a["token_ids"]), T)
    ids[b, :n] = a["token_ids"][:n]
    attn[b, :n] = 1
    loss_mask[b, :n] = a["loss_mask"][:n]
    iv[b, :n] = a["intervened_mask"][:n] & a["loss_mask"][:n]
    fields["old_logp"][b, :n] = a["behaviour_logp"][:n]
    if intervened_old_logp == "cal":
      fields["old_logp"][b, :n] = np.where(iv[b, :n], a["cal_logp"][:n], fields["old_logp"][b, :n])
    fields["roll_logp"][b, :n] = a["roll_logp"][:n]
    fields["cal_logp"][b, :n] = a["cal_logp"][:n] if reweight else a["roll_logp"][:n]
  rewards = np.asarray([t.reward for t in trajs], np.float32)
  adv = core.group_advantages(jnp.asarray(rewards), len(groups[0]), std=advantage_std)
  return RTIBatch(
    input_ids=jnp.asarray(ids),
    attention_mask=jnp.asarray(attn),
    loss_mask=jnp.asarray(loss_mask),
    old_logp=jnp.asarray(fields["old_logp"]),
    advantages=adv,
    roll_logp=jnp.asarray(fields["roll_logp"]),
    cal_logp=jnp.asarray(fields["cal_logp"]),
    intervened_mask=jnp.asarray(iv),
  ).check()


def without_empty_intervention(batch: RTIBatch) -> RTIBatch:
  """``batch`` without its intervention fields (``roll_logp``, ``cal_logp``, ``intervened_mask``)
  when no loss token of it is intervened; otherwise ``batch`` itself.

  Eq. 7 without a Corrector-written token is the GRPO objective, and ``LOSSES["rti"]`` of a batch
  without these fields is ``LOSSES["grpo"]``: the same traced program. So an RTI update whose
  interventions were all rejected (delta = 0) is GRPO's update exactly, not up to the rounding of
  another program, and GRPO and RTI trainers can share compiled programs."""
  if batch.intervened_mask is None:
    return batch
  if np.any((np.asarray(batch.intervened_mask) != 0) & (np.asarray(batch.loss_mask) != 0)):
    return batch
  return dataclasses.replace(batch, roll_logp=None, cal_logp=None, intervened_mask=None)


def length_chunks(batch: RTIBatch, n: int, bucket: Callable[[int], int]) -> list[RTIBatch]:
  """``batch``'s rows sorted by length (real tokens) and split into ``n`` equal-size chunks, each
  cut and padded to ``bucket(its longest row)``; ``n = 1`` gives the whole batch padded to
  ``bucket(longest row)``. Rows keep their advantages, so any row order gives the same loss."""
  b = batch.input_ids.shape[0]
  if n < 1 or b % n:
    raise ValueError(f"length_chunks: expected a chunk count dividing the batch size {b}, got {n}")
  lengths = np.asarray(batch.attention_mask).sum(axis=1)
  order = np.argsort(lengths, kind="stable") if n > 1 else np.arange(b)
  out = []
  for rows in np.split(order, n):
    t = bucket(int(lengths[rows].max()))

    def take(x: Any, rows: np.ndarray = rows, t: int = t) -> Any:
      if x is None:
        return None
      x = np.asarray(x)[rows]
      return x[:, :t] if x.ndim == 2 else x

    chunk = RTIBatch(**{f.name: take(getattr(batch, f.name)) for f in dataclasses.fields(batch)
                        if f.name != "trained_positions"})
    if batch.trained_positions is not None:
      chunk = with_trained_positions(chunk)
    out.append(_pad_batch(chunk, t))
  return out


def combine_chunk_metrics(metrics: Sequence[dict[str, Any]]) -> dict[str, float]:
  """Metrics of length chunks as those of the whole batch: token counts summed, ``cal_weight_mean``
  and ``clip_frac_intervened`` weighted by intervened tokens, ``clip_frac_on_policy`` by on-policy
  tokens, every other metric by ``num_tokens`` (token means)."""
  ms = [{k: float(v) for k, v in m.items()} for m in metrics]
  out: dict[str, float] = {}
  weight_of = {"cal_weight_mean": "intervened_tokens", "clip_frac_intervened": "intervened_tokens",
               "clip_frac_on_policy": "on_policy_tokens"}
  for key in ms[0]:
    if key in ("num_tokens", "intervened_tokens", "on_policy_tokens"):
      out[key] = sum(m[key] for m in ms)
      continue
    wkey = weight_of.get(key, "num_tokens")
    w = np.asarray([m.get(wkey, 1.0) for m in ms])
    vals = np.asarray([m[key] for m in ms])
    out[key] = float((w * vals).sum() / w.sum()) if w.sum() > 0 else float(vals.mean())
  return out


def _pad_batch(batch: RTIBatch, length: int) -> RTIBatch:
  """Right-pads every [B, T] field of ``batch`` to ``length`` (padding is masked out)."""
  t = batch.input_ids.shape[1]
  if t == length:
    return batch
  if t > length:
    raise ValueError(f"batch: length {t} exceeds the bucket {length}")

  def pad(x: Any) -> Any:
    if x is None or x.ndim != 2:
      return x
    return jnp.pad(x, ((0, 0), (0, length - t)))

  return RTIBatch(**{f.name: getattr(batch, f.name) if f.name == "trained_positions" else pad(getattr(batch, f.name))
                     for f in dataclasses.fields(batch)})


def trained_width(count: int, length: int) -> int:
  """The slots W of ``trained_positions`` for at most ``count`` trained tokens a row in a batch of
  ``length``: the next multiple of ``length // 4`` (at least 1), at most ``length``; so a bucketed
  length gives at most 4 widths (distinct compiled programs: fewer compiles outweigh the padded
  positions in a CPU run, docs/benchmarks.md)."""
  step = max(length // 4, 1)
  return min(length, max(step, -(-int(count) // step) * step))


def with_trained_positions(batch: RTIBatch) -> RTIBatch:
  """``batch`` with ``trained_positions``: each row's positions t >= 1 with ``loss_mask != 0``, in
  order, 0-padded to ``trained_width`` of the largest count (a host-side step, like the chunking).
  Position 0 is never a prediction (its log-prob is 0 by convention), so it is left out."""
  mask = np.asarray(batch.loss_mask) != 0
  mask[:, 0] = False
  width = trained_width(int(mask.sum(axis=1).max(initial=0)), mask.shape[1])
  first = np.argsort(~mask, axis=1, kind="stable")[:, :width]  # each row's trained positions first, in order
  pos = np.where(np.take_along_axis(mask, first, axis=1), first, 0).astype(np.int32)
  return dataclasses.replace(batch, trained_positions=pos)
