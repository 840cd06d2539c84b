"""Diagnostic: can a tiny Qwen3 learn to *copy* names and coordinates in Navigation episodes?

The shipped tiny base policy (``policies/navigation_tiny``) has the episode format but solves
no task: it does not copy stop names from the query nor coordinates from tool results. This
probe trains a fresh tiny model for a fixed number of SFT steps on a variant of the SFT data
and reports the mean next-token NLL on held-out train-split episodes (the last 40 train tasks;
the test split is never read) by token class:

* ``name``: a capitalised word token (or a whole multi-word name with ``--pattern names``),
* ``num``: a number token inside a ``<tool_call>`` (coordinates copied into ``direction``),
* ``numtext``: a number token in assistant text (the ``--cot`` route line),
* ``other``: every other trained token (format, fixed sentences).

A copied token costs ~0 nats once the model copies; ~log(#candidates) when it guesses.

Variants (all monkeypatch module attributes *inside this process only*):

* ``--pattern names``: whole names (``Jiming Hill``) and whole coordinates (``104.0145,30.5197``)
  become single tokens; ``digits``: numbers split into single digits; ``pairs``: into <= 2 digits.
* ``--reorder``: the direction call lists origin, waypoints, destination in route order.
* ``--maxres 1``: searches return one candidate (``NavConfig.max_results``).
* ``--cot``: tool lines read ``name X lon,lat; city C`` and the direction turn starts with a route
  line ``Route: X lon,lat; Y lon,lat.`` (name-anchored copying).
* ``--freeze --embinit s``: embeddings frozen at N(0, s^2) (tests rare-token degeneration).
* ``--drills N``: N associative-recall drills from the map's POI list (5 ``name X lon,lat`` lines,
  then 3 named look-ups); ``--kinds none --drills N`` trains on drills only.
* ``--wcopy w``: loss weight w on name/number tokens.
* ``--number-type-init s``: a shared direction of norm s added to every number token's embedding at init.

Usage::

    python experiments/tiny_policy_probe.py --steps 600 --pattern names --reorder
    # a curriculum: stage 1 saves, stage 2 starts from it
    python experiments/tiny_policy_probe.py --kinds none --drills 20000 --drill-lines 1 --pattern names \
        --vocab 4096 --steps 1000 --save runs/probe_stage1
    python experiments/tiny_policy_probe.py --init runs/probe_stage1 --cot --reorder --steps 600

Findings are in docs/tiny_policy.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NUMBER_TOKEN = r"Ġ?[0-9.,]+"
LOC_TOKEN = r"Ġ?[0-9]+\.[0-9]+,[0-9]+\.[0-9]+"
PLACE_NAME_TOKEN = r"[A-Z][a-z]+(?:Ġ[A-Z][a-z]+)+Ġ?"  # a multi-word place name (one token)
NAME_TOKEN = r"[A-Z][A-Za-zĠ]+"  # a whole (possibly multi-word) name token
PATTERNS = {
  "default": None,
  "names": r"[A-Z][a-z]+(?: [A-Z][a-z]+)*|[0-9]+(?:\.[0-9]+)?(?:,[0-9]+(?:\.[0-9]+)?)?|\s+|[A-Za-z]+|"
           r"[^\sA-Za-z0-9]+(?: [^\sA-Za-z0-9]+)* ?",
  # as "names", but a number takes the space before it: "X 1.2,3.4" is name, number (a 1-back copy)
  "names1": r"[A-Z][a-z]+(?: [A-Z][a-z]+)*| ?[0-9]+(?:\.[0-9]+)?(?:,[0-9]+(?:\.[0-9]+)?)?|\s+|[A-Za-z]+|"
            r"[^\sA-Za-z0-9]+(?: [^\sA-Za-z0-9]+)* ?",
  # as "names", but a name takes the space after it when a number follows: "X 1.2,3.4" is name, number
  "names2": r"[A-Z][a-z]+(?: [A-Z][a-z]+)*(?: (?=[0-9]))?|[0-9]+(?:\.[0-9]+)?(?:,[0-9]+(?:\.[0-9]+)?)?|\s+|"
            r"[A-Za-z]+|[^\sA-Za-z0-9]+(?: [^\sA-Za-z0-9]+)* ?",
  "digits": r"[A-Z][a-z]+(?: [A-Z][a-z]+)*|[0-9]|\s+|[A-Za-z]+|[^\sA-Za-z0-9]+(?: [^\sA-Za-z0-9]+)* ?",
  "pairs": r"[A-Z][a-z]+(?: [A-Z][a-z]+)*|[0-9]{1,2}|\s+|[A-Za-z]+|[^\sA-Za-z0-9]+(?: [^\sA-Za-z0-9]+)* ?",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--steps", type=int, default=600)
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--tokens-per-batch", type=int, default=4096)
  p.add_argument("--hidden", type=int, default=128)
  p.add_argument("--layers", type=int, default=3)
  p.add_argument("--heads", type=int, default=2)
  p.add_argument("--head-dim", type=int, default=64)
  p.add_argument("--vocab", type=int, default=2048)
  p.add_argument("--pattern", choices=sorted(PATTERNS), default="default")
  p.add_argument("--system", action="store_true", help="keep the system turn (default: episodes without it)")
  p.add_argument("--kinds", default="plain,trusting,resolve,resolve_ctx,correction", help="SFT kinds, or 'none'")
  p.add_argument("--reorder", action="store_true")
  p.add_argument("--maxres", type=int, default=2)
  p.add_argument("--cot", action="store_true")
  p.add_argument("--freeze", action="store_true")
  p.add_argument("--embinit", type=float, default=0.02)
  p.add_argument("--drills", type=int, default=0)
  p.add_argument("--drill-lines", type=int, default=5, help="POI lines per drill (look-ups: min(3, lines))")
  p.add_argument("--final-norm", type=float, default=1.0,
                 help="init the final RMSNorm weight to this (a larger logit scale for the tied embeddings)")
  p.add_argument("--labelled", action="store_true", help="direction stops as 'Name lon,lat' strings")
  p.add_argument("--log-every", type=int, default=100)
  p.add_argument("--name-type-init", type=float, default=0.0,
                 help="add this times one shared random unit direction to every place-name token's embedding")
  p.add_argument("--name-drills", type=int, default=0,
                 help="first-turn drills: train requests with other places' names, searched in order")
  p.add_argument("--kv-heads", type=int, default=1)
  p.add_argument("--mode-type-init", type=float, default=0.0,
                 help="add this times one shared random unit direction to the request's travel-verb tokens")
  p.add_argument("--qk", type=float, default=2.0, help="initial q/k RMSNorm weight (sft.sharpen_qk_norm)")
  p.add_argument("--wcopy", type=float, default=1.0)
  p.add_argument("--number-type-init", type=float, default=0.0,
                 help="add this times one shared random unit direction to every number token's embedding at init")
  p.add_argument("--worlds", type=int, default=0, help="extra practice worlds (other seeds) in the SFT data")
  p.add_argument("--init", default=None, help="start from this checkpoint dir (model + tokenizer; --pattern, "
                 "--vocab and the size flags are then ignored) instead of a fresh model: stages of a curriculum")
  p.add_argument("--save", default=None, help="save the trained model + tokenizer here (HF format)")
  p.add_argument("--out", default=os.path.join(ROOT, "runs", "tiny_policy_probe"))
  return p.parse_args(argv)


def patch_variants(args: argparse.Namespace) -> None:
  """Applies the data-format variants by replacing module attributes in this process."""
  import rti_jax.envs.navigation.agents as agents
  import rti_jax.envs.navigation.tools as tools
  import rti_jax.policy.tokenizer as tokenizer
  from rti_jax.envs.tool_calls import ToolCall
  from rti_jax.policy import sft_data

  if PATTERNS[args.pattern] is not None:
    tokenizer.PRE_TOKENIZER_PATTERN = PATTERNS[args.pattern]
  if not (args.reorder or args.cot or args.labelled):
    return
  stash: dict[str, str] = {}

  def direction_call(task: Any, chosen: dict[str, Any]) -> ToolCall:
    locs = [chosen[s.name].location for s in task.stops]
    if args.labelled:  # each stop as "Name lon,lat": the coordinate follows its place's name, as in a result line
      locs = [f"{chosen[s.name].name} {chosen[s.name].location}" for s in task.stops]
    if args.cot:
      stash["route"] = "Route: " + "; ".join(f"{s.name} {chosen[s.name].location}" for s in task.stops) + "."
    return agents.direction_call(locs, task.mode)

  agents._direction_call = direction_call
  sft_data._direction_call = direction_call
  if args.cot:
    def format_poi(index: int, poi: Any, distance_m: float | None = None, terse: bool = False) -> str:
      line = f"{index}. name {poi.name} {poi.location}; city {poi.city}; type {poi.type}"
      return line + (f"; distance {int(round(distance_m))} m" if distance_m is not None else "")

    tools.format_poi = format_poi
    agents._POI_LINE = re.compile(r"^\d+\. name (?P<name>[^;]+?) (?P<loc>-?[\d.]+,-?[\d.]+); city (?P<city>[^;]+);")
    plain_render = agents.render_turn

    def render_turn(text: str, calls: list[ToolCall]) -> str:
      if text == agents.PLAN_NOW and "route" in stash:
        text = stash.pop("route")
      return plain_render(text, calls)

    agents.render_turn = render_turn
    sft_data.render_turn = render_turn


def name_drills(tasks: list[Any], world: Any, fmt: Any, n: int, seed: int = 6) -> list[Any]:
  """First-turn drills: a train task's request with its stop names swapped for other places of the
  map, and the first turn that searches each stop in order (only that turn is trained)."""
  from rti_jax.envs.navigation.agents import SEARCH_FIRST, render_turn
  from rti_jax.envs.tool_calls import ToolCall
  from rti_jax.policy.sft_data import SFTExample, swap_names

  rng = np.random.default_rng(seed)
  names = sorted({p.name for p in world.pois})
  plain = [t for t in tasks if not any(s.hinted for s in t.stops)]
  out = []
  while len(out) < n:
    task = plain[int(rng.integers(len(plain)))]
    new = [str(x) for x in rng.choice(names, size=len(task.stops), replace=False)]
    swapped = swap_names([task.query], [s.name for s in task.stops], new)
    if swapped is None:
      continue
    query = swapped[0]
    turn = render_turn(SEARCH_FIRST, [ToolCall("poi_search", {"address": x}) for x in new])
    prompt = fmt.tokenizer.apply_chat_template([{"role": "user", "content": query}], tokenize=False,
                                               add_generation_prompt=True)
    p_ids = fmt.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    t_ids = fmt.tokenizer(turn + "<|im_end|>", add_special_tokens=False)["input_ids"]
    out.append(SFTExample("name_drill", "plain", tuple(p_ids + t_ids), tuple([False] * len(p_ids) + [True] * len(t_ids))))
  return out


def drills(world: Any, fmt: Any, n: int, lines: int = 5, seed: int = 5) -> list[Any]:
  """Associative-recall drills over the map's POIs (no task): ``lines`` lines, up to 3 look-ups, coordinates trained."""
  from rti_jax.policy.sft_data import SFTExample

  rng = np.random.default_rng(seed)
  enc = lambda s: fmt.tokenizer(s)["input_ids"]  # noqa: E731
  head, mid = enc("<|im_start|>user\n"), enc("<|im_end|>\n<|im_start|>assistant\nRoute: ")
  pois, out = world.pois, []
  for _ in range(n):
    pick = rng.choice(len(pois), size=lines, replace=False)
    ctx = "\n".join(f"{i + 1}. name {pois[j].name} {pois[j].location}; city {pois[j].city}" for i, j in enumerate(pick))
    ids = head + enc(ctx) + mid
    mask = [False] * len(ids)
    for j in rng.permutation(pick)[:3]:
      # the name, then its coordinate: tokenized together as in a tool result line (with pattern names2
      # the name token takes the space); everything after the name's first token is trained
      pair = enc(pois[j].name + " " + pois[j].location + "; ")
      ids, mask = ids + pair, mask + [False] + [True] * (len(pair) - 1)
    out.append(SFTExample("drill", "plain", tuple(ids), tuple(mask)))
  return out


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  patch_variants(args)
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  from models.qwen import Qwen
  from rti_jax.envs import navigation as nav
  from rti_jax.policy import sft, sft_data
  from rti_jax.policy import tokenizer as T
  from rti_jax.rollout import ChatFormatter

  t0 = time.time()
  bench = nav.load_benchmark("tiny", max_results=args.maxres)
  env = nav.NavigationEnv(bench.world)
  train, held = bench.train[:560], bench.train[560:]
  worlds = [nav.load_benchmark("tiny", max_results=args.maxres, seed=100 + i) for i in range(args.worlds)]
  corpus = sft_data.corpus_texts(train, env) + list(nav.vocabulary())
  # every POI's name and coordinate (world data, no task): each coordinate is one token in every pattern
  corpus += [f"name {p.name} {p.location};" for p in bench.world.pois] * 2
  for w in worlds:
    corpus += sft_data.corpus_texts(w.train[:50], nav.NavigationEnv(w.world))
  if args.init:
    from models.weights import from_pretrained
    from transformers import AutoTokenizer

    model, mcfg = from_pretrained(args.init)
    tok = AutoTokenizer.from_pretrained(args.init, local_files_only=True)
  else:
    tok = T.build_tokenizer(corpus, args.vocab)
  fmt = ChatFormatter(tok)
  kinds = set(args.kinds.split(","))

  def examples(tasks: list[Any], e: Any, seed: int) -> list[Any]:
    out = [x for x in sft_data.build_examples(tasks, e, fmt, sft_data.MixConfig(seed=seed)) if x.kind in kinds]
    return out if args.system else [sft_data.without_system_turn(fmt, x) for x in out]

  data = examples(train, env, 0)
  for i, w in enumerate(worlds):
    data += examples(w.train + w.test, nav.NavigationEnv(w.world), i + 1)
  held_out = [x for x in examples(held, env, 99) if len(x.token_ids) <= 1024][:40]
  if args.drills:
    data += drills(bench.world, fmt, args.drills, args.drill_lines)
  if args.name_drills:
    data += name_drills(train, bench.world, fmt, args.name_drills)
  if not data:
    raise SystemExit("no SFT data: pass --kinds or --drills")
  pad, eos = tok.convert_tokens_to_ids(T.PAD_TOKEN), tok.convert_tokens_to_ids(T.END_OF_TURN)
  if not args.init:
    mcfg = sft.tiny_qwen3_config(len(tok), hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                                 num_kv_heads=args.kv_heads, head_dim=args.head_dim, intermediate_size=2 * args.hidden,
                                 pad_token_id=pad, eos_token_id=eos)
    model = Qwen(mcfg, rngs=nnx.Rngs(0))
    sft.sharpen_qk_norm(model, args.qk)
  if args.embinit != 0.02:
    sft.scale_embeddings(model, args.embinit, args.final_norm, seed=1)
  elif args.final_norm != 1.0:
    model.norm.scale.set_value(jnp.full(model.norm.scale.shape, args.final_norm, model.norm.scale.dtype))

  def add_type_direction(pattern: str, scale: float, seed: int) -> None:
    """``sft.add_type_direction`` on every token matching ``pattern``."""
    vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
    sft.add_type_direction(model, [i for i, t in enumerate(vocab) if re.fullmatch(pattern, t)], scale, seed=seed)

  if args.number_type_init:
    add_type_direction(NUMBER_TOKEN, args.number_type_init, 7)
  if args.name_type_init:
    add_type_direction(PLACE_NAME_TOKEN, args.name_type_init, 8)
  if args.mode_type_init:
    from rti_jax.envs.navigation.words import MODE_VERBS
    add_type_direction("|".join(MODE_VERBS.values()), args.mode_type_init, 9)
  if args.freeze:
    def frozen_optimizer(m: Qwen, cfg: sft.SFTConfig, total: int) -> nnx.Optimizer:
      is_embed = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731
          lambda path, _: any(getattr(k, "key", getattr(k, "name", None)) == "embed" for k in path), params)
      tx = optax.chain(sft.make_tx(cfg, total), optax.masked(optax.set_to_zero(), is_embed))
      return nnx.Optimizer(m, tx, wrt=nnx.Param)

    sft.make_optimizer = frozen_optimizer
  if args.wcopy != 1.0:
    vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
    heavy = {i for i, t in enumerate(vocab) if re.fullmatch(NUMBER_TOKEN, t) or re.fullmatch(NAME_TOKEN, t)}
    data = [dataclasses.replace(x, loss_mask=tuple((args.wcopy if t in heavy else 1.0) if m else 0.0
                                                   for t, m in zip(x.token_ids, x.loss_mask))) for x in data]
  base = sft.SFTConfig(tokens_per_batch=args.tokens_per_batch, lr=args.lr)
  per_epoch = len(sft.make_batches(data, base, np.random.default_rng(0), pad, sft.common_prefix_len(data)))
  cfg = dataclasses.replace(base, epochs=args.steps / per_epoch)
  print(f"data: {len(data)} sequences, {per_epoch} batches/epoch; model {sft.count_params(model)} params", flush=True)
  res = sft.train(model, data, cfg, pad, log=lambda s: print(s, flush=True), log_every=args.log_every)

  sums = {k: [0.0, 0] for k in ("name", "num", "numtext", "other", "loc_route", "loc_call")}
  hits = {"loc_route": [0, 0], "loc_call": [0, 0], "name_search": [0, 0], "name_after_results": [0, 0], "mode": [0, 0]}
  from rti_jax.envs.navigation.words import MODES
  modes = set(MODES)
  for x in held_out:
    n = len(x.token_ids)
    ids = jnp.asarray([list(x.token_ids) + [pad] * (1024 - n)])
    attn = jnp.asarray([[1] * n + [0] * (1024 - n)])
    logp = jax.nn.log_softmax(model(ids, attn)[0, :n - 1].astype(jnp.float32), -1)
    nll = -np.asarray(jnp.take_along_axis(logp, ids[0, 1:n, None], -1)[:, 0])
    toks = tok.convert_ids_to_tokens(list(x.token_ids))
    inside = False
    a0 = toks.index("assistant") if "assistant" in toks else 0
    first_result = next((i for i in range(a0, n) if toks[i] == "<tool_response>"), n)
    for t in range(n - 1):
      s = toks[t + 1]
      inside = True if s == "<tool_call>" else False if s == "</tool_call>" else inside
      if not x.loss_mask[t + 1]:
        continue
      c = ("num" if inside else "numtext") if re.fullmatch(NUMBER_TOKEN, s) else (
          "name" if re.fullmatch(NAME_TOKEN, s) else "other")
      sums[c][0] += float(nll[t])
      sums[c][1] += 1
      if re.fullmatch(NAME_TOKEN, s) and s not in ("I", "Now", "Your", "It", "Route"):
        # a name the first turn copies from the query (a search), or one written after results arrived
        c = "name_search" if t + 1 < first_result else "name_after_results"
        hits[c][0] += int(int(jnp.argmax(logp[t])) == int(x.token_ids[t + 1]))
        hits[c][1] += 1
      if s in modes and toks[t].startswith('":'):  # the direction call's travel mode
        hits["mode"][0] += int(int(jnp.argmax(logp[t])) == int(x.token_ids[t + 1]))
        hits["mode"][1] += 1
      if re.fullmatch(LOC_TOKEN, s):  # a whole coordinate: its NLL and whether argmax copies it
        c = "loc_call" if inside else "loc_route"
        sums[c][0] += float(nll[t])
        sums[c][1] += 1
        hits[c][0] += int(int(jnp.argmax(logp[t])) == int(x.token_ids[t + 1]))
        hits[c][1] += 1
  nll_by_class = {k: (v[0] / v[1] if v[1] else None) for k, v in sums.items()}
  accuracy = {k: (v[0] / v[1] if v[1] else None) for k, v in hits.items()}
  result = {"args": vars(args), "copy_accuracy": accuracy, "final_train_loss": float(np.mean(res.losses[-20:])),
            "held_out_nll": nll_by_class,
            "sft_wall_s": res.wall_s, "wall_s": time.time() - t0}
  if args.save:
    from models.weights import save_pretrained

    save_pretrained(model, mcfg, args.save)
    tok.save_pretrained(args.save)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "result.json"), "w") as f:
    json.dump(result, f, indent=1)
  print("held-out NLL per token class: " + ", ".join(
      f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in nll_by_class.items()))
  print("argmax copies a whole coordinate: " + ", ".join(
      f"{k} {v:.2f} of {hits[k][1]}" if v is not None else f"{k} -" for k, v in accuracy.items()))
  print(f"final train loss {result['final_train_loss']:.4f}; wall {result['wall_s']:.0f}s; wrote {args.out}/result.json")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
