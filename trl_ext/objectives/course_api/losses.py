"""The courses' loss, reward and reduction functions (CS336 A5 names and signatures), as thin adapters over the axes.

    no_baseline              -r * logp          (raw rewards; `reinforce` with `raw` advantages)
    reinforce_with_baseline  -A * logp          (`reinforce` with group-normalised advantages)
    grpo_clip                -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)
    grpo_no_clip             -ratio * A

The per-token arithmetic is the axis functions' (`trl_ext.objectives.losses`), so the courses' API and the trainer
cannot disagree; what is added here is the courses' calling convention (`(B, 1)` scores, `cliprange`, metadata).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from trl_ext.objectives.advantages import _check_group_size, group_normalize
from trl_ext.objectives.losses import grpo_clip_loss, grpo_no_clip_loss, reinforce_loss
from trl_ext.objectives.reductions import _masked

Metadata = dict[str, torch.Tensor]


def _as_column(scores: torch.Tensor, name: str) -> torch.Tensor:
    """`(B,)` -> `(B, 1)` so one score per sequence broadcasts over its `T` tokens; `(B, 1)` passes."""
    if scores.dim() == 1:
        return scores.unsqueeze(-1)
    if scores.dim() == 2:
        return scores
    raise ValueError(f"{name} must have shape (B,) or (B, 1), got {tuple(scores.shape)}")


def _clip_bounds(cliprange: float | tuple[float, float]) -> tuple[float, float]:
    low, high = cliprange if isinstance(cliprange, tuple | list) else (cliprange, cliprange)
    if low < 0 or high < 0:
        raise ValueError(f"cliprange must be >= 0, got {cliprange!r}")
    return float(low), float(high)


def compute_naive_policy_gradient_loss(
    raw_rewards_or_advantages: torch.Tensor, policy_log_probs: torch.Tensor
) -> torch.Tensor:
    """Vanilla policy-gradient loss `-A * logp` (its gradient is the REINFORCE estimator).

    Args:
        raw_rewards_or_advantages: `(B, 1)` (or `(B,)`) one score per sequence, constant w.r.t. the policy.
        policy_log_probs: `(B, T)` log-probs of the sampled tokens under the current policy.

    Returns:
        `(B, T)` per-token loss.
    """
    return reinforce_loss(policy_log_probs, _as_column(raw_rewards_or_advantages, "raw_rewards_or_advantages"))[0]


def compute_grpo_clip_loss(
    advantages: torch.Tensor,
    policy_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    cliprange: float | tuple[float, float],
) -> tuple[torch.Tensor, Metadata]:
    """Clipped surrogate `-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`, `ratio = exp(logp - old_logp)`.

    Args:
        advantages: `(B, 1)` (or `(B,)`) one advantage per sequence.
        policy_log_probs: `(B, T)` log-probs under the policy being trained.
        old_log_probs: `(B, T)` log-probs under the policy that sampled the tokens.
        cliprange: `eps`, or `(eps_low, eps_high)` for asymmetric clipping (TRL's `epsilon` / `epsilon_high`).

    Returns:
        `(B, T)` per-token loss and metadata (detached tensors): `clipped` `(B, T)` bool, True where the clipped
        term was strictly smaller than the unclipped one (so the token gets no gradient); `clipped_low` /
        `clipped_high` split it by side (ratio < 1 - eps with A < 0, ratio > 1 + eps with A > 0, TRL's
        `is_low_clipped` / `is_high_clipped`); `ratio` `(B, T)`.
    """
    low, high = _clip_bounds(cliprange)
    advantages = _as_column(advantages, "advantages")
    mask = torch.ones_like(policy_log_probs)
    loss, _ = grpo_clip_loss(policy_log_probs, old_log_probs, advantages, mask, epsilon=low, epsilon_high=high)
    with torch.no_grad():
        ratio = torch.exp(policy_log_probs - old_log_probs)
        clipped = torch.clamp(ratio, 1 - low, 1 + high) * advantages < ratio * advantages
        metadata = {
            "clipped": clipped,
            "clipped_low": clipped & (ratio < 1 - low),
            "clipped_high": clipped & (ratio > 1 + high),
            "ratio": ratio,
        }
    return loss, metadata


def compute_grpo_no_clip_loss(
    advantages: torch.Tensor, policy_log_probs: torch.Tensor, old_log_probs: torch.Tensor
) -> tuple[torch.Tensor, Metadata]:
    """Unclipped importance-weighted surrogate `-ratio * A`, `ratio = exp(logp - old_logp)`.

    Args:
        advantages: `(B, 1)` (or `(B,)`) one advantage per sequence.
        policy_log_probs: `(B, T)` log-probs under the policy being trained.
        old_log_probs: `(B, T)` log-probs under the policy that sampled the tokens.

    Returns:
        `(B, T)` per-token loss and metadata `{"ratio": (B, T)}` (detached).
    """
    mask = torch.ones_like(policy_log_probs)
    loss, _ = grpo_no_clip_loss(policy_log_probs, old_log_probs, _as_column(advantages, "advantages"), mask)
    return loss, {"ratio": torch.exp(policy_log_probs - old_log_probs).detach()}


def _require(loss_type: str, **args: object) -> None:
    missing = [name for name, value in args.items() if value is None]
    if missing:
        raise ValueError(f"loss_type {loss_type!r} needs {', '.join(missing)} (got None)")


def _no_baseline(policy_log_probs, raw_rewards, advantages, old_log_probs, cliprange):
    _require("no_baseline", raw_rewards=raw_rewards)
    return compute_naive_policy_gradient_loss(raw_rewards, policy_log_probs), {}


def _reinforce_with_baseline(policy_log_probs, raw_rewards, advantages, old_log_probs, cliprange):
    _require("reinforce_with_baseline", advantages=advantages)
    return compute_naive_policy_gradient_loss(advantages, policy_log_probs), {}


def _grpo_clip(policy_log_probs, raw_rewards, advantages, old_log_probs, cliprange):
    _require("grpo_clip", advantages=advantages, old_log_probs=old_log_probs, cliprange=cliprange)
    return compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange)


def _grpo_no_clip(policy_log_probs, raw_rewards, advantages, old_log_probs, cliprange):
    _require("grpo_no_clip", advantages=advantages, old_log_probs=old_log_probs)
    return compute_grpo_no_clip_loss(advantages, policy_log_probs, old_log_probs)


COURSE_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, Metadata]]] = {
    "no_baseline": _no_baseline,
    "reinforce_with_baseline": _reinforce_with_baseline,
    "grpo_clip": _grpo_clip,
    "grpo_no_clip": _grpo_no_clip,
}
# How NLPDL HW3 and CS336 A5 write two of them in prose ('use the "GRPO-Clip" loss type', 'a new loss type
# "GRPO-No-Clip"'): accepted as `loss_type` for the same losses.
COURSE_LOSS_SPELLINGS: dict[str, str] = {"GRPO-Clip": "grpo_clip", "GRPO-No-Clip": "grpo_no_clip"}


def compute_policy_gradient_loss(
    policy_log_probs: torch.Tensor,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | tuple[float, float] | None = None,
) -> tuple[torch.Tensor, Metadata]:
    """Dispatch to the courses' per-token loss named `loss_type`.

    Args:
        policy_log_probs: `(B, T)` log-probs under the policy being trained.
        loss_type: `no_baseline` (uses `raw_rewards`), `reinforce_with_baseline` (uses `advantages`),
            `grpo_clip` (uses `advantages`, `old_log_probs`, `cliprange`) or `grpo_no_clip` (uses `advantages`,
            `old_log_probs`); `"GRPO-Clip"` / `"GRPO-No-Clip"` (NLPDL HW3/CS336 A5's spellings) name the last two.
        raw_rewards: `(B, 1)` or `(B,)`.
        advantages: `(B, 1)` or `(B,)`.
        old_log_probs: `(B, T)`.
        cliprange: `eps` or `(eps_low, eps_high)`.

    Returns:
        `(B, T)` per-token loss and the loss's metadata dict (empty for the naive losses).

    Raises:
        ValueError: unknown `loss_type`, or an argument it needs is None (the message names both).
    """
    name = COURSE_LOSS_SPELLINGS.get(loss_type, loss_type)
    if name not in COURSE_LOSSES:
        raise ValueError(
            f"unknown loss_type {loss_type!r}; valid names: {', '.join(COURSE_LOSSES)} (also "
            f"{', '.join(COURSE_LOSS_SPELLINGS)}, the courses' spellings)"
        )
    return COURSE_LOSSES[name](policy_log_probs, raw_rewards, advantages, old_log_probs, cliprange)


def masked_mean_drgrpo(tensor: torch.Tensor, mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Assignment 2's Dr.GRPO reduction: `sum(m * x) / (num_tokens * B)`, a scalar.

    Every unmasked token gets the same weight `1 / (num_tokens * B)`, whatever the length of its sequence.

    Args:
        tensor: `(B, T)`.
        mask: `(B, T)`, 0/1.
        num_tokens: the constant per sequence, usually `max_completion_length`.

    Returns:
        Scalar tensor.
    """
    return _masked(tensor, mask).sum() / (num_tokens * tensor.shape[0])


def compute_group_normalized_rewards(
    reward_fn: Callable[[str, Any], float | dict[str, float]],
    rollout_responses: Sequence[str],
    repeated_ground_truths: Sequence[Any],
    group_size: int,
    advantage_eps: float,
    normalize_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Score every response, then normalise the rewards within each group (the courses' entry point).

    Args:
        reward_fn: `reward_fn(response, ground_truth)` -> a float, or a dict with `"reward"` and optionally
            `"format_reward"` / `"answer_reward"`.
        rollout_responses: N completions, `group_size` contiguous ones per prompt.
        repeated_ground_truths: N ground truths, each repeated `group_size` times to line up with the responses.
        group_size: completions per prompt.
        advantage_eps: added to the group std.
        normalize_by_std: GRPO (`True`) or Dr.GRPO (`False`) advantages, see `group_normalize`.

    Returns:
        `(advantages (N,), raw_rewards (N,), metadata)`, both float32; metadata holds `reward_mean`,
        `reward_std` (unbiased, over all N), `reward_max`, `reward_min` and the means of `format_reward` /
        `answer_reward` when the reward function returns them.
    """
    n = len(rollout_responses)
    if n == 0:
        raise ValueError("rollout_responses is empty")
    if len(repeated_ground_truths) != n:
        raise ValueError(
            f"rollout_responses has {n} items but repeated_ground_truths has {len(repeated_ground_truths)}"
        )
    _check_group_size(n, group_size)
    rewards: list[float] = []
    components: dict[str, list[float]] = {}
    for i, (response, truth) in enumerate(zip(rollout_responses, repeated_ground_truths, strict=True)):
        out = reward_fn(response, truth)
        if isinstance(out, dict):
            if "reward" not in out:
                raise ValueError(f"reward_fn returned a dict without 'reward' for row {i}: keys {sorted(out)}")
            for key in ("format_reward", "answer_reward"):
                if key in out:
                    components.setdefault(key, []).append(float(out[key]))
            out = out["reward"]
        rewards.append(float(out))
    raw_rewards = torch.tensor(rewards, dtype=torch.float32)
    advantages = group_normalize(raw_rewards, group_size, advantage_eps, normalize_by_std)
    metadata = {
        "reward_mean": raw_rewards.mean().item(),
        "reward_std": raw_rewards.std().item() if n > 1 else 0.0,
        "reward_max": raw_rewards.max().item(),
        "reward_min": raw_rewards.min().item(),
    }
    for key, values in components.items():
        metadata[f"{key}_mean"] = sum(values) / len(values)
    return advantages, raw_rewards, metadata
