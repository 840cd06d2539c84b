"""Diagnostic: where a tiny tau2 policy's copies go wrong (teacher-forced, held-out copy drills).

The copy drills of a build's held-out train tasks (``tau2_sft_data.copy_drills`` over the last
``data.holdout`` generated train tasks, as ``--exp=tau2_sft``'s copy check draws them; the test
split is never read) are run through the policy once each, and the argmax is checked at every
trained token. Each trained token is put in a class by where its text lies in the trained turn:
inside a copied value (by the argument's key: ``order_id``, ``user_id``, ``item_ids`` ...), inside
the tool's name, or elsewhere in the call (its JSON); a drill that trains a confirmation (the turn
that lists the next write's details) is one class of its own. Per class it prints the
trained tokens, the share predicted right, and the share of drills with every token of the class
right; for values, also the share right by the token's position inside the value (first, second,
...), which tells a copy that fails at its start (finding the value) from one that drifts on the
way (carrying it); and, of the value tokens predicted wrong, the share whose predicted token occurs
earlier in the drill's conversation, which tells a copy from the wrong place (a look-up that finds
another value) from no copy at all (a token the model brings from its training); it says that only
where a value is one token (``tokenizer.pattern=values``): a digit or a short piece occurs somewhere
in almost any conversation.

    python experiments/run.py --exp=copy_errors --env retail --policy runs/retail_sft/policy
"""

from __future__ import annotations

import argparse
import collections
import json
from typing import Any, Sequence


def classify(tok: Any, ids: Sequence[int], start: int, call: tuple[str, Any] | None,
             values: Sequence[tuple[str, str]]) -> list[tuple[str, int]]:
  """(class, position inside its value or -1) of each token ``ids[start:]`` (the trained turn)."""
  pieces = [tok.decode([i]) for i in ids[start:]]
  text = "".join(pieces)
  label = ["other"] * len(text)
  if call is not None:
    at = text.find(call[0])
    if at >= 0:
      label[at:at + len(call[0])] = ["tool name"] * len(call[0])
  for key, value in values:
    at = text.find(value)
    while at >= 0:
      label[at:at + len(value)] = [f"value:{key}"] * len(value)
      at = text.find(value, at + len(value))
  out: list[tuple[str, int]] = []
  pos = 0
  for piece in pieces:
    span = [c for c in label[pos:pos + len(piece)] if c != "other"] or ["other"]
    cls = collections.Counter(span).most_common(1)[0][0]
    if not cls.startswith("value:"):
      k = -1
    else:  # the k-th token of a run of one value's tokens
      k = out[-1][1] + 1 if out and out[-1][0] == cls else 0
    out.append((cls, k))
    pos += len(piece)
  return out


def measure(domain: str, policy: str, n: int, seed: int = 6, context: int = -1, cut: bool = False) -> dict[str, Any]:
  import jax.numpy as jnp
  import numpy as np

  from experiments.tau2_sft import cached_episodes
  from rti_jax.envs.tau2.source import split_tasks
  from rti_jax.policy import build_config
  from rti_jax.policy import evaluate as ev
  from rti_jax.policy import tau2_sft_data as td
  from rti_jax.policy.sft_example import split_train

  cfg = build_config.load_tau2(None, [])
  train, _ = split_tasks(domain, "generated", cfg.data.num_train)
  _, held = split_train(train, cfg.data.holdout)
  model, tok, fmt = ev.load_policy(policy)
  episodes = cached_episodes(domain, held, td.make_env(domain))
  drills = td.copy_drills(episodes, fmt, n, seed=seed, context=context, cut=cut)
  tokens: dict[str, list[int]] = collections.defaultdict(list)
  drills_right: dict[str, list[int]] = collections.defaultdict(list)
  by_position: dict[int, list[int]] = collections.defaultdict(list)
  wrong_in_context: list[int] = []  # per value token predicted wrong: 1 if the predicted token occurs before the turn
  for d in drills:
    ids, mask = list(d.token_ids), np.asarray(d.loss_mask, np.float32)
    trained = np.flatnonzero(mask > 0)
    start = int(trained[0])
    seen = set(ids[:start])
    text = tok.decode(ids[start:int(trained[-1]) + 1])
    call = td._turn_call(text)  # None: a confirmation that lists the next write's details
    values = td._copied_values(call) if call is not None else []
    t = -(-len(ids) // 64) * 64
    padded = np.zeros((1, t), np.int32)
    padded[0, :len(ids)] = ids
    attn = np.zeros((1, t), np.int32)
    attn[0, :len(ids)] = 1
    logits = model(jnp.asarray(padded), jnp.asarray(attn))
    pred = np.asarray(jnp.argmax(logits[0, :len(ids) - 1], axis=-1))
    classes = (classify(tok, ids[:int(trained[-1]) + 1], start, call, values) if call is not None
               else [("confirmation", -1)] * (int(trained[-1]) + 1 - start))
    per: dict[str, list[int]] = collections.defaultdict(list)
    for j, (cls, k) in zip(range(start, int(trained[-1]) + 1), classes):
      if mask[j] <= 0:
        continue
      hit = int(pred[j - 1] == ids[j])
      tokens[cls].append(hit)
      per[cls].append(hit)
      if k >= 0:
        by_position[min(k, 9)].append(hit)
        if not hit:
          wrong_in_context.append(int(int(pred[j - 1]) in seen))
    for cls, hits in per.items():
      drills_right[cls].append(int(all(hits)))
  rows = {cls: {"tokens": len(h), "right": float(np.mean(h)), "drills": len(drills_right[cls]),
                "drills_all_right": float(np.mean(drills_right[cls]))} for cls, h in sorted(tokens.items())}
  positions = {k: float(np.mean(h)) for k, h in sorted(by_position.items())}
  return {"domain": domain, "policy": policy, "drills": len(drills), "context": context, "cut": cut, "classes": rows,
          "value_position_right": positions, "wrong_value_tokens": len(wrong_in_context),
          "wrong_value_tokens_in_context": float(np.mean(wrong_in_context)) if wrong_in_context else 0.0}


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--env", default="retail", choices=["retail", "airline"])
  p.add_argument("--policy", required=True, help="a tau2 policy dir (its build's tokenizer)")
  p.add_argument("--drills", type=int, default=200, help="held-out copy drills checked")
  p.add_argument("--context", type=int, default=-1,
                 help="the drills' conversation (copy_stage.context): -1 all of it, k the messages showing the values + k")
  p.add_argument("--cut", action="store_true", help="only the messages showing the values (copy_stage.cut)")
  p.add_argument("--json", default=None, help="also write the figures here")
  args = p.parse_args(argv)
  res = measure(args.env, args.policy, args.drills, context=args.context, cut=args.cut)
  print(f"{res['drills']} held-out {args.env} copy drills, {args.policy}")
  print("| class | trained tokens | right | drills with the class | all right |")
  print("|---|---|---|---|---|")
  for cls, r in res["classes"].items():
    print(f"| {cls} | {r['tokens']} | {r['right']:.3f} | {r['drills']} | {r['drills_all_right']:.3f} |")
  print("value tokens right by position in the value (9 = 9th and later): "
        + ", ".join(f"{k}: {v:.3f}" for k, v in res["value_position_right"].items()))
  print(f"value tokens predicted wrong: {res['wrong_value_tokens']}, of them a token that occurs earlier in the "
        f"drill: {res['wrong_value_tokens_in_context']:.3f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(res, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
