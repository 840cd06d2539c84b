"""QwenConfig from config.json: family switches, rope parameters, unsupported models."""

import json

import pytest

from models.config import SUPPORTED_ARCHITECTURES, QwenConfig, UnsupportedModelError
from models_fixtures import tiny_hf_model


def _hf_dict(family: str, **kw) -> dict:
  return json.loads(tiny_hf_model(family, **kw).config.to_json_string())


def test_qwen3_switches_and_rope_theta_from_rope_parameters():
  c = QwenConfig.from_hf_dict(_hf_dict("qwen3"))
  assert (c.model_type, c.qk_norm, c.qkv_bias, c.o_bias) == ("qwen3", True, False, False)
  assert (c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta) == (4, 2, 8, 1e6)
  assert c.architecture == "Qwen3ForCausalLM"


def test_qwen2_has_qkv_bias_no_qk_norm_and_head_dim_from_hidden_size():
  hf = _hf_dict("qwen2", tie=True)
  hf.pop("head_dim", None)
  c = QwenConfig.from_hf_dict(hf)
  assert (c.model_type, c.qk_norm, c.qkv_bias, c.o_bias, c.tie_word_embeddings) == (
    "qwen2", False, True, False, True)
  assert c.head_dim == 32 // 4


def test_legacy_top_level_rope_theta_is_read():
  hf = _hf_dict("qwen3")
  hf.pop("rope_parameters")
  hf["rope_theta"] = 12345.0
  assert QwenConfig.from_hf_dict(hf).rope_theta == 12345.0


def test_to_hf_dict_round_trips():
  hf = _hf_dict("qwen3", rope={"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0})
  c = QwenConfig.from_hf_dict(hf)
  assert (c.rope_type, c.rope_factor) == ("linear", 2.0)
  assert QwenConfig.from_hf_dict(c.to_hf_dict()) == c


@pytest.mark.parametrize("change, needle", [
  ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "Qwen3ForCausalLM"),
  ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}, "Qwen3MoeForCausalLM"),
  ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "yarn"),
  ({"use_sliding_window": True}, "use_sliding_window"),
])
def test_unsupported_models_get_a_clear_error(change, needle):
  hf = _hf_dict("qwen3")
  hf.update(change)
  with pytest.raises(UnsupportedModelError, match=needle):
    QwenConfig.from_hf_dict(hf)


def test_unsupported_architecture_error_lists_all_supported():
  hf = _hf_dict("qwen3")
  hf.update({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
  with pytest.raises(UnsupportedModelError) as err:
    QwenConfig.from_hf_dict(hf)
  for arch in SUPPORTED_ARCHITECTURES:
    assert arch in str(err.value)


def test_missing_config_json_names_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    QwenConfig.from_pretrained(tmp_path)


def test_qwen3_moe_fields_and_sparse_layer_choice_match_transformers():
  hf = _hf_dict("qwen3_moe")
  c = QwenConfig.from_hf_dict(hf)
  assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob) == (4, 2, 16, True)
  assert [c.is_moe_layer(i) for i in range(2)] == [True, False]  # mlp_only_layers=[1]
  c2 = c.replace(num_layers=6, decoder_sparse_step=2, mlp_only_layers=(3,))
  assert [c2.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
  assert QwenConfig.from_hf_dict(c.to_hf_dict()) == c
  assert not QwenConfig.from_hf_dict(_hf_dict("qwen3")).is_moe_layer(0)
