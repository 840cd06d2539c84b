"""``intervention.corrector``: which correction message the Corrector samples from, per config, on
the Table-3 experiment's command line, and through the trainer to the policy's backend."""

from __future__ import annotations

import pytest

from experiments import navigation_ablation
from rti_jax.config import ConfigError, intervention_config, load_config
from rti_jax.intervention.judges import PolicyCorrector
from intervention_doubles import FEEDBACK_MARKER, PAPER_CORRECTION_MARKER


@pytest.mark.parametrize("name, expected", [("navigation", "feedback"), ("telecom", "feedback"),
                                            ("navigation_qwen3_8b", "paper")])
def test_each_config_names_its_corrector(name, expected):
  cfg = load_config(name, ["policy.path=x"])
  assert cfg.intervention.corrector == expected
  assert intervention_config(cfg).corrector == expected


def test_override_and_a_bad_value():
  assert intervention_config(load_config("navigation", ["policy.path=x", "intervention.corrector=paper"])).corrector == "paper"
  with pytest.raises(ConfigError, match=r"intervention\.corrector: expected one of \['feedback', 'paper'\], got 'oracle'"):
    load_config("navigation", ["policy.path=x", "intervention.corrector=oracle"])


def test_ablation_switch_sets_every_variants_corrector():
  args, _ = navigation_ablation.parse_args(["--corrector", "feedback", "train.iterations=2"])
  assert args.overrides == ["intervention.corrector=feedback", "train.iterations=2"]
  for overrides in navigation_ablation.VARIANTS.values():
    assert load_config("navigation", ["policy.path=x", *args.overrides, *overrides]).intervention.corrector == "feedback"
  with pytest.raises(SystemExit):
    navigation_ablation.parse_args(["--corrector", "oracle"])


def test_table3_experiments_default_to_the_paper_corrector_and_the_configs_share():
  from experiments import telecom_ablation

  args, _ = navigation_ablation.parse_args([])
  assert args.overrides == ["intervention.corrector=paper"]
  for name, share in [("navigation", 0.0), ("navigation_qwen3_8b", 0.3)]:
    cfg = load_config(name, ["policy.path=x", *args.overrides])
    assert (cfg.intervention.corrector, cfg.env.navigation.hidden_city_share) == ("paper", share)
  args, _ = navigation_ablation.parse_args(["--hidden-city-share", "0.3", "intervention.corrector=feedback"])
  cfg = load_config("navigation", ["policy.path=x", *args.overrides])  # the command line's key=value wins
  assert (cfg.intervention.corrector, cfg.env.navigation.hidden_city_share) == ("feedback", 0.3)
  args, _ = telecom_ablation.parse_args([])
  assert load_config("telecom", ["policy.path=x", *args.overrides]).intervention.corrector == "paper"


def test_the_delta_sweep_runs_in_the_ablations_setting():
  """Fig. 3's GRPO and delta = inf runs resolve to Table 3's GRPO and w/o PPL Gating (so --reuse finds them)."""
  from experiments import delta_sweep

  for argv in ([], ["--corrector", "feedback", "--hidden-city-share", "0.3"]):
    sweep, _ = delta_sweep.parse_args(argv)
    ablation, _ = navigation_ablation.parse_args(argv)
    assert sweep.overrides == ablation.overrides
    variants = delta_sweep.sweep_variants([float("inf")])
    for mine, theirs in [("grpo", "grpo"), ("delta_inf", "rti_no_ppl_gate")]:
      a = load_config("navigation", ["policy.path=x", *sweep.overrides, *variants[mine]])
      b = load_config("navigation", ["policy.path=x", *ablation.overrides, *navigation_ablation.VARIANTS[theirs]])
      assert a == b, mine


class _Recording:
  """Wraps a backend and keeps the decoded prompts it was asked to generate from."""

  def __init__(self, backend, tokenizer):
    self.backend, self.tokenizer, self.prompts = backend, tokenizer, []

  def generate(self, prompts, params, seed):
    self.prompts += [self.tokenizer.decode(list(p), skip_special_tokens=False) for p in prompts]
    return self.backend.generate(prompts, params, seed)


@pytest.mark.parametrize("kind, marker", [("paper", PAPER_CORRECTION_MARKER),
                                           pytest.param("feedback", FEEDBACK_MARKER, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_trainer_samples_corrections_from_the_configured_message(nav_policy, tmp_path, kind, marker):
  """A random policy fails every Navigation task; the trainer's policy Corrector is asked to write
  each correction from p_roll plus the configured message (with the evidence only for ``paper``)."""
  from rti_jax.trainer import Trainer

  cfg = load_config("navigation", [
      f"policy.path={nav_policy}", "loss.method=rti", "rollout.tasks_per_iter=1", "rollout.group_size=2",
      "rollout.max_new_tokens=8", "train.iterations=1", "env.num_train=4", "env.num_test=2", "env.max_turns=2",
      "train.val_tasks=0", f"intervention.corrector={kind}"])
  trainer = Trainer(cfg, tmp_path / "run", progress=False)
  assert trainer.intervention_config.corrector == kind and isinstance(trainer.roles.corrector, PolicyCorrector)
  rec = _Recording(trainer.roles.corrector.backend, trainer.formatter.tokenizer)
  trainer.roles.corrector.backend = rec
  out = trainer.train()[0]
  assert out["rti/steps_flagged"] >= 1 and rec.prompts
  task = trainer.source.train[trainer.order[0]]
  stop = task.stops[-1].location  # a reference coordinate: in l, never in a random policy's conversation
  for prompt in rec.prompts:
    message = prompt.rsplit("<|im_start|>user\n", 1)[1]
    assert marker in message
    assert (stop in message) == (kind == "paper")
