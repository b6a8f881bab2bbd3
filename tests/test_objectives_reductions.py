"""Reduction axis: every registered reduction, the courses' masked_mean / masked_normalize / masked_mean_drgrpo and
reduce_loss, against loops over Python floats, gradient accumulation, and gradcheck."""

from __future__ import annotations

import math

import pytest
import torch

from trl_ext.objectives import (
    LENGTH_NORMALIZATIONS,
    get_reduction,
    masked_mean,
    masked_mean_drgrpo,
    masked_normalize,
    reduce_loss,
)


def random_case(seed: int, b: int = 4, t: int = 6):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, generator=gen, dtype=torch.float64)
    mask = torch.rand(b, t, generator=gen) < 0.6
    mask[:, 0] = True  # no empty row: the loop reference below divides by the row count
    return x, mask


def loop_sums(x, mask):
    """Per-row masked sums and counts, per-column sums and counts, and the totals, as Python floats."""

    def reduce(values, flags):
        return [
            (sum(v for v, m in zip(r, mr, strict=True) if m), sum(mr)) for r, mr in zip(values, flags, strict=True)
        ]

    rows = reduce(x.tolist(), mask.tolist())
    cols = reduce(x.T.tolist(), mask.T.tolist())
    total = (sum(s for s, _ in rows), sum(n for _, n in rows))
    return rows, cols, total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_mean_and_normalize_match_loop(seed):
    x, mask = random_case(seed)
    rows, cols, (total, count) = loop_sums(x, mask)
    f64 = dict(dtype=torch.float64)
    assert torch.allclose(masked_mean(x, mask, dim=-1), torch.tensor([s / n for s, n in rows], **f64))
    assert torch.allclose(masked_mean(x, mask, dim=1), torch.tensor([s / n for s, n in rows], **f64))
    col_means = [s / n if n else math.nan for s, n in cols]
    assert torch.allclose(masked_mean(x, mask, dim=0), torch.tensor(col_means, **f64), equal_nan=True)
    assert masked_mean(x, mask).item() == pytest.approx(total / count, rel=1e-12)
    assert torch.allclose(masked_normalize(x, mask, 3.0, dim=-1), torch.tensor([s / 3 for s, _ in rows], **f64))
    assert torch.allclose(masked_normalize(x, mask, 3.0, dim=0), torch.tensor([s / 3 for s, _ in cols], **f64))
    assert masked_normalize(x, mask, 3.0).item() == pytest.approx(total / 3, rel=1e-12)
    assert masked_mean_drgrpo(x, mask, 6).item() == pytest.approx(total / (6 * 4), rel=1e-12)


def loop_reduction(name, x, mask, ga, window_tokens, constant):
    """Reference micro-batch loss from Python floats, written from the formula table of reductions.py."""
    rows, _, (total, count) = loop_sums(x, mask)
    b = len(rows)
    if name == "masked_mean":
        return sum(s / max(n, 1) for s, n in rows) / b / ga
    if name == "masked_normalize":
        return total / (b * constant) / ga
    if name == "seq_mean_token_sum":
        return total / b / ga
    if name == "microbatch_token_mean":
        return total / max(count, 1) / ga
    return total / window_tokens  # token_mean


@pytest.mark.parametrize("name", LENGTH_NORMALIZATIONS)
@pytest.mark.parametrize("seed", [3, 4])
def test_reduction_matches_loop(name, seed):
    x, mask = random_case(seed)
    got = reduce_loss(x, mask, name, 6.0, accumulation_steps=2, window_tokens=37.0)
    assert got.item() == pytest.approx(loop_reduction(name, x, mask, 2, 37.0, 6.0), rel=1e-12)


@pytest.mark.parametrize("name", LENGTH_NORMALIZATIONS)
def test_micro_batches_sum_to_the_step_loss(name):
    # 8 sequences as 2 micro-batches of 4 (GA = 2): the sum of the micro-batch losses is the step's loss.
    x, mask = random_case(7, b=8)
    window = float(mask.sum())
    halves = [
        reduce_loss(x[r], mask[r], name, 6.0, accumulation_steps=2, window_tokens=window)
        for r in (slice(0, 4), slice(4, 8))
    ]
    rows, _, (total, count) = loop_sums(x, mask)
    step = {
        "masked_mean": sum(s / n for s, n in rows) / 8,  # every sequence weighs 1 / 8
        "masked_normalize": total / (8 * 6.0),
        "seq_mean_token_sum": total / 8,
        "token_mean": total / count,  # every token of the step weighs 1 / (tokens of the step)
    }
    if name == "microbatch_token_mean":  # the mean of the two micro-batches' token means (TRL bnpo)
        first, second = (loop_sums(x[r], mask[r])[2] for r in (slice(0, 4), slice(4, 8)))
        step[name] = (first[0] / first[1] + second[0] / second[1]) / 2
    assert sum(halves).item() == pytest.approx(step[name], rel=1e-12)


@pytest.mark.parametrize("name", LENGTH_NORMALIZATIONS)
def test_rows_of_zero_loss_can_be_left_out_given_the_full_counts(name):
    # What skip_zero_advantage_completions relies on: drop rows whose loss is 0, pass the full batch's counts.
    x, mask = random_case(8, b=6)
    x[[1, 4]] = 0.0
    full = reduce_loss(x, mask, name, 6.0, accumulation_steps=2, window_tokens=50.0)
    kept = [0, 2, 3, 5]
    counts = dict(num_sequences=6, num_tokens=mask.sum(), accumulation_steps=2, window_tokens=50.0)
    assert reduce_loss(x[kept], mask[kept], name, 6.0, **counts).item() == pytest.approx(full.item(), rel=1e-12)


def test_per_sequence_loss_broadcasts_over_the_mask():
    # A (B, 1) loss (GSPO) counts once per token under the token sums, once per sequence under masked_mean.
    loss, mask = torch.tensor([[2.0], [3.0]]), torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert reduce_loss(loss, mask, "masked_mean").item() == pytest.approx(2.5)
    assert reduce_loss(loss, mask, "seq_mean_token_sum").item() == pytest.approx((4 + 3) / 2)
    assert reduce_loss(loss, mask, "token_mean").item() == pytest.approx(7 / 3)


def test_numeric_and_bool_masks_agree():
    x, mask = random_case(5)
    assert torch.equal(masked_mean(x, mask, dim=-1), masked_mean(x, mask.long(), dim=-1))
    assert torch.equal(masked_normalize(x, mask, 7, dim=-1), masked_normalize(x, mask.float(), 7, dim=-1))


def test_masked_positions_cannot_leak_inf_or_nan():
    x = torch.tensor([[1.0, 3.0, -math.inf, math.nan]])
    mask = torch.tensor([[1, 1, 0, 0]])
    assert masked_mean(x, mask).item() == 2.0
    assert masked_normalize(x, mask, 4.0, dim=-1).tolist() == [1.0]
    assert masked_mean_drgrpo(x, mask, 4).item() == 1.0


def test_empty_mask():
    x = torch.ones(2, 3)
    empty = torch.zeros(2, 3)
    # the course function: mean of nothing is NaN, as torch.mean(torch.tensor([])) is
    assert torch.isnan(masked_mean(x, empty)) and torch.isnan(torch.tensor([]).mean())
    assert torch.isnan(masked_mean(x, empty, dim=-1)).all()
    # the registered reduction clamps the count at 1 (TRL's loss_type="grpo"): an empty row adds 0
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert get_reduction("masked_mean")(x, mask).item() == 0.5


def test_masked_mean_drgrpo_is_masked_normalize_then_batch_mean():
    x, mask = random_case(6)
    assert torch.allclose(masked_mean_drgrpo(x, mask, 6), reduce_loss(x, mask, "masked_normalize", 6), rtol=1e-14)


def test_gradcheck_reductions():
    x, mask = random_case(8, b=3, t=4)
    x.requires_grad_()
    for fn in (
        lambda t: masked_mean(t, mask),
        lambda t: masked_mean(t, mask, dim=-1),
        lambda t: masked_normalize(t, mask, 4.0, dim=-1),
        lambda t: masked_normalize(t, mask, 4.0),
        lambda t: masked_mean_drgrpo(t, mask, 4),
        lambda t: reduce_loss(t, mask, "masked_mean"),
        lambda t: reduce_loss(t, mask, "masked_normalize", 4.0),
        *(lambda t, n=name: reduce_loss(t, mask, n, 4.0, accumulation_steps=2) for name in LENGTH_NORMALIZATIONS),
    ):
        assert torch.autograd.gradcheck(fn, (x,))


def test_registry_names_and_errors():
    assert LENGTH_NORMALIZATIONS == (
        "masked_mean", "masked_normalize", "seq_mean_token_sum", "microbatch_token_mean", "token_mean",
    )  # fmt: skip
    with pytest.raises(ValueError, match="valid names: masked_mean, masked_normalize, seq_mean_token_sum"):
        get_reduction("seq-mean-token-sum")
    with pytest.raises(ValueError, match="'masked_normalize' needs normalize_constant"):
        reduce_loss(torch.ones(1, 2), torch.ones(1, 2), "masked_normalize", None)
