"""``experiments/run.py``: every experiment (diagnostics included) is registered, importable and
listed by ``--help`` and when ``--exp`` is missing."""

from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

from experiments import run

EXPERIMENTS_DIR = pathlib.Path(__file__).resolve().parent.parent / "experiments"


def _modules_with_main() -> set[str]:
  out = set()
  for path in [*EXPERIMENTS_DIR.glob("*.py"), *EXPERIMENTS_DIR.glob("diagnostics/*.py")]:
    if path.name in ("__init__.py", "run.py"):
      continue
    if "\ndef main(" in path.read_text():
      out.add(".".join(path.relative_to(EXPERIMENTS_DIR.parent).with_suffix("").parts))
  return out


def test_every_experiment_module_is_registered_and_importable():
  registered = {module for module, _ in run.EXPERIMENTS.values()}
  assert registered == _modules_with_main()
  for module in sorted(registered):
    assert callable(importlib.import_module(module).main), module
  assert {"decision_probe", "name_copy_check", "name_drill"} <= set(run.EXPERIMENTS)


def test_help_and_a_missing_exp_list_every_experiment(capsys):
  assert run.main(["--help"]) == 0
  listed = capsys.readouterr().out
  assert run.main([]) == 2
  missing = capsys.readouterr().err
  assert "--exp is required" in missing
  assert run.main(["--exp=no_such_experiment"]) == 2
  unknown = capsys.readouterr().err
  for name in run.EXPERIMENTS:
    assert name in listed and name in missing and name in unknown, name


def test_exp_help_reaches_the_experiment(capsys):
  with pytest.raises(SystemExit) as e:
    run.main(["--exp=name_copy_check", "--help"])
  assert e.value.code == 0 and "--swapped" in capsys.readouterr().out


@pytest.mark.slow
def test_run_py_as_a_script_from_another_directory(tmp_path):
  out = subprocess.run([sys.executable, str(EXPERIMENTS_DIR / "run.py"), "--exp=navigation_sft", "--help"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and "--chain" in out.stdout, out.stderr


_CACHED_PROGRAM = """
import sys, jax, jax.numpy as jnp
from experiments import run
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name))
print(run.use_compile_cache(sys.argv[1], min_compile_s=0.0))
jax.jit(lambda x: jnp.tanh(x) @ x.T)(jnp.ones((8, 8))).block_until_ready()
print(sum(h == "/jax/compilation_cache/cache_hits" for h in hits))
"""


@pytest.mark.slow
def test_a_second_process_loads_the_first_ones_programs_from_the_compile_cache(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXPERIMENTS_DIR.parent), env.get("PYTHONPATH")) if p)
  cache = tmp_path / "xla"

  def once(where):
    out = subprocess.run([sys.executable, "-c", _CACHED_PROGRAM, where], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()

  assert once(str(cache)) == [str(cache), "0"] and any(cache.iterdir())
  where, hits = once(str(cache))
  assert where == str(cache) and int(hits) >= 1  # the matmul program, and the eager ones before it
  assert once("off") == ["None", "0"]
