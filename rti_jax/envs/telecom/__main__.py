"""``python -m rti_jax.envs.telecom stats``: task counts, scripted-user coverage, pass rates.

Coverage = the share of tasks whose gold path the scripted user follows, measured
as a gold replay (``scripted_agents.GoldAgent``, device actions asked for by tool
name) scoring 1 through the full text interface; the described replay
(``DescribedGoldAgent``) asks for them in plain words instead. The do-nothing agents stop at once or only chat until the turn limit.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from typing import Any

from rti_jax.envs.telecom.env import TelecomEnv
from rti_jax.envs.telecom.scripted_agents import DescribedGoldAgent, DoNothingAgent, GoldAgent, run_episode
from rti_jax.envs.telecom.tasks import ISSUE_TYPES, load_split


def compute_stats(seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
  """Counts and pass rates per split; gold replay over every seed in ``seeds``."""
  out: dict[str, Any] = {"seeds": list(seeds), "splits": {}}
  for split in ("train", "test", "base"):
    tasks = load_split(split)
    by_issue = collections.Counter(t.issue_type for t in tasks)
    gold_pass = collections.Counter()
    gold_turns = []
    failures = []
    for seed in seeds:
      env = TelecomEnv(seed=seed)
      for task in tasks:
        reward = run_episode(env, GoldAgent(task), task).reward
        gold_pass[task.issue_type] += int(reward == 1.0)
        gold_turns.append(env.transcript.num_turns)
        if reward != 1.0:
          failures.append({"seed": seed, "task_id": task.task_id, "evaluation": env.transcript.info.get("evaluation")})
    env = TelecomEnv()
    described = sum(run_episode(env, DescribedGoldAgent(t), t).reward for t in tasks)
    stop_pass = sum(run_episode(env, DoNothingAgent(stop=True), t).reward for t in tasks)
    chat_pass = sum(run_episode(env, DoNothingAgent(stop=False), t).reward for t in tasks)
    n = len(tasks)
    out["splits"][split] = {
        "tasks": n, "by_issue_type": {k: by_issue[k] for k in ISSUE_TYPES},
        "gold_replay_pass": sum(gold_pass.values()) / (n * len(seeds)),
        "gold_replay_pass_by_issue_type": {k: gold_pass[k] / (by_issue[k] * len(seeds)) for k in ISSUE_TYPES
                                           if by_issue[k]},
        "covered_tasks": n - len({f["task_id"] for f in failures}),
        "gold_replay_mean_turns": sum(gold_turns) / len(gold_turns),
        "described_gold_replay_pass": described / n,
        "do_nothing_stop_pass": stop_pass / n, "do_nothing_chat_pass": chat_pass / n,
        "gold_failures": failures,
    }
  return out


def _print_table(stats: dict[str, Any]) -> None:
  print(f"tau2-Telecom offline (scripted user seeds {stats['seeds']})")
  header = ("split", "tasks", "service", "mobile_data", "mms", "covered", "gold pass", "gold turns",
            "described gold pass", "do-nothing stop", "do-nothing chat")
  print(" | ".join(header))
  for split, s in stats["splits"].items():
    issues = s["by_issue_type"]
    print(" | ".join(str(x) for x in (
        split, s["tasks"], issues["service_issue"], issues["mobile_data_issue"], issues["mms_issue"],
        f"{s['covered_tasks']}/{s['tasks']}", f"{s['gold_replay_pass']:.3f}", f"{s['gold_replay_mean_turns']:.1f}",
        f"{s['described_gold_replay_pass']:.3f}", f"{s['do_nothing_stop_pass']:.3f}", f"{s['do_nothing_chat_pass']:.3f}")))
  for split, s in stats["splits"].items():
    for f in s["gold_failures"]:
      print(f"gold failure [{split}] seed {f['seed']}: {f['task_id']}")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m rti_jax.envs.telecom")
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("stats", help="tasks per split and issue type, coverage, gold and do-nothing pass rates")
  p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="scripted-user seeds for the gold replay")
  p.add_argument("--json", action="store_true", help="print JSON instead of a table")
  args = parser.parse_args(argv)
  stats = compute_stats(tuple(args.seeds))
  if args.json:
    json.dump(stats, sys.stdout, indent=1)
    print()
  else:
    _print_table(stats)
  return 0


if __name__ == "__main__":
  sys.exit(main())
