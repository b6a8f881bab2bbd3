"""From the rewards of several reward functions `(N, K)` to one advantage per completion `(N,)`.

TRL's `multi_objective_aggregation`, each a registered function:

    sum_then_normalize  r = sum_k w_k r_k, then the advantage axis (`advantage_type`)            (TRL's default)
    normalize_then_sum  z_k = (r_k - mean_g r_k) / (std_g r_k + eps);  s = sum_k w_k z_k;
                        A = (s - mean_batch s) / (std_batch s + eps)                           (GDPO)

GDPO: Group reward-Decoupled Normalization Policy Optimization, https://arxiv.org/abs/2601.05242. A completion that
no function could score (all NaN) stays NaN until the advantage, where it gets 0.
"""

from __future__ import annotations

import torch

from trl_ext.objectives.advantages import ADVANTAGES, _nanstd
from trl_ext.objectives.registry import Registry

AGGREGATIONS = Registry("multi_objective_aggregation")


def _weighted_sum(values: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """`sum_k w_k v_k` ignoring NaN entries, NaN where every entry of a row is NaN. `(N, K)` -> `(N,)`."""
    summed = (values * reward_weights.to(values).unsqueeze(0)).nansum(dim=1)
    return summed.masked_fill(torch.isnan(values).all(dim=1), float("nan"))


@AGGREGATIONS.register("sum_then_normalize")
def sum_then_normalize(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    group_size: int,
    advantage_type: str,
    advantage_eps: float | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weighted sum of the rewards, then the estimator `advantage_type` (given what it declares).

    Args:
        rewards_per_func: `(N, K)`, NaN where a function returned None.
        reward_weights: `(K,)`.
        group_size: completions per prompt.
        advantage_type: a key of `ADVANTAGES`.
        advantage_eps: for the estimators that divide by a std.
        lengths: `(N,)` completion lengths, for the estimators that weigh by length.

    Returns:
        `(N,)` advantages.
    """
    rewards = _weighted_sum(rewards_per_func, reward_weights)
    return ADVANTAGES.call(
        advantage_type, rewards=rewards, group_size=group_size, advantage_eps=advantage_eps, lengths=lengths
    )


@AGGREGATIONS.register("normalize_then_sum")
def normalize_then_sum(
    rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, group_size: int, advantage_eps: float
) -> torch.Tensor:
    """GDPO: each function's rewards normalised within the group, weighted and summed, then whitened over the batch
    (TRL 1.16's `multi_objective_aggregation="normalize_then_sum"`, with `advantage_eps` for its fixed 1e-4).

    Args:
        rewards_per_func: `(N, K)`, NaN where a function returned None.
        reward_weights: `(K,)`.
        group_size: completions per prompt.
        advantage_eps: added to both stds.

    Returns:
        `(N,)` advantages.
    """
    n, k = rewards_per_func.shape
    grouped = rewards_per_func.view(-1, group_size, k)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    if group_size > 1:
        count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
        var = torch.nanmean((grouped - mean) ** 2, dim=1, keepdim=True) * count / (count - 1)
        std = var.masked_fill(count < 2, float("nan")).sqrt()
    else:
        std = torch.zeros_like(mean)
    summed = _weighted_sum(((grouped - mean) / (std + advantage_eps)).view(n, k), reward_weights)
    summed = summed.masked_fill(torch.isnan(rewards_per_func).all(dim=1), float("nan"))
    std_batch = _nanstd(summed) if n > 1 else torch.zeros((), dtype=summed.dtype)
    return torch.nan_to_num((summed - torch.nanmean(summed)) / (std_batch + advantage_eps), nan=0.0)


MULTI_OBJECTIVE_AGGREGATIONS: tuple[str, ...] = AGGREGATIONS.names()


def compute_advantages(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    group_size: int,
    advantage_type: str | None,
    multi_objective_aggregation: str = "sum_then_normalize",
    advantage_eps: float | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages `(N,)` of `N` completions from their per-function rewards `(N, K)`: the aggregation named
    `multi_objective_aggregation`, then (for `sum_then_normalize`) the estimator named `advantage_type`."""
    return AGGREGATIONS.call(
        multi_objective_aggregation,
        rewards_per_func=rewards_per_func,
        reward_weights=reward_weights,
        group_size=group_size,
        advantage_type=advantage_type,
        advantage_eps=advantage_eps,
        lengths=lengths,
    )
