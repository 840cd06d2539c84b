"""``python -m rti_jax.envs list``: the registered environments; ``python -m rti_jax.envs stats --env
NAME [key=value ...]``: per split, the task count and the pass rate of the environment's reference
(gold) agent replayed through the environment itself, scored by its own reward.

The config is ``configs/<NAME>.yaml`` when there is one (else the schema's defaults), with
``env.name=NAME`` and any overrides (e.g. ``env.num_train=100``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

from rti_jax.config import CONFIG_DIR, load_config
from rti_jax.envs import registry
from rti_jax.envs.base import run_episode


def split_stats(source: Any, gold_agent: Any, tasks: Sequence[Any]) -> dict[str, Any]:
  """``{"tasks", "gold pass", "gold reward", "s/episode", "gold failures"}`` of one split."""
  if gold_agent is None:
    return {"tasks": len(tasks), "gold pass": None, "gold reward": None, "s/episode": None, "gold failures": []}
  env, rewards, failed = source.env_factory(), [], []
  t0 = time.perf_counter()
  for task in tasks:
    reward = run_episode(env, gold_agent(task), task).reward
    rewards.append(reward)
    if reward < source.success_threshold:
      failed.append(source.task_id(task))
  n = max(1, len(tasks))
  return {"tasks": len(tasks), "gold pass": (len(tasks) - len(failed)) / n, "gold reward": sum(rewards) / n,
          "s/episode": (time.perf_counter() - t0) / n, "gold failures": failed}


def compute_stats(name: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
  spec = registry.get(name)
  config = name if (CONFIG_DIR / f"{name}.yaml").exists() else None
  cfg = load_config(config, [f"env.name={name}", "policy.path=unused", *spec.stats_overrides, *overrides])
  source = registry.task_source(cfg)
  return {"env": name, "splits": {split: split_stats(source, spec.gold_agent, getattr(source, split))
                                  for split in ("train", "test")}}


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m rti_jax.envs", description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  sub.add_parser("list", help="the registered environments")
  st = sub.add_parser("stats", help="tasks and gold pass per split")
  st.add_argument("--env", required=True)
  st.add_argument("--json", action="store_true", help="print the stats as JSON")
  st.add_argument("overrides", nargs="*", help="config overrides key=value")
  args = p.parse_args(argv)
  if args.cmd == "list":
    print(f"{'name':<12} {'user side':<24} description")
    for spec in registry.specs():
      print(f"{spec.name:<12} {spec.user_side:<24} {spec.description}")
    return 0
  try:
    stats = compute_stats(args.env, args.overrides)
  except ValueError as e:
    print(f"stats: {e}", file=sys.stderr)
    return 2
  if args.json:
    print(json.dumps(stats, indent=1))
    return 0
  print(f"{args.env}: the reference agent replayed through the environment")
  print(f"{'split':<8} {'tasks':>6} {'gold pass':>10} {'gold reward':>12} {'s/episode':>10}")
  for split, s in stats["splits"].items():
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    print(f"{split:<8} {s['tasks']:>6} {fmt(s['gold pass'], '.3f'):>10} {fmt(s['gold reward'], '.3f'):>12} "
          f"{fmt(s['s/episode'], '.3f'):>10}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
