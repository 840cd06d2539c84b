"""Qwen2 / Qwen3 in Flax NNX: HF checkpoints in and out, a KV-cache sampler and scoring.

Tokenizer and chat-template helpers live in ``models.chat`` (imported on demand: it pulls in
transformers).
"""

from models.config import SUPPORTED_ARCHITECTURES, QwenConfig, UnsupportedModelError
from models.qwen import Qwen
from models.sampler import GenerateOutput, Sampler, generate, score
from models.weights import from_pretrained, save_pretrained

__all__ = [
  "SUPPORTED_ARCHITECTURES", "QwenConfig", "UnsupportedModelError", "Qwen",
  "from_pretrained", "save_pretrained", "Sampler", "GenerateOutput", "generate", "score",
]
