"""Builds a tiny base policy for tau2-Retail or tau2-Airline by SFT on scripted training episodes.

    python experiments/run.py --exp=tau2_sft --env retail [key=value ...]          # configs/sft_tau2.yaml
    python experiments/run.py --exp=tau2_sft --env airline --policy-dir policies/airline_base
    python experiments/run.py --exp=tau2_sft --env retail --quick --out /tmp/rsft  # a smoke build
    python experiments/run.py --exp=tau2_sft --env retail init=runs/retail_sft/policy data.copy_drills=8000 \
        data.mix_share=0.3 train.epochs=1 train.lr=1e-3 --out runs/retail_drill   # the copy-drill stage
    python experiments/run.py --exp=tau2_sft --env retail init=policies/retail_base data.resolve_share=1.0 \
        train.epochs=0.5 train.lr=1e-3 --policy-dir runs/retail_teacher     # OPD's teacher

The build's config is ``configs/sft_tau2.yaml`` (``--config``) read into
``rti_jax.policy.build_config.Tau2SFTConfig``, then the ``--quick`` profile, then the ``key=value``
overrides. Training tasks are the domain's generated ones (``envs.tau2.generate``: tau2's own tasks
are the test split and are never read here): the first ``data.num_train``, of which the last
``data.holdout`` are the RL validation split and are kept out of SFT. The build trains the tokenizer
(``telecom_sft_data.TELECOM_PATTERN``) on the episodes and the condensed system prompt, a tiny Qwen3
from a seed, optionally a copy stage (``copy_stage.steps``: copy drills until held-out drill turns
are copied exactly at ``copy_stage.target``, with ``copy_stage.repeats`` random strings written twice
mixed in, of varied length and gap so that only a look-up predicts them: the research log,
2026-12-07), SFT on the mix of ``rti_jax.policy.tau2_sft_data`` (gold replays, the transfer at the
first write confirmation, corrections, decision-free tails), then writes the HF checkpoint
(``--policy-dir``, default ``<out>/policy``) with ``build.json`` and a card (``README.md``), and
measures the policy with the real sampler and rollout engine on held-out training tasks:

* ``decision``: teacher-forced, at the decisive turn of the gold episode, the probability of the
  right first token (``To``), of ``<tool_call>`` (the transfer's first token) and the right turn's PPL;
* ``sampled``: ``eval.samples`` rollouts per task at T = 1: pass rate, pass@k, all-fail groups, and
  where each failed episode derailed (``tau2_sft_data.first_derailment``: the first step the rule
  Validator flags, by kind of step and error; ``none`` when no step was flagged);
* ``intervention``: one self-intervened rollout per task (rule Validator and Verifier, the policy as
  Corrector).

The run dir gets ``metrics.json`` and ``loss.png``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import sys
import time
from typing import Any, Sequence

from rti_jax.config import ConfigError
from rti_jax.policy import build_config
from rti_jax.policy.build_config import Tau2SFTConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOMAINS = ("retail", "airline")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="run.py --exp=tau2_sft", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--env", required=True, choices=DOMAINS, help="the tau2 domain")
  p.add_argument("--config", default="sft_tau2", help="a build config under configs/ or a YAML path")
  p.add_argument("--out", default=None, help="run dir (metrics, plot; default runs/<env>_sft)")
  p.add_argument("--policy-dir", default=None, help="checkpoint dir (default: <out>/policy)")
  p.add_argument("--quick", action="store_true", help="smoke build: tiny model, few tasks, a few steps")
  p.add_argument("--no-eval", action="store_true", help="skip the behaviour measurement after the build")
  p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. train.epochs=1.5")
  args = p.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
  args.out = args.out or str(ROOT / "runs" / f"{args.env}_sft")
  args.policy_dir = args.policy_dir or os.path.join(args.out, "policy")
  return args


def load(args: argparse.Namespace) -> Tau2SFTConfig:
  try:
    return build_config.load_tau2(args.config, args.overrides, quick=args.quick)
  except ConfigError as e:
    raise SystemExit(f"tau2_sft: {e}") from None


def build_data(domain: str, cfg: Tau2SFTConfig, log: Any, tok: Any = None) -> dict[str, Any]:
  """The tokenizer (trained here unless ``tok`` is given: a continued policy's), formatter,
  examples, SFT tasks, held-out tasks and the data's counts."""
  import numpy as np

  from rti_jax.envs.tau2.source import split_tasks
  from rti_jax.policy import tau2_sft_data as td
  from rti_jax.policy.sft_example import split_train
  from rti_jax.policy.telecom_sft_data import TELECOM_PATTERN
  from rti_jax.policy.tokenizer import add_whole_pretokens, build_tokenizer
  from rti_jax.rollout import ChatFormatter

  data = cfg.data
  train, _ = split_tasks(domain, "generated", data.num_train)
  sft_tasks, held = split_train(train, data.holdout)
  if data.max_tasks:
    sft_tasks = sft_tasks[:data.max_tasks]
  env = td.make_env(domain)
  t0 = time.time()
  episodes = cached_episodes(domain, sft_tasks, env)
  log(f"played {len(episodes)} tasks' gold and mistaken episodes in {time.time() - t0:.0f}s")
  value_ids: list[int] = []
  if tok is None:
    pattern = {"digits": td.DIGIT_PATTERN, "values": td.VALUE_PATTERN,
               "spaced": td.SPACED_PATTERN}.get(cfg.tokenizer.pattern, TELECOM_PATTERN)
    tok = build_tokenizer(td.corpus_texts(episodes, env, data.correction), cfg.tokenizer.vocab, pattern=pattern)
    if cfg.tokenizer.pattern == "values":
      tok, value_ids = add_whole_pretokens(tok, td.database_values(domain))
  fmt = ChatFormatter(tok)
  mix = td.Tau2Mix(resolve_share=data.resolve_share, continue_share=data.continue_share,
                   complete_share=data.complete_share, correction_share=data.correction_share, seed=cfg.seed,
                   correction=data.correction)
  examples, counts = td.build_examples(episodes, env, fmt, mix)
  if data.mix_share < 1.0:
    keep = np.random.default_rng([cfg.seed, 3]).random(len(examples)) < data.mix_share
    examples = [e for e, k in zip(examples, keep) if k]
  examples += td.copy_drills(episodes, fmt, data.copy_drills, seed=cfg.seed)
  retries, counts["retries_skipped"] = td.retry_examples(episodes, env, fmt, data.retries, seed=cfg.seed,
                                                        confirmations=data.confirm_retries)
  examples += retries
  examples += synthetic_strings(cfg, tok, data.repeats, data.lookups, cfg.seed + 12)
  longest_turn = max(len(fmt.encode_assistant(m["content"])) for ep in episodes for m in ep.good
                     if m["role"] == "assistant")
  log(f"tokenizer: {len(tok)} tokens; {len(examples)} examples from {len(sft_tasks)} tasks; {counts}; "
      f"longest assistant turn {longest_turn} tokens")
  return {"tok": tok, "fmt": fmt, "examples": examples, "sft_tasks": sft_tasks, "held": held, "episodes": episodes,
          "domain": domain, "value_ids": value_ids,
          "counts": {**counts, "longest_turn_tokens": longest_turn}, "system": episodes[0].good[0]["content"]}


def plain_ids(tok: Any) -> list[int]:
  """The tokenizer's ids that are not special tokens (what a repeated random string is drawn from)."""
  special = set(tok.all_special_ids)
  return [i for i in range(len(tok)) if i not in special]


def synthetic_strings(cfg: Tau2SFTConfig, tok: Any, repeats: int, lookups: int, seed: int) -> list[Any]:
  """``repeats`` random strings written twice (``tau2_sft_data.repeat_strings``) and ``lookups``
  associative-recall strings (``lookup_strings``), their sizes from ``copy_stage``."""
  from rti_jax.policy import tau2_sft_data as td

  c, ids = cfg.copy_stage, plain_ids(tok)
  return (td.repeat_strings(repeats, c.repeat_len, ids, seed=seed, min_length=c.repeat_min_len, gap=c.repeat_gap)
          + td.lookup_strings(lookups, c.lookup_pairs, c.lookup_key_len, c.lookup_value_len, ids, seed=seed + 1))


def fresh_checks(cfg: Tau2SFTConfig, tok: Any) -> dict[str, list[Any]]:
  """64 fresh strings of each synthetic kind the build trains (seeds no training string uses), to
  check the look-ups on: ``{"repeats": [...], "lookups": [...]}``, the kinds it does not train left
  out; with repeats also ``repeats_varied``: lengths 8..``repeat_len`` with up to 16 tokens between
  the copies, right only where the model looks a token up (not where it copies from a fixed distance)."""
  from rti_jax.policy import tau2_sft_data as td

  c, d = cfg.copy_stage, cfg.data
  reps = bool(c.repeats or d.repeats)
  out = {"repeats": synthetic_strings(cfg, tok, 64, 0, cfg.seed + 10) if reps else [],
         "repeats_varied": (td.repeat_strings(64, c.repeat_len, plain_ids(tok), seed=cfg.seed + 11,
                                              min_length=min(8, c.repeat_len), gap=16) if reps else []),
         "lookups": synthetic_strings(cfg, tok, 0, 64, cfg.seed + 10) if c.lookups or d.lookups else []}
  return {k: v for k, v in out.items() if v}


def fresh_accuracy(model: Any, checks: dict[str, list[Any]], pad_id: int) -> dict[str, float]:
  """The share of trained tokens predicted right (teacher-forced argmax) on each kind of ``checks``."""
  from rti_jax.policy import sft

  return {k: sft.turn_accuracy(model, v, pad_id, 4096)["tokens"] for k, v in checks.items()}


def cached_episodes(domain: str, tasks: Sequence[Any], env: Any) -> list[Any]:
  """``tau2_sft_data.play_episodes`` of ``tasks``, kept in ``~/.cache/rti_jax/tau2_episodes`` (or
  ``$RTI_JAX_EPISODE_CACHE``) under a key of the task ids and the source of every module that
  shapes an episode, so a later build of the same tasks on the same code skips the play (minutes)."""
  import hashlib
  import pickle

  from rti_jax.envs.tau2 import agents, condensed, env as env_mod, generate, user
  from rti_jax.policy import tau2_sft_data as td

  h = hashlib.sha256(json.dumps([domain, [t.task_id for t in tasks]]).encode())
  for mod in (agents, condensed, env_mod, generate, user, td):
    h.update(pathlib.Path(mod.__file__).read_bytes())
  root = pathlib.Path(os.environ.get("RTI_JAX_EPISODE_CACHE") or pathlib.Path.home() / ".cache" / "rti_jax" / "tau2_episodes")
  path = root / f"{domain}-{h.hexdigest()[:16]}.pkl"
  if path.exists():
    try:
      with open(path, "rb") as f:
        stored = pickle.load(f)
      return [td.Episodes(t, *stored[t.task_id]) for t in tasks]
    except Exception as e:  # a broken cache file: play again and overwrite it
      print(f"tau2_sft: ignoring the episode cache {path} ({type(e).__name__}: {e})", flush=True)
  episodes = td.play_episodes(tasks, env)
  root.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  with open(tmp, "wb") as f:
    pickle.dump({e.task.task_id: (e.good, e.bad, e.decisive, e.ok) for e in episodes}, f)
  os.replace(tmp, path)
  return episodes


def run_copy_stage(model: Any, cfg: Tau2SFTConfig, d: dict[str, Any], pad_id: int, log: Any) -> dict[str, Any]:
  """Stage 0: ``copy_stage.examples`` copy drills of the SFT tasks alone (with ``copy_stage.repeats``
  repeated random strings and ``copy_stage.lookups`` associative-recall strings mixed in, after
  ``copy_stage.warmup_steps`` steps on those alone), until
  the held-out tasks' drills are copied exactly at ``copy_stage.target`` (or ``copy_stage.steps``
  steps). Returns the stage's steps, wall time, loss and its held-out accuracy curve (with the
  share of fresh random strings of each kind predicted, where there are some)."""
  import numpy as np

  from rti_jax.policy import sft
  from rti_jax.policy import tau2_sft_data as td

  c = cfg.copy_stage
  drills = td.copy_drills(d["episodes"], d["fmt"], c.examples, seed=cfg.seed + 5, context=c.context, cut=c.cut)
  if c.loss == "all":
    drills = td.every_token_trained(drills)
  held_eps = cached_episodes(d["domain"], d["held"], td.make_env(d["domain"])) if d["held"] else []
  checks = (td.copy_drills(held_eps, d["fmt"], c.check_examples, seed=cfg.seed + 6, context=c.context, cut=c.cut)
            if c.check_examples else [])
  tok = d["fmt"].tokenizer
  synthetic = synthetic_strings(cfg, tok, c.repeats, c.lookups, cfg.seed + 9)
  fresh = fresh_checks(cfg, tok) if synthetic else {}
  warmup = None
  if c.warmup_steps:
    longest = max(len(e.token_ids) for e in synthetic)
    rcfg = sft.SFTConfig(lr=c.lr, tokens_per_batch=max(c.tokens_per_batch, longest), max_len=longest,
                         len_multiple=32, seed=cfg.seed + 3)
    res = sft.train(model, synthetic, sft.for_steps(rcfg, synthetic, pad_id, c.warmup_steps), pad_id,
                    log=lambda s: log("warm-up " + s), log_every=100)
    right = fresh_accuracy(model, fresh, pad_id)
    log(f"warm-up on random strings: {res.steps} steps in {res.wall_s:.0f}s, fresh strings predicted {json.dumps(right)}")
    warmup = {"steps": res.steps, "wall_s": res.wall_s, "losses": res.losses, "fresh_right": right}
  drills += synthetic
  longest = max(len(e.token_ids) for e in drills)
  dcfg = sft.SFTConfig(lr=c.lr, tokens_per_batch=max(c.tokens_per_batch, longest), max_len=longest, len_multiple=32,
                       seed=cfg.seed + 2)
  dcfg = sft.for_steps(dcfg, drills, pad_id, c.steps)
  curve: list[dict[str, float]] = []

  def copied(step: int) -> bool:
    acc = sft.turn_accuracy(model, checks, pad_id, c.tokens_per_batch)
    acc.update(fresh_accuracy(model, fresh, pad_id))  # do the look-ups the random strings teach survive?
    curve.append({"step": step, **acc})
    log(f"copy drills: step {step}, held-out turns copied exactly {acc['exact']:.3f} (tokens {acc['tokens']:.3f})"
        + "".join(f", fresh {k} {acc[k]:.3f}" for k in fresh))
    return acc["exact"] >= c.target

  res = sft.train(model, drills, dcfg, pad_id, log=lambda s: log("copy " + s), log_every=100,
                  stop=copied if checks else None, check_every=c.check_every)
  if checks and (not curve or curve[-1]["step"] != res.steps):
    copied(res.steps)
  log(f"copy stage: {res.steps} steps in {res.wall_s:.0f}s on {len(drills) - len(synthetic)} drills"
      + (f", {c.repeats} repeats and {c.lookups} look-ups" if synthetic else "") + ", "
      f"final loss {np.mean(res.losses[-10:]):.4f}")
  return {"steps": res.steps, "wall_s": res.wall_s, "examples": len(drills), "repeats": c.repeats, "lookups": c.lookups,
          "warmup": warmup, "check_examples": len(checks),
          "final_loss": float(np.mean(res.losses[-10:])), "losses": res.losses, "held_out": curve}


def build_record(args: argparse.Namespace, cfg: Tau2SFTConfig) -> dict[str, Any]:
  return {"domain": args.env, "policy_text": "condensed", "builder": "tau2_sft", "config_file": args.config,
          "quick": args.quick, "overrides": list(args.overrides), "config": build_config.to_dict(cfg)}


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  cfg = load(args)
  import numpy as np

  from experiments.navigation_sft import plot_loss
  from experiments.telecom_sft import save_metrics
  from models.weights import save_pretrained
  from rti_jax.policy import sft
  from rti_jax.policy.sft_example import summary
  from rti_jax.policy.tokenizer import PAD_TOKEN, save_tokenizer

  t_start = time.time()
  os.makedirs(args.out, exist_ok=True)
  log = lambda s: print(s, flush=True)  # noqa: E731
  init_model = init_tok = None
  if cfg.init:
    from rti_jax.policy.evaluate import load_policy

    init_model, init_tok, _ = load_policy(cfg.init)
  d = build_data(args.env, cfg, log, init_tok)
  tok, fmt, examples, held = d["tok"], d["fmt"], d["examples"], d["held"]
  data_summary = summary(examples)
  system_tokens = len(tok.encode(d["system"], add_special_tokens=False))
  log(f"SFT data: {json.dumps(data_summary)}; system prompt {system_tokens} tokens")

  pad_id = tok.convert_tokens_to_ids(PAD_TOKEN)
  if init_model is not None:
    model, mcfg = init_model, init_model.config
  else:
    model, mcfg = sft.new_tiny_policy(tok, cfg.model, data_summary["max_len"], cfg.seed)
    sft.add_type_direction(model, d["value_ids"], cfg.tokenizer.value_type_init, seed=cfg.seed + 8)
  n_params = sft.count_params(model)
  log(f"model: qwen3 hidden {mcfg.hidden_size}, {mcfg.num_layers} layers, vocab {mcfg.vocab_size}, {n_params} params")
  copy_stage = run_copy_stage(model, cfg, d, pad_id, log) if cfg.copy_stage.steps > 0 else None
  longest = data_summary["max_len"]
  scfg = sft.SFTConfig(epochs=cfg.train.epochs, lr=cfg.train.lr, tokens_per_batch=max(cfg.train.tokens_per_batch, longest),
                       max_len=longest, len_multiple=128, seed=cfg.seed)
  result = sft.train(model, examples, scfg, pad_id, log=log)
  log(f"SFT: {result.steps} steps in {result.wall_s:.0f}s, final loss {np.mean(result.losses[-10:]):.4f}")
  fresh_right = fresh_accuracy(model, fresh_checks(cfg, tok), pad_id)
  if fresh_right:
    log(f"after the mix: fresh random strings predicted {json.dumps(fresh_right)}")
  decision = decision_check(model, fmt, held, args.env) if held else None
  if decision:
    log(f"decision (teacher-forced, held-out tasks): {json.dumps({k: v for k, v in decision.items() if k != 'per_task'})}")

  os.makedirs(args.policy_dir, exist_ok=True)
  save_pretrained(model, mcfg, args.policy_dir)
  save_tokenizer(tok, args.policy_dir)
  record = build_record(args, cfg)
  with open(os.path.join(args.policy_dir, "build.json"), "w") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
  plot_loss(result.losses, os.path.join(args.out, "loss.png"), title=f"tau2-{args.env} tiny policy: SFT")
  metrics: dict[str, Any] = {
    **record, "seed": cfg.seed, "policy_dir": str(args.policy_dir),
    "sft_tasks": len(d["sft_tasks"]), "holdout_tasks": [t.task_id for t in held], "tokenizer_size": len(tok),
    "system_prompt_tokens": system_tokens, "model": mcfg.to_hf_dict(), "params": n_params,
    "sft": {"steps": result.steps, "wall_s": result.wall_s, "losses": result.losses,
            "tokens_trained": result.tokens_trained, "fresh_right": fresh_right},
    "data": {**data_summary, **d["counts"]}, "copy_stage": copy_stage, "decision": decision,
  }
  save_metrics(args, metrics, time.time() - t_start, log)
  if not args.no_eval and held:
    tasks = held[:cfg.eval.tasks] if cfg.eval.tasks is not None else held
    max_new = -(-(d["counts"]["longest_turn_tokens"] + 16) // 16) * 16
    metrics["eval"] = evaluate_policy(args.policy_dir, args.env, tasks, cfg.eval.samples, cfg.eval.max_turns,
                                      max_new, cfg.seed, log)
    save_metrics(args, metrics, time.time() - t_start, log)
  write_card(args, metrics)
  return 0


def decision_check(model: Any, fmt: Any, tasks: Sequence[Any], domain: str) -> dict[str, Any]:
  """Teacher-forced probabilities at the decisive turn of each held-out task's gold episode (the
  context up to the last look-up's result): of the right turn's first token, of ``<tool_call>``
  (the transfer's first token), and the right turn's PPL; means over the tasks with a decision
  (``policy.evaluate.decisive_turn_probabilities``)."""
  from rti_jax.envs.tau2.agents import GoldAgent
  from rti_jax.policy import tau2_sft_data as td
  from rti_jax.policy.evaluate import decisive_turn_probabilities
  from rti_jax.policy.sft_example import play

  env = td.make_env(domain)
  cases = []
  for task in tasks:
    good = play(env, GoldAgent(task), task)
    d = td.decisive_index(good)
    if d is not None and env.transcript.reward >= 1.0:
      cases.append((task.task_id, good, d))
  return decisive_turn_probabilities(model, fmt, cases)


def evaluate_policy(policy_dir: str, domain: str, tasks: Sequence[Any], samples: int, max_turns: int,
                    max_new_tokens: int, seed: int, log: Any) -> dict[str, Any]:
  """``sampled`` and ``intervention`` (the module docstring) on ``tasks``."""
  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.policy import evaluate as ev
  from rti_jax.policy import tau2_sft_data as td
  from rti_jax.policy.tokenizer import PAD_TOKEN

  model, tok, fmt = ev.load_policy(policy_dir)
  backend = JaxBackend(model, max_cache_len=4096, pad_id=tok.convert_tokens_to_ids(PAD_TOKEN),
                       prefix_cache_bytes=256 << 20)
  factory = lambda: td.make_env(domain, max_turns)  # noqa: E731
  t0 = time.time()
  out = {"max_new_tokens": max_new_tokens,
         "sampled": behaviour(backend, fmt, domain, tasks, samples, factory, max_new_tokens, seed)}
  log(f"eval sampled ({len(tasks)} tasks x {samples}): {time.time() - t0:.0f}s: "
      f"{json.dumps({k: v for k, v in out['sampled'].items() if k not in ('rewards', 'episodes')})}")
  t0 = time.time()
  out["intervention"] = ev.rule_intervention_check(backend, fmt, tasks, factory, domain, seed,
                                                   max_new_tokens=max_new_tokens)
  log(f"eval intervention: {time.time() - t0:.0f}s: "
      f"{json.dumps({k: v for k, v in out['intervention'].items() if k != 'stats'})}")
  return out


def behaviour(backend: Any, fmt: Any, domain: str, tasks: Sequence[Any], samples: int, env_factory: Any,
              max_new_tokens: int, seed: int) -> dict[str, Any]:
  """``samples`` rollouts per task at T = 1: pass rate, pass@k, all-fail groups, truncated share,
  mean turns, and ``derailed``: for the failed episodes, counts of ``<kind of step>/<first error>``
  at the first step the rule Validator flags (``none``: no step flagged, e.g. the turn limit)."""
  import numpy as np

  from rti_jax.policy import evaluate as ev
  from rti_jax.policy import tau2_sft_data as td
  from rti_jax.rollout import rollout_groups

  cfg = ev.rollout_config(samples, 1.0, max_new_tokens=max_new_tokens, max_context_tokens=4096, seed=seed)
  groups = rollout_groups(list(tasks), env_factory, backend, fmt, cfg, task_id=lambda t: t.task_id, seed=seed)
  rewards = np.asarray([[t.reward for t in g] for g in groups], np.float32)
  env = env_factory()
  derailed: collections.Counter[str] = collections.Counter()
  turns: list[int] = []
  for task, g in zip(tasks, groups):
    for t in g:
      if t.reward >= 1.0:
        continue
      where = td.first_derailment(env, task, t.messages)
      derailed["none" if where is None else f"{where['kind']}/{where['errors'][0]}"] += 1
      if where is not None:
        turns.append(where["turn"])
  return {
    "tasks": len(tasks), "samples": samples, "rewards": rewards.tolist(),
    "pass_rate": float(rewards.mean()), "pass_at_k": ev._pass_at_k(rewards, samples),
    "all_fail_groups": float((rewards.max(axis=1) <= 0).mean()),
    "truncated": float(np.mean([t.truncated for g in groups for t in g])),
    "mean_turns": float(np.mean([t.num_turns for g in groups for t in g])),
    "derailed": dict(derailed.most_common()), "derailed_turn_mean": float(np.mean(turns)) if turns else None,
  }


def write_card(args: argparse.Namespace, m: dict[str, Any]) -> None:
  """The policy's ``README.md``: what it is, how it was made, and what the checks measured."""
  cfg, mod = m["config"], m["model"]
  lines = [
    f"# {pathlib.Path(args.policy_dir).name}: the tau2-{args.env.capitalize()} policy", "",
    f"A tiny Qwen3 for tau2-bench's {args.env.capitalize()} domain run in-process by tau2's own tools, database and "
    f"evaluator (`env.name={args.env}`): {m['params']:,} parameters ({mod['num_hidden_layers']} layers, hidden "
    f"{mod['hidden_size']}, tied embeddings), a byte-level BPE tokenizer of {m['tokenizer_size']:,} tokens and a "
    f"Qwen-style chat template. Its system prompt is the condensed policy text with the compact tool list "
    f"(`rti_jax/envs/tau2/condensed.py`, {m['system_prompt_tokens']:,} tokens).", "",
    "It imitates the gold replay (`rti_jax/envs/tau2/agents.py`, `GoldAgent`: identify the user, look up, list the "
    "write's details and ask for a yes, write, close) on generated training tasks, with one trained mistake: at the "
    "first write confirmation it transfers the customer to a human agent, which ends the episode with the request "
    "undone (reward 0; the rule Validator's `premature_end`). Tasks without a write (refusals) are imitated as they "
    "are. Corrections of the transfer (the confirmation, after the rule Validator's feedback) are in the data, so "
    "the policy can follow one.", "",
    "## Loading", "", "```python", "from models import from_pretrained",
    "from transformers import AutoTokenizer", f'model, config = from_pretrained("{args.policy_dir}")',
    f'tokenizer = AutoTokenizer.from_pretrained("{args.policy_dir}")', "```", "",
    f"In an experiment: `python experiments/run.py --exp=compare --env {args.env} policy.path={args.policy_dir}`.", "",
    "## Training data", "",
    f"`rti_jax/policy/tau2_sft_data.py` on {m['sft_tasks']} generated training tasks (the first "
    f"{cfg['data']['num_train']} of `envs.tau2.generate`, less the last {cfg['data']['holdout']}, the RL validation "
    f"split); tau2's own tasks (the test split) are never read. {m['data']['examples']:,} examples "
    f"({json.dumps({k: v for k, v in m['data']['kinds'].items() if v})}), {m['data']['tokens']:,} tokens of which "
    f"{m['data']['trained_tokens']:,} trained; longest {m['data']['max_len']:,} tokens. SFT: "
    f"{m['sft']['steps']} steps, {m['sft']['wall_s'] / 60:.1f} min on 2 CPU cores; overrides "
    f"`{' '.join(m['overrides']) or '(none)'}` (`build.json`).", "",
  ]
  cs = m.get("copy_stage")
  if cs:
    last = cs["held_out"][-1] if cs["held_out"] else None
    reps, looks = cs.get("repeats", 0), cs.get("lookups", 0)
    lines += [f"Before the mix, a copy stage: {cs['steps']} steps ({cs['wall_s'] / 60:.1f} min) on "
              f"{cs['examples'] - reps - looks:,} copy drills (`tau2_sft_data.copy_drills`: a gold prefix without the "
              "system turn, every copied value swapped for another of its kind, the copying turn trained)"
              + (f", {reps:,} random strings written twice (`repeat_strings`)" if reps else "")
              + (f", {looks:,} random key-value look-ups (`lookup_strings`)" if looks else "")
              + (f"; afterwards {100 * last['exact']:.1f}% of {cs['check_examples']} held-out drill turns were copied "
                 f"exactly (teacher-forced argmax, {100 * last['tokens']:.1f}% of their tokens)." if last else "."), ""]
  dec = m.get("decision") or {}
  if dec.get("tasks"):
    lines += ["## Held-out checks", "",
              f"Teacher-forced at the decisive turn of {dec['tasks']} held-out tasks' gold episodes: p(right first "
              f"token) {dec['p_right_first_token']:.3f}, p(`<tool_call>`) {dec['p_tool_call']:.3f}, PPL of the "
              f"right turn {dec['right_turn_ppl']:.2f}.", ""]
  ev = m.get("eval")
  if ev:
    s, iv = ev["sampled"], ev["intervention"]
    lines += [f"Sampled at T = 1 ({s['tasks']} held-out tasks x {s['samples']}): pass rate {100 * s['pass_rate']:.1f}%, "
              f"pass@{s['samples']} {100 * s['pass_at_k']:.1f}%, all-fail groups {100 * s['all_fail_groups']:.0f}%, "
              f"{s['mean_turns']:.1f} turns on average. Where the failed episodes derailed (the first step the rule "
              "Validator flags, `kind of step/error`; `none`: no step flagged):", "",
              "| first derailment | episodes |", "|---|---|",
              *[f"| {k} | {v} |" for k, v in s["derailed"].items()], "",
              f"One self-intervened rollout per task (rule Validator and Verifier, the policy as Corrector, delta 5): "
              f"{iv['steps_flagged']} steps flagged, {iv['corrections_applied']} corrections applied, "
              f"{iv['verifier_rejected']} rejected by the Verifier, {iv['ppl_rejected']} by the PPL gate; success "
              f"{100 * iv['success_rate']:.0f}%.", ""]
  with open(os.path.join(args.policy_dir, "README.md"), "w") as f:
    f.write("\n".join(lines))


if __name__ == "__main__":
  sys.exit(main())
