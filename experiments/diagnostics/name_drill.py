"""Diagnostic: can a fresh tiny Qwen3 learn to read the stop names out of a Navigation request?

A fresh tiny model is trained on first-turn drills only: a train-split request with its stop names
swapped for other places of the map, and the first turn that searches each stop
(``sft_swap.name_swap_examples`` builds the same kind of example for a policy build; here without
the system turn, to be fast). It then reports, teacher-forced on 100 drills from held-out
train-split requests (the test split is never read), how often the argmax at a search's name is
the right name, and how often it is one of the request's own names. With ``--held-names`` the
evaluation drills use 60 names that no training drill contains. The model, init and tokenizer
defaults are those of a policy build (``configs/sft_navigation.yaml``); docs/tiny_policy.md has the
figures.

    python experiments/run.py --exp=name_drill                          # a build's model and init
    python experiments/run.py --exp=name_drill --order route            # searches in route order
    python experiments/run.py --exp=name_drill --qk 2.0 --type-init 0   # q/k norm 2.0, no name direction

Writes ``result.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import time
from typing import Any, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[2]

PLACE_NAME = r"[A-Z][a-z]+(?:Ġ[A-Z][a-z]+)+Ġ?"
NAMES1 = (r"[A-Z][a-z]+(?: [A-Z][a-z]+)*| ?[0-9]+(?:\.[0-9]+)?(?:,[0-9]+(?:\.[0-9]+)?)?|\s+|[A-Za-z]+|"
          r"[^\sA-Za-z0-9]+(?: [^\sA-Za-z0-9]+)* ?")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="run.py --exp=name_drill", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--steps", type=int, default=1600)
  p.add_argument("--drills", type=int, default=8000, help="training drills")
  p.add_argument("--order", choices=("route", "mention"), default="mention",
                 help="searches in the request's order (as the scripted agents, agents.mention_order) or in route order")
  p.add_argument("--layers", type=int, default=3)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--head-dim", type=int, default=32)
  p.add_argument("--qk", type=float, default=1.4, help="initial q/k RMSNorm weight (sft.sharpen_qk_norm)")
  p.add_argument("--type-init", type=float, default=8.0, help="sft.add_type_direction scale on place-name tokens")
  p.add_argument("--embed-std", type=float, default=1.0)
  p.add_argument("--final-norm", type=float, default=0.03)
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--freeze-names", action="store_true",
                 help="keep the place-name embedding rows at their init (SFTConfig.frozen_token_ids)")
  p.add_argument("--held-names", action="store_true", help="evaluate on names no training drill contains")
  p.add_argument("--pattern", choices=("names", "names1"), default="names",
                 help="pre-tokenizer: tokenizer.NAME_PATTERN, or names1 (a number takes the space before it)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=str(ROOT / "runs" / "name_drill"))
  return p.parse_args(None if argv is None else list(argv))


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from models.qwen import Qwen
  from rti_jax.envs import navigation as nav
  from rti_jax.envs.navigation.agents import SEARCH_FIRST, render_turn
  from rti_jax.envs.tool_calls import ToolCall
  from rti_jax.policy import sft, sft_data, sft_swap
  from rti_jax.policy import tokenizer as T
  from rti_jax.policy.sft_example import SFTExample

  t0 = time.time()
  bench = nav.load_benchmark("tiny")
  env = nav.NavigationEnv(bench.world)
  train, held = bench.train[:560], bench.train[560:]
  pattern = T.NAME_PATTERN if args.pattern == "names" else NAMES1
  tok = T.build_tokenizer(sft_data.corpus_texts(train, env) + list(nav.vocabulary()), 4096, pattern=pattern)
  names = sorted({p.name for p in bench.world.pois})
  perm = np.random.default_rng(args.seed).permutation(len(names))
  held_names = sorted(names[i] for i in perm[:60])
  train_names = sorted(set(names) - set(held_names)) if args.held_names else names

  def make(tasks: list[Any], pool: list[str], n: int, seed: int) -> list[tuple[SFTExample, str]]:
    rng = np.random.default_rng(seed)
    plain = [t for t in tasks if not any(s.hinted for s in t.stops)]
    out: list[tuple[SFTExample, str]] = []
    while len(out) < n:
      task = plain[int(rng.integers(len(plain)))]
      new = [str(x) for x in rng.choice(pool, size=len(task.stops), replace=False)]
      swapped = sft_swap.swap_names([task.query], [s.name for s in task.stops], new)
      if swapped is None:
        continue
      q = swapped[0]
      order = new if args.order == "route" else sorted(new, key=q.index)
      turn = render_turn(SEARCH_FIRST, [ToolCall("poi_search", {"address": x}) for x in order])
      prompt = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
      a = tok(prompt, add_special_tokens=False)["input_ids"]
      b = tok(turn + T.END_OF_TURN, add_special_tokens=False)["input_ids"]
      out.append((SFTExample("drill", "name_swap", tuple(a + b), tuple([False] * len(a) + [True] * len(b))), q))
    return out

  data = [x for x, _ in make(train, train_names, args.drills, args.seed + 1)]
  evals = make(held, held_names if args.held_names else names, 100, args.seed + 2)
  pad, eos = tok.convert_tokens_to_ids(T.PAD_TOKEN), tok.convert_tokens_to_ids(T.END_OF_TURN)
  mcfg = sft.tiny_qwen3_config(len(tok), hidden_size=128, num_layers=args.layers, num_heads=args.heads,
                               num_kv_heads=1, head_dim=args.head_dim, intermediate_size=256,
                               pad_token_id=pad, eos_token_id=eos)
  model = Qwen(mcfg, rngs=nnx.Rngs(args.seed))
  sft.sharpen_qk_norm(model, args.qk)
  sft.scale_embeddings(model, args.embed_std, args.final_norm, seed=args.seed + 1)
  name_ids = sft_data.place_name_token_ids(tok, env)
  sft.add_type_direction(model, name_ids, args.type_init, seed=args.seed + 8)
  base = sft.SFTConfig(tokens_per_batch=2048, lr=args.lr, len_multiple=32, max_len=1024, seed=args.seed,
                       frozen_token_ids=tuple(name_ids) if args.freeze_names else ())
  res = sft.train(model, data, sft.for_steps(base, data, pad, args.steps), pad,
                  log=lambda s: print(s, flush=True), log_every=100)

  hits = in_request = total = 0
  by_position: dict[int, list[int]] = {}
  for x, q in evals:
    ids = jnp.asarray([list(x.token_ids)])
    pred = np.asarray(jnp.argmax(model(ids, jnp.ones_like(ids))[0], -1))
    toks = tok.convert_ids_to_tokens(list(x.token_ids))
    k = 0
    for t in range(len(toks) - 1):
      if not (x.loss_mask[t + 1] and re.fullmatch(PLACE_NAME, toks[t + 1])):
        continue
      want = toks[t + 1].replace("Ġ", " ").strip()
      got = tok.convert_ids_to_tokens([int(pred[t])])[0].replace("Ġ", " ").strip()
      total, hits, in_request = total + 1, hits + (got == want), in_request + (got in q)
      by_position.setdefault(k, [0, 0])
      by_position[k][0] += got == want
      by_position[k][1] += 1
      k += 1
  result = {"args": vars(args), "search_names": total, "copied": hits / max(total, 1),
            "a_request_name": in_request / max(total, 1),
            "copied_by_search": {k: v[0] / v[1] for k, v in sorted(by_position.items())},
            "final_train_loss": float(np.mean(res.losses[-20:])), "wall_s": time.time() - t0}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "result.json"), "w") as f:
    json.dump(result, f, indent=1)
  print(f"search names copied (argmax): {result['copied']:.2f} of {total}; one of the request's names: "
        f"{result['a_request_name']:.2f}; by search: "
        + ", ".join(f"#{k + 1} {v:.2f}" for k, v in result["copied_by_search"].items()))
  print(f"final train loss {result['final_train_loss']:.4f}; wall {result['wall_s']:.0f}s; wrote {args.out}/result.json")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
