"""The courses' function API (CS336 A5 names and signatures): tokenisation, log-probs, losses and train steps.

The trainer does not use these; they keep the courses' unit tests and notebooks working, and each loss here is an
adapter over the axis functions of `trl_ext.objectives`, so both compute the same numbers. Everything here is also
importable from `trl_ext.objectives`.

This package follows NYU Assignment 3 and CS336 A5. A course whose names or semantics differ has a module of its own:
`assignment2_grpo` (Assignment 2's `compute_group_normalized_advantages`, `compute_loss`, and a `masked_mean` per
sequence then over the batch; its verifier and reward are `trl_ext.rewards.assignment2_grpo`) and `nlpdl_hw3`
(`normalized_by_std`).
`adapters` maps the courses' `tests/adapters.py` hooks (`run_*`) onto these functions, so the courses' own test
suites run against trl_ext (docs/objectives.md).
"""

from trl_ext.objectives.course_api.logprobs import compute_entropy, get_response_log_probs, tokenize_prompt_and_output
from trl_ext.objectives.course_api.losses import (
    COURSE_LOSS_SPELLINGS,
    COURSE_LOSSES,
    compute_group_normalized_rewards,
    compute_grpo_clip_loss,
    compute_grpo_no_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
    masked_mean_drgrpo,
)
from trl_ext.objectives.course_api.reductions import masked_normalize
from trl_ext.objectives.course_api.train_steps import grpo_microbatch_train_step, sft_microbatch_train_step
from trl_ext.objectives.reductions import masked_mean

__all__ = [
    "COURSE_LOSSES",
    "COURSE_LOSS_SPELLINGS",
    "compute_entropy",
    "compute_group_normalized_rewards",
    "compute_grpo_clip_loss",
    "compute_grpo_no_clip_loss",
    "compute_naive_policy_gradient_loss",
    "compute_policy_gradient_loss",
    "get_response_log_probs",
    "grpo_microbatch_train_step",
    "masked_mean",
    "masked_mean_drgrpo",
    "masked_normalize",
    "sft_microbatch_train_step",
    "tokenize_prompt_and_output",
]
