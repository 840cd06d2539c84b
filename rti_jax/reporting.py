"""Run directories: per-iteration JSONL metrics, result JSON, PNG plots and stdout tables.

Every experiment writes into one run directory::

    runs/<name>-<timestamp>/
      config.yaml        the resolved config
      metrics.jsonl      one JSON object per iteration (appended as the run goes)
      results.json       the final numbers
      *.png              plots

and prints its result table on stdout (``print_table``). In a multi-process job only process 0
writes (``write_json`` / ``append_jsonl`` / ``write_jsonl`` do nothing on the others) and every
process uses process 0's run directory name.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import pathlib
import tempfile
import warnings
from typing import Any, Iterable, Mapping, Sequence

import numpy as np


def make_run_dir(root: str | pathlib.Path, name: str, *, exact: bool = False) -> pathlib.Path:
  """Creates ``root/name-YYYYmmdd-HHMMSS`` (or ``root/name`` when ``exact``)."""
  from rti_jax import distributed

  root = pathlib.Path(root)
  stamp = distributed.from_writer(lambda: _dt.datetime.now().strftime('%Y%m%d-%H%M%S'))  # one name per job
  path = root / name if exact else root / f"{name}-{stamp}"
  path.mkdir(parents=True, exist_ok=True)
  return path


def to_jsonable(obj: Any) -> Any:
  """Converts numpy/jax scalars and arrays, tuples and non-finite floats for ``json``."""
  if isinstance(obj, Mapping):
    return {str(k): to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_jsonable(v) for v in obj]
  if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
    arr = np.asarray(obj)
    return to_jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
  if isinstance(obj, float) and not math.isfinite(obj):
    return str(obj)  # "inf", "-inf", "nan": JSON has no literal for them
  if isinstance(obj, (np.integer, np.floating, np.bool_)):
    return obj.item()
  return obj


def _writer() -> bool:
  """Whether this process writes files (process 0 of a multi-process job; always in one process)."""
  from rti_jax import distributed

  return distributed.is_writer()


def _replace_text(path: pathlib.Path, text: str) -> None:
  """Writes ``text`` to ``path`` atomically (a temporary file in the same directory, synced, then
  ``os.replace``): a kill leaves the old file or the new one, never a mix."""
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def write_json(path: str | pathlib.Path, obj: Any) -> None:
  """Writes ``obj`` as indented JSON, atomically."""
  if not _writer():
    return
  _replace_text(pathlib.Path(path), json.dumps(to_jsonable(obj), indent=2, sort_keys=True) + "\n")


def append_jsonl(path: str | pathlib.Path, record: Mapping[str, Any]) -> None:
  """Appends one record as one line (flushed and synced, so a kill leaves at most a torn last line)."""
  if not _writer():
    return
  with open(path, "a") as f:
    f.write(json.dumps(to_jsonable(record), sort_keys=True) + "\n")
    f.flush()
    os.fsync(f.fileno())


def write_jsonl(path: str | pathlib.Path, records: Iterable[Mapping[str, Any]]) -> None:
  """Rewrites ``path`` with ``records``, one JSON object per line, atomically."""
  if not _writer():
    return
  _replace_text(pathlib.Path(path), "".join(json.dumps(to_jsonable(r), sort_keys=True) + "\n" for r in records))


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, Any]]:
  """The records of a JSONL file. A last line without its newline that does not parse (a write cut
  off by a kill) is dropped with a warning; any other line that does not parse raises ValueError
  naming the file and line."""
  text = pathlib.Path(path).read_text()
  lines = text.split("\n")
  out = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      if i == len(lines) - 1:  # no newline after it: a torn final write
        warnings.warn(f"{path}: dropped a torn last line ({len(line)} characters)", RuntimeWarning, stacklevel=2)
        break
      raise ValueError(f"{path}:{i + 1}: not a JSON record ({e})") from None
    if not isinstance(record, dict):
      raise ValueError(f"{path}:{i + 1}: expected a JSON object, got {type(record).__name__}")
    out.append(record)
  return out


def format_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], floatfmt: str = "{:.2f}") -> str:
  """A plain-text table (markdown-compatible), also usable in README files."""
  def cell(v: Any) -> str:
    if isinstance(v, float):
      return floatfmt.format(v)
    return str(v)
  body = [[cell(v) for v in row] for row in rows]
  widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c) for i, c in enumerate(columns)]
  line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
  out = [f"{title}", line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
  out += [line(r) for r in body]
  return "\n".join(out)


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], floatfmt: str = "{:.2f}") -> str:
  """Prints ``format_table`` to stdout and returns it."""
  text = format_table(title, columns, list(rows), floatfmt)
  print(text, flush=True)
  return text


def plot_curves(
    path: str | pathlib.Path,
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
) -> None:
  """One PNG with a line per named (x, y) curve."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for label, (xs, ys) in curves.items():
    ax.plot(list(xs), list(ys), marker="o", markersize=3, label=label)
  ax.set_title(title)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if logx:
    ax.set_xscale("log")
  if logy:
    ax.set_yscale("log")
  ax.grid(alpha=0.3)
  if len(curves) > 1:
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
