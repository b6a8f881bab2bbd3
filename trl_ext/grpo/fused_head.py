"""Score only the completion tokens through TRL's fused LM head on the CPU too.

TRL 1.16's `_get_per_token_logps_and_entropies` calls the model with `fused_lm_head=True`
(`trl.trainer.utils.add_fused_lm_head`): the LM head runs in tiles (`_ChunkedLogProbFunction`, 4096 tokens x 32768
vocabulary rows), so no `(tokens, vocab)` tensor exists. Which tokens it scores depends on the device:
`compact = _use_triton(device)`. On CUDA / XPU (Triton) only the positions whose label is not -100 (the completion
tokens) go through the head; everywhere else every position does (prompt, completion and padding: `B * (L - 1)`
rows through a vocabulary of, for Qwen3, 151,936 rows) and the non-completion values are zeroed afterwards. TRL
does that for XLA / Neuron, where a token count that changes with every batch recompiles the tile shapes. The
CPU has no such cost, and there the full scoring is most of a small model's step.

`compact_lm_head()` makes that choice compact on the CPU as well, for the duration of a forward, by swapping the
`_use_triton` name `trl.trainer.utils` looks up at call time (the kernel's own choice of Triton vs torch ops reads
`trl.kernels.chunked_logprob._use_triton`, which is left alone). The model's forward, and so any DDP / FSDP / PEFT
wrapper around it, runs as before; other devices keep TRL's behaviour. Compact and full scoring compute each
token's log-prob and entropy from the same tile math on the same hidden state: equal to float rounding (tested
against stock TRL in tests/test_fused_head.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import trl.trainer.utils as trl_utils

# Devices without Triton on which the number of scored tokens may change from call to call at no cost.
COMPACT_DEVICE_TYPES = ("cpu",)


@contextlib.contextmanager
def compact_lm_head() -> Iterator[None]:
    """Within the block, TRL's fused LM head scores only the labelled positions on `COMPACT_DEVICE_TYPES` too."""
    trl_choice = trl_utils._use_triton

    def compact(device: torch.device) -> bool:
        return device.type in COMPACT_DEVICE_TYPES or trl_choice(device)

    trl_utils._use_triton = compact
    try:
        yield
    finally:
        trl_utils._use_triton = trl_choice
