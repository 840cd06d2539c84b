"""Diagnostic: does a Navigation policy copy place names and coordinates? (teacher-forced)

For scripted plain / trusting episodes of the last 40 *train-split* tasks (the test split is never
read; ``navigation_sft``'s ``data.holdout: 40``, the default, keeps these tasks out of SFT), it
runs the policy once over each whole episode and, at every trained position that holds a whole
place-name or coordinate token, checks the argmax. Names of the first turn (the searches, copied
from the request) are reported apart from names written after the results, with how often the
argmax is one of the request's own names and the accuracy per search position. ``--swapped`` checks
first turns of the same tasks with their stop names swapped for random places of the map instead
(``sft_swap.name_swap_examples``): reading, not recall of a trained request.

    python experiments/run.py --exp=name_copy_check --policy policies/navigation_base --episodes 30
    python experiments/run.py --exp=name_copy_check --swapped --episodes 60
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from typing import Sequence

from rti_jax.policy import DEFAULT_POLICY_DIR

PLACE_NAME = r"[A-Z][a-z]+(?:Ġ[A-Z][a-z]+)+Ġ?"
COORDINATE = r"Ġ?[0-9]+\.[0-9]+,[0-9]+\.[0-9]+"


def measure(policy: str, episodes: int, swapped: bool = False) -> dict[str, dict[str, object]]:
  """The copy figures printed by ``main`` (see the module docstring) for the checkpoint ``policy``."""
  from rti_jax.policy import evaluate as ev

  model, tok, fmt = ev.load_policy(policy)
  return measure_model(model, tok, fmt, episodes, swapped)


def measure_model(model: object, tok: object, fmt: object, episodes: int, swapped: bool = False,
                  tasks: list[object] | None = None, system_turn: bool = True,
                  env: object | None = None) -> dict[str, dict[str, object]]:
  """``measure`` for a model in memory (e.g. mid-build) with its tokenizer and chat formatter;
  ``tasks``: train-split tasks to draw from (default: the last 40); ``system_turn=False``: the
  sequences without their system turn (as the build's name drills are trained); ``env``: the
  Navigation env of ``tasks``' setting (default: the tiny setting's)."""
  import jax.numpy as jnp
  import numpy as np

  from rti_jax.envs import navigation as nav
  from rti_jax.policy import sft_data, sft_swap

  if env is None or tasks is None:
    bench = nav.load_benchmark("tiny")
    env = nav.NavigationEnv(bench.world) if env is None else env
    tasks = bench.train[-40:] if tasks is None else tasks
  tasks = list(tasks)
  if swapped:  # first turns only, the stop names swapped for random places (sft_swap.name_swap_examples)
    examples = sft_swap.name_swap_examples(tasks, env, fmt, episodes, seed=99)
  else:
    examples = [x for x in sft_data.build_examples(tasks, env, fmt, sft_data.MixConfig(seed=99))
                if x.kind in ("plain", "trusting")][:episodes]
  if not system_turn:
    examples = [sft_data.without_system_turn(fmt, x) for x in examples]
  c: collections.Counter[str] = collections.Counter()
  for x in examples:
    n = len(x.token_ids)
    ids = jnp.asarray([list(x.token_ids)])
    pred = np.asarray(jnp.argmax(model(ids, jnp.ones_like(ids))[0, :n - 1], -1))
    toks = tok.convert_ids_to_tokens(list(x.token_ids))
    starts = [i for i in range(n - 1) if toks[i] == "<|im_start|>"]
    user = next(i for i in starts if toks[i + 1] == "user")
    first_turn = next(i for i in starts if i > user and toks[i + 1] == "assistant")
    first_result = next((i for i in range(first_turn, n) if toks[i] == "<tool_response>"), n)
    request_names = {toks[i] for i in range(user, first_turn) if re.fullmatch(PLACE_NAME, toks[i])}
    k = 0
    for t in range(first_turn, n - 1):
      s, guess = toks[t + 1], tok.convert_ids_to_tokens([int(pred[t])])[0]
      if not x.loss_mask[t + 1]:
        continue
      if re.fullmatch(COORDINATE, s):
        c["coordinates"] += 1
        c["coordinates copied"] += guess == s
      elif re.fullmatch(PLACE_NAME, s):
        where = "search names" if t + 1 < first_result else "names after results"
        c[where] += 1
        c[f"{where} copied"] += guess == s
        if where == "search names":
          c["search names: argmax is a request name"] += guess in request_names
          c[f"search {k + 1} copied"] += guess == s
          c[f"search {k + 1}"] += 1
          k += 1
  share = lambda hit, total: c[hit] / c[total] if c[total] else None  # noqa: E731
  out: dict[str, dict[str, object]] = {
    k: {"n": c[k], "copied": share(f"{k} copied", k)} for k in ("coordinates", "search names", "names after results")}
  out["search names"]["argmax is a request name"] = share("search names: argmax is a request name", "search names")
  out["per search (copied)"] = {k: share(f"{k} copied", k) for k in sorted(c) if re.fullmatch(r"search \d+", k)}
  return out


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="run.py --exp=name_copy_check", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--policy", default=str(DEFAULT_POLICY_DIR), help="policy dir (default: policies/navigation_base)")
  p.add_argument("--episodes", type=int, default=30)
  p.add_argument("--swapped", action="store_true",
                 help="first-turn drills whose stop names are swapped for random places, instead of episodes")
  args = p.parse_args(None if argv is None else list(argv))
  print(json.dumps(measure(args.policy, args.episodes, args.swapped), indent=1))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
