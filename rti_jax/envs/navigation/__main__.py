"""CLI: regenerate the Navigation tasks, print their statistics, dump agent transcripts.

    python -m rti_jax.envs.navigation stats [--config tiny|paper|both] [--hidden-city-share 0.3]
    python -m rti_jax.envs.navigation generate --config tiny --out data/navigation
    python -m rti_jax.envs.navigation sft --config tiny --agent oracle --split train --out sft.jsonl
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from rti_jax.envs.navigation import Benchmark, NavigationEnv, load_benchmark, vocabulary
from rti_jax.envs.navigation.agents import NaiveAgent, OracleAgent, run_episode, sft_example
from rti_jax.envs.navigation.tasks import save_tasks
from rti_jax.envs.navigation.vocab import tokenize_words

AGENTS = {"oracle": OracleAgent, "naive": NaiveAgent}


def _bench(args: argparse.Namespace, name: str) -> Benchmark:
  overrides = {k: v for k, v in (("seed", args.seed), ("num_train", args.num_train), ("num_test", args.num_test),
                                 ("min_stops", args.min_stops), ("max_stops", args.max_stops),
                                 ("hidden_city_share", args.hidden_city_share)) if v is not None}
  return load_benchmark(name, **overrides)


def split_stats(bench: Benchmark) -> dict[str, dict[str, object]]:
  """Table-4-style statistics and both reference agents' pass rates, per split."""
  env = NavigationEnv(bench.world)
  out: dict[str, dict[str, object]] = {}
  for split, tasks in (("train", bench.train), ("test", bench.test)):
    stops = [len(t.stops) for t in tasks]
    oracle = [run_episode(env, OracleAgent(t), t) for t in tasks]
    naive = [run_episode(env, NaiveAgent(t), t).reward for t in tasks]
    tokens = [sum(len(tokenize_words(m["content"])) for m in tr.messages[1:]) for tr in oracle]
    levels = collections.Counter(t.order_level for t in tasks)
    out[split] = {
        "tasks": len(tasks),
        "stops min/mean/max": f"{min(stops)}/{statistics.mean(stops):.2f}/{max(stops)}",
        "waypoints mean": f"{statistics.mean(stops) - 2:.2f}",
        **{f"order level {k}": f"{levels[k]} ({100 * levels[k] / len(tasks):.1f}%)" for k in range(5)},
        "need disambiguation": f"{100 * sum(t.needs_disambiguation for t in tasks) / len(tasks):.1f}%",
        "with a city hint": f"{100 * sum(any(s.hinted for s in t.stops) for t in tasks) / len(tasks):.1f}%",
        **({"hidden city (ask the user)": f"{sum(t.hidden_city for t in tasks)}"}
           if bench.config.hidden_city_share > 0 else {}),
        "query words mean": f"{statistics.mean(len(t.query.split()) for t in tasks):.1f}",
        "oracle turns mean": f"{statistics.mean(tr.num_turns for tr in oracle):.2f}",
        "oracle episode tokens mean/max (no system)": f"{statistics.mean(tokens):.0f}/{max(tokens)}",
        "oracle pass rate": f"{100 * statistics.mean(tr.reward for tr in oracle):.1f}%",
        "naive pass rate": f"{100 * statistics.mean(naive):.1f}%",
    }
  return out


def cmd_stats(args: argparse.Namespace) -> None:
  names = ["tiny", "paper"] if args.config == "both" else [args.config]
  for name in names:
    bench = _bench(args, name)
    cfg, world = bench.config, bench.world
    shared = sum(world.is_ambiguous(n) for n in world.names)
    system_tokens = len(tokenize_words(NavigationEnv(world).reset(bench.test[0])[0]["content"]))
    print(f"== Navigation, config {cfg.name} (seed {cfg.seed}): {len(world.cities)} cities, {len(world.pois)} POIs, "
          f"{shared} names in several cities, stops {cfg.min_stops}-{cfg.max_stops}, {cfg.decimals} decimals, "
          f"{cfg.max_results} candidates per search, {cfg.max_turns} turns")
    print(f"   vocabulary {len(vocabulary())} tokens; system prompt {system_tokens} tokens")
    stats = split_stats(bench)
    print(f"   {'Statistic':<44}{'Train':>16}{'Test':>16}")
    for key in stats["train"]:
      print(f"   {key:<44}{str(stats['train'][key]):>16}{str(stats['test'][key]):>16}")
    rej = ", ".join(f"{k} {v}" for k, v in sorted(bench.report.rejected.items()))
    print(f"   construction: {bench.report.drawn} drawn, {bench.report.kept} kept; rejected: {rej}\n")


def cmd_generate(args: argparse.Namespace) -> None:
  bench = _bench(args, args.config)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  save_tasks(bench.train, out / "train.jsonl")
  save_tasks(bench.test, out / "test.jsonl")
  config = dataclasses.asdict(bench.config)
  if not config["hidden_city_share"]:  # the file of a setting without hidden-city tasks stays as it was
    del config["hidden_city_share"]
  (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
  print(f"wrote {len(bench.train)} train and {len(bench.test)} test tasks of config {bench.config.name} to {out}")


def cmd_sft(args: argparse.Namespace) -> None:
  bench = _bench(args, args.config)
  env = NavigationEnv(bench.world)
  tasks = bench.train if args.split == "train" else bench.test
  with open(args.out, "w", encoding="utf-8") as f:
    for t in tasks:
      f.write(sft_example(run_episode(env, AGENTS[args.agent](t), t)) + "\n")
  print(f"wrote {len(tasks)} {args.agent} transcripts of {args.split} ({bench.config.name}) to {args.out}")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m rti_jax.envs.navigation", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)
  for name in ("stats", "generate", "sft"):
    p = sub.add_parser(name)
    p.add_argument("--config", default="both" if name == "stats" else "tiny",
                   choices=["tiny", "paper", "both"] if name == "stats" else ["tiny", "paper"])
    p.add_argument("--seed", type=int)
    p.add_argument("--num-train", type=int)
    p.add_argument("--num-test", type=int)
    p.add_argument("--min-stops", type=int)
    p.add_argument("--max-stops", type=int)
    p.add_argument("--hidden-city-share", type=float, help="share of hidden-city tasks per split (docs/navigation.md)")
    if name == "generate":
      p.add_argument("--out", required=True)
    if name == "sft":
      p.add_argument("--agent", default="oracle", choices=sorted(AGENTS))
      p.add_argument("--split", default="train", choices=["train", "test"])
      p.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  try:
    {"stats": cmd_stats, "generate": cmd_generate, "sft": cmd_sft}[args.command](args)
  except (ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
