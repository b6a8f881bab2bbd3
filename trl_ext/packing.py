"""Padding-free micro-batches: a batch's prompt+completion rows packed into one sequence, and back.

TRL lays a micro-batch out as `(B, P + T)`: prompts left-padded to `P`, completions right-padded to `T`, so the
forward and backward run over `B * (P + T)` positions however short most completions are. Packing keeps only the
real tokens (attention mask 1), in row order, as one row `(1, N)` with `position_ids` restarting at 0 for every
sequence and no attention mask: transformers (5.x) reads the restarts as sequence boundaries (a block-diagonal
causal mask for sdpa / eager / flex, the varlen kernels for flash-attention), so each token attends to its own
sequence only and the per-token log-probs equal the padded forward's to float rounding (RoPE depends on relative
positions only, so the left padding's position offset does not matter). The labels are TRL's: the completion tokens,
-100 elsewhere; `unpack_per_token` scatters the per-token values back to TRL's `(B, T)` layout, 0 at padding.

The packed row feeds TRL's fused LM head (`trl.trainer.utils.add_fused_lm_head`), so log-probs and entropies are
computed in TRL's tiles (no `(tokens, vocab)` tensor for the micro-batch) exactly as for the padded layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100
# transformers' attention implementations that separate sequences packed by `position_ids` when the attention mask
# is None (`masking_utils.find_packed_sequence_indices` for the mask-based ones, `_is_packed_sequence` for flash).
PACKABLE_ATTENTION = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")
# Decoder layer kinds (`config.layer_types`) that only attend: recurrent / convolutional / linear-attention layers
# (Mamba, Qwen3-Next, LFM2 ...) carry state from one packed sequence into the next.
PACKABLE_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class PackedRows:
    """One packed sequence and the map back to the padded layout.

    Attributes:
        input_ids: `(1, N)` the real tokens of every row, row after row (`N` = attention-mask ones).
        position_ids: `(1, N)` each token's position in its own row's real tokens (0 at every row's first token).
        labels: `(1, N)` the token where its padded column is a scored completion column (one of the last
            `logits_to_keep` columns, attention mask 1), else -100; -100 at every row's first token too.
        index: `(N,)` each packed token's flat index `b * L + c` in the padded `(B, L)` layout.
        shape: `(B, L)` of the padded layout.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    index: torch.Tensor
    shape: tuple[int, int]


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> PackedRows:
    """Pack the real tokens of a padded batch into one row for a padding-free forward.

    Each row's real tokens must be contiguous (TRL's left-padded prompt + right-padded completion are): positions
    count them from 0, as the padded row's would up to a constant offset.

    Args:
        input_ids: `(B, L)` token ids, `L = P + T`.
        attention_mask: `(B, L)` 1 at real tokens, 0 at padding.
        logits_to_keep: `T`, the completion columns to score (the last `T` columns).

    Returns:
        A `PackedRows` with `N = attention_mask.sum()` tokens. TRL's padded labels
        (`input_ids` where `attention_mask`, -100 elsewhere and before column `L - T`) are gathered at the kept
        tokens, so the packed forward scores exactly the tokens the padded one does. A row's first token has no
        predecessor in its own sequence and is never scored (TRL's prompts are never empty, so its first token is
        a prompt token, -100 in both layouts).
    """
    batch, length = input_ids.shape
    keep = attention_mask.bool()
    positions = keep.long().cumsum(dim=1) - 1  # (B, L): 0 at each row's first real token
    labels = input_ids.masked_fill(~keep, IGNORE_INDEX)
    labels[:, : length - logits_to_keep] = IGNORE_INDEX
    index = keep.reshape(-1).nonzero().squeeze(1)  # (N,), row-major: row after row, in column order
    packed_positions = positions.reshape(-1)[index]
    packed_labels = labels.reshape(-1)[index].masked_fill(packed_positions == 0, IGNORE_INDEX)
    return PackedRows(
        input_ids=input_ids.reshape(-1)[index].unsqueeze(0),
        position_ids=packed_positions.unsqueeze(0),
        labels=packed_labels.unsqueeze(0),
        index=index,
        shape=(batch, length),
    )


def unpack_per_token(values: torch.Tensor, packed: PackedRows, logits_to_keep: int) -> torch.Tensor:
    """Scatter next-token values of a packed forward back to TRL's `(B, T)` completion layout.

    Args:
        values: `(1, N - 1)` a per-token output of the fused LM head on the packed row: `values[0, k - 1]` belongs
            to packed token `k` (predicted from token `k - 1`), 0 where its label is -100.
        packed: the `PackedRows` the forward ran on.
        logits_to_keep: `T`.

    Returns:
        `(B, T)`: `out[b, t]` is the value of the token in padded column `L - T + t` of row `b`, 0 at padding; the
        gradient flows back to `values`.
    """
    batch, length = packed.shape
    flat = values.new_zeros(batch * length).index_copy(0, packed.index[1:], values.reshape(-1))  # (B * L,)
    return flat.view(batch, length)[:, length - logits_to_keep :]


def packing_problem(config, is_multimodal: bool = False) -> str | None:
    """Why a model cannot take packed rows, or None when it can.

    Args:
        config: the model's `PretrainedConfig` (its `_attn_implementation` and `layer_types`).
        is_multimodal: the trainer was given a processor (images are laid out per row, not per packed token).

    Returns:
        A sentence naming the reason, or None.
    """
    if is_multimodal:
        return (
            "multimodal batches (pixel_values and the other image entries) are laid out per padded row and cannot "
            "be packed"
        )
    attention = getattr(config, "_attn_implementation", None)
    if attention not in PACKABLE_ATTENTION:
        return (
            f"attention implementation {attention!r} is not one that transformers makes separate packed sequences "
            f"from position_ids ({', '.join(PACKABLE_ATTENTION)}); load the model with one of those"
        )
    layer_types = getattr(config.get_text_config(), "layer_types", None) or ()
    other = sorted({kind for kind in layer_types if kind not in PACKABLE_LAYER_TYPES})
    if other:
        return (
            f"the model has {', '.join(other)} layers, which carry state across the packed sequences (only "
            f"{', '.join(PACKABLE_LAYER_TYPES)} layers can be packed)"
        )
    return None
