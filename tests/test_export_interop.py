"""Exports load with the same rope, dtype, stop ids and tokenizer in transformers 4.x (what SGLang and
vLLM releases pin) as in transformers 5.x: a real transformers 4.57 in a throw-away venv reads them."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

import models
from models.chat import build_tiny_tokenizer
from models_fixtures import write_checkpoint

TRANSFORMERS_4 = "transformers==4.57.1"

READ_4X = textwrap.dedent("""
  import json, sys
  import transformers
  from transformers import AutoConfig, AutoTokenizer, GenerationConfig
  assert transformers.__version__.startswith("4."), transformers.__version__
  out = {}
  for path in sys.argv[1:]:
    c = AutoConfig.from_pretrained(path)
    g = GenerationConfig.from_pretrained(path)
    t = AutoTokenizer.from_pretrained(path)
    out[path] = {"model_type": c.model_type, "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
                 "dtype": str(c.torch_dtype), "eos": g.eos_token_id, "layers": c.num_hidden_layers,
                 "ids": t("Hello, world").input_ids}
  print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def transformers4(tmp_path_factory):
  """A venv with transformers 4.x (no torch: configs, generation configs and tokenizers only)."""
  venv = tmp_path_factory.mktemp("tf4") / "venv"
  # no pip of its own (installing one is a few seconds): this interpreter's pip installs into it, without
  # byte-compiling every module it installs (half the install's time; the few the check imports compile then)
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  py = venv / "bin" / "python"
  done = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-compile",
                         "--disable-pip-version-check", TRANSFORMERS_4],
                        capture_output=True, text=True)
  if done.returncode:
    pytest.fail(f"pip install {TRANSFORMERS_4} failed (the package index must be reachable):\n{done.stderr[-2000:]}")
  return py


def _export(tmp_path: pathlib.Path, family: str, rope: dict, dtype: str) -> pathlib.Path:
  src, out = tmp_path / f"{family}_src", tmp_path / f"{family}_out"
  write_checkpoint(src, family, rope=rope)
  model, config = models.from_pretrained(src)
  models.save_pretrained(model, config, out, dtype=dtype, eos_token_ids=[5, 2])
  tok = build_tiny_tokenizer(["Hello", "world"], tmp_path / f"{family}_tok")
  models.save_tokenizer(tok, out)
  return out


@pytest.mark.slow
def test_an_export_reads_the_same_in_transformers_4_and_5(tmp_path, transformers4):
  cases = {"qwen3": ({"rope_type": "default", "rope_theta": 1e6}, "bfloat16"),
           "qwen3_moe": ({"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}, "float32")}
  paths = {f: _export(tmp_path, f, rope, dtype) for f, (rope, dtype) in cases.items()}
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
  done = subprocess.run([str(transformers4), "-c", READ_4X, *map(str, paths.values())], capture_output=True,
                        text=True, env=env, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  old = json.loads(done.stdout.strip().splitlines()[-1])
  for family, path in paths.items():
    rope, dtype = cases[family]
    got4 = old[str(path)]
    new = AutoConfig.from_pretrained(path)
    assert got4["model_type"] == new.model_type == family
    assert got4["rope_theta"] == new.rope_parameters["rope_theta"] == rope["rope_theta"]
    assert got4["dtype"].endswith(dtype) and str(new.dtype).endswith(dtype)
    if rope["rope_type"] == "linear":
      assert got4["rope_scaling"]["factor"] == new.rope_parameters["factor"] == 2.0
      assert got4["rope_scaling"]["type"] == new.rope_parameters["rope_type"] == "linear"
    else:
      assert got4["rope_scaling"] is None
    assert got4["eos"] == GenerationConfig.from_pretrained(path).eos_token_id == [5, 2]
    assert got4["ids"] == AutoTokenizer.from_pretrained(path)("Hello, world").input_ids
    assert got4["layers"] == new.num_hidden_layers
    # and our own loader reads the export back with the same settings
    cfg = models.QwenConfig.from_pretrained(path)
    assert (cfg.rope_theta, cfg.rope_type, cfg.dtype) == (rope["rope_theta"], rope["rope_type"], dtype)


def test_generation_config_joins_the_given_stop_ids_and_the_configs(tmp_path):
  from models.weights import write_generation_config

  write_generation_config(tmp_path, {"eos_token_id": [7, 5], "pad_token_id": 0}, [5, 9])
  gen = json.loads((tmp_path / "generation_config.json").read_text())
  assert gen["eos_token_id"] == [5, 9, 7] and gen["pad_token_id"] == 0
  write_generation_config(tmp_path, {"eos_token_id": True}, None)
  assert "eos_token_id" not in json.loads((tmp_path / "generation_config.json").read_text())
