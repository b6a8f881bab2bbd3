"""The courses' train steps: one microbatch of SFT or GRPO, its loss, gradient-accumulation scaling and `backward()`.

The loss is divided by `gradient_accumulation_steps` so that the gradients summed over the GA microbatches of one
optimizer step equal the gradient of the mean loss (exactly so for equal-sized microbatches).
"""

from __future__ import annotations

import torch

from trl_ext.objectives.course_api.losses import compute_policy_gradient_loss
from trl_ext.objectives.reductions import masked_mean, masked_normalize, reduce_loss


def _check_ga(gradient_accumulation_steps: int) -> None:
    if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be a positive int, got {gradient_accumulation_steps!r}")


def sft_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    normalize_constant: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SFT negative log-likelihood of the response tokens, scaled for accumulation, with `backward()` called.

    `loss = -mean_b(sum_t m_bt * logp_bt / normalize_constant) / gradient_accumulation_steps`.

    Args:
        policy_log_probs: `(B, T)` log-probs of the labels (requires grad).
        response_mask: `(B, T)`, 1 on response tokens.
        gradient_accumulation_steps: microbatches per optimizer step.
        normalize_constant: divisor of the per-sequence sum (1.0: summed NLL per sequence).

    Returns:
        The scaled scalar loss (already back-propagated) and metadata (detached):
        `nll_per_token` (the unscaled mean NLL over response tokens) and `num_response_tokens`.
    """
    _check_ga(gradient_accumulation_steps)
    loss = -masked_normalize(policy_log_probs, response_mask, normalize_constant, dim=-1).mean()
    loss = loss / gradient_accumulation_steps
    loss.backward()
    with torch.no_grad():
        metadata = {
            "nll_per_token": -masked_mean(policy_log_probs.detach(), response_mask),
            "num_response_tokens": response_mask.sum(),
        }
    return loss, metadata


def grpo_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | tuple[float, float] | None = None,
    length_normalization: str = "masked_mean",
    normalize_constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One GRPO microbatch: per-token loss -> per-sequence reduction -> batch mean -> / GA -> `backward()`.

    `loss = mean_b reduction(compute_policy_gradient_loss(...), response_mask)_b / gradient_accumulation_steps`
    where the reduction is `masked_mean` (GRPO) or `masked_normalize` by `normalize_constant` (Dr.GRPO).

    Args:
        policy_log_probs: `(B, T)` log-probs under the policy being trained (requires grad).
        response_mask: `(B, T)`, 1 on response tokens.
        gradient_accumulation_steps: microbatches per optimizer step.
        loss_type: one of the courses' four (`COURSE_LOSSES`).
        raw_rewards: `(B, 1)` or `(B,)`, for `no_baseline`.
        advantages: `(B, 1)` or `(B,)`, for the other loss types.
        old_log_probs: `(B, T)`, for `grpo_clip` / `grpo_no_clip`.
        cliprange: `eps` or `(eps_low, eps_high)`, for `grpo_clip`.
        length_normalization: one of `LENGTH_NORMALIZATIONS`.
        normalize_constant: `C` of `masked_normalize` (required there).

    Returns:
        The scaled scalar loss (already back-propagated) and metadata (detached): `loss` (unscaled batch loss),
        plus for `grpo_clip` `clip_fraction` (fraction of response tokens whose clipped term was the smaller)
        and the loss function's own tensors.
    """
    _check_ga(gradient_accumulation_steps)
    # Validate the reduction before any backward so a config mistake fails without touching gradients.
    if length_normalization == "masked_normalize" and normalize_constant is None:
        raise ValueError(
            "length_normalization 'masked_normalize' needs normalize_constant (e.g. max_completion_length)"
        )
    per_token_loss, metadata = compute_policy_gradient_loss(
        policy_log_probs,
        loss_type,
        raw_rewards=raw_rewards,
        advantages=advantages,
        old_log_probs=old_log_probs,
        cliprange=cliprange,
    )
    batch_loss = reduce_loss(per_token_loss, response_mask, length_normalization, normalize_constant)
    loss = batch_loss / gradient_accumulation_steps
    loss.backward()
    metadata = dict(metadata)
    metadata["loss"] = batch_loss.detach()
    if "clipped" in metadata:
        metadata["clip_fraction"] = masked_mean(metadata["clipped"].float(), response_mask)
    return loss, metadata
