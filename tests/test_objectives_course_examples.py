"""The courses' worked examples, number for number (GRPO's length bias and Dr.GRPO's fix).

Convention for the gradient tables: the batch objective is `J = mean_b reduction(ratio_bt * A_b)`, i.e. minus
the loss `grpo_microbatch_train_step` back-propagates with GA = 1, and the table entry is `dJ / dlogp_bt`. With
`ratio = exp(logp - old) = 1` we have `d ratio / d logp = 1`, so the entry is `A * w_bt / B` with `w_bt = 1 / |o_b|`
for `masked_mean` and `w_bt = 1 / max_gen_len` for `masked_normalize`. Here A = 2 and B = 2 cancel, so the tables
read `1 / |o_b|` (0.25 for the 4-token answer, 1/7 = 0.1429 for the 7-token one) and `1 / 7` everywhere.
"""

from __future__ import annotations

import pytest
import torch

from trl_ext.objectives import (
    grpo_microbatch_train_step,
    masked_mean,
    masked_mean_drgrpo,
    masked_normalize,
    reduce_loss,
)

MAX_GEN_LEN = 7


def two_sequence_example():
    mask = torch.zeros(2, MAX_GEN_LEN)
    mask[0, :4] = 1  # sequence 1: 4 tokens
    mask[1, :7] = 1  # sequence 2: 7 tokens
    logp = torch.full((2, MAX_GEN_LEN), -0.7, dtype=torch.float64, requires_grad=True)
    advantages = torch.tensor([2.0, 2.0], dtype=torch.float64)
    return logp, logp.detach().clone(), advantages, mask  # old == current: ratio 1


def test_per_sequence_values():
    logp, old, adv, mask = two_sequence_example()
    objective = torch.exp(logp - old) * adv.unsqueeze(1)  # ratio * A = 2 at every token
    assert masked_mean(objective, mask, dim=-1).tolist() == [2.0, 2.0]
    got = masked_normalize(objective, mask, MAX_GEN_LEN, dim=-1)
    assert torch.allclose(got, torch.tensor([8 / 7, 2.0], dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.allclose(got, torch.tensor([1.1429, 2.0], dtype=torch.float64), atol=5e-5)  # the course's rounding


def objective_gradient(length_normalization: str) -> torch.Tensor:
    logp, old, adv, mask = two_sequence_example()
    grpo_microbatch_train_step(
        logp, mask, 1, "grpo_clip", advantages=adv, old_log_probs=old, cliprange=0.2,
        length_normalization=length_normalization, normalize_constant=MAX_GEN_LEN,
    )  # fmt: skip
    return -logp.grad  # dJ/dlogp, J = -loss


def test_gradient_table_masked_mean():
    grad = objective_gradient("masked_mean")
    want = torch.tensor([[0.25] * 4 + [0.0] * 3, [1 / 7] * 7], dtype=torch.float64)
    assert torch.allclose(grad, want, rtol=0, atol=1e-15)
    assert torch.allclose(grad[1], torch.full((7,), 0.1429, dtype=torch.float64), atol=5e-5)


def test_gradient_table_masked_normalize():
    grad = objective_gradient("masked_normalize")
    want = torch.tensor([[1 / 7] * 4 + [0.0] * 3, [1 / 7] * 7], dtype=torch.float64)
    assert torch.allclose(grad, want, rtol=0, atol=1e-15)
    assert torch.allclose(grad[want > 0], torch.tensor(0.1429, dtype=torch.float64), atol=5e-5)


def test_assignment2_three_vs_six_tokens():
    # Two answers of 3 and 6 tokens with the same per-token loss; num_tokens = 6 = the longest answer.
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    per_token = torch.ones(2, 6, dtype=torch.float64, requires_grad=True)
    masked_mean_drgrpo(per_token, mask, 6).backward()
    # Dr.GRPO: every real token weighs 1 / (6 * 2), short answer or long
    assert torch.allclose(per_token.grad, mask.double() / 12, rtol=0, atol=1e-15)

    per_token.grad = None
    reduce_loss(per_token, mask, "masked_mean").backward()
    # GRPO's masked_mean: a token of the 3-token answer weighs 1 / (3 * 2), twice one of the 6-token answer
    want = torch.tensor([[1 / 6] * 3 + [0.0] * 3, [1 / 12] * 6], dtype=torch.float64)
    assert torch.allclose(per_token.grad, want, rtol=0, atol=1e-15)


def test_length_normalization_example_as_cs336_a5_prints_it():
    """NYU Assignment 3's, NLPDL HW3's and CS336 A5's length-normalisation example (Lambert's), as CS336 A5 prints it
    (float32 tensors), with the courses' `constant_normalizer=` keyword; the printed results are the course's, to its 4
    decimals."""
    from trl_ext.objectives.course_api import masked_mean, masked_normalize

    ratio = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], requires_grad=True, dtype=torch.float32)
    advs = torch.tensor([[2, 2, 2, 2, 2, 2, 2], [2, 2, 2, 2, 2, 2, 2]], dtype=torch.float32)
    masks = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])  # generations of 4 and 7 tokens
    max_gen_len = 7
    masked_mean_result = masked_mean(ratio * advs, masks, dim=1)
    masked_normalize_result = masked_normalize(ratio * advs, masks, dim=1, constant_normalizer=max_gen_len)
    assert torch.allclose(masked_mean_result, torch.tensor([2.0, 2.0]), rtol=0, atol=5e-5)
    assert torch.allclose(masked_normalize_result, torch.tensor([1.1429, 2.0000]), rtol=0, atol=5e-5)
    masked_mean_result.mean().backward()
    want = torch.tensor([[0.2500] * 4 + [0.0] * 3, [0.1429] * 7])
    assert torch.allclose(ratio.grad, want, rtol=0, atol=5e-5)
    ratio.grad.zero_()
    masked_normalize_result.mean().backward()
    want = torch.tensor([[0.1429] * 4 + [0.0] * 3, [0.1429] * 7])
    assert torch.allclose(ratio.grad, want, rtol=0, atol=5e-5)
    # section 4.2's own keyword gives the same; both or neither is an error
    assert torch.equal(masked_normalize(ratio * advs, masks, max_gen_len, dim=1), masked_normalize_result)
    with pytest.raises(TypeError, match="exactly one"):
        masked_normalize(ratio * advs, masks, 7, dim=1, constant_normalizer=7)


def test_nyu_a3_and_nlpdl_hw3_print_the_example_with_integer_tensors_torch_cannot_differentiate():
    """Why the test above uses CS336 A5's version: NYU Assignment 3 and NLPDL HW3 print `torch.tensor([[1, ...]],
    requires_grad=True)` without a dtype, integers, which torch refuses before any trl_ext code runs."""
    with pytest.raises(RuntimeError, match="floating point"):
        torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], requires_grad=True)


def test_nyu_a3_starter_batch_sizes_fail_its_own_asserts():
    """NYU Assignment 3 section 7.2's starter values (rollout 16, train 64, GA 128) against its own sanity asserts: the
    first fails (64 % 128 = 64), so the recipes use NLPDL HW3/CS336 A5's consistent 256 / 256 / 128
    (docs/recipes.md)."""
    rollout_batch_size, group_size, train_batch_size, gradient_accumulation_steps = 16, 8, 64, 128
    assert train_batch_size % gradient_accumulation_steps != 0  # the course's `assert ... == 0` fails
    assert train_batch_size // gradient_accumulation_steps == 0  # a micro-batch of 0 sequences
    assert rollout_batch_size % group_size == 0 and train_batch_size >= group_size  # the other two hold
    assert train_batch_size != rollout_batch_size  # and "on-policy" (train == rollout batch) does not
