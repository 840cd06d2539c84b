"""The lineage of the shipped policies (``policies/LINEAGE.yaml``): each stage's builder, overrides
and the stage it continues.

A stage is one run of its builder (``experiments/navigation_sft.py``, ``telecom_sft.py``,
``tau2_sft.py`` with the domain its build.json names) on the builder's config file with the
stage's overrides, plus ``init=<policy dir>`` of the stage it continues. ``chain`` walks back from a stage to its build from scratch; ``stage_overrides`` gives
one stage's overrides with the ``init`` it gets in a chain.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINEAGE_PATH = ROOT / "policies" / "LINEAGE.yaml"
BUILDERS = ("navigation_sft", "telecom_sft", "tau2_sft", "judge_sft")


@dataclasses.dataclass(frozen=True)
class Stage:
  """One build. path: where its policy was written (relative to the repository root); init: the
  name of the stage it continues (None: from scratch); overrides: ``key=value`` over the builder's
  config file, without ``init``."""

  name: str
  builder: str
  path: str
  shipped: bool
  init: str | None
  overrides: tuple[str, ...]
  about: str = ""


def load_lineage(path: str | pathlib.Path = LINEAGE_PATH) -> dict[str, Stage]:
  """The stages of ``path`` in file order; raises ValueError naming the stage and field on a bad
  entry (an unknown builder, an ``init`` that is not an earlier stage of the same builder, an
  ``init=`` among the overrides)."""
  with open(path) as f:
    raw = yaml.safe_load(f)
  if not isinstance(raw, dict) or not isinstance(raw.get("stages"), dict):
    raise ValueError(f"{path}: expected a mapping with 'stages'")
  out: dict[str, Stage] = {}
  for name, entry in raw["stages"].items():
    where = f"{path}: stages.{name}"
    if not isinstance(entry, dict):
      raise ValueError(f"{where}: expected a mapping, got {entry!r}")
    unknown = set(entry) - {f.name for f in dataclasses.fields(Stage)}
    if unknown:
      raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    stage = Stage(name=str(name), builder=entry.get("builder"), path=entry.get("path"),
                  shipped=bool(entry.get("shipped")), init=entry.get("init"), overrides=tuple(str(o) for o in entry.get("overrides") or ()),
                  about=str(entry.get("about", "")))
    if stage.builder not in BUILDERS:
      raise ValueError(f"{where}.builder: expected one of {list(BUILDERS)}, got {stage.builder!r}")
    if not isinstance(stage.path, str) or not stage.path:
      raise ValueError(f"{where}.path: expected a policy dir, got {stage.path!r}")
    # A judge_sft stage teaches the judges to a policy of any builder; the others continue their own.
    if stage.init is not None and (stage.init not in out or (out[stage.init].builder != stage.builder
                                                             and stage.builder != "judge_sft")):
      raise ValueError(f"{where}.init: expected an earlier {stage.builder} stage of {sorted(out)}, got {stage.init!r}")
    if any(o.split("=", 1)[0].strip() == "init" for o in stage.overrides):
      raise ValueError(f"{where}.overrides: init is the field 'init' (a stage name), not an override")
    out[stage.name] = stage
  return out


def chain(stages: dict[str, Stage], target: str) -> list[Stage]:
  """The stages that build ``target`` from scratch, first to last."""
  if target not in stages:
    raise ValueError(f"stage {target!r}: expected one of {sorted(stages)}")
  out = [stages[target]]
  while out[-1].init is not None:
    out.append(stages[out[-1].init])
  return out[::-1]


def stage_overrides(stage: Stage, init_dir: str | None) -> list[str]:
  """The overrides of one run of ``stage``: ``init=<init_dir>`` (the previous stage's policy dir)
  when it continues one, then the stage's own."""
  if (stage.init is None) != (init_dir is None):
    raise ValueError(f"stage {stage.name}: init_dir expected {'None' if stage.init is None else 'a policy dir'}, "
                     f"got {init_dir!r}")
  return ([f"init={init_dir}"] if init_dir is not None else []) + list(stage.overrides)


def without_init(config: dict[str, Any]) -> dict[str, Any]:
  """A resolved config without its ``init`` path (which differs between a chain and the shipped build)."""
  return {k: v for k, v in config.items() if k != "init"}
