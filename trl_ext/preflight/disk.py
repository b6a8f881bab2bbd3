"""What a run writes to disk: each checkpoint, the peak while one is saved, and the final model (pure).

A `checkpoint-N` folder of the HF Trainer holds the weights in their training dtype (`model.safetensors`) and the
optimizer states (`optimizer.pt`); the scheduler, RNG and trainer state are a few KB. With fp32 master weights and
AdamW (the GPU recipes) that is 4 P + 8 P bytes: 20.6 GB for Qwen3-1.7B. The Trainer deletes old checkpoints beyond
`save_total_limit` only after the new one is written (transformers 5.17: `Trainer._save_checkpoint` calls
`trainer_utils.rotate_checkpoints` last), so
`save_total_limit: 1` needs two checkpoints of room during a save. DeepSpeed writes bf16 weights and its fp32 master
copy with the states, sharded over the ranks but summing to (2 + 4 + K) P.

The final model (`trainer.save_model`) is the weights alone, in the training dtype: fp32 for the GPU recipes. It is
kept in fp32 on purpose: the checkpoints must hold the master weights anyway, a later run that continues from the
final model (`--model_name_or_path runs/...`, an SFT -> GRPO chain) keeps the bits below bf16's resolution, and the
readers that want bf16 take it themselves (vLLM's `dtype: auto` downcasts a float32 checkpoint to bf16,
`vllm/config/model.py` `_resolve_auto_dtype`; `trl-ext eval --dtype bfloat16`). It costs 2 P bytes of disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trl_ext.preflight.memory import optimizer_states_bytes
from trl_ext.preflight.models import ModelShape
from trl_ext.preflight.setup import TrainingSetup

GB = 1e9


@dataclass(frozen=True)
class DiskPlan:
    """Bytes on disk: one checkpoint (weights + optimizer states), the most checkpoints present at once, the final
    model."""

    checkpoint_weights: float
    checkpoint_optimizer: float
    checkpoints_at_once: int
    final_model: float
    weight_dtype: str

    @property
    def checkpoint(self) -> float:
        return self.checkpoint_weights + self.checkpoint_optimizer

    @property
    def peak(self) -> float:
        return self.checkpoint * self.checkpoints_at_once + self.final_model

    def render(self) -> str:
        if not self.checkpoints_at_once:
            return f"disk:    no checkpoints; final model {self.final_model / GB:.1f} GB ({self.weight_dtype})"
        weights, states = self.checkpoint_weights / GB, self.checkpoint_optimizer / GB
        return (
            f"disk:    checkpoint {self.checkpoint / GB:.1f} GB each (weights {weights:.1f} {self.weight_dtype} + "
            f"optimizer states {states:.1f}), {self.checkpoints_at_once} at once while saving; final model "
            f"{self.final_model / GB:.1f} GB ({self.weight_dtype}): up to {self.peak / GB:.1f} GB in output_dir"
        )


def saves_during_run(max_steps: int, save_strategy: str, save_steps: float) -> int:
    """Checkpoints the HF Trainer writes in `max_steps` steps (`save_steps < 1`: a fraction of max_steps, rounded
    up as `TrainingArguments` does)."""
    if save_strategy != "steps" or max_steps <= 0 or save_steps <= 0:
        return 0
    interval = math.ceil(max_steps * save_steps) if save_steps < 1 else int(save_steps)
    return max_steps // max(interval, 1)


def plan_disk(shape: ModelShape, setup: TrainingSetup, saves: int, save_total_limit: int | None) -> DiskPlan:
    """The `DiskPlan` of a run (module docstring).

    Args:
        shape: the model.
        setup: the run's training setup (precision, optimizer, ZeRO stage, LoRA rank).
        saves: checkpoints written during the run (`saves_during_run`).
        save_total_limit: the Trainer's limit (None: all kept).
    """
    p, optim, lora_rank = shape.params, setup.optim, setup.lora_rank
    if lora_rank is not None:  # the adapters, in fp32, and their states
        weights, state = shape.lora_params(lora_rank) * 4.0, optimizer_states_bytes(shape, optim, 4, lora_rank)
    elif setup.zero_stage:
        weights = p * 2.0  # bf16 module states; the fp32 master copy sits with the optimizer states
        state = p * 4.0 + optimizer_states_bytes(shape, optim, 4)
    else:
        weights, state = p * float(setup.weight_bytes), optimizer_states_bytes(shape, optim, setup.weight_bytes)
    at_once = min(saves, save_total_limit + 1) if save_total_limit else saves
    dtype = "fp32" if weights == p * 4.0 or lora_rank is not None else "bf16"
    return DiskPlan(weights, state, at_once, weights, dtype)
