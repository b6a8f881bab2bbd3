"""The courses' sft_microbatch_train_step / grpo_microbatch_train_step: loss and gradient vs a scalar loop,
GA invariance."""

from __future__ import annotations

import math

import pytest
import torch

from trl_ext.objectives import grpo_microbatch_train_step, sft_microbatch_train_step
from trl_ext.objectives.course_api import COURSE_LOSSES

# the courses' four names; the axis losses are tested in test_objectives_losses.py
PG_LOSS_TYPES = tuple(COURSE_LOSSES)
LENGTH_NORMALIZATIONS = ("masked_mean", "masked_normalize")  # the courses' two reductions

EPS = 0.2
C = 8.0  # normalize_constant, as max_completion_length


def make_batch(seed: int, b: int = 4, t: int = 8):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T) right-padded responses
    rewards = torch.rand(b, generator=gen, dtype=torch.float64)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    return logp, old, mask, rewards, adv


def loop_grpo_loss(logp, old, mask, rewards, adv, loss_type, length_normalization, ga):
    """Reference built from scalar torch ops (so autograd gives the reference gradient too)."""
    per_seq = []
    for b in range(logp.shape[0]):
        a = rewards[b] if loss_type == "no_baseline" else adv[b]
        terms = []
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            if loss_type in ("no_baseline", "reinforce_with_baseline"):
                terms.append(-a * logp[b, t])
                continue
            ratio = torch.exp(logp[b, t] - old[b, t])
            if loss_type == "grpo_no_clip":
                terms.append(-ratio * a)
            else:
                terms.append(-torch.minimum(ratio * a, ratio.clamp(1 - EPS, 1 + EPS) * a))
        per_seq.append(sum(terms) / (len(terms) if length_normalization == "masked_mean" else C))
    return sum(per_seq) / len(per_seq) / ga


@pytest.mark.parametrize("length_normalization", LENGTH_NORMALIZATIONS)
@pytest.mark.parametrize("loss_type", PG_LOSS_TYPES)
def test_grpo_step_matches_loop(loss_type, length_normalization):
    logp, old, mask, rewards, adv = make_batch(len(loss_type) + len(length_normalization))
    x = logp.clone().requires_grad_()
    loss, meta = grpo_microbatch_train_step(
        x, mask, 3, loss_type, rewards.unsqueeze(1), adv, old, EPS, length_normalization, C
    )
    ref_x = logp.clone().requires_grad_()
    ref = loop_grpo_loss(ref_x, old, mask, rewards, adv, loss_type, length_normalization, 3)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12, abs=1e-14)
    assert torch.allclose(x.grad, ref_x.grad, rtol=1e-12, atol=1e-14)
    assert meta["loss"].item() == pytest.approx(3 * ref.item(), rel=1e-12, abs=1e-14)  # unscaled by GA
    assert ("clip_fraction" in meta) == (loss_type == "grpo_clip")


def test_clip_fraction_by_hand():
    ratios = torch.tensor([[0.5, 1.0, 1.5, 1.5], [0.5, 1.0, 1.5, 1.5]], dtype=torch.float64)
    logp = ratios.log().requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # A > 0 clips ratio 1.5 (row 0: 1 of 3 response tokens; the 4th is padding); A < 0 clips ratio 0.5 (row 1: 1 of 2)
    _, meta = grpo_microbatch_train_step(
        logp, mask, 1, "grpo_clip", advantages=torch.tensor([1.0, -1.0]).double(),
        old_log_probs=torch.zeros(2, 4).double(), cliprange=EPS,
    )  # fmt: skip
    assert meta["clip_fraction"].item() == pytest.approx(2 / 5)


@pytest.mark.parametrize("length_normalization", LENGTH_NORMALIZATIONS)
@pytest.mark.parametrize("loss_type", PG_LOSS_TYPES)
def test_gradient_accumulation_invariance(loss_type, length_normalization):
    # Two microbatches of 2 with GA = 2 accumulate the gradient of one batch of 4 with GA = 1. (With masked_mean
    # per-sequence values are averaged over the batch, so this needs equal-sized microbatches.)
    logp, old, mask, rewards, adv = make_batch(11)
    kwargs = dict(loss_type=loss_type, cliprange=EPS, length_normalization=length_normalization, normalize_constant=C)
    whole = logp.clone().requires_grad_()
    grpo_microbatch_train_step(whole, mask, 1, raw_rewards=rewards, advantages=adv, old_log_probs=old, **kwargs)
    split = logp.clone().requires_grad_()
    for rows in (slice(0, 2), slice(2, 4)):
        grpo_microbatch_train_step(
            split[rows],
            mask[rows],
            2,
            raw_rewards=rewards[rows],
            advantages=adv[rows],
            old_log_probs=old[rows],
            **kwargs,
        )
    assert torch.allclose(split.grad, whole.grad, rtol=1e-12, atol=1e-15)
    assert whole.grad.abs().sum() > 0


def test_sft_step_matches_loop():
    logp, _, mask, _, _ = make_batch(5)
    x = logp.clone().requires_grad_()
    loss, meta = sft_microbatch_train_step(x, mask, 2, normalize_constant=4.0)
    rows = [sum(logp[b, t].item() for t in range(8) if mask[b, t]) / 4.0 for b in range(4)]
    assert loss.item() == pytest.approx(-sum(rows) / 4 / 2, rel=1e-12)
    # d loss / d logp_bt = -m_bt / (C * B * GA)
    assert torch.allclose(x.grad, -mask.double() / (4.0 * 4 * 2), rtol=0, atol=1e-15)
    n = int(mask.sum())
    assert meta["num_response_tokens"].item() == n
    assert meta["nll_per_token"].item() == pytest.approx(-sum(r * 4.0 for r in rows) / n, rel=1e-12)


def test_sft_default_constant_is_summed_nll():
    logp = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]], requires_grad=True)
    loss, _ = sft_microbatch_train_step(logp, torch.tensor([[1, 1, 0]]), 1)
    assert loss.item() == pytest.approx(math.log(8))  # -(log 1/2 + log 1/4)


def test_sft_gradient_accumulation_invariance():
    logp, _, mask, _, _ = make_batch(6)
    whole, split = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    sft_microbatch_train_step(whole, mask, 1, 8.0)
    for rows in (slice(0, 2), slice(2, 4)):
        sft_microbatch_train_step(split[rows], mask[rows], 2, 8.0)
    assert torch.allclose(split.grad, whole.grad, rtol=1e-12, atol=1e-15)


def test_errors_are_raised_before_backward():
    logp, old, mask, rewards, adv = make_batch(7)
    x = logp.clone().requires_grad_()
    with pytest.raises(ValueError, match="'masked_normalize' needs normalize_constant"):
        grpo_microbatch_train_step(x, mask, 1, "grpo_clip", advantages=adv, old_log_probs=old, cliprange=EPS,
                                   length_normalization="masked_normalize")  # fmt: skip
    with pytest.raises(ValueError, match="loss_type 'grpo_clip' needs cliprange"):
        grpo_microbatch_train_step(x, mask, 1, "grpo_clip", advantages=adv, old_log_probs=old)
    with pytest.raises(ValueError, match="valid names: masked_mean, masked_normalize, seq_mean_token_sum"):
        grpo_microbatch_train_step(x, mask, 1, "reinforce_with_baseline", advantages=adv, length_normalization="sum")
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be a positive int"):
        grpo_microbatch_train_step(x, mask, 0, "reinforce_with_baseline", advantages=adv)
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be a positive int"):
        sft_microbatch_train_step(x, mask, 0)
    assert x.grad is None
