"""SGLang's native ``/generate`` API as data: our sampling settings in its terms, and its answers
checked field by field (types, finite log-probs <= 0, non-negative integer token ids, lengths)
before they become ``Completion``s. ``SGLangProtocolError`` names the URL and the field.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from rti_jax.generation.base import Completion, SamplingParams
from rti_jax.generation.http_json import BackendUnavailableError, ServerProtocolError

__all__ = ["BackendUnavailableError", "SGLangProtocolError", "parse_generate_item", "sampling_params_to_sglang"]


class SGLangProtocolError(ServerProtocolError):
  """The server answered, but not with what the native API promises."""


def sampling_params_to_sglang(params: SamplingParams, seed: int | None = None) -> dict[str, Any]:
  """Maps our ``SamplingParams`` onto SGLang's ``sampling_params`` dict.

  ``top_k == 0`` (off) becomes SGLang's ``-1``; ``temperature == 0`` is greedy in
  both. Special tokens are kept in the output so tool-call and think tags survive.
  ``seed`` is sent as ``sampling_seed`` only when given (older servers reject it).
  """
  out: dict[str, Any] = {
    "max_new_tokens": int(params.max_new_tokens),
    "temperature": float(params.temperature),
    "top_p": float(params.top_p),
    "top_k": int(params.top_k) if params.top_k > 0 else -1,
    "skip_special_tokens": False,
    "no_stop_trim": True,
  }
  if params.stop_token_ids:
    out["stop_token_ids"] = [int(t) for t in params.stop_token_ids]
  if seed is not None:
    out["sampling_seed"] = int(seed)
  return out


#: log-probs above this are impossible (beyond float32 rounding of log 1 = 0)
_MAX_LOGPROB = 1e-4


def _triples(meta: dict[str, Any], key: str, url: str) -> list[Sequence[Any]]:
  """``meta_info[key]`` checked as a list of ``[logprob, token_id, ...]`` entries."""
  value = meta.get(key)
  if not isinstance(value, list):
    raise SGLangProtocolError(
      f"{url}: meta_info.{key} must be a list of [logprob, token_id, text], got {type(value).__name__}"
    )
  for j, t in enumerate(value):
    if not isinstance(t, (list, tuple)) or len(t) < 2:
      raise SGLangProtocolError(f"{url}: meta_info.{key}[{j}] must be [logprob, token_id, text], got {t!r:.80}")
    token = t[1]
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
      raise SGLangProtocolError(f"{url}: meta_info.{key}[{j}] token id must be an integer >= 0, got {token!r:.80}")
  return value


def _logprob(value: Any, field: str, url: str) -> float:
  """One reported log-prob, checked: a finite number <= 0."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
      or value > _MAX_LOGPROB:
    raise SGLangProtocolError(f"{url}: {field} must be a finite log-prob <= 0, got {value!r:.80}")
  return min(float(value), 0.0)


def parse_generate_item(item: Any, url: str, max_new_tokens: int | None = None) -> Completion:
  """Turns one ``/generate`` answer item into a ``Completion`` (checked; ``SGLangProtocolError``
  names the field).

  Token ids are taken from ``meta_info.output_token_logprobs`` (so ids and
  log-probs always line up); ``output_ids``, when present, must agree. With
  ``max_new_tokens``, a longer completion is refused.
  """
  if not isinstance(item, dict):
    raise SGLangProtocolError(f"{url}: answer item must be a JSON object, got {type(item).__name__}")
  meta = item.get("meta_info")
  if not isinstance(meta, dict):
    raise SGLangProtocolError(f"{url}: answer item has no meta_info dict (keys: {sorted(item)})")
  triples = _triples(meta, "output_token_logprobs", url)
  if max_new_tokens is not None and len(triples) > max_new_tokens:
    raise SGLangProtocolError(f"{url}: meta_info.output_token_logprobs has {len(triples)} tokens, more than "
                              f"max_new_tokens={max_new_tokens}")
  if any(t[1] > np.iinfo(np.int32).max for t in triples):
    raise SGLangProtocolError(f"{url}: meta_info.output_token_logprobs holds a token id beyond int32")
  ids = np.asarray([int(t[1]) for t in triples], dtype=np.int32)
  lps = [t[0] for t in triples]
  if any(lp is None for lp in lps):
    raise SGLangProtocolError(f"{url}: meta_info.output_token_logprobs holds a null log-prob")
  logprobs = np.asarray([_logprob(lp, f"meta_info.output_token_logprobs[{j}][0]", url) for j, lp in enumerate(lps)],
                        dtype=np.float32)
  output_ids = item.get("output_ids")
  if output_ids is not None and (not isinstance(output_ids, list) or output_ids != ids.tolist()):
    raise SGLangProtocolError(
      f"{url}: output_ids ({len(output_ids)} ids) disagree with output_token_logprobs ({len(ids)} ids)"
    )
  reason = meta.get("finish_reason")
  kind = reason.get("type") if isinstance(reason, dict) else reason
  if kind not in ("stop", "length"):
    # "abort" or unknown: the completion is unusable as a finished turn.
    raise SGLangProtocolError(f"{url}: meta_info.finish_reason must be 'stop' or 'length', got {reason!r}")
  return Completion(token_ids=ids, logprobs=logprobs, finish_reason=kind)


def _aborted(item: Any) -> bool:
  meta = item.get("meta_info") if isinstance(item, dict) else None
  reason = meta.get("finish_reason") if isinstance(meta, dict) else None
  return (reason.get("type") if isinstance(reason, dict) else reason) == "abort"
