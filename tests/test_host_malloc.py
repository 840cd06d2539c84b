"""The allocator settings of ``rti_jax.host_malloc``: when they apply, that the re-executed run gets
them with its command line unchanged, and that they do what they are for (far fewer page faults when
a jitted program's large temporary buffer is freed and allocated again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rti_jax import host_malloc

CPU = dict(glibc=True, accelerator_plugin=False)
needs_glibc = pytest.mark.skipif(not host_malloc.on_glibc(), reason="glibc's allocator variables")


def test_settings_apply_when_asked_on_a_plain_cpu_environment_only():
  keep = {host_malloc.SWITCH: "keep"}
  assert host_malloc.settings_for(keep, **CPU) == host_malloc.SETTINGS
  assert host_malloc.settings_for({**keep, "JAX_PLATFORMS": "cpu"}, **CPU) == host_malloc.SETTINGS
  assert host_malloc.settings_for({}, **CPU) is None  # off by default
  assert host_malloc.settings_for({host_malloc.SWITCH: "system"}, **CPU) is None
  assert host_malloc.settings_for({**keep, "JAX_PLATFORMS": "cuda,cpu"}, **CPU) is None
  assert host_malloc.settings_for(keep, glibc=False, accelerator_plugin=False) is None
  assert host_malloc.settings_for(keep, glibc=True, accelerator_plugin=True) is None
  for var in host_malloc.USER_VARIABLES:  # a user's own allocator choice is left alone
    assert host_malloc.settings_for({**keep, var: "1"}, **CPU) is None


_REPORT = textwrap.dedent("""
    import json, os, sys
    from rti_jax import host_malloc
    host_malloc.reexec_with_settings()
    print(json.dumps({"argv": sys.argv[1:], "utf8": sys.flags.utf8_mode,
                      "env": {k: os.environ.get(k) for k in host_malloc.SETTINGS}}))
""")


def _child(env_extra: dict[str, str], tmp_path) -> dict:
  script = tmp_path / "report.py"
  script.write_text(_REPORT)
  env = {k: v for k, v in os.environ.items() if k not in host_malloc.USER_VARIABLES and k != host_malloc.SWITCH}
  env.pop("JAX_PLATFORMS", None)
  out = subprocess.run([sys.executable, "-X", "utf8", str(script), "--exp=x", "a b"], env={**env, **env_extra},
                       capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


@needs_glibc
def test_the_reexecuted_process_has_the_settings_and_the_same_arguments(tmp_path):
  got = _child({host_malloc.SWITCH: "keep"}, tmp_path)
  assert got["argv"] == ["--exp=x", "a b"] and got["utf8"] == 1  # the interpreter's own options survive too
  assert got["env"] == host_malloc.SETTINGS
  off = _child({}, tmp_path)
  assert off["argv"] == ["--exp=x", "a b"] and off["env"] == {k: None for k in host_malloc.SETTINGS}
  mine = _child({host_malloc.SWITCH: "keep", "MALLOC_ARENA_MAX": "4"}, tmp_path)
  assert mine["env"] == {"MALLOC_ARENA_MAX": "4", "MALLOC_MMAP_MAX_": None, "MALLOC_TRIM_THRESHOLD_": None}


_FAULTS = textwrap.dedent("""
    import resource
    import jax, jax.numpy as jnp
    h = jnp.full((8192, 128), 0.01, jnp.float32)
    w = jnp.full((128, 2048), 0.01, jnp.float32)
    ids = jnp.zeros((8192,), jnp.int32)
    # a token log-prob pass in miniature: its [8192, 2048] logits are a 64 MiB temporary buffer
    f = jax.jit(lambda h, w: jnp.take_along_axis(jax.nn.log_softmax(h @ w), ids[:, None], 1).sum())
    for _ in range(3):
        f(h, w).block_until_ready()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(32):
        f(h, w).block_until_ready()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


@needs_glibc
def test_the_settings_stop_a_freed_temporary_from_faulting_in_again(tmp_path):
  script = tmp_path / "faults.py"
  script.write_text(_FAULTS)
  env = {k: v for k, v in os.environ.items() if k not in host_malloc.USER_VARIABLES}
  env["JAX_PLATFORMS"] = "cpu"

  def faults(extra: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, str(script)], env={**env, **extra}, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])

  plain, kept = faults({}), faults(host_malloc.SETTINGS)
  # 32 temporaries of 64 MiB are 32 x 16,384 pages of 4 KiB, mapped anew each time without the settings;
  # with them the heap grows to hold a few such buffers (the frees run on XLA's threads) and then reuses them
  assert plain > 16 * 16384, plain
  assert kept < plain / 4, (kept, plain)
