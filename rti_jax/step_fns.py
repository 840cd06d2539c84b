"""The body of ``rti_jax.sharding.make_train_step``: loss, gradients and the optax update, and the
memory model of that step.

``MemoryModel`` holds what decides the step's peak memory besides the mesh: each decoder layer's
rematerialisation policy, whether the token log-probs come from the hidden states a vocabulary chunk
at a time (``models.qwen.Qwen.token_logprobs``: no [B, T, V] logits), and the micro-batch size (from
a tokens-per-device budget, or a fixed count). Micro-batches run in a ``lax.scan`` whose carry is
the running sum of the numerator gradients (in the parameters' dtype), numerators and denominators,
so only one micro-batch's activations and one gradient tree beside the sum are live.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from models.axes import LOGICAL_AXIS_RULES, Rules, _axes_size, activation_sharding
from rti_jax.objectives import LossConfig, RTIBatch, get_loss, next_token_logprobs


class StepOutput(NamedTuple):
  """loss: float32 scalar; grads: like params (before the optax update); metrics: dict of scalars."""

  loss: jax.Array
  grads: Any
  metrics: dict


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  """params: ``nnx.State`` of the model's ``nnx.Param`` variables; rest: its other state
  (read-only in the step); opt_state: the optax state."""

  params: Any
  rest: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class MemoryModel:
  """remat: ``models.qwen.REMAT_POLICIES`` key; vocab_chunk: None (full logits) or the ids per
  chunk; tokens_per_device: None (``micro_batches`` fixed micro-batches) or the budget;
  scan_layers: the decoder layers as one scan over a stacked view of their parameters."""

  remat: str = "none"
  vocab_chunk: int | None = None
  tokens_per_device: int | None = None
  micro_batches: int = 1
  scan_layers: bool = False

  @classmethod
  def of(cls, model: nnx.Module, logp_fn: Callable, **kw: Any) -> "MemoryModel":
    """Checks the settings against ``model`` (ValueError on a bad one)."""
    m = cls(**kw)
    from models.qwen import REMAT_POLICIES

    for name in ("vocab_chunk", "tokens_per_device"):
      val = getattr(m, name)
      if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
        raise ValueError(f"{name}: expected None or a positive int, got {val!r}")
    if m.remat not in REMAT_POLICIES:
      raise ValueError(f"remat: expected one of {sorted(REMAT_POLICIES)}, got {m.remat!r}")
    if (m.lean or m.vocab_chunk is not None) and not hasattr(model, "token_logprobs"):
      raise ValueError(f"remat / scan_layers / vocab_chunk: the model ({type(model).__name__}) has no token_logprobs / "
                       "hidden_states (models.qwen.Qwen has)")
    if m.vocab_chunk is not None and logp_fn is not next_token_logprobs:
      raise ValueError("vocab_chunk: the model computes the log-probs itself; logp_fn must be the default")
    if m.tokens_per_device is not None and m.micro_batches != 1:
      raise ValueError("tokens_per_device and micro_batches > 1: give one of them")
    return m

  @property
  def lean(self) -> bool:
    """Whether the forward pass differs from ``model(input_ids, attention_mask)``'s."""
    return self.remat != "none" or self.scan_layers or self.vocab_chunk is not None

  def count(self, rows: int, length: int, data_parallel: int) -> int:
    """Micro-batches for a batch of ``rows`` x ``length`` split over ``data_parallel`` devices: each
    device's rows cut into equal micro-batches of at most ``tokens_per_device // length`` rows (at
    least one)."""
    if self.tokens_per_device is None:
      return self.micro_batches
    per_device = max(1, rows // data_parallel)
    size = max(1, min(per_device, self.tokens_per_device // length))
    while per_device % size:
      size -= 1
    return per_device // size


_COUNTS = ("num_tokens", "intervened_tokens", "on_policy_tokens")
_WEIGHT_OF = {"cal_weight_mean": "intervened_tokens", "clip_frac_intervened": "intervened_tokens",
              "clip_frac_on_policy": "on_policy_tokens"}


def combine_micro_metrics(ms: dict) -> dict:
  """Metrics stacked over micro-batches ([k] each) as those of the whole batch, by the rule of
  ``rti_jax.objectives.combine_chunk_metrics``: token counts summed, ratios weighted by the tokens
  they are taken over (``num_tokens`` unless listed), a plain mean where the weights are all 0."""
  out = {}
  for key, vals in ms.items():
    weights = ms.get(_WEIGHT_OF.get(key, "num_tokens"))
    if key in _COUNTS:
      out[key] = jnp.sum(vals, axis=0)
    elif weights is None:
      out[key] = jnp.mean(vals, axis=0)
    else:
      total = jnp.sum(weights, axis=0)
      out[key] = jnp.where(total > 0, jnp.sum(weights * vals, axis=0) / jnp.where(total > 0, total, 1.0),
                           jnp.mean(vals, axis=0))
  return out


def jit_step_functions(graphdef: Any, tx: optax.GradientTransformation, mesh: Mesh, loss_cfg: LossConfig,
                       logp_fn: Callable, micro_batches: int, donate: bool, state_sh: TrainState,
                       b_sh: NamedSharding, logits_sh: NamedSharding, p_sh: Any, replicated: NamedSharding,
                       rules: Rules = LOGICAL_AXIS_RULES, memory: MemoryModel = MemoryModel(),
                       ) -> tuple[Callable, Callable, Callable]:
  """The jitted ``step``, ``grads`` and ``apply`` of ``make_train_step`` (see there)."""
  parts_of = get_loss(loss_cfg.name)
  dp = _axes_size(mesh, b_sh.spec[0] if b_sh.spec else None)
  temp = float(loss_cfg.logp_temperature)  # log-probs of logits / temp (objectives.LossConfig)

  def numerator(p: Any, rest_state: Any, batch: RTIBatch) -> tuple[jax.Array, tuple[jax.Array, dict]]:
    """Loss numerator (differentiated), with the denominator and metrics as aux."""
    batch.check()
    net = nnx.merge(graphdef, p, rest_state)
    if batch.trained_positions is not None:  # the log-probs at the trained positions alone
      from models.scoring import token_logprobs_at

      if not hasattr(net, "hidden_states") or logp_fn is not next_token_logprobs:
        raise ValueError("batch.trained_positions: needs a model with hidden_states (models.qwen.Qwen) and the "
                         "default logp_fn")
      with activation_sharding(mesh, rules):
        logp = token_logprobs_at(net, batch.input_ids, batch.attention_mask, batch.trained_positions,
                                 vocab_chunk=memory.vocab_chunk, remat=memory.remat, scan=memory.scan_layers,
                                 right_padded=True, temperature=temp)
      parts = parts_of(logp, batch, loss_cfg)
      return parts.numerator, (parts.denominator, parts.metrics)
    if memory.lean:
      kw = dict(remat=memory.remat, scan=memory.scan_layers, right_padded=True)  # RTIBatch rows are right padded
      with activation_sharding(mesh, rules):
        if memory.vocab_chunk is not None:
          logp = net.token_logprobs(batch.input_ids, batch.attention_mask, vocab_chunk=memory.vocab_chunk,
                                    temperature=temp, **kw)
        else:
          logits = net.logits(net.hidden_states(batch.input_ids, batch.attention_mask, **kw))
          logp = logp_fn(logits if temp == 1.0 else logits / temp, batch.input_ids)
      parts = parts_of(logp, batch, loss_cfg)
      return parts.numerator, (parts.denominator, parts.metrics)
    with activation_sharding(mesh, rules):  # the model's own activation constraints (models.qwen)
      logits = net(batch.input_ids, batch.attention_mask)
    if logits.ndim != 3 or tuple(logits.shape[:2]) != tuple(batch.input_ids.shape):
      raise ValueError(f"model(input_ids, attention_mask): expected logits [B, T, V] with "
                       f"[B, T]={tuple(batch.input_ids.shape)}, got {tuple(logits.shape)}")
    if logits.shape[-1] % _axes_size(mesh, logits_sh.spec[-1]) == 0:
      logits = jax.lax.with_sharding_constraint(logits, logits_sh)
    parts = parts_of(logp_fn(logits if temp == 1.0 else logits / temp, batch.input_ids), batch, loss_cfg)
    return parts.numerator, (parts.denominator, parts.metrics)

  grad_num = jax.value_and_grad(numerator, has_aux=True)

  def accumulate(state: TrainState, batch: RTIBatch) -> tuple[Any, jax.Array, jax.Array, dict]:
    """Numerator gradients, numerator, denominator and metrics of ``batch`` (over k micro-batches)."""
    b, t = batch.shape
    k = memory.count(b, t, dp)
    if k == 1:
      (num, (den, metrics)), g = grad_num(state.params, state.rest, batch)
    else:
      if b % k != 0:
        raise ValueError(f"batch.input_ids: expected a batch size divisible by micro_batches={k}, got B={b}")
      split = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(b // k, k, *x.shape[1:]), 0, 1), batch)

      def body(carry, mb):
        g_acc, num_acc, den_acc = carry
        (num, (den, m)), g = grad_num(state.params, state.rest, mb)
        return (jax.tree.map(jnp.add, g_acc, g), num_acc + num, den_acc + den), m

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      (g, num, den), ms = jax.lax.scan(body, (zeros, jnp.float32(0), jnp.float32(0)), split)
      if memory.tokens_per_device is None:
        metrics = jax.tree.map(lambda x: jnp.mean(x, axis=0), ms)
      else:  # the budget's micro-batches are an implementation detail: the whole batch's metrics
        metrics = combine_micro_metrics(ms)
    return g, num, den, metrics

  def step(state: TrainState, batch: RTIBatch) -> tuple[TrainState, StepOutput]:
    return finish(state, *accumulate(state, batch))

  def finish(state: TrainState, g: Any, num: jax.Array, den: jax.Array, metrics: dict,
             ) -> tuple[TrainState, StepOutput]:
    """Scales the summed numerator gradients by 1 / max(den, 1) and takes the optimizer step."""
    scale = 1.0 / jnp.maximum(den, 1.0)
    loss = num * scale
    # Gradients in each parameter's dtype: the fp32 loss scale would otherwise promote the
    # gradients of bf16 parameters, and with them the optimizer moments, to fp32 after the first
    # step, so the state would change dtype (a second compile, and donation could not reuse it).
    grads = jax.tree.map(lambda x, p: (x * scale).astype(p.dtype), g, state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # The global norm before clipping, inside the program: read eagerly off sharded gradients it
    # would be one small program per parameter (a collective each across processes).
    metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
    return TrainState(params, state.rest, opt_state), StepOutput(loss, grads, metrics)

  def apply(state: TrainState, g: Any, num: jax.Array, den: jax.Array) -> tuple[TrainState, StepOutput]:
    return finish(state, g, num, den, {})

  out_sh = (state_sh, StepOutput(replicated, p_sh, replicated))
  jitted = jax.jit(step, in_shardings=(state_sh, b_sh), out_shardings=out_sh,
                   donate_argnums=(0,) if donate else ())
  jit_grads = jax.jit(accumulate, in_shardings=(state_sh, b_sh),
                      out_shardings=(p_sh, replicated, replicated, replicated))
  jit_apply = jax.jit(apply, in_shardings=(state_sh, p_sh, replicated, replicated), out_shardings=out_sh,
                      donate_argnums=(0,) if donate else ())
  return jitted, jit_grads, jit_apply


@functools.partial(jax.jit, static_argnames=("graphdef", "vocab_chunk", "micro_batches", "scan", "temperature"))
def forward_logp(graphdef: Any, params: Any, rest: Any, ids: jax.Array, mask: jax.Array,
                 vocab_chunk: int | None = None, micro_batches: int = 1, scan: bool = False,
                 temperature: float = 1.0, positions: jax.Array | None = None) -> jax.Array:
  """Per-token log-probs [B, T] of ``ids`` under ``params``, of ``logits / temperature`` (the KL
  reference pass and the recomputed behaviour log-probs of ``rti_jax.trainer``; with vocab_chunk,
  from the hidden states a vocabulary chunk at a time; micro_batches > 1: rows ``j, j+k, ...`` at a
  time in a ``lax.map``, as the train step splits them; positions: [B, W], only there, 0 elsewhere,
  as ``RTIBatch.trained_positions``). Module-level, so trainers of the same architecture (GRPO then
  RTI in one run, or the next seed) share its compiles."""
  net = nnx.merge(graphdef, params, rest)

  def one(ids: jax.Array, mask: jax.Array, pos: jax.Array | None) -> jax.Array:
    if pos is not None:
      from models.scoring import token_logprobs_at

      return token_logprobs_at(net, ids, mask, pos, vocab_chunk=vocab_chunk, right_padded=True, scan=scan,
                               temperature=temperature)
    if vocab_chunk is not None:
      return net.token_logprobs(ids, mask, vocab_chunk=vocab_chunk, right_padded=True, scan=scan,
                                temperature=temperature)
    logits = net(ids, mask)
    return next_token_logprobs(logits if temperature == 1.0 else logits / temperature, ids)

  k, b = micro_batches, ids.shape[0]
  if k == 1 or b % k:
    return one(ids, mask, positions)
  split = lambda x: None if x is None else jnp.swapaxes(x.reshape(b // k, k, *x.shape[1:]), 0, 1)  # noqa: E731
  return jnp.swapaxes(jax.lax.map(lambda a: one(*a), (split(ids), split(mask), split(positions))), 0,
                      1).reshape(ids.shape)


@functools.partial(jax.jit, donate_argnums=(0,))
def tree_add(acc: Any, x: Any) -> Any:
  """acc + x leaf by leaf, into ``acc``'s buffers (the length chunks' running gradient sum)."""
  return jax.tree.map(jnp.add, acc, x)
