"""The courses' loss functions (compute_*_loss, compute_policy_gradient_loss): the four losses by hand, against a plain
loop, gradcheck, and argument errors. The registered axis losses are tested in test_objectives_losses.py."""

from __future__ import annotations

import math

import pytest
import torch

from trl_ext.objectives import (
    compute_grpo_clip_loss,
    compute_grpo_no_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
)
from trl_ext.objectives.course_api import COURSE_LOSSES

PG_LOSS_TYPES = tuple(COURSE_LOSSES)


def loop_loss(loss_type, logp, score, old, eps):
    """Reference per-token loss from Python floats: `score` is one number per row (reward or advantage)."""
    out = []
    for b, row in enumerate(logp):
        a = score[b]
        vals = []
        for t, lp in enumerate(row):
            if loss_type in ("no_baseline", "reinforce_with_baseline"):
                vals.append(-a * lp)
                continue
            ratio = math.exp(lp - old[b][t])
            if loss_type == "grpo_no_clip":
                vals.append(-ratio * a)
            else:
                clipped = min(max(ratio, 1 - eps), 1 + eps)
                vals.append(-min(ratio * a, clipped * a))
        out.append(vals)
    return out


def test_naive_loss_by_hand():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    scores = torch.tensor([[2.0], [-1.0]])
    want = torch.tensor([[2.0, 4.0], [-0.5, -3.0]])
    assert torch.equal(compute_naive_policy_gradient_loss(scores, logp), want)
    assert torch.equal(compute_naive_policy_gradient_loss(scores.squeeze(-1), logp), want)  # (B,) is accepted


# ratios around both ends of [1 - eps, 1 + eps] with eps = 0.2
RATIOS = [0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 1.5]


def test_clip_loss_and_metadata_by_hand():
    ratios = torch.tensor([RATIOS] * 3, dtype=torch.float64)
    old = torch.full_like(ratios, -1.3)
    logp = old + ratios.log()
    adv = torch.tensor([[1.0], [-1.0], [0.0]], dtype=torch.float64)
    loss, meta = compute_grpo_clip_loss(adv, logp, old, 0.2)
    # A = +1: -min(r, clip(r)) -> the clip only binds above 1.2 (1.21, 1.5 -> 1.2)
    # A = -1: max(r, clip(r))  -> the clip only binds below 0.8 (0.5, 0.79 -> 0.8)
    want = torch.tensor(
        [
            [-0.5, -0.79, -0.81, -1.0, -1.19, -1.2, -1.2],
            [0.8, 0.8, 0.81, 1.0, 1.19, 1.21, 1.5],
            [0.0] * 7,
        ],
        dtype=torch.float64,
    )
    assert torch.allclose(loss, want, rtol=0, atol=1e-12)
    high = [False, False, False, False, False, True, True]
    low = [True, True, False, False, False, False, False]
    assert meta["clipped"].dtype == torch.bool and meta["clipped"].shape == (3, 7)
    assert meta["clipped"].tolist() == [high, low, [False] * 7]
    assert meta["clipped_high"].tolist() == [high, [False] * 7, [False] * 7]
    assert meta["clipped_low"].tolist() == [[False] * 7, low, [False] * 7]
    assert torch.allclose(meta["ratio"], ratios, atol=1e-12)


def test_clipped_tokens_get_no_gradient():
    ratios = torch.tensor([RATIOS, RATIOS], dtype=torch.float64)
    old = torch.zeros_like(ratios)
    logp = ratios.log().requires_grad_()
    adv = torch.tensor([[2.0], [-3.0]], dtype=torch.float64)
    loss, meta = compute_grpo_clip_loss(adv, logp, old, 0.2)
    loss.sum().backward()
    # d(-ratio * A)/dlogp = -ratio * A where the unclipped term is the min, 0 where the clip binds
    want = torch.where(meta["clipped"], torch.zeros_like(ratios), -ratios * adv)
    assert torch.allclose(logp.grad, want, atol=1e-12)
    assert meta["clipped"].sum() == 4


def test_asymmetric_cliprange():
    ratios = torch.tensor([[0.85, 1.25, 1.35]], dtype=torch.float64)
    loss, meta = compute_grpo_clip_loss(
        torch.tensor([1.0]).double(), ratios.log(), torch.zeros(1, 3).double(), (0.1, 0.3)
    )
    assert torch.allclose(loss, torch.tensor([[-0.85, -1.25, -1.3]], dtype=torch.float64), atol=1e-12)
    assert meta["clipped"].tolist() == [[False, False, True]]


def test_no_clip_loss_by_hand():
    ratios = torch.tensor([[0.5, 2.0], [1.0, 3.0]], dtype=torch.float64)
    loss, meta = compute_grpo_no_clip_loss(
        torch.tensor([1.5, -2.0]).double(), ratios.log(), torch.zeros(2, 2).double()
    )
    assert torch.allclose(loss, torch.tensor([[-0.75, -3.0], [2.0, 6.0]], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(meta["ratio"], ratios, atol=1e-12)


@pytest.mark.parametrize("loss_type", PG_LOSS_TYPES)
def test_dispatch_matches_loop(loss_type):
    gen = torch.Generator().manual_seed(len(loss_type))
    logp = -torch.rand(5, 8, generator=gen, dtype=torch.float64) * 4
    old = logp + 0.4 * torch.randn(5, 8, generator=gen, dtype=torch.float64)
    rewards = torch.rand(5, 1, generator=gen, dtype=torch.float64)
    adv = torch.randn(5, 1, generator=gen, dtype=torch.float64)
    loss, _ = compute_policy_gradient_loss(logp, loss_type, rewards, adv, old, 0.2)
    score = rewards if loss_type == "no_baseline" else adv
    want = loop_loss(loss_type, logp.tolist(), score.squeeze(1).tolist(), old.tolist(), 0.2)
    assert loss.shape == (5, 8)
    assert torch.allclose(loss, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss_type", PG_LOSS_TYPES)
def test_gradcheck(loss_type):
    gen = torch.Generator().manual_seed(7)
    logp = (-torch.rand(3, 5, generator=gen, dtype=torch.float64)).requires_grad_()
    old = (logp + 0.3 * torch.randn(3, 5, generator=gen, dtype=torch.float64)).detach()
    rewards = torch.rand(3, 1, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 1, generator=gen, dtype=torch.float64)
    # keep every ratio at least 1e-3 away from the clip kinks, where the loss is not differentiable
    assert ((logp - old).exp().sub(1).abs().sub(0.2).abs() > 1e-3).all()
    fn = lambda lp: compute_policy_gradient_loss(lp, loss_type, rewards, adv, old, 0.2)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (logp,))


@pytest.mark.parametrize(
    ("loss_type", "drop", "missing"),
    [
        ("no_baseline", "raw_rewards", "raw_rewards"),
        ("reinforce_with_baseline", "advantages", "advantages"),
        ("grpo_clip", "old_log_probs", "old_log_probs"),
        ("grpo_clip", "cliprange", "cliprange"),
        ("grpo_no_clip", "advantages", "advantages"),
    ],
)
def test_missing_argument_names_it_and_the_loss_type(loss_type, drop, missing):
    kwargs = {
        "raw_rewards": torch.ones(2, 1),
        "advantages": torch.ones(2, 1),
        "old_log_probs": torch.zeros(2, 3),
        "cliprange": 0.2,
    }
    kwargs[drop] = None
    with pytest.raises(ValueError, match=rf"loss_type '{loss_type}' needs {missing}"):
        compute_policy_gradient_loss(torch.zeros(2, 3), loss_type, **kwargs)


def test_course_names_and_unknown_loss():
    assert PG_LOSS_TYPES == ("no_baseline", "reinforce_with_baseline", "grpo_clip", "grpo_no_clip")
    with pytest.raises(ValueError, match="valid names: no_baseline, reinforce_with_baseline, grpo_clip, grpo_no_clip"):
        compute_policy_gradient_loss(torch.zeros(1, 2), "ppo")
    # the naive losses differ only in which score they read
    lp = torch.tensor([[-1.0, -2.0]])
    scores = dict(raw_rewards=torch.tensor([3.0]), advantages=torch.tensor([5.0]))
    a, _ = compute_policy_gradient_loss(lp, "no_baseline", **scores)
    b, _ = compute_policy_gradient_loss(lp, "reinforce_with_baseline", **scores)
    assert a.tolist() == [[3.0, 6.0]] and b.tolist() == [[5.0, 10.0]]


def test_bad_advantage_shape():
    with pytest.raises(ValueError, match=r"advantages must have shape \(B,\) or \(B, 1\)"):
        compute_grpo_no_clip_loss(torch.zeros(2, 1, 1), torch.zeros(2, 3), torch.zeros(2, 3))
