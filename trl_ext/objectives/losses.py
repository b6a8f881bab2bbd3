"""Per-token loss axis: from log-probs, old log-probs and one advantage per sequence to a per-token loss.

`r = exp(logp - old_logp)` is the importance ratio per token, or GSPO's per-sequence `exp(mean_t(logp - old_logp))`
when `importance_sampling_level="sequence"`; `A` is `(B, 1)`; `sg` stops the gradient. Registered under
`pg_loss_type`, each with TRL 1.16's arithmetic where TRL has the loss:

    reinforce     -A logp                                                  (REINFORCE; the courses' naive loss)
    grpo_clip     -min(r A, clip(r, 1 - eps, 1 + eps_high) A), r capped at `delta` if set
                                                                           (PPO / GRPO; INTELLECT-2 two-sided clip)
    grpo_no_clip  -r A                                                     (the courses' GRPO-No-Clip)
    gspo          grpo_clip with the sequence-level ratio                   (GSPO, https://arxiv.org/abs/2507.18071)
    luspo         |y| * gspo, |y| the completion's length in tokens        (LUSPO, https://arxiv.org/abs/2602.05261)
    cispo         -sg(min(r, eps_high)) A logp                             (CISPO, https://arxiv.org/abs/2506.13585)
    sapo          -(4 / tau) sigmoid(tau (r - 1)) A, tau = tau_pos if A > 0 else tau_neg
                                                                           (SAPO, https://arxiv.org/abs/2511.20347)
    vespo         -sg(phi(w)) A logp, phi(w) = e^lam w^k e^(-lam w) on the sequence ratio w
                                                                           (VESPO, https://arxiv.org/abs/2602.10693)

A function declares the inputs it reads as parameters (`old_log_probs` only where the loss uses the sampling policy;
`importance_sampling_ratio` only where the loss folds the vLLM correction in itself, so the caller applies it to the
others). It returns the loss, `(B, T)` or `(B, 1)` for a per-sequence loss, and detached metrics of the same shapes
whose masked means the trainer logs under TRL's names.
"""

from __future__ import annotations

import math

import torch

from trl_ext.objectives.registry import Registry

PG_LOSSES = Registry("pg_loss_type")
Metrics = dict[str, torch.Tensor]


def log_importance_weights(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor, importance_sampling_level: str
) -> torch.Tensor:
    """`log r`: `logp - old_logp` per token `(B, T)`, or its masked mean per sequence `(B, 1)` (GSPO).

    Args:
        log_probs, old_log_probs, mask: `(B, T)`.
        importance_sampling_level: "token" or "sequence".
    """
    log_ratio = log_probs - old_log_probs
    if importance_sampling_level == "token":
        return log_ratio
    if importance_sampling_level == "sequence":
        return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    raise ValueError(f"importance_sampling_level={importance_sampling_level!r}; choose 'token' or 'sequence'")


def _clip_metrics(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float) -> Metrics:
    """TRL's clip fractions: a ratio below 1 - eps with A < 0, or above 1 + eps_high with A > 0."""
    with torch.no_grad():
        is_low = (ratio < 1 - low) & (advantages < 0)
        is_high = (ratio > 1 + high) & (advantages > 0)
        return {
            "clip_ratio/low_mean": is_low.float(),
            "clip_ratio/high_mean": is_high.float(),
            "clip_ratio/region_mean": (is_low | is_high).float(),
        }


def _clipped_surrogate(
    log_weights: torch.Tensor, advantages: torch.Tensor, epsilon: float, epsilon_high: float, delta: float | None
) -> tuple[torch.Tensor, Metrics]:
    coef_1 = torch.exp(log_weights)
    coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    return loss, _clip_metrics(coef_1, advantages, epsilon, epsilon_high)


@PG_LOSSES.register("reinforce")
def reinforce_loss(log_probs: torch.Tensor, advantages: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """`-A * logp`, whose gradient is the REINFORCE estimator (Williams 1992). `(B, T)`, `(B, 1)` -> `(B, T)`."""
    return -advantages * log_probs, {}


@PG_LOSSES.register("grpo_clip")
def grpo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    epsilon_high: float,
    delta: float | None = None,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, Metrics]:
    """Clipped surrogate `-min(r A, clip(r, 1 - eps, 1 + eps_high) A)` (PPO, https://arxiv.org/abs/1707.06347; GRPO).

    Args:
        log_probs, old_log_probs, mask: `(B, T)`.
        advantages: `(B, 1)`.
        epsilon, epsilon_high: the clip range (DAPO's clip-higher when `epsilon_high > epsilon`).
        delta: if set, the unclipped ratio is capped at `delta` (two-sided clip, INTELLECT-2,
            https://arxiv.org/abs/2505.07291), bounding the loss of a negative-advantage token.
        importance_sampling_level: "token" (`(B, T)` loss) or "sequence" (GSPO's ratio, `(B, 1)` loss).

    Returns:
        The loss and TRL's `clip_ratio/{low,high,region}_mean` indicators.
    """
    log_weights = log_importance_weights(log_probs, old_log_probs, mask, importance_sampling_level)
    return _clipped_surrogate(log_weights, advantages, epsilon, epsilon_high, delta)


@PG_LOSSES.register("grpo_no_clip")
def grpo_no_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, Metrics]:
    """Unclipped importance-weighted surrogate `-r A` (the courses' GRPO-No-Clip). Shapes as `grpo_clip_loss`."""
    ratio = torch.exp(log_importance_weights(log_probs, old_log_probs, mask, importance_sampling_level))
    return -ratio * advantages, {}


@PG_LOSSES.register("gspo")
def gspo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    epsilon_high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO: `grpo_clip` with the sequence ratio `s = exp(mean_t(logp - old_logp))`, one loss per sequence `(B, 1)`
    (https://arxiv.org/abs/2507.18071; TRL's `importance_sampling_level="sequence"`)."""
    log_weights = log_importance_weights(log_probs, old_log_probs, mask, "sequence")
    return _clipped_surrogate(log_weights, advantages, epsilon, epsilon_high, delta)


@PG_LOSSES.register("luspo")
def luspo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    epsilon_high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """LUSPO: GSPO's per-sequence loss times the completion length `|y|` `(B, 1)`, removing GSPO's bias toward
    short answers (https://arxiv.org/abs/2602.05261). With `masked_mean` this is the paper's objective; TRL's
    `loss_type="luspo"` instead puts `|y|` in the reduction (`gspo` + `seq_mean_token_sum`)."""
    loss, metrics = gspo_loss(log_probs, old_log_probs, advantages, mask, epsilon, epsilon_high, delta)
    return loss * mask.sum(-1, keepdim=True).to(loss.dtype), metrics


@PG_LOSSES.register("cispo")
def cispo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_high: float,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, Metrics]:
    """CISPO: `-sg(min(r, eps_high)) A logp` clips the importance weight, not the update, so every token keeps a
    gradient (MiniMax-M1, https://arxiv.org/abs/2506.13585; `epsilon_high` is ScaleRL's eps_max, 5.0 there).

    Returns:
        `(B, T)` loss and TRL's `cispo_clip_ratio` indicator (`r > eps_high` with `A > 0`).
    """
    ratio = torch.exp(log_importance_weights(log_probs, old_log_probs, mask, importance_sampling_level))
    loss = -torch.clamp(ratio, max=epsilon_high).detach() * advantages * log_probs
    with torch.no_grad():
        clipped = ((ratio > epsilon_high) & (advantages > 0)).float()
    return loss, {"cispo_clip_ratio": clipped}


@PG_LOSSES.register("sapo")
def sapo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    sapo_temperature_pos: float,
    sapo_temperature_neg: float,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, Metrics]:
    """SAPO: a smooth gate instead of the hard clip, `-(4 / tau) sigmoid(tau (r - 1)) A` with `tau = tau_pos` for
    `A > 0` else `tau_neg` (https://arxiv.org/abs/2511.20347). Its gradient at `r = 1` is the plain `-A dr`."""
    ratio = torch.exp(log_importance_weights(log_probs, old_log_probs, mask, importance_sampling_level))
    temperature = torch.where(
        advantages > 0, ratio.new_tensor(sapo_temperature_pos), ratio.new_tensor(sapo_temperature_neg)
    )
    return -torch.sigmoid(temperature * (ratio - 1)) * 4 / temperature * advantages, {}


@torch.no_grad()
def vespo_gamma_weights(
    advantages: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None,
    k_pos: float,
    lambda_pos: float,
    k_neg: float,
    lambda_neg: float,
) -> torch.Tensor:
    """VESPO's weight `phi(w) = exp(lam + k log w - lam w)` (so `phi(1) = 1`) of the sequence ratio
    `w = exp(sum_t m_t clamp(log r_t, -20, 20))`, times the vLLM ratio when given; `k`, `lam` by the sign of A.

    Args:
        advantages: `(B, 1)`.
        log_ratio: `(B, T)` per-token `logp - old_logp`.
        mask: `(B, T)`.
        importance_sampling_ratio: `(B, T)` sampler correction `pi_old / pi_vllm` or None.
        k_pos, lambda_pos, k_neg, lambda_neg: the Gamma shape for `A >= 0` and `A < 0`.

    Returns:
        `(B, 1)` detached weights (`log w` clamped to `[log 1e-8, 20]`, as TRL; non-finite -> 0).
    """
    low = math.log(1e-8)
    log_w = torch.sum(torch.clamp(log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
    if importance_sampling_ratio is not None:
        log_w = log_w + torch.sum(torch.clamp(torch.log(importance_sampling_ratio), low, 20.0), dim=-1, keepdim=True)
    log_w = torch.clamp(log_w, low, 20.0)
    nonneg = advantages >= 0
    k = torch.where(nonneg, log_w.new_tensor(k_pos), log_w.new_tensor(k_neg))
    lam = torch.where(nonneg, log_w.new_tensor(lambda_pos), log_w.new_tensor(lambda_neg)).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@PG_LOSSES.register("vespo")
def vespo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    vespo_k_pos: float,
    vespo_lambda_pos: float,
    vespo_k_neg: float,
    vespo_lambda_neg: float,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """VESPO: `-sg(phi(w)) A logp`, a smooth asymmetric Gamma weight on the sequence ratio in place of the hard clip
    (https://arxiv.org/abs/2602.10693). The vLLM sampler ratio enters `w` (token-level only), not the loss."""
    phi = vespo_gamma_weights(
        advantages,
        log_probs - old_log_probs,
        mask,
        importance_sampling_ratio,
        vespo_k_pos,
        vespo_lambda_pos,
        vespo_k_neg,
        vespo_lambda_neg,
    )
    return -phi * advantages * log_probs, {"vespo/phi_seq_mean": phi}


PG_LOSS_TYPES: tuple[str, ...] = PG_LOSSES.names()


def get_pg_loss(name: str):
    """The per-token loss registered as `name` (see the module table for what it reads)."""
    return PG_LOSSES.lookup(name)
