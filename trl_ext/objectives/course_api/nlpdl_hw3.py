"""NLPDL HW3's function API (HW3, Problems 3-8), where it differs from CS336's (`trl_ext.objectives.course_api`).

One name differs: Problem 3's interface spells the last parameter of `compute_group_normalized_rewards`
`normalized_by_std`, while its own docstring and its course's tests (`tests/test_grpo.py`, `tests/adapters.py`)
spell it `normalize_by_std`. The function here takes either keyword (exactly one). Everything else of Problems 4-8
is CS336's and re-exported: `compute_naive_policy_gradient_loss`, `compute_grpo_clip_loss`,
`compute_policy_gradient_loss` (which also reads the course's `"GRPO-No-Clip"` and `"GRPO-Clip"`), `masked_mean`
(one mean over the masked elements along `dim`), `masked_normalize` (also `constant_normalizer=`, the name in the
assignment's length-normalisation example) and `grpo_microbatch_train_step`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from trl_ext.objectives.course_api.losses import compute_group_normalized_rewards as _cs336_group_normalized_rewards
from trl_ext.objectives.course_api.losses import (
    compute_grpo_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
)
from trl_ext.objectives.course_api.reductions import masked_normalize
from trl_ext.objectives.course_api.train_steps import grpo_microbatch_train_step
from trl_ext.objectives.reductions import masked_mean

__all__ = [
    "compute_group_normalized_rewards",
    "compute_grpo_clip_loss",
    "compute_naive_policy_gradient_loss",
    "compute_policy_gradient_loss",
    "grpo_microbatch_train_step",
    "masked_mean",
    "masked_normalize",
]


def compute_group_normalized_rewards(
    reward_fn: Callable[[str, Any], dict[str, float] | float],
    rollout_responses: Sequence[str],
    repeated_ground_truths: Sequence[Any],
    group_size: int,
    advantage_eps: float,
    normalized_by_std: bool | None = None,
    *,
    normalize_by_std: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Score every response and normalise the rewards within each group (NLPDL HW3 Problem 3).

    `A_i = (r_i - mean_g r) / (std_g r + advantage_eps)` when normalising by the std (Eq. 28), else
    `A_i = r_i - mean_g r` (Dr.GRPO).

    Args:
        reward_fn: `reward_fn(response, ground_truth) -> {"reward", "format_reward", "answer_reward"}` (or a float).
        rollout_responses: rollout_batch_size = n_prompts * group_size responses, groups contiguous.
        repeated_ground_truths: one ground truth per response (each repeated group_size times).
        group_size: responses per question.
        advantage_eps: added to the group std.
        normalized_by_std: divide by the per-group std (the interface's spelling).
        normalize_by_std: the same switch under the docstring's and the course tests' spelling; give one.

    Returns:
        `(advantages (N,), raw_rewards (N,), metadata)`: metadata `reward_mean`, `reward_std`, `reward_max`,
        `reward_min` and the means of `format_reward` / `answer_reward` when the reward returns them.

    Raises:
        TypeError: both spellings given, or neither.
    """
    if (normalized_by_std is None) == (normalize_by_std is None):
        raise TypeError(
            "compute_group_normalized_rewards takes the std switch as normalized_by_std (NLPDL HW3's signature) or "
            f"normalize_by_std (its docstring and tests), exactly one; got normalized_by_std={normalized_by_std!r}, "
            f"normalize_by_std={normalize_by_std!r}"
        )
    by_std = normalized_by_std if normalize_by_std is None else normalize_by_std
    return _cs336_group_normalized_rewards(
        reward_fn, rollout_responses, repeated_ground_truths, group_size, advantage_eps, by_std
    )
