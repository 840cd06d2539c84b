"""The environment registry: every benchmark registers one ``EnvSpec`` under its name, and config
validation, the trainer, the intervention pipeline, the LLM roles' prompts and the experiments
read it. Nothing outside an environment's own package names it.

An environment registers itself in a module ``rti_jax/envs/<package>/registration.py`` (found by
scanning the ``rti_jax.envs`` packages on first use), or in any importable module named by the
``rti_jax.envs`` entry-point group of an installed distribution, or by calling ``register`` before
the config is loaded (tests, notebooks)::

    register(EnvSpec(name="calculator", source=calculator_source, options=CalculatorOptions,
                     rule_roles=calculator_rules))

``docs/adding_an_environment.md`` walks through one.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import threading
from typing import Any, Callable

from rti_jax.envs.source import TaskSource

#: The entry-point group an installed distribution names its registration modules under.
ENTRY_POINT_GROUP = "rti_jax.envs"


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """Everything the library needs of one environment.

  name: the ``env.name`` that selects it.
  source: ``cfg -> TaskSource`` (its tasks, episode factory, report subsets, success threshold);
    ``cfg`` is the ``ExperimentConfig``, its section is ``options_of(cfg)``.
  options: the dataclass of its own config section ``env.<name>.*`` (typed by OmegaConf like every
    other key); may define ``validate(self)`` raising ``ValueError`` whose message starts with the
    field's name. None: no options.
  rule_roles: ``options -> (Validator, Verifier)``, the rule-based roles that read the evidence l
    exactly (the defaults for a policy too small to judge). None: only LLM judges.
  prompts: how its evidence l enters the LLM roles' prompts (an ``intervention.prompting.JudgePrompts``);
    None: the generic prompts, with l as JSON.
  demonstrator: ``check_line -> (task -> agent with act(messages) -> str)``, LUFFY's off-policy
    demonstrations (``check_line``: the policy writes the check line). None: LUFFY is refused.
  sft_data: ``(options, tasks, **kwargs) -> examples``, scripted SFT trajectories for a tiny policy.
  gold_agent: ``task -> agent`` (``act(messages) -> str``) that solves the task as its reference
    solution does: ``python -m rti_jax.envs stats`` replays it on every split.
  stats_overrides: config overrides that ``python -m rti_jax.envs stats`` applies before the
    command line's (how the reference replay is scored, e.g. by the benchmark's own evaluator).
  user_side: who plays the user, for listings ("none", "scripted", "scripted or LLM", ...).
  description: one line for listings.
  """

  name: str
  source: Callable[[Any], TaskSource]
  options: type | None = None
  rule_roles: Callable[[Any], tuple[Any, Any]] | None = None
  prompts: Any = None
  demonstrator: Callable[[bool], Callable[[Any], Any]] | None = None
  sft_data: Callable[..., Any] | None = None
  gold_agent: Callable[[Any], Any] | None = None
  stats_overrides: tuple[str, ...] = ()
  user_side: str = "none"
  description: str = ""

  def __post_init__(self) -> None:
    if not (isinstance(self.name, str) and self.name.isidentifier()):
      raise ValueError(f"name: expected an identifier (it becomes the config section env.<name>), got {self.name!r}")
    if not callable(self.source):
      raise ValueError(f"source: expected a callable cfg -> TaskSource for {self.name!r}, got {self.source!r}")
    if self.options is not None and not dataclasses.is_dataclass(self.options):
      raise ValueError(f"options: expected a dataclass for {self.name!r}, got {self.options!r}")

  def default_options(self) -> Any:
    return None if self.options is None else self.options()


_SPECS: dict[str, EnvSpec] = {}
_LOCK = threading.Lock()
_discovered = False


def register(spec: EnvSpec, *, replace: bool = False) -> EnvSpec:
  """Adds ``spec``; a second spec of the same name is an error unless ``replace``."""
  if not isinstance(spec, EnvSpec):
    raise TypeError(f"spec: expected an EnvSpec, got {type(spec).__name__}")
  with _LOCK:
    old = _SPECS.get(spec.name)
    if old is not None and old is not spec and not replace:
      raise ValueError(f"env {spec.name!r}: registered already (pass replace=True to swap it)")
    _SPECS[spec.name] = spec
  return spec


def unregister(name: str) -> None:
  """Removes ``name`` (tests that register a toy environment clean up with it)."""
  with _LOCK:
    _SPECS.pop(name, None)


def _discover() -> None:
  """Imports every ``rti_jax/envs/<package>/registration.py`` and every entry point of the group
  ``rti_jax.envs``, once. A registration module that fails to import is an error naming it."""
  global _discovered
  if _discovered:
    return
  _discovered = True
  import rti_jax.envs as envs_pkg

  modules = [f"rti_jax.envs.{m.name}.registration" for m in pkgutil.iter_modules(envs_pkg.__path__) if m.ispkg]
  modules = [m for m in sorted(modules) if importlib.util.find_spec(m) is not None]
  modules += [ep.value.split(":")[0] for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
  for module in modules:
    try:
      importlib.import_module(module)
    except Exception as e:  # a broken plug-in names itself instead of failing somewhere later
      raise ImportError(f"environment registration {module}: {type(e).__name__}: {e}") from e


def names() -> list[str]:
  """Every registered environment name, sorted."""
  _discover()
  return sorted(_SPECS)


def specs() -> list[EnvSpec]:
  _discover()
  return [_SPECS[n] for n in sorted(_SPECS)]


def get(name: str) -> EnvSpec:
  """The spec of ``name``; an unknown name is a ``ValueError`` listing the registered ones."""
  _discover()
  spec = _SPECS.get(name)
  if spec is None:
    raise ValueError(f"env.name: unknown environment {name!r}; registered: {sorted(_SPECS)}")
  return spec


def options_of(cfg: Any, name: str | None = None) -> Any:
  """The typed section ``env.<name>`` of ``cfg`` (default name: ``cfg.env.name``; the section's
  defaults when the config has none)."""
  spec = get(cfg.env.name if name is None else name)
  section = getattr(cfg.env, spec.name, None)
  return section if section is not None else spec.default_options()


def task_source(cfg: Any) -> TaskSource:
  """The ``TaskSource`` of ``cfg.env.name``."""
  source = get(cfg.env.name).source(cfg)
  if not isinstance(source, TaskSource):
    raise TypeError(f"env {cfg.env.name!r}: its source returned {type(source).__name__}, expected a TaskSource")
  return source


def rule_roles(name: str, options: Any = None) -> tuple[Any, Any]:
  """The rule-based (Validator, Verifier) of environment ``name`` with its ``options`` (default:
  the section's defaults); a ``ValueError`` when it registers none."""
  spec = get(name)
  if spec.rule_roles is None:
    raise ValueError(f"env {name!r} registers no rule-based roles: set intervention.validator=llm and "
                     "intervention.verifier=llm (or off)")
  return spec.rule_roles(spec.default_options() if options is None else options)


def prompts_for(name: str) -> Any:
  """The ``JudgePrompts`` of environment ``name`` (None: the generic ones)."""
  return get(name).prompts


def demonstrator(name: str, check_line: bool = False) -> Callable[[Any], Any]:
  """``task -> agent`` writing LUFFY's demonstrations for environment ``name``."""
  spec = get(name)
  if spec.demonstrator is None:
    with_demo = [s.name for s in specs() if s.demonstrator is not None]
    raise ValueError(f"env {name!r} registers no demonstrator, which loss.method=luffy needs "
                     f"(environments with one: {with_demo})")
  return spec.demonstrator(check_line)
