"""The embedded tiny base policy for Navigation (issue 6, item 4).

* ``tokenizer``: byte-level BPE trained on train-split transcripts and the Qwen-style
  chat template (``build_tokenizer``, ``CHAT_TEMPLATE``).
* ``sft_data``: scripted trajectories -> token sequences laid out like rollouts, the SFT
  mix that shapes the policy (``build_examples``, ``MixConfig``, ``TrustingAgent``).
* ``sft``: the tiny Qwen3 config and the SFT loop (``tiny_qwen3_config``, ``train``).
* ``evaluate``: behaviour with the real sampler and intervention pipeline.

The shipped checkpoint is ``policies/navigation_tiny`` (``DEFAULT_POLICY_DIR``), rebuilt by
``python experiments/run.py --exp=navigation_sft``.
"""

from __future__ import annotations

import pathlib

DEFAULT_POLICY_DIR = pathlib.Path(__file__).resolve().parents[2] / "policies" / "navigation_tiny"

__all__ = ["DEFAULT_POLICY_DIR"]
