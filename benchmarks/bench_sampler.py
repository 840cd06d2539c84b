"""Benchmark: our KV-cache sampler and ``score`` vs transformers on the same tiny Qwen3.

Decode: ``Sampler.generate`` (sampling at temperature 1, no stop ids, exactly
``--new`` tokens per row) vs ``Qwen3ForCausalLM.generate(do_sample=True)`` with the same
batch, left-padded prompt length and new-token count; reported as generated tokens/s.
Score: ``Sampler.score`` (per-token log-probs of the responses) vs a torch forward +
log_softmax + gather on the same sequences. Median of ``--iters`` runs after a warm-up
(compile) call; torch runs with all visible cores. Usage:

  python benchmarks/bench_sampler.py                           # batch 64, prompt 32, new 64
  python benchmarks/bench_sampler.py --batch 8 --size small --iters 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import jax
import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import models
from models.sampler import Sampler

SIZES = {
  # a tiny policy: ~0.9 M parameters (tied embeddings)
  "tiny": dict(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=32),
  # a small one: ~29 M parameters (tied embeddings)
  "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=4, head_dim=64),
}


def machine() -> str:
  cpu = platform.processor() or "unknown cpu"
  try:
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  return (f"{jax.devices()[0].platform} x{len(jax.devices())}; host cpu '{cpu}', "
          f"{os.cpu_count()} logical cores, load avg {load:.1f}; jax {jax.__version__}, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)")


def median_time(fn, iters: int) -> float:
  fn()  # warm-up / compile
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--prompt", type=int, default=32)
  ap.add_argument("--new", type=int, default=64)
  ap.add_argument("--iters", type=int, default=5)
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

  keys = iter(jax.random.split(jax.random.key(0), args.iters + 1))

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
  seq = torch.tensor([p + r + [0] * (args.prompt - len(p)) for p, r in zip(prompts, responses)])
  seq_mask = torch.tensor([[1] * (len(p) + args.new) + [0] * (args.prompt - len(p)) for p in prompts])

  def ours_score():
    sampler.score(prompts, responses)

  def torch_score():
    with torch.no_grad():
      logp = hf(input_ids=seq, attention_mask=seq_mask).logits.float().log_softmax(-1)
      logp[:, :-1].gather(-1, seq[:, 1:, None])

  tokens = args.batch * args.new
  t_ours = median_time(ours_generate, args.iters)
  t_hf = median_time(hf_generate, args.iters)
  s_ours = median_time(ours_score, args.iters)
  s_torch = median_time(torch_score, args.iters)
  print(f"machine: {machine()}")
  print(f"model: {args.size} Qwen3 ({n_params / 1e6:.2f} M params, fp32), batch {args.batch}, "
        f"prompt <= {args.prompt}, new {args.new}, median of {args.iters}")
  print("| what | ours (s) | transformers (s) | ours tok/s | transformers tok/s | speed-up |")
  print("|------|----------|------------------|------------|--------------------|----------|")
  print(f"| decode | {t_ours:.3f} | {t_hf:.3f} | {tokens / t_ours:,.0f} | {tokens / t_hf:,.0f} | "
        f"{t_hf / t_ours:.1f}x |")
  stokens = args.batch * args.new
  print(f"| score | {s_ours:.3f} | {s_torch:.3f} | {stokens / s_ours:,.0f} | {stokens / s_torch:,.0f} | "
        f"{s_torch / s_ours:.1f}x |")


if __name__ == "__main__":
  main()
