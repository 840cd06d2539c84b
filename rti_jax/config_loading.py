"""Loading typed configs from YAML and ``key=value`` overrides with OmegaConf, for any dataclass
schema (the experiment config of ``rti_jax.config`` and the policy builders' configs share it)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import typing
from typing import Any, Optional, Sequence, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"


Schema = TypeVar("Schema")


class ConfigError(ValueError):
  """A bad config: unknown key, wrong type or out-of-range value (the message names the key)."""


def config_path(name_or_path: str | os.PathLike, glob: str = "*.yaml") -> pathlib.Path:
  """A YAML path, or ``configs/<name>.yaml`` for a bare name; ``ConfigError`` listing the known
  configs (those matching ``glob``) when there is no such file."""
  path = pathlib.Path(name_or_path)
  if not path.suffix:
    path = CONFIG_DIR / f"{name_or_path}.yaml"
  if not path.exists():
    known = sorted(p.stem for p in CONFIG_DIR.glob(glob))
    raise ConfigError(f"config {str(name_or_path)!r}: no file {path}; known configs: {known}")
  return path


def load_structured(schema: type[Schema], path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> Schema:
  """``schema``'s defaults <- the YAML at ``path`` (if any) <- ``key=value`` overrides, type-checked
  by OmegaConf (the experiment config and the policy builders' configs share this). Overrides are
  literal values: ``${...}`` is not interpolated, and YAML's boolean words stay strings for string
  fields. Every error is a ``ConfigError`` naming the key."""
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r}: expected key=value")
  overrides = [_literal(_quote_yaml_words(item, schema)) for item in overrides]
  layers = [OmegaConf.structured(schema)] + ([OmegaConf.load(path)] if path is not None else [])
  try:
    merged = OmegaConf.merge(*layers, OmegaConf.from_dotlist(list(overrides)))
    cfg = OmegaConf.to_object(merged)
  except OmegaConfBaseException as e:
    key = getattr(e, "full_key", None) or "config"
    raise ConfigError(f"{key}: {str(e).splitlines()[0]}") from None
  assert isinstance(cfg, schema)
  return cfg


_YAML_BOOL_WORDS = {"on", "off", "yes", "no", "y", "n", "true", "false"}


def _field_type(dotted: str, schema: Any) -> Any:
  """The annotated type of a dotted key of the dataclass ``schema`` (None if unknown)."""
  cls: Any = schema
  typ: Any = None
  for part in dotted.split("."):
    hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
    if part not in hints:
      return None
    typ = cls = hints[part]
  return typ


def _quote_yaml_words(item: str, schema: Any) -> str:
  """``intervention.verifier=off`` stays the string "off": YAML would read off/on/yes/no as booleans."""
  key, _, value = item.partition("=")
  if value.strip().lower() in _YAML_BOOL_WORDS and _field_type(key.strip(), schema) in (str, Optional[str]):
    return f"{key}='{value.strip()}'"
  return item


def _literal(item: str) -> str:
  """An override's value taken literally: ``${...}`` (OmegaConf interpolation, e.g. ``${oc.env:HOME}``)
  is escaped, so nothing on a command line is resolved from the environment or the config."""
  key, _, value = item.partition("=")
  return f"{key}={value.replace('${', chr(92) + '${')}" if "${" in value else item
