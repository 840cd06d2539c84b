"""Teaches a policy to be its own Validator and Verifier (self-intervention) by SFT on its
environment's rule oracles, and measures how far their verdicts agree on held-out steps.

    python experiments/run.py --exp=judge_sft --env navigation --out runs/judge_nav      # build + measure
    python experiments/run.py --exp=judge_sft --env navigation --eval-only --policy DIR  # measure any policy
    python experiments/run.py --exp=judge_sft --env navigation --quick --out /tmp/j      # a smoke build

The questions are those the judges meet in training (``rti_jax.policy.judge_sft``): every step of
one intervened rollout per task of the policy itself (rule roles deciding, the policy as Corrector
under the config's correction message), ``--rounds`` times with other seeds, on the train split
without its validation tasks (``train.val_tasks``, kept for choosing RL settings). Every step the
oracle objects to is kept, with as many others drawn at random (``--accept-per-objection``). The
pre-tokens those prompts and answers repeat become whole tokens where the policy's own text
encodes exactly as before (``grow_tokenizer``), and the SFT mix adds ``--replays`` episodes per
train task (one by default) sampled from the policy at T = 1 (``replay``: its expected gradient is
zero at the policy, so it only holds the agent where it was), and the same for the policy's own
corrections: each correction prompt p_cal with the rewrite the policy sampled from it at T = 1 (the
Corrector skill, whose message's wording must also encode as before). The policy (``--policy-dir``,
default ``<out>/policy``) gets ``build.json`` and a card.

The measurement: on the test split, one intervened rollout per task of the built policy, each
question asked to it as a judge (greedy, within ``intervention.judge_max_new_tokens`` and the
judges' context) and to the rule oracle: precision and recall of "invalid" (Validator) and
"reject" (Verifier), per error type and per reason, the malformed and over-context counts; and the
agent's p@1 on the validation tasks before and after. ``<out>`` gets ``metrics.json`` and
``table.md``. The test split chooses nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="run.py --exp=judge_sft", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--env", default="navigation", help="a registered environment with rule roles")
  p.add_argument("--config", default=None, help="the RL config whose rollout and intervention settings apply (default: --env)")
  p.add_argument("--policy", default=None, help="the policy to teach, or with --eval-only to measure (default: the config's)")
  p.add_argument("--out", default=None, help="run dir (default: runs/judge_sft_<env>)")
  p.add_argument("--policy-dir", default=None, help="where the built policy goes (default: <out>/policy)")
  p.add_argument("--eval-only", action="store_true", help="only measure --policy as a judge")
  p.add_argument("--quick", action="store_true", help="a smoke build: a few tasks, a few steps")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--rounds", type=int, default=2, help="intervened rollouts per train task (each another seed)")
  p.add_argument("--replays", type=int, default=1,
                 help="the policy's own episodes per train task (T = 1) trained beside the judging, to hold the agent")
  p.add_argument("--accept-per-objection", type=float, default=1.0)
  p.add_argument("--suggestion", choices=["visible", "evidence", "auto"], default="auto",
                 help="the Validator's suggest_next: the visible-only one or the one from l (auto: visible for "
                      "intervention.corrector=feedback, evidence for paper)")
  p.add_argument("--min-share", type=float, default=0.3, help="pre-tokens in this share of a role's texts become tokens")
  p.add_argument("--epochs", type=float, default=3.0)
  p.add_argument("--lr", type=float, default=1e-3)
  p.add_argument("--tokens-per-batch", type=int, default=4096)
  p.add_argument("--judge-tokens", type=int, default=0,
                 help="the judges' answer budget in the measurement (0: the longest trained answer + 16)")
  p.add_argument("--test-tasks", type=int, default=0, help="test tasks measured (0: all)")
  p.add_argument("overrides", nargs="*", help="overrides of the RL config, key=value")
  args = p.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
  if args.replays < 1:
    p.error(f"--replays: expected an integer >= 1, got {args.replays}")
  args.out = args.out or str(ROOT / "runs" / f"judge_sft_{args.env}")
  args.policy_dir = args.policy_dir or os.path.join(args.out, "policy")
  return args


def _log(s: str) -> None:
  print(s, flush=True)


def load_policy(path: str, tool_schemas: Any) -> tuple[Any, Any, Any]:
  """``policy.evaluate.load_policy`` with the environment's tool schemas in the formatter."""
  from rti_jax.policy import evaluate
  from rti_jax.rollout import ChatFormatter

  if not os.path.isdir(path):
    raise SystemExit(f"--policy: {path} is not a policy directory")
  model, tok, _ = evaluate.load_policy(path)
  return model, tok, ChatFormatter(tok, tool_schemas)


def backend_for(model: Any, tok: Any, cfg: Any) -> Any:
  from rti_jax.generation.jax_backend import JaxBackend

  return JaxBackend(model, max_cache_len=cfg.rollout.max_context, pad_id=tok.pad_token_id or 0,
                    prefix_cache_bytes=int(cfg.rollout.prefix_cache_mb) << 20)


def setting(args: argparse.Namespace) -> dict[str, Any]:
  """The RL config, its task source, splits, rule roles and runtime configs."""
  from rti_jax import config as config_lib
  from rti_jax.envs import registry

  try:
    cfg = config_lib.load_config(args.config or args.env, args.overrides)
  except config_lib.ConfigError as e:
    raise SystemExit(f"judge_sft: {e}") from None
  if cfg.env.name != args.env:
    raise SystemExit(f"--env {args.env}: the config {args.config or args.env!r} is for env.name={cfg.env.name!r}")
  source = registry.task_source(cfg)
  val = int(cfg.train.val_tasks)
  train, held = list(source.train[:len(source.train) - val]), list(source.train[len(source.train) - val:])
  test = list(source.test)[:args.test_tasks or None]
  if args.quick:
    train, held, test = train[:6], held[:4], test[:4]
  return {"cfg": cfg, "source": source, "train": train, "val": held, "test": test,
          "roles": registry.rule_roles(source.domain, registry.options_of(cfg, source.domain)),
          "rollout": config_lib.rollout_config(cfg),
          "intervention": config_lib.intervention_config(cfg, source.domain, source.success_threshold),
          "judge_context": config_lib.judge_context(cfg)}


def record(s: dict[str, Any], tasks: Sequence[Any], backend: Any, fmt: Any, seed: int, **kw: Any) -> list[Any]:
  from rti_jax.policy import judge_sft

  src = s["source"]
  return judge_sft.record_steps(tasks, src.env_factory, backend, fmt, s["roles"], s["intervention"], s["rollout"],
                                task_id=src.task_id, seed=seed, **kw)


def pass_rate(s: dict[str, Any], backend: Any, fmt: Any, tasks: Sequence[Any], samples: int, seed: int) -> float:
  """Mean success of ``samples`` episodes per task at the config's temperature."""
  from rti_jax.rollout import rollout_groups

  if not tasks:
    return math.nan
  src = s["source"]
  groups = rollout_groups(list(tasks), src.env_factory, backend, fmt,
                          dataclasses.replace(s["rollout"], group_size=samples), task_id=src.task_id, seed=seed)
  return float(sum(t.reward >= src.success_threshold for g in groups for t in g) / (len(tasks) * samples))


def build(args: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
  import numpy as np

  from models.weights import save_pretrained
  from rti_jax.policy import judge_sft, sft
  from rti_jax.policy.sft_example import SFTExample, summary
  from rti_jax.policy.tokenizer import save_tokenizer
  from rti_jax.rollout import ChatFormatter, rollout_groups

  cfg, src = s["cfg"], s["source"]
  policy = args.policy or cfg.policy.path
  model, tok, fmt = load_policy(policy, src.tool_schemas)
  backend = backend_for(model, tok, cfg)
  t0 = time.time()
  steps: list[Any] = []
  corrections: list[tuple[list[int], list[int]]] = []  # the policy's own corrections at T = 1, replayed
  for r in range(args.rounds):
    steps += record(s, s["train"], backend, fmt, seed=1000 * args.seed + 17 * r, corrector_temperature=1.0,
                    corrections=corrections)
    _log(f"round {r + 1}/{args.rounds}: {len(steps)} questions recorded ({time.time() - t0:.0f}s)")
  replay_cfg = dataclasses.replace(s["rollout"], group_size=args.replays, behaviour_temperature=1.0,
                                   sampling=dataclasses.replace(s["rollout"].sampling, temperature=1.0))
  groups = rollout_groups(s["train"], src.env_factory, backend, fmt, replay_cfg, task_id=src.task_id,
                          seed=1000 * args.seed + 5)
  replay = [t for g in groups for t in g]
  record_s = time.time() - t0
  chosen = judge_sft.balanced(steps, np.random.default_rng(args.seed), args.accept_per_objection)
  suggestion = args.suggestion if args.suggestion != "auto" else (
    "evidence" if cfg.intervention.corrector == "paper" else "visible")
  texts = {role: [st.prompt() + "\n" + judge_sft.answer(st, suggestion) for st in chosen if st.role == role]
           for role in judge_sft.ROLES}
  cands = list(dict.fromkeys(c for role in judge_sft.ROLES if texts[role]
                             for c in judge_sft.frequent_pretokens(tok, texts[role], args.min_share)))
  # What the policy reads and writes as the agent, the correction prompts' messages included.
  agent_texts = [tok.decode(t.token_ids, skip_special_tokens=True) for t in replay] + [
    tok.decode(p + c, skip_special_tokens=True) for p, c in corrections]
  new_tok, kept, like = judge_sft.grow_tokenizer(tok, cands, agent_texts)
  _log(f"tokenizer: {len(kept)} of {len(cands)} frequent judge pre-tokens made whole ({len(tok)} -> {len(new_tok)} tokens)")
  if like:
    model = sft.grow_vocabulary(model, len(new_tok), like, seed=args.seed + 12)
  fmt = ChatFormatter(new_tok, src.tool_schemas)
  jfmt = judge_sft.judge_formatter(fmt)
  scfg = sft.SFTConfig(epochs=args.epochs, lr=args.lr, tokens_per_batch=args.tokens_per_batch, seed=args.seed,
                       max_len=min(cfg.rollout.max_context, args.tokens_per_batch))
  examples = [e for e in (judge_sft.example(jfmt, st, suggestion, scfg.max_len) for st in chosen) if e is not None]
  too_long = len(chosen) - len(examples)
  answer_len = max((sum(e.loss_mask) for e in examples), default=0)
  examples += [SFTExample(t.task_id, "replay", tuple(t.token_ids), tuple(t.loss_mask)) for t in replay
               if len(t.token_ids) <= scfg.max_len and any(t.loss_mask)]
  examples += [SFTExample("correction", "correction", tuple(p + c), tuple([False] * len(p) + [True] * len(c)))
               for p, c in corrections if len(p) + len(c) <= scfg.max_len]
  data = summary(examples)
  _log(f"SFT data: {json.dumps({k: v for k, v in data.items() if k != 'kinds'})}, "
       f"{ {k: v for k, v in data['kinds'].items() if v} }, {too_long} questions over {scfg.max_len} tokens left out")
  result = sft.train(model, examples, scfg, new_tok.pad_token_id or 0, log=_log)
  _log(f"SFT: {result.steps} steps in {result.wall_s:.0f}s, final loss {np.mean(result.losses[-10:]):.4f}")
  os.makedirs(args.policy_dir, exist_ok=True)
  save_pretrained(model, model.config, args.policy_dir)
  save_tokenizer(new_tok, args.policy_dir)
  judge_tokens = args.judge_tokens or answer_len + 16
  record_json = {"domain": src.domain, "builder": "judge_sft", "init": policy, "config_file": args.config or args.env,
                 "overrides": list(args.overrides), "suggestion": suggestion, "judge_max_new_tokens": judge_tokens,
                 "check_line": _check_line(policy),
                 "args": {k: getattr(args, k) for k in ("seed", "rounds", "replays", "accept_per_objection", "min_share",
                                                          "epochs", "lr", "tokens_per_batch", "quick")}}
  with open(os.path.join(args.policy_dir, "build.json"), "w") as f:
    json.dump(record_json, f, indent=1)
    f.write("\n")
  by_role = {role: {"recorded": sum(st.role == role for st in steps),
                    "objected": sum(st.role == role and judge_sft.verdict(st) for st in steps),
                    "trained": sum(st.role == role for st in chosen)} for role in judge_sft.ROLES}
  return {"build": record_json, "record_s": record_s, "questions": by_role, "new_tokens": kept,
          "tokenizer_size": len(new_tok), "too_long": too_long, "answer_tokens_max": answer_len, "data": data,
          "sft": {"steps": result.steps, "wall_s": result.wall_s, "losses": result.losses,
                  "config": dataclasses.asdict(scfg)}}


def _check_line(policy: str) -> Any:
  path = os.path.join(policy, "build.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f).get("check_line")


def measure(args: argparse.Namespace, s: dict[str, Any], policy_dir: str, judge_tokens: int,
            base: str | None = None) -> dict[str, Any]:
  """The agreement of ``policy_dir`` as a judge on test-split steps, and the agent's p@1 on the
  validation tasks (and ``base``'s, for comparison)."""
  from rti_jax.generation.base import SamplingParams
  from rti_jax.intervention.judges import JudgeLLM
  from rti_jax.policy import judge_sft

  cfg, src = s["cfg"], s["source"]
  model, tok, fmt = load_policy(policy_dir, src.tool_schemas)
  backend = backend_for(model, tok, cfg)
  t0 = time.time()
  steps = record(s, s["test"], backend, fmt, seed=1000 * args.seed + 999)
  llm = JudgeLLM(backend, judge_sft.judge_formatter(fmt), SamplingParams(max_new_tokens=judge_tokens, temperature=0.0),
                 s["judge_context"])
  texts: list[str | None] = []
  batch = 16
  for i in range(0, len(steps), batch):
    texts += llm.ask([st.prompt() for st in steps[i:i + batch]], seed=i)
  agree = judge_sft.agreement(steps, texts)
  judge_s = time.time() - t0
  _log(f"measured {len(steps)} test questions in {judge_s:.0f}s")
  samples = 2 if args.quick else 4
  out = {"policy": policy_dir, "judge_max_new_tokens": judge_tokens, "test_tasks": len(s["test"]),
         "agreement": agree, "measure_s": judge_s,
         "val_p1": pass_rate(s, backend, fmt, s["val"], samples, seed=args.seed + 3),
         "examples": [{"role": st.role, "truth": judge_sft.answer(st), "answer": t}
                      for st, t in list(zip(steps, texts))[:: max(1, len(steps) // 6)][:6]]}
  if base:
    bmodel, btok, bfmt = load_policy(base, src.tool_schemas)
    out["base_val_p1"] = pass_rate(s, backend_for(bmodel, btok, cfg), bfmt, s["val"], samples, seed=args.seed + 3)
  return out


def _pct(x: Any) -> str:
  return "-" if not isinstance(x, (int, float)) or math.isnan(x) else f"{100 * x:.1f}"


def table(m: dict[str, Any]) -> str:
  """The agreement as a markdown table: one row per role and per error type / reason."""
  a = m["agreement"]
  lines = ["| role | what the oracle says | cases | judge says so | precision | recall |", "|---|---|---|---|---|---|"]
  for role, key, sub in (("validator", "invalid", "by_type"), ("verifier", "reject", "by_reason")):
    r = a[role]
    lines.append(f"| {role} | {key} | {r[key]['positives']} | {r[key]['predicted']} | {_pct(r[key]['precision'])} | "
                 f"{_pct(r[key]['recall'])} |")
    for k, v in r[sub].items():
      lines.append(f"| | {k} | {v['positives']} | {v['predicted']} | {_pct(v['precision'])} | {_pct(v['recall'])} |")
  lines.append("")
  lines.append("| role | questions | over context | malformed | malformed rate | accuracy |")
  lines.append("|---|---|---|---|---|---|")
  for role in ("validator", "verifier"):
    r = a[role]
    lines.append(f"| {role} | {r['questions']} | {r['over_context']} | {r['malformed']} | {_pct(r['malformed_rate'])} | "
                 f"{_pct(r['accuracy'])} |")
  lines.append("")
  lines.append(f"agent p@1 on the validation tasks: {_pct(m.get('val_p1'))}"
               + (f" (before: {_pct(m['base_val_p1'])})" if "base_val_p1" in m else ""))
  return "\n".join(lines)


def write_card(args: argparse.Namespace, m: dict[str, Any], path: str) -> None:
  """The built policy's card: what it is, its data, how to rebuild and use it, what was measured."""
  b, q, me = m["build"], m["questions"], m["measure"]
  name = os.path.basename(os.path.normpath(args.policy_dir))
  budget = b["judge_max_new_tokens"]
  kinds = ", ".join(f"{k} {v}" for k, v in m["data"]["kinds"].items() if v)
  flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in b["args"].items() if k not in ("quick",))
  replays = b["args"].get("replays", 1)  # builds before --replays had one
  text = f"""# {name}: {b['init']} as its own Validator and Verifier

`{b['init']}` taught to answer the {b['domain']} Validator and Verifier prompts (the judges' chat: one
user turn, no tools) with the verdicts of the environment's rule oracles, so that it can judge its
own steps (self-intervention, `intervention.validator=llm intervention.verifier=llm`). The agent
is unchanged in format and tokenization: {len(m['new_tokens'])} pre-tokens the judges' prompts repeat
became whole tokens ({m['tokenizer_size']} in all) only where the policy's own text encodes as before.

## Use

    python experiments/run.py --exp={b['domain']} policy.path={args.policy_dir} intervention.validator=llm intervention.verifier=llm intervention.judge_max_new_tokens={budget}

## Training data

The questions of one intervened rollout per task of `{b['init']}` itself (rule roles deciding, the
policy as Corrector), {b['args']['rounds']} rounds over the {m['splits']['train']} train-split tasks outside the
validation split: Validator {q['validator']['recorded']} questions ({q['validator']['objected']} flagged),
Verifier {q['verifier']['recorded']} ({q['verifier']['objected']} rejected). Every objection and as many others
at random were trained, plus {replays} episode{"s" * (replays > 1)} per task sampled from the policy at T = 1
(`replay`, which holds the agent where it was): {kinds}; {m['sft']['steps']} SFT steps. The Validator's
`suggest_next` is the oracle's {b['suggestion']} suggestion. The longest answer is
{m['answer_tokens_max']} tokens; the judges' budget is {budget}.

## Rebuilding

    python experiments/run.py --exp=judge_sft --env {b['domain']} --policy {b['init']} {flags} --policy-dir {args.policy_dir}

## Agreement with the rule oracles (test split, {me['test_tasks']} tasks, one intervened rollout each)

{table(me)}
"""
  with open(path, "w") as f:
    f.write(text)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  if args.quick:
    args.rounds, args.epochs = 1, 0.2
  s = setting(args)
  os.makedirs(args.out, exist_ok=True)
  t0 = time.time()
  metrics: dict[str, Any] = {"env": args.env, "splits": {k: len(s[k]) for k in ("train", "val", "test")}}
  if args.eval_only:
    policy = args.policy or s["cfg"].policy.path
    metrics["measure"] = measure(args, s, policy, args.judge_tokens or 256)
  else:
    metrics.update(build(args, s))
    _save(args, metrics, t0)
    metrics["measure"] = measure(args, s, args.policy_dir, metrics["build"]["judge_max_new_tokens"],
                                 base=args.policy or s["cfg"].policy.path)
  _save(args, metrics, t0)
  if not args.eval_only:
    write_card(args, metrics, os.path.join(args.policy_dir, "README.md"))
  text = table(metrics["measure"])
  with open(os.path.join(args.out, "table.md"), "w") as f:
    f.write(text + "\n")
  print(text)
  return 0


def _save(args: argparse.Namespace, metrics: dict[str, Any], t0: float) -> None:
  metrics["wall_s"] = time.time() - t0
  with open(os.path.join(args.out, "metrics.json"), "w") as f:
    json.dump(metrics, f, indent=1, default=str)


if __name__ == "__main__":
  raise SystemExit(main())
