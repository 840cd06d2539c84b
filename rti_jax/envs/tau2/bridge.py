"""The link to tau2-bench itself (the optional ``tau2`` extra): its domains, tasks and evaluator.

Everything that touches the ``tau2`` package goes through here and imports it lazily, so the rest of
``rti_jax`` (and this package's registration) works without it; a missing package is an
``ImportError`` that says how to install it.

* ``new_environment(domain)``: a fresh tau2 ``Environment`` (its tools over a private copy of the
  domain's database, its policy text), built from a database parsed once per process.
* ``base_tasks(domain)`` / ``split_ids(domain)``: tau2's own tasks and its train / test split.
* ``gold_replay(domain, task)``: the task's gold calls replayed on a fresh database: which of them
  fail on purpose (an error response: not a required step); ``gold_db`` / ``gold_hash``: the
  database they leave and its hash.
* ``tau2_reward(...)``: tau2's ``evaluate_simulation`` on a ``SimulationRun`` of tau2 messages.
* ``fast_reward(...)``: the same number without replaying the trajectory: the live database against
  the gold one (compared as objects first, then as JSON, and by tau2's hash only where those two
  disagree), times tau2's own communicate (and, where a task lists them, action and env-assertion)
  checks. It equals ``tau2_reward`` on every episode the tests and
  ``python -m rti_jax.envs.tau2 check-reward`` compare.

Telecom: ``Tau2Env`` also runs tau2's Telecom domain (``ENV_DOMAINS``; ``DOMAINS``, the domains with
generated tasks, rules and a scripted customer, stays Retail and Airline). Its customer has tools of
its own on a simulated phone (``user_tool_names``), run through tau2's user-tool path. Two pieces of
tau2's Telecom tools would make an episode's tool replies depend on what ran before it in the
process; they are pinned as ``rti_jax.envs.telecom.tau2_bridge`` pins them for the port's parity
tests (no rule changes):

* a refuel that opens a new bill names it with ``uuid4``: each episode names its bills from its own
  counter (``episode_ids``, installed around every tool call by ``tool_ids``), and ``tau2_reward``
  scores with a counter restarted at 0, so tau2's replay of the episode names them the same way;
* ``connect_vpn`` hands every phone one shared VPN record, which the ``break_vpn`` fault degrades for
  the rest of the process: each environment from ``new_environment`` gets its own fresh copy, and
  ``tau2_reward`` restores the shared one before tau2's evaluator builds its environments.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import os
import sys
import threading
import warnings
from typing import Any, Iterator

#: the domains with generated tasks, rules, a scripted customer and the command line (``__main__``)
DOMAINS = ("retail", "airline")
TELECOM = "telecom"
#: every domain ``Tau2Env`` runs
ENV_DOMAINS = DOMAINS + (TELECOM,)
INSTALL_HINT = ('the tau2 domains (retail, airline) need tau2-bench: '
                'pip install -e ".[tau2]" -c constraints.txt -c constraints-tau2.txt')
#: tau2's stop and transfer markers (the user's ``###STOP###`` ends a conversation; so does the agent's)
STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
#: our episode endings -> tau2's termination reasons (a transfer ends as tau2's user does: a user stop)
TERMINATION = {"agent_stop": "agent_stop", "user_stop": "user_stop", "transfer": "user_stop",
               "max_turns": "max_steps"}

_LOCK = threading.Lock()
#: held while tau2's Telecom tools name new bills from an episode's counter (a module-wide setting)
_TELECOM_LOCK = threading.RLock()


@functools.cache
def tau2_modules() -> dict[str, Any]:
  """tau2's modules used by this package (imported once; an ImportError names the install command)."""
  # litellm (imported by tau2's registry) would otherwise try to download its price table
  os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
  try:
    from loguru import logger
    logger.disable("tau2")  # its per-call logging
    from tau2.data_model import message, simulation, tasks
    from tau2.domains.airline import environment as airline
    from tau2.domains.retail import environment as retail
    from tau2.domains.telecom import environment as telecom
    from tau2.environment import toolkit
    from tau2.evaluator import evaluator, evaluator_action, evaluator_communicate
    from tau2.utils import utils
  except ImportError as e:
    raise ImportError(f"{INSTALL_HINT} ({e})") from e
  return {"message": message, "simulation": simulation, "tasks": tasks, "evaluator": evaluator,
          "action": evaluator_action, "communicate": evaluator_communicate, "toolkit": toolkit,
          "utils": utils, "retail": retail, "airline": airline, "telecom": telecom}


def check_domain(domain: str, allowed: tuple[str, ...] = DOMAINS) -> str:
  """``domain`` if it is one of ``allowed`` (default ``DOMAINS``), else a ValueError naming them."""
  if domain not in allowed:
    raise ValueError(f"domain: expected one of {list(allowed)}, got {domain!r}")
  return domain


def domain_module(domain: str) -> Any:
  """tau2's ``tau2.domains.<domain>.environment`` module (any of ``ENV_DOMAINS``)."""
  return tau2_modules()[check_domain(domain, ENV_DOMAINS)]


@functools.cache
def _pristine(domain: str) -> tuple[type, dict[str, Any]]:
  """The domain's database class and its parsed contents (never handed out: copied per episode)."""
  env = domain_module(domain).get_environment()
  db = env.tools.db
  return type(db), db.model_dump()


@functools.cache
def _pristine_user(domain: str) -> tuple[type, dict[str, Any]] | None:
  """The domain's user-side database class and contents (Telecom's phone), None without one."""
  env = domain_module(domain).get_environment()
  if env.user_tools is None:
    return None
  db = env.user_tools.db
  return type(db), db.model_dump()


@functools.cache
def _reference_db(domain: str) -> Any:
  """The domain's initial database as an object (never handed out: what ``restore_environment``
  compares against and copies records from)."""
  cls, dump = _pristine(domain)
  return cls.model_validate(dump)


_MISSING = object()


def restore_db(domain: str, db: Any) -> int:
  """Puts ``db``, a Retail or Airline database from ``new_environment``, back to the initial contents
  in place and returns how many records it replaced.

  Each top-level table is a dict of records: a record unequal to the initial one (or missing) is
  replaced by a copy of the initial record, one the episode added is removed, and the initial key
  order is kept, so the result equals a freshly parsed database and hashes the same. Comparing every
  record costs a tenth of parsing the database again (Retail 8 ms against 74, Airline 19 against
  203). Anything else unequal (a field that is not a dict) is copied whole."""
  check_domain(domain)
  ref = _reference_db(domain)
  if type(db) is not type(ref) or db.__dict__.keys() != ref.__dict__.keys():
    raise TypeError(f"db: expected a {domain} database ({type(ref).__name__}), got {type(db).__name__}")
  replaced = 0
  for name, want in ref.__dict__.items():
    cur = db.__dict__[name]
    if not (isinstance(want, dict) and isinstance(cur, dict)):
      if cur != want:
        db.__dict__[name] = copy.deepcopy(want)
        replaced += 1
      continue
    if len(cur) != len(want) or any(a != b for a, b in zip(cur, want)):
      kept = {k: cur.get(k, _MISSING) for k in want}
      replaced += len(cur.keys() - want.keys())
      cur.clear()
      cur.update(kept)
    for key, record in want.items():
      have = cur[key]
      if have is _MISSING or have != record:
        cur[key] = copy.deepcopy(record)
        replaced += 1
  for attr in ("__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
    if getattr(db, attr, None) != getattr(ref, attr, None):
      object.__setattr__(db, attr, copy.deepcopy(getattr(ref, attr, None)))
  return replaced


def restore_environment(domain: str, env: Any) -> Any:
  """``env`` (a Retail or Airline environment from ``new_environment``) over its database put back to
  the initial contents (``restore_db``): the same as a new environment, without parsing the database."""
  restore_db(domain, env.tools.db)
  return env


def new_environment(domain: str) -> Any:
  """A fresh tau2 environment of ``domain`` over its own copy of the initial database (and, for
  Telecom, of the phone's, with its own fresh VPN record: see the module docstring). Retail and
  Airline start on a spare database put back when there is one (``_fresh_db``)."""
  if domain != TELECOM:
    return domain_module(domain).get_environment(db=_fresh_db(domain))
  cls, dump = _pristine(domain)
  user_cls, user_dump = _pristine_user(domain)
  env = domain_module(domain).get_environment(db=cls.model_validate(dump), user_db=user_cls.model_validate(user_dump))
  phone = env.user_tools
  excellent = _telecom_bridge().tau2_modules()["user_data_model"].PerformanceLevel.EXCELLENT
  phone.default_vpn_details = type(phone).default_vpn_details.model_copy(update={"server_performance": excellent})
  return env


def _telecom_bridge() -> Any:
  """``rti_jax.envs.telecom.tau2_bridge``: the port's link to tau2's Telecom, whose pins this module
  shares (imported on first use)."""
  from rti_jax.envs.telecom import tau2_bridge

  return tau2_bridge


def episode_ids(domain: str) -> Any:
  """A fresh counter that names the new bills of one ``domain`` episode (Telecom), else None."""
  return _telecom_bridge()._CountingIds() if domain == TELECOM else None


@contextlib.contextmanager
def tool_ids(ids: Any) -> Iterator[None]:
  """While inside, tau2's Telecom tools name new bills from ``ids`` (``episode_ids``); nothing for
  None. Held under a lock: the setting is module-wide."""
  if ids is None:
    yield
    return
  tools = _telecom_bridge().tau2_modules()["tools"]
  with _TELECOM_LOCK:
    saved, tools.uuid = tools.uuid, ids
    try:
      yield
    finally:
      tools.uuid = saved


@functools.cache
def user_tool_names(domain: str) -> frozenset[str]:
  """The tools the customer runs itself (Telecom's phone tools; none in Retail and Airline)."""
  env = domain_module(domain).get_environment()
  return frozenset(env.user_tools.tools) if env.user_tools is not None else frozenset()


@functools.cache
def policy_text(domain: str) -> str:
  """tau2's own agent policy of ``domain``."""
  return domain_module(domain).get_environment().get_policy()


@functools.cache
def tool_info(domain: str) -> tuple[tuple[dict[str, Any], ...], frozenset[str]]:
  """(the agent tools' OpenAI schemas as tau2 writes them, the names of its write tools)."""
  env = domain_module(domain).get_environment()
  schemas = tuple(t.openai_schema for t in env.get_tools())
  write = tau2_modules()["toolkit"].ToolType.WRITE
  writes = frozenset(name for name in env.tools.tools if env.tools.tool_type(name) == write)
  return schemas, writes


@functools.cache
def parameter_models(domain: str) -> dict[str, Any]:
  """Tool name -> the pydantic model of its parameters (tau2's own, read from its signature)."""
  env = domain_module(domain).get_environment()
  return {name: tool.params for name, tool in env.tools.get_tools().items()}


@functools.cache
def base_tasks(domain: str) -> tuple[Any, ...]:
  """Every task tau2 ships for ``domain`` (its ``base`` set), as tau2 ``Task`` objects."""
  return tuple(domain_module(domain).get_tasks())


@functools.cache
def split_ids(domain: str) -> dict[str, tuple[str, ...]]:
  """tau2's own split of the task ids: ``train``, ``test`` and ``base`` (all)."""
  return {k: tuple(v) for k, v in domain_module(domain).get_tasks_split().items()}


@contextlib.contextmanager
def quiet_serializer():
  """Silences pydantic's serializer warnings while tau2 dumps a database in which a tool stored an
  agent's mistyped argument (a float bag count): the dump and its hash are what tau2 scores."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Pydantic serializer warnings", category=UserWarning)
    yield


# ----------------------------------------------------------------------------- gold replay


@dataclasses.dataclass(frozen=True)
class GoldReplay:
  """A task's gold calls replayed on a fresh database.

  failing: indices of the gold calls whose response is an error (they fail on purpose and change
    nothing: not required steps).
  outputs: each gold call's response text.

  The database they leave is ``gold_db``, its hash (what tau2's evaluator compares) ``gold_hash``.
  """

  failing: tuple[int, ...]
  outputs: tuple[str, ...]


_GOLD: dict[tuple[str, str], GoldReplay] = {}
#: tau2's hash of each task's gold database, and whether that database is the initial one (computed
#: when first needed: the hash costs as much as the replay)
_GOLD_HASH: dict[tuple[str, str], str] = {}
_GOLD_IS_INITIAL: dict[tuple[str, str], bool] = {}
#: the gold databases of the most recently scored tasks (a whole database each: kept few)
GOLD_DB_CACHE = 8
_GOLD_DB: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()


#: Retail and Airline databases nothing holds any more (gold databases dropped from the cache, those of
#: the evaluator's environments), per domain: the next gold replays and evaluator environments start
#: on them, put back by ``restore_db`` (a few, a whole database each; the evaluator builds two)
_SPARE: dict[str, list[Any]] = collections.defaultdict(list)
SPARE_DBS = 4


def _fresh_db(domain: str) -> Any:
  """A Retail or Airline database with the initial contents: a spare one put back (``restore_db``), else
  a new parse."""
  with _LOCK:
    spare = _SPARE[domain].pop() if _SPARE.get(domain) else None
  if spare is None:
    cls, dump = _pristine(domain)
    return cls.model_validate(dump)
  restore_db(domain, spare)
  return spare


def _give_back(domain: str, db: Any) -> None:
  """Keeps ``db`` as a spare when nothing but the caller holds it. Called with a database the caller
  holds by one local name (no other reference of its own): that name, this parameter and
  getrefcount's argument are then the only references, and nobody else can reach it any more."""
  with _LOCK:
    if domain in DOMAINS and len(_SPARE[domain]) < SPARE_DBS and sys.getrefcount(db) <= 3:
      _SPARE[domain].append(db)


def _replay(domain: str, task: Any) -> tuple[Any, list[int], list[str]]:
  """A fresh environment with ``task``'s initial state and gold calls applied; (env, failing, outputs)."""
  msg = tau2_modules()["message"]
  env = new_environment(domain)
  ids = episode_ids(domain)
  init = task.initial_state
  if init is not None:
    with tool_ids(ids):
      env.set_state(initialization_data=init.initialization_data,
                    initialization_actions=init.initialization_actions,
                    message_history=list(init.message_history or []))
  failing, outputs = [], []
  actions = (task.evaluation_criteria.actions or []) if task.evaluation_criteria else []
  for i, action in enumerate(actions):
    with tool_ids(ids):
      reply = env.get_response(msg.ToolCall(id=f"gold_{i}", name=action.name, arguments=dict(action.arguments),
                                            requestor=action.requestor))
    outputs.append(reply.content or "")
    if reply.error:
      failing.append(i)
  return env, failing, outputs


def _keep_gold_db(key: tuple[str, str], db: Any) -> None:
  with _LOCK:
    _GOLD_DB[key] = db
    _GOLD_DB.move_to_end(key)
    dropped = [_GOLD_DB.popitem(last=False) for _ in range(len(_GOLD_DB) - GOLD_DB_CACHE)]
  while dropped:
    (dom, _), old = dropped.pop()
    _give_back(dom, old)
    del old


def gold_replay(domain: str, task: Any) -> GoldReplay:
  """The gold replay of tau2 ``Task`` ``task`` (cached by domain and task id)."""
  key = (domain, str(task.id))
  hit = _GOLD.get(key)
  if hit is not None:
    return hit
  env, failing, outputs = _replay(domain, task)
  out = GoldReplay(failing=tuple(failing), outputs=tuple(outputs))
  with _LOCK:
    _GOLD[key] = out
  _keep_gold_db(key, env.tools.db)
  return out


def gold_db(domain: str, task: Any) -> Any:
  """The database ``task``'s gold calls leave (the last ``GOLD_DB_CACHE`` are kept)."""
  key = (domain, str(task.id))
  with _LOCK:
    db = _GOLD_DB.get(key)
  if db is None:
    db = _replay(domain, task)[0].tools.db
    _keep_gold_db(key, db)
  return db


def gold_hash(domain: str, task: Any) -> str:
  """tau2's hash of the database ``task``'s gold calls leave (its ``Toolkit.get_db_hash``; cached)."""
  key = (domain, str(task.id))
  hit = _GOLD_HASH.get(key)
  if hit is None:
    with quiet_serializer():
      hit = tau2_modules()["utils"].get_dict_hash(gold_db(domain, task).model_dump())
    with _LOCK:
      _GOLD_HASH[key] = hit
  return hit


def _same_database(live: Any, live_hash: Any, gold: Any, gold_hash_of: Any) -> bool:
  """Whether database ``live`` hashes as ``gold`` does by tau2's hash, mostly without hashing.

  Unequal objects dump unequally (arguments come from JSON), so only equal objects need more; equal
  objects whose JSON dumps are equal also hash equally (the dump keeps 1, 1.0 and true apart), at a
  fifth of the hash's cost; only equal objects with unequal dumps (keys in another order, an int
  for a float) need tau2's hashes, ``live_hash()`` and ``gold_hash_of()``."""
  with quiet_serializer():
    return live == gold and (live.model_dump_json() == gold.model_dump_json() or live_hash() == gold_hash_of())


def gold_is_initial(domain: str, task: Any) -> bool:
  """Whether ``task``'s gold calls leave the initial database, by tau2's hash (cached)."""
  key = (domain, str(task.id))
  hit = _GOLD_IS_INITIAL.get(key)
  if hit is None:
    initial = _reference_db(domain) if domain in DOMAINS else new_environment(domain).tools.db
    hit = _same_database(initial, lambda: initial_db_hash(domain), gold_db(domain, task), lambda: gold_hash(domain, task))
    with _LOCK:
      _GOLD_IS_INITIAL[key] = hit
  return hit


def forget_gold(domain: str, task_id: str) -> None:
  """Drops a cached gold replay (a generated task whose id was reused)."""
  key = (domain, str(task_id))
  with _LOCK:
    for cache in (_GOLD, _GOLD_DB, _GOLD_HASH, _GOLD_IS_INITIAL):
      cache.pop(key, None)


# ----------------------------------------------------------------------------- rewards


@dataclasses.dataclass(frozen=True)
class Tau2Reward:
  """One episode's reward and how it was reached.

  reward: the product over the task's reward basis (0 when the episode did not end by a stop).
  breakdown: reward per basis (``DB``, ``COMMUNICATE``, ...).
  db_match: the database matches the gold one (None: not checked).
  communicate: (info, said) per required piece of information.
  method: ``tau2`` (its ``evaluate_simulation``) or ``fast``.
  note: why the reward is 0 without checks (a turn-limit ending), else "".
  """

  reward: float
  breakdown: dict[str, float]
  db_match: bool | None
  communicate: tuple[tuple[str, bool], ...]
  method: str
  note: str = ""

  def to_dict(self) -> dict[str, Any]:
    return {"reward": self.reward, "breakdown": dict(self.breakdown), "db_match": self.db_match,
            "communicate": [list(c) for c in self.communicate], "method": self.method, "note": self.note}


def simulation_run(task: Any, messages: list[Any], termination: str) -> Any:
  """A tau2 ``SimulationRun`` of ``messages`` ending with our ``termination``."""
  reason = TERMINATION.get(termination)
  if reason is None:
    raise ValueError(f"termination: expected one of {sorted(TERMINATION)}, got {termination!r}")
  sim = tau2_modules()["simulation"]
  now = "2024-05-15T15:00:00"
  return sim.SimulationRun(id=f"rti-jax-{task.id}", task_id=str(task.id), start_time=now, end_time=now,
                           duration=0.0, termination_reason=sim.TerminationReason(reason), messages=list(messages))


#: held while tau2's registry builds a domain's environments from the parsed database (``parsed_database``)
_REGISTRY_LOCK = threading.RLock()


@contextlib.contextmanager
def parsed_database(domain: str) -> Iterator[None]:
  """While inside, tau2's registry builds Retail's or Airline's environments over a copy of the
  database parsed once per process (``new_environment``) instead of reading the domain's JSON file
  again. tau2's evaluator builds two environments per scored episode, and that file read was most
  of an episode's scoring time; the database, tools and policy text are the same. The copies are
  spare databases put back (``restore_db``) where there are any, and on the way out the databases
  of environments nobody holds any more become spares: an environment built inside is not to be
  used after it. Nothing for Telecom, whose environments carry the pins of the module docstring."""
  if domain not in DOMAINS:
    yield
    return
  from tau2.registry import registry

  build = domain_module(domain).get_environment
  handed: list[Any] = []

  def constructor(solo_mode: bool = False) -> Any:
    handed.append(_fresh_db(domain))
    return build(db=handed[-1], solo_mode=solo_mode)

  with _REGISTRY_LOCK:
    saved = registry.get_env_constructor(domain)
    registry._domains[domain] = constructor
    try:
      yield
    finally:
      registry._domains[domain] = saved
  # the evaluator's environments are gone once it returned: their databases serve the next ones
  while handed:
    db = handed.pop()
    _give_back(domain, db)
    del db


def tau2_reward(domain: str, task: Any, messages: list[Any], termination: str) -> Tau2Reward:
  """tau2's ``evaluate_simulation`` (``EvaluationType.ALL``) of the episode ``messages`` (Telecom: with
  a bill counter restarted at 0 and the shared VPN record restored, see the module docstring; Retail
  and Airline: environments over the parsed database, ``parsed_database``)."""
  ev = tau2_modules()["evaluator"]
  check_domain(domain, ENV_DOMAINS)
  with quiet_serializer(), tool_ids(episode_ids(domain)), parsed_database(domain):
    if domain == TELECOM:
      _telecom_bridge()._fresh_vpn_server()
    info = ev.evaluate_simulation(simulation=simulation_run(task, messages, termination), task=task,
                                  evaluation_type=ev.EvaluationType.ALL, solo_mode=False, domain=domain)
  breakdown = {getattr(k, "value", str(k)): float(v) for k, v in (info.reward_breakdown or {}).items()}
  db_match = None if info.db_check is None else bool(info.db_check.db_match)
  comm = tuple((c.info, bool(c.met)) for c in info.communicate_checks or [])
  note = str((info.info or {}).get("note", "")) if isinstance(info.info, dict) else ""
  return Tau2Reward(reward=float(info.reward), breakdown=breakdown, db_match=db_match, communicate=comm,
                    method="tau2", note=note)


@functools.cache
def initial_db_hash(domain: str) -> str:
  """tau2's hash of the domain's initial database (what an episode that wrote nothing leaves)."""
  with quiet_serializer():
    return new_environment(domain).get_db_hash()


def fast_reward(domain: str, task: Any, env: Any, messages: list[Any], termination: str,
                untouched: bool = False) -> Tau2Reward:
  """What ``tau2_reward`` gives, read off the live environment ``env`` instead of a replay.

  untouched: the caller knows ``env`` holds the initial database (no initial state, nothing written);
    the answer is then the task's own, ``gold_is_initial``, computed once.

  Follows tau2's evaluator step by step: 0 unless the episode ended by a stop; 1 without criteria;
  the DB basis compares the live database with ``gold_db`` as tau2's hash would (``_same_database``,
  hashing only equal objects whose dumps differ); ENV_ASSERTION runs the
  task's assertions on ``env``; COMMUNICATE and ACTION call tau2's own checks on ``messages``.
  NL assertions need an LLM judge: those tasks go to ``tau2_reward`` (which refuses them too).
  """
  mods = tau2_modules()
  reason = TERMINATION.get(termination)
  if reason is None:
    raise ValueError(f"termination: expected one of {sorted(TERMINATION)}, got {termination!r}")
  if reason not in ("agent_stop", "user_stop"):
    return Tau2Reward(0.0, {}, None, (), "fast", note=f"the episode ended by {termination}, not by a stop")
  criteria = task.evaluation_criteria
  if criteria is None:
    return Tau2Reward(1.0, {}, None, (), "fast", note="no evaluation criteria")
  basis = {getattr(b, "value", str(b)) for b in criteria.reward_basis}
  if "NL_ASSERTION" in basis:
    return tau2_reward(domain, task, messages, termination)
  reward, breakdown = 1.0, {}
  db_match = None
  if basis & {"DB", "ENV_ASSERTION"}:
    if criteria.actions is None and criteria.env_assertions is None:
      db_reward, db_match = 1.0, True
    else:
      if untouched:
        db_match = gold_is_initial(domain, task)
      else:
        db_match = _same_database(env.tools.db, env.get_db_hash, gold_db(domain, task), lambda: gold_hash(domain, task))
      db_reward = 1.0 if db_match else 0.0
    assertion_reward = 1.0
    for assertion in criteria.env_assertions or []:
      assertion_reward *= 1.0 if env.run_env_assertion(assertion, raise_assertion_error=False) else 0.0
    if "DB" in basis:
      breakdown["DB"] = db_reward
      reward *= db_reward
    if "ENV_ASSERTION" in basis:
      breakdown["ENV_ASSERTION"] = assertion_reward
      reward *= assertion_reward
  if "ACTION" in basis:
    info = mods["action"].ActionEvaluator.calculate_reward(task=task, full_trajectory=messages)
    breakdown["ACTION"] = float(info.reward)
    reward *= float(info.reward)
  comm: tuple[tuple[str, bool], ...] = ()
  if "COMMUNICATE" in basis:
    info = mods["communicate"].CommunicateEvaluator.calculate_reward(task=task, full_trajectory=messages)
    comm = tuple((c.info, bool(c.met)) for c in info.communicate_checks or [])
    breakdown["COMMUNICATE"] = float(info.reward)
    reward *= float(info.reward)
  return Tau2Reward(reward=reward, breakdown=breakdown, db_match=db_match, communicate=comm, method="fast")
