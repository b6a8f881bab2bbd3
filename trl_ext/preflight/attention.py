"""Which attention a run loads its policy with, decided before the model loads.

A recipe asks for an implementation through its model init arguments (`model_init_kwargs: {attn_implementation:
flash_attention_2}`, or ModelConfig's `attn_implementation`); the recipes that follow NYU Assignment 3's loading ("in
bfloat16 and with FlashAttention-2") ask for FlashAttention-2. It needs the `flash_attn` package and a CUDA GPU:
where `flash_attn` is not installed, or the run is on the CPU (`use_cpu`), the run falls back to PyTorch's SDPA
(`sdpa`) with a message saying so, instead of failing when transformers loads the model. The preflights print which
attention runs (`AttentionChoice.render`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

__all__ = ["FALLBACK_ATTENTION", "FLASH_ATTENTION_2", "AttentionChoice", "choose_attention", "requested_attention"]

FLASH_ATTENTION_2 = "flash_attention_2"
FALLBACK_ATTENTION = "sdpa"


@dataclass(frozen=True)
class AttentionChoice:
    """The attention a recipe asks for (`requested`, None: the model's default) and the one it loads (`used`)."""

    requested: str | None
    used: str | None
    reason: str = ""  # why `used` is not `requested`

    @property
    def fell_back(self) -> bool:
        return self.used != self.requested

    def message(self) -> str:
        """The fallback, in one sentence ("" when the requested attention runs)."""
        if not self.fell_back:
            return ""
        return f"attn_implementation {self.requested} asked for, {self.used} runs instead: {self.reason}"

    def render(self) -> str:
        """The preflight's line."""
        if self.fell_back:
            return f"attention: {self.used} instead of {self.requested} ({self.reason})"
        if self.used is None:
            return "attention: the model's default (transformers picks sdpa where the model supports it)"
        return f"attention: {self.used}" + (" (flash_attn installed)" if self.used == FLASH_ATTENTION_2 else "")


def requested_attention(training_args, model_args=None) -> str | None:
    """The attention the parsed recipe asks for: `model_init_kwargs.attn_implementation`, else ModelConfig's
    `attn_implementation` (the order `trl_ext.recipes.model_init_kwargs` merges them in)."""
    kwargs = getattr(training_args, "model_init_kwargs", None)
    if isinstance(kwargs, dict) and "attn_implementation" in kwargs:
        return kwargs["attn_implementation"]
    return getattr(model_args, "attn_implementation", None)


def flash_attn_installed() -> bool:
    """Whether `flash_attn` can be imported (looked up, not imported: its import initialises CUDA)."""
    return importlib.util.find_spec("flash_attn") is not None


def choose_attention(requested: str | None, use_cpu: bool = False, flash_attn: bool | None = None) -> AttentionChoice:
    """The attention to load: `requested`, except FlashAttention-2 without `flash_attn` (`flash_attn`: installed or
    not; None looks it up) or on the CPU, where it is `sdpa`."""
    if requested != FLASH_ATTENTION_2:
        return AttentionChoice(requested, requested)
    if not (flash_attn_installed() if flash_attn is None else flash_attn):
        return AttentionChoice(requested, FALLBACK_ATTENTION, "flash_attn is not installed; pip install flash-attn")
    if use_cpu:
        return AttentionChoice(requested, FALLBACK_ATTENTION, "FlashAttention-2 needs a CUDA GPU and use_cpu is true")
    return AttentionChoice(requested, requested)
