"""HF checkpoints in and out through the one weight table."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM

import models
from models.weights import WEIGHT_TABLE, LoadReport, expand_table, partition_spec
from models_fixtures import padded_batch, tiny_hf_model, torch_logits, write_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flax_logits(model, ids, mask):
  return np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_disk_loads_exactly_as_upcast_weights(tmp_path, dtype):
  ref_model = write_checkpoint(tmp_path, "qwen3", dtype=dtype)
  model, config = models.from_pretrained(tmp_path, dtype="float32")
  assert config.dtype == str(dtype).removeprefix("torch.")
  # The rounding the file went through; state_dict only, so RoPE's inv_freq buffer stays fp32.
  ref_model.load_state_dict({k: v.to(dtype).float() for k, v in ref_model.state_dict().items()})
  ids, mask = padded_batch()
  diff = np.abs(_flax_logits(model, ids, mask) - torch_logits(ref_model, ids, mask))
  assert diff[mask.astype(bool)].max() <= 1e-4


def test_sharded_checkpoint_with_index_loads(tmp_path):
  ref_model = write_checkpoint(tmp_path, "qwen2", tie=True, max_shard_size="20KB")
  assert os.path.isfile(tmp_path / "model.safetensors.index.json")
  assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
  model, _ = models.from_pretrained(tmp_path)
  ids, mask = padded_batch()
  diff = np.abs(_flax_logits(model, ids, mask) - torch_logits(ref_model, ids, mask))
  assert diff[mask.astype(bool)].max() <= 1e-4


def _edit_checkpoint(path, edit):
  tensors = load_file(os.path.join(path, "model.safetensors"))
  edit(tensors)
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("edit, needle", [
  (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "model.layers.1.mlp.up_proj.weight"),
  (lambda t: t.update({"model.layers.0.extra.weight": np.zeros(3, np.float32)}), "model.layers.0.extra.weight"),
  (lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((8, 32), np.float32)}),
   r"model.layers.0.self_attn.k_proj.weight.*\(16, 32\).*\(8, 32\)"),
])
def test_bad_checkpoints_name_the_tensor(tmp_path, edit, needle):
  write_checkpoint(tmp_path, "qwen3")
  _edit_checkpoint(tmp_path, edit)
  with pytest.raises(ValueError, match=needle):
    models.from_pretrained(tmp_path)


_K = "model.layers.0.self_attn.k_proj.weight"


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.float64, np.uint8])
def test_a_tensor_of_a_non_float_dtype_fails_naming_the_tensor(tmp_path, dtype):
  """Integer, boolean and float64 tensors are refused, not cast (a float64 tensor is no Qwen checkpoint)."""
  write_checkpoint(tmp_path, "qwen3")
  _edit_checkpoint(tmp_path, lambda t: t.update({_K: (t[_K] * 0 + 1).astype(dtype)}))
  with pytest.raises(ValueError, match=rf"{_K}.*float dtype"):
    models.from_pretrained(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_an_unreadable_safetensors_file_fails_naming_the_file(tmp_path, damage):
  write_checkpoint(tmp_path, "qwen3")
  f = tmp_path / "model.safetensors"
  data = f.read_bytes()
  f.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x07not a tensor file" * 50, "empty": b""}[damage])
  with pytest.raises(ValueError, match="model.safetensors: not a readable safetensors file"):
    models.from_pretrained(tmp_path)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}',
                                  "\xff\xfe"])
def test_an_invalid_config_json_fails_naming_the_file(tmp_path, text):
  write_checkpoint(tmp_path, "qwen3")
  (tmp_path / "config.json").write_text(text, encoding="latin-1")
  with pytest.raises(ValueError, match="config.json"):
    models.from_pretrained(tmp_path)


def test_an_index_naming_a_tensor_its_file_lacks_fails_naming_both(tmp_path):
  write_checkpoint(tmp_path, "qwen2", tie=True, max_shard_size="20KB")
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  name = next(iter(index["weight_map"]))
  other = next(f for f in set(index["weight_map"].values()) if f != index["weight_map"][name])
  index["weight_map"][name] = other
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(ValueError, match=rf"{name}.*{other}"):
    models.from_pretrained(tmp_path)
  (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": 3}')
  with pytest.raises(ValueError, match="index.json: not a readable safetensors index"):
    models.from_pretrained(tmp_path)


def test_rotary_buffer_and_tied_lm_head_are_ignored_and_reported(tmp_path):
  write_checkpoint(tmp_path, "qwen2", tie=True)
  _edit_checkpoint(tmp_path, lambda t: t.update({
    "model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(4, np.float32),
    "lm_head.weight": t["model.embed_tokens.weight"]}))
  report = LoadReport()
  models.from_pretrained(tmp_path, report=report)
  assert sorted(report.ignored) == ["lm_head.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"]


@pytest.mark.parametrize("family, tie", [("qwen3", False), ("qwen2", True), ("qwen3_moe", False)])
def test_table_covers_every_hf_tensor_exactly_once(family, tie):
  from flax import nnx
  from models.weights import abstract_model
  hf_model = tiny_hf_model(family, tie=tie)
  config = models.QwenConfig.from_hf_dict(json.loads(hf_model.config.to_json_string()))
  entries = list(expand_table(config))
  names = [e.hf for e in entries]
  assert len(names) == len(set(names))
  with tempfile.TemporaryDirectory() as d:  # the on-disk names (MoE experts are unfused there)
    hf_model.save_pretrained(d)
    on_disk = set(load_file(os.path.join(d, "model.safetensors")))
  assert set(names) == on_disk
  leaves = dict(nnx.to_flat_state(nnx.state(abstract_model(config), nnx.Param)))
  assert {e.path for e in entries} == set(leaves)  # every Flax parameter is written too
  for e in entries:
    assert len(e.spec.axes) == len(leaves[e.path].shape), e.hf


@pytest.mark.parametrize("family, tie", [("qwen3", False), ("qwen2", True), ("qwen3_moe", True)])
def test_save_then_transformers_load_gives_the_same_logits(tmp_path, family, tie):
  write_checkpoint(tmp_path / "in", family, tie=tie)
  model, config = models.from_pretrained(tmp_path / "in")
  models.save_pretrained(model, config, tmp_path / "out")
  if tie:
    assert "lm_head.weight" not in load_file(os.path.join(tmp_path / "out", "model.safetensors"))
  hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
  assert type(hf).__name__ == config.architecture
  ids, mask = padded_batch(seed=5)
  ref = torch_logits(hf, ids, mask)
  got = _flax_logits(model, ids, mask)
  assert np.abs(got - ref)[mask.astype(bool)].max() <= 1e-4
  reloaded, config2 = models.from_pretrained(tmp_path / "out")
  assert config2 == config
  np.testing.assert_array_equal(_flax_logits(reloaded, ids, mask), got)


def test_save_sharded_bf16_round_trips(tmp_path):
  write_checkpoint(tmp_path / "in", "qwen3")
  model, config = models.from_pretrained(tmp_path / "in")
  models.save_pretrained(model, config, tmp_path / "out", dtype="bfloat16", max_shard_size="30KB")
  index = json.load(open(tmp_path / "out" / "model.safetensors.index.json"))
  assert len(set(index["weight_map"].values())) > 1
  hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
  assert hf.dtype == torch.bfloat16
  m16, _ = models.from_pretrained(tmp_path / "out", dtype="float32")
  ids, mask = padded_batch()
  ref = torch_logits(hf.float(), ids, mask)
  assert np.abs(_flax_logits(m16, ids, mask) - ref)[mask.astype(bool)].max() <= 1e-4


def test_indivisible_dims_fall_back_to_replicated():
  """The loader reads the trainer's sharding table (rti_jax.sharding): embed over fsdp, heads over tensor."""
  from jax.sharding import AbstractMesh

  mesh = AbstractMesh((1, 2, 4), ("data", "fsdp", "tensor"))
  spec = next(s for s in WEIGHT_TABLE if s.hf.endswith("k_proj.weight"))
  pspec, fell_back = partition_spec(spec, (32, 16), mesh)
  assert (tuple(pspec), fell_back) == (("fsdp", "tensor"), False)
  pspec, fell_back = partition_spec(spec, (32, 6), mesh)
  assert (tuple(pspec), fell_back) == (("fsdp", None), True)
  experts = next(s for s in WEIGHT_TABLE if s.hf.endswith("experts.{j}.gate_proj.weight"))
  pspec, _ = partition_spec(experts, (4, 32, 16), mesh)
  assert tuple(pspec) == ("tensor", "fsdp", None)  # mlp's tensor axis is taken by experts


_MESH_SCRIPT = textwrap.dedent("""
  import os, sys
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  import jax, numpy as np
  from jax.sharding import NamedSharding
  from flax import nnx
  import models
  from models.weights import expand_table
  from rti_jax.sharding import make_mesh
  def check(path):
    mesh = make_mesh(data=1, fsdp=2, tensor=4)
    model, config = models.from_pretrained(path, mesh=mesh)
    leaves = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    n_split = 0
    for hf, p, spec, _ in expand_table(config):
      arr = leaves[p].get_value()
      assert isinstance(arr.sharding, NamedSharding), (hf, arr.sharding)
      assert len(arr.sharding.device_set) == 8, hf
      shard = arr.addressable_shards[0].data.shape
      if any(a is not None for a in arr.sharding.spec):
        assert np.prod(shard) < np.prod(arr.shape), (hf, shard)
        n_split += 1
    assert n_split >= 9, n_split
    P = jax.sharding.PartitionSpec
    if config.num_experts:  # [experts, embed, mlp]: experts over "tensor", embed over "fsdp"
      experts = leaves[("layers", 0, "mlp", "gate_proj")].get_value()
      assert experts.sharding.spec == P("tensor", "fsdp", None), experts.sharding.spec
      assert experts.addressable_shards[0].data.shape == (1, 16, 16)
    else:
      kernel = leaves[("layers", 0, "mlp", "gate_proj", "kernel")].get_value()
      assert kernel.sharding.spec == P("fsdp", "tensor"), kernel.sharding.spec
      assert kernel.addressable_shards[0].data.shape == (16, 12)
    batch = np.load(os.path.join(path, "batch.npz"))
    ids, mask, want = batch["ids"], batch["mask"], batch["logits"]
    got = np.asarray(jax.jit(lambda m, i, k: m(i, k))(model, ids, mask))
    assert np.abs(got - want)[mask.astype(bool)].max() <= 1e-5
    from models.sampler import Sampler
    out = Sampler(model).generate([[5, 6, 7], [1]], key=jax.random.key(0), max_new_tokens=6,
                                  temperature=0.0)
    np.testing.assert_array_equal(np.stack(out.tokens), batch["greedy"])
    print("MESH-OK", config.model_type, n_split)
  for path in sys.argv[1:]:
    check(path)
""")


@pytest.mark.slow
def test_shard_on_load_over_8_host_devices(tmp_path):
  """Qwen3 and Qwen3-MoE, in one subprocess: XLA_FLAGS must be set before jax is imported."""
  families = ["qwen3", "qwen3_moe"]
  for family in families:
    path = tmp_path / family
    write_checkpoint(path, family)
    ids, mask = padded_batch()
    plain, _ = models.from_pretrained(path)
    greedy = models.Sampler(plain).generate([[5, 6, 7], [1]], key=jax.random.key(0),
                                           max_new_tokens=6, temperature=0.0)
    np.savez(path / "batch.npz", ids=ids, mask=mask, logits=_flax_logits(plain, ids, mask),
             greedy=np.stack(greedy.tokens))
  env = dict(os.environ)  # the tests' XLA flags (tests/conftest.py); the script adds its device count
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)  # `models` from this tree
  res = subprocess.run([sys.executable, "-c", _MESH_SCRIPT] + [str(tmp_path / f) for f in families],
                       capture_output=True, text=True, env=env, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  for family in families:
    assert f"MESH-OK {family}" in res.stdout


def test_save_and_load_reject_an_unknown_dtype(tmp_path):
  write_checkpoint(tmp_path / "in", "qwen3")
  model, config = models.from_pretrained(tmp_path / "in")
  with pytest.raises(ValueError, match="dtype: expected one of .*'int8'"):
    models.save_pretrained(model, config, tmp_path / "out", dtype="int8")
  with pytest.raises(ValueError, match="dtype: expected one of .*int8"):
    models.from_pretrained(tmp_path / "in", dtype="int8")


def test_a_freshly_initialised_model_saves_for_transformers(tmp_path):
  """The tiny default policy starts from random init, not from a checkpoint."""
  from flax import nnx
  config = models.QwenConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=48,
                             num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                             tie_word_embeddings=True)
  model = models.Qwen(config, rngs=nnx.Rngs(3))
  models.save_pretrained(model, config, tmp_path)
  hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
  ids, mask = padded_batch(vocab=64)
  ref = torch_logits(hf, ids, mask)
  assert np.abs(_flax_logits(model, ids, mask) - ref)[mask.astype(bool)].max() <= 1e-5
  assert np.abs(ref).max() > 0.01


@pytest.mark.slow
def test_bf16_compute_with_fp32_master_weights(tmp_path):
  """param_dtype=float32 with dtype=bfloat16: the checkpoint's fp32 values are kept exactly,
  the forward runs in bf16, and a paper-size step (Adam, lr 1e-6) moves the fp32 parameters;
  the same step leaves pure-bf16 parameters where they were (the step is below bf16's spacing)."""
  import optax
  from flax import nnx

  from rti_jax import sharding
  from rti_jax.objectives import LossConfig, RTIBatch

  write_checkpoint(tmp_path, "qwen3")
  ref, _ = models.from_pretrained(tmp_path, dtype="float32")
  mixed, _ = models.from_pretrained(tmp_path, dtype="bfloat16", param_dtype="float32")
  pure, _ = models.from_pretrained(tmp_path, dtype="bfloat16")
  for a, b in zip(jax.tree.leaves(nnx.state(ref, nnx.Param)), jax.tree.leaves(nnx.state(mixed, nnx.Param))):
    assert b.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ids, mask = padded_batch()
  valid = mask.astype(bool)
  l_ref, l_mixed, l_pure = (_flax_logits(m, ids, mask) for m in (ref, mixed, pure))
  np.testing.assert_allclose(l_mixed[valid], l_pure[valid], atol=1e-6)  # the same bf16 forward
  assert 0 < np.abs(l_mixed - l_ref)[valid].max() < 0.1

  b, t = ids.shape
  batch = RTIBatch(input_ids=jnp.asarray(ids, jnp.int32), attention_mask=jnp.asarray(mask, jnp.int32),
                   loss_mask=jnp.asarray(mask, jnp.float32), old_logp=jnp.full((b, t), -5.0),
                   advantages=jnp.asarray(np.linspace(-1, 1, b), jnp.float32))
  moved = {}
  for name, model in (("mixed", mixed), ("pure", pure)):
    before = [np.asarray(x, np.float32) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
    step = sharding.make_train_step(model, optax.adam(1e-6), sharding.make_mesh(devices=jax.devices()[:1]),
                                    LossConfig(name="grpo"))
    state, _ = step.step(step.state, step.shard_batch(batch))
    after = [np.asarray(x, np.float32) for x in jax.tree.leaves(state.params)]
    moved[name] = np.mean([np.mean(x != y) for x, y in zip(before, after)])
  assert moved["mixed"] > 0.9
  assert moved["pure"] < 0.1


def test_weight_sync_writes_the_checkpoint_dtype_from_fp32_master_weights(tmp_path):
  """A bf16 checkpoint trained with fp32 master weights is written back in bf16 by the SGLang
  weight sync (half the bytes), exactly round-tripping the values it was loaded with."""
  from safetensors import safe_open

  from rti_jax.generation.jax_backend import qwen_save_fn

  write_checkpoint(tmp_path / "ckpt", "qwen3", dtype=torch.bfloat16)
  mixed, config = models.from_pretrained(tmp_path / "ckpt", dtype="bfloat16", param_dtype="float32")
  assert config.dtype == "bfloat16"
  qwen_save_fn(mixed, str(tmp_path / "sync"))
  with safe_open(str(tmp_path / "sync" / "model.safetensors"), framework="numpy") as f:
    names = list(f.keys())
    assert names and all(str(f.get_slice(k).get_dtype()) == "BF16" for k in names)
  back, _ = models.from_pretrained(tmp_path / "sync", dtype="float32")
  again, _ = models.from_pretrained(tmp_path / "ckpt", dtype="float32")
  from flax import nnx
  for a, b in zip(jax.tree.leaves(nnx.state(back, nnx.Param)), jax.tree.leaves(nnx.state(again, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
