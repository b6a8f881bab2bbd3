"""Pure tensor math of the GRPO family, split along three independent axes, each a small registry.

    advantage       ADVANTAGES   (advantage_type)        raw | group_mean | group_mean_std | batch_std | rloo | opo |
                                                         reinforce_pp | passk
    per-token loss  PG_LOSSES    (pg_loss_type)          reinforce | grpo_clip | grpo_no_clip | gspo | luspo | cispo |
                                                         sapo | vespo
    reduction       REDUCTIONS   (length_normalization)  masked_mean | masked_normalize | seq_mean_token_sum |
                                                         microbatch_token_mean | token_mean

`aggregation` turns several reward functions into one advantage (TRL's `multi_objective_aggregation`), `objective`
composes the loss with TRL's masks, sampler correction and KL penalty. GRPO is `group_mean_std` + `grpo_clip` +
`masked_mean`; Dr.GRPO (https://arxiv.org/abs/2503.20783) changes two things: `group_mean` and `masked_normalize` by
`max_completion_length`; DAPO (TRL's default) is `group_mean_std` + `grpo_clip` + `token_mean`. The courses' function
API (CS336 A5 names) lives in `course_api` and is re-exported here (its `masked_normalize` also takes the constant as
`constant_normalizer=`, as the courses' length-normalisation example calls it); Assignment 2's and NLPDL HW3's own
names are
`course_api.assignment2_grpo` and `course_api.nlpdl_hw3`.
"""

from trl_ext.objectives.advantages import (
    ADVANTAGE_TYPES,
    ADVANTAGES,
    get_advantage_fn,
    group_normalize,
)
from trl_ext.objectives.aggregation import AGGREGATIONS, MULTI_OBJECTIVE_AGGREGATIONS, compute_advantages
from trl_ext.objectives.course_api import (
    compute_entropy,
    compute_group_normalized_rewards,
    compute_grpo_clip_loss,
    compute_grpo_no_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
    get_response_log_probs,
    grpo_microbatch_train_step,
    masked_mean_drgrpo,
    masked_normalize,
    sft_microbatch_train_step,
    tokenize_prompt_and_output,
)
from trl_ext.objectives.losses import PG_LOSS_TYPES, PG_LOSSES, get_pg_loss, log_importance_weights
from trl_ext.objectives.objective import adaptive_entropy_coef, entropy_bonus, k3_kl, policy_objective
from trl_ext.objectives.reductions import (
    LENGTH_NORMALIZATIONS,
    REDUCTIONS,
    get_reduction,
    masked_mean,
    reduce_loss,
)
from trl_ext.objectives.registry import Registry

__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_TYPES",
    "AGGREGATIONS",
    "LENGTH_NORMALIZATIONS",
    "MULTI_OBJECTIVE_AGGREGATIONS",
    "PG_LOSSES",
    "PG_LOSS_TYPES",
    "REDUCTIONS",
    "Registry",
    "adaptive_entropy_coef",
    "compute_advantages",
    "compute_entropy",
    "compute_group_normalized_rewards",
    "compute_grpo_clip_loss",
    "compute_grpo_no_clip_loss",
    "compute_naive_policy_gradient_loss",
    "compute_policy_gradient_loss",
    "entropy_bonus",
    "get_advantage_fn",
    "get_pg_loss",
    "get_reduction",
    "get_response_log_probs",
    "group_normalize",
    "grpo_microbatch_train_step",
    "k3_kl",
    "log_importance_weights",
    "masked_mean",
    "masked_mean_drgrpo",
    "masked_normalize",
    "policy_objective",
    "reduce_loss",
    "sft_microbatch_train_step",
    "tokenize_prompt_and_output",
]
