"""Builds the tiny base policy for tau2-Telecom by SFT on scripted train-split episodes.

    python experiments/run.py --exp=telecom_sft --policy-dir policies/telecom_base
    python experiments/run.py --exp=telecom_sft --quick --out /tmp/tsft    # a smoke build (< 2 min)

Trains the tokenizer (``telecom_sft_data.TELECOM_PATTERN``) on the SFT tasks' scripted episodes
and the condensed system prompt, a tiny Qwen3 from a seed (``sft.tiny_qwen3_config``), SFT on the
mix of ``rti_jax.policy.telecom_sft_data`` (checklist episodes, the early device-tool mistake,
corrections, decision-free tails), then writes the HF checkpoint (``--policy-dir``; transformers
and ``models.from_pretrained`` load it) and measures the built policy with the real sampler and
rollout engine on the held-out train tasks (the last ``--holdout`` of ``rl_train_split``, never
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

ROOT = pathlib.Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "experiments"):
  if str(_path) not in sys.path:
    sys.path.insert(0, str(_path))

DEFAULT_POLICY_DIR = ROOT / "policies" / "telecom_base"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="run.py --exp=telecom_sft", description=__doc__.split("\n")[0])
  p.add_argument("--out", default=str(ROOT / "runs" / "telecom_sft"), help="run dir (metrics, plot)")
  p.add_argument("--policy-dir", default=None,
                 help="checkpoint dir (default: policies/telecom_base; with --quick: <out>/policy)")
  p.add_argument("--quick", action="store_true", help="smoke build: tiny model, few tasks, a few steps")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--holdout", type=int, default=10, help="last train tasks (rl_train_split order) kept out of SFT (validation)")
  p.add_argument("--recombined", type=int, default=0,
                 help="extra SFT tasks: SFT train tasks with their device faults recombined "
                      "(rti_jax/envs/telecom/recombine.py; no test or train fault set repeated)")
  p.add_argument("--rounds", type=int, default=4,
                 help="scripted-user phrasing seeds each SFT task is played with (the mix is drawn per round)")
  p.add_argument("--epochs", type=float, default=None)
  p.add_argument("--hidden", type=int, default=None)
  p.add_argument("--layers", type=int, default=None)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--head-dim", type=int, default=None)
  p.add_argument("--vocab", type=int, default=4096, help="tokenizer size (at most; BPE stops when no pair repeats)")
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--tokens-per-batch", type=int, default=8192)
  p.add_argument("--qk-norm-init", type=float, default=1.4, help="initial q/k RMSNorm weight (as navigation_sft)")
  p.add_argument("--embed-std", type=float, default=1.0, help="init std of the tied embeddings (sft.scale_embeddings)")
  p.add_argument("--final-norm-init", type=float, default=0.03, help="initial final RMSNorm weight")
  p.add_argument("--resolve-share", type=float, default=0.06, help="checklist episodes with the decision trained")
  p.add_argument("--continue-share", type=float, default=0.35, help="checklist episodes, decisive turn as context")
  p.add_argument("--complete-share", type=float, default=0.5,
                 help="checklist episodes trained except the decisive turn's first token (resolve_tail)")
  p.add_argument("--correction-share", type=float, default=0.6, help="correction examples (p_cal -> right turn)")
  p.add_argument("--max-turns", type=int, default=16,
                 help="assistant turns per sampled episode (the checklist needs at most 14)")
  p.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks sampled (default: all of --holdout)")
  p.add_argument("--eval-samples", type=int, default=4, help="samples per task at temperature 1")
  p.add_argument("--no-eval", action="store_true")
  args = p.parse_args(list(argv) if argv is not None else None)
  if args.quick:
    args.epochs = 0.05 if args.epochs is None else args.epochs
    args.hidden = args.hidden or 32
    args.layers = args.layers or 1
    args.head_dim = args.head_dim or 16
    args.heads = min(args.heads, 2)
    args.rounds = 1
    args.vocab = min(args.vocab, 1024)
    args.eval_tasks = 2 if args.eval_tasks is None else args.eval_tasks
    args.eval_samples = min(args.eval_samples, 2)
    args.max_turns = min(args.max_turns, 6)
  args.epochs = 3.0 if args.epochs is None else args.epochs
  args.hidden = args.hidden or 128
  args.layers = args.layers or 3
  args.head_dim = args.head_dim or 32
  if args.policy_dir is None:
    args.policy_dir = os.path.join(args.out, "policy") if args.quick else str(DEFAULT_POLICY_DIR)
  if args.rounds < 1:
    raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
  if args.recombined < 0:
    raise SystemExit(f"--recombined must be >= 0, got {args.recombined}")
  if not 1 <= args.max_turns <= 30:
    raise SystemExit(f"--max-turns must be in 1..30, got {args.max_turns}")
  if args.epochs <= 0:
    raise SystemExit(f"--epochs must be > 0, got {args.epochs}")
  return args


def build_data(args: argparse.Namespace, log: Any) -> tuple[Any, Any, list[Any], list[Any], list[Any]]:
  """(tokenizer, formatter, examples, SFT tasks, held-out tasks)."""
  from rti_jax.envs.telecom.tasks import rl_train_split
  from rti_jax.policy import telecom_sft_data as td
  from rti_jax.policy.tokenizer import build_tokenizer
  from rti_jax.rollout import ChatFormatter

  from navigation_sft import split_train

  sft_tasks, held = split_train(rl_train_split(), args.holdout)
  if args.quick:
    sft_tasks = sft_tasks[:12]
  if args.recombined:
    from rti_jax.envs.telecom.recombine import recombined_tasks

    try:
      sft_tasks = sft_tasks + recombined_tasks(sft_tasks, args.recombined, seed=args.seed)
    except ValueError as e:
      raise SystemExit(f"--recombined: {e}") from None
  corpus = [text for r in range(args.rounds) for text in td.corpus_texts(sft_tasks, td.make_env(seed=r))]
  tok = build_tokenizer(corpus, args.vocab, pattern=td.TELECOM_PATTERN)
  fmt = ChatFormatter(tok)
  examples = []
  for r in range(args.rounds):
    mix = td.TelecomMix(resolve_share=args.resolve_share, continue_share=args.continue_share,
                        complete_share=args.complete_share, correction_share=args.correction_share,
                        seed=args.seed + 101 * r)
    examples += td.build_examples(sft_tasks, td.make_env(seed=r), fmt, mix)
  log(f"tokenizer: {len(tok)} tokens; {len(examples)} examples from {len(sft_tasks)} tasks x {args.rounds} rounds")
  return tok, fmt, examples, sft_tasks, held


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  import numpy as np
  from flax import nnx

  from models.qwen import Qwen
  from models.weights import save_pretrained
  from rti_jax.envs.telecom.condensed import prompt_stats
  from rti_jax.policy import sft
  from rti_jax.policy.sft_data import summary
  from rti_jax.policy.tokenizer import END_OF_TURN, PAD_TOKEN

  t_start = time.time()
  os.makedirs(args.out, exist_ok=True)
  log = lambda s: print(s, flush=True)  # noqa: E731
  tok, fmt, examples, sft_tasks, held = build_data(args, log)
  data_summary = summary(examples)
  prompts = prompt_stats(tok)
  log(f"SFT data: {json.dumps(data_summary)}; system prompt: {json.dumps(prompts)}")

  pad_id, eos_id = tok.convert_tokens_to_ids(PAD_TOKEN), tok.convert_tokens_to_ids(END_OF_TURN)
  max_pos = max(4096, -(-data_summary["max_len"] // 1024) * 1024)
  mcfg = sft.tiny_qwen3_config(len(tok), hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                               num_kv_heads=1, head_dim=args.head_dim, intermediate_size=2 * args.hidden,
                               max_position_embeddings=max_pos, pad_token_id=pad_id, eos_token_id=eos_id)
  model = Qwen(mcfg, rngs=nnx.Rngs(args.seed))
  sft.sharpen_qk_norm(model, args.qk_norm_init)
  sft.scale_embeddings(model, args.embed_std, args.final_norm_init, seed=args.seed + 1)
  n_params = sft.count_params(model)
  log(f"model: qwen3 hidden {mcfg.hidden_size}, {mcfg.num_layers} layers, vocab {mcfg.vocab_size}, {n_params} params")
  longest = data_summary["max_len"]
  scfg = sft.SFTConfig(epochs=args.epochs, lr=args.lr, tokens_per_batch=max(args.tokens_per_batch, longest),
                       max_len=longest, len_multiple=128, seed=args.seed)
  result = sft.train(model, examples, scfg, pad_id, log=log)
  log(f"SFT: {result.steps} steps in {result.wall_s:.0f}s, final loss {np.mean(result.losses[-10:]):.4f}")
  decision = decision_check(model, fmt, held) if held else None
  if decision:
    log(f"decision (teacher-forced, held-out tasks): "
        f"{json.dumps({k: v for k, v in decision.items() if k != 'per_task_p_right'})}")

  os.makedirs(args.policy_dir, exist_ok=True)
  save_pretrained(model, mcfg, args.policy_dir)
  tok.save_pretrained(args.policy_dir)
  build = {"domain": "telecom", "policy_text": "condensed",
           "argv": list(argv) if argv is not None else sys.argv[1:]}
  with open(os.path.join(args.policy_dir, "build.json"), "w") as f:
    json.dump(build, f, indent=1)
  from navigation_sft import plot_loss

  plot_loss(result.losses, os.path.join(args.out, "loss.png"), title="Telecom tiny policy: SFT")
  metrics: dict[str, Any] = {
    **build, "seed": args.seed, "quick": args.quick, "policy_dir": str(args.policy_dir),
    "sft_tasks": len(sft_tasks), "holdout_tasks": [t.task_id for t in held], "rounds": args.rounds,
    "tokenizer_size": len(tok), "system_prompt": prompts, "model": mcfg.to_hf_dict(), "params": n_params,
    "sft": {"steps": result.steps, "wall_s": result.wall_s, "losses": result.losses,
            "tokens_trained": result.tokens_trained},
    "data": data_summary, "decision": decision,
  }
  save_metrics(args, metrics, time.time() - t_start, log)
  if not args.no_eval and held:
    tasks = held[:args.eval_tasks] if args.eval_tasks is not None else held
    metrics["eval"] = evaluate_policy(args.policy_dir, tasks, args.eval_samples, args.max_turns, args.seed, log)
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
  NLL, to compare with the PPL gate); means over the tasks that have a decisive turn."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from rti_jax.envs.telecom.checklist_agent import ChecklistAgent
  from rti_jax.policy import telecom_sft_data as td
  from rti_jax.policy.sft_data import encode_messages, play

  env = td.make_env()
  call_id = fmt.tokenizer.convert_tokens_to_ids("<tool_call>")
  p_right, p_call, nll = [], [], []
  for task in tasks:
    good = play(env, ChecklistAgent(), task)
    d = td.decisive_index(good)
    if d is None:
      continue
    ids, _ = encode_messages(fmt, good[:d + 1])
    start = len(ids) - len(fmt.encode_assistant(good[d]["content"]))
    x = jnp.asarray([ids], jnp.int32)
    logp = np.asarray(jax.nn.log_softmax(model(x, jnp.ones_like(x)).astype(jnp.float32), axis=-1))[0]
    p_right.append(float(np.exp(logp[start - 1, ids[start]])))
    p_call.append(float(np.exp(logp[start - 1, call_id])))
    nll.append(float(-np.mean([logp[t - 1, ids[t]] for t in range(start, len(ids))])))
  if not p_right:
    return {"tasks": 0}
  return {"tasks": len(p_right), "p_right_first_token": float(np.mean(p_right)),
          "p_tool_call": float(np.mean(p_call)), "right_turn_ppl": float(np.exp(np.mean(nll))),
          "per_task_p_right": p_right}


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
  """One self-intervened rollout per task (Algorithm 1 lines 9-23: rule-based Validator and
  Verifier, the policy as Corrector, PPL gate delta 5): corrections applied, their mean PPL_roll,
  and the success rate."""
  from rti_jax.intervention import InterventionConfig, InterventionStats, PolicyCorrector, run_intervened_rollouts
  from rti_jax.intervention.pipeline import InterventionRoles, rule_roles
  from rti_jax.policy import evaluate as ev

  cfg = ev.rollout_config(1, 1.0, max_new_tokens=96, max_context_tokens=4096, seed=seed)
  validator, verifier = rule_roles("telecom")
  roles = InterventionRoles(validator, PolicyCorrector(backend, cfg.sampling, fmt.end_of_turn_id), verifier)
  stats = InterventionStats(groups_total=len(tasks), groups_triggered=len(tasks))
  runs = run_intervened_rollouts(list(tasks), _env_factory(max_turns), backend, fmt, roles,
                                 InterventionConfig(domain="telecom"), cfg, stats, task_id=lambda t: t.task_id,
                                 seed=seed)
  trajs = [t for r in runs for t in r]
  return {
    "tasks": len(tasks), "steps_flagged": stats.steps_flagged, "corrections_applied": stats.corrections_applied,
    "verifier_rejected": stats.verifier_rejected, "ppl_rejected": stats.ppl_rejected,
    "mean_applied_ppl": stats.mean_accepted_ppl if stats.corrections_applied else float("nan"),
    "success_rate": sum(t.reward >= 1.0 for t in trajs) / max(1, len(trajs)),
    "stats": stats.as_dict(prefix=""),
  }


if __name__ == "__main__":
  sys.exit(main())
