"""Builds the tiny base policy for tau2-Telecom by SFT on scripted train-split episodes.

    python experiments/run.py --exp=telecom_sft [key=value ...]           # configs/sft_telecom.yaml
    python experiments/run.py --exp=telecom_sft --quick --out /tmp/tsft   # a smoke build (< 2 min)

The build's config is ``configs/sft_telecom.yaml`` (``--config``) read into
``rti_jax.policy.build_config.TelecomSFTConfig``, then the ``--quick`` profile, then the
``key=value`` overrides (an unknown key or a wrong type is an error naming the key);
``policies/LINEAGE.yaml`` has the overrides of the shipped ``policies/telecom_base``. It trains the
tokenizer (``telecom_sft_data.TELECOM_PATTERN``) on the SFT tasks' scripted episodes and the
condensed system prompt, a tiny Qwen3 from a seed (``sft.tiny_qwen3_config``), SFT on the mix of
``rti_jax.policy.telecom_sft_data`` (checklist episodes, the early device-tool mistake,
corrections, decision-free tails), then writes the HF checkpoint (``--policy-dir``, default
``<out>/policy``; transformers and ``models.from_pretrained`` load it) with ``build.json`` (the
resolved config and the overrides) and measures the built policy with the real sampler and
rollout engine on the held-out train tasks (the last ``data.holdout`` of ``rl_train_split``, never
trained on): the teacher-forced probability of the right first token at the decisive turn
(``decision_check``), success rate, pass@k, the share of all-fail groups, how the first device step
went (the mistake or asking the user), and one self-intervened rollout per task (rule-based
Validator / Verifier, the policy as Corrector). The test split is never read. The run dir gets
``metrics.json`` and ``loss.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from typing import Any, Sequence

from rti_jax.config import ConfigError
from rti_jax.policy import build_config
from rti_jax.policy.build_config import TelecomSFTConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="run.py --exp=telecom_sft", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="sft_telecom", help="a build config under configs/ or a YAML path")
  p.add_argument("--out", default=str(ROOT / "runs" / "telecom_sft"), help="run dir (metrics, plot)")
  p.add_argument("--policy-dir", default=None, help="checkpoint dir (default: <out>/policy)")
  p.add_argument("--quick", action="store_true", help="smoke build: tiny model, few tasks, a few steps")
  p.add_argument("--no-eval", action="store_true", help="skip the behaviour measurement after the build")
  p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. data.recombined=128")
  args = p.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
  args.policy_dir = args.policy_dir or os.path.join(args.out, "policy")
  return args


def load(args: argparse.Namespace) -> TelecomSFTConfig:
  """The resolved config of ``args`` (a bad key or value is a command-line error naming it)."""
  try:
    return build_config.load_telecom(args.config, args.overrides, quick=args.quick)
  except ConfigError as e:
    raise SystemExit(f"telecom_sft: {e}") from None


def build_data(cfg: TelecomSFTConfig, log: Any) -> tuple[Any, Any, list[Any], list[Any], list[Any]]:
  """(tokenizer, formatter, examples, SFT tasks, held-out tasks)."""
  from experiments.navigation_sft import split_train
  from rti_jax.envs.telecom.tasks import rl_train_split
  from rti_jax.policy import telecom_sft_data as td
  from rti_jax.policy.tokenizer import build_tokenizer
  from rti_jax.rollout import ChatFormatter

  data = cfg.data
  sft_tasks, held = split_train(rl_train_split(), data.holdout)
  if data.max_tasks:
    sft_tasks = sft_tasks[:data.max_tasks]
  if data.recombined:
    from rti_jax.envs.telecom.recombine import recombined_tasks

    try:
      sft_tasks = sft_tasks + recombined_tasks(sft_tasks, data.recombined, seed=cfg.seed)
    except ValueError as e:
      raise SystemExit(f"data.recombined: {e}") from None
  checks = data.checklist == "checks_first"
  corpus = [text for r in range(data.phrasings)
            for text in td.corpus_texts(sft_tasks, td.make_env(seed=r), checks, data.correction)]
  tok = build_tokenizer(corpus, cfg.tokenizer.vocab, pattern=td.TELECOM_PATTERN)
  fmt = ChatFormatter(tok)
  examples = []
  for r in range(data.phrasings):
    mix = td.TelecomMix(resolve_share=data.resolve_share, continue_share=data.continue_share,
                        complete_share=data.complete_share, correction_share=data.correction_share,
                        seed=cfg.seed + 101 * r, checks=checks, correction=data.correction)
    examples += td.build_examples(sft_tasks, td.make_env(seed=r), fmt, mix)
  log(f"tokenizer: {len(tok)} tokens; {len(examples)} examples from {len(sft_tasks)} tasks x "
      f"{data.phrasings} user phrasings")
  return tok, fmt, examples, sft_tasks, held


def build_record(args: argparse.Namespace, cfg: TelecomSFTConfig) -> dict[str, Any]:
  """The policy's ``build.json``: what the policy's users read (the domain, the system prompt's
  policy text), then how it was made (the config file, the overrides as given, the resolved config)."""
  return {"domain": "telecom", "policy_text": "condensed", "builder": "telecom_sft", "config_file": args.config,
          "quick": args.quick, "overrides": list(args.overrides), "config": build_config.to_dict(cfg)}


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  cfg = load(args)
  import numpy as np

  from experiments.navigation_sft import plot_loss
  from models.weights import save_pretrained
  from rti_jax.envs.telecom.condensed import prompt_stats
  from rti_jax.policy import sft
  from rti_jax.policy.sft_example import summary
  from rti_jax.policy.tokenizer import PAD_TOKEN

  t_start = time.time()
  os.makedirs(args.out, exist_ok=True)
  log = lambda s: print(s, flush=True)  # noqa: E731
  tok, fmt, examples, sft_tasks, held = build_data(cfg, log)
  data_summary = summary(examples)
  prompts = prompt_stats(tok)
  log(f"SFT data: {json.dumps(data_summary)}; system prompt: {json.dumps(prompts)}")

  pad_id = tok.convert_tokens_to_ids(PAD_TOKEN)
  model, mcfg = sft.new_tiny_policy(tok, cfg.model, data_summary["max_len"], cfg.seed)
  n_params = sft.count_params(model)
  log(f"model: qwen3 hidden {mcfg.hidden_size}, {mcfg.num_layers} layers, vocab {mcfg.vocab_size}, {n_params} params")
  longest = data_summary["max_len"]
  scfg = sft.SFTConfig(epochs=cfg.train.epochs, lr=cfg.train.lr, tokens_per_batch=max(cfg.train.tokens_per_batch, longest),
                       max_len=longest, len_multiple=128, seed=cfg.seed)
  result = sft.train(model, examples, scfg, pad_id, log=log)
  log(f"SFT: {result.steps} steps in {result.wall_s:.0f}s, final loss {np.mean(result.losses[-10:]):.4f}")
  decision = decision_check(model, fmt, held) if held else None
  if decision:
    log(f"decision (teacher-forced, held-out tasks): "
        f"{json.dumps({k: v for k, v in decision.items() if k != 'per_task_p_right'})}")

  os.makedirs(args.policy_dir, exist_ok=True)
  save_pretrained(model, mcfg, args.policy_dir)
  tok.save_pretrained(args.policy_dir)
  record = build_record(args, cfg)
  with open(os.path.join(args.policy_dir, "build.json"), "w") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
  plot_loss(result.losses, os.path.join(args.out, "loss.png"), title="Telecom tiny policy: SFT")
  metrics: dict[str, Any] = {
    **record, "seed": cfg.seed, "policy_dir": str(args.policy_dir),
    "sft_tasks": len(sft_tasks), "holdout_tasks": [t.task_id for t in held], "phrasings": cfg.data.phrasings,
    "tokenizer_size": len(tok), "system_prompt": prompts, "model": mcfg.to_hf_dict(), "params": n_params,
    "sft": {"steps": result.steps, "wall_s": result.wall_s, "losses": result.losses,
            "tokens_trained": result.tokens_trained},
    "data": data_summary, "decision": decision,
  }
  save_metrics(args, metrics, time.time() - t_start, log)
  if not args.no_eval and held:
    tasks = held[:cfg.eval.tasks] if cfg.eval.tasks is not None else held
    metrics["eval"] = evaluate_policy(args.policy_dir, tasks, cfg.eval.samples, cfg.eval.max_turns, cfg.seed, log)
    save_metrics(args, metrics, time.time() - t_start, log)
  return 0


def save_metrics(args: argparse.Namespace, metrics: dict[str, Any], wall_s: float, log: Any) -> None:
  metrics["wall_s"] = wall_s
  with open(os.path.join(args.out, "metrics.json"), "w") as f:
    json.dump(metrics, f, indent=1, default=str)
  log(f"wrote {args.out}/metrics.json ({wall_s:.0f}s)")


def evaluate_policy(policy_dir: str, tasks: Sequence[Any], samples: int, max_turns: int, seed: int,
                    log: Any) -> dict[str, Any]:
  """Behaviour of the policy in ``policy_dir`` on ``tasks`` with the real sampler (T=1):
  ``sampled`` (``samples`` rollouts per task) and ``intervention`` (one self-intervened rollout
  per task); see ``telecom_behaviour`` and ``telecom_intervention``."""
  from rti_jax.config import load_config
  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.policy import evaluate as ev
  from rti_jax.policy.tokenizer import PAD_TOKEN

  model, tok, fmt = ev.load_policy(policy_dir)
  backend = JaxBackend(model, max_cache_len=4096, pad_id=tok.convert_tokens_to_ids(PAD_TOKEN),
                       prefix_cache_bytes=load_config("telecom").rollout.prefix_cache_mb << 20)
  t0 = time.time()
  out = {"sampled": telecom_behaviour(backend, fmt, tasks, samples, max_turns, seed)}
  log(f"eval sampled ({len(tasks)} tasks x {samples}): {time.time() - t0:.0f}s: "
      f"{json.dumps({k: v for k, v in out['sampled'].items() if k != 'rewards'})}")
  t0 = time.time()
  out["intervention"] = telecom_intervention(backend, fmt, tasks, max_turns, seed)
  log(f"eval intervention: {time.time() - t0:.0f}s: "
      f"{json.dumps({k: v for k, v in out['intervention'].items() if k != 'stats'})}")
  return out


def decision_check(model: Any, fmt: Any, tasks: Sequence[Any]) -> dict[str, Any]:
  """Teacher-forced probabilities at the decisive turn of each task's checklist episode (the
  context up to the line look-up's result): of the right turn's first token (``Please``), of
  ``<tool_call>`` (the mistake's first token), and of the whole right turn (its mean per-token
  NLL, to compare with the PPL gate); means over the tasks that have a decisive turn
  (``policy.evaluate.decisive_turn_probabilities``; ``per_task_p_right`` per task)."""
  from rti_jax.envs.telecom.checklist_agent import ChecklistAgent
  from rti_jax.policy import telecom_sft_data as td
  from rti_jax.policy.evaluate import decisive_turn_probabilities
  from rti_jax.policy.sft_example import play

  env = td.make_env()
  cases = []
  for task in tasks:
    good = play(env, ChecklistAgent(), task)
    d = td.decisive_index(good)
    if d is not None:
      cases.append((task.task_id, good, d))
  out = decisive_turn_probabilities(model, fmt, cases)
  per_task = out.pop("per_task", {})
  if out["tasks"]:
    out["per_task_p_right"] = [p for p, _ in per_task.values()]
  return out


def _env_factory(max_turns: int) -> Any:
  from rti_jax.envs.telecom.condensed import CONDENSED_POLICY
  from rti_jax.envs.telecom.env import TelecomEnv

  return lambda: TelecomEnv(policy=CONDENSED_POLICY, max_turns=max_turns)


def telecom_behaviour(backend: Any, fmt: Any, tasks: Sequence[Any], samples: int, max_turns: int,
                      seed: int) -> dict[str, Any]:
  """``samples`` rollouts per task at T=1: pass rate, pass@k, all-fail groups, truncated share, and
  the first device step (``telecom_sft_data.first_device_step``) as shares of all rollouts."""
  import numpy as np

  from rti_jax.policy import evaluate as ev
  from rti_jax.policy.telecom_sft_data import first_device_step
  from rti_jax.rollout import rollout_groups

  cfg = ev.rollout_config(samples, 1.0, max_new_tokens=96, max_context_tokens=4096, seed=seed)
  groups = rollout_groups(list(tasks), _env_factory(max_turns), backend, fmt, cfg, task_id=lambda t: t.task_id,
                          seed=seed)
  rewards = np.asarray([[t.reward for t in g] for g in groups], np.float32)
  steps = [first_device_step(t.messages) for g in groups for t in g]
  return {
    "tasks": len(tasks), "samples": samples, "rewards": rewards.tolist(),
    "pass_rate": float(rewards.mean()), "pass_at_k": ev._pass_at_k(rewards, samples),
    "all_fail_groups": float((rewards.max(axis=1) <= 0).mean()),
    "truncated": float(np.mean([t.truncated for g in groups for t in g])),
    "mean_turns": float(np.mean([t.num_turns for g in groups for t in g])),
    "first_device_step": {k: steps.count(k) / len(steps) for k in ("mistake", "asked", "malformed", "none")},
  }


def telecom_intervention(backend: Any, fmt: Any, tasks: Sequence[Any], max_turns: int, seed: int) -> dict[str, Any]:
  """One self-intervened rollout per task (``policy.evaluate.rule_intervention_check`` on Telecom)."""
  from rti_jax.policy import evaluate as ev

  return ev.rule_intervention_check(backend, fmt, tasks, _env_factory(max_turns), "telecom", seed)


if __name__ == "__main__":
  sys.exit(main())
