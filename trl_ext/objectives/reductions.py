"""Reduction axis: from a `(B, T)` per-token loss and its response mask to one value per sequence `(B,)`.

    masked_mean       L_b = sum_t m_bt * l_bt / sum_t m_bt     (GRPO: each sequence weighs the same, so a token of
                                                                a short answer weighs more than one of a long one)
    masked_normalize  L_b = sum_t m_bt * l_bt / C               (Dr.GRPO: C is a constant, max_completion_length,
                                                                so every token weighs the same 1 / (C * B))

The caller then takes the batch mean. With `C = max_completion_length`, `masked_normalize` followed by the batch mean
is seed 000's `masked_mean_drgrpo` (`sum / (C * B)`) and TRL's `loss_type="dr_grpo"`; `masked_mean` followed by the
batch mean is TRL's `loss_type="grpo"`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trl_ext.objectives.registry import Registry

REDUCTIONS = Registry("length_normalization")


def _masked(tensor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # `where`, not `tensor * mask`: padding positions may hold inf / nan (e.g. log-probs of pad tokens), and
    # 0 * inf would leak NaN into the sum.
    return torch.where(mask.bool(), tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device))


def masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `tensor` over the positions where `mask` is nonzero: `sum(m * x) / sum(m)`.

    Args:
        tensor: any shape, e.g. `(B, T)`.
        mask: same shape, 0/1 (bool or numeric).
        dim: the dimension to average over; `None` averages over all elements (a scalar).

    Returns:
        The masked mean, with `dim` reduced (e.g. `(B,)` for `dim=-1`). An all-zero mask gives NaN, as
        `torch.mean` of an empty tensor does.
    """
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    total = _masked(tensor, mask).sum() if dim is None else _masked(tensor, mask).sum(dim=dim)
    return total / count


def masked_normalize(
    tensor: torch.Tensor, mask: torch.Tensor, normalize_constant: float, dim: int | None = None
) -> torch.Tensor:
    """Masked sum divided by a constant: `sum(m * x) / normalize_constant`.

    Args:
        tensor: any shape, e.g. `(B, T)`.
        mask: same shape, 0/1 (bool or numeric).
        normalize_constant: the divisor (Dr.GRPO uses `max_completion_length`).
        dim: the dimension to sum over; `None` sums all elements (a scalar).

    Returns:
        The normalised sum, with `dim` reduced.
    """
    total = _masked(tensor, mask).sum() if dim is None else _masked(tensor, mask).sum(dim=dim)
    return total / normalize_constant


def masked_mean_drgrpo(tensor: torch.Tensor, mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Seed 000's Dr.GRPO reduction: `sum(m * x) / (num_tokens * B)`, a scalar.

    Every unmasked token gets the same weight `1 / (num_tokens * B)`, whatever the length of its sequence.

    Args:
        tensor: `(B, T)`.
        mask: `(B, T)`, 0/1.
        num_tokens: the constant per sequence, usually `max_completion_length`.

    Returns:
        Scalar tensor.
    """
    return _masked(tensor, mask).sum() / (num_tokens * tensor.shape[0])


@REDUCTIONS.register("masked_mean")
def _per_sequence_masked_mean(
    per_token_loss: torch.Tensor, mask: torch.Tensor, normalize_constant: float | None = None
) -> torch.Tensor:
    # Unlike `masked_mean`, an empty completion (all-zero mask row, e.g. TRL's mask_truncated_completions) gives 0,
    # not NaN: the token count is clamped at 1, as TRL's loss_type="grpo" does, so one such row cannot poison
    # the batch.
    total = _masked(per_token_loss, mask).sum(dim=-1)
    return total / mask.sum(dim=-1).clamp(min=1)


@REDUCTIONS.register("masked_normalize")
def _per_sequence_masked_normalize(
    per_token_loss: torch.Tensor, mask: torch.Tensor, normalize_constant: float | None = None
) -> torch.Tensor:
    if normalize_constant is None:
        raise ValueError(
            "length_normalization 'masked_normalize' needs normalize_constant (e.g. max_completion_length)"
        )
    if normalize_constant <= 0:
        raise ValueError(f"normalize_constant must be > 0, got {normalize_constant!r}")
    return masked_normalize(per_token_loss, mask, normalize_constant, dim=-1)


LENGTH_NORMALIZATIONS: tuple[str, ...] = REDUCTIONS.names()


def get_reduction(name: str) -> Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]:
    """The per-sequence reduction `f(per_token_loss (B, T), mask (B, T), normalize_constant) -> (B,)` for `name`."""
    return REDUCTIONS.lookup(name)


def reduce_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    length_normalization: str = "masked_mean",
    normalize_constant: float | None = None,
) -> torch.Tensor:
    """Batch loss: the batch mean of the per-sequence reduction `length_normalization` (no backward, no GA scaling).

    Args:
        per_token_loss: `(B, T)`.
        mask: `(B, T)` response mask, 0/1.
        length_normalization: one of `LENGTH_NORMALIZATIONS`.
        normalize_constant: the constant `C` of `masked_normalize` (required there, ignored by `masked_mean`).

    Returns:
        Scalar `mean_b reduction(per_token_loss, mask, C)_b`.
    """
    return get_reduction(length_normalization)(per_token_loss, mask, normalize_constant).mean()
