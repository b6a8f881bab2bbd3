"""Pure tensor math of GRPO / Dr.GRPO / SFT, split along three independent axes, each a small registry.

    advantage       ADVANTAGES / get_advantage_fn      no_baseline | group_mean | group_mean_std
    per-token loss  PG_LOSSES / get_pg_loss            no_baseline | reinforce_with_baseline | grpo_clip | grpo_no_clip
    reduction       REDUCTIONS / get_reduction         masked_mean | masked_normalize

GRPO is `group_mean_std` + `grpo_clip` + `masked_mean`; Dr.GRPO (https://arxiv.org/abs/2503.20783) changes two
things: `group_mean` (no std division) and `masked_normalize` by `max_completion_length` (no length bias).
"""

from trl_ext.objectives.advantages import (
    ADVANTAGE_TYPES,
    ADVANTAGES,
    compute_group_normalized_rewards,
    get_advantage_fn,
    group_normalize,
)
from trl_ext.objectives.logprobs import compute_entropy, get_response_log_probs, tokenize_prompt_and_output
from trl_ext.objectives.losses import (
    PG_LOSS_TYPES,
    PG_LOSSES,
    compute_grpo_clip_loss,
    compute_grpo_no_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
    get_pg_loss,
)
from trl_ext.objectives.reductions import (
    LENGTH_NORMALIZATIONS,
    REDUCTIONS,
    get_reduction,
    masked_mean,
    masked_mean_drgrpo,
    masked_normalize,
    reduce_loss,
)
from trl_ext.objectives.registry import Registry
from trl_ext.objectives.train_steps import grpo_microbatch_train_step, sft_microbatch_train_step

__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_TYPES",
    "LENGTH_NORMALIZATIONS",
    "PG_LOSSES",
    "PG_LOSS_TYPES",
    "REDUCTIONS",
    "Registry",
    "compute_entropy",
    "compute_group_normalized_rewards",
    "compute_grpo_clip_loss",
    "compute_grpo_no_clip_loss",
    "compute_naive_policy_gradient_loss",
    "compute_policy_gradient_loss",
    "get_advantage_fn",
    "get_pg_loss",
    "get_reduction",
    "get_response_log_probs",
    "group_normalize",
    "grpo_microbatch_train_step",
    "masked_mean",
    "masked_mean_drgrpo",
    "masked_normalize",
    "reduce_loss",
    "sft_microbatch_train_step",
    "tokenize_prompt_and_output",
]
