"""Padding-free micro-batches: a batch's prompt+completion rows packed into few rows without padding, and back.

TRL lays a micro-batch out as `(B, P + T)`: prompts left-padded to `P`, completions right-padded to `T`, so the
forward and backward run over `B * (P + T)` positions however short most completions are. Packing keeps only the
real tokens (attention mask 1), row after row, with `position_ids` restarting at 0 for every row and no attention
mask: transformers (5.x) reads the restarts as sequence boundaries (a block-diagonal causal mask for sdpa / eager /
flex, the varlen kernels for flash-attention), so each token attends to its own row only and the per-token
log-probs equal the padded forward's to float rounding (RoPE depends on relative positions only, so the left
padding's position offset does not matter). The labels are TRL's: the completion tokens, -100 elsewhere;
`unpack_per_token` scatters the per-token values back to TRL's `(B, T)` layout, 0 at padding.

How many packed rows: flash-attention's varlen kernels take one row (`capacity=None`) and attend within each
sequence only. sdpa and eager compute the whole `(W, W)` block-diagonal mask densely, so one row of `N` tokens
costs `N^2` attention instead of `B * L^2` (measured on the CPU, 4 layers x 256 wide, 8 rows of 100 + ~250 tokens:
11.8 s one row vs 10.2 s padded per forward + backward); for them the rows are packed first-fit decreasing into rows
of at most the longest row's tokens, so attention never exceeds the padded batch's and the other layers run over
about `N` tokens (plus the fillers that end each packed row, a sequence of their own that nothing reads).

The packed rows feed TRL's fused LM head (`trl.trainer.utils.add_fused_lm_head`), so log-probs and entropies are
computed in TRL's tiles (no `(tokens, vocab)` tensor for the micro-batch) exactly as for the padded layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trl_ext.preflight.packed_models import model_type_problem, prompt_learning_problem

IGNORE_INDEX = -100
# transformers' attention implementations that separate sequences packed by `position_ids` when the attention mask
# is None (`masking_utils.find_packed_sequence_indices` for the mask-based ones, `_is_packed_sequence` for flash).
PACKABLE_ATTENTION = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")
# Decoder layer kinds (`config.layer_types`) that only attend: recurrent / convolutional / linear-attention layers
# (Mamba, Qwen3-Next, LFM2 ...) carry state from one packed sequence into the next.
PACKABLE_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class PackedRows:
    """Packed rows (`K` of width `W`) and the map back to the padded `(B, L)` layout.

    Attributes:
        input_ids: `(K, W)` the real tokens of the rows assigned to each packed row, one after another, then filler
            tokens (id 0) up to `W`.
        position_ids: `(K, W)` each token's position in its own row's real tokens (0 at every row's first token);
            the fillers count from 0 again, a sequence of their own.
        labels: `(K, W)` the token where its padded column is a scored completion column (one of the last
            `logits_to_keep` columns, attention mask 1), else -100; -100 at every row's first token and the fillers.
        index: `(K, W)` each packed token's flat index `b * L + c` in the padded layout; -1 at the fillers.
        shape: `(B, L)` of the padded layout.
        cu_seq_lens: with one packed row (`K = 1`), `(S + 1,)` int32 on the batch's device: 0, then the running
            total of the `S` non-empty rows' tokens in packed order (the last entry is `W`); None for `K > 1`.
        max_length: with one packed row, the longest row's tokens (a Python int); None for `K > 1`.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    index: torch.Tensor
    shape: tuple[int, int]
    cu_seq_lens: torch.Tensor | None = None
    max_length: int | None = None

    def varlen_kwargs(self) -> dict:
        """The flash-attention varlen arguments of one packed row, as transformers' `FlashAttentionKwargs` names them.

        `_flash_attention_forward` takes its `is_fa_with_varlen_kwargs` branch when all four are given: it then
        neither recomputes the boundaries from `position_ids` (`prepare_fa_kwargs_from_position_ids`: a `nonzero`,
        a host sync) nor reads `max_length` back from the device, in every layer.
        """
        if self.cu_seq_lens is None:
            raise ValueError(f"varlen arguments need one packed row; these are {self.input_ids.size(0)}")
        return {
            "cu_seq_lens_q": self.cu_seq_lens,
            "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }


def assign_rows(lengths: list[int], capacity: int | None) -> list[list[int]]:
    """First-fit decreasing: the rows, longest first, each into the first packed row with room for it.

    Args:
        lengths: real tokens per row.
        capacity: tokens per packed row (at least the longest row); None: every row in one packed row.

    Returns:
        The row numbers of each packed row.
    """
    if capacity is None:
        return [list(range(len(lengths)))]
    bins: list[list[int]] = []
    loads: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        target = next((k for k, load in enumerate(loads) if load + lengths[row] <= capacity), None)
        if target is None:
            bins.append([row])
            loads.append(lengths[row])
        else:
            bins[target].append(row)
            loads[target] += lengths[row]
    return bins


def row_spans(attention_mask: torch.Tensor) -> tuple[list[int], list[int]]:
    """Each row's real-token count and first real column, read to the host in one transfer: packing's one sync.

    Args:
        attention_mask: `(B, L)` 1 at real tokens, 0 at padding; each row's ones contiguous.

    Returns:
        `(lengths, firsts)`, `B` ints each.

    Raises:
        ValueError: a row's real tokens are not contiguous (its positions could not count them from 0).
    """
    keep = attention_mask.bool()
    width = keep.size(1)
    first = keep.int().argmax(dim=1)  # argmax returns the first maximum: the first real column (0 when none)
    last = width - 1 - keep.flip(1).int().argmax(dim=1)
    lengths, firsts, lasts = torch.stack([keep.sum(dim=1), first, last]).tolist()
    for row, (count, begin, end) in enumerate(zip(lengths, firsts, lasts, strict=True)):
        if count and end - begin + 1 != count:
            raise ValueError(
                f"padding_free packs contiguous rows, but row {row}'s attention mask has {count} ones between columns "
                f"{begin} and {end}; TRL's rows are a left-padded prompt then a right-padded completion"
            )
    return lengths, firsts


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    capacity: int | None = None,
    spans: tuple[list[int], list[int]] | None = None,
) -> PackedRows:
    """Pack the real tokens of a padded batch into few rows for a padding-free forward.

    Each row's real tokens must be contiguous (TRL's left-padded prompt + right-padded completion are): positions
    count them from 0, as the padded row's would up to a constant offset. The layout is computed on the host from
    `row_spans` (one device-to-host transfer for the whole batch, none per row) and copied to the device once.

    Args:
        input_ids: `(B, L)` token ids, `L = P + T`.
        attention_mask: `(B, L)` 1 at real tokens, 0 at padding.
        logits_to_keep: `T`, the completion columns to score (the last `T` columns).
        capacity: tokens per packed row (`assign_rows`); None: one row of `N = attention_mask.sum()` tokens.
        spans: `row_spans(attention_mask)` when the caller already read it.

    Returns:
        A `PackedRows`. TRL's padded labels (`input_ids` where `attention_mask`, -100 elsewhere and before column
        `L - T`) are gathered at the kept tokens, so the packed forward scores exactly the tokens the padded one
        does. A row's first token has no predecessor in its own sequence and is never scored (TRL's prompts are
        never empty, so its first token is a prompt token, -100 in both layouts).
    """
    batch, length = input_ids.shape
    lengths, firsts = spans if spans is not None else row_spans(attention_mask)
    bins = assign_rows(lengths, capacity)
    loads = torch.tensor([sum(lengths[row] for row in rows) for rows in bins])  # (K,)
    width = int(loads.max())
    # The non-empty rows in packed order (packed row 0's rows, then packed row 1's, ...), then their tokens.
    order = [(k, row) for k, rows in enumerate(bins) for row in rows if lengths[row]]
    seq_lens = torch.tensor([lengths[row] for _, row in order], dtype=torch.long)  # (S,)
    seq = torch.repeat_interleave(torch.arange(len(order)), seq_lens)  # (N,) each token's sequence
    within = torch.arange(seq.numel()) - (seq_lens.cumsum(0) - seq_lens)[seq]  # (N,) position in its own row
    starts = torch.tensor([row * length + firsts[row] for _, row in order], dtype=torch.long)  # (S,)
    packed_row = torch.tensor([k for k, _ in order], dtype=torch.long)[seq]  # (N,)
    column = torch.arange(seq.numel()) - (loads.cumsum(0) - loads)[packed_row]  # (N,) column in its packed row
    index = torch.full((len(bins), width), -1, dtype=torch.long)  # (K, W)
    index[packed_row, column] = starts[seq] + within
    positions = torch.arange(width) - loads.unsqueeze(1)  # the fillers sit at the end of their packed row
    positions[packed_row, column] = within
    device = input_ids.device
    index, positions = index.to(device), positions.to(device)
    cu_seq_lens = max_length = None
    if len(bins) == 1:
        cu_seq_lens = torch.cat([torch.zeros(1, dtype=torch.long), seq_lens.cumsum(0)]).to(device, torch.int32)
        max_length = max(lengths)

    labels = input_ids.masked_fill(~attention_mask.bool(), IGNORE_INDEX)
    labels[:, : length - logits_to_keep] = IGNORE_INDEX
    real = index >= 0
    gather = index.clamp(min=0)
    return PackedRows(
        input_ids=input_ids.reshape(-1)[gather].masked_fill(~real, 0),
        position_ids=positions,
        labels=labels.reshape(-1)[gather].masked_fill(~real | (positions == 0), IGNORE_INDEX),
        index=index,
        shape=(batch, length),
        cu_seq_lens=cu_seq_lens,
        max_length=max_length,
    )


def unpack_per_token(values: torch.Tensor, packed: PackedRows, logits_to_keep: int) -> torch.Tensor:
    """Scatter next-token values of a packed forward back to TRL's `(B, T)` completion layout.

    Args:
        values: `(K, W - 1)` a per-token output of the fused LM head on the packed rows: `values[k, j - 1]` belongs
            to packed token `(k, j)` (predicted from token `(k, j - 1)`), 0 where its label is -100.
        packed: the `PackedRows` the forward ran on.
        logits_to_keep: `T`.

    Returns:
        `(B, T)`: `out[b, t]` is the value of the token in padded column `L - T + t` of row `b`, 0 at padding; the
        gradient flows back to `values`.
    """
    batch, length = packed.shape
    target = packed.index[:, 1:]  # (K, W - 1)
    # The fillers (-1, value 0) go to one extra slot that is dropped: no boolean selection, so no host sync.
    slots = target.masked_fill(target < 0, batch * length).reshape(-1)
    flat = values.new_zeros(batch * length + 1).index_copy(0, slots, values.reshape(-1))  # (B * L + 1,)
    return flat[:-1].view(batch, length)[:, length - logits_to_keep :]


def packing_problem(model, is_multimodal: bool = False) -> str | None:
    """Why a model's packed rows could attend to each other (or cannot be packed at all), or None when they cannot.

    Args:
        model: the (unwrapped) model: a transformers `PreTrainedModel` or a PEFT `PeftModel` around one. Its
            config's `model_type` must be on `trl_ext.preflight.packed_models.PACKED_MODEL_TYPES`, its
            `_attn_implementation` in `PACKABLE_ATTENTION`, its `layer_types` all attention; a prompt-learning PEFT
            adapter (prefix tuning feeds `past_key_values`, which turns transformers' packed-sequence mask off) is
            refused.
        is_multimodal: the trainer was given a processor (images are laid out per row, not per packed token).

    Returns:
        A sentence naming the reason, or None.
    """
    if is_multimodal:
        return (
            "multimodal batches (pixel_values and the other image entries) are laid out per padded row and cannot "
            "be packed"
        )
    peft = getattr(model, "active_peft_config", None)
    if peft is not None and peft.is_prompt_learning:
        return prompt_learning_problem(getattr(peft.peft_type, "value", str(peft.peft_type)))
    config = model.config
    problem = model_type_problem(getattr(config, "model_type", None))
    if problem is not None:
        return problem
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


def packed_logps_and_entropies(
    model,
    unwrapped,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    compute_aux_loss: bool = False,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    **forward_kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """TRL's `_get_per_token_logps_and_entropies` with each chunk of `batch_size` rows packed without padding, through
    TRL's fused LM head (`fused_lm_head=True`), the values scattered back to TRL's layout.

    With flash-attention the chunk is one packed row and its boundaries go to the model as transformers' varlen
    arguments (`PackedRows.varlen_kwargs`), computed once per chunk from one host read (`row_spans`).

    Args:
        model: the (wrapped) model TRL passes; `unwrapped` the model inside it (its config and PEFT adapter decide
            whether and how to pack: `packing_problem`).
        input_ids, attention_mask: `(B, P + T)`, prompts left-padded and completions right-padded.
        logits_to_keep: `T`.
        batch_size: rows per forward (default: all).
        autocast: the accelerator's autocast context.
        forward_kwargs: TRL's multimodal entries; all must be None.

    Returns:
        log-probs `(B, T)`, entropies `(B, T)` or None, the mean MoE aux loss or None.
    """
    given = sorted(key for key, value in forward_kwargs.items() if value is not None)
    if given:
        raise ValueError(f"padding_free=True cannot pack a multimodal batch (it holds {given}); set it False")
    problem = packing_problem(unwrapped)
    if problem is not None:
        raise ValueError(f"padding_free=True cannot be used here: {problem}; set padding_free=False")
    config = unwrapped.config
    # One packed row for flash-attention's varlen kernels and where the MoE aux loss must not count fillers;
    # rows of at most the longest row's tokens for the dense-mask kernels (see the module docstring).
    flash = config._attn_implementation.startswith("flash_attention")
    one_row = flash or compute_aux_loss
    batch_size = batch_size or input_ids.size(0)
    logps, entropies, aux_losses = [], [], []
    for start in range(0, input_ids.size(0), batch_size):
        mask = attention_mask[start : start + batch_size]
        spans = row_spans(mask)  # the chunk's one host sync
        capacity = None if one_row else max(spans[0])
        packed = pack_rows(input_ids[start : start + batch_size], mask, logits_to_keep, capacity, spans)
        extra = {"output_router_logits": True} if compute_aux_loss else {}
        if flash:
            extra.update(packed.varlen_kwargs())
        with autocast():
            # No attention mask: transformers separates the sequences where position_ids restart at 0.
            outputs = model(
                input_ids=packed.input_ids,
                position_ids=packed.position_ids,
                labels=packed.labels,
                fused_lm_head=True,
                **extra,
            )
        logps.append(unpack_per_token(outputs.log_probs, packed, logits_to_keep))
        if compute_entropy:
            entropies.append(unpack_per_token(outputs.entropy, packed, logits_to_keep))
        if compute_aux_loss:
            aux_losses.append(outputs.aux_loss)
    return (
        torch.cat(logps, dim=0),
        torch.cat(entropies, dim=0) if compute_entropy else None,
        torch.stack(aux_losses).mean() if compute_aux_loss else None,
    )
