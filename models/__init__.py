"""Qwen2 / Qwen3 / Qwen3-MoE in Flax NNX: HF checkpoints in and out, a KV-cache sampler, scoring.

Example::

    import jax, models
    from models.chat import load_tokenizer, encode_chat

    model, config = models.from_pretrained("/ckpt/Qwen3-8B", dtype="bfloat16")
    tok = load_tokenizer("/ckpt/Qwen3-8B")
    prompt = encode_chat(tok, [{"role": "user", "content": "Hi"}])
    sampler = models.Sampler(model, max_cache_len=4096)
    out = sampler.generate([prompt], key=jax.random.key(0), max_new_tokens=64,
                           temperature=0.7, stop_token_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    logp = sampler.score([prompt], out.tokens)       # == out.logprobs (fp32)
    models.save_pretrained(model, config, "/out/policy")  # loads in transformers / SGLang / vLLM

Tokenizer and chat-template helpers live in ``models.chat`` (imported on demand: it pulls in
transformers).
"""

from models.config import SUPPORTED_ARCHITECTURES, QwenConfig, UnsupportedModelError
from models.qwen import Qwen
from models.sampler import GenerateOutput, Sampler, generate, score
from models.scoring import next_token_logprobs, response_logprobs
from models.weights import from_pretrained, save_pretrained, save_tokenizer

__all__ = [
  "SUPPORTED_ARCHITECTURES", "QwenConfig", "UnsupportedModelError", "Qwen",
  "from_pretrained", "save_pretrained", "save_tokenizer", "Sampler", "GenerateOutput", "generate", "score",
  "next_token_logprobs", "response_logprobs",
]
