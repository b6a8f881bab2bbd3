"""Advantage axis: from one scalar reward per completion to one advantage per completion.

Completions come in groups of `group_size` answers to the same prompt, laid out contiguously
(`[p0 a0, p0 a1, ..., p1 a0, ...]`, TRL's order). GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300)
centres each reward on its group mean and divides by the group std; Dr.GRPO (Liu et al. 2025,
https://arxiv.org/abs/2503.20783) drops the std division because it up-weights near-uniform groups.

    no_baseline     A_i = r_i
    group_mean      A_i = r_i - mean(r_group)
    group_mean_std  A_i = (r_i - mean(r_group)) / (std(r_group) + advantage_eps)    (std with Bessel's correction)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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


def group_normalize(
    rewards: torch.Tensor, group_size: int, advantage_eps: float, normalize_by_std: bool
) -> torch.Tensor:
    """Group-relative advantages, the tensor core used by the trainer.

    `A = (r - mean_g) / (std_g + advantage_eps)` if `normalize_by_std` else `A = r - mean_g`, where `mean_g` and
    `std_g` (unbiased, as `torch.std`) are taken over the `group_size` contiguous completions of each prompt.

    Args:
        rewards: `(N,)` one reward per completion, groups contiguous; N must be a multiple of `group_size`.
        group_size: completions per prompt (TRL's `num_generations`).
        advantage_eps: added to the std so an all-equal group gives 0 instead of 0/0 (exactly 0: see below).
        normalize_by_std: divide by the group std (GRPO) or not (Dr.GRPO).

    Returns:
        `(N,)` advantages, same dtype as `rewards`.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    _check_group_size(rewards.numel(), group_size)
    if normalize_by_std and group_size < 2:
        raise ValueError("normalize_by_std needs group_size >= 2 (the unbiased std of one sample is undefined)")
    grouped = rewards.view(-1, group_size)  # (N / G, G)
    # An all-equal group has advantage exactly 0. Its float mean can miss the common value by an ulp (eight 0.1s
    # in float32: 7.5e-9), which 1 / (std + 1e-6) would blow up to A = -0.0074 for every member.
    tied = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).masked_fill(tied, 0.0)
    if normalize_by_std:
        centred = centred / (grouped.std(dim=1, keepdim=True) + advantage_eps)
    return centred.reshape(-1)


@ADVANTAGES.register("no_baseline")
def raw_reward_advantages(rewards: torch.Tensor, group_size: int, advantage_eps: float = 1e-6) -> torch.Tensor:
    """`A = r`: the reward itself (REINFORCE without a baseline). `rewards`: `(N,)` -> `(N,)`."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    _check_group_size(rewards.numel(), group_size)
    return rewards.clone()


@ADVANTAGES.register("group_mean")
def group_mean_advantages(rewards: torch.Tensor, group_size: int, advantage_eps: float = 1e-6) -> torch.Tensor:
    """`A = r - mean_g` (Dr.GRPO). `rewards`: `(N,)` -> `(N,)`."""
    return group_normalize(rewards, group_size, advantage_eps, normalize_by_std=False)


@ADVANTAGES.register("group_mean_std")
def group_mean_std_advantages(rewards: torch.Tensor, group_size: int, advantage_eps: float = 1e-6) -> torch.Tensor:
    """`A = (r - mean_g) / (std_g + advantage_eps)` (GRPO). `rewards`: `(N,)` -> `(N,)`."""
    return group_normalize(rewards, group_size, advantage_eps, normalize_by_std=True)


ADVANTAGE_TYPES: tuple[str, ...] = ADVANTAGES.names()


def get_advantage_fn(name: str) -> Callable[..., torch.Tensor]:
    """The advantage function `f(rewards (N,), group_size, advantage_eps) -> (N,)` registered as `name`."""
    return ADVANTAGES.lookup(name)


def compute_group_normalized_rewards(
    reward_fn: Callable[[str, Any], float | dict[str, float]],
    rollout_responses: Sequence[str],
    repeated_ground_truths: Sequence[Any],
    group_size: int,
    advantage_eps: float,
    normalize_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Score every response, then normalise the rewards within each group (the seeds' entry point).

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
