"""Trace-time argument checks shared by the objective functions.

Shapes and dtypes are static under ``jax.jit``, so every check here runs once per
trace and raises a ``ValueError`` that names the argument, the expected value and the
received one. Nothing here inspects traced values.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def as_array(name: str, x: Any) -> jax.Array:
  """``jnp.asarray(x)``, or a ValueError naming ``name`` when ``x`` is not array-like."""
  if x is None:
    raise ValueError(f"{name}: expected an array, got None")
  try:
    return jnp.asarray(x)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}: expected an array, got {type(x).__name__} ({e})") from None


def check_float(name: str, x: Any, ndims: Sequence[int]) -> jax.Array:
  """Checks a floating array of one of the ranks in ``ndims``; returns it as float32 or wider."""
  x = as_array(name, x)
  if x.ndim not in ndims:
    want = " or ".join(f"rank {d}" for d in ndims)
    raise ValueError(f"{name}: expected {want}, got shape {tuple(x.shape)} (rank {x.ndim})")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name}: expected a floating dtype, got {x.dtype}")
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def check_real(name: str, x: Any, ndims: Sequence[int]) -> jax.Array:
  """Like ``check_float`` but also accepts bool/integer arrays (cast to float32)."""
  x = as_array(name, x)
  if x.ndim not in ndims:
    want = " or ".join(f"rank {d}" for d in ndims)
    raise ValueError(f"{name}: expected {want}, got shape {tuple(x.shape)} (rank {x.ndim})")
  if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)
          or x.dtype == jnp.bool_):
    raise ValueError(f"{name}: expected a real (float, int or bool) dtype, got {x.dtype}")
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def check_mask(name: str, x: Any, shape: tuple[int, ...]) -> jax.Array:
  """Checks a 0/1 mask of exactly ``shape`` (bool, integer or float); returns it as bool (``x != 0``)."""
  x = as_array(name, x)
  if tuple(x.shape) != tuple(shape):
    raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
  if not (x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer)
          or jnp.issubdtype(x.dtype, jnp.floating)):
    raise ValueError(f"{name}: expected a bool, integer or float mask, got {x.dtype}")
  return x != 0


def check_same_shape(name: str, x: jax.Array, ref_name: str, ref: jax.Array) -> None:
  if tuple(x.shape) != tuple(ref.shape):
    raise ValueError(f"{name}: expected the shape of {ref_name} {tuple(ref.shape)}, got {tuple(x.shape)}")


def check_advantages(name: str, adv: Any, shape_bt: tuple[int, int]) -> jax.Array:
  """Advantages ``[B]`` (one per response) or ``[B, T]`` (per token); returns ``[B, T]``-broadcastable ``[B, 1]`` or ``[B, T]``."""
  adv = check_float(name, adv, (1, 2))
  b, t = shape_bt
  if adv.ndim == 1:
    if adv.shape[0] != b:
      raise ValueError(f"{name}: expected shape ({b},) or ({b}, {t}), got {tuple(adv.shape)}")
    return adv[:, None]
  if tuple(adv.shape) != (b, t):
    raise ValueError(f"{name}: expected shape ({b},) or ({b}, {t}), got {tuple(adv.shape)}")
  return adv


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
  if not isinstance(value, str) or value not in choices:
    raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
  return value


def _concrete(value: Any) -> float | None:
  """The Python float of ``value`` when it is concrete (not traced), else None."""
  if isinstance(value, jax.core.Tracer):
    return None
  try:
    arr = np.asarray(value)
  except Exception:  # noqa: BLE001 - anything non-numeric is reported by the caller
    return None
  if arr.shape != () or not np.issubdtype(arr.dtype, np.number):
    return None
  return float(arr)


def check_scalar(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, allow_inf: bool = False) -> None:
  """Checks a hyper-parameter that is a concrete scalar in a range; traced scalars pass unchecked."""
  if isinstance(value, jax.core.Tracer):
    return
  v = _concrete(value)
  if v is None:
    raise ValueError(f"{name}: expected a real scalar, got {value!r}")
  if math.isnan(v) or (math.isinf(v) and not allow_inf):
    raise ValueError(f"{name}: expected a finite number, got {v}")
  lo_ok = low is None or (v > low if low_open else v >= low)
  hi_ok = high is None or (v < high if high_open else v <= high)
  if not (lo_ok and hi_ok):
    lo = "-inf" if low is None else f"{low}"
    hi = "inf" if high is None else f"{high}"
    interval = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
    raise ValueError(f"{name}: expected a value in {interval}, got {v}")


def check_positive_int(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name}: expected a positive Python int, got {value!r}")
  return int(value)
