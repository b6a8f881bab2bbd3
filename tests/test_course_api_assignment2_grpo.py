"""Assignment 2's own API (Tasks 1-5) under its names, with the course's asserts and examples as written.

Values are typed from the course (sections 1.1-1.4, Task 5); the rest are computed by hand in the comments. The
semantics that differ from CS336's (`trl_ext.objectives.course_api`) are checked against it, so a test fails if the
two ever become the same function by mistake.
"""

from __future__ import annotations

import math

import pytest
import torch

from trl_ext.objectives import masked_mean as cs336_masked_mean
from trl_ext.objectives.course_api.assignment2_grpo import (
    compute_group_normalized_advantages,
    compute_loss,
    masked_mean,
    masked_mean_drgrpo,
)
from trl_ext.rewards.assignment2_grpo import _evaluate_equation, _extract_answer, _validate_numbers, reward_fn


def test_task1_verifier_asserts_as_the_assignment_writes_them():
    # Example 1: Valid Usage (subset)
    assert _validate_numbers("(64 + 14) - 16", [64, 14, 16, 7]) == True  # noqa: E712 (the course's own comparison)
    # Example 2: Invalid Usage (number used too many times); the course passes the expression unquoted (an int, 21)
    assert _validate_numbers((7 + 7) + 7, [7, 7, 65]) == False  # noqa: E712
    assert _validate_numbers("(7 + 7) + 7", [7, 7, 65]) == False  # noqa: E712 (what it means: 7 three times)
    # Example 3: Invalid Usage (number not available)
    assert _validate_numbers("10 + 9", [10, 8, 2]) == False  # noqa: E712
    assert _evaluate_equation("(65 - 7) - 7") == 51.0


@pytest.mark.parametrize(
    ("equation", "value"),
    [
        ("(65 - 7) - 7", 51.0),
        ("6/(1-3/4)", 24.0),
        ("1/3", 1 / 3),
        ("-2+8", 6.0),  # a unary sign, as eval reads it
        ("2(3)", None),  # implicit multiplication: invalid, as the course says
        ("3 × 4", None),  # a Unicode operator: invalid, as the course says
        ("2**3", None),  # not one of the four operations
        ("1/0", None),
        ("07+1", None),  # a leading zero is not a Python integer
        ("1 +\n2", None),  # a line break: not among the course's characters (and eval raises SyntaxError)
        ("1\t+ 2", None),  # a tab: not a space
        (" 1 + 2 ", 3.0),  # spaces, leading ones included: eval skips them
    ],
)
def test_task1_evaluate_equation(equation, value):
    assert _evaluate_equation(equation) == value


def test_task1_extract_answer_takes_the_last_tag():
    assert _extract_answer("<answer>1 + 2</answer> then <answer> (3 * 4) </answer>") == "(3 * 4)"
    assert _extract_answer("The final answer is 62.") is None


def test_task2_reward_asserts_as_the_assignment_writes_them():
    numbers = [79, 17, 60]
    target = 36
    ground_truth = {"numbers": numbers, "target": target}
    rollout = "...thinking... <answer>(79 - (60 - 17))</answer>"
    assert reward_fn(rollout, ground_truth) == 1.0
    rollout = "...thinking...<answer>(79 + 60) + 17</answer>"
    assert reward_fn(rollout, ground_truth) == 0.1
    rollout = "...thinking...The final answer is 62."
    assert reward_fn(rollout, ground_truth) == 0.0


@pytest.mark.parametrize(
    ("numbers", "target", "expected_output"),
    [
        ([7, 7, 65], 51, "(65 - 7) - 7"),  # section 1.1, Example #1
        ([34, 84, 83, 72], 39, "(72 - 34) + (84 - 83)"),  # Example #2
        ([9, 4, 3, 7], 101, "(9 * (4 * 3)) - 7"),  # Example #3
    ],
)
def test_section_1_1_examples_score_1(numbers, target, expected_output):
    assert reward_fn(f"<answer>{expected_output}</answer>", {"numbers": numbers, "target": target}) == 1.0


def test_task3_group_normalized_advantages_by_hand():
    rewards = {"right": 1.0, "tagged": 0.1, "none": 0.0}
    responses = ["right", "none", "tagged", "tagged"]  # two groups of 2
    truths = [{"numbers": [1, 2], "target": 3}] * 4
    adv, raw, meta = compute_group_normalized_advantages(
        responses, truths, lambda text, truth: rewards[text], group_size=2, advantage_eps=1e-6, normalize_by_std=True
    )
    assert raw.tolist() == pytest.approx([1.0, 0.0, 0.1, 0.1])
    std = math.sqrt(2 * 0.5**2 / 1)  # unbiased std of (1, 0)
    assert adv.tolist() == pytest.approx([0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.0, 0.0], abs=1e-7)
    # metadata: 'mean', 'std', 'max', 'min' of the raw rewards (the course's keys), as tensors
    assert sorted(meta) == ["max", "mean", "min", "std"] and all(torch.is_tensor(v) for v in meta.values())
    mean = 1.2 / 4
    sample_std = math.sqrt(sum((r - mean) ** 2 for r in [1.0, 0.0, 0.1, 0.1]) / 3)
    assert [meta[k].item() for k in ("mean", "std", "max", "min")] == pytest.approx([mean, sample_std, 1.0, 0.0])
    adv, _, _ = compute_group_normalized_advantages(
        responses, truths, lambda text, truth: rewards[text], 2, 1e-6, normalize_by_std=False
    )
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])  # Dr.GRPO: the group mean only


def test_task3_runs_with_the_seeds_reward_fn():
    truth = {"numbers": [79, 17, 60], "target": 36}
    responses = ["<answer>(79 - (60 - 17))</answer>", "<answer>(79 + 60) + 17</answer>", "62", "62"]
    adv, raw, _ = compute_group_normalized_advantages(responses, [truth] * 4, reward_fn, 4, 1e-6, True)
    assert raw.tolist() == pytest.approx([1.0, 0.1, 0.0, 0.0])
    assert adv[0] > adv[1] > adv[2] == adv[3]


def test_task4_compute_loss_by_hand():
    advantages = torch.tensor([2.0, -1.0])  # (B,): one scalar per response, broadcast inside
    old = torch.zeros(2, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5], [1.5, 0.5]]))  # ratios 1.5 and 0.5
    loss, meta = compute_loss(advantages, logp, old, clip_range=0.2)
    # A = 2: min(3.0, 1.2 * 2) = 2.4 and min(1.0, 0.8 * 2) = 1.0; A = -1: min(-1.5, -1.2) = -1.5, min(-0.5, -0.8)
    assert torch.allclose(loss, torch.tensor([[-2.4, -1.0], [1.5, 0.8]]), rtol=0, atol=1e-6)
    assert meta["clipped"].tolist() == [[True, False], [False, True]]


def test_task5_three_and_six_token_answers():
    """The course's question: one answer of 3 response tokens (3 masked), one of 6; num_tokens 6 for Dr.GRPO."""
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    per_token = torch.ones(2, 6, dtype=torch.float64, requires_grad=True)
    masked_mean(per_token, mask).backward()
    # per sequence, then over the batch: a short-answer token weighs 1 / (3 * 2), a long-answer one 1 / (6 * 2)
    want = torch.tensor([[1 / 6] * 3 + [0.0] * 3, [1 / 12] * 6], dtype=torch.float64)
    assert torch.equal(per_token.grad, want)
    per_token.grad = None
    masked_mean_drgrpo(per_token, mask, 6).backward()
    assert torch.equal(per_token.grad, mask.double() / 12)  # every token 1 / (6 * 2), short answer or long


def test_task5_masked_mean_is_not_cs336s():
    tensor = torch.tensor([[3.0, 3.0, 3.0, 9.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert masked_mean(tensor, mask).item() == pytest.approx((3.0 + 0.0) / 2)  # per sequence, then the batch
    assert cs336_masked_mean(tensor, mask).item() == pytest.approx(9.0 / 4)  # one mean over the 4 masked tokens
    with pytest.raises(ValueError, match=r"\(B, T\) tensor"):
        masked_mean(tensor[0], mask[0])
