"""Shared test set-up: how XLA compiles the tests' programs, and the tiny random policies that
several test files train or roll out.

The tests compile thousands of tiny programs that each run for milliseconds, so XLA's LLVM
optimisation passes cost more than they save: ``jax_disable_most_optimizations`` turns them off
(the HLO programs are the same; only the machine code generated from them is less tuned), and the
older XLA:CPU fusion emitters replace the MLIR ones (``--xla_cpu_use_fusion_emitters=false``).
``JAX_DISABLE_MOST_OPTIMIZATIONS=0`` in the environment runs the tests with full optimisation.
The variable is set in the environment, not only in jax's config, so that the subprocesses some
tests start compile the same way.

Property tests (hypothesis) draw the same examples on every run and machine (the ``repeatable``
profile, no example database), so a run's outcome depends on the code alone;
``HYPOTHESIS_PROFILE=explore`` draws new examples each run, to look for failures.

Compiled programs are also kept between runs, in pytest's cache directory
(``.pytest_cache/d/jax_compilation_cache``, trimmed to 1 GiB at the end of a run): a second run of the same tests loads
them instead of compiling again. ``pytest --cache-clear`` empties it, ``-p no:cacheprovider`` runs
without it, and ``JAX_COMPILATION_CACHE_DIR`` in the environment puts it elsewhere. The tau2 episodes the SFT builds
play (``experiments/tau2_sft.py``) are kept beside them (``.pytest_cache/d/tau2_episodes``), or,
without pytest's cache, in a temporary directory removed at the end of the run: the tests never
read or write the user's own caches (``RTI_JAX_EPISODE_CACHE`` in the environment chooses).

Python keeps the bytecode of the project's modules and of the assertion-rewritten test modules in
``__pycache__`` directories (ignored by git) during a test run even when
``PYTHONDONTWRITEBYTECODE`` is set: every xdist worker and every subprocess a test starts would
otherwise compile the project's sources and rewrite all test modules again, about 8 s of each
worker's collection (docs/benchmarks.md). ``RTI_JAX_TEST_BYTECODE=0`` keeps Python's setting.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

if os.environ.get("RTI_JAX_TEST_BYTECODE", "1") != "0":
  sys.dont_write_bytecode = False
  os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the workers and subprocesses started from here

os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# XLA:CPU's MLIR fusion emitters compile a small program several times slower than the older
# emitters (docs/benchmarks.md); the tests compile hundreds of them, so they use the older ones
# unless XLA_FLAGS already chooses. The library's own runs keep XLA's default, which is as fast or
# faster on the models' larger programs.
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_use_fusion_emitters=false").strip()

# Runs of experiments/run.py started by tests keep no compiled programs in the user's cache.
os.environ.setdefault("RTI_JAX_COMPILE_CACHE", "off")
# The test workers already fill the cores: experiments train their variants one after the other
# unless a test asks for side-by-side trainings (--jobs).
os.environ.setdefault("RTI_JAX_JOBS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

hypothesis_settings.register_profile("repeatable", derandomize=True, database=None)
hypothesis_settings.register_profile("explore")
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

if os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "1":  # jax may have read the variable before it was set
  jax.config.update("jax_disable_most_optimizations", True)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
  """``-n auto``: one worker per core, at most 4 (each worker holds its own JAX, torch and shared
  policies, about 3 GB, and compiles its own programs)."""
  return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (``--dist loadgroup``)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  """The slow tier first, each tier in its files' order: with ``-n``, the long end-to-end checks
  start while every worker is free, and the short checks fill the end of the run.

  A test that reads a module-scoped fixture of its own file, and has no group of its own, joins
  the xdist group of that fixture: with ``-n`` the fixture (a quick build, a subprocess report) is
  made once per run instead of once per worker that draws one of its tests."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)
  uses: list[tuple[pytest.Item, list[str]]] = []
  parent: dict[str, str] = {}  # module fixtures read by one test share a group (union-find)

  def root(x: str) -> str:
    while parent.setdefault(x, x) != x:
      x = parent[x]
    return x

  for item in items:
    info = getattr(item, "_fixtureinfo", None)
    if item.get_closest_marker("xdist_group") is not None or info is None:
      continue
    module = item.nodeid.split("::")[0]
    own = sorted(f"{module}::{name}" for name, defs in info.name2fixturedefs.items()
                 if defs and defs[-1].scope == "module" and defs[-1].baseid == module)
    if own:
      uses.append((item, own))
      for other in own[1:]:
        a, b = root(own[0]), root(other)
        parent[max(a, b)] = min(a, b)
  for item, own in uses:
    item.add_marker(pytest.mark.xdist_group(root(own[0])))


def pytest_configure(config: pytest.Config) -> None:
  # pytest ends each process with five full garbage collections to surface exceptions raised in
  # finalizers; over a worker's heap of compiled programs and models each takes about 0.8 s. One
  # collection still runs every pending finalizer once.
  try:
    from _pytest.unraisableexception import gc_collect_iterations_key
  except ImportError:  # another pytest: its default
    pass
  else:
    config.stash[gc_collect_iterations_key] = 1
  cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
  # Set before the xdist workers start (they inherit it), so that the run shares one directory.
  if not os.environ.get("RTI_JAX_EPISODE_CACHE"):
    where = str(cache.mkdir("tau2_episodes")) if cache is not None else tempfile.mkdtemp(prefix="rti_jax_episodes_")
    os.environ["RTI_JAX_EPISODE_CACHE"] = where
    config.stash[_EPISODES_TMP] = where if cache is None else None
  if cache is None or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return
  jax.config.update("jax_compilation_cache_dir", str(cache.mkdir("jax_compilation_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # the tests' programs compile in ms
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  # No size limit inside the run: with one, JAX reads every entry's access time on each write (a
  # cold run of the fast tier took twice as long); the run's end trims the directory instead.
  jax.config.update("jax_compilation_cache_max_size", -1)


def pytest_sessionfinish(session: pytest.Session) -> None:
  """The compiled-program cache back to at most ``_CACHE_BYTES``, the entries least recently
  written or read going first, and the run's temporary episode directory removed (once, in the
  process that started the run)."""
  episodes_tmp = session.config.stash.get(_EPISODES_TMP, None)
  if episodes_tmp and not hasattr(session.config, "workerinput"):
    shutil.rmtree(episodes_tmp, ignore_errors=True)
  cache = getattr(session.config, "cache", None)
  if cache is None or hasattr(session.config, "workerinput") or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return
  trim_compilation_cache(cache.mkdir("jax_compilation_cache"), _CACHE_BYTES)


_CACHE_BYTES = 1 << 30
#: the temporary episode directory this run made (removed at its end), None when it is pytest's cache
_EPISODES_TMP = pytest.StashKey[str | None]()


def trim_compilation_cache(path, max_bytes: int) -> int:
  """Deletes the oldest entries of JAX's compilation cache at ``path`` (by the later of their
  access and modification times) until their sizes sum to at most ``max_bytes``, and the access-time
  files of JAX's own size limit; the number of entries deleted."""
  entries = []
  for f in path.iterdir():
    if f.name.endswith("-atime"):
      f.unlink(missing_ok=True)
    elif f.name.endswith("-cache"):
      st = f.stat()
      entries.append((max(st.st_atime, st.st_mtime), st.st_size, f))
  total, deleted = sum(e[1] for e in entries), 0
  for _, size, f in sorted(entries, key=lambda e: e[0]):
    if total <= max_bytes:
      break
    f.unlink(missing_ok=True)
    total, deleted = total - size, deleted + 1
  return deleted


@pytest.fixture(scope="session")
def toy_policy(tmp_path_factory) -> str:
  """A random tied-embedding Qwen3 (2 layers, 4 query / 2 kv heads of dim 8) over the toy words of
  ``trainer_fixtures.WORDS``, for the toy environments; the path of its checkpoint and tokenizer."""
  from models.chat import build_tiny_tokenizer
  from trainer_fixtures import WORDS, write_random_qwen

  path = tmp_path_factory.mktemp("toy_policy")
  tok = build_tiny_tokenizer(WORDS, path)
  return write_random_qwen(path, len(tok), seed=0, layers=2, heads=4, kv_heads=2, head_dim=8, max_positions=1024)


@pytest.fixture(scope="session")
def nav_policy(tmp_path_factory) -> str:
  """A random 1-layer Qwen3 over the Navigation vocabulary (it fails every Navigation task)."""
  from models.chat import build_tiny_tokenizer
  from rti_jax.envs import navigation
  from trainer_fixtures import write_random_qwen

  path = tmp_path_factory.mktemp("nav_policy")
  tok = build_tiny_tokenizer(navigation.vocabulary(), path)
  return write_random_qwen(path, len(tok), seed=1)


@pytest.fixture(scope="session")
def nav_teacher(tmp_path_factory) -> str:
  """Another random Qwen3 with ``nav_policy``'s tokenizer and a wider hidden size (an OPD teacher)."""
  from models.chat import build_tiny_tokenizer
  from rti_jax.envs import navigation
  from trainer_fixtures import write_random_qwen

  path = tmp_path_factory.mktemp("nav_teacher")
  tok = build_tiny_tokenizer(navigation.vocabulary(), path)
  return write_random_qwen(path, len(tok), seed=2, hidden=48)


@pytest.fixture(scope="module")
def optimised_xla():
  """Full XLA optimisation for a test module whose programs run long loops (the theory simulations),
  where the run time of the compiled code outweighs its compile time: such a module says
  ``pytestmark = pytest.mark.usefixtures("optimised_xla")``."""
  before = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", False)
  yield
  jax.config.update("jax_disable_most_optimizations", before)
