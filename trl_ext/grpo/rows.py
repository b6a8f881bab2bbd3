"""The rows of a TRL GRPO batch: which entries are per completion and how they pad, the loss mask, and cutting a
batch to fewer rows or columns (dynamic sampling, skipped zero-advantage rows, expert iteration's kept samples)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Per-completion batch entries: (pad on the left, pad value; None = the tokenizer's pad id). 1-D entries ignore both.
ROW_ENTRIES = {
    "prompt_ids": (True, None),
    "prompt_mask": (True, 0),
    "completion_ids": (False, None),
    "completion_mask": (False, 0),
    "tool_mask": (False, 1),
    "advantages": (False, 0),
    "old_per_token_logps": (False, 0.0),
    "sampling_per_token_logps": (False, 0.0),
    "ref_per_token_logps": (False, 0.0),
    "importance_sampling_ratio": (False, 0.0),
    "policy_version": (False, 0),  # async rollouts: the optimizer step of the weights that sampled the row
}
# Optional multimodal batch entries that TRL's `_compute_loss` passes on to `_get_per_token_logps_and_entropies`.
FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


def loss_mask(batch: dict) -> torch.Tensor:
    """`(B, T)` completion tokens that count in the loss (tool outputs excluded), as TRL."""
    mask = batch["completion_mask"]
    return mask if batch.get("tool_mask") is None else mask * batch["tool_mask"]


def trim_padding(batch: dict, multiple: int | None = None, trim_prompt: bool = True) -> dict:
    """Drop the prompt columns that are padding in every row (left) and the completion columns after every row's
    last completion token (right), keeping widths multiples of `multiple` when set; returns a new dict.

    Rows taken from wider batches carry their padding along; TRL pads a batch to its own longest prompt and
    completion, and so the built batch must be (left padding shifts positions, so it changes the forward).

    Args:
        batch: entries of `ROW_ENTRIES`; `prompt_mask` `(B, P)`, `completion_mask` `(B, T)`.
        multiple: TRL's `pad_to_multiple_of`.
        trim_prompt: False keeps every prompt column (only the completion side is cut).
    """

    def width(mask: torch.Tensor, from_left: bool) -> int:
        used = mask.any(dim=0).nonzero().flatten()
        if used.numel() == 0:
            n = 1
        else:
            n = mask.size(1) - int(used[0]) if from_left else int(used[-1]) + 1
        if multiple:
            n = -(-n // multiple) * multiple
        return min(n, mask.size(1))

    widths = {True: batch["prompt_mask"].size(1), False: batch["completion_mask"].size(1)}
    keep = {
        True: width(batch["prompt_mask"], from_left=True) if trim_prompt else widths[True],
        False: width(batch["completion_mask"], from_left=False),
    }
    trimmed = dict(batch)
    for key, (left, _) in ROW_ENTRIES.items():
        tensor = batch.get(key)
        # 1-D entries and the (B, 1) sequence-level importance ratio have no padding columns.
        if tensor is None or tensor.dim() < 2 or tensor.size(1) != widths[left]:
            continue
        trimmed[key] = tensor[:, widths[left] - keep[left] :] if left else tensor[:, : keep[left]]
    return trimmed


def pad_and_concat(tensors: Sequence[torch.Tensor], pad_value: float, left: bool) -> torch.Tensor:
    """Concatenate `(n_i, T_i)` tensors along rows after padding each to `max T_i` columns (1-D: plain concat).

    Args:
        tensors: the blocks; all 1-D or all 2-D.
        pad_value: fill of the added columns.
        left: pad on the left (prompts, as TRL left-pads them) instead of the right (completions).

    Returns:
        `(sum n_i, max T_i)` (or `(sum n_i,)`).
    """
    if tensors[0].dim() == 1:
        return torch.cat(list(tensors))
    width = max(t.size(1) for t in tensors)
    padded = []
    for t in tensors:
        extra = t.new_full((t.size(0), width - t.size(1)), pad_value)
        padded.append(torch.cat([extra, t] if left else [t, extra], dim=1))
    return torch.cat(padded)


def drop_zero_advantage_rows(inputs: dict) -> dict:
    """The completions of a TRL batch whose advantage is not 0.

    A completion with `A = 0` adds exactly 0 to every registered policy-gradient loss (each is a multiple of `A`)
    and to its gradient, and every reduction sums over completions; given the full micro-batch's counts (which the
    trainer passes), the kept rows give the full batch's loss and gradient. `AblationGRPOConfig` refuses the options
    that break this (KL, entropy bonus, entropy quantile).

    Args:
        inputs: a batch as `_generate_and_score_completions` returns it; `advantages` `(B,)` or `(B, 1)`.

    Returns:
        The rows with `A != 0` of every per-completion entry, completion columns cut after the kept rows' last
        completion token (prompt columns kept: left padding sets the positions). `inputs` itself when every row
        counts or the batch holds multimodal entries. When no row counts, row 0 stays (its loss is 0), so the
        forward, the backward and distributed collectives still run.
    """
    advantages = inputs["advantages"]
    n = advantages.size(0)
    keep = advantages.reshape(n, -1).ne(0).any(dim=1)  # (B,)
    if keep.all() or any(inputs.get(key) is not None for key in FORWARD_KEYS):
        return inputs
    if not keep.any():
        keep[0] = True
    rows = keep.nonzero().squeeze(1)
    batch = dict(inputs)
    batch.update({key: inputs[key][rows] for key in ROW_ENTRIES if inputs.get(key) is not None})
    return trim_padding(batch, trim_prompt=False)
