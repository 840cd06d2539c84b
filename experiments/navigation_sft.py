"""Builds the tiny base policy for Navigation by SFT on scripted train-split trajectories.

``python experiments/run.py --exp=navigation_sft`` trains the tokenizer and a tiny Qwen3
from a seed, writes the HF checkpoint (``policies/navigation_tiny`` by default; transformers
and ``models.from_pretrained`` load it), then reloads it and measures its behaviour with the
real sampler on train and test tasks: pass rates on tasks with and without the need to
disambiguate, pass@k and all-fail groups, and self-intervention with the rule-based
Validator (does the policy follow the feedback; PPL_roll of its corrections, Eq. 3-4).
The run dir gets ``metrics.json``, ``loss.png`` and ``sft_data.json`` (the mix).
``--quick`` is a seconds-long smoke run for tests (tiny model, few tasks).

The default policy (``policies/navigation_base``, build 11) is four such builds, each
continuing the previous one; ``--chain DIR`` runs all four (``CHAIN``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "experiments"):
  if str(_path) not in sys.path:
    sys.path.insert(0, str(_path))

DEFAULT_POLICY_DIR = ROOT / "policies" / "navigation_tiny"

#: The stages that build the default policy (build 11) from scratch: build 7, then builds 9, 10 and
#: 11, each continuing the previous one (``--chain DIR``; docs/tiny_policy.md). ``{prev}`` is the
#: previous stage's policy dir. The shipped dirs: policies/navigation_tiny, _b9, _b10, _b11.
CHAIN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("b7", ()),
    ("b9", ("--init", "{prev}", "--check-line", "1", "--epochs", "1", "--warmup-epochs", "0", "--lr", "1e-3")),
    ("b10", ("--init", "{prev}", "--check-line", "1", "--complete-share", "1.0", "--epochs", "1",
             "--warmup-epochs", "0", "--lr", "1e-3")),
    ("b11", ("--init", "{prev}", "--check-line", "1", "--complete-share", "1.0", "--resolve-share", "0",
             "--epochs", "1", "--warmup-epochs", "0", "--lr", "1e-3")),
)


def chain_argv(chain_dir: str, extra: list[str]) -> list[list[str]]:
  """Per ``CHAIN`` stage, the argv of one build: the stage's options, then ``extra`` (later options
  win, so ``--quick --epochs 0.2`` shrink every stage), then its run dir ``DIR/<stage>`` and policy
  dir ``DIR/<stage>/policy``."""
  out, prev = [], None
  for name, opts in CHAIN:
    run = os.path.join(chain_dir, name)
    out.append([o.format(prev=prev) for o in opts] + list(extra) + ["--out", run, "--policy-dir", os.path.join(run, "policy")])
    prev = os.path.join(run, "policy")
  return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="navigation_sft", description=__doc__.split("\n")[0])
  p.add_argument("--out", default=str(ROOT / "runs" / "navigation_sft"), help="run dir (metrics, plot)")
  p.add_argument("--policy-dir", default=None, help="checkpoint dir (default: policies/navigation_tiny; "
                 "with --quick: <out>/policy)")
  p.add_argument("--quick", action="store_true", help="smoke run: tiny model, few tasks, short training")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--epochs", type=float, default=None)
  p.add_argument("--hidden", type=int, default=None)
  p.add_argument("--layers", type=int, default=None)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--head-dim", type=int, default=32)
  p.add_argument("--qk-norm-init", type=float, default=1.4,
                 help="initial q/k RMSNorm weight (2.0 locks heads onto format tokens: names are not read)")
  p.add_argument("--name-type-init", type=float, default=8.0,
                 help="norm of the shared 'place name' direction added to every whole-name token's embedding "
                      "(sft.add_type_direction; 0 = off)")
  p.add_argument("--name-swap", type=int, default=1000,
                 help="first-turn drills with swapped stop names (sft_swap.name_swap_examples) in the main mix")
  p.add_argument("--name-drill-steps", type=int, default=4000,
                 help="stage 0: at most this many steps on first-turn drills alone (without the system turn; 0 = skip)")
  p.add_argument("--swap-episodes", type=int, default=2000,
                 help="whole oracle episodes of plain tasks made by swapping a train task's stops for other places "
                      "(sft_swap.swap_episode_examples) in the main mix; 0 = none (builds 1-4), 1000 in build 5")
  p.add_argument("--swap-disamb", type=int, default=800,
                 help="new tasks needing a re-search, made by the same stop swap, each giving a re-search-in-context "
                      "episode, and by chance a trusting episode and a correction example "
                      "(sft_swap.swap_disamb_examples); 0 = none (builds 1-6)")
  p.add_argument("--name-drill-examples", type=int, default=8000,
                 help="distinct stage-0 drills (0 = 16 per step, as builds 1-3; on the drill bench 8000 were read "
                      "at 97%% and 32000 at 54%%, docs/tiny_policy.md)")
  p.add_argument("--name-drill-target", type=float, default=0.9,
                 help="stage 0 ends early once this share of the search names of held-out drills is read right "
                      "(checked every 200 steps on --reading-checks drills of the --holdout tasks; > 1 = never)")
  p.add_argument("--embed-std", type=float, default=1.0,
                 help="init std of the tied embeddings (0.02 is the usual; see sft.scale_embeddings)")
  p.add_argument("--final-norm-init", type=float, default=0.03, help="initial final RMSNorm weight")
  p.add_argument("--vocab", type=int, default=4096, help="tokenizer size")
  p.add_argument("--pattern", choices=("names", "words"), default="names",
                 help="pre-tokenizer: whole names and coordinates (tokenizer.NAME_PATTERN) or words and numbers")
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--copy-examples", type=int, default=None, help="synthetic copy sequences of stage 0 (default 0; 8000 installs copy heads on "
                 "the toy task but they did not carry over to Navigation in a trial)")
  p.add_argument("--warmup-epochs", type=float, default=None,
                 help="epochs of the short-context stage (examples without the system turn) before the full one")
  p.add_argument("--tokens-per-batch", type=int, default=4096)
  p.add_argument("--resolve-share", type=float, default=0.06,
                 help="share of disambiguation tasks whose decisive re-search is trained")
  p.add_argument("--complete-share", type=float, default=0.0,
                 help="share of disambiguation tasks whose re-search turn is trained except its decision token "
                      "(sft_data kind resolve_tail; 0 = none, as builds 1-9)")
  p.add_argument("--holdout", type=int, default=40,
                 help="last train-split tasks kept out of SFT, for diagnostics such as experiments/name_copy_check.py")
  p.add_argument("--reading-checks", type=int, default=30,
                 help="held-out first turns / episodes for the teacher-forced reading checks after each stage "
                      "(experiments/name_copy_check.py; 0 = skip)")
  p.add_argument("--check-line", type=int, choices=(0, 1), default=0,
                 help="1: every scripted turn after the first search results starts with the check line "
                      "(agents.check_line; builds 8 and 9, policies/navigation_tiny_b9); 0: builds 1-7 (the default policy)")
  p.add_argument("--check-drills", type=int, default=3000,
                 help="check-line drills in the main mix (sft_swap.check_drill_examples; only with --check-line 1)")
  p.add_argument("--init", default=None,
                 help="continue from this policy dir (its tokenizer and weights) instead of a fresh model: no "
                      "tokenizer build, no model init, no stage 0 (build 9 = build 7 + this stage, docs/tiny_policy.md)")
  p.add_argument("--eval-tasks", type=int, default=None, help="tasks per kind (disambiguation / plain) per split")
  p.add_argument("--eval-samples", type=int, default=8, help="samples per task at temperature 1")
  p.add_argument("--no-eval", action="store_true")
  p.add_argument("--chain", metavar="DIR", default=None,
                 help="build the default policy from scratch: the CHAIN stages (build 7, 9, 10, 11) into DIR/b7 .. "
                      "DIR/b11, each from the previous; other options apply to every stage (about 2.5 h on 2 cores)")
  p.add_argument("--eval-only", action="store_true",
                 help="only evaluate the built policy (its <out>/metrics.json must exist) and rewrite its card")
  args = p.parse_args(argv)
  if args.quick:
    args.epochs = 1.0 if args.epochs is None else args.epochs
    args.hidden = args.hidden or 32
    args.layers = args.layers or 2
    args.head_dim = 16
    args.name_drill_steps = min(args.name_drill_steps, 5)
    args.name_drill_examples = min(args.name_drill_examples, 80)
    args.eval_tasks = 2 if args.eval_tasks is None else args.eval_tasks
    args.eval_samples = min(args.eval_samples, 2)
  args.epochs = 2.0 if args.epochs is None else args.epochs
  args.warmup_epochs = (0.0 if args.quick else 3.0) if args.warmup_epochs is None else args.warmup_epochs
  args.copy_examples = 0 if args.copy_examples is None else args.copy_examples
  args.hidden = args.hidden or 128
  args.layers = args.layers or 3
  args.eval_tasks = 16 if args.eval_tasks is None else args.eval_tasks
  if args.policy_dir is None:
    args.policy_dir = os.path.join(args.out, "policy") if args.quick else str(DEFAULT_POLICY_DIR)
  return args


def split_train(train: list[Any], holdout: int) -> tuple[list[Any], list[Any]]:
  """``sft_data.split_train``, with a bad ``--holdout`` as a command-line error."""
  from rti_jax.policy import sft_data

  try:
    return sft_data.split_train(train, holdout)
  except ValueError as e:
    raise SystemExit(f"--holdout: {e}") from None


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


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--chain" in argv:  # the whole recipe of the default policy, stage by stage
    i = argv.index("--chain")
    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
      raise SystemExit("--chain needs a directory (the stages go to DIR/b7 ... DIR/b11)")
    extra = argv[:i] + argv[i + 2:]
    if any(o in extra for o in ("--init", "--out", "--policy-dir")):
      raise SystemExit("--chain sets --init, --out and --policy-dir of every stage itself")
    for stage_argv in chain_argv(argv[i + 1], extra):
      print("chain stage: navigation_sft " + " ".join(stage_argv), flush=True)
      if main(stage_argv) != 0:
        return 1
    return 0
  args = parse_args(argv)
  import numpy as np
  from flax import nnx

  from models.qwen import Qwen
  from models.weights import save_pretrained
  from rti_jax.envs import navigation as nav
  from rti_jax.policy import sft, sft_data, sft_swap
  from rti_jax.policy.tokenizer import END_OF_TURN, NAME_PATTERN, PAD_TOKEN, PRE_TOKENIZER_PATTERN, build_tokenizer
  from rti_jax.rollout import ChatFormatter

  t_start = time.time()
  os.makedirs(args.out, exist_ok=True)
  log = lambda s: print(s, flush=True)  # noqa: E731
  bench = nav.load_benchmark("tiny")
  if args.eval_only:
    path = os.path.join(args.out, "metrics.json")
    if not os.path.exists(path):
      raise SystemExit(f"--eval-only: {path} not found; build the policy first (without --eval-only)")
    with open(path) as f:
      metrics = json.load(f)
    metrics["eval"] = evaluate_policy(args, bench, log)
    save_metrics(args, metrics, metrics.get("wall_s", 0.0) + time.time() - t_start, log)
    return 0
  env = nav.NavigationEnv(bench.world)
  train_tasks, held = split_train(bench.train, args.holdout)
  if args.quick:
    train_tasks = train_tasks[:16]
  checks = args.reading_checks > 0 and bool(held) and not args.quick

  check = bool(args.check_line)
  if args.init:
    from transformers import AutoTokenizer

    from models.weights import from_pretrained

    if not os.path.isdir(args.init):
      raise SystemExit(f"--init: {args.init} is not a directory (a policy dir with config.json and tokenizer files)")
    tok = AutoTokenizer.from_pretrained(args.init, local_files_only=True)
  else:
    # Tokenizer: trained on train-split transcripts plus every benchmark token.
    tok = build_tokenizer(sft_data.corpus_texts(train_tasks, env, check=check) + list(nav.vocabulary()), args.vocab,
                          pattern=NAME_PATTERN if args.pattern == "names" else PRE_TOKENIZER_PATTERN)
  fmt = ChatFormatter(tok)
  mix = sft_data.MixConfig(resolve_share=args.resolve_share, seed=args.seed, check=check,
                           complete_share=args.complete_share)
  examples = sft_data.build_examples(train_tasks, env, fmt, mix)
  examples += sft_swap.name_swap_examples(train_tasks, env, fmt, args.name_swap // (20 if args.quick else 1),
                                          seed=args.seed + 7)
  # The stop sets of every benchmark task (test split included) are excluded from the generated
  # tasks, so none repeats a benchmark task; nothing else of the test split is read.
  taken = frozenset(frozenset(s.poi_id for s in t.stops) for t in bench.train + bench.test)
  examples += sft_swap.swap_episode_examples(train_tasks, env, fmt, args.swap_episodes // (20 if args.quick else 1),
                                             seed=args.seed + 11, exclude=taken, check=check)
  examples += sft_swap.swap_disamb_examples(train_tasks, env, fmt, args.swap_disamb // (20 if args.quick else 1),
                                            seed=args.seed + 13, exclude=taken, check=check)
  if check:
    examples += sft_swap.check_drill_examples(train_tasks, env, fmt, args.check_drills // (20 if args.quick else 1),
                                              seed=args.seed + 17, exclude=taken)
  data_summary = sft_data.summary(examples)
  log(f"tokenizer: {len(tok)} tokens; SFT data: {json.dumps(data_summary)}")

  pad_id, eos_id = tok.convert_tokens_to_ids(PAD_TOKEN), tok.convert_tokens_to_ids(END_OF_TURN)
  if args.init:
    model, mcfg = from_pretrained(args.init)
  else:
    mcfg = sft.tiny_qwen3_config(len(tok), hidden_size=args.hidden, num_layers=args.layers,
                                 num_heads=args.heads, num_kv_heads=1, head_dim=args.head_dim,
                                 intermediate_size=2 * args.hidden, pad_token_id=pad_id, eos_token_id=eos_id)
    model = Qwen(mcfg, rngs=nnx.Rngs(args.seed))
    sft.sharpen_qk_norm(model, args.qk_norm_init)
    sft.scale_embeddings(model, args.embed_std, args.final_norm_init, seed=args.seed + 1)
    sft.add_type_direction(model, sft_data.place_name_token_ids(tok, env), args.name_type_init, seed=args.seed + 8)
  n_params = sft.count_params(model)
  log(f"model: qwen3 hidden {mcfg.hidden_size}, {mcfg.num_layers} layers, vocab {mcfg.vocab_size}, {n_params} params"
      + (f" (from {args.init})" if args.init else ""))
  if args.name_drill_steps > 0 and not args.init:
    # Stage 0: reading stop names out of requests, on first-turn drills alone (short sequences).
    drills = [sft_data.without_system_turn(fmt, e)
              for e in sft_swap.name_swap_examples(train_tasks, env, fmt, args.name_drill_examples or 16 * args.name_drill_steps,
                                                   seed=args.seed + 9)]
    dcfg = sft.SFTConfig(lr=args.lr, tokens_per_batch=2048, max_len=1024, len_multiple=32, seed=args.seed + 2)
    per_epoch = len(sft.make_batches(drills, dcfg, np.random.default_rng(0), pad_id, sft.common_prefix_len(drills)))
    dcfg = dataclasses.replace(dcfg, epochs=args.name_drill_steps / per_epoch)
    curve: list[tuple[int, float]] = []

    def names_read(step: int) -> bool:
      import name_copy_check

      m = name_copy_check.measure_model(model, tok, fmt, args.reading_checks, swapped=True, tasks=held, system_turn=False)
      curve.append((step, m["search names"]["copied"]))
      log(f"names: step {step}, held-out drills read right {curve[-1][1]:.2f}")
      return curve[-1][1] >= args.name_drill_target

    dres = sft.train(model, drills, dcfg, pad_id, log=lambda s: log("names " + s), log_every=100,
                     stop=names_read if checks else None, check_every=200)
    log(f"name drills: {dres.steps} steps in {dres.wall_s:.0f}s, final loss {np.mean(dres.losses[-10:]):.4f}")
    name_stage = {"steps": dres.steps, "wall_s": dres.wall_s, "examples": len(drills),
                  "final_loss": float(np.mean(dres.losses[-10:])), "held_out_read": curve}
    if checks:
      name_stage["reading"] = reading_check(model, tok, fmt, args.reading_checks, held, swapped_only=True)
      log(f"reading after the name drills: {json.dumps(name_stage['reading'])}")
  if args.copy_examples > 0:
    # Stage 0: synthetic copying over the tokenizer's word and number tokens.
    pool = [i for t, i in tok.get_vocab().items() if t.isalnum() or t.replace(".", "").isdigit()]
    copy = sft.copy_task_examples(pool, args.copy_examples, seed=args.seed)
    ccfg = sft.SFTConfig(epochs=1.0, lr=args.lr, tokens_per_batch=768, max_len=64, len_multiple=32, seed=args.seed)
    cres = sft.train(model, copy, ccfg, pad_id, log=lambda s: log("copy " + s), log_every=50)
    log(f"copy stage: {cres.steps} steps in {cres.wall_s:.0f}s, final loss {np.mean(cres.losses[-10:]):.4f}")
  if args.warmup_epochs > 0:
    # Stage 1: the same examples without the (constant, untrained) system turn.
    short = [sft_data.without_system_turn(fmt, e) for e in examples]
    wcfg = sft.SFTConfig(epochs=args.warmup_epochs, lr=args.lr, tokens_per_batch=args.tokens_per_batch // 2,
                         seed=args.seed + 1)
    warm = sft.train(model, short, wcfg, pad_id, log=lambda s: log("warm-up " + s))
    log(f"warm-up: {warm.steps} steps in {warm.wall_s:.0f}s, final loss {np.mean(warm.losses[-10:]):.4f}")
  scfg = sft.SFTConfig(epochs=args.epochs, lr=args.lr, tokens_per_batch=args.tokens_per_batch, seed=args.seed)
  result = sft.train(model, examples, scfg, pad_id, log=log)
  if args.warmup_epochs > 0:
    result = sft.SFTResult(losses=warm.losses + result.losses, steps=warm.steps + result.steps,
                           wall_s=warm.wall_s + result.wall_s, tokens_trained=warm.tokens_trained + result.tokens_trained)
  log(f"SFT: {result.steps} steps in {result.wall_s:.0f}s, final loss {np.mean(result.losses[-10:]):.4f}")
  reading = reading_check(model, tok, fmt, args.reading_checks, held) if checks else None
  if reading:
    log(f"reading after SFT: {json.dumps(reading)}")
  decision = decision_check(model, fmt, held, env, pad_id, check) if held and not args.quick else None
  if decision:
    log(f"decision after SFT (teacher-forced, held-out tasks): {json.dumps(decision)}")

  os.makedirs(args.policy_dir, exist_ok=True)
  save_pretrained(model, mcfg, args.policy_dir)
  tok.save_pretrained(args.policy_dir)
  if args.init:  # loading with local_files_only leaves these in the saved config; they are not the tokenizer's
    tc = os.path.join(args.policy_dir, "tokenizer_config.json")
    with open(tc) as f:
      tconf = json.load(f)
    for key in ("is_local", "local_files_only"):
      tconf.pop(key, None)
    with open(tc, "w") as f:
      json.dump(tconf, f, indent=2, ensure_ascii=False)
      f.write("\n")
  build = {"check_line": check, "init": args.init, "argv": list(argv) if argv is not None else sys.argv[1:]}
  with open(os.path.join(args.policy_dir, "build.json"), "w") as f:  # what the policy's format expects
    json.dump(build, f, indent=1)
  plot_loss(result.losses, os.path.join(args.out, "loss.png"))
  metrics: dict[str, Any] = {
    "name_drills": name_stage if args.name_drill_steps > 0 and not args.init else None,
    **build,
    "seed": args.seed, "quick": args.quick, "policy_dir": os.path.relpath(args.policy_dir, ROOT),
    "sft_tasks": len(train_tasks), "holdout_tasks": [t.task_id for t in held],
    "tokenizer_size": len(tok), "model": mcfg.to_hf_dict(), "params": n_params,
    "sft": {"steps": result.steps, "wall_s": result.wall_s, "losses": result.losses,
            "tokens_trained": result.tokens_trained, "config": vars(scfg) if hasattr(scfg, "__dict__") else str(scfg)},
    "data": data_summary, "mix": vars(mix) if hasattr(mix, "__dict__") else str(mix),
    "reading": reading, "decision": decision,
  }

  # Saved before the evaluation, so a failed evaluation loses nothing (--eval-only reruns it).
  save_metrics(args, metrics, time.time() - t_start, log)
  if not args.no_eval:
    metrics["eval"] = evaluate_policy(args, bench, log)
    save_metrics(args, metrics, time.time() - t_start, log)
  return 0


def reading_check(model: Any, tok: Any, fmt: Any, n: int, tasks: list[Any], swapped_only: bool = False) -> dict[str, Any]:
  """Teacher-forced argmax accuracy of search names (and coordinates) on held-out train tasks:
  ``n`` first turns with swapped stop names, and unless ``swapped_only`` ``n`` whole episodes
  (``experiments/name_copy_check.py``)."""
  import name_copy_check

  def brief(m: dict[str, Any]) -> dict[str, Any]:
    return {"search_names": m["search names"]["copied"], "a_request_name": m["search names"]["argmax is a request name"],
            "by_search": m["per search (copied)"], "names_after_results": m["names after results"]["copied"],
            "coordinates": m["coordinates"]["copied"]}

  out = {"swapped_first_turns": brief(name_copy_check.measure_model(model, tok, fmt, n, swapped=True, tasks=tasks))}
  if not swapped_only:
    out["episodes"] = brief(name_copy_check.measure_model(model, tok, fmt, n, tasks=tasks))
  return out


def decision_check(model: Any, fmt: Any, tasks: list[Any], env: Any, pad_id: int, check: bool) -> dict[str, float]:
  """The decision probe's figures (``experiments/decision_probe.py``) on held-out train tasks,
  teacher-forced: the check word and the decision after the first search results."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  import decision_probe
  from rti_jax import objectives

  probe = decision_probe.DecisionProbe(tasks, env, fmt, pad_id, check=check)
  logp = jax.jit(lambda ids, m: objectives.next_token_logprobs(model(ids, m), ids))(
    jnp.asarray(probe.ids), jnp.asarray(probe.mask))
  return probe.summarize(np.asarray(logp))


def save_metrics(args: argparse.Namespace, metrics: dict[str, Any], wall_s: float, log: Any) -> None:
  """Writes ``<out>/metrics.json`` and the policy's model card."""
  metrics["wall_s"] = wall_s
  with open(os.path.join(args.out, "metrics.json"), "w") as f:
    json.dump(metrics, f, indent=1, default=str)
  write_card(args, metrics, os.path.join(args.policy_dir, "README.md"))
  log(f"wrote {args.policy_dir}/README.md and {args.out}/metrics.json ({wall_s:.0f}s)")


def evaluate_policy(args: argparse.Namespace, bench: Any, log: Any) -> dict[str, Any]:
  """The behaviour figures of the policy in ``args.policy_dir`` per split (see ``table``)."""
  from rti_jax.generation.jax_backend import JaxBackend
  from rti_jax.policy import evaluate as ev
  from rti_jax.policy.tokenizer import PAD_TOKEN

  pmodel, ptok, pfmt = ev.load_policy(args.policy_dir)
  backend = JaxBackend(pmodel, max_cache_len=2048, pad_id=ptok.convert_tokens_to_ids(PAD_TOKEN))
  evals: dict[str, Any] = {}
  for split, tasks in (("train", bench.train), ("test", bench.test)):
    chosen = pick(tasks, args.eval_tasks)
    need = [t for t in chosen if t.needs_disambiguation]
    t0 = time.time()
    evals[split] = {
      "sampled": ev.rollout_behaviour(backend, pfmt, bench.world, chosen, args.eval_samples, 1.0, seed=args.seed),
      "greedy": ev.rollout_behaviour(backend, pfmt, bench.world, chosen, 1, 0.0, seed=args.seed),
      "intervention": ev.intervention_behaviour(backend, pfmt, bench.world, need, 1.0, seed=args.seed),
    }
    log(f"eval {split}: {time.time() - t0:.0f}s")
  log(table(evals, args.eval_samples))
  return evals


PATTERN_NOTES = {"names": "whole names and coordinates, a name takes the space after it when a number follows (NAME_PATTERN)",
                 "words": "words and numbers (PRE_TOKENIZER_PATTERN)"}


def write_card(args: argparse.Namespace, metrics: dict[str, Any], path: str) -> None:
  """A short model card next to the checkpoint: how it was built and what it does."""
  lines = [
    "# navigation_tiny: the embedded base policy for Navigation",
    "",
    "A tiny Qwen3 (transformers `Qwen3ForCausalLM`, loaded by `models.from_pretrained`) with a",
    "byte-level BPE tokenizer and a Qwen-style chat template, built by SFT on scripted",
    "train-split trajectories only. Rebuild it with:",
    "",
    "    python experiments/run.py --exp=navigation_sft " + " ".join(metrics.get("argv") or [f"--seed {args.seed}"]),
    "",
    f"Params: {metrics['params']}; tokenizer: {metrics['tokenizer_size']} tokens; "
    f"SFT: {metrics['sft']['steps']} steps, {metrics['sft']['wall_s']:.0f} s on the build machine's CPU.",
    f"SFT mix: {json.dumps(metrics['data']['kinds'])}.",
  ]
  held_note = (f"Searches in the order the request names the places; "
               f"{len(metrics.get('holdout_tasks') or [])} train tasks held out of SFT for diagnostics.")
  if metrics.get("init"):
    lines.append(f"Continued from the policy in `{metrics['init']}` (its tokenizer, weights and architecture; "
                 f"no tokenizer build, init or stage 0 here; see that policy's card). {held_note}")
  else:
    lines.append(
      f"Pre-tokenizer: {PATTERN_NOTES[args.pattern]}; "
      f"init: embeddings std {args.embed_std}, final norm {args.final_norm_init}, q/k norm {args.qk_norm_init}, "
      f"a shared place-name direction of norm {args.name_type_init}; {args.heads} heads x {args.head_dim}; "
      f"stage 0: {(metrics.get('name_drills') or {}).get('steps', args.name_drill_steps)} steps on "
      f"{(metrics.get('name_drills') or {}).get('examples', '?')} distinct first-turn name drills "
      f"(why: docs/tiny_policy.md). {held_note}")
  ep = (metrics.get("reading") or {}).get("episodes")
  if ep:
    by = " / ".join(f"{v:.0%}" for v in ep["by_search"].values())
    lines += ["", "Teacher-forced on held-out train episodes (argmax): coordinates copied "
              f"{ep['coordinates']:.0%}; search names right {ep['search_names']:.0%} (by search {by}), "
              f"one of the request's names {ep['a_request_name']:.0%}; names after the results {ep['names_after_results']:.0%}."]
  dec = metrics.get("decision")
  if dec and metrics.get("check_line"):
    lines += ["", "Check line (docs/tiny_policy.md), teacher-forced on the held-out train tasks: the off stop named "
              f"with probability {dec['p_check_odd']:.3f} after ambiguous results, `all` {dec['p_check_all_plain']:.3f} "
              f"after plain ones; after the line: re-search {dec['p_research']:.4f}, trust {dec['p_trust']:.3f}, "
              f"plan (plain) {dec['p_plan_plain']:.3f}."]
  if metrics.get("note"):
    lines += ["", f"Note: {metrics['note']}."]
  if "eval" in metrics:
    lines += ["", "Measured behaviour (real sampler; see the run's metrics.json):", "", "```",
              table(metrics["eval"], args.eval_samples), "```"]
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
