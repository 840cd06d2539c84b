"""Logical axes on every Qwen parameter, activation constraints, tensor parallelism, the decode copy.

The mesh-equivalence check runs ``tests/_tp_check.py`` in a subprocess (8 forced CPU devices must
be set before jax is imported), once per session: a tiny Qwen3 on meshes (fsdp=8), (fsdp=4,
tensor=2), (data=2, fsdp=2, tensor=2) and a tiny Qwen3-MoE on the last, each against one device.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from models import sampler as sampler_lib
from models.config import QwenConfig
from models.qwen import Qwen, annotate_logical_axes
from models.sampler import Sampler
from models.weight_table import expand_table
from rti_jax import sharding as S

HERE = pathlib.Path(__file__).resolve().parent
#: meshes per family: the dense model on all three; the MoE (experts over the tensor axis) on the one
#: that has every axis
MESHES = {"qwen3": ["1x8x1", "1x4x2", "2x2x2"], "qwen3_moe": ["2x2x2"]}
CASES = [(family, mesh) for family, meshes in MESHES.items() for mesh in meshes]


def _config(family: str = "qwen3", **kw) -> QwenConfig:
  moe = family == "qwen3_moe"
  base = dict(model_type=family, vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=8, max_position_embeddings=128, num_experts=4 if moe else 0,
              num_experts_per_tok=2 if moe else 0, moe_intermediate_size=16 if moe else 0)
  base.update(kw)
  return QwenConfig(**base)


def _params(model) -> dict:
  return dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("family, kw", [
  ("qwen3", {}), ("qwen3", {"tie_word_embeddings": True}), ("qwen2", {"qkv_bias": True, "qk_norm": False}),
  ("qwen3_moe", {"mlp_only_layers": (1,)}),
])
def test_every_parameter_carries_the_logical_axes_of_its_weight_table_row(family, kw):
  config = _config(family, **kw)
  params = _params(nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0))))
  rows = {e.path: e.spec for e in expand_table(config)}
  assert set(params) == set(rows)  # the table names every parameter, and nothing else
  for path, var in params.items():
    axes = var.get_metadata()[S.LOGICAL_AXES_KEY]
    assert axes == rows[path].axes and len(axes) == var.ndim, path
    assert all(a is None or a in S.LOGICAL_AXIS_RULES for a in axes), (path, axes)
  kernel = params[("layers", 0, "attn", "q_proj", "kernel")].get_metadata()[S.LOGICAL_AXES_KEY]
  assert kernel == ("embed", "heads")


def test_a_parameter_without_a_table_row_is_refused():
  model = Qwen(_config(), rngs=nnx.Rngs(0))
  model.layers[0].attn.extra = nnx.Param(jnp.zeros((3,)))
  with pytest.raises(ValueError, match="layers.0.attn.extra: no row of the weight table"):
    annotate_logical_axes(model, model.config)


class _FakeMesh:
  def __init__(self, **shape: int):
    self.shape = shape


def test_the_tensor_axis_splits_heads_mlp_and_vocab_and_decode_rules_keep_embed_whole():
  config = _config()
  params = _params(nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0))))
  mesh = _FakeMesh(data=2, fsdp=2, tensor=2)

  def spec(path, rules=S.LOGICAL_AXIS_RULES):
    var = params[path]
    return S.logical_to_spec(var.get_metadata()[S.LOGICAL_AXES_KEY], mesh=mesh, shape=var.shape, rules=rules)

  assert spec(("layers", 0, "attn", "q_proj", "kernel")) == P("fsdp", "tensor")
  assert spec(("layers", 0, "attn", "k_proj", "kernel")) == P("fsdp", "tensor")
  assert spec(("layers", 0, "attn", "o_proj", "kernel")) == P("tensor", "fsdp")
  assert spec(("layers", 1, "mlp", "down_proj", "kernel")) == P("tensor", "fsdp")
  assert spec(("lm_head",)) == P("fsdp", "tensor")
  assert spec(("embed", "embedding")) == P("tensor", "fsdp")
  assert spec(("norm", "scale")) == P(None)
  assert spec(("layers", 0, "attn", "q_proj", "kernel"), S.DECODE_AXIS_RULES) == P(None, "tensor")


def test_fused_head_dimensions_split_only_between_whole_heads():
  from models.weights import partition_spec

  config = _config(num_kv_heads=1)  # k_proj kernel [32, 1 * 8]: one kv head of 8
  params = _params(nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0))))
  rows = {e.path: e.spec for e in expand_table(config)}
  mesh = _FakeMesh(data=1, fsdp=1, tensor=2)
  k = params[("layers", 0, "attn", "k_proj", "kernel")]
  meta = k.get_metadata()
  assert meta[S.LOGICAL_UNITS_KEY] == (1, 8)
  fallbacks: list[str] = []
  spec = S.logical_to_spec(meta[S.LOGICAL_AXES_KEY], mesh=mesh, shape=k.shape, units=meta[S.LOGICAL_UNITS_KEY],
                           fallbacks=fallbacks)
  assert spec == P(None, None) and "blocks of 8" in fallbacks[0]
  assert S.logical_to_spec(meta[S.LOGICAL_AXES_KEY], mesh=mesh, shape=k.shape) == P(None, "tensor")  # half a head
  row = rows[("layers", 0, "attn", "k_proj", "kernel")]
  assert partition_spec(row, k.shape, mesh, config=config) == (P(None, None), True)  # the loader agrees
  q = params[("layers", 0, "attn", "q_proj", "kernel")]  # 4 query heads: 2 per device
  assert partition_spec(rows[("layers", 0, "attn", "q_proj", "kernel")], q.shape, mesh, config=config) == (
    P(None, "tensor"), False)


def _count_constraints(jaxpr) -> int:
  import jax.extend

  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == "sharding_constraint"
    n += sum(_count_constraints(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params))
  return n


def test_activation_constraints_only_under_a_multi_device_mesh():
  model = Qwen(_config(), rngs=nnx.Rngs(0))
  ids = jnp.ones((2, 5), jnp.int32)
  x = jnp.ones((4, 6))
  assert S.constrain(x, ("batch", "act_mlp")) is x  # outside activation_sharding: unchanged
  with S.activation_sharding(S.make_mesh(devices=jax.devices()[:1])):  # one device: no constraints
    assert S.constrain(x, ("batch", "act_mlp")) is x
    assert _count_constraints(jax.make_jaxpr(lambda i: model(i))(ids).jaxpr) == 0
  with S.activation_sharding(None):
    assert S.constrain(x, ("batch", "act_mlp")) is x


def _bf16_model(family: str = "qwen3") -> Qwen:
  """bf16 compute with fp32 master weights, random weights wide enough for clear greedy margins."""
  model = Qwen(_config(family), dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  nnx.update(model, jax.tree.map(lambda x: jnp.asarray(0.3 * rng.normal(size=x.shape), jnp.float32),
                                 nnx.state(model, nnx.Param)))
  return model


@pytest.mark.slow
@pytest.mark.parametrize("family", list(MESHES))
def test_bf16_decode_copy_gives_exactly_the_numbers_of_the_fp32_master_weights(family):
  """Casting the parameters once is what a bf16-compute module does before each use."""
  model = _bf16_model(family)
  sampler = Sampler(model, max_cache_len=64)
  assert {x.dtype for x in jax.tree.leaves(sampler.state)} == {jnp.dtype(jnp.bfloat16)}
  prompts = [[5, 6, 7], [1], [9, 8, 7, 6]]
  out = sampler.generate(prompts, key=jax.random.key(0), max_new_tokens=6, temperature=0.0)
  scores = sampler.score(prompts, [list(t) for t in out.tokens])
  sampler.state = nnx.split(model)[1]  # the fp32 master weights themselves, cast at each matmul
  ref = sampler.generate(prompts, key=jax.random.key(0), max_new_tokens=6, temperature=0.0)
  ref_scores = sampler.score(prompts, [list(t) for t in out.tokens])
  for a, b in zip(out.tokens + out.logprobs + scores, ref.tokens + ref.logprobs + ref_scores):
    np.testing.assert_array_equal(a, b)
  assert np.ptp(np.concatenate(out.logprobs)) > 0.1  # not a degenerate comparison


def test_fp32_policy_on_one_device_is_decoded_without_a_copy_and_sync_stays_on_device():
  model = Qwen(_config(), rngs=nnx.Rngs(0))
  sampler = Sampler(model, max_cache_len=64, mesh=S.make_mesh(devices=jax.devices()[:1]))
  for a, b in zip(jax.tree.leaves(sampler.state), jax.tree.leaves(nnx.state(model))):
    assert a is b
  bf16 = Sampler(_bf16_model(), max_cache_len=64)
  new = _bf16_model()
  with jax.transfer_guard("disallow"):  # no host <-> device transfer in the weight sync
    bf16.sync_weights(new)
  assert {x.dtype for x in jax.tree.leaves(bf16.state)} == {jnp.dtype(jnp.bfloat16)}


def test_the_generate_cache_is_shared_across_samplers_of_one_mesh():
  model = Qwen(_config(), rngs=nnx.Rngs(0))
  Sampler(model, max_cache_len=64).generate([[1, 2]], key=jax.random.key(0), max_new_tokens=3)
  before = sampler_lib._generate_jit._cache_size()
  Sampler(model, max_cache_len=64, mesh=S.make_mesh(devices=jax.devices()[:1])).generate(
    [[3, 4]], key=jax.random.key(1), max_new_tokens=3)
  assert sampler_lib._generate_jit._cache_size() == before  # a one-device mesh decodes as no mesh


def test_trainer_loads_onto_its_mesh_and_keeps_one_copy(toy_policy, tmp_path):
  from rti_jax.config import load_config
  from rti_jax.envs.source import TaskSource
  from rti_jax.trainer import Trainer
  from trainer_fixtures import LengthRewardEnv

  cfg = load_config("navigation", [f"policy.path={toy_policy}", "loss.method=grpo", "rollout.tasks_per_iter=2",
                                   "rollout.group_size=2", "rollout.max_new_tokens=6", "rollout.max_context=64",
                                   "train.val_tasks=0"])
  src = TaskSource(train=list(range(4)), test=[100], env_factory=LengthRewardEnv, task_id=str, subsets={},
                   domain="navigation")
  tr = Trainer(cfg, tmp_path / "run", source=src, progress=False)
  assert not hasattr(tr, "model")  # no reference to the loaded parameters outside the train state
  params = jax.tree.leaves(tr.state.params)
  assert all(isinstance(x.sharding, jax.sharding.NamedSharding) and x.sharding.mesh == tr.mesh for x in params)
  # fp32 on one device: the sampler decodes from the train state's own arrays (no second copy)
  for a, b in zip(jax.tree.leaves(tr.backend.sampler.state), params):
    assert a is b


@pytest.fixture(scope="module")
def tp_report() -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # XLA_FLAGS as the tests set it (tests/conftest.py); the script adds its device count
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
  proc = subprocess.run([sys.executable, str(HERE / "_tp_check.py"), *(f"{f}:{','.join(m)}" for f, m in MESHES.items())],
                        capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=1500)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("family, mesh", CASES)
def test_sharded_train_step_and_sampler_equal_one_device(tp_report, family, mesh):
  fam = tp_report[family]
  got = fam["meshes"][mesh]
  assert got["loss_diff"] <= 1e-5 and got["grad_diff"] <= 1e-5 and got["param_diff"] <= 1e-5, got
  assert fam["param_moved"] > 1e-3  # two AdamW steps really moved the parameters
  assert got["tokens_equal"] and got["cached_tokens_equal"]
  assert got["logprob_diff"] <= 5e-5 and got["score_diff"] <= 5e-5 and got["cached_logprob_diff"] <= 5e-5, got
  assert fam["reference_score_consistency"] <= 5e-5  # scored log-probs are the generated ones
  assert len({len(t) for t in fam["reference_tokens"]}) == 1 and len(set(map(tuple, fam["reference_tokens"]))) > 1
  # the model's own constraints (q/k/v, attention output, residual, MLP hidden, cache, logits) are
  # in the traced step on a mesh; on one device only the train step's logits constraint is
  assert got["constraints"] > fam["reference_constraints"] + 20, (got["constraints"], fam["reference_constraints"])
  assert got["bf16_copy_dtypes"] == ["bfloat16"] and got["bf16_master_dtypes"] == ["float32"]


@pytest.mark.slow
def test_parameters_and_decode_copy_use_the_tensor_axis(tp_report):
  dense = tp_report["qwen3"]["meshes"]["1x4x2"]
  assert dense["specs"]["layers.0.attn.q_proj.kernel"] == "P('fsdp', 'tensor')"
  assert dense["specs"]["layers.0.attn.o_proj.kernel"] == "P('tensor', 'fsdp')"
  assert dense["specs"]["layers.1.mlp.gate_proj.kernel"] == "P('fsdp', 'tensor')"
  assert dense["specs"]["lm_head"] == "P('fsdp', 'tensor')"
  assert dense["decode_specs"]["layers.0.attn.q_proj.kernel"] == "P(None, 'tensor')"
  assert dense["decode_specs"]["embed.embedding"] == "P('tensor', None)"
  assert dense["fallbacks"] == []
  # the KV cache [B, Kv, S, D]: rows over the batch axes, kv heads over tensor
  assert dense["cache_spec"] == "P('fsdp', 'tensor', None, None)"
  assert tp_report["qwen3"]["meshes"]["1x8x1"]["cache_spec"] == "P('fsdp', None, None, None)"
  assert tp_report["qwen3_moe"]["meshes"]["2x2x2"]["cache_spec"] == "P(('data', 'fsdp'), 'tensor', None, None)"
  assert tp_report["qwen3"]["meshes"]["1x8x1"]["specs"]["layers.0.attn.q_proj.kernel"] == "P('fsdp', None)"
  moe = tp_report["qwen3_moe"]["meshes"]["2x2x2"]
  assert moe["specs"]["layers.0.mlp.gate_proj"] == "P('tensor', 'fsdp', None)"  # experts over tensor
  assert moe["decode_specs"]["layers.0.mlp.gate_proj"] == "P('tensor', None, None)"
  assert all("mlp" in f and "already used" in f for f in moe["fallbacks"])  # the counted expert-mlp fallback


def _trainer_run(policy: str, run_dir: pathlib.Path, mesh: tuple[int, int, int]) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # XLA_FLAGS as the tests set it (tests/conftest.py); the script adds its device count
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
  for attempt in range(2):  # once more after XLA's rendezvous abort (thread starvation under load)
    proc = subprocess.run([sys.executable, str(HERE / "_tp_trainer_check.py"), policy, str(run_dir), *map(str, mesh)],
                          capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=900)
    if proc.returncode == 0 or "Termination timeout for `all reduce" not in proc.stderr:
      break
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_trainer_iteration_on_a_tensor_parallel_mesh_equals_one_device(toy_policy, tmp_path):
  """Load onto (fsdp=4, tensor=2), roll out from the decode copy, update, sync: the iteration's
  rollouts and update match the one-device trainer's."""
  from rti_jax.trainer import TIMING_KEYS

  import _tp_trainer_check

  ref = _tp_trainer_check.run(toy_policy, str(tmp_path / "one"), 1, 1, 1)  # in this process, on one device
  got = _trainer_run(toy_policy, tmp_path / "tp", (1, 4, 2))
  assert ref["devices"] == 1 and got["devices"] == 8 and got["mesh"] == {"data": 1, "fsdp": 4, "tensor": 2}
  assert not got["has_model"] and got["sampler_mesh"] == got["mesh"]
  q = "['layers'][0]['attn']['q_proj']['kernel'].value"
  assert got["specs"][q] == "P('fsdp', 'tensor')" and got["decode_specs"][q] == "P(None, 'tensor')"
  a, b = ref["record"], got["record"]
  assert set(a) == set(b)
  for key in sorted(set(a) - set(TIMING_KEYS)):
    if isinstance(a[key], float) and np.isnan(a[key]):
      assert np.isnan(b[key]), key
    elif key in ("tokens", "reward_mean", "length_cut_turns", "num_tokens") or key.startswith("rti/"):
      assert a[key] == b[key], key  # the same rollouts
    else:
      assert abs(a[key] - b[key]) <= 1e-5, (key, a[key], b[key])
  assert a["grad_norm"] > 0.1  # the update is not a no-op
