"""RTI objective library: pure, jit-able JAX loss math (paper Eq. 1-7) and the baselines.

``from rti_jax.objectives import rti_loss, grpo_loss, group_advantages, ...``. See ``core``
(GRPO/RTI, Eq. 1-7), ``baselines`` (GSPO, LUFFY, OPD, AEPO) and ``batch`` (``RTIBatch``,
``LossConfig`` and the ``LOSSES`` registry).
"""

from rti_jax.objectives.baselines import (aepo_advantages, aepo_loss, aepo_token_loss, entropy_zscore, gspo_loss,
                                          gspo_token_loss, luffy_loss, luffy_token_loss,
                                          opd_advantages)
from rti_jax.objectives.batch import (INTERVENED_OLD_LOGP, LOSSES, LossConfig, LossFn, LossParts, RTIBatch, assemble_batch,
                                      combine_chunk_metrics, get_loss, length_chunks, loss_from_batch,
                                      trained_width, with_trained_positions, without_empty_intervention)
from rti_jax.objectives.core import (AGG_MODES, ADVANTAGE_STDS, KL_KINDS, LOG_RATIO_CLAMP,
                                     aggregate, aggregate_parts, calibration_weights,
                                     clipped_surrogate, group_advantages, grpo_loss,
                                     grpo_token_loss, kl_penalty, next_token_logprobs, ppl_gate,
                                     rti_loss, rti_token_loss, sequence_perplexity,
                                     token_logprobs)

__all__ = [
    "ADVANTAGE_STDS", "AGG_MODES", "INTERVENED_OLD_LOGP", "KL_KINDS", "LOG_RATIO_CLAMP", "LOSSES", "LossConfig", "LossFn",
    "LossParts", "RTIBatch", "aepo_advantages", "assemble_batch", "combine_chunk_metrics", "length_chunks", "trained_width", "with_trained_positions",
    "without_empty_intervention", "aepo_loss", "aepo_token_loss", "aggregate",
    "aggregate_parts", "calibration_weights", "clipped_surrogate", "entropy_zscore", "get_loss", "group_advantages",
    "grpo_loss", "grpo_token_loss", "gspo_loss", "gspo_token_loss", "kl_penalty",
    "loss_from_batch", "luffy_loss", "luffy_token_loss", "next_token_logprobs", "opd_advantages",
    "ppl_gate", "rti_loss", "rti_token_loss", "sequence_perplexity", "token_logprobs",
]
