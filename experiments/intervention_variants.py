"""RTI variants side by side on one environment's config (default Navigation):

    python experiments/run.py --exp=intervention_variants --variants rti rti_teacher --seeds 0 1 2   # Fig. 6
    python experiments/run.py --exp=intervention_variants --variants rti rti_cal --seeds 0 1 2       # old_logp

* ``rti``: the config's RTI (the policy as Corrector; rule or LLM judges as the config says);
* ``rti_teacher``: another checkpoint (``--intervener``, default ``policies/navigation_teacher``,
  the shipped OPD teacher, same tokenizer) writes the corrections and answers any LLM judge,
  sampled in-process (``intervention.intervener_path``): the paper's Fig. 6, a stronger
  intervener against self-intervention;
* ``rti_cal``: the corrected tokens' behaviour log-prob is pi_cal, the distribution they were drawn
  from, instead of pi_roll (``loss.intervened_old_logp=cal``);
* ``rti_self``: the policy is its own Validator and Verifier as well as Corrector (``intervention.validator=llm
  intervention.verifier=llm``, the paper's default), for a policy taught to judge (``--exp=judge_sft``;
  its card gives ``intervention.judge_max_new_tokens``);
* ``grpo``: the same config trained with GRPO, the row every variant is read against.

    python experiments/run.py --exp=intervention_variants --variants grpo rti rti_self --seeds 0 1 2 \
      policy.path=policies/navigation_judge intervention.judge_max_new_tokens=N               # who judges

The table: test p@1, avg p@k, avg pk, the last periodic evaluation's p@1 (the validation split:
what chooses between variants), groups replaced, corrections applied, the mean PPL of applied
corrections under pi_roll, and the clip fractions of intervened and on-policy tokens (means over
iterations); every column a mean over seeds. Table 6 follows. ``--reuse`` takes over trainings
whose resolved config equals one of these variants (e.g. ``--exp=navigation --methods rti``).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from typing import Any, Sequence

import numpy as np

from experiments import navigation as nav_exp
from rti_jax import experiment

DEFAULT_INTERVENER = "policies/navigation_teacher"
VARIANTS = ("rti", "rti_teacher", "rti_cal", "rti_self", "grpo")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = experiment.common_parser("run.py --exp=intervention_variants", __doc__, "runs/<name>-variants-<time>")
  p.add_argument("--variants", nargs="+", default=["rti", "rti_teacher"], choices=list(VARIANTS))
  p.add_argument("--intervener", default=DEFAULT_INTERVENER, help="the checkpoint of rti_teacher (shares the tokenizer)")
  return experiment.split_overrides(p, argv)


def variant_overrides(names: Sequence[str], intervener: str) -> dict[str, list[str]]:
  per = {"rti": ["loss.method=rti"],
         "rti_teacher": ["loss.method=rti", f"intervention.intervener_path={intervener}"],
         "rti_cal": ["loss.method=rti", "loss.intervened_old_logp=cal"],
         "rti_self": ["loss.method=rti", "intervention.validator=llm", "intervention.verifier=llm"],
         "grpo": ["loss.method=grpo"]}
  return {n: per[n] for n in names}


def _mean(xs: Sequence[float]) -> float:
  xs = [x for x in xs if isinstance(x, (int, float)) and not math.isnan(x)]
  return float(np.mean(xs)) if xs else math.nan


def rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
  cols = ["variant", "p@1", "avg p@k", "avg pk", "val p@1", "groups replaced", "applied", "mean PPL_roll",
          "clip frac intervened", "clip frac on-policy"]
  out = []
  for m in results["methods"]:
    runs = [r for r in results["runs"].values()]
    summ = [r[m]["all"] for r in runs]
    row: list[Any] = [m, *(100 * _mean([s[k] for s in summ]) for k in ("p@1", "avg p@k", "avg pk"))]
    if m == "base":
      out.append(row + [math.nan] * (len(cols) - len(row)))
      continue
    recs = [r.get(f"{m}_records", []) for r in runs]
    val = [next((x["eval"]["all"]["p@1"] for x in reversed(rs) if "eval" in x), math.nan) for rs in recs]
    stats = [experiment.summed_stats(rs) for rs in recs]
    row += [100 * _mean(val), _mean([s.groups_replaced for s in stats]), _mean([s.corrections_applied for s in stats]),
            _mean([s.mean_accepted_ppl for s in stats]),
            _mean([_mean([x.get("clip_frac_intervened", math.nan) for x in rs]) for rs in recs]),
            _mean([_mean([x.get("clip_frac_on_policy", math.nan) for x in rs]) for rs in recs])]
    out.append(row)
  return cols, out


def main(argv: Sequence[str] | None = None) -> int:
  args, unknown = parse_args(argv)
  if "rti_teacher" in args.variants and not (pathlib.Path(args.intervener) / "config.json").exists():
    print(f"--intervener: no checkpoint at {args.intervener!r}", file=sys.stderr)
    return 2
  prepared = experiment.prepare_run(args, unknown, nav_exp.QUICK, "-variants")
  if prepared is None:
    return 2
  overrides, out = prepared
  results = experiment.run(args.config, overrides, args.seeds, variant_overrides(args.variants, args.intervener), out,
                           progress=not args.no_progress, reuse=args.reuse, jobs=args.jobs)
  experiment.print_and_report(results, out, "RTI variants", *rows(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
