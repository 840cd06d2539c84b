"""Run-dir helpers: JSON round trips (incl. inf and numpy), tables, PNGs."""

import json

import numpy as np

from rti_jax import reporting


def test_json_and_jsonl_round_trip(tmp_path):
  rec = {"a": np.float32(0.5), "b": np.arange(3), "delta": float("inf"), "t": (1, 2)}
  reporting.write_json(tmp_path / "r.json", rec)
  assert json.loads((tmp_path / "r.json").read_text()) == {"a": 0.5, "b": [0, 1, 2], "delta": "inf", "t": [1, 2]}
  for i in range(3):
    reporting.append_jsonl(tmp_path / "m.jsonl", {"it": i, "x": np.float64(i) / 2})
  assert [r["x"] for r in reporting.read_jsonl(tmp_path / "m.jsonl")] == [0.0, 0.5, 1.0]


def test_table_aligns_and_formats():
  text = reporting.format_table("T", ["method", "p@1"], [["grpo", 35.333], ["rti", 57.3]])
  lines = text.splitlines()
  assert lines[0] == "T" and "35.33" in lines[3] and "57.30" in lines[4]
  assert len({len(l) for l in lines[1:]}) == 1


def test_plot_writes_a_png(tmp_path):
  reporting.plot_curves(tmp_path / "c.png", {"a": ([1, 2, 3], [3, 2, 1])}, title="t", xlabel="x", ylabel="y")
  assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
