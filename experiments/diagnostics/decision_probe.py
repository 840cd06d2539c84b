"""Diagnostic: does RL move the decisive step on Navigation, and does it stay context-specific?

    python experiments/run.py --exp=decision_probe                      # RTI, the default config
    python experiments/run.py --exp=decision_probe loss.method=grpo optim.lr=5e-4

Trains one method (config + overrides) and, before training and after every iteration, scores
the scripted oracle's and the trusting agent's episodes of the *validation* tasks
(``train.val_tasks``, the last train-split tasks; the test split is never read) teacher-forced
under the current policy. Per iteration it reports:

* ``p_research``: on validation tasks that need disambiguation, the probability of the first
  token of the oracle's second turn (the re-search of a stop whose first result lies in another
  city) after the ambiguous first search results: the decision RTI's repaired rollouts teach.
* ``p_trust``: on the same tasks, the probability of the first token of the trusting agent's
  second turn (planning the route at once with the wrong result).
* ``p_plan_plain``: on the other validation tasks, the probability of the first token of the
  oracle's second turn (planning the route): drops when the re-search spreads to contexts
  where it is not needed.
* ``research_turn_logp`` / ``plain_logp`` / ``disamb_rest_logp``: summed log-probs of the oracle's
  re-search turn, of every oracle turn of the other tasks, and of the oracle's later turns on
  disambiguation tasks (competence on the steps RL should leave alone).

The log-odds shift of ``p_trust`` against that of ``p_plan_plain`` tells whether an update
moved a context-specific decision or only a bias.

With a policy whose format writes the check line first in that turn (``rti_jax.policy.check_line``;
the build records ``"check_line": true`` in ``<policy>/build.json``), the three probabilities are
read right after the (teacher-forced) line, and two more figures read the line itself:

* ``p_check_odd``: on tasks that need disambiguation, the probability of the line's first word
  naming the off stop (``Check: Nanhu Lake in Wuhan.``), in the oracle's episode;
* ``p_check_all_plain``: on the other tasks, the probability of ``all`` (``Check: all in Xian.``).

Writes ``probe.jsonl``, ``probe.png`` and a final validation evaluation (``results.json``) to
the run directory.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Sequence

import numpy as np

from experiments import navigation as nav_exp
from rti_jax import experiment, reporting
from rti_jax.config import load_config, to_yaml

QUICK = [*nav_exp.QUICK, "train.eval_samples=2"]


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = experiment.common_parser("run.py --exp=decision_probe", __doc__, "runs/<name>-probe-<time>", reuse=False)
  return experiment.split_overrides(p, argv)


def turn_spans(mask: Sequence[bool]) -> list[tuple[int, int]]:
  """[start, end) of each run of True in ``mask`` (the assistant turns of an encoded episode)."""
  spans, i = [], 0
  while i < len(mask):
    if mask[i]:
      j = i
      while j < len(mask) and mask[j]:
        j += 1
      spans.append((i, j))
      i = j
    else:
      i += 1
  return spans


class DecisionProbe:
  """Teacher-forced scoring of scripted episodes of ``tasks`` (Navigation tasks) under a policy.

  Rows: (needs_disambiguation, agent kind, token ids, assistant-turn spans, (c, d)); one oracle
  episode per task, plus a trusting (naive) one per task that needs disambiguation. ``c`` and
  ``d`` are offsets into the second turn: its check word and its decision token (both 0 without
  ``check``: the decision is the turn's first token).
  """

  def __init__(self, tasks: Sequence[Any], env: Any, formatter: Any, pad_id: int, check: bool = False):
    from rti_jax.envs.navigation.agents import NaiveAgent, OracleAgent
    from rti_jax.policy.check_line import CHECK_PREFIX, check_line_length
    from rti_jax.policy.sft_data import encode_messages, play, scripted

    if not tasks:
      raise ValueError("tasks: expected at least one validation task, got none")
    self.check = check
    tok = formatter.tokenizer
    n_prefix = len(tok.encode(CHECK_PREFIX, add_special_tokens=False))
    self.rows: list[tuple[bool, str, list[int], list[tuple[int, int]], tuple[int, int]]] = []
    for task in tasks:
      for kind, agent in (("oracle", OracleAgent), ("naive", NaiveAgent)):
        if kind == "naive" and not task.needs_disambiguation:
          continue
        messages = play(env, scripted(agent, task, check), task)
        ids, mask = encode_messages(formatter, messages)
        spans = turn_spans(mask)
        if len(spans) < 2:
          raise ValueError(f"{task.task_id}: the scripted {kind} episode has fewer than two turns")
        offsets = (0, 0)
        if check:
          second = [m for m in messages if m["role"] == "assistant"][1]["content"]
          offsets = (n_prefix, check_line_length(tok, ids, spans[1][0], second))
        self.rows.append((bool(task.needs_disambiguation), kind, ids, spans, offsets))
    length = max(len(r[2]) for r in self.rows)
    length = -(-length // 128) * 128
    self.ids = np.full((len(self.rows), length), pad_id, np.int32)
    self.mask = np.zeros((len(self.rows), length), np.int32)
    for k, (_, _, ids, _, _) in enumerate(self.rows):
      self.ids[k, :len(ids)] = ids
      self.mask[k, :len(ids)] = 1

  def summarize(self, logp: np.ndarray) -> dict[str, float]:
    """The probe's figures from ``logp[k, t] = log p(ids[k, t] | ids[k, :t])`` (see module doc)."""
    research, research_turn, trust, plan, plain, rest, check_odd, check_all = [], [], [], [], [], [], [], []
    for k, (need, kind, _, spans, (c, d)) in enumerate(self.rows):
      s, e = spans[1]
      if need and kind == "oracle":
        research.append(np.exp(logp[k, s + d]))
        research_turn.append(logp[k, s + d:e].sum())
        rest += [logp[k, a:b].sum() for a, b in spans[2:]]
        check_odd.append(np.exp(logp[k, s + c]))
      elif need:
        trust.append(np.exp(logp[k, s + d]))
      else:
        plan.append(np.exp(logp[k, s + d]))
        plain += [logp[k, a:b].sum() for a, b in spans]
        check_all.append(np.exp(logp[k, s + c]))
    mean = lambda xs: float(np.mean(xs)) if xs else float("nan")  # noqa: E731
    out = {"p_research": mean(research), "p_trust": mean(trust), "p_plan_plain": mean(plan),
           "research_turn_logp": mean(research_turn), "disamb_rest_logp": mean(rest), "plain_logp": mean(plain)}
    if self.check:
      out.update(p_check_odd=mean(check_odd), p_check_all_plain=mean(check_all))
    return out

  def measure(self, logp_fn: Any, params: Any) -> dict[str, float]:
    import jax.numpy as jnp

    return self.summarize(np.asarray(logp_fn(params, jnp.asarray(self.ids), jnp.asarray(self.mask))))


def plot(records: Sequence[dict[str, Any]], path: Any) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  its = [r["iteration"] for r in records]
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for key in ("p_research", "p_trust", "p_plan_plain"):
    axes[0].plot(its, [r[key] for r in records], marker=".", label=key)
  axes[0].set(title="Decisive-step probabilities (validation split)", xlabel="iteration", ylabel="probability")
  for key in ("plain_logp", "disamb_rest_logp"):
    axes[1].plot(its, [r[key] for r in records], marker=".", label=key)
  axes[1].set(title="Log-prob of the other oracle turns", xlabel="iteration", ylabel="log-prob per turn")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
  from rti_jax.trainer import Trainer

  args, unknown = parse_args(argv)
  prepared = experiment.prepare_run(args, unknown, QUICK, "-probe")
  if prepared is None:
    return 2
  overrides, out = prepared
  cfg = load_config(args.config, [*overrides, f"train.seed={args.seeds[0]}"])
  if cfg.env.name != "navigation" or not cfg.train.val_tasks:
    print("decision_probe needs env.name=navigation and train.val_tasks > 0", file=sys.stderr)
    return 2
  (out / "config.yaml").write_text(to_yaml(cfg))
  trainer = Trainer(cfg, out / "train", progress=not args.no_progress)
  from rti_jax.policy.check_line import policy_check_line

  check = policy_check_line(cfg.policy.path)
  probe = DecisionProbe(trainer.val, trainer.source.env_factory(), trainer.formatter, trainer.pad_id, check=check)
  records = [{"iteration": 0, **probe.measure(trainer._logp_fn, trainer.state.params)}]
  reporting.write_jsonl(out / "probe.jsonl", records)
  t0 = time.perf_counter()
  for _ in range(cfg.train.iterations):
    rec = trainer.iterate()
    row = {"iteration": trainer.iteration, "reward_mean": rec["reward_mean"],
           "all_fail_group_frac": rec["all_fail_group_frac"], "groups_replaced": rec.get("rti/groups_replaced", 0),
           "grad_norm": rec["grad_norm"], **probe.measure(trainer._logp_fn, trainer.state.params)}
    records.append(row)
    reporting.append_jsonl(out / "probe.jsonl", row)
    print(f"iter {row['iteration']:>3}  p_research {row['p_research']:.4f}  p_trust {row['p_trust']:.4f}  "
          f"p_plan_plain {row['p_plan_plain']:.4f}  plain_logp {row['plain_logp']:.3f}  "
          + (f"p_check_odd {row['p_check_odd']:.4f}  p_check_all_plain {row['p_check_all_plain']:.4f}  " if check else "")
          + f"replaced {row['groups_replaced']}  ({time.perf_counter() - t0:.0f} s)", flush=True)
  ev = trainer.evaluate(trainer.val, cfg.train.eval_samples, seed=10_000 + args.seeds[0], desc="eval val")
  ev.pop("successes", None)
  first, last = records[0], records[-1]
  logit = lambda p: float(np.log(p) - np.log1p(-p))  # noqa: E731
  cols = ["figure", "before", "after"]
  keys = ("p_research", "p_trust", "p_plan_plain", "plain_logp", "disamb_rest_logp")
  rows = [[k, first[k], last[k]] for k in keys + (("p_check_odd", "p_check_all_plain") if check else ())]
  rows += [["log-odds shift of trusting (disamb)", 0.0, logit(last["p_trust"]) - logit(first["p_trust"])],
           ["log-odds shift of planning (other)", 0.0, logit(last["p_plan_plain"]) - logit(first["p_plan_plain"])]]
  for part in ("all", "disambiguation", "not_disambiguation"):
    if part in ev:
      rows.append([f"validation p@1 ({part})", float("nan"), 100 * ev[part]["p@1"]])
  table = reporting.print_table(f"Decision probe: {cfg.loss.method}, {cfg.train.iterations} iterations, "
                                f"{len(trainer.val)} validation tasks", cols, rows, floatfmt="{:.4f}")
  reporting.write_json(out / "results.json", {"config": to_yaml(cfg), "probe": records, "validation": ev})
  (out / "table.md").write_text(table + "\n")
  plot(records, out / "probe.png")
  print(f"run dir: {out}  (probe.jsonl, probe.png, results.json, table.md)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
