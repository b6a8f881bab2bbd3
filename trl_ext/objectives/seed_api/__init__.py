"""The seeds' function API (CS336 A5 names and signatures): tokenisation, log-probs, losses and train steps.

The trainer does not use these; they keep the seeds' unit tests and notebooks working, and each loss here is an
adapter over the axis functions of `trl_ext.objectives`, so both compute the same numbers. Everything is also
importable from `trl_ext.objectives`.
"""

from trl_ext.objectives.seed_api.logprobs import compute_entropy, get_response_log_probs, tokenize_prompt_and_output
from trl_ext.objectives.seed_api.losses import (
    SEED_LOSSES,
    compute_group_normalized_rewards,
    compute_grpo_clip_loss,
    compute_grpo_no_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
    masked_mean_drgrpo,
)
from trl_ext.objectives.seed_api.train_steps import grpo_microbatch_train_step, sft_microbatch_train_step

__all__ = [
    "SEED_LOSSES",
    "compute_entropy",
    "compute_group_normalized_rewards",
    "compute_grpo_clip_loss",
    "compute_grpo_no_clip_loss",
    "compute_naive_policy_gradient_loss",
    "compute_policy_gradient_loss",
    "get_response_log_probs",
    "grpo_microbatch_train_step",
    "masked_mean_drgrpo",
    "sft_microbatch_train_step",
    "tokenize_prompt_and_output",
]
