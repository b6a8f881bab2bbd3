"""NLPDL HW3's API (Problems 3-8) where it differs from CS336's: `normalized_by_std` (and `normalize_by_std`, its
docstring's spelling), the `"GRPO-No-Clip"` / `"GRPO-Clip"` loss types, and its starter values against its own
sanity asserts (values typed from the course, section 5.2)."""

from __future__ import annotations

import pytest
import torch

from trl_ext.objectives.course_api import compute_group_normalized_rewards as cs336_group_normalized_rewards
from trl_ext.objectives.course_api.nlpdl_hw3 import (
    compute_group_normalized_rewards,
    compute_grpo_clip_loss,
    compute_policy_gradient_loss,
    grpo_microbatch_train_step,
)

RESPONSES = ["a", "b", "c", "d", "e", "f"]
TRUTHS = ["1"] * 6
SCORES = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0, "e": 1.0, "f": 1.0}


def reward_fn(response, ground_truth):
    r = SCORES[response]
    return {"reward": r, "format_reward": 1.0, "answer_reward": r}


@pytest.mark.parametrize("by_std", [True, False])
def test_normalized_by_std_as_the_interface_spells_it(by_std):
    adv, raw, meta = compute_group_normalized_rewards(reward_fn, RESPONSES, TRUTHS, 3, 1e-6, normalized_by_std=by_std)
    # groups (1, 0, 0) and (1, 1, 1): mean 1/3, unbiased std sqrt(1/3); the second group is all equal -> 0
    if by_std:
        s = (1 / 3) ** 0.5 + 1e-6
        want = [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0.0, 0.0, 0.0]
    else:
        want = [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]
    assert adv.tolist() == pytest.approx(want, abs=1e-6)
    assert raw.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0] and meta["answer_reward_mean"] == pytest.approx(4 / 6)
    # the docstring's spelling and a positional call give the same, and so does CS336's function
    same = compute_group_normalized_rewards(reward_fn, RESPONSES, TRUTHS, 3, 1e-6, normalize_by_std=by_std)[0]
    positional = compute_group_normalized_rewards(reward_fn, RESPONSES, TRUTHS, 3, 1e-6, by_std)[0]
    cs336 = cs336_group_normalized_rewards(reward_fn, RESPONSES, TRUTHS, 3, 1e-6, normalize_by_std=by_std)[0]
    assert torch.equal(same, adv) and torch.equal(positional, adv) and torch.equal(cs336, adv)


def test_both_or_neither_spelling_is_an_error():
    with pytest.raises(TypeError, match="exactly one"):
        compute_group_normalized_rewards(reward_fn, RESPONSES, TRUTHS, 3, 1e-6, True, normalize_by_std=True)
    with pytest.raises(TypeError, match="normalized_by_std .* or normalize_by_std"):
        compute_group_normalized_rewards(reward_fn, RESPONSES, TRUTHS, 3, 1e-6)


def test_grpo_no_clip_and_grpo_clip_as_the_assignment_writes_them():
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    old = torch.zeros(1, 2)
    adv = torch.tensor([[2.0]])
    no_clip, _ = compute_policy_gradient_loss(logp, "GRPO-No-Clip", advantages=adv, old_log_probs=old)
    assert no_clip[0].tolist() == pytest.approx([-3.0, -1.0])  # -ratio * A, unclipped
    clip, _ = compute_policy_gradient_loss(logp, "GRPO-Clip", advantages=adv, old_log_probs=old, cliprange=0.2)
    assert clip[0].tolist() == pytest.approx([-2.4, -1.0])  # -min(ratio A, clip(ratio, 0.8, 1.2) A)
    assert torch.equal(clip, compute_grpo_clip_loss(adv, logp, old, 0.2)[0])
    logp = logp.clone().requires_grad_()
    loss, _ = grpo_microbatch_train_step(logp, torch.ones(1, 2), 1, "GRPO-No-Clip", advantages=adv, old_log_probs=old)
    assert loss.item() == pytest.approx(-2.0)  # masked_mean of (-3, -1)
    with pytest.raises(ValueError, match="GRPO-Clip, GRPO-No-Clip, the courses' spellings"):
        compute_policy_gradient_loss(logp, "GRPO-NoClip", advantages=adv, old_log_probs=old)


def test_starter_values_pass_the_seeds_own_asserts():
    """Section 5.2's starter values and its sanity asserts, as written."""
    rollout_batch_size = 256
    group_size = 8
    train_batch_size = 256
    gradient_accumulation_steps = 128  # microbatch size is 2
    assert train_batch_size % gradient_accumulation_steps == 0
    micro_train_batch_size = train_batch_size // gradient_accumulation_steps
    assert rollout_batch_size % group_size == 0
    n_prompts_per_rollout_batch = rollout_batch_size // group_size
    assert train_batch_size >= group_size
    n_microbatches_per_rollout_batch = rollout_batch_size // micro_train_batch_size
    assert (micro_train_batch_size, n_prompts_per_rollout_batch, n_microbatches_per_rollout_batch) == (2, 32, 128)
