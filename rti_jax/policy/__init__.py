"""The embedded tiny base policy for Navigation (issue 6, item 4).

* ``tokenizer``: byte-level BPE trained on train-split transcripts and the Qwen-style
  chat template (``build_tokenizer``, ``CHAT_TEMPLATE``).
* ``sft_data``: scripted trajectories -> token sequences laid out like rollouts, the SFT
  mix that shapes the policy (``build_examples``, ``MixConfig``, ``TrustingAgent``).
* ``sft``: the tiny Qwen3 config and the SFT loop (``tiny_qwen3_config``, ``train``).
* ``evaluate``: behaviour with the real sampler and intervention pipeline.

The default policy is ``policies/navigation_tiny_b11`` (``DEFAULT_POLICY_DIR``, build 11), rebuilt
from scratch by ``python experiments/run.py --exp=navigation_sft --chain DIR``: build 7
(``policies/navigation_tiny``), then builds 9, 10 and 11, each continuing the previous one.
"""

from __future__ import annotations

import pathlib

DEFAULT_POLICY_DIR = pathlib.Path(__file__).resolve().parents[2] / "policies" / "navigation_tiny_b11"

__all__ = ["DEFAULT_POLICY_DIR"]
