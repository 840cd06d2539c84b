"""``python -m rti_jax.envs.tau2 stats --domain retail``: per split, the task count, the gold
replay's pass rate through the full text interface with the scripted user (scored by tau2's own
evaluator, ``--reward tau2``, or the fast reward), the do-nothing agent's pass rate, and seconds per
episode. ``--sample N`` plays only the first N tasks of each split.

``python -m rti_jax.envs.tau2 check-reward --domain retail``: plays the gold, do-nothing, chatting
and one-write-dropped agents on every test task and counts where the fast reward and tau2's
evaluator disagree (0 expected).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

from rti_jax.envs.tau2.agents import DoNothingAgent, GoldAgent, run_episode
from rti_jax.envs.tau2.bridge import DOMAINS
from rti_jax.envs.tau2.env import Tau2Env
from rti_jax.envs.tau2.source import split_tasks


def split_stats(domain: str, tasks: Sequence[Any], reward: str = "tau2") -> dict[str, Any]:
  """``{"tasks", "gold pass", "do-nothing pass", "s/episode", "gold failures", "by request type"}``."""
  env = Tau2Env(domain, reward=reward)
  failures, by_type = [], {}
  t0 = time.perf_counter()
  gold = 0
  for task in tasks:
    ok = run_episode(env, GoldAgent(task), task).reward >= 1.0
    gold += ok
    if not ok:
      failures.append(task.task_id)
    for kind in task.request_types:
      n, k = by_type.get(kind, (0, 0))
      by_type[kind] = (n + 1, k + ok)
  seconds = (time.perf_counter() - t0) / max(1, len(tasks))
  nothing = sum(run_episode(env, DoNothingAgent(), t).reward >= 1.0 for t in tasks)
  n = max(1, len(tasks))
  return {"tasks": len(tasks), "gold pass": gold / n, "do-nothing pass": nothing / n, "s/episode": seconds,
          "gold failures": failures, "by request type": {k: {"tasks": a, "gold pass": b / a} for k, (a, b) in
                                                          sorted(by_type.items())}}


def compute_stats(domain: str, splits: str = "generated", sample: int | None = None, reward: str = "tau2",
                  num_train: int | None = None) -> dict[str, Any]:
  train, test = split_tasks(domain, splits, num_train)
  out = {"domain": domain, "splits": splits, "reward": reward, "split": {}}
  for name, tasks in (("train", train), ("test", test)):
    out["split"][name] = split_stats(domain, tasks[:sample] if sample else tasks, reward)
  return out


class _DropOneWrite:
  """The gold agent with its first write call left out (a wrong-database episode)."""

  def __init__(self, task: Any) -> None:
    self.agent = GoldAgent(task)
    writes = [i for i, (kind, what) in enumerate(self.agent.plan) if kind == "call" and what[0] in self.agent.writes]
    if writes:
      del self.agent.plan[writes[0]]

  def act(self, messages: list[dict[str, Any]]) -> str:
    return self.agent.act(messages)


def check_reward(domain: str, sample: int | None = None) -> dict[str, Any]:
  """Episodes where ``bridge.fast_reward`` and tau2's evaluator disagree, over four agents."""
  _, test = split_tasks(domain, "generated", 0)
  env = Tau2Env(domain, reward="fast")
  agents = {"gold": GoldAgent, "do-nothing": lambda t: DoNothingAgent(), "chat": lambda t: DoNothingAgent(stop=False),
            "drop-one-write": _DropOneWrite}
  episodes, disagree = 0, []
  for task in test[:sample] if sample else test:
    for name, make in agents.items():
      fast = run_episode(env, make(task), task).reward
      slow = env.score("tau2").reward
      episodes += 1
      if fast != slow:
        disagree.append({"task": task.task_id, "agent": name, "fast": fast, "tau2": slow})
  return {"domain": domain, "episodes": episodes, "disagreements": disagree}


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m rti_jax.envs.tau2", description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  st = sub.add_parser("stats", help="tasks, gold pass and do-nothing pass per split")
  st.add_argument("--domain", choices=DOMAINS, required=True)
  st.add_argument("--splits", choices=("generated", "tau2"), default="generated")
  st.add_argument("--sample", type=int, default=None, help="only the first N tasks of each split")
  st.add_argument("--num-train", type=int, default=None, help="generated training tasks kept (default all)")
  st.add_argument("--reward", choices=("tau2", "fast"), default="tau2")
  st.add_argument("--json", action="store_true")
  ck = sub.add_parser("check-reward", help="the fast reward against tau2's evaluator")
  ck.add_argument("--domain", choices=DOMAINS, required=True)
  ck.add_argument("--sample", type=int, default=None)
  args = p.parse_args(argv)
  if args.cmd == "check-reward":
    out = check_reward(args.domain, args.sample)
    print(json.dumps(out, indent=1))
    return 0 if not out["disagreements"] else 1
  stats = compute_stats(args.domain, args.splits, args.sample, args.reward, args.num_train)
  if args.json:
    print(json.dumps(stats, indent=1))
    return 0
  print(f"tau2 {args.domain} ({args.splits} splits; gold replay with the scripted user, scored by "
        f"{'tau2' if args.reward == 'tau2' else 'the fast reward'})")
  print(f"{'split':<6} {'tasks':>6} {'gold pass':>10} {'do-nothing':>11} {'s/episode':>10}")
  for name, s in stats["split"].items():
    print(f"{name:<6} {s['tasks']:>6} {s['gold pass']:>10.3f} {s['do-nothing pass']:>11.3f} {s['s/episode']:>10.3f}")
  for name, s in stats["split"].items():
    kinds = ", ".join(f"{k} {v['tasks']}" for k, v in s["by request type"].items())
    print(f"{name} request types: {kinds}")
    if s["gold failures"]:
      print(f"{name} gold failures: {' '.join(s['gold failures'])}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
