"""Per-token loss axis: from log-probs and one score per sequence to a `(B, T)` loss (lower is better).

    no_baseline              -r * logp                                    (REINFORCE on raw rewards)
    reinforce_with_baseline  -A * logp                                    (A from the advantage axis)
    grpo_clip                -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)   (PPO / GRPO surrogate)
    grpo_no_clip             -ratio * A                                   (the surrogate without the clip)

with `ratio = exp(logp - old_logp)`. The ratio and the clip are computed exactly as TRL 1.16's
`GRPOTrainer._compute_loss` does for `loss_type="grpo"` (`coef_1 = exp(logp - old)`, `coef_2 = clamp(coef_1, ...)`,
`-min(coef_1 * A, coef_2 * A)`), so the two agree bit for bit. Every registered loss has the signature of
`compute_policy_gradient_loss` minus `loss_type`, so a caller can pass all its tensors and let the name choose.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trl_ext.objectives.registry import Registry

PG_LOSSES = Registry("pg_loss_type")
Metadata = dict[str, torch.Tensor]


def _as_column(scores: torch.Tensor, name: str) -> torch.Tensor:
    """`(B,)` -> `(B, 1)` so one score per sequence broadcasts over its `T` tokens; `(B, 1)` / `(B, T)` pass."""
    if scores.dim() == 1:
        return scores.unsqueeze(-1)
    if scores.dim() == 2:
        return scores
    raise ValueError(f"{name} must have shape (B,) or (B, 1), got {tuple(scores.shape)}")


def _clip_bounds(cliprange: float | tuple[float, float]) -> tuple[float, float]:
    if isinstance(cliprange, tuple | list):
        low, high = cliprange
    else:
        low = high = cliprange
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
    return -_as_column(raw_rewards_or_advantages, "raw_rewards_or_advantages") * policy_log_probs


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
    coef_1 = torch.exp(policy_log_probs - old_log_probs)  # (B, T)
    coef_2 = torch.clamp(coef_1, 1 - low, 1 + high)
    per_token_loss1 = coef_1 * advantages
    per_token_loss2 = coef_2 * advantages
    loss = -torch.min(per_token_loss1, per_token_loss2)
    with torch.no_grad():
        clipped = per_token_loss2 < per_token_loss1
        metadata = {
            "clipped": clipped,
            "clipped_low": clipped & (coef_1 < 1 - low),
            "clipped_high": clipped & (coef_1 > 1 + high),
            "ratio": coef_1.detach(),
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
    coef_1 = torch.exp(policy_log_probs - old_log_probs)  # (B, T)
    loss = -(coef_1 * _as_column(advantages, "advantages"))
    return loss, {"ratio": coef_1.detach()}


def _require(loss_type: str, **args: object) -> None:
    missing = [name for name, value in args.items() if value is None]
    if missing:
        raise ValueError(f"loss_type {loss_type!r} needs {', '.join(missing)} (got None)")


@PG_LOSSES.register("no_baseline")
def _no_baseline(policy_log_probs, raw_rewards=None, advantages=None, old_log_probs=None, cliprange=None):
    _require("no_baseline", raw_rewards=raw_rewards)
    return compute_naive_policy_gradient_loss(raw_rewards, policy_log_probs), {}


@PG_LOSSES.register("reinforce_with_baseline")
def _reinforce_with_baseline(policy_log_probs, raw_rewards=None, advantages=None, old_log_probs=None, cliprange=None):
    _require("reinforce_with_baseline", advantages=advantages)
    return compute_naive_policy_gradient_loss(advantages, policy_log_probs), {}


@PG_LOSSES.register("grpo_clip")
def _grpo_clip(policy_log_probs, raw_rewards=None, advantages=None, old_log_probs=None, cliprange=None):
    _require("grpo_clip", advantages=advantages, old_log_probs=old_log_probs, cliprange=cliprange)
    return compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange)


@PG_LOSSES.register("grpo_no_clip")
def _grpo_no_clip(policy_log_probs, raw_rewards=None, advantages=None, old_log_probs=None, cliprange=None):
    _require("grpo_no_clip", advantages=advantages, old_log_probs=old_log_probs)
    return compute_grpo_no_clip_loss(advantages, policy_log_probs, old_log_probs)


PG_LOSS_TYPES: tuple[str, ...] = PG_LOSSES.names()


def get_pg_loss(name: str) -> Callable[..., tuple[torch.Tensor, Metadata]]:
    """The per-token loss registered as `name`; signature as `compute_policy_gradient_loss` without `loss_type`."""
    return PG_LOSSES.lookup(name)


def compute_policy_gradient_loss(
    policy_log_probs: torch.Tensor,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | tuple[float, float] | None = None,
) -> tuple[torch.Tensor, Metadata]:
    """Dispatch to the per-token loss named `loss_type` (one of `PG_LOSS_TYPES`).

    Args:
        policy_log_probs: `(B, T)` log-probs under the policy being trained.
        loss_type: `no_baseline` (uses `raw_rewards`), `reinforce_with_baseline` (uses `advantages`),
            `grpo_clip` (uses `advantages`, `old_log_probs`, `cliprange`) or `grpo_no_clip` (uses `advantages`,
            `old_log_probs`).
        raw_rewards: `(B, 1)` or `(B,)`.
        advantages: `(B, 1)` or `(B,)`.
        old_log_probs: `(B, T)`.
        cliprange: `eps` or `(eps_low, eps_high)`.

    Returns:
        `(B, T)` per-token loss and the loss's metadata dict (empty for the naive losses).

    Raises:
        ValueError: unknown `loss_type`, or an argument it needs is None (the message names both).
    """
    return get_pg_loss(loss_type)(
        policy_log_probs,
        raw_rewards=raw_rewards,
        advantages=advantages,
        old_log_probs=old_log_probs,
        cliprange=cliprange,
    )
