"""Shared pieces of the trainer and experiment tests: a toy env with text-dependent rewards and
tiny random Qwen3 policies written by transformers."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from rti_jax.envs.base import Environment, StepResult, Transcript

# One update step per rollout batch from the sampler's temperature-1 log-probs: the Navigation
# default (T = 0.8, two epochs, the sampler's behaviour log-probs) with the fewest programs, for
# checks whose subject is something else (a mesh, a process split, one epoch's arithmetic).
ONE_STEP_FROM_SAMPLER = ("optim.epochs=1", "rollout.temperature=1.0", "loss.logp_temperature=1.0",
                         "loss.behaviour_logp=rollout")

WORDS = ["go", "left", "right", "up", "down", "stop", "north", "south", "east", "west"]


class LengthRewardEnv(Environment):
  """One turn; reward 1 iff the reply's length is a multiple of ``modulus`` (non-zero advantages)."""

  max_turns = 1
  modulus = 2

  def reset(self, task):
    self._t = Transcript(task_id=str(task))
    self._t.messages = [{"role": "system", "content": "you move"}, {"role": "user", "content": f"task {task}"}]
    return list(self._t.messages)

  def step(self, assistant_text):
    reward = float(len(assistant_text) % self.modulus == 0)
    self._t.num_turns += 1
    self._t.reward, self._t.done = reward, True
    return StepResult(messages=[], done=True, reward=reward)

  @property
  def transcript(self):
    return self._t

  def tool_schemas(self):
    return []


def write_random_qwen(path, vocab_size: int, seed: int, *, hidden: int = 32, layers: int = 1, heads: int = 2,
                      kv_heads: int = 1, head_dim: int = 16, max_positions: int = 2048,
                      init_std: float = 0.02) -> str:
  """A random tied-embedding Qwen3 checkpoint at ``path`` (returns the path as a string).
  init_std: the weights' initial std (0.02, transformers' default, gives near-uniform next-token
  distributions; around 0.5, peaked ones whose entropies vary from token to token)."""
  torch.manual_seed(seed)
  cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                    tie_word_embeddings=True, max_position_embeddings=max_positions,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e4}, initializer_range=init_std)
  Qwen3ForCausalLM(cfg).save_pretrained(str(path))
  return str(path)
