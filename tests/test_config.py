"""Configs: YAML + overrides build typed dataclasses; bad values name their key."""

import math

import pytest

from rti_jax.config import _CHOICES, CONFIG_DIR, ConfigError, ExperimentConfig, load_config, to_yaml


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
        # checked by the runtime classes the config builds, reported by YAML key
        ("rollout.temperature=-0.5", "rollout.temperature"),
        ("rollout.temperature=inf", "rollout.temperature"),
        ("rollout.top_k=-1", "rollout.top_k"),
        ("loss.clip_low=1.0", "loss.clip_low"),
        ("loss.dual_clip=0.5", "loss.dual_clip"),
        ("loss.beta=-0.1", "loss.beta"),
        ("loss.aggregation=sum", "loss.aggregation"),
        ("loss.agg_norm=0", "loss.agg_norm"),
        ("policy.chat_template=chatml", "policy.chat_template"),
        ("loss.intervened_old_logp=behaviour", "loss.intervened_old_logp"),
        ("loss.agg_norm=nan", "loss.agg_norm"),
        ("intervention.eps_cal=0", "intervention.eps_cal"),
        ("intervention.max_attempts=0", "intervention.max_attempts"),
        ("baselines.luffy_gamma=0", "baselines.luffy_gamma"),
        ("baselines.gspo_clip_low=1", "baselines.gspo_clip_low"),
        # values that cannot train
        ("loss.beta=nan", "loss.beta"),
        ("optim.lr=inf", "optim.lr"),
        ("optim.max_grad_norm=0", "optim.max_grad_norm"),
        ("optim.max_grad_norm=-1", "optim.max_grad_norm"),
        ("optim.b1=1.0", "optim.b1"),
        ("optim.b2=-0.5", "optim.b2"),
        ("optim.weight_decay=-0.1", "optim.weight_decay"),
        ("intervention.delta=-inf", "intervention.delta"),
        ("intervention.delta=nan", "intervention.delta"),
        ("train.eval_tasks=-3", "train.eval_tasks"),
        ("rollout.max_context=1024", "rollout.max_context"),  # the 8B config's turn is 1024 tokens
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
  """Every experiment config under configs/ (the policy builders' sft_*.yaml have their own schema)."""
  for path in CONFIG_DIR.glob("*.yaml"):
    if path.name.startswith("sft_"):
      continue
    cfg = load_config(str(path), ["policy.path=/p"])
    assert "policy:" in to_yaml(cfg)


def test_yaml_boolean_words_stay_strings_for_string_fields():
  cfg = load_config("navigation_qwen3_8b", ["policy.path=/p", "intervention.verifier=off", "intervention.reweight=off"])
  assert cfg.intervention.verifier == "off" and cfg.intervention.reweight is False


def test_runtime_configs_are_built_from_the_yaml_and_share_its_defaults():
  """The schema's defaults are the runtime classes' own, and the builders carry every set key."""
  from rti_jax import objectives
  from rti_jax.config import intervention_config, loss_config, rollout_config
  from rti_jax.intervention.pipeline import InterventionConfig
  from rti_jax.rollout import RolloutConfig

  default = ExperimentConfig()
  assert (default.loss.clip_low, default.loss.kl_kind, default.loss.aggregation) == (
      objectives.LossConfig().clip_low, objectives.LossConfig().kl_kind, objectives.LossConfig().agg)
  assert default.rollout.temperature == RolloutConfig().sampling.temperature
  assert default.intervention.delta == InterventionConfig().ppl_delta
  cfg = load_config("navigation", ["loss.clip_high=0.28", "intervention.delta=3", "rollout.top_k=5",
                                   "loss.behaviour_logp=recompute",  # top-k: the sampler's log-probs are not the policy's
                                   "intervention.verifier=off", "loss.method=grpo"])
  lc, rc, ic = loss_config(cfg), rollout_config(cfg), intervention_config(cfg, "telecom")
  assert (lc.name, lc.clip_high, lc.beta, lc.eps_cal) == ("grpo", 0.28, cfg.loss.beta, cfg.intervention.eps_cal)
  assert (rc.group_size, rc.max_context_tokens, rc.sampling.top_k, rc.sampling.temperature) == (
      cfg.rollout.group_size, cfg.rollout.max_context, 5, cfg.rollout.temperature)
  assert (ic.enabled, ic.verifier_enabled, ic.ppl_delta, ic.domain) == (False, False, 3.0, "telecom")


def test_overrides_are_literal_values(monkeypatch):
  """``${...}`` on a command line is not interpolated (from the environment or the config)."""
  monkeypatch.setenv("RTI_TEST_SECRET", "/etc")
  cfg = load_config("navigation", ["policy.path=${oc.env:RTI_TEST_SECRET}", "name=${policy.path}"])
  assert cfg.policy.path == "${oc.env:RTI_TEST_SECRET}"
  assert cfg.name == "${policy.path}"
  assert load_config("navigation", ["intervention.delta=inf"]).intervention.delta == math.inf


def test_env_tools_in_template_sends_navigation_tools_through_the_chat_template():
  from rti_jax.envs.registry import task_source

  paper = task_source(load_config("navigation_qwen3_8b", ["policy.path=/p"]))
  assert [t["function"]["name"] for t in paper.tool_schemas] and paper.env_factory().tools_in_prompt is False
  tiny = task_source(load_config("navigation"))
  assert tiny.tool_schemas is None and tiny.env_factory().tools_in_prompt is True


#: Numeric keys for which a negative value is a valid setting (a threshold in nats).
NEGATIVE_OK = {"baselines.aepo_branch_threshold"}
#: Optional numeric keys (null by default) and a value of the right type that cannot train.
OPTIONAL_BAD = {"loss.dual_clip": "0.5", "loss.agg_norm": "-3.0", "optim.vocab_chunk": "-2",
                "optim.tokens_per_device": "0", "optim.length_buckets_per_octave": "0"}


@pytest.mark.parametrize("config", ["navigation", "telecom"])
def test_every_bad_numeric_or_choice_value_is_an_error_naming_its_key_first(config):
  """Over every leaf of the schema (the environment's own section included): a negative or NaN number,
  an unknown choice word, or a bad optional value is a ConfigError whose first words are its key."""
  from rti_jax.config import _leaves

  checked = 0
  for key, value in _leaves(load_config(config)):
    if isinstance(value, bool) or key in NEGATIVE_OK:
      continue
    if value is None:
      bad = [OPTIONAL_BAD[key]] if key in OPTIONAL_BAD else []
    elif isinstance(value, (int, float)):
      bad = ["-5"] + (["nan"] if isinstance(value, float) else [])
    elif key in _CHOICES or key == "env.name" or key.startswith("env.") and key.count(".") == 2:
      bad = ["bogus-choice"]
    else:
      bad = []  # free text: names, paths, urls
    for v in bad:
      with pytest.raises(ConfigError) as e:
        load_config(config, [f"{key}={v}"])
      assert str(e.value).startswith(f"{key}:"), (key, v, str(e.value))
      checked += 1
  assert checked > 60


def test_sampling_and_mesh_errors_name_their_own_key_before_any_cross_check():
  for override, key in (("rollout.top_p=0", "rollout.top_p"), ("rollout.top_k=-5", "rollout.top_k"),
                        ("rollout.temperature=0", "rollout.temperature"), ("mesh.tensor=-1", "mesh.tensor"),
                        ("mesh.process_id=-5", "mesh.process_id"), ("mesh.rollout_slices=-1", "mesh.rollout_slices")):
    with pytest.raises(ConfigError, match=rf"^{key}:"):
      load_config("navigation", [override])


def test_a_stored_config_from_before_a_new_field_resolves_as_today():
  """``current_yaml`` fills fields added to the schema since a config was stored with their defaults
  (what ``--reuse`` compares), leaves a config of today as it is, and gives a text the schema cannot
  take back unchanged."""
  from rti_jax.config import current_yaml

  cfg = load_config("retail", ["train.seed=1", "loss.method=grpo"])
  today = to_yaml(cfg)
  assert current_yaml(today) == today
  older = "\n".join(line for line in today.split("\n") if "validator_rules" not in line)
  assert older != today and current_yaml(older) == today
  changed = older.replace("tasks_per_iter: 4", "tasks_per_iter: 8")
  assert current_yaml(changed) != today  # a value that differs still differs
  removed = today.replace("  max_turns:", "  max_turns_gone:")
  assert current_yaml(removed) == removed


BOTH = ("grpo", "rti")
#: results/compare_retail_seed0's budget (stored before ``env.*.validator_rules`` existed)
SIXTEEN = ("train.iterations=16", "train.eval_every=16", "loss.behaviour_logp=recompute")


@pytest.mark.parametrize("stored,env,trainings,test_tasks,budget,p1", [
    pytest.param("compare_retail", "retail", {0: BOTH, 1: BOTH, 2: ("grpo",)}, 114, (), None, id="retail"),
    pytest.param("compare_airline", "airline", {0: BOTH, 1: BOTH, 2: BOTH}, 50, (), None, id="airline"),
    pytest.param("compare_retail_seed0", "retail", {0: BOTH}, 114, SIXTEEN, 7 / 114, id="retail_seed0")])
def test_the_stored_runs_are_found_by_todays_configs(stored, env, trainings, test_tasks, budget, p1):
  """``results/<stored>`` (the README's tables; the earlier Retail budget) offers every training it
  holds to ``--reuse`` of today's ``--exp=compare --env <env>`` (with ``budget``): a change to a
  shipped config's values shows here."""
  import json
  import pathlib

  from rti_jax import experiment
  from rti_jax.baselines import method_variants

  stored = pathlib.Path(__file__).resolve().parents[1] / "results" / stored
  found = experiment.reusable_runs([stored])
  variants, _ = method_variants(["grpo", "rti"], None, "")
  table = json.loads((stored / "results.json").read_text()) if (stored / "results.json").exists() else None
  for seed, labels in trainings.items():
    for label in labels:
      key = to_yaml(load_config(env, [f"env.name={env}", *variants[label], f"train.seed={seed}", *budget]))
      assert key in found, (env, seed, label)
      got = found[key]["eval"]
      assert got["num_tasks"] == test_tasks
      if table is not None:  # the training's own evaluation is the one the table was made from
        assert got["all"]["p@1"] == table["runs"][str(seed)][label]["all"]["p@1"]
      if p1 is not None:
        assert got["all"]["p@1"] == pytest.approx(p1)
