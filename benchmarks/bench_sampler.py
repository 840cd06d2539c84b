"""Benchmark: our KV-cache sampler and ``score`` vs transformers on the same random Qwen3.

Decode: ``Sampler.generate`` (sampling at temperature 1, no stop ids, exactly ``--new`` tokens
per row) vs ``Qwen3ForCausalLM.generate(do_sample=True)`` with the same batch, left-padded prompt
lengths and new-token count; reported as generated tokens/s.
Score: ``Sampler.score`` (per-token log-probs of the responses) vs a torch forward +
log_softmax + gather on the same right-padded sequences, in two shapes: the batch above
(``--batch`` rows, prompts <= ``--prompt``, ``--new``-token responses) and the PPL gate's shape
(``--gate-batch`` rows of a ``--gate-prompt``-token context and a ``--gate-new``-token step).

Each pair is timed in alternation (ours, theirs, ours, ...; median of ``--iters`` after one
warm-up call each), and the 1-minute load average is printed beside every ratio: on a shared
2-core machine both sides slow down under load, torch's threads more. ``--profile`` adds where
one ``score`` call of the first shape spends its time: host work around the compiled program,
and the program's ops grouped by the model function they come from. ``--json`` writes the
figures. Usage:

  python benchmarks/bench_sampler.py                           # tiny Qwen3
  python benchmarks/bench_sampler.py --size small --iters 5 --profile --json sampler_small.json
"""

from __future__ import annotations

import argparse
import json
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import torch
from bench_common import alternating_medians, load_average, machine
from transformers import Qwen3Config, Qwen3ForCausalLM

import models
from models import scoring
from models.sampler import Sampler

SIZES = {
  # a tiny policy: ~0.9 M parameters (tied embeddings)
  "tiny": dict(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=32),
  # a small one: ~29 M parameters (tied embeddings)
  "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=4, head_dim=64),
}


def torch_score_fn(hf, prompts, responses):
  """A torch forward + log_softmax + gather of each response's ids, right-padded like ours."""
  width = max(len(p) + len(r) for p, r in zip(prompts, responses))
  seq = torch.zeros((len(prompts), width), dtype=torch.long)
  mask = torch.zeros((len(prompts), width), dtype=torch.long)
  for i, (p, r) in enumerate(zip(prompts, responses)):
    seq[i, :len(p) + len(r)] = torch.tensor(p + r)
    mask[i, :len(p) + len(r)] = 1

  def run():
    with torch.no_grad():
      logp = hf(input_ids=seq, attention_mask=mask).logits.float().log_softmax(-1)
      logp[:, :-1].gather(-1, seq[:, 1:, None])
  return run


def profile_score(sampler: Sampler, prompts, responses, iters: int) -> dict:
  """Host time around the compiled program, and the program's op time by model function."""
  import collections
  import glob
  import gzip
  import os
  import re

  p_rows = [np.asarray(p, np.int32) for p in prompts]
  r_rows = [np.asarray(r, np.int32) for r in responses]
  ids, mask, starts, width = scoring.pack_rows(p_rows, r_rows)
  args = (sampler.graphdef, sampler.state, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(starts))
  program = lambda: scoring.score_jit(*args, width=width, mesh=sampler.mesh).block_until_ready()  # noqa: E731
  t = alternating_medians({"call": lambda: sampler.score(prompts, responses), "program": program}, iters)
  text = scoring.score_jit.lower(*args, width=width, mesh=sampler.mesh).compile().as_text()
  table = lambda name: dict(re.findall(r"^(\d+) (.*)$", text.split(name + "\n", 1)[1].split("\n\n", 1)[0], re.M))  # noqa: E731
  functions, locations, frames = table("FunctionNames"), table("FileLocations"), table("StackFrames")

  def where(frame: str) -> str:  # the innermost function of our code the op was traced from
    loc = re.search(r"file_location_id=(\d+)", frames.get(frame, ""))
    fn = re.search(r"function_name_id=(\d+)", locations.get(loc.group(1), "")) if loc else None
    return functions.get(fn.group(1), "?").strip('"') if fn else "?"

  op_where = {name: where(frame) for name, frame in re.findall(r"%(\S+) = .*?stack_frame_id=(\d+)", text)}
  with tempfile.TemporaryDirectory() as d:
    jax.profiler.start_trace(d, create_perfetto_trace=True)
    for _ in range(iters):
      program()
    jax.profiler.stop_trace()
    events = json.load(gzip.open(sorted(glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True))[-1]))
  by_fn: collections.Counter = collections.Counter()
  for e in events["traceEvents"]:
    if e.get("ph") == "X" and e["name"] in op_where:
      by_fn[op_where[e["name"]]] += e["dur"] / 1e6 / iters
  return {"call_s": t["call"], "program_s": t["program"], "host_s": t["call"] - t["program"],
          "op_seconds_by_function": dict(by_fn.most_common())}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--prompt", type=int, default=32)
  ap.add_argument("--new", type=int, default=64)
  ap.add_argument("--gate-batch", type=int, default=8)
  ap.add_argument("--gate-prompt", type=int, default=480)
  ap.add_argument("--gate-new", type=int, default=32)
  ap.add_argument("--iters", type=int, default=9)
  ap.add_argument("--profile", action="store_true", help="also break one score call down (see above)")
  ap.add_argument("--json", default=None, help="write the figures to this file")
  args = ap.parse_args()

  torch.manual_seed(0)
  hf = Qwen3ForCausalLM(Qwen3Config(**SIZES[args.size], tie_word_embeddings=True,
                                    max_position_embeddings=4096)).eval()
  n_params = sum(p.numel() for p in hf.parameters())
  with tempfile.TemporaryDirectory() as d:
    hf.save_pretrained(d)
    model, config = models.from_pretrained(d)
  sampler = Sampler(model)
  rng = np.random.default_rng(0)
  lengths = rng.integers(args.prompt // 2, args.prompt + 1, args.batch)
  lengths[0] = args.prompt
  prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in lengths]
  ids = torch.zeros((args.batch, args.prompt), dtype=torch.long)
  mask = torch.zeros((args.batch, args.prompt), dtype=torch.long)
  for i, p in enumerate(prompts):  # left padding, as generation needs
    ids[i, args.prompt - len(p):] = torch.tensor(p)
    mask[i, args.prompt - len(p):] = 1
  keys = iter(jax.random.split(jax.random.key(0), 2 * args.iters + 2))

  def ours_generate():
    out = sampler.generate(prompts, key=next(keys), max_new_tokens=args.new, temperature=1.0)
    assert all(len(t) == args.new for t in out.tokens)

  def hf_generate():
    with torch.no_grad():
      out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                        temperature=1.0, max_new_tokens=args.new, min_new_tokens=args.new,
                        pad_token_id=0)
    assert out.shape[1] == args.prompt + args.new

  responses = [rng.integers(0, config.vocab_size, args.new).tolist() for _ in prompts]
  gate_prompts = [rng.integers(0, config.vocab_size, args.gate_prompt).tolist() for _ in range(args.gate_batch)]
  gate_steps = [rng.integers(0, config.vocab_size, args.gate_new).tolist() for _ in gate_prompts]
  cases = [
    ("decode", f"{args.batch} rows, prompt <= {args.prompt}, {args.new} new", args.batch * args.new,
     ours_generate, hf_generate),
    ("score", f"{args.batch} rows, prompt <= {args.prompt} + {args.new}", args.batch * args.new,
     lambda: sampler.score(prompts, responses), torch_score_fn(hf, prompts, responses)),
    ("score (gate)", f"{args.gate_batch} rows, {args.gate_prompt} + {args.gate_new}", args.gate_batch * args.gate_new,
     lambda: sampler.score(gate_prompts, gate_steps), torch_score_fn(hf, gate_prompts, gate_steps)),
  ]
  print(f"machine: {machine()}; torch {torch.__version__} ({torch.get_num_threads()} threads)")
  print(f"model: {args.size} Qwen3 ({n_params / 1e6:.2f} M params, fp32), median of {args.iters}, "
        "ours and transformers in alternation")
  print("| what | shape | ours (s) | transformers (s) | ours tok/s | transformers tok/s | speed-up | load avg |")
  print("|---|---|---|---|---|---|---|---|")
  rows = []
  for what, shape, tokens, ours, theirs in cases:
    t = alternating_medians({"ours": ours, "theirs": theirs}, args.iters)
    row = dict(what=what, shape=shape, tokens=tokens, ours_s=t["ours"], transformers_s=t["theirs"],
               speedup=t["theirs"] / t["ours"], load_avg=load_average())
    rows.append(row)
    print(f"| {what} | {shape} | {t['ours']:.3f} | {t['theirs']:.3f} | {tokens / t['ours']:,.0f} | "
          f"{tokens / t['theirs']:,.0f} | {row['speedup']:.2f}x | {row['load_avg']:.2f} |", flush=True)
  out = {"size": args.size, "params": n_params, "machine": machine(), "rows": rows}
  if args.profile:
    prof = profile_score(sampler, prompts, responses, args.iters)
    out["score_profile"] = prof
    ops = sum(prof["op_seconds_by_function"].values())
    print(f"score call {prof['call_s'] * 1e3:.1f} ms = compiled program {prof['program_s'] * 1e3:.1f} ms + host "
          f"{prof['host_s'] * 1e3:.1f} ms (checks, padding, transfer, dispatch); the program's ops by model "
          f"function ({ops * 1e3:.1f} ms of op time over the threads):")
    for fn, s in prof["op_seconds_by_function"].items():
      print(f"  {fn:40s} {s * 1e3:8.2f} ms  {100 * s / ops:5.1f}%")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
