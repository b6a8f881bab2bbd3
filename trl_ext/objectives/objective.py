"""The per-token objective the trainer minimises: the chosen policy-gradient loss, TRL's token masks and sampler
correction, and the KL penalty, composed in TRL 1.16's order; plus the entropy bonus and its adaptive coefficient.

    l_t = pg_loss_t * off_policy_mask * entropy_mask * is_ratio_t + beta * kl_t
    kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1          (k3 estimator of KL(pi || pi_ref), >= 0)
           times the importance ratio r_t when `use_bias_correction_kl` (DeepSeek-V3.2, https://arxiv.org/abs/2512.02556)

The reduction axis then turns `l` into the micro-batch loss; the entropy bonus subtracts `coef * mean_t H_t`.
"""

from __future__ import annotations

import torch

from trl_ext.objectives.losses import PG_LOSSES, Metrics, log_importance_weights


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token `exp(ref - logp) - (ref - logp) - 1`: Schulman's k3, unbiased for KL(pi || pi_ref), >= 0. `(B, T)`."""
    diff = ref_log_probs - log_probs
    return torch.exp(diff) - diff - 1


def policy_objective(
    pg_loss_type: str,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    importance_sampling_ratio: torch.Tensor | None = None,
    off_policy_mask: torch.Tensor | None = None,
    entropy_mask: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    beta: float = 0.0,
    use_bias_correction_kl: bool = True,
    importance_sampling_level: str = "token",
    **loss_parameters: object,
) -> tuple[torch.Tensor, Metrics]:
    """Per-token loss `(B, T)` (or `(B, 1)` for a per-sequence loss without KL) and its metrics.

    Args:
        pg_loss_type: a key of `PG_LOSSES`.
        log_probs: `(B, T)` under the policy being trained (with gradient).
        old_log_probs: `(B, T)` under the sampling policy (detached; equal to `log_probs` on-policy).
        advantages: `(B, 1)`.
        mask: `(B, T)` loss mask.
        importance_sampling_ratio: `(B, T)` or `(B, 1)` vLLM sampler correction (TRL's
            `importance_sampling_ratio`), multiplied in unless the loss folds it in itself (vespo).
        off_policy_mask: `(B, 1)` 0/1 keep-mask (TRL's `off_policy_mask_threshold`).
        entropy_mask: `(B, T)` 0/1 keep-mask of high-entropy tokens (TRL's `top_entropy_quantile`).
        ref_log_probs: `(B, T)` under the reference model, needed when `beta != 0`.
        beta: KL coefficient.
        use_bias_correction_kl: multiply the KL by the importance ratio (at `importance_sampling_level`).
        importance_sampling_level: "token" or "sequence", for the ratio-based losses and the KL correction.
        **loss_parameters: the loss's own parameters (`epsilon`, `epsilon_high`, `delta`, `sapo_*`, `vespo_*`);
            each loss takes the ones it declares.

    Returns:
        The per-token loss and the loss's metrics, plus `kl` `(B, T)` when `beta != 0`.
    """
    loss, metrics = PG_LOSSES.call(
        pg_loss_type,
        log_probs=log_probs,
        old_log_probs=old_log_probs,
        advantages=advantages,
        mask=mask,
        importance_sampling_ratio=importance_sampling_ratio,
        importance_sampling_level=importance_sampling_level,
        **loss_parameters,
    )
    metrics = dict(metrics)
    if off_policy_mask is not None:
        loss = loss * off_policy_mask
    if entropy_mask is not None:
        loss = loss * entropy_mask
    if importance_sampling_ratio is not None and "importance_sampling_ratio" not in PG_LOSSES.parameters(pg_loss_type):
        loss = loss * importance_sampling_ratio
    if beta != 0.0:
        if ref_log_probs is None:
            raise ValueError(f"beta={beta} needs the reference model's log-probs (ref_log_probs)")
        kl = k3_kl(log_probs, ref_log_probs)
        if use_bias_correction_kl:
            kl = kl * torch.exp(log_importance_weights(log_probs, old_log_probs, mask, importance_sampling_level))
        loss = loss + beta * kl
        metrics["kl"] = kl.detach()
    return loss, metrics


def entropy_bonus(entropies: torch.Tensor, mask: torch.Tensor, accumulation_steps: int = 1) -> torch.Tensor:
    """Mean per-token entropy over the mask, scaled for accumulation: `sum m H / max(sum m, 1) / GA` (TRL's entropy
    bonus, subtracted as `coef * bonus` whatever the reduction). `(B, T)` -> scalar."""
    return (entropies * mask).sum() / mask.sum().clamp(min=1.0) / accumulation_steps


def adaptive_entropy_coef(
    coef: float, entropy: float, target: float, delta: float, coef_min: float, coef_max: float
) -> float:
    """Skywork-OR1's controller (https://arxiv.org/abs/2505.22312): raise the coefficient by `delta` while the
    measured entropy is at or below `target`, lower it otherwise, within `[coef_min, coef_max]`."""
    if entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)
