"""Reduction axis: from a per-token loss and its mask to one micro-batch's share of the optimizer step's loss.

With `l` the `(B, T)` per-token loss, `m` its 0/1 mask, `n_b = sum_t m_bt`, `B` the micro-batch's sequences,
`GA` the accumulation steps and `N_win` the loss tokens of the whole accumulation window (per process):

    masked_mean            sum_b (sum_t m l / max(n_b, 1)) / B / GA   (GRPO; TRL grpo / sapo; verl seq-mean-token-mean)
    masked_normalize       sum_bt m l / (B * C) / GA                  (Dr.GRPO, C = max_completion_length; TRL dr_grpo)
    seq_mean_token_sum     sum_bt m l / B / GA                        (verl seq-mean-token-sum; TRL luspo)
    microbatch_token_mean  sum_bt m l / max(sum_bt m, 1) / GA         (TRL bnpo)
    token_mean             sum_bt m l / N_win                         (DAPO; TRL dapo / cispo / vespo; verl token-mean)

Summed over the GA micro-batches (and averaged over processes by DDP) each gives the step's loss: a mean over
sequences for the first three, over the micro-batch's tokens for `microbatch_token_mean`, over every token of the
step for `token_mean` (so every token weighs the same, whatever its micro-batch). `masked_mean` gives a token of a
short answer more weight than one of a long answer; that is the length bias Dr.GRPO and DAPO remove.

`B` (`num_sequences`) and `sum_bt m` (`num_tokens`) default to the given batch's; a caller that drops rows which
contribute 0 (the zero-advantage skip) passes the full micro-batch's, so the result does not change.
"""

from __future__ import annotations

import torch

from trl_ext.objectives.registry import Registry

REDUCTIONS = Registry("length_normalization")


def _masked(tensor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # `where`, not `tensor * mask`: padding positions may hold inf / nan (e.g. log-probs of pad tokens), and
    # 0 * inf would leak NaN into the sum. A (B, 1) per-sequence loss broadcasts over the mask's tokens.
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


@REDUCTIONS.register("masked_mean")
def masked_mean_reduction(
    per_token_loss: torch.Tensor, mask: torch.Tensor, num_sequences: int | None = None, accumulation_steps: int = 1
) -> torch.Tensor:
    """Per-sequence masked mean, then the batch mean (an empty sequence gives 0: its count is clamped at 1, as TRL's
    `grpo`). Args: `per_token_loss` `(B, T)` or `(B, 1)`, `mask` `(B, T)`. Returns a scalar."""
    per_sequence = _masked(per_token_loss, mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_sequence.sum() / (mask.size(0) if num_sequences is None else num_sequences) / accumulation_steps


@REDUCTIONS.register("masked_normalize")
def masked_normalize_reduction(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    normalize_constant: float,
    num_sequences: int | None = None,
    accumulation_steps: int = 1,
) -> torch.Tensor:
    """Token sum over the batch divided by `B * normalize_constant` (Dr.GRPO; Assignment 2's `masked_mean_drgrpo`).
    Args: `per_token_loss` `(B, T)` or `(B, 1)`, `mask` `(B, T)`. Returns a scalar."""
    if normalize_constant is None or not normalize_constant > 0:
        raise ValueError(
            f"length_normalization 'masked_normalize' needs normalize_constant > 0 (e.g. max_completion_length), "
            f"got {normalize_constant}"
        )
    sequences = mask.size(0) if num_sequences is None else num_sequences
    return _masked(per_token_loss, mask).sum() / (sequences * normalize_constant) / accumulation_steps


@REDUCTIONS.register("seq_mean_token_sum")
def seq_mean_token_sum_reduction(
    per_token_loss: torch.Tensor, mask: torch.Tensor, num_sequences: int | None = None, accumulation_steps: int = 1
) -> torch.Tensor:
    """Token sum per sequence, then the batch mean (verl `seq-mean-token-sum`). Returns a scalar."""
    return (
        _masked(per_token_loss, mask).sum()
        / (mask.size(0) if num_sequences is None else num_sequences)
        / (accumulation_steps)
    )


@REDUCTIONS.register("microbatch_token_mean")
def microbatch_token_mean_reduction(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: torch.Tensor | float | None = None,
    accumulation_steps: int = 1,
) -> torch.Tensor:
    """Mean over the micro-batch's loss tokens (TRL `bnpo`: depends on how the step is cut into micro-batches).
    Returns a scalar."""
    tokens = mask.sum() if num_tokens is None else num_tokens
    tokens = torch.as_tensor(tokens, dtype=per_token_loss.dtype, device=per_token_loss.device).clamp(min=1.0)
    return _masked(per_token_loss, mask).sum() / tokens / accumulation_steps


@REDUCTIONS.register("token_mean")
def token_mean_reduction(
    per_token_loss: torch.Tensor, mask: torch.Tensor, window_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Token sum divided by the loss tokens of the whole accumulation window on this process (DAPO,
    https://arxiv.org/abs/2503.14476; TRL `dapo`), so the step's loss is the mean over all its tokens. Not divided by
    the accumulation steps: `window_tokens` already spans them. `None`: this batch's tokens (one micro-batch per
    step). Returns a scalar."""
    tokens = mask.sum() if window_tokens is None else window_tokens
    tokens = torch.as_tensor(tokens, dtype=per_token_loss.dtype, device=per_token_loss.device).clamp(min=1.0)
    return _masked(per_token_loss, mask).sum() / tokens


LENGTH_NORMALIZATIONS: tuple[str, ...] = REDUCTIONS.names()


def get_reduction(name: str):
    """The reduction registered as `name`: `f(per_token_loss, mask, <what it declares>) -> scalar`."""
    return REDUCTIONS.lookup(name)


def reduce_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    length_normalization: str = "masked_mean",
    normalize_constant: float | None = None,
    **scale: object,
) -> torch.Tensor:
    """The micro-batch loss of the reduction `length_normalization` (no backward).

    Args:
        per_token_loss: `(B, T)` (or `(B, 1)` for a per-sequence loss).
        mask: `(B, T)` loss mask, 0/1.
        length_normalization: one of `LENGTH_NORMALIZATIONS`.
        normalize_constant: `C` of `masked_normalize` (required there, ignored by the others).
        **scale: `num_sequences`, `num_tokens`, `window_tokens`, `accumulation_steps` (defaults: this batch, 1 step).

    Returns:
        A scalar.
    """
    return REDUCTIONS.call(
        length_normalization, per_token_loss=per_token_loss, mask=mask, normalize_constant=normalize_constant, **scale
    )
