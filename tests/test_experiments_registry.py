"""``experiments/run.py``: every experiment (diagnostics included) is registered, importable and
listed by ``--help`` and when ``--exp`` is missing."""

from __future__ import annotations

import importlib
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
