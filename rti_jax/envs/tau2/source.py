"""A tau2 domain (Retail or Airline) as the trainer's ``TaskSource``.

Splits (``env.<domain>.splits``):

* ``generated`` (default): test = every task tau2 ships for the domain (114 Retail / 50 Airline, as
  the paper's Table 4 evaluates), train = the first ``env.num_train`` tasks ``generate`` builds
  from the domain's database (disjoint from the test tasks' users' targets: ``generate.overlap``);
* ``tau2``: tau2's own split, train 74 / test 40 (Retail), 30 / 20 (Airline).

``env.num_test`` does not cut the test split (tau2's tasks are the benchmark). Each episode gets a
fresh ``Tau2Env``. Subsets for reporting: each request type of the domain (``tasks.request_types``),
``modify`` (any change to an existing order or reservation), ``multi_write`` (two or more kinds of
write) and ``communicate`` (the agent must tell the user a fact).
"""

from __future__ import annotations

from typing import Any, Callable

from rti_jax.envs.registry import options_of
from rti_jax.envs.source import TaskSource
from rti_jax.envs.tau2 import bridge
from rti_jax.envs.tau2.tasks import DOMAIN_TYPES, MODIFY_TYPES, Tau2Task, tau2_tasks

#: the most assistant turns an episode may take (tau2's own runs stop at 100 messages of all roles)
MAX_TURNS = 60
SPLITS = ("generated", "tau2")


def _has(kind: str) -> Callable[[Tau2Task], bool]:
  return lambda t: kind in t.request_types


def tau2_subsets(domain: str) -> dict[str, Callable[[Tau2Task], bool]]:
  """Named boolean selectors over ``Tau2Task`` (see the module docstring)."""
  subsets = {kind: _has(kind) for kind in DOMAIN_TYPES[bridge.check_domain(domain)]}
  subsets["modify"] = lambda t: bool(MODIFY_TYPES & set(t.request_types))
  subsets["multi_write"] = lambda t: len([k for k in t.request_types if k not in ("transfer", "refusal")]) > 1
  subsets["communicate"] = lambda t: bool(t.communicate_info)
  return subsets


def split_tasks(domain: str, splits: str, num_train: int | None = None, seed: int = 0) -> tuple[list, list]:
  """(train, test) of ``domain`` for ``splits`` (``generated`` or ``tau2``)."""
  if splits == "tau2":
    return tau2_tasks(domain, "train"), tau2_tasks(domain, "test")
  if splits == "generated":
    from rti_jax.envs.tau2.generate import generated_tasks

    return generated_tasks(domain, num_train, seed=seed), tau2_tasks(domain, "base")
  raise ValueError(f"splits: expected one of {list(SPLITS)}, got {splits!r}")


def tau2_source(cfg: Any, domain: str, tools_in_template: bool = False) -> TaskSource:
  """The tau2 domain ``domain`` as a ``TaskSource``.

  cfg: reads ``cfg.env.max_turns`` (1..``MAX_TURNS``; tau2 episodes need about 10-30 assistant
    turns), ``cfg.env.num_train`` (generated training tasks kept), ``cfg.env.seed`` (the generator's
    seed) and the section ``cfg.env.<domain>`` (``registration.Tau2Options``).
  tools_in_template: the system message holds the policy text only and the tools reach the model
    through the chat template's ``tools=``; default False: the system message lists them.
  """
  bridge.tau2_modules()  # a clear ImportError when the tau2 extra is missing
  max_turns = int(cfg.env.max_turns)
  if not 1 <= max_turns <= MAX_TURNS:
    raise ValueError(f"cfg.env.max_turns: expected 1..{MAX_TURNS} for {domain}, got {cfg.env.max_turns}")
  opts = options_of(cfg)
  opts.validate()
  train, test = split_tasks(domain, opts.splits, int(cfg.env.num_train), int(cfg.env.seed))
  kwargs = dict(policy_text=opts.policy_text, max_turns=max_turns, user=opts.user, user_url=opts.user_url,
                user_model=opts.user_model, reward=opts.reward, observation=opts.observation,
                user_timeout_s=opts.user_timeout_s, user_max_retries=opts.user_max_retries,
                audit_share=opts.audit_share)
  from rti_jax.envs.tau2.env import Tau2Env

  return TaskSource(
      train=train,
      test=test,
      env_factory=lambda: Tau2Env(domain, tools_in_prompt=not tools_in_template, **kwargs),
      task_id=lambda t: t.task_id,
      subsets=tau2_subsets(domain),
      domain=domain,
      tool_schemas=Tau2Env(domain, **kwargs).tool_schemas() if tools_in_template else None,
      success_threshold=1.0,
  )
