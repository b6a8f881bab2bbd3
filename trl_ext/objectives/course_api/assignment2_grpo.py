"""Assignment 2's own function API (GRPO on Countdown, Tasks 3-5), with its names, keywords and semantics.

Assignment 2 names and defines its functions differently from CS336 (`trl_ext.objectives.course_api`, NYU Assignment
3/CS336 A5):

    compute_group_normalized_advantages(rollout_responses, repeated_ground_truths, reward_fn, group_size,
                                        advantage_eps, normalize_by_std)   responses first, reward_fn third;
                                        metadata: mean / std / max / min of the raw rewards, as tensors
    compute_loss(advantages, policy_log_probs, old_log_probs, clip_range)   the clipped surrogate; advantages (B,)
    masked_mean(tensor, mask)              mean over each sequence's response tokens, THEN over the batch: a scalar
                                           (CS336's masked_mean is one mean over all masked elements)
    masked_mean_drgrpo(tensor, mask, num_tokens)   token sum / (num_tokens * B)

The two `masked_mean`s differ exactly where Assignment 2's Task 5 looks: with a 3-token and a 6-token answer,
Assignment 2's gives each token of the short answer 1 / (3 * 2) of the gradient and each of the long one 1 / (6 * 2);
one mean over all 9 masked tokens gives every token 1 / 9, which hides the length bias the task asks about.

The arithmetic is trl_ext's own: `group_normalize` (the advantage axis), `grpo_clip_loss` (the loss axis) and the
`masked_mean` reduction the trainer uses for GRPO (`length_normalization: masked_mean`). Assignment 2's Tasks 1-2 (the
verifier `_extract_answer`, `_validate_numbers`, `_evaluate_equation` and `reward_fn`) are
`trl_ext.rewards.assignment2_grpo`: rewards sit beside objectives, and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from trl_ext.objectives.course_api.losses import (
    compute_group_normalized_rewards,
    compute_grpo_clip_loss,
    masked_mean_drgrpo,
)
from trl_ext.objectives.reductions import masked_mean_reduction

__all__ = ["compute_group_normalized_advantages", "compute_loss", "masked_mean", "masked_mean_drgrpo"]


def compute_group_normalized_advantages(
    rollout_responses: Sequence[str],
    repeated_ground_truths: Sequence[Mapping],
    reward_fn: Callable[[str, Mapping], float],
    group_size: int,
    advantage_eps: float,
    normalize_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Score every response, then normalise the rewards within each group of `group_size` (Assignment 2 Task 3).

    `A_i = (r_i - mean_g r) / (std_g r + advantage_eps)` with `normalize_by_std` (GRPO, Assignment 2's Eq. 1), else
    `A_i = r_i - mean_g r` (Dr.GRPO). `std` is the unbiased sample std, as `torch.std`.

    Args:
        rollout_responses: N = batch_size * group_size generated responses, `group_size` contiguous ones per prompt.
        repeated_ground_truths: N ground truths (e.g. `{"numbers": [...], "target": 36}`), each repeated
            `group_size` times to line up with the responses.
        reward_fn: `reward_fn(response, ground_truth) -> float` (Assignment 2's `reward_fn`:
            `trl_ext.rewards.assignment2_grpo.reward_fn`); a dict with a `"reward"` key is read too.
        group_size: G, responses per question.
        advantage_eps: added to the group std.
        normalize_by_std: True for GRPO, False for Dr.GRPO.

    Returns:
        `(advantages (N,), raw_rewards (N,), metadata)`, float32; metadata `{"mean", "std", "max", "min"}` of the raw
        rewards over all N, each a 0-d tensor (`std` unbiased; 0 when N = 1).
    """
    advantages, raw_rewards, stats = compute_group_normalized_rewards(
        reward_fn, rollout_responses, repeated_ground_truths, group_size, advantage_eps, normalize_by_std
    )
    metadata = {key: torch.tensor(stats[f"reward_{key}"]) for key in ("mean", "std", "max", "min")}
    return advantages, raw_rewards, metadata


def compute_loss(
    advantages: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped surrogate loss (Assignment 2 Task 4).

    `ratio_t = exp(logp_t - old_logp_t)`; `loss_t = -min(A * ratio_t, A * clip(ratio_t, 1 - eps, 1 + eps))`.

    Args:
        advantages: `(B,)` one advantage per response (a `(B, 1)` column is accepted too), broadcast over `T`.
        policy_log_probs: `(B, T)` log-probs of the sampled tokens under the policy being trained.
        old_log_probs: `(B, T)` the same under the policy that sampled them.
        clip_range: `eps`.

    Returns:
        `(B, T)` per-token loss (prompt and padding positions included: mask them in the reduction) and metadata
        (detached): `clipped` `(B, T)` bool (the clipped term was strictly the smaller), `clipped_low`,
        `clipped_high`, `ratio` `(B, T)`.
    """
    return compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, clip_range)


def masked_mean(tensor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sequence's response tokens, then the mean over the batch (Assignment 2 Task 5, GRPO's reduction).

    `sum_b (sum_t m_bt x_bt / n_b) / B`, `n_b = sum_t m_bt`. A sequence without a response token counts as 0 in
    the batch mean (its count is taken as 1, as TRL's `grpo` loss does); the course leaves that case open.

    Args:
        tensor: `(B, T)` per-token loss.
        mask: `(B, T)`, 1 on response tokens, 0 on prompt and padding.

    Returns:
        Scalar loss.
    """
    if tensor.dim() != 2 or mask.shape != tensor.shape:
        raise ValueError(
            f"Assignment 2's masked_mean takes a (B, T) tensor and a mask of the same shape, "
            f"got {tuple(tensor.shape)} and {tuple(mask.shape)}"
        )
    return masked_mean_reduction(tensor, mask)
