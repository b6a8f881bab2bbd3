"""Advantage axis: from one scalar reward per completion to one advantage per completion.

Completions come in groups of `group_size` answers to the same prompt, laid out contiguously (TRL's order
`[p0 a0, p0 a1, ..., p1 a0, ...]`). A NaN reward marks a completion no reward function could score (TRL's
convention): it stays out of every statistic and gets advantage 0. Each estimator is registered under its
`advantage_type` and declares what it reads (`advantage_eps`, `lengths`: completion lengths in tokens):

    raw             A_i = r_i                                                  (REINFORCE without a baseline)
    group_mean      A_i = r_i - mean_g                                         (Dr.GRPO, TRL scale_rewards="none")
    group_mean_std  A_i = (r_i - mean_g) / (std_g + eps)                       (GRPO, TRL scale_rewards="group")
    batch_std       A_i = (r_i - mean_g) / (std_batch + eps)                   (TRL scale_rewards="batch")
    rloo            A_i = r_i - mean_{j != i in g} r_j = G/(G-1) (r_i - mean_g) (RLOO, verl "rloo")
    opo             A_i = r_i - sum_g(l_j r_j) / sum_g(l_j)                    (OPO, verl "opo")
    reinforce_pp    c_i = r_i - mean_g;  A_i = (c_i - mean_tok c) / sqrt(var_tok c + eps)
                                                                               (REINFORCE++-baseline, verl)
    passk           A_i = (r_max - r_2nd) / (std_g + eps) for the group's best completion, 0 for the others
                                                                               (pass@k, verl "grpo_passk")

`mean_g` / `std_g` are over the scored completions of a group (std Bessel-corrected, as torch.std, TRL's nanstd and
verl); `_tok` statistics weight each completion by its length in tokens, as verl's `masked_whiten` over response
tokens does. The group-centred estimators give exactly 0 to every member of a group whose scored rewards are all
equal (eight float32 0.1s average to 0.1 - 7.5e-9, which 1 / (std + 1e-6) would blow up to -0.0074).
"""

from __future__ import annotations

import torch

from trl_ext.objectives.registry import Registry

ADVANTAGES = Registry("advantage_type")


def _check_group_size(num: int, group_size: int) -> None:
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if num % group_size != 0:
        raise ValueError(
            f"number of rewards ({num}) is not divisible by group_size ({group_size}); "
            "each prompt needs exactly group_size completions"
        )


def _grouped(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(P, G)` rewards and their `(P, G)` scored mask (not NaN)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    _check_group_size(rewards.numel(), group_size)
    grouped = rewards.view(-1, group_size)
    return grouped, ~torch.isnan(grouped)


def _group_stats(grouped: torch.Tensor, scored: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per group `(P, 1)`: number of scored members, their mean, unbiased std (NaN below 2) and "all equal"."""
    zero = torch.zeros((), dtype=grouped.dtype, device=grouped.device)
    count = scored.sum(dim=1, keepdim=True)
    mean = torch.where(scored, grouped, zero).sum(dim=1, keepdim=True) / count.clamp(min=1)
    squares = torch.where(scored, (grouped - mean) ** 2, zero).sum(dim=1, keepdim=True)
    std = (squares / (count - 1).clamp(min=1)).sqrt().masked_fill(count < 2, float("nan"))
    inf = torch.tensor(float("inf"), dtype=grouped.dtype, device=grouped.device)
    tied = torch.where(scored, grouped, -inf).amax(dim=1, keepdim=True) == torch.where(scored, grouped, inf).amin(
        dim=1, keepdim=True
    )
    return count, mean, std, tied


def _finish(advantages: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """Flatten to `(N,)`; unscorable completions and undefined statistics (one scored member) give 0."""
    return torch.nan_to_num(advantages.masked_fill(~scored, 0.0), nan=0.0).reshape(-1)


def _centred(grouped: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """`r - mean_g`, exactly 0 for every member of an all-equal group. `(P, G)`."""
    _, mean, _, tied = _group_stats(grouped, scored)
    return (grouped - mean).masked_fill(tied, 0.0)


def _nanstd(values: torch.Tensor) -> torch.Tensor:
    """Unbiased std of the non-NaN entries of `values` (all of them), NaN below 2 entries (TRL's `nanstd`)."""
    kept = values[~torch.isnan(values)]
    return kept.std() if kept.numel() > 1 else torch.tensor(float("nan"), dtype=values.dtype, device=values.device)


@ADVANTAGES.register("raw")
def raw_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`A = r`: the reward itself (REINFORCE without a baseline). `rewards`: `(N,)` -> `(N,)`."""
    grouped, scored = _grouped(rewards, group_size)
    return _finish(grouped.clone(), scored)


@ADVANTAGES.register("group_mean")
def group_mean_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`A = r - mean_g` (Dr.GRPO, https://arxiv.org/abs/2503.20783). `rewards`: `(N,)` -> `(N,)`."""
    grouped, scored = _grouped(rewards, group_size)
    return _finish(_centred(grouped, scored), scored)


@ADVANTAGES.register("group_mean_std")
def group_mean_std_advantages(rewards: torch.Tensor, group_size: int, advantage_eps: float) -> torch.Tensor:
    """`A = (r - mean_g) / (std_g + eps)` (GRPO, https://arxiv.org/abs/2402.03300). `(N,)` -> `(N,)`."""
    grouped, scored = _grouped(rewards, group_size)
    _, _, std, _ = _group_stats(grouped, scored)
    return _finish(_centred(grouped, scored) / (std + advantage_eps), scored)


@ADVANTAGES.register("batch_std")
def batch_std_advantages(rewards: torch.Tensor, group_size: int, advantage_eps: float) -> torch.Tensor:
    """`A = (r - mean_g) / (std_batch + eps)`: group baseline, one scale for the batch (TRL `scale_rewards="batch"`,
    PPO-Lite / "Tricks or Traps", https://arxiv.org/abs/2508.08221). `(N,)` -> `(N,)`."""
    grouped, scored = _grouped(rewards, group_size)
    return _finish(_centred(grouped, scored) / (_nanstd(rewards) + advantage_eps), scored)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_g)` over the G scored members of the group
    (REINFORCE Leave-One-Out, https://arxiv.org/abs/2402.14740; verl "rloo"). `(N,)` -> `(N,)`."""
    grouped, scored = _grouped(rewards, group_size)
    count = scored.sum(dim=1, keepdim=True).to(grouped.dtype)
    return _finish(_centred(grouped, scored) * count / (count - 1), scored)


@ADVANTAGES.register("opo")
def opo_advantages(rewards: torch.Tensor, group_size: int, lengths: torch.Tensor) -> torch.Tensor:
    """`A_i = r_i - sum_g(l_j r_j) / sum_g(l_j)`: the length-weighted group baseline of On-Policy RL with Optimal
    reward baseline (https://arxiv.org/abs/2505.23585; verl "opo").

    Args:
        rewards: `(N,)`.
        group_size: completions per prompt.
        lengths: `(N,)` completion lengths in tokens. A group whose scored members are all empty falls back to
            the plain mean.

    Returns:
        `(N,)` advantages.
    """
    grouped, scored = _grouped(rewards, group_size)
    weights = torch.where(scored, lengths.to(grouped.dtype).view_as(grouped), torch.zeros_like(grouped))
    total = weights.sum(dim=1, keepdim=True)
    weighted = torch.where(scored, grouped * weights, torch.zeros_like(grouped)).sum(dim=1, keepdim=True)
    _, mean, _, tied = _group_stats(grouped, scored)
    baseline = torch.where(total > 0, weighted / total.clamp(min=1e-30), mean)
    return _finish((grouped - baseline).masked_fill(tied, 0.0), scored)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(
    rewards: torch.Tensor, group_size: int, advantage_eps: float, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """REINFORCE++ with a group baseline (https://arxiv.org/abs/2501.03262; verl "reinforce_plus_plus_baseline"):
    `c = r - mean_g`, then whitened over the batch's tokens: `A = (c - mean_tok c) / sqrt(var_tok c + eps)`.

    verl whitens the `(B, T)` tensor `c` broadcast over each response's tokens, so a completion weighs its length;
    here that is the weight `l_i`: `mean_tok c = sum l c / sum l`, `var_tok c = sum l (c - mean)^2 / (sum l - 1)`
    (Bessel-corrected over tokens, as verl's `masked_var`). verl's eps is 1e-8 (set `advantage_eps` to match).

    Args:
        rewards: `(N,)`.
        group_size: completions per prompt.
        advantage_eps: added to the variance.
        lengths: `(N,)` completion lengths in tokens; `None` weighs every completion 1.

    Returns:
        `(N,)` advantages.
    """
    grouped, scored = _grouped(rewards, group_size)
    centred = _centred(grouped, scored)
    weights = torch.ones_like(grouped) if lengths is None else lengths.to(grouped.dtype).view_as(grouped)
    weights = torch.where(scored, weights, torch.zeros_like(weights))
    total = weights.sum()
    values = torch.where(scored, centred, torch.zeros_like(centred))
    mean = (weights * values).sum() / total
    var = (weights * (values - mean) ** 2).sum() / (total - 1)
    return _finish((centred - mean) / torch.sqrt(var + advantage_eps), scored)


@ADVANTAGES.register("passk")
def passk_advantages(rewards: torch.Tensor, group_size: int, advantage_eps: float) -> torch.Tensor:
    """Pass@k-optimised advantages (verl "grpo_passk", https://arxiv.org/abs/2503.19595): only the best completion of
    a group is credited, with its margin over the runner-up, `A = (r_max - r_2nd) / (std_g + eps)`; every other
    completion gets 0 (a tie at the top gives 0). As verl with `norm_adv_by_std_in_grpo=True`, its default.
    `rewards`: `(N,)` -> `(N,)`."""
    grouped, scored = _grouped(rewards, group_size)
    count, _, std, _ = _group_stats(grouped, scored)
    if group_size < 2:
        return _finish(torch.zeros_like(grouped), scored)
    top = torch.where(scored, grouped, torch.tensor(float("-inf"), dtype=grouped.dtype)).topk(2, dim=1)
    margin = (top.values[:, :1] - top.values[:, 1:]).masked_fill(count < 2, 0.0)
    best = torch.zeros_like(grouped).scatter(1, top.indices[:, :1], margin / (std + advantage_eps))
    return _finish(best, scored)


ADVANTAGE_TYPES: tuple[str, ...] = ADVANTAGES.names()


def get_advantage_fn(name: str):
    """The advantage estimator registered as `name` (see the module table for its inputs)."""
    return ADVANTAGES.lookup(name)


def group_normalize(
    rewards: torch.Tensor, group_size: int, advantage_eps: float, normalize_by_std: bool
) -> torch.Tensor:
    """Group-relative advantages (the courses' entry point): `group_mean_std` if `normalize_by_std` else `group_mean`.

    Args:
        rewards: `(N,)` one reward per completion, groups contiguous; N must be a multiple of `group_size`.
        group_size: completions per prompt (TRL's `num_generations`).
        advantage_eps: added to the std so an all-equal group gives 0 instead of 0/0.
        normalize_by_std: divide by the group std (GRPO) or not (Dr.GRPO).

    Returns:
        `(N,)` advantages, same dtype as `rewards`.
    """
    if normalize_by_std and group_size < 2:
        raise ValueError("normalize_by_std needs group_size >= 2 (the unbiased std of one sample is undefined)")
    if normalize_by_std:
        return group_mean_std_advantages(rewards, group_size, advantage_eps)
    return group_mean_advantages(rewards, group_size)
