"""The tiny base policies (Navigation, Telecom): their tokenizer, SFT data, SFT loop and checks.

* ``tokenizer``: byte-level BPE trained on train-split transcripts and the Qwen-style
  chat template (``build_tokenizer``, ``CHAT_TEMPLATE``).
* ``sft_example``: one encoded conversation and its trained tokens, for any domain
  (``SFTExample``, ``encode_messages``, ``play``).
* ``sft_data`` / ``sft_swap``: the Navigation SFT mix (``build_examples``, ``MixConfig``,
  ``TrustingAgent``) and its kinds on swapped-name / swapped-stop tasks; ``telecom_sft_data``: the
  Telecom mix.
* ``check_line``: the line a Navigation policy may write after the first search results
  (``CheckedAgent``, ``policy_check_line``).
* ``sft``: the tiny Qwen3 config and the SFT loop (``tiny_qwen3_config``, ``train``).
* ``build_config`` / ``lineage``: the typed configs of the builds (``configs/sft_*.yaml``) and the
  stages of the shipped policies (``policies/LINEAGE.yaml``).
* ``evaluate``: behaviour with the real sampler and intervention pipeline.

The default Navigation policy is ``policies/navigation_base`` (``DEFAULT_POLICY_DIR``); ``python
experiments/run.py --exp=navigation_sft --chain DIR`` rebuilds it from scratch, stage by stage.
"""

from __future__ import annotations

import pathlib

DEFAULT_POLICY_DIR = pathlib.Path(__file__).resolve().parents[2] / "policies" / "navigation_base"

__all__ = ["DEFAULT_POLICY_DIR"]
