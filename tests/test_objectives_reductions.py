"""Reduction axis: masked_mean / masked_normalize / masked_mean_drgrpo / reduce_loss against loops and gradcheck."""

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


@pytest.mark.parametrize("name", LENGTH_NORMALIZATIONS)
@pytest.mark.parametrize("seed", [3, 4])
def test_reduce_loss_matches_loop(name, seed):
    x, mask = random_case(seed)
    rows, _, _ = loop_sums(x, mask)
    per_seq = [s / n for s, n in rows] if name == "masked_mean" else [s / 6 for s, _ in rows]
    assert reduce_loss(x, mask, name, 6).item() == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-12)
    assert torch.allclose(get_reduction(name)(x, mask, 6), torch.tensor(per_seq, dtype=torch.float64))


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
    # the seed function: mean of nothing is NaN, as torch.mean(torch.tensor([])) is
    assert torch.isnan(masked_mean(x, empty)) and torch.isnan(torch.tensor([]).mean())
    assert torch.isnan(masked_mean(x, empty, dim=-1)).all()
    # the registry's per-sequence reduction clamps the count at 1 (TRL's loss_type="grpo"): an empty row gives 0
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert get_reduction("masked_mean")(x, mask, None).tolist() == [1.0, 0.0]


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
    ):
        assert torch.autograd.gradcheck(fn, (x,))


def test_registry_names_and_errors():
    assert LENGTH_NORMALIZATIONS == ("masked_mean", "masked_normalize")
    with pytest.raises(ValueError, match="valid names: masked_mean, masked_normalize"):
        get_reduction("seq_mean_token_sum")
    with pytest.raises(ValueError, match="'masked_normalize' needs normalize_constant"):
        reduce_loss(torch.ones(1, 2), torch.ones(1, 2), "masked_normalize", None)
