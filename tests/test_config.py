"""Configs: YAML + overrides build typed dataclasses; bad values name their key."""

import math

import pytest

from rti_jax.config import CONFIG_DIR, ConfigError, ExperimentConfig, load_config, to_yaml


def test_paper_config_carries_the_paper_settings():
  cfg = load_config("navigation_qwen3_8b", ["policy.path=/ckpt/Qwen3-8B"])
  assert isinstance(cfg, ExperimentConfig)
  assert cfg.optim.lr == 1e-6 and cfg.optim.weight_decay == 0.1
  assert cfg.rollout.temperature == 0.8 and cfg.rollout.group_size == 8
  assert cfg.loss.clip_low == cfg.loss.clip_high == 0.2 and cfg.intervention.eps_cal == 0.2
  assert cfg.intervention.delta == 5.0 and cfg.env.max_turns == 6
  assert cfg.policy.path == "/ckpt/Qwen3-8B"


def test_overrides_win_and_inf_delta_parses():
  cfg = load_config("navigation_qwen3_8b", ["policy.path=/p", "intervention.delta=inf", "loss.method=grpo"])
  assert math.isinf(cfg.intervention.delta) and cfg.loss.method == "grpo"


@pytest.mark.parametrize(
    "override, key",
    [
        ("loss.method=foo", "loss.method"),
        ("optim.lr=abc", "optim.lr"),
        ("nope=1", "nope"),
        ("rollout.group_size=1", "rollout.group_size"),
        ("intervention.eps_cal=1.5", "intervention.eps_cal"),
        ("intervention.delta=-1", "intervention.delta"),
        ("rollout.top_p=0", "rollout.top_p"),
        ("mesh.data=0", "mesh.data"),
        ("train.val_tasks=-1", "train.val_tasks"),
        ("train.val_tasks=100000", "train.val_tasks"),
        ("rollout.prefix_cache_mb=-1", "rollout.prefix_cache_mb"),
        ("rollout.prefix_cache_mb=lots", "rollout.prefix_cache_mb"),
    ],
)
def test_bad_values_raise_naming_the_key(override, key):
  with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
    load_config("navigation_qwen3_8b", ["policy.path=/p", override])


def test_missing_required_path_is_an_error():
  with pytest.raises(ConfigError, match="policy.path"):
    load_config("navigation_qwen3_8b")


def test_unknown_config_name_lists_known_ones():
  with pytest.raises(ConfigError, match="navigation_qwen3_8b"):
    load_config("no_such_config")


def test_every_shipped_yaml_loads():
  for path in CONFIG_DIR.glob("*.yaml"):
    cfg = load_config(str(path), ["policy.path=/p"])
    assert "policy:" in to_yaml(cfg)


def test_yaml_boolean_words_stay_strings_for_string_fields():
  cfg = load_config("navigation_qwen3_8b", ["policy.path=/p", "intervention.verifier=off", "intervention.reweight=off"])
  assert cfg.intervention.verifier == "off" and cfg.intervention.reweight is False
