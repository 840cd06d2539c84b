"""Diagnostic: what the Corrector's applied corrections do on hidden-city tasks (Navigation).

    python experiments/run.py --exp=hidden_city_corrections                      # Verifier off
    python experiments/run.py --exp=hidden_city_corrections --verifier rules --tasks 16

In the hidden-city setting (``env.navigation.hidden_city_share``, docs/navigation.md) a correction that names
the trip's city X before the user has (X comes only from the evidence l) can earn reward 1 but
cannot be learned. This runs the intervened rollouts of Algorithm 1 (the policy as Corrector,
``--corrector``, default the paper's) on the first ``--tasks`` hidden-city tasks of the *train*
split (the test split is never read), ``intervention.max_attempts`` per task, and
classifies every applied correction:

* ``leak``: it names X while nothing visible before it (query, tool results, the user's answers) does;
* ``ask``: it calls ``ask_user`` (the honest path);
* ``other``: neither.

Per intervened rollout it reports the reward, whether a leak or an ask was applied, and, for the
rollouts with a leak, how many of the task's stops were searched with region X by the end of the
episode and whether a ``direction`` call followed: why a leak does or does not become a success.
Writes ``corrections.json`` (counts and each rollout's turns) to ``--out``.

The defaults are those of the Table-3 runs in this setting: ``--hidden-city-share 0.3
policy.path=policies/navigation_hidden``; ``key=value`` overrides the config.
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any, Sequence

from rti_jax import experiment, reporting
from rti_jax.config import load_config, to_yaml
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.intervention.prompting import CORRECTORS

SETTING = ["env.navigation.hidden_city_share=0.3", "policy.path=policies/navigation_hidden"]
QUICK = ["rollout.max_new_tokens=48", "intervention.max_attempts=2"]


def classify(turn_text: str, city: str, visible_before: str) -> str:
  """``leak``, ``ask`` or ``other`` for one applied correction (see the module docstring)."""
  calls = parse_assistant_turn(turn_text).tool_calls
  if any(c.name == "ask_user" for c in calls):
    return "ask"
  if city.lower() in turn_text.lower() and city.lower() not in visible_before.lower():
    return "leak"
  return "other"


def searched_in(turn_texts: Sequence[str], names: Sequence[str], city: str) -> set[str]:
  """The stop names of ``names`` that some turn searched with ``region`` equal to ``city``."""
  found = set()
  for text in turn_texts:
    for c in parse_assistant_turn(text).tool_calls:
      args = c.arguments
      if c.name == "poi_search" and str(args.get("region", "")).strip().lower() == city.lower():
        name = str(args.get("address", "")).strip().lower()
        found |= {n for n in names if n.lower() == name}
  return found


def describe(traj: Any, task: Any) -> dict[str, Any]:
  """One intervened rollout: its reward, the class of each applied correction, the stops searched in
  the trip's city and whether a direction call was made."""
  city = task.stops[0].city
  names = sorted({s.name for s in task.stops})
  kinds, texts, seen = [], [], []  # seen: the non-assistant messages so far (what the dialogue shows)
  for m in traj.messages:
    if m["role"] != "assistant":
      seen.append(str(m.get("content", "")))
      continue
    turn_index = len(texts)
    if turn_index < len(traj.turns) and traj.turns[turn_index].intervened:
      kinds.append(classify(m["content"], city, "\n".join(seen)))
    texts.append(m["content"])
  direction = any(c.name == "direction" for t in texts for c in parse_assistant_turn(t).tool_calls)
  return {"task_id": traj.task_id, "city": city, "reward": float(traj.reward), "corrections": kinds,
          "stops": len(names), "stops_searched_in_city": len(searched_in(texts, names, city)),
          "direction_call": direction, "turns": texts}


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Counts over the described rollouts."""
  kinds = collections.Counter(k for r in rows for k in r["corrections"])
  leaked = [r for r in rows if "leak" in r["corrections"]]
  asked = [r for r in rows if "ask" in r["corrections"]]
  return {
      "rollouts": len(rows),
      "with_applied_correction": sum(bool(r["corrections"]) for r in rows),
      "succeeded": sum(r["reward"] >= 1 for r in rows),
      "applied_corrections": dict(kinds),
      "with_leak": len(leaked), "with_leak_succeeded": sum(r["reward"] >= 1 for r in leaked),
      "with_ask": len(asked), "with_ask_succeeded": sum(r["reward"] >= 1 for r in asked),
      "with_leak_all_stops_searched_in_city": sum(r["stops_searched_in_city"] == r["stops"] for r in leaked),
      "with_leak_direction_call": sum(r["direction_call"] for r in leaked),
  }


def parse_args(argv: Sequence[str] | None):
  p = experiment.common_parser("run.py --exp=hidden_city_corrections", __doc__, "runs/<name>-hidden-<time>",
                               reuse=False)
  p.add_argument("--tasks", type=int, default=16, help="hidden-city train tasks to intervene on")
  p.add_argument("--verifier", default="off", choices=["off", "rules", "llm"], help="the Verifier of the run")
  p.add_argument("--corrector", default="paper", choices=CORRECTORS)
  args, unknown = experiment.split_overrides(p, argv)
  args.overrides[:0] = [*SETTING, f"intervention.corrector={args.corrector}",
                        f"intervention.verifier='{args.verifier}'"]
  return args, unknown


def main(argv: Sequence[str] | None = None) -> int:
  from rti_jax.intervention import pipeline
  from rti_jax.intervention.stats import InterventionStats
  from rti_jax.trainer import Trainer

  args, unknown = parse_args(argv)
  prepared = experiment.prepare_run(args, unknown, QUICK, "-hidden")
  if prepared is None:
    return 2
  overrides, out = prepared
  cfg = load_config(args.config, [*overrides, f"train.seed={args.seeds[0]}"])
  if cfg.env.name != "navigation" or cfg.env.navigation.hidden_city_share <= 0:
    print("hidden_city_corrections needs env.name=navigation and env.navigation.hidden_city_share > 0", file=sys.stderr)
    return 2
  (out / "config.yaml").write_text(to_yaml(cfg))
  trainer = Trainer(cfg, out / "train", progress=False)
  tasks = [t for t in trainer.source.train if t.hidden_city][: args.tasks]
  stats = InterventionStats(groups_total=len(tasks), groups_triggered=len(tasks))
  runs = pipeline.run_intervened_rollouts(
      tasks, trainer.source.env_factory, trainer.backend, trainer.formatter, trainer.roles,
      trainer.intervention_config, trainer.rollout_config, stats, task_id=trainer.source.task_id, seed=args.seeds[0])
  trajs = [t for g in runs for t in g]
  stats.trajectories_intervened = len(trajs)  # what intervene_groups counts after the rollouts
  stats.trajectories_with_accepted = sum(any(t.intervened_mask) for t in trajs)
  stats.trajectories_success = sum(t.reward >= trainer.intervention_config.success_reward for t in trajs)
  rows = [describe(t, task) for task, g in zip(tasks, runs) for t in g]
  summary = summarize(rows)
  reporting.write_json(out / "corrections.json", {"summary": summary, "stats": stats.as_dict(), "rollouts": rows})
  print(f"{len(tasks)} hidden-city train tasks, Verifier {args.verifier}, Corrector {args.corrector}")
  print(stats.format_table())
  print(json.dumps(summary, indent=1))
  print(f"run dir: {out}")
  return 0
