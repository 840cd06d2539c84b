"""Builds the tiny base policy for Navigation by SFT on scripted train-split trajectories.

    python experiments/run.py --exp=navigation_sft [key=value ...]          # configs/sft_navigation.yaml
    python experiments/run.py --exp=navigation_sft --chain DIR [--chain-to STAGE]
    python experiments/run.py --exp=navigation_sft --quick --out /tmp/nsft  # a smoke build (seconds)

The build's config is ``configs/sft_navigation.yaml`` (``--config``) read into
``rti_jax.policy.build_config.NavigationSFTConfig``, then the ``--quick`` profile, then the
``key=value`` overrides; an unknown key or a wrong type is an error naming the key. It trains the
tokenizer and a tiny Qwen3 from a seed (or continues the policy ``init=DIR``), writes the HF
checkpoint (``--policy-dir``, default ``<out>/policy``; transformers and ``models.from_pretrained``
load it) with ``build.json`` (the resolved config and the overrides), then reloads it and measures
its behaviour with the real sampler on train and test tasks: pass rates on tasks with and without
the need to disambiguate, pass@k and all-fail groups, and self-intervention with the rule-based
Validator (does the policy follow the feedback; PPL_roll of its corrections, Eq. 3-4). The run dir
(``--out``) gets ``metrics.json`` and ``loss.png``.

``--chain DIR`` builds a shipped policy from scratch: the stages of ``policies/LINEAGE.yaml`` that
lead to ``--chain-to`` (default ``b11``, the default policy ``policies/navigation_base``), each into
``DIR/<stage>`` and continuing the previous one; overrides on the command line apply to every
stage, and a stage whose ``DIR/<stage>/policy/build.json`` already holds its config is kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
from typing import Any, Sequence

from rti_jax.config import ConfigError
from rti_jax.policy import build_config, lineage
from rti_jax.policy.build_config import NavigationSFTConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="run.py --exp=navigation_sft", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="sft_navigation", help="a build config under configs/ or a YAML path")
  p.add_argument("--out", default=None, help="run dir (metrics, plot; default: runs/navigation_sft)")
  p.add_argument("--policy-dir", default=None, help="checkpoint dir (default: <out>/policy)")
  p.add_argument("--quick", action="store_true", help="smoke build: tiny model, few tasks, short training")
  p.add_argument("--no-eval", action="store_true", help="skip the behaviour measurement after the build")
  p.add_argument("--eval-only", action="store_true",
                 help="only evaluate the built policy (its <out>/metrics.json must exist) and rewrite its card")
  p.add_argument("--chain", metavar="DIR", default=None,
                 help="build the stages of policies/LINEAGE.yaml up to --chain-to from scratch into DIR/<stage>")
  p.add_argument("--chain-to", metavar="STAGE", default="b11", help="the last stage of --chain (default: b11)")
  p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. data.check_line=true")
  args = p.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
  args.paths_given = args.out is not None or args.policy_dir is not None
  args.out = args.out or str(ROOT / "runs" / "navigation_sft")
  args.policy_dir = args.policy_dir or os.path.join(args.out, "policy")
  return args


def load(args: argparse.Namespace) -> NavigationSFTConfig:
  """The resolved config of ``args`` (a bad key or value is a command-line error naming it)."""
  try:
    return build_config.load_navigation(args.config, args.overrides, quick=args.quick)
  except ConfigError as e:
    raise SystemExit(f"navigation_sft: {e}") from None


def chain_runs(chain_dir: str, target: str, overrides: Sequence[str], flags: Sequence[str] = (),
               path: str | pathlib.Path = lineage.LINEAGE_PATH) -> list[tuple[lineage.Stage, list[str]]]:
  """Per stage of ``lineage.chain(target)``, the argv of its build: ``flags`` (e.g. ``--quick``),
  its run dir ``DIR/<stage>`` and policy dir ``DIR/<stage>/policy``, ``init=`` the previous
  stage's policy dir, the stage's overrides, then ``overrides`` (later ones win, so
  ``train.epochs=0.2`` shrinks every stage)."""
  stages = lineage.chain(lineage.load_lineage(path), target)
  wrong = [s.name for s in stages if s.builder != "navigation_sft"]
  if wrong:
    raise ValueError(f"--chain-to {target}: stages {wrong} are not navigation_sft builds")
  out, prev = [], None
  for stage in stages:
    run = os.path.join(chain_dir, stage.name)
    policy = os.path.join(run, "policy")
    out.append((stage, [*flags, "--out", run, "--policy-dir", policy, *lineage.stage_overrides(stage, prev), *overrides]))
    prev = policy
  return out


def run_chain(args: argparse.Namespace) -> int:
  if args.eval_only or args.paths_given or any(o.split("=", 1)[0].strip() == "init" for o in args.overrides):
    raise SystemExit("--chain sets init, --out and --policy-dir of every stage itself (and has no --eval-only)")
  flags = ["--config", args.config] + (["--quick"] if args.quick else []) + (["--no-eval"] if args.no_eval else [])
  try:
    runs = chain_runs(args.chain, args.chain_to, args.overrides, flags)
  except ValueError as e:
    raise SystemExit(str(e)) from None
  for stage, argv in runs:
    sub = parse_args(argv)
    meta = os.path.join(sub.policy_dir, "build.json")
    if os.path.exists(meta) and _recorded_config(meta) == build_config.to_dict(load(sub)):
      print(f"chain stage {stage.name}: built already ({meta})", flush=True)
      continue
    print(f"chain stage {stage.name}: navigation_sft " + " ".join(argv), flush=True)
    if main(argv) != 0:
      return 1
  return 0


def _recorded_config(build_json: str) -> Any:
  with open(build_json) as f:
    return json.load(f).get("config")


def split_train(train: list[Any], holdout: int) -> tuple[list[Any], list[Any]]:
  """``sft_example.split_train``, with a bad ``data.holdout`` as a command-line error."""
  from rti_jax.policy.sft_example import split_train as split

  try:
    return split(train, holdout)
  except ValueError as e:
    raise SystemExit(f"data.holdout: {e}") from None


def pick(tasks: list[Any], n: int) -> list[Any]:
  """The first ``n`` tasks needing disambiguation and the first ``n`` not needing it (split order)."""
  need = [t for t in tasks if t.needs_disambiguation][:n]
  plain = [t for t in tasks if not t.needs_disambiguation][:n]
  return need + plain


def plot_loss(losses: list[float], path: str, title: str = "Navigation tiny policy: SFT") -> None:
  """The SFT loss per step (log scale) and its running mean, as a PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, ax = plt.subplots(figsize=(5, 3.2))
  ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.8, label="batch")
  if len(losses) >= 10:
    k = max(2, len(losses) // 20)
    ax.plot(np.arange(k, len(losses) + 1), np.convolve(losses, np.ones(k) / k, "valid"), lw=1.5, label=f"mean of {k}")
  ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("NLL per assistant token")
  ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def build_record(args: argparse.Namespace, cfg: NavigationSFTConfig) -> dict[str, Any]:
  """The policy's ``build.json``: the format flag the policy's users read (``check_line``), then
  how it was made (the config file, the overrides as given, the resolved config)."""
  return {"domain": "navigation", "check_line": cfg.data.check_line, "builder": "navigation_sft",
          "config_file": args.config, "quick": args.quick, "overrides": list(args.overrides),
          "config": build_config.to_dict(cfg)}


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  if args.chain:
    return run_chain(args)
  cfg = load(args)
  from rti_jax.envs import navigation as nav

  t_start = time.time()
  os.makedirs(args.out, exist_ok=True)
  log = lambda s: print(s, flush=True)  # noqa: E731
  bench = nav.load_benchmark("tiny", hidden_city_share=cfg.data.hidden_city_share)
  if args.eval_only:
    path = os.path.join(args.out, "metrics.json")
    if not os.path.exists(path):
      raise SystemExit(f"--eval-only: {path} not found; build the policy first (without --eval-only)")
    with open(path) as f:
      metrics = json.load(f)
    metrics["eval"] = evaluate_policy(args.policy_dir, cfg, bench, log)
    save_metrics(args, cfg, metrics, metrics.get("wall_s", 0.0) + time.time() - t_start, log)
    return 0
  metrics = build(args, cfg, bench, log)
  # Saved before the evaluation, so a failed evaluation loses nothing (--eval-only reruns it).
  save_metrics(args, cfg, metrics, time.time() - t_start, log)
  if not args.no_eval:
    metrics["eval"] = evaluate_policy(args.policy_dir, cfg, bench, log)
    save_metrics(args, cfg, metrics, time.time() - t_start, log)
  return 0


def whole_place_tokens(tok: Any, env: Any) -> tuple[Any, dict[int, list[int]]]:
  """(``tok`` with one token per name and per coordinate of every place of ``env``'s world, {new id:
  the existing ids its embedding row starts from}) for a build that continues a policy: a setting
  with hidden-city places adds places the policy's tokenizer never saw. A new name starts from the
  existing whole-name tokens, a new coordinate from the existing coordinate tokens, any other new
  token (a partial merge) from every ordinary token; ({} when nothing is new or the tokenizer does
  not make whole names: ``tokenizer.pattern=words``)."""
  from rti_jax.policy import sft_data
  from rti_jax.policy.tokenizer import add_whole_pretokens

  texts = [t for p in env.world.pois for t in (p.name, f"{p.name} {p.location}")]
  names = sft_data.place_name_token_ids(tok, env)
  if not names or all(len(tok.encode(t, add_special_tokens=False)) == 2 for t in texts[1::2]):
    return tok, {}
  locations = {p.location for p in env.world.pois}
  vocab = tok.get_vocab()
  coords = sorted(i for t, i in vocab.items() if t in locations)
  ordinary = sorted(i for t, i in vocab.items() if i not in tok.all_special_ids and not t.startswith("<"))
  new, _ = add_whole_pretokens(tok, texts)
  new_names = set(sft_data.place_name_token_ids(new, env))
  like: dict[int, list[int]] = {}
  for t, i in new.get_vocab().items():
    if i >= len(tok):
      like[i] = names if i in new_names else coords if t in locations and coords else ordinary
  return new, like


def build(args: argparse.Namespace, cfg: NavigationSFTConfig, bench: Any, log: Any) -> dict[str, Any]:
  """Trains and saves the policy of ``cfg`` into ``args.policy_dir``; returns the build's metrics."""
  import numpy as np
  from flax import nnx

  from models.qwen import Qwen
  from models.weights import save_pretrained
  from rti_jax.envs import navigation as nav
  from rti_jax.policy import sft, sft_data, sft_swap
  from rti_jax.policy.tokenizer import (END_OF_TURN, NAME_PATTERN, PAD_TOKEN, PRE_TOKENIZER_PATTERN, build_tokenizer,
                                       save_tokenizer)
  from rti_jax.rollout import ChatFormatter

  env = nav.NavigationEnv(bench.world)
  data, train_cfg, drill_cfg = cfg.data, cfg.train, cfg.name_drills
  train_tasks, held = split_train(bench.train, data.holdout)
  if data.max_tasks:
    train_tasks = train_tasks[:data.max_tasks]
  checks = cfg.checks.reading > 0 and bool(held)
  check = data.check_line
  if cfg.init:
    from transformers import AutoTokenizer

    from models.weights import from_pretrained

    if not os.path.isdir(cfg.init):
      raise SystemExit(f"init: {cfg.init} is not a directory (a policy dir with config.json and tokenizer files)")
    tok = AutoTokenizer.from_pretrained(cfg.init, local_files_only=True)
  else:
    # Tokenizer: trained on train-split transcripts plus every benchmark token.
    tok = build_tokenizer(sft_data.corpus_texts(train_tasks, env, check=check) + list(nav.vocabulary()),
                          cfg.tokenizer.vocab,
                          pattern=NAME_PATTERN if cfg.tokenizer.pattern == "names" else PRE_TOKENIZER_PATTERN)
  grown = None
  if cfg.init:
    tok, grown = whole_place_tokens(tok, env)
    if grown:
      log(f"tokenizer: {len(grown)} new tokens for places the policy's tokenizer lacked (now {len(tok)})")
  fmt = ChatFormatter(tok)
  mix = sft_data.MixConfig(resolve_share=data.resolve_share, seed=cfg.seed, check=check,
                           complete_share=data.complete_share, correction=data.correction)
  examples = sft_data.build_examples(train_tasks, env, fmt, mix)
  examples += sft_swap.name_swap_examples(train_tasks, env, fmt, data.name_swap, seed=cfg.seed + 7)
  # The stop sets of every benchmark task (test split included) are excluded from the generated
  # tasks, so none repeats a benchmark task; nothing else of the test split is read.
  taken = frozenset(frozenset(s.poi_id for s in t.stops) for t in bench.train + bench.test)
  examples += sft_swap.swap_episode_examples(train_tasks, env, fmt, data.swap_episodes, seed=cfg.seed + 11,
                                             exclude=taken, check=check)
  examples += sft_swap.swap_disamb_examples(train_tasks, env, fmt, data.swap_disamb, seed=cfg.seed + 13,
                                            exclude=taken, check=check)
  if check:
    examples += sft_swap.check_drill_examples(train_tasks, env, fmt, data.check_drills, seed=cfg.seed + 17,
                                              exclude=taken)
  data_summary = sft_data.summary(examples)
  log(f"tokenizer: {len(tok)} tokens; SFT data: {json.dumps(data_summary)}")

  pad_id, eos_id = tok.convert_tokens_to_ids(PAD_TOKEN), tok.convert_tokens_to_ids(END_OF_TURN)
  if cfg.init:
    model, mcfg = from_pretrained(cfg.init)
    if grown:
      model = sft.grow_vocabulary(model, len(tok), grown, seed=cfg.seed + 12)
      mcfg = model.config
  else:
    m = cfg.model
    mcfg = sft.tiny_qwen3_config(len(tok), hidden_size=m.hidden, num_layers=m.layers, num_heads=m.heads,
                                 num_kv_heads=1, head_dim=m.head_dim, intermediate_size=2 * m.hidden,
                                 pad_token_id=pad_id, eos_token_id=eos_id)
    model = Qwen(mcfg, rngs=nnx.Rngs(cfg.seed))
    sft.sharpen_qk_norm(model, m.qk_norm_init)
    sft.scale_embeddings(model, m.embed_std, m.final_norm_init, seed=cfg.seed + 1)
    sft.add_type_direction(model, sft_data.place_name_token_ids(tok, env), m.name_type_init, seed=cfg.seed + 8)
  n_params = sft.count_params(model)
  log(f"model: qwen3 hidden {mcfg.hidden_size}, {mcfg.num_layers} layers, vocab {mcfg.vocab_size}, {n_params} params"
      + (f" (from {cfg.init})" if cfg.init else ""))
  name_stage = None
  if drill_cfg.steps > 0 and not cfg.init:
    # Stage 0: reading stop names out of requests, on first-turn drills alone (short sequences).
    drills = [sft_data.without_system_turn(fmt, e)
              for e in sft_swap.name_swap_examples(train_tasks, env, fmt, drill_cfg.examples or 16 * drill_cfg.steps,
                                                   seed=cfg.seed + 9)]
    dcfg = sft.SFTConfig(lr=train_cfg.lr, tokens_per_batch=2048, max_len=1024, len_multiple=32, seed=cfg.seed + 2)
    dcfg = sft.for_steps(dcfg, drills, pad_id, drill_cfg.steps)
    curve: list[tuple[int, float]] = []

    def names_read(step: int) -> bool:
      from experiments.diagnostics import name_copy_check

      got = name_copy_check.measure_model(model, tok, fmt, cfg.checks.reading, swapped=True, tasks=held, env=env,
                                          system_turn=False)
      curve.append((step, got["search names"]["copied"]))
      log(f"names: step {step}, held-out drills read right {curve[-1][1]:.2f}")
      return curve[-1][1] >= drill_cfg.target

    dres = sft.train(model, drills, dcfg, pad_id, log=lambda s: log("names " + s), log_every=100,
                     stop=names_read if checks else None, check_every=200)
    log(f"name drills: {dres.steps} steps in {dres.wall_s:.0f}s, final loss {np.mean(dres.losses[-10:]):.4f}")
    name_stage = {"steps": dres.steps, "wall_s": dres.wall_s, "examples": len(drills),
                  "final_loss": float(np.mean(dres.losses[-10:])), "held_out_read": curve}
    if checks:
      name_stage["reading"] = reading_check(model, tok, fmt, cfg.checks.reading, held, env, swapped_only=True)
      log(f"reading after the name drills: {json.dumps(name_stage['reading'])}")
  if train_cfg.copy_examples > 0:
    # Stage 0: synthetic copying over the tokenizer's word and number tokens.
    pool = [i for t, i in tok.get_vocab().items() if t.isalnum() or t.replace(".", "").isdigit()]
    copy = sft.copy_task_examples(pool, train_cfg.copy_examples, seed=cfg.seed)
    ccfg = sft.SFTConfig(epochs=1.0, lr=train_cfg.lr, tokens_per_batch=768, max_len=64, len_multiple=32, seed=cfg.seed)
    cres = sft.train(model, copy, ccfg, pad_id, log=lambda s: log("copy " + s), log_every=50)
    log(f"copy stage: {cres.steps} steps in {cres.wall_s:.0f}s, final loss {np.mean(cres.losses[-10:]):.4f}")
  if train_cfg.warmup_epochs > 0:
    # Stage 1: the same examples without the (constant, untrained) system turn.
    short = [sft_data.without_system_turn(fmt, e) for e in examples]
    wcfg = sft.SFTConfig(epochs=train_cfg.warmup_epochs, lr=train_cfg.lr,
                         tokens_per_batch=train_cfg.tokens_per_batch // 2, seed=cfg.seed + 1)
    warm = sft.train(model, short, wcfg, pad_id, log=lambda s: log("warm-up " + s))
    log(f"warm-up: {warm.steps} steps in {warm.wall_s:.0f}s, final loss {np.mean(warm.losses[-10:]):.4f}")
  scfg = sft.SFTConfig(epochs=train_cfg.epochs, lr=train_cfg.lr, tokens_per_batch=train_cfg.tokens_per_batch,
                       seed=cfg.seed)
  result = sft.train(model, examples, scfg, pad_id, log=log)
  if train_cfg.warmup_epochs > 0:
    result = sft.SFTResult(losses=warm.losses + result.losses, steps=warm.steps + result.steps,
                           wall_s=warm.wall_s + result.wall_s, tokens_trained=warm.tokens_trained + result.tokens_trained)
  log(f"SFT: {result.steps} steps in {result.wall_s:.0f}s, final loss {np.mean(result.losses[-10:]):.4f}")
  os.makedirs(args.policy_dir, exist_ok=True)
  save_pretrained(model, mcfg, args.policy_dir)
  save_tokenizer(tok, args.policy_dir)
  record = build_record(args, cfg)
  with open(os.path.join(args.policy_dir, "build.json"), "w") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
  # the policy dir is complete before the checks: a failing check loses no training
  reading = reading_check(model, tok, fmt, cfg.checks.reading, held, env) if checks else None
  if reading:
    log(f"reading after SFT: {json.dumps(reading)}")
  decision = decision_check(model, fmt, held, env, pad_id, check) if held and cfg.checks.decision else None
  if decision:
    log(f"decision after SFT (teacher-forced, held-out tasks): {json.dumps(decision)}")

  plot_loss(result.losses, os.path.join(args.out, "loss.png"))
  return {
    "name_drills": name_stage, **record, "init": cfg.init, "seed": cfg.seed,
    "policy_dir": os.path.relpath(args.policy_dir, ROOT),
    "sft_tasks": len(train_tasks), "holdout_tasks": [t.task_id for t in held],
    "tokenizer_size": len(tok), "new_place_tokens": len(grown or {}), "model": mcfg.to_hf_dict(), "params": n_params,
    "sft": {"steps": result.steps, "wall_s": result.wall_s, "losses": result.losses,
            "tokens_trained": result.tokens_trained, "config": dataclasses.asdict(scfg)},
    "data": data_summary, "mix": dataclasses.asdict(mix), "reading": reading, "decision": decision,
  }


def reading_check(model: Any, tok: Any, fmt: Any, n: int, tasks: list[Any], env: Any,
                  swapped_only: bool = False) -> dict[str, Any]:
  """Teacher-forced argmax accuracy of search names (and coordinates) on held-out train tasks of
  ``env``'s setting: ``n`` first turns with swapped stop names, and unless ``swapped_only`` ``n``
  whole episodes (``experiments/diagnostics/name_copy_check.py``)."""
  from experiments.diagnostics import name_copy_check

  def brief(m: dict[str, Any]) -> dict[str, Any]:
    return {"search_names": m["search names"]["copied"], "a_request_name": m["search names"]["argmax is a request name"],
            "by_search": m["per search (copied)"], "names_after_results": m["names after results"]["copied"],
            "coordinates": m["coordinates"]["copied"]}

  out = {"swapped_first_turns": brief(name_copy_check.measure_model(model, tok, fmt, n, swapped=True, tasks=tasks,
                                                                    env=env))}
  if not swapped_only:
    out["episodes"] = brief(name_copy_check.measure_model(model, tok, fmt, n, tasks=tasks, env=env))
  return out


def decision_check(model: Any, fmt: Any, tasks: list[Any], env: Any, pad_id: int, check: bool) -> dict[str, float]:
  """The decision probe's figures (``experiments/diagnostics/decision_probe.py``) on held-out
  train tasks, teacher-forced: the check word and the decision after the first search results."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from experiments.diagnostics.decision_probe import DecisionProbe
  from rti_jax import objectives

  probe = DecisionProbe(tasks, env, fmt, pad_id, check=check)
  logp = jax.jit(lambda ids, m: objectives.next_token_logprobs(model(ids, m), ids))(
    jnp.asarray(probe.ids), jnp.asarray(probe.mask))
  return probe.summarize(np.asarray(logp))


def save_metrics(args: argparse.Namespace, cfg: NavigationSFTConfig, metrics: dict[str, Any], wall_s: float,
                 log: Any) -> None:
  """Writes ``<out>/metrics.json`` and the policy's model card."""
  metrics["wall_s"] = wall_s
  with open(os.path.join(args.out, "metrics.json"), "w") as f:
    json.dump(metrics, f, indent=1, default=str)
  write_card(cfg, metrics, os.path.join(args.policy_dir, "README.md"))
  log(f"wrote {args.policy_dir}/README.md and {args.out}/metrics.json ({wall_s:.0f}s)")


def evaluate_policy(policy_dir: str, cfg: NavigationSFTConfig, bench: Any, log: Any) -> dict[str, Any]:
  """The behaviour figures of the policy in ``policy_dir`` per split (see ``table``)."""
  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.policy import evaluate as ev
  from rti_jax.policy.tokenizer import PAD_TOKEN

  pmodel, ptok, pfmt = ev.load_policy(policy_dir)
  backend = JaxBackend(pmodel, max_cache_len=2048, pad_id=ptok.convert_tokens_to_ids(PAD_TOKEN))
  evals: dict[str, Any] = {}
  for split, tasks in (("train", bench.train), ("test", bench.test)):
    chosen = pick(tasks, cfg.eval.tasks)
    need = [t for t in chosen if t.needs_disambiguation]
    t0 = time.time()
    evals[split] = {
      "sampled": ev.rollout_behaviour(backend, pfmt, bench.world, chosen, cfg.eval.samples, 1.0, seed=cfg.seed),
      "greedy": ev.rollout_behaviour(backend, pfmt, bench.world, chosen, 1, 0.0, seed=cfg.seed),
      "intervention": ev.intervention_behaviour(backend, pfmt, bench.world, need, 1.0, seed=cfg.seed,
                                                corrector=cfg.data.correction),
    }
    log(f"eval {split}: {time.time() - t0:.0f}s")
  log(table(evals, cfg.eval.samples))
  return evals


PATTERN_NOTES = {"names": "whole names and coordinates, a name takes the space after it when a number follows (NAME_PATTERN)",
                 "words": "words and numbers (PRE_TOKENIZER_PATTERN)"}


def write_card(cfg: NavigationSFTConfig, metrics: dict[str, Any], path: str) -> None:
  """A short model card next to the checkpoint: how it was built and what it does."""
  rebuild = " ".join((["--quick"] if metrics.get("quick") else []) + list(metrics.get("overrides") or []))
  lines = [
    "# A tiny base policy for Navigation",
    "",
    "A tiny Qwen3 (transformers `Qwen3ForCausalLM`, loaded by `models.from_pretrained`) with a",
    "byte-level BPE tokenizer and a Qwen-style chat template, built by SFT on scripted",
    "train-split trajectories only (resolved config: `build.json`). Rebuild it with:",
    "",
    "    python experiments/run.py --exp=navigation_sft " + rebuild,
    "",
    f"Params: {metrics['params']}; tokenizer: {metrics['tokenizer_size']} tokens; "
    f"SFT: {metrics['sft']['steps']} steps, {metrics['sft']['wall_s']:.0f} s.",
    f"SFT mix: {json.dumps(metrics['data']['kinds'])}.",
  ]
  held_note = (f"Searches in the order the request names the places; "
               f"{len(metrics.get('holdout_tasks') or [])} train tasks held out of SFT for diagnostics.")
  m, drills = cfg.model, metrics.get("name_drills") or {}
  if cfg.init:
    grown = metrics.get("new_place_tokens") or 0
    extra = (f" plus {grown} tokens for the places of this setting that its tokenizer lacked, with new embedding rows"
             if grown else "")
    lines.append(f"Continued from the policy in `{cfg.init}` (its tokenizer, weights and architecture{extra}; "
                 f"no tokenizer build, init or stage 0 here; see that policy's card). {held_note}")
  else:
    lines.append(
      f"Pre-tokenizer: {PATTERN_NOTES[cfg.tokenizer.pattern]}; "
      f"init: embeddings std {m.embed_std}, final norm {m.final_norm_init}, q/k norm {m.qk_norm_init}, "
      f"a shared place-name direction of norm {m.name_type_init}; {m.heads} heads x {m.head_dim}; "
      f"stage 0: {drills.get('steps', cfg.name_drills.steps)} steps on {drills.get('examples', '?')} distinct "
      f"first-turn name drills (why: docs/tiny_policy.md). {held_note}")
  ep = (metrics.get("reading") or {}).get("episodes")
  if ep:
    by = " / ".join(f"{v:.0%}" for v in ep["by_search"].values())
    lines += ["", "Teacher-forced on held-out train episodes (argmax): coordinates copied "
              f"{ep['coordinates']:.0%}; search names right {ep['search_names']:.0%} (by search {by}), "
              f"one of the request's names {ep['a_request_name']:.0%}; names after the results {ep['names_after_results']:.0%}."]
  dec = metrics.get("decision")
  if dec and metrics.get("check_line"):
    lines += ["", "Check line (rti_jax/policy/check_line.py), teacher-forced on the held-out train tasks: the off "
              f"stop named with probability {dec['p_check_odd']:.3f} after ambiguous results, `all` "
              f"{dec['p_check_all_plain']:.3f} after plain ones; after the line: re-search {dec['p_research']:.4f}, "
              f"trust {dec['p_trust']:.3f}, plan (plain) {dec['p_plan_plain']:.3f}."]
  if "eval" in metrics:
    lines += ["", "Measured behaviour (real sampler; see the run's metrics.json):", "", "```",
              table(metrics["eval"], cfg.eval.samples), "```"]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def table(evals: dict[str, Any], k: int) -> str:
  """A text table of the behaviour figures per split."""
  rows = [f"{'':34s}" + "".join(f"{s:>10s}" for s in evals)]

  def row(name: str, get: Any) -> None:
    vals = []
    for s in evals:
      try:
        vals.append(f"{float(get(evals[s])):10.3f}")
      except (KeyError, TypeError, ValueError):
        vals.append(f"{'-':>10s}")
    rows.append(f"{name:34s}" + "".join(vals))

  row("plain: pass rate (T=1)", lambda e: e["sampled"]["plain"]["pass_rate"])
  row("plain: pass rate (greedy)", lambda e: e["greedy"]["plain"]["pass_rate"])
  row("disamb.: pass rate (T=1)", lambda e: e["sampled"]["disambiguation"]["pass_rate"])
  row("disamb.: pass rate (greedy)", lambda e: e["greedy"]["disambiguation"]["pass_rate"])
  row(f"disamb.: pass@{k} (T=1)", lambda e: e["sampled"]["disambiguation"]["pass_at_k"])
  row(f"disamb.: all-fail groups (G={k})", lambda e: e["sampled"]["disambiguation"]["all_fail_groups"])
  row("interv.: follows re-search hint", lambda e: e["intervention"]["follows_research_suggestion"])
  row("interv.: corrections applied", lambda e: e["intervention"]["corrections_applied"])
  row("interv.: mean PPL_roll applied", lambda e: e["intervention"]["mean_applied_ppl"])
  row("interv.: success rate", lambda e: e["intervention"]["success_rate"])
  return "\n".join(rows)


if __name__ == "__main__":
  sys.exit(main())
