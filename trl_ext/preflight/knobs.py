"""Knobs that lower the peak-memory estimate (`trl_ext.preflight.memory`): each candidate change to a recipe
(gradient checkpointing, micro-batch, validation batch, fused or 8-bit AdamW, vLLM sleep or share, LoRA, pure bf16)
as the flags to pass and the `TrainingSetup` they give, mildest first. Which of them fit a limit is the picker's
question (`trl_ext.preflight.fit.knobs_to_fit`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from trl_ext.preflight.memory import EIGHT_BIT_OPTIMIZERS, MemoryEstimate, optimizer_state_bytes
from trl_ext.preflight.setup import TrainingSetup


@dataclass(frozen=True)
class Knob:
    """One change to a recipe that lowers the estimate: the flags to pass and the estimate they give."""

    flags: str
    estimate: MemoryEstimate
    caveat: str = ""

    def render(self) -> str:
        caveat = f" ({self.caveat})" if self.caveat else ""
        return f"{self.flags} -> {self.estimate.peak_gib:.1f} GiB{caveat}"


def knob_candidates(setup: TrainingSetup) -> list[tuple[str, TrainingSetup, str]]:
    """`(flags, setup with them, caveat)` for each single change that could lower `setup`'s estimate, mildest first:
    gradient checkpointing, smaller micro-batch, smaller validation batch, fused or 8-bit AdamW, colocated vLLM sleep
    mode or smaller share, LoRA, pure bf16 (last: it loses small updates)."""
    out: list[tuple[str, TrainingSetup, str]] = []
    if not setup.gradient_checkpointing:
        out.append(("--gradient_checkpointing true", replace(setup, gradient_checkpointing=True), ""))
    batch = setup.micro_batch // 2
    while batch >= 1:
        out.append(
            (
                f"--per_device_train_batch_size {batch}",
                replace(setup, micro_batch=batch),
                "GA follows from train_batch_size",
            )
        )
        batch //= 2
    if setup.eval_batch > 1:
        batch = setup.eval_batch // 2
        while batch >= 1:
            out.append((f"--per_device_eval_batch_size {batch}", replace(setup, eval_batch=batch), ""))
            batch //= 4
    if setup.optim.lower() not in EIGHT_BIT_OPTIMIZERS and not setup.zero_stage:
        if "fused" not in setup.optim and optimizer_state_bytes(setup.optim, 4)[1]:
            out.append(("--optim adamw_torch_fused", replace(setup, optim="adamw_torch_fused"), "same AdamW math"))
        out.append(("--optim adamw_bnb_8bit", replace(setup, optim="adamw_bnb_8bit"), "needs bitsandbytes"))
    if setup.generator == "colocate":
        if not setup.vllm_sleep:
            out.append(("--vllm_enable_sleep_mode true", replace(setup, vllm_sleep=True), ""))
        for share in (0.2, 0.15):
            if share < setup.vllm_gpu_memory_utilization:
                out.append(
                    (
                        f"--vllm_gpu_memory_utilization {share}",
                        replace(setup, vllm_gpu_memory_utilization=share),
                        "less KV cache: slower generation",
                    )
                )
    if setup.lora_rank is None:
        out.append(
            (
                "--use_peft true --lora_r 64 --lora_target_modules all-linear",
                replace(setup, lora_rank=64),
                "trains LoRA adapters, not the full model",
            )
        )
    if setup.precision == "fp32_master" and not setup.zero_stage:
        out.append(
            (
                "--dtype bfloat16 (pure bf16)",
                replace(setup, precision="pure_bf16"),
                "lr 1e-5 updates below half a bf16 ulp are lost (docs/gpu.md)",
            )
        )
    return out


def merge_knob(current: TrainingSetup, candidate: TrainingSetup, original: TrainingSetup) -> TrainingSetup:
    """`current` plus the one field `candidate` changed relative to `original`."""
    changes = {
        name: getattr(candidate, name)
        for name in TrainingSetup.__dataclass_fields__
        if getattr(candidate, name) != getattr(original, name)
    }
    return replace(current, **changes)
