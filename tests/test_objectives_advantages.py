"""The courses' advantage functions: group_normalize and compute_group_normalized_rewards (the registered estimators
are tested in test_objectives_estimators.py)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from trl_ext.objectives import compute_group_normalized_rewards, group_normalize


def loop_group_normalize(rewards: list[float], group_size: int, eps: float, by_std: bool) -> list[float]:
    """Reference: plain Python, `statistics.stdev` is the Bessel-corrected std."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = statistics.fmean(group)
        std = statistics.stdev(group) if by_std else None
        out += [(r - mean) / (std + eps) if by_std else r - mean for r in group]
    return out


def test_group_normalize_by_hand():
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3); group 1: all equal -> std 0.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5], dtype=torch.float64)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    expected_std = torch.tensor([a, -a, -a, a, 0, 0, 0, 0], dtype=torch.float64)
    assert torch.allclose(group_normalize(rewards, 4, 1e-6, True), expected_std, rtol=0, atol=1e-12)
    expected_mean = torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0], dtype=torch.float64)
    assert torch.equal(group_normalize(rewards, 4, 1e-6, False), expected_mean)


@pytest.mark.parametrize("value,group_size", [(0.7, 3), (0.1, 8), (0.3, 8), (1.1, 16)])
def test_all_equal_group_gives_exactly_zero_advantages(value, group_size):
    # Eight float32 0.1s (Countdown's format-only reward) average to 0.1 - 7.5e-9: without the tie check the
    # std-normalised advantage would be -7.5e-9 / 1e-6 = -0.0074 for every member of an all-wrong group.
    rewards = torch.full((2 * group_size,), value)  # float32, as the trainer's rewards
    rewards[group_size] = 0.0  # the second group is not tied
    for by_std in (True, False):
        adv = group_normalize(rewards, group_size, 1e-6, by_std)
        assert torch.isfinite(adv).all()
        assert torch.equal(adv[:group_size], torch.zeros(group_size))
        assert adv[group_size] < 0 and adv[group_size + 1] > 0


@pytest.mark.parametrize("by_std", [True, False])
@pytest.mark.parametrize("group_size", [2, 3, 8])
def test_group_normalize_matches_loop(by_std, group_size):
    gen = torch.Generator().manual_seed(group_size)
    rewards = torch.rand(5 * group_size, generator=gen, dtype=torch.float64)
    rewards[:group_size] = 1.0  # one degenerate group
    got = group_normalize(rewards, group_size, 1e-6, by_std)
    want = torch.tensor(loop_group_normalize(rewards.tolist(), group_size, 1e-6, by_std), dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_group_normalize_errors():
    with pytest.raises(ValueError, match=r"\(7\) is not divisible by group_size \(2\)"):
        group_normalize(torch.zeros(7), 2, 1e-6, True)
    with pytest.raises(ValueError, match="group_size >= 2"):
        group_normalize(torch.zeros(4), 1, 1e-6, True)
    with pytest.raises(ValueError, match="1-D"):
        group_normalize(torch.zeros(2, 2), 2, 1e-6, True)


def dict_reward(response: str, ground_truth: str) -> dict[str, float]:
    formatted = response.startswith("<answer>")
    correct = formatted and response.removeprefix("<answer>") == ground_truth
    return {"reward": float(correct), "format_reward": float(formatted), "answer_reward": float(correct)}


def test_compute_group_normalized_rewards_dict_reward():
    responses = ["<answer>4", "<answer>5", "4", "<answer>4", "<answer>9", "<answer>9"]
    truths = ["4"] * 3 + ["9"] * 3
    adv, raw, meta = compute_group_normalized_rewards(dict_reward, responses, truths, 3, 1e-6, False)
    assert raw.dtype == torch.float32 and raw.shape == (6,)
    assert raw.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    # group means 1/3 and 2/3
    assert torch.allclose(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3]), atol=1e-7)
    assert meta["reward_mean"] == pytest.approx(0.5)
    assert meta["reward_std"] == pytest.approx(statistics.stdev([1, 0, 0, 0, 1, 1]))
    assert (meta["reward_max"], meta["reward_min"]) == (1.0, 0.0)
    assert meta["format_reward_mean"] == pytest.approx(5 / 6)
    assert meta["answer_reward_mean"] == pytest.approx(0.5)


def test_compute_group_normalized_rewards_float_reward_matches_group_normalize():
    responses = [str(i) for i in range(8)]
    truths = ["x"] * 8
    adv, raw, meta = compute_group_normalized_rewards(lambda r, g: int(r) ** 2 / 10, responses, truths, 4, 1e-6, True)
    want_raw = [i**2 / 10 for i in range(8)]
    assert torch.allclose(raw, torch.tensor(want_raw))
    assert torch.allclose(adv, torch.tensor(loop_group_normalize(want_raw, 4, 1e-6, True), dtype=torch.float32))
    assert "format_reward_mean" not in meta


def test_compute_group_normalized_rewards_errors():
    with pytest.raises(ValueError, match="not divisible by group_size"):
        compute_group_normalized_rewards(lambda r, g: 1.0, ["a"] * 5, ["a"] * 5, 2, 1e-6, True)
    with pytest.raises(ValueError, match="rollout_responses has 4 items but repeated_ground_truths has 3"):
        compute_group_normalized_rewards(lambda r, g: 1.0, ["a"] * 4, ["a"] * 3, 2, 1e-6, True)
    with pytest.raises(ValueError, match="without 'reward' for row 0"):
        compute_group_normalized_rewards(lambda r, g: {"score": 1.0}, ["a"] * 2, ["a"] * 2, 2, 1e-6, True)
