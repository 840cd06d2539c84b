"""Typed configs of the SFT builds of the tiny base policies (dataclasses + YAML + overrides).

As ``rti_jax.config`` does for the RL experiments, a build's config is made in layers, later ones
winning::

    defaults of the dataclasses  <-  configs/sft_<domain>.yaml  <-  the --quick profile  <-  key=value overrides

OmegaConf checks types against the schema (an unknown key or a string where a float belongs is an
error naming the key); ``validate_*`` then check ranges and choices. Every error is a
``rti_jax.config.ConfigError`` that names the key. The resolved config (``to_dict``) is what a
build records in its policy's ``build.json``.

* ``NavigationSFTConfig`` (``experiments/navigation_sft.py``, ``configs/sft_navigation.yaml``)
* ``TelecomSFTConfig`` (``experiments/telecom_sft.py``, ``configs/sft_telecom.yaml``)
* ``Tau2SFTConfig`` (``experiments/tau2_sft.py``, ``configs/sft_tau2.yaml``; Retail and Airline)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence


from rti_jax.config_loading import ConfigError, config_path, load_structured


@dataclasses.dataclass
class TinyQwenConfig:
  """The tiny Qwen3 of a build from scratch (``sft.tiny_qwen3_config``; one kv head, MLP 2 x hidden)
  and its init; unused by a build that continues a policy (``init``)."""

  hidden: int = 128
  layers: int = 3
  heads: int = 4
  head_dim: int = 32
  qk_norm_init: float = 1.4  # initial q/k RMSNorm weight (sft.sharpen_qk_norm)
  embed_std: float = 1.0  # init std of the tied embeddings (sft.scale_embeddings; 0.02 is the usual)
  final_norm_init: float = 0.03  # initial final RMSNorm weight


@dataclasses.dataclass
class NavigationModelConfig(TinyQwenConfig):
  # norm of the shared "place name" direction added to every whole-name token's embedding
  # (sft.add_type_direction; 0 = off)
  name_type_init: float = 8.0


@dataclasses.dataclass
class NavigationTokenizerConfig:
  vocab: int = 4096  # tokenizer size
  pattern: str = "names"  # names: whole names and coordinates (tokenizer.NAME_PATTERN) | words: words and numbers


@dataclasses.dataclass
class NavigationDataConfig:
  """The SFT mix (``sft_data``, ``sft_swap``); train split only."""

  holdout: int = 40  # the last train-split tasks, kept out of SFT (the RL validation split; diagnostics)
  max_tasks: int = 0  # SFT on the first this-many of the other train tasks only (0 = all)
  # every scripted turn after the first search results starts with the check line (rti_jax.policy.check_line)
  check_line: bool = False
  resolve_share: float = 0.06  # disambiguation tasks whose decisive re-search is trained
  # disambiguation tasks whose re-search turn is trained except its decision token (kind resolve_tail)
  complete_share: float = 0.0
  name_swap: int = 1000  # first-turn drills with swapped stop names in the main mix (sft_swap.name_swap_examples)
  swap_episodes: int = 2000  # oracle episodes of plain tasks made by a stop swap (sft_swap.swap_episode_examples)
  swap_disamb: int = 800  # tasks needing a re-search made by a stop swap (sft_swap.swap_disamb_examples)
  check_drills: int = 3000  # check-line drills in the main mix (sft_swap.check_drill_examples; with check_line only)
  # the benchmark setting's share of hidden-city tasks (env.navigation.hidden_city_share of the RL configs): its
  # world, tasks and system message (with ask_user); the oracle asks the user on those tasks. A build
  # that continues a policy gets whole tokens for the places its tokenizer lacks (tokenizer.add_whole_pretokens)
  hidden_city_share: float = 0.0
  # the user message of the correction examples: feedback (the Validator's feedback) or paper (the
  # paper's Corrector inputs with the evidence and the rule to conceal it; prompting.correction_message)
  correction: str = "feedback"


@dataclasses.dataclass
class NameDrillConfig:
  """Stage 0 of a build from scratch: reading stop names out of requests, on first-turn drills
  alone (without the system turn)."""

  steps: int = 4000  # at most this many steps (0 = no stage 0)
  examples: int = 8000  # distinct drills (0 = 16 per step)
  # the stage ends early once this share of the search names of held-out drills is read right
  # (checked every 200 steps on checks.reading drills of the held-out tasks; > 1 = never)
  target: float = 0.9


@dataclasses.dataclass
class NavigationTrainConfig:
  lr: float = 3e-3
  epochs: float = 2.0  # of the full stage
  warmup_epochs: float = 3.0  # of the short-context stage before it (the mix without the system turn)
  tokens_per_batch: int = 4096
  copy_examples: int = 0  # synthetic copy sequences over word and number tokens before stage 1 (0 = none)


@dataclasses.dataclass
class NavigationChecksConfig:
  """Teacher-forced checks on the held-out train tasks after each stage (metrics.json, the card)."""

  reading: int = 30  # first turns / episodes of the reading check (diagnostics.name_copy_check; 0 = skip)
  decision: bool = True  # the decision probe's figures (diagnostics.decision_probe)


@dataclasses.dataclass
class NavigationEvalConfig:
  """Behaviour with the real sampler after the build (skipped with --no-eval)."""

  tasks: int = 16  # tasks per kind (disambiguation / plain) per split
  samples: int = 8  # samples per task at temperature 1


@dataclasses.dataclass
class NavigationSFTConfig:
  """A build of the tiny Navigation policy (``experiments/navigation_sft.py``)."""

  seed: int = 0
  # continue from this policy dir (its tokenizer, weights and architecture) instead of a fresh
  # model: no tokenizer build, no model init, no stage 0
  init: Optional[str] = None
  tokenizer: NavigationTokenizerConfig = dataclasses.field(default_factory=NavigationTokenizerConfig)
  model: NavigationModelConfig = dataclasses.field(default_factory=NavigationModelConfig)
  data: NavigationDataConfig = dataclasses.field(default_factory=NavigationDataConfig)
  name_drills: NameDrillConfig = dataclasses.field(default_factory=NameDrillConfig)
  train: NavigationTrainConfig = dataclasses.field(default_factory=NavigationTrainConfig)
  checks: NavigationChecksConfig = dataclasses.field(default_factory=NavigationChecksConfig)
  eval: NavigationEvalConfig = dataclasses.field(default_factory=NavigationEvalConfig)


#: ``--quick``: a seconds-long smoke build (tiny model, 16 tasks, a twentieth of the generated kinds).
NAVIGATION_QUICK = (
    "model.hidden=32", "model.layers=2", "model.head_dim=16", "train.epochs=1.0", "train.warmup_epochs=0.0",
    "name_drills.steps=5", "name_drills.examples=80", "data.max_tasks=16", "data.name_swap=50",
    "data.swap_episodes=100", "data.swap_disamb=40", "data.check_drills=150", "checks.reading=0",
    "checks.decision=false", "eval.tasks=2", "eval.samples=2",
)


@dataclasses.dataclass
class TelecomDataConfig:
  """The SFT mix (``telecom_sft_data``); train split only, in ``rl_train_split`` order."""

  holdout: int = 10  # the last train tasks, kept out of SFT (the RL validation split)
  max_tasks: int = 0  # SFT on the first this-many of the other train tasks only (0 = all)
  # extra SFT tasks: SFT tasks with their device faults recombined (envs/telecom/recombine.py;
  # no test or train fault set repeated)
  recombined: int = 0
  phrasings: int = 4  # scripted-user phrasing seeds each SFT task is played with (the mix is drawn per seed)
  resolve_share: float = 0.06  # checklist episodes with the decision trained
  continue_share: float = 0.35  # checklist episodes, decisive turn as context
  complete_share: float = 0.5  # checklist episodes trained except the decisive turn's first token
  correction_share: float = 0.6  # correction examples (p_cal -> right turn)
  checklist: str = "checks_first"  # what ChecklistAgent the policy imitates: checks_first | fix_first
  # the correction examples' user message: feedback | paper (the paper's Corrector inputs with the
  # backend records and the rule to conceal them; prompting.correction_message)
  correction: str = "feedback"


@dataclasses.dataclass
class TelecomTrainConfig:
  lr: float = 3e-3
  epochs: float = 3.0
  tokens_per_batch: int = 8192  # at least the longest example


@dataclasses.dataclass
class TelecomEvalConfig:
  """Behaviour on the held-out train tasks with the real sampler (skipped with --no-eval)."""

  tasks: Optional[int] = None  # held-out tasks sampled (null = all of data.holdout)
  samples: int = 4  # samples per task at temperature 1
  max_turns: int = 20  # assistant turns per sampled episode (the checklist needs at most 16)


@dataclasses.dataclass
class TelecomTokenizerConfig:
  vocab: int = 4096  # at most; BPE stops when no pair repeats (pre-tokenizer: telecom_sft_data.TELECOM_PATTERN)


@dataclasses.dataclass
class TelecomSFTConfig:
  """A build of the tiny Telecom policy (``experiments/telecom_sft.py``)."""

  seed: int = 0
  tokenizer: TelecomTokenizerConfig = dataclasses.field(default_factory=TelecomTokenizerConfig)
  model: TinyQwenConfig = dataclasses.field(default_factory=TinyQwenConfig)
  data: TelecomDataConfig = dataclasses.field(default_factory=TelecomDataConfig)
  train: TelecomTrainConfig = dataclasses.field(default_factory=TelecomTrainConfig)
  eval: TelecomEvalConfig = dataclasses.field(default_factory=TelecomEvalConfig)


#: ``--quick``: a smoke build of under two minutes.
TELECOM_QUICK = (
    "model.hidden=32", "model.layers=1", "model.head_dim=16", "model.heads=2", "train.epochs=0.05",
    "tokenizer.vocab=1024", "data.max_tasks=12", "data.phrasings=1", "eval.tasks=2", "eval.samples=2",
    "eval.max_turns=6",
)


@dataclasses.dataclass
class Tau2DataConfig:
  """The SFT mix (``tau2_sft_data``); the generated training tasks only, in the source's order."""

  num_train: int = 600  # the RL config's env.num_train: the training split the holdout is cut from
  holdout: int = 40  # the last train tasks, kept out of SFT (the RL validation split, train.val_tasks)
  max_tasks: int = 0  # SFT on the first this-many of the other train tasks only (0 = all)
  resolve_share: float = 0.06  # gold episodes with the decision trained
  continue_share: float = 0.35  # gold episodes, decisive turn as context
  complete_share: float = 0.5  # gold episodes trained except the decisive turn's first token
  correction_share: float = 0.6  # correction examples (p_cal -> the confirmation)
  correction: str = "feedback"
  mix_share: float = 1.0  # the share of the tasks' examples above kept (a continuing stage may keep fewer)
  copy_drills: int = 0  # short copy drills without the system turn (tau2_sft_data.copy_drills)
  retries: int = 0  # a read call refused by the tool for a wrong value, then the right call (tau2_sft_data.retry_examples)
  confirm_retries: int = 0  # a confirmation with a wrong value refused by the user, then the right one (likewise)
  # random token strings written twice (sized by copy_stage.repeat_*, tau2_sft_data.repeat_strings)
  # mixed into the SFT examples, so the look-up the copy stage's repeats teach is kept through the mix
  repeats: int = 0
  lookups: int = 0  # associative-recall strings (copy_stage.lookup_*) kept in the mix likewise


@dataclasses.dataclass
class Tau2CopyStageConfig:
  """Stage 0 of a build from scratch: copy drills alone (``tau2_sft_data.copy_drills``: a gold
  prefix without the system turn, every copied value swapped, the copying turn trained)."""

  steps: int = 0  # at most this many steps (0 = no stage 0)
  examples: int = 6000  # distinct drills
  tokens_per_batch: int = 4096
  lr: float = 3.0e-3
  # the stage ends early once this share of held-out drill turns is copied exactly (teacher-forced
  # argmax over every trained token; checked every check_every steps on check_examples drills of
  # the held-out tasks; > 1 = never)
  target: float = 0.9
  check_every: int = 250
  check_examples: int = 200
  # the drills' conversation (training and check): -1 the whole prefix; k >= 0 the last messages
  # that show every copied value and k more before them (tau2_sft_data.copy_drills)
  context: int = -1
  # true: only the messages that show the copied values (each with `context` before it), the
  # opening request and the turn, everything between them dropped
  cut: bool = False
  # which tokens of a training drill carry the loss: "turn" the copying turn only; "all" every token
  # of its conversation (tau2_sft_data.every_token_trained), so each value a message repeats from an
  # earlier one is a copy to learn too. The held-out check scores the copying turn either way.
  loss: str = "turn"
  # random token strings written twice, the repeat trained (tau2_sft_data.repeat_strings): `repeats`
  # of them mixed into the drills, after `warmup_steps` steps on them alone (0 = none)
  repeats: int = 0
  repeat_len: int = 48
  # lengths drawn from repeat_min_len..repeat_len (null: all repeat_len), and 0..repeat_gap random
  # tokens between the copies: with one length and no gap a tiny model copies from a fixed distance
  # back instead of looking the token up
  repeat_min_len: Optional[int] = None
  repeat_gap: int = 0
  # associative-recall strings (tau2_sft_data.lookup_strings: `lookup_pairs` random keys of
  # `lookup_key_len` tokens with values of `lookup_value_len`, then each key again and its value,
  # trained), mixed in and warmed up on beside the repeats
  lookups: int = 0
  lookup_pairs: int = 8
  lookup_key_len: int = 2
  lookup_value_len: int = 6
  warmup_steps: int = 0


@dataclasses.dataclass
class Tau2TrainConfig:
  lr: float = 3e-3
  epochs: float = 2.0
  tokens_per_batch: int = 8192  # at least the longest example


@dataclasses.dataclass
class Tau2EvalConfig:
  """Behaviour on the held-out train tasks with the real sampler (skipped with --no-eval)."""

  tasks: Optional[int] = 20  # held-out tasks sampled (null = all of data.holdout)
  samples: int = 4  # samples per task at temperature 1
  max_turns: int = 30  # assistant turns per sampled episode (configs/retail.yaml env.max_turns)


@dataclasses.dataclass
class Tau2TokenizerConfig:
  vocab: int = 4096  # at most; BPE stops when no pair repeats
  # the pre-tokenizer: "words" (telecom_sft_data.TELECOM_PATTERN: an id such as W2378156 is one
  # pre-token, so several BPE pieces of varying length) | "digits" (tau2_sft_data.DIGIT_PATTERN:
  # letters, digits one at a time, so an id is copied one digit at a time) | "values"
  # (tau2_sft_data.VALUE_PATTERN, and every value of the domain's database one token) | "spaced"
  # (tau2_sft_data.SPACED_PATTERN: "digits" with a value the same tokens wherever it appears)
  pattern: str = "words"
  # with "values": norm of a shared direction added to the value tokens' embeddings at init
  # (sft.add_type_direction: "this token is a value"; 0 = off)
  value_type_init: float = 8.0


@dataclasses.dataclass
class Tau2SFTConfig:
  """A build of a tiny tau2-Retail or tau2-Airline policy (``experiments/tau2_sft.py``)."""

  seed: int = 0
  init: Optional[str] = None  # continue this policy dir (its tokenizer and weights; model.* unused)
  tokenizer: Tau2TokenizerConfig = dataclasses.field(default_factory=Tau2TokenizerConfig)
  model: TinyQwenConfig = dataclasses.field(default_factory=TinyQwenConfig)
  data: Tau2DataConfig = dataclasses.field(default_factory=Tau2DataConfig)
  copy_stage: Tau2CopyStageConfig = dataclasses.field(default_factory=Tau2CopyStageConfig)
  train: Tau2TrainConfig = dataclasses.field(default_factory=Tau2TrainConfig)
  eval: Tau2EvalConfig = dataclasses.field(default_factory=Tau2EvalConfig)


TAU2_QUICK = (
    "model.hidden=32", "model.layers=1", "model.head_dim=16", "model.heads=2", "train.epochs=0.05",
    "tokenizer.vocab=1024", "data.max_tasks=8", "eval.tasks=2", "eval.samples=2", "eval.max_turns=6",
)


def _check(ok: bool, key: str, expected: str, got: Any) -> None:
  if not ok:
    raise ConfigError(f"{key}: expected {expected}, got {got!r}")


def _check_finite(obj: Any, prefix: str = "") -> None:
  """Every float of the config is finite (``inf`` or ``nan`` from a command line is an error)."""
  for f in dataclasses.fields(obj):
    value, key = getattr(obj, f.name), f"{prefix}{f.name}"
    if dataclasses.is_dataclass(value):
      _check_finite(value, key + ".")
    elif isinstance(value, float):
      _check(math.isfinite(value), key, "a finite number", value)


def _check_model(m: TinyQwenConfig) -> None:
  for key in ("hidden", "layers", "heads", "head_dim"):
    _check(getattr(m, key) >= 1, f"model.{key}", "an integer >= 1", getattr(m, key))


def _check_correction(value: str) -> None:
  """``data.correction``: one of the Corrector messages (``prompting.CORRECTORS``)."""
  from rti_jax.intervention.prompting import CORRECTORS

  _check(value in CORRECTORS, "data.correction", f"one of {list(CORRECTORS)}", value)


def validate_navigation(cfg: NavigationSFTConfig) -> NavigationSFTConfig:
  """Checks choices and ranges; raises ``ConfigError`` naming the key."""
  _check_finite(cfg)
  _check(cfg.tokenizer.pattern in ("names", "words"), "tokenizer.pattern", "one of ['names', 'words']",
         cfg.tokenizer.pattern)
  _check(cfg.tokenizer.vocab >= 512, "tokenizer.vocab", "an integer >= 512", cfg.tokenizer.vocab)
  _check_model(cfg.model)
  for key in ("resolve_share", "complete_share", "hidden_city_share"):
    _check(0 <= getattr(cfg.data, key) <= 1, f"data.{key}", "a share in [0, 1]", getattr(cfg.data, key))
  _check_correction(cfg.data.correction)
  for key in ("holdout", "max_tasks", "name_swap", "swap_episodes", "swap_disamb", "check_drills"):
    _check(getattr(cfg.data, key) >= 0, f"data.{key}", "an integer >= 0", getattr(cfg.data, key))
  _check(cfg.name_drills.steps >= 0 and cfg.name_drills.examples >= 0, "name_drills.steps/examples",
         "integers >= 0", (cfg.name_drills.steps, cfg.name_drills.examples))
  _check(cfg.train.lr > 0, "train.lr", "> 0", cfg.train.lr)
  _check(cfg.train.epochs > 0, "train.epochs", "> 0", cfg.train.epochs)
  _check(cfg.train.warmup_epochs >= 0, "train.warmup_epochs", ">= 0", cfg.train.warmup_epochs)
  _check(cfg.train.copy_examples >= 0, "train.copy_examples", "an integer >= 0", cfg.train.copy_examples)
  _check(cfg.checks.reading >= 0, "checks.reading", "an integer >= 0", cfg.checks.reading)
  _check(cfg.eval.tasks >= 1 and cfg.eval.samples >= 1, "eval.tasks/samples", "integers >= 1",
         (cfg.eval.tasks, cfg.eval.samples))
  return cfg


def validate_telecom(cfg: TelecomSFTConfig) -> TelecomSFTConfig:
  """Checks choices and ranges; raises ``ConfigError`` naming the key."""
  _check_finite(cfg)
  _check(cfg.tokenizer.vocab >= 512, "tokenizer.vocab", "an integer >= 512", cfg.tokenizer.vocab)
  _check_model(cfg.model)
  for key in ("resolve_share", "continue_share", "complete_share", "correction_share"):
    _check(0 <= getattr(cfg.data, key) <= 1, f"data.{key}", "a share in [0, 1]", getattr(cfg.data, key))
  _check(cfg.data.phrasings >= 1, "data.phrasings", "an integer >= 1", cfg.data.phrasings)
  _check(cfg.data.checklist in ("checks_first", "fix_first"), "data.checklist", "checks_first or fix_first",
         cfg.data.checklist)
  for key in ("holdout", "max_tasks", "recombined"):
    _check(getattr(cfg.data, key) >= 0, f"data.{key}", "an integer >= 0", getattr(cfg.data, key))
  _check_correction(cfg.data.correction)
  _check(cfg.train.lr > 0, "train.lr", "> 0", cfg.train.lr)
  _check(cfg.train.epochs > 0, "train.epochs", "> 0", cfg.train.epochs)
  _check(1 <= cfg.eval.max_turns <= 30, "eval.max_turns", "an integer in 1..30", cfg.eval.max_turns)
  _check(cfg.eval.tasks is None or cfg.eval.tasks >= 1, "eval.tasks", "an integer >= 1 or null", cfg.eval.tasks)
  _check(cfg.eval.samples >= 1, "eval.samples", "an integer >= 1", cfg.eval.samples)
  return cfg


def validate_tau2(cfg: Tau2SFTConfig) -> Tau2SFTConfig:
  """Checks choices and ranges; raises ``ConfigError`` naming the key."""
  _check_finite(cfg)
  _check(cfg.tokenizer.vocab >= 512, "tokenizer.vocab", "an integer >= 512", cfg.tokenizer.vocab)
  _check(cfg.tokenizer.pattern in ("words", "digits", "values", "spaced"), "tokenizer.pattern",
         "words, digits, values or spaced", cfg.tokenizer.pattern)
  _check(cfg.tokenizer.value_type_init >= 0, "tokenizer.value_type_init", ">= 0", cfg.tokenizer.value_type_init)
  _check_model(cfg.model)
  for key in ("resolve_share", "continue_share", "complete_share", "correction_share", "mix_share"):
    _check(0 <= getattr(cfg.data, key) <= 1, f"data.{key}", "a share in [0, 1]", getattr(cfg.data, key))
  _check(cfg.data.copy_drills >= 0, "data.copy_drills", "an integer >= 0", cfg.data.copy_drills)
  for key in ("repeats", "lookups"):
    _check(getattr(cfg.data, key) >= 0, f"data.{key}", "an integer >= 0", getattr(cfg.data, key))
  _check(cfg.data.num_train >= 2, "data.num_train", "an integer >= 2", cfg.data.num_train)
  _check(0 <= cfg.data.holdout < cfg.data.num_train, "data.holdout", f"an integer in [0, {cfg.data.num_train})",
         cfg.data.holdout)
  _check(cfg.data.max_tasks >= 0, "data.max_tasks", "an integer >= 0", cfg.data.max_tasks)
  _check_correction(cfg.data.correction)
  c = cfg.copy_stage
  for key in ("steps", "examples", "check_examples"):
    _check(getattr(c, key) >= 0, f"copy_stage.{key}", "an integer >= 0", getattr(c, key))
  _check(c.steps == 0 or c.examples >= 1, "copy_stage.examples", "an integer >= 1 with copy_stage.steps > 0",
         c.examples)
  _check(c.tokens_per_batch >= 256, "copy_stage.tokens_per_batch", "an integer >= 256", c.tokens_per_batch)
  _check(c.lr > 0, "copy_stage.lr", "> 0", c.lr)
  _check(c.check_every >= 1, "copy_stage.check_every", "an integer >= 1", c.check_every)
  _check(isinstance(c.context, int) and c.context >= -1, "copy_stage.context", "an integer >= -1 (-1: the whole prefix)",
         c.context)
  _check(c.loss in ("turn", "all"), "copy_stage.loss", "turn or all", c.loss)
  for key in ("repeats", "lookups", "warmup_steps"):
    _check(getattr(c, key) >= 0, f"copy_stage.{key}", "an integer >= 0", getattr(c, key))
  _check(c.repeat_len >= 2, "copy_stage.repeat_len", "an integer >= 2", c.repeat_len)
  _check(c.repeat_min_len is None or 2 <= c.repeat_min_len <= c.repeat_len, "copy_stage.repeat_min_len",
         f"null or an integer in 2..{c.repeat_len} (copy_stage.repeat_len)", c.repeat_min_len)
  _check(c.repeat_gap >= 0, "copy_stage.repeat_gap", "an integer >= 0", c.repeat_gap)
  for key in ("lookup_pairs", "lookup_key_len", "lookup_value_len"):
    _check(getattr(c, key) >= 1, f"copy_stage.{key}", "an integer >= 1", getattr(c, key))
  _check(c.warmup_steps == 0 or c.repeats + c.lookups >= 1, "copy_stage.warmup_steps",
         "0 unless copy_stage.repeats or copy_stage.lookups >= 1", c.warmup_steps)
  _check(c.steps == 0 or cfg.init is None, "copy_stage.steps", "0 when continuing a policy (init)", c.steps)
  _check(cfg.train.lr > 0, "train.lr", "> 0", cfg.train.lr)
  _check(cfg.train.epochs > 0, "train.epochs", "> 0", cfg.train.epochs)
  _check(1 <= cfg.eval.max_turns <= 60, "eval.max_turns", "an integer in 1..60", cfg.eval.max_turns)
  _check(cfg.eval.tasks is None or cfg.eval.tasks >= 1, "eval.tasks", "an integer >= 1 or null", cfg.eval.tasks)
  _check(cfg.eval.samples >= 1, "eval.samples", "an integer >= 1", cfg.eval.samples)
  return cfg


def _load(schema: type[Any], default_name: str, name_or_path: str | None, overrides: Sequence[str]) -> Any:
  return load_structured(schema, config_path(name_or_path or default_name, "sft_*.yaml"), overrides)


def load_navigation(name_or_path: str | None = None, overrides: Sequence[str] = (),
                    quick: bool = False) -> NavigationSFTConfig:
  """The validated config of a Navigation build: ``configs/sft_navigation.yaml`` (or another name
  under ``configs/`` or a YAML path), then the quick profile, then ``overrides`` (``key=value``)."""
  layers = [*(NAVIGATION_QUICK if quick else ()), *overrides]
  return validate_navigation(_load(NavigationSFTConfig, "sft_navigation", name_or_path, layers))


def load_telecom(name_or_path: str | None = None, overrides: Sequence[str] = (),
                 quick: bool = False) -> TelecomSFTConfig:
  """The validated config of a Telecom build (``configs/sft_telecom.yaml``; as ``load_navigation``)."""
  layers = [*(TELECOM_QUICK if quick else ()), *overrides]
  return validate_telecom(_load(TelecomSFTConfig, "sft_telecom", name_or_path, layers))


def load_tau2(name_or_path: str | None = None, overrides: Sequence[str] = (), quick: bool = False) -> Tau2SFTConfig:
  """The validated config of a tau2-Retail / tau2-Airline build (``configs/sft_tau2.yaml``; as
  ``load_navigation``)."""
  layers = [*(TAU2_QUICK if quick else ()), *overrides]
  return validate_tau2(_load(Tau2SFTConfig, "sft_tau2", name_or_path, layers))


def to_dict(cfg: Any) -> dict[str, Any]:
  """The resolved config as a plain dict (for ``build.json`` and ``metrics.json``)."""
  return dataclasses.asdict(cfg)
