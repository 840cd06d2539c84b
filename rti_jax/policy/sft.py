"""Supervised fine-tuning of the tiny Qwen3 policy (loss on assistant tokens only).

The loss is the mean next-token cross-entropy over trained tokens::

    loss = - sum_{b,t} m[b, t+1] * log p(x[b, t+1] | x[b, :t+1]) / sum_{b,t} m[b, t+1]

with ``x: [B, T]`` the ids and ``m: [B, T]`` the loss mask (True on assistant tokens
the example trains). Batches are built from length-sorted buckets (little padding);
the schedule is linear warm-up then cosine decay (optax); everything is fixed by one seed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from models.config import QwenConfig
from models.qwen import Qwen
from rti_jax import jit_maps
from rti_jax.policy.sft_example import SFTExample


def tiny_qwen3_config(vocab_size: int, *, hidden_size: int = 128, num_layers: int = 3, num_heads: int = 2,
                      num_kv_heads: int = 1, head_dim: int = 32, intermediate_size: int = 256,
                      max_position_embeddings: int = 4096, pad_token_id: int = 0, eos_token_id: int = 0) -> QwenConfig:
  """A Qwen3 config (qk-norm, GQA, SwiGLU, RoPE, tied embeddings) of about 0.5M params.

  vocab_size is rounded up to a multiple of 64 (extra rows are never produced by the tokenizer).
  """
  if vocab_size < 1:
    raise ValueError(f"vocab_size: expected >= 1, got {vocab_size}")
  return QwenConfig(
    model_type="qwen3", vocab_size=-(-int(vocab_size) // 64) * 64, hidden_size=hidden_size,
    intermediate_size=intermediate_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
    head_dim=head_dim, rope_theta=10000.0, tie_word_embeddings=True,
    max_position_embeddings=max_position_embeddings,
    hf_extra=(("bos_token_id", None), ("eos_token_id", int(eos_token_id)), ("pad_token_id", int(pad_token_id))))


def scale_embeddings(model: Qwen, embed_std: float, final_norm: float, seed: int = 1) -> None:
  """Re-initialises the (tied) token embeddings with standard deviation ``embed_std`` and sets the
  final RMSNorm weight to ``final_norm`` (init only).

  With the default 0.02 a rare token (one place's name or coordinate) is a small vector that the
  residual stream drowns, and copying it out of the context is learned only after a long plateau.
  Large embeddings (``embed_std`` ~1) keep every token distinct from the first step; a small final
  norm weight keeps the initial logits (``norm(h) . E``, tied) as small as before
  (docs/tiny_policy.md).
  """
  emb = model.embed.embedding
  emb.set_value(jax.random.normal(jax.random.key(seed), emb.shape, emb.dtype) * embed_std)
  model.norm.scale.set_value(jnp.full(model.norm.scale.shape, final_norm, model.norm.scale.dtype))


def add_type_direction(model: Qwen, token_ids: Sequence[int], scale: float, seed: int = 8) -> None:
  """Adds ``scale`` times one shared random unit direction to the (tied) embedding of every
  token in ``token_ids`` (init only): a type feature ("this token is a place name").

  With large random embeddings (``scale_embeddings``) a whole-name token carries nothing that
  says it is a name, and attention cannot pick "the place names of the request" out of the
  context by a linear query; the shared direction makes that one query (the first-turn name
  drill, ``experiments/diagnostics/name_drill.py --type-init``, compares; docs/tiny_policy.md).
  """
  ids = np.asarray(sorted({int(i) for i in token_ids}), np.int64)
  if ids.size == 0 or scale == 0.0:
    return
  emb = model.embed.embedding
  if ids.min() < 0 or ids.max() >= emb.shape[0]:
    raise ValueError(f"token_ids: expected ids in [0, {emb.shape[0]}), got {ids.min()}..{ids.max()}")
  u = np.random.default_rng(seed).normal(size=emb.shape[1])
  row = jnp.asarray(scale * u / np.linalg.norm(u), emb.dtype)
  emb.set_value(emb[...].at[jnp.asarray(ids)].add(row[None, :]))


def grow_vocabulary(model: Qwen, num_tokens: int, like: dict[int, Sequence[int]], seed: int = 12) -> Qwen:
  """A copy of ``model`` (tied embeddings) with room for ``num_tokens`` token ids (rounded up to a
  multiple of 64, as ``tiny_qwen3_config``); every other weight is the same, and ``model`` is left
  unchanged.

  ``like`` maps each new id to existing ids it should resemble (place names to place names,
  coordinates to coordinates): its row is their mean plus per-dimension Gaussian noise of their
  spread, so a new name carries the shared name direction (``add_type_direction``) and the
  magnitude of the rows the policy learned to copy. Rows not in ``like`` stay at zero (the padding
  rows past the tokenizer). For ``add_whole_pretokens``'s new tokens.
  """
  cfg = model.config
  if not cfg.tie_word_embeddings:
    raise ValueError("grow_vocabulary: expected a model with tied embeddings")
  old = model.embed.embedding[...]
  size = max(-(-int(num_tokens) // 64) * 64, old.shape[0])
  if any(not 0 <= i < old.shape[0] for ids in like.values() for i in ids) or any(not ids for ids in like.values()):
    raise ValueError(f"like: expected non-empty lists of existing ids in [0, {old.shape[0]})")
  if any(not 0 <= i < size for i in like):
    raise ValueError(f"like: expected new ids in [0, {size})")
  rng = np.random.default_rng(seed)
  host = np.asarray(old)
  grown = np.zeros((size, host.shape[1]), host.dtype)
  grown[: host.shape[0]] = host
  for i, ids in sorted(like.items()):
    rows = host[np.asarray(sorted(set(ids)), np.int64)]
    grown[i] = rows.mean(0) + rows.std(0) * rng.normal(size=host.shape[1])
  new = Qwen(dataclasses.replace(cfg, vocab_size=size), dtype=model.dtype, precision=model.precision,
             param_dtype=old.dtype, rngs=nnx.Rngs(seed))
  nnx.update(new, nnx.state(model, nnx.Param))  # the values; ``model``'s own variables stay as they are
  new.embed.embedding.set_value(jnp.asarray(grown))
  return new


def sharpen_qk_norm(model: Qwen, scale: float) -> None:
  """Sets every q/k RMSNorm weight to ``scale`` (init only; Qwen3 initialises them to 1).

  With qk-norm the attention logit q.k/sqrt(d) is bounded by about ``scale**2 * sqrt(d)``;
  a larger start lets a tiny model attend sharply to one earlier token (copying a name or a
  coordinate out of a long context) from the first steps instead of after the norm weights
  have slowly grown. Too large a start saturates the softmax: every head of the tiny Navigation
  policy can lock onto one format token and never learn to read the request's names, so the
  build's default is 1.4, not 2.0 (``model.qk_norm_init``; docs/tiny_policy.md).
  """
  for layer in model.layers:
    for norm in (layer.attn.q_norm, layer.attn.k_norm):
      norm.scale.set_value(jnp.full(norm.scale.shape, scale, norm.scale.dtype))


def copy_task_examples(token_ids: Sequence[int], num: int, length: int = 12, seed: int = 0) -> list[SFTExample]:
  """Synthetic copy sequences ``[a_1..a_n, a_1..a_n]`` of random ``token_ids`` (trained on
  the repeat). A few hundred steps on them install copy (induction) heads, which the
  Navigation data alone (few copied tokens among long contexts) does not grow quickly.
  """
  rng = np.random.default_rng(seed)
  pool = np.asarray(list(token_ids), np.int32)
  out = []
  for _ in range(num):
    seq = [int(x) for x in rng.choice(pool, size=length)]
    out.append(SFTExample("copy", "plain", tuple(seq + seq), tuple([False] * length + [True] * length)))
  return out


def count_params(model: nnx.Module) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """SFT settings. tokens_per_batch: the padded token budget of one batch (rows x length).
  frozen_token_ids: (tied) embedding rows kept at their values from the start of ``train``
  (``freeze_rows``)."""

  epochs: float = 3.0
  tokens_per_batch: int = 8192
  lr: float = 3e-3
  warmup_steps: int = 30
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  seed: int = 0
  len_multiple: int = 256
  max_len: int = 2048
  frozen_token_ids: tuple[int, ...] = ()

  def __post_init__(self) -> None:
    if self.epochs <= 0:
      raise ValueError(f"epochs: expected > 0, got {self.epochs}")
    if self.tokens_per_batch < self.max_len:
      raise ValueError(f"tokens_per_batch: expected >= max_len={self.max_len}, got {self.tokens_per_batch}")


def common_prefix_len(examples: Sequence[SFTExample]) -> int:
  """The length of the longest token prefix shared by all examples that no example trains
  (the system turn), less one so every example keeps at least one prefix-free token."""
  if not examples:
    return 0
  first = examples[0].token_ids
  n = min(len(e.token_ids) for e in examples) - 1
  for e in examples[1:]:
    ids = e.token_ids
    k = 0
    while k < n and ids[k] == first[k]:
      k += 1
    n = k
  for e in examples:
    if any(e.loss_mask[:n]):
      n = min(n, e.loss_mask.index(True))
  return max(n, 0)


def make_batches(examples: Sequence[SFTExample], cfg: SFTConfig, rng: np.random.Generator, pad_id: int,
                 prefix_len: int = 0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """One epoch of batches of the examples' suffixes after ``prefix_len`` tokens:
  ``(ids [B, T] int32, attn [B, T] int32, mask [B, T] float32)``.

  Examples are shuffled, grouped by suffix length (T = a multiple of ``len_multiple``), and
  each group is cut into batches of ``tokens_per_batch // (prefix_len + T)`` rows; batch
  order is shuffled. Filler rows have an all-zero mask. Suffixes longer than ``max_len`` are cut.
  """
  order = rng.permutation(len(examples))
  by_len: dict[int, list[int]] = {}
  for i in order:
    n = min(len(examples[i].token_ids) - prefix_len, cfg.max_len)
    t = -(-n // cfg.len_multiple) * cfg.len_multiple
    by_len.setdefault(t, []).append(int(i))
  batches = []
  for t, idx in sorted(by_len.items()):
    rows = max(1, cfg.tokens_per_batch // (t + prefix_len))
    for s in range(0, len(idx), rows):
      chunk = idx[s:s + rows]
      ids = np.full((rows, t), pad_id, np.int32)
      attn = np.zeros((rows, t), np.int32)
      mask = np.zeros((rows, t), np.float32)
      for r, i in enumerate(chunk):
        e = examples[i]
        n = min(len(e.token_ids) - prefix_len, t)
        ids[r, :n] = e.token_ids[prefix_len:prefix_len + n]
        attn[r, :n] = 1
        mask[r, :n] = e.loss_mask[prefix_len:prefix_len + n]
      batches.append((ids, attn, mask))
  perm = rng.permutation(len(batches))
  return [batches[i] for i in perm]


def for_steps(cfg: SFTConfig, examples: Sequence[SFTExample], pad_id: int, steps: int) -> SFTConfig:
  """``cfg`` with ``epochs`` set so that ``train`` on ``examples`` makes ``steps`` steps (a share of
  an epoch's batches, or several epochs)."""
  per_epoch = len(make_batches(examples, cfg, np.random.default_rng(0), pad_id, common_prefix_len(examples)))
  return dataclasses.replace(cfg, epochs=steps / per_epoch)


def shared_prefix_logits(model: Qwen, prefix: jax.Array, ids: jax.Array, attn: jax.Array) -> jax.Array:
  """Logits ``[B, T, V]`` of the suffixes ``ids: [B, T]`` (right padded, ``attn: [B, T]``)
  that all follow the same ``prefix: [P]``; equal to the logits of a full forward pass
  over ``prefix + ids[b]`` at the suffix positions, with the prefix computed once."""
  p, (b, t) = prefix.shape[0], ids.shape
  if p == 0:
    return model(ids, attn)
  cache = model.init_cache(1, p + t)
  keys = jnp.arange(p + t)
  mask_p = (keys[None, :] <= jnp.arange(p)[:, None])[None]  # [1, P, P+T]
  _, cache = model.forward(prefix[None], jnp.arange(p)[None], mask_p, cache, 0)
  cache = [type(c)(jnp.broadcast_to(c.k, (b,) + c.k.shape[1:]), jnp.broadcast_to(c.v, (b,) + c.v.shape[1:]))
           for c in cache]
  real = jnp.concatenate([jnp.ones((b, p), bool), attn.astype(bool)], axis=1)  # [B, P+T]
  causal = keys[None, :] <= (p + jnp.arange(t))[:, None]  # [T, P+T]
  mask_s = causal[None] & real[:, None, :]
  pos = jnp.broadcast_to(p + jnp.arange(t)[None], (b, t))
  h, _ = model.forward(ids, pos, mask_s, cache, p)
  return model.logits(h)


def masked_nll(logits: jax.Array, ids: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Summed next-token NLL over trained positions and their count.

  logits: [B, T, V] fp32; ids: [B, T]; mask: [B, T] (1 where token t is trained).
  Position t predicts token t+1, weighted by mask[:, t+1].
  """
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  tgt = ids[:, 1:]
  nll = -jnp.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]
  m = mask[:, 1:].astype(jnp.float32)
  return jnp.sum(nll * m), jnp.sum(m)


def make_tx(cfg: SFTConfig, total_steps: int) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW (no decay on norm scales) on warm-up + cosine decay."""
  sched = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, max(1, min(cfg.warmup_steps, total_steps // 2)),
                                             max(2, total_steps), end_value=cfg.lr * 0.05)
  decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)  # no decay on norm scales  # noqa: E731
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                     optax.adamw(sched, b1=0.9, b2=0.98, weight_decay=cfg.weight_decay, mask=decay_mask))


def make_optimizer(model: Qwen, cfg: SFTConfig, total_steps: int) -> nnx.Optimizer:
  return nnx.Optimizer(model, make_tx(cfg, total_steps), wrt=nnx.Param)


@nnx.jit
def train_step(model: Qwen, optimizer: nnx.Optimizer, prefix: jax.Array, ids: jax.Array, attn: jax.Array,
               mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One AdamW step on the mean NLL of the batch (suffixes ``ids: [B, T]`` after the shared
  ``prefix: [P]``); returns (mean loss, trained-token count)."""

  def loss_fn(m: Qwen) -> tuple[jax.Array, jax.Array]:
    total, n = masked_nll(shared_prefix_logits(m, prefix, ids, attn), ids, mask)
    return total / jnp.maximum(n, 1.0), n

  (loss, n), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)
  return loss, n


@nnx.jit
def eval_step(model: Qwen, prefix: jax.Array, ids: jax.Array, attn: jax.Array, mask: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
  return masked_nll(shared_prefix_logits(model, prefix, ids, attn), ids, mask)


@nnx.jit
def _argmax_hits(model: Qwen, prefix: jax.Array, ids: jax.Array, attn: jax.Array, mask: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
  """Per row: trained tokens whose argmax prediction is right, and trained tokens ([B] each)."""
  logits = shared_prefix_logits(model, prefix, ids, attn)
  hit = (jnp.argmax(logits[:, :-1], axis=-1) == ids[:, 1:]).astype(jnp.float32)
  m = mask[:, 1:].astype(jnp.float32)
  return jnp.sum(hit * m, axis=1), jnp.sum(m, axis=1)


def turn_accuracy(model: Qwen, examples: Sequence[SFTExample], pad_id: int, tokens_per_batch: int = 4096
                  ) -> dict[str, float]:
  """Teacher-forced greedy accuracy over the trained tokens of ``examples``: ``tokens`` (share of
  trained tokens predicted right), ``exact`` (share of examples with every trained token right)."""
  if not examples:
    raise ValueError("examples: expected at least one example, got 0")
  longest = max(len(e.token_ids) for e in examples)
  cfg = SFTConfig(tokens_per_batch=max(tokens_per_batch, longest), max_len=longest, len_multiple=32)
  p = common_prefix_len(examples)
  prefix = jnp.asarray(examples[0].token_ids[:p], jnp.int32)
  hits = total = exact = rows = 0.0
  for ids, attn, mask in make_batches(examples, cfg, np.random.default_rng(0), pad_id, p):
    h, n = (np.asarray(x) for x in _argmax_hits(model, prefix, jnp.asarray(ids), jnp.asarray(attn), jnp.asarray(mask)))
    real = attn.sum(axis=1) > 0
    hits, total = hits + float(h[real].sum()), total + float(n[real].sum())
    exact, rows = exact + float(np.sum((h == n)[real])), rows + float(real.sum())
  return {"tokens": hits / max(total, 1.0), "exact": exact / max(rows, 1.0)}


def evaluate_loss(model: Qwen, examples: Sequence[SFTExample], cfg: SFTConfig, pad_id: int) -> float:
  """Mean NLL per trained token over ``examples`` (no update)."""
  tot, cnt = 0.0, 0.0
  p = common_prefix_len(examples)
  prefix = jnp.asarray(examples[0].token_ids[:p], jnp.int32)
  for ids, attn, mask in make_batches(examples, cfg, np.random.default_rng(0), pad_id, p):
    s, n = eval_step(model, prefix, jnp.asarray(ids), jnp.asarray(attn), jnp.asarray(mask))
    tot, cnt = tot + float(s), cnt + float(n)
  return tot / max(cnt, 1.0)


def freeze_rows(model: Qwen, token_ids: Sequence[int]) -> Callable[[], None]:
  """A function that resets the embedding rows of ``token_ids`` to their current values.

  Called after every update it keeps those rows exactly as they are now (AdamW's weight decay
  included). Used by ``experiments/diagnostics/name_drill.py --freeze-names`` to test whether fixed
  name embeddings let the tiny model copy names generically (through the tied embeddings) instead
  of learning each name as an output (docs/tiny_policy.md).
  """
  ids = np.asarray(sorted({int(i) for i in token_ids}), np.int64)
  emb = model.embed.embedding
  if ids.size and (ids.min() < 0 or ids.max() >= emb.shape[0]):
    raise ValueError(f"token_ids: expected ids in [0, {emb.shape[0]}), got {ids.min()}..{ids.max()}")
  if ids.size == 0:
    return lambda: None
  idx = jnp.asarray(ids)
  rows = emb[...][idx]

  def restore() -> None:
    emb.set_value(emb[...].at[idx].set(rows))

  return restore


@dataclasses.dataclass
class SFTResult:
  """losses[i]: mean NLL of step i's batch; steps, wall seconds, trained tokens seen."""

  losses: list[float]
  steps: int
  wall_s: float
  tokens_trained: int


def train(model: Qwen, examples: Sequence[SFTExample], cfg: SFTConfig, pad_id: int,
          log: Callable[[str], None] | None = None, log_every: int = 20,
          stop: Callable[[int], bool] | None = None, check_every: int = 200) -> SFTResult:
  """Runs SFT in place on ``model``; deterministic for ``cfg.seed`` and the example order.

  stop: called with the number of steps done every ``check_every`` steps; training ends early
    (the learning-rate schedule keeps the planned length) when it returns True.
  """
  if not examples:
    raise ValueError("examples: expected at least one SFT example, got 0")
  rng = np.random.default_rng(cfg.seed)
  p = common_prefix_len(examples)
  prefix = jnp.asarray(examples[0].token_ids[:p], jnp.int32)
  n_epochs = int(np.ceil(cfg.epochs))
  epochs = [make_batches(examples, cfg, rng, pad_id, p) for _ in range(n_epochs)]
  per_epoch = len(epochs[0])
  total = max(1, int(round(cfg.epochs * per_epoch)))
  plan = [b for ep in epochs for b in ep][:total]
  optimizer = make_optimizer(model, cfg, total)
  restore = freeze_rows(model, cfg.frozen_token_ids)
  losses: list[float] = []
  tokens = 0
  t0 = time.time()
  for step, (ids, attn, mask) in enumerate(plan):
    loss, n = train_step(model, optimizer, prefix, jnp.asarray(ids), jnp.asarray(attn), jnp.asarray(mask))
    restore()
    losses.append(float(loss))
    tokens += int(n)
    if log is not None and (step % log_every == 0 or step == total - 1):
      log(f"step {step + 1}/{total} loss {losses[-1]:.4f} ({time.time() - t0:.0f}s)")
    if stop is not None and (step + 1) % check_every == 0 and step + 1 < total and stop(step + 1):
      break
    if step % 10 == 9:  # many length buckets compile many programs: stay under the kernel's mapping limit
      jit_maps.relieve(log=log)
  return SFTResult(losses=losses, steps=len(losses), wall_s=time.time() - t0, tokens_trained=tokens)


def new_tiny_policy(tokenizer: Any, model: Any, max_len: int, seed: int) -> tuple[Any, QwenConfig]:
  """A fresh tiny Qwen3 for ``tokenizer`` from a ``build_config.TinyQwenConfig`` ``model`` (one kv
  head, MLP 2 x hidden), positions for ``max_len`` tokens rounded up to 1024 (at least 4096), its q/k
  norms sharpened and embeddings scaled as the config says: (model, its config)."""
  from models.qwen import Qwen
  from rti_jax.policy.tokenizer import END_OF_TURN, PAD_TOKEN

  pad_id, eos_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN), tokenizer.convert_tokens_to_ids(END_OF_TURN)
  mcfg = tiny_qwen3_config(len(tokenizer), hidden_size=model.hidden, num_layers=model.layers, num_heads=model.heads,
                           num_kv_heads=1, head_dim=model.head_dim, intermediate_size=2 * model.hidden,
                           max_position_embeddings=max(4096, -(-max_len // 1024) * 1024), pad_token_id=pad_id,
                           eos_token_id=eos_id)
  policy = Qwen(mcfg, rngs=nnx.Rngs(seed))
  sharpen_qk_norm(policy, model.qk_norm_init)
  scale_embeddings(policy, model.embed_std, model.final_norm_init, seed=seed + 1)
  return policy, mcfg
