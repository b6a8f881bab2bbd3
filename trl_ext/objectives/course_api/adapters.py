"""The courses' test hooks (`tests/adapters.py`'s `run_*`) mapped onto trl_ext, so their own test suites run on it.

NYU Assignment 3 (and NLPDL HW3, whose homework ships the same file) has students wire their functions into the
course's
`tests/adapters.py` and run its tests (`uv run pytest`). These are the hooks the courses name, with the course's
signatures and keywords, each one call into `trl_ext.objectives.course_api`. To run a course's suite against trl_ext,
from the course's checkout and with trl_ext's Python environment (docs/objectives.md, "The courses' own tests"):

    echo 'from trl_ext.objectives.course_api.adapters import *  # noqa: F401,F403' >> tests/adapters.py
    python -m pytest tests

The appended import replaces exactly the hooks in `__all__` (the eleven the courses name); the course's other stubs
(its optional RLHF / safety part: packed SFT data, batches, MMLU / GSM8K parsing, DPO) stay the course's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trl_ext.objectives.course_api.logprobs import compute_entropy, get_response_log_probs, tokenize_prompt_and_output
from trl_ext.objectives.course_api.losses import (
    compute_group_normalized_rewards,
    compute_grpo_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
)
from trl_ext.objectives.course_api.reductions import masked_normalize
from trl_ext.objectives.course_api.train_steps import grpo_microbatch_train_step, sft_microbatch_train_step
from trl_ext.objectives.reductions import masked_mean

__all__ = [
    "run_compute_entropy",
    "run_compute_group_normalized_rewards",
    "run_compute_grpo_clip_loss",
    "run_compute_naive_policy_gradient_loss",
    "run_compute_policy_gradient_loss",
    "run_get_response_log_probs",
    "run_grpo_microbatch_train_step",
    "run_masked_mean",
    "run_masked_normalize",
    "run_sft_microbatch_train_step",
    "run_tokenize_prompt_and_output",
]

Metadata = dict[str, torch.Tensor]


def run_tokenize_prompt_and_output(prompt_strs: list[str], output_strs: list[str], tokenizer: Any) -> dict:
    """NYU Assignment 3 section 4.2 (`tokenize_prompt_and_output`)."""
    return tokenize_prompt_and_output(prompt_strs, output_strs, tokenizer)


def run_compute_group_normalized_rewards(
    reward_fn: Callable,
    rollout_responses: list[str],
    repeated_ground_truths: list[str],
    group_size: int,
    advantage_eps: float,
    normalize_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """NYU Assignment 3 section 7.2, NLPDL HW3 Problem 3 (`compute_group_normalized_rewards`)."""
    return compute_group_normalized_rewards(
        reward_fn, rollout_responses, repeated_ground_truths, group_size, advantage_eps, normalize_by_std
    )


def run_compute_entropy(logits: torch.Tensor) -> torch.Tensor:
    """NYU Assignment 3 section 4.2 (`compute_entropy`)."""
    return compute_entropy(logits)


def run_get_response_log_probs(
    model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor, return_token_entropy: bool
) -> dict[str, torch.Tensor]:
    """NYU Assignment 3 section 4.2 (`get_response_log_probs`)."""
    return get_response_log_probs(model, input_ids, labels, return_token_entropy=return_token_entropy)


def run_compute_naive_policy_gradient_loss(
    raw_rewards_or_advantages: torch.Tensor, policy_log_probs: torch.Tensor
) -> torch.Tensor:
    """NYU Assignment 3 section 7.2, NLPDL HW3 Problem 4 (`compute_naive_policy_gradient_loss`)."""
    return compute_naive_policy_gradient_loss(raw_rewards_or_advantages, policy_log_probs)


def run_compute_grpo_clip_loss(
    advantages: torch.Tensor, policy_log_probs: torch.Tensor, old_log_probs: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, Metadata]:
    """NYU Assignment 3 section 7.2, NLPDL HW3 Problem 5 (`compute_grpo_clip_loss`)."""
    return compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange)


def run_compute_policy_gradient_loss(
    policy_log_probs: torch.Tensor,
    loss_type: str,
    raw_rewards: torch.Tensor,
    advantages: torch.Tensor,
    old_log_probs: torch.Tensor,
    cliprange: float,
) -> tuple[torch.Tensor, Metadata]:
    """NYU Assignment 3 section 7.2, NLPDL HW3 Problem 6 (`compute_policy_gradient_loss`)."""
    return compute_policy_gradient_loss(
        policy_log_probs,
        loss_type,
        raw_rewards=raw_rewards,
        advantages=advantages,
        old_log_probs=old_log_probs,
        cliprange=cliprange,
    )


def run_masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """NYU Assignment 3 section 7.2, NLPDL HW3 Problem 7 (`masked_mean`: one mean over the masked elements along
    `dim`)."""
    return masked_mean(tensor, mask, dim=dim)


def run_sft_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    normalize_constant: float | None = 1.0,
) -> tuple[torch.Tensor, Metadata]:
    """NYU Assignment 3 section 4.2 (`sft_microbatch_train_step`; calls `backward()`)."""
    return sft_microbatch_train_step(policy_log_probs, response_mask, gradient_accumulation_steps, normalize_constant)


def run_grpo_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | None = None,
) -> tuple[torch.Tensor, Metadata]:
    """NYU Assignment 3 section 7.2, NLPDL HW3 Problem 8 (`grpo_microbatch_train_step`: `masked_mean` per sequence;
    calls
    `backward()`)."""
    return grpo_microbatch_train_step(
        policy_log_probs,
        response_mask,
        gradient_accumulation_steps,
        loss_type,
        raw_rewards=raw_rewards,
        advantages=advantages,
        old_log_probs=old_log_probs,
        cliprange=cliprange,
    )


def run_masked_normalize(
    tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None, normalize_constant: float = 1.0
) -> torch.Tensor:
    """NYU Assignment 3 section 4.2 (`masked_normalize`)."""
    return masked_normalize(tensor, mask, normalize_constant, dim=dim)
