"""What one training process holds (`TrainingSetup`), read once from a parsed recipe and where it runs.

`training_setup` turns the parsed recipe (precision, optimizer, PEFT, lengths, batch layout, generator) and the
`RunContext` (processes, ZeRO stage, GPU memory) into the one `TrainingSetup` that the memory estimate
(`trl_ext.preflight.memory`), the picker that fits it (`trl_ext.preflight.fit`) and the disk plan
(`trl_ext.preflight.disk`) all read; none of them reads the recipe again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trl_ext.preflight.batch import BatchLayout
from trl_ext.preflight.context import RunContext

# Longest prompt in tokens (Qwen tokenizer, chat template where the recipe uses it) of each task's shipped data,
# measured on the full sets: Countdown train_10k (countdown prompt, chat 266; tinyzero 99), GSM8K train (299),
# MATH12k train (r1_zero 1742), the kissing problem (232, chat, no thinking). Batches are padded to their longest
# prompt, so the maximum is what memory sees.
PROMPT_TOKENS = {"countdown": 266, "gsm8k": 299, "math": 1742, "kissing": 232}
DEFAULT_PROMPT_TOKENS = 512
# trl/kernels/chunked_logprob.py (TRL 1.16): TOKEN_CHUNK_SIZE, and _CHUNKED_LOGPROB_CHUNK_SIZE in trl/trainer/utils.py.
LOGPROB_TOKEN_CHUNK = 4096
# Completion length a padding-free estimate assumes per row when none is stated, as a fraction of
# max_completion_length: Countdown and MATH rollouts have a median well under half the limit and a tail to it
# (median ~250 of 1024), so half is a stated, deliberately generous guess; state the real mean with
# `--expected_completion_tokens` once a run has logged `completions/mean_length`.
EXPECTED_COMPLETION_FRACTION = 0.5
PRECISIONS = ("fp32_master", "pure_bf16")
GENERATORS = ("server", "colocate", "transformers")


@dataclass(frozen=True)
class TrainingSetup:
    """What one training process holds; every field is a recipe / accelerate setting (`training_setup`).

    Attributes:
        precision: `fp32_master` (load fp32, bf16 autocast) or `pure_bf16` (weights, gradients, states in bf16).
        zero_stage: DeepSpeed ZeRO stage (0: no DeepSpeed); DeepSpeed keeps bf16 weights and an fp32 master copy.
        world_size: training processes W (ZeRO shards over them).
        ddp: PyTorch DDP with W > 1 (a second, bucketed copy of the gradients).
        optim: HF `optim` name.
        lora_rank: LoRA rank when training adapters through peft, else None.
        gradient_checkpointing: recompute layer internals in the backward.
        micro_batch: `per_device_train_batch_size`.
        prompt_tokens, completion_tokens: longest prompt and `max_completion_length` (batches are padded to them).
        padding_free: each micro-batch's rows are packed into one sequence of their real tokens (memory module).
        expected_completion_tokens: completion tokens a row is expected to have when `padding_free` (None:
            `EXPECTED_COMPLETION_FRACTION x completion_tokens`); ignored without `padding_free`.
        chunked_logprobs: log-probs in `(logprob_token_chunk, LOGPROB_VOCAB_CHUNK)` tiles (TRL 1.16's fused head,
            both layouts); False counts materialised fp32 logits of the scored tokens instead.
        logprob_token_chunk: scored tokens per log-prob tile.
        eval_batch: `per_device_eval_batch_size` (0: no validation), eval_generations: completions per prompt.
        generator: `server` (vLLM on other GPUs), `colocate` (vLLM on this GPU), `transformers` (`generate`).
        generation_batch: completions one process generates at once with the transformers backend.
        vllm_gpu_memory_utilization: colocated vLLM's share of this GPU.
        vllm_sleep: colocated vLLM sleeps (frees its weights and KV cache) while training.
        gpu_memory_gib: memory of one GPU (needed for the colocated share).
        beta: the KL coefficient; not 0 (without LoRA): TRL 1.16 loads a full reference copy of the model.
    """

    precision: str = "fp32_master"
    zero_stage: int = 0
    world_size: int = 1
    ddp: bool = False
    optim: str = "adamw_torch"
    lora_rank: int | None = None
    gradient_checkpointing: bool = True
    micro_batch: int = 2
    prompt_tokens: int = 256
    completion_tokens: int = 1024
    eval_batch: int = 0
    eval_generations: int = 1
    generator: str = "server"
    generation_batch: int = 0
    vllm_gpu_memory_utilization: float = 0.3
    vllm_sleep: bool = False
    gpu_memory_gib: float | None = None
    padding_free: bool = False
    expected_completion_tokens: int | None = None
    chunked_logprobs: bool = True
    logprob_token_chunk: int = LOGPROB_TOKEN_CHUNK
    beta: float = 0.0

    @property
    def reference_model(self) -> bool:
        """TRL 1.16 builds a reference copy when `beta != 0` and the policy is not a PEFT model (with LoRA the
        reference is the base with the adapter disabled: `GRPOTrainer.__init__`, "Reference model")."""
        return self.beta != 0.0 and self.lora_rank is None

    @property
    def autocast_cache(self) -> bool:
        """Whether bf16 autocast caches weight casts: fp32 weights under accelerate's bf16 autocast (accelerate
        leaves autocast off under DeepSpeed, whose module weights are bf16 anyway; pure bf16 casts nothing)."""
        return self.precision == "fp32_master" and not self.zero_stage

    @property
    def weight_bytes(self) -> int:
        """Bytes of one model weight on the GPU: 2 in pure bf16 and under DeepSpeed (bf16 module weights), else 4."""
        return 2 if (self.precision == "pure_bf16" or self.zero_stage) else 4

    @property
    def row_completion_tokens(self) -> int:
        """Completion tokens per row that a micro-batch's memory follows: `max_completion_length` when padded, the
        expected length when padding-free (at most `max_completion_length`)."""
        if not self.padding_free:
            return self.completion_tokens
        if self.expected_completion_tokens is not None:
            return min(self.expected_completion_tokens, self.completion_tokens)
        return max(1, round(EXPECTED_COMPLETION_FRACTION * self.completion_tokens))

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r}; choose one of {PRECISIONS}")
        if self.generator not in GENERATORS:
            raise ValueError(f"generator={self.generator!r}; choose one of {GENERATORS}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage}; choose 0, 1, 2 or 3")
        if self.expected_completion_tokens is not None and self.expected_completion_tokens < 1:
            raise ValueError(f"expected_completion_tokens={self.expected_completion_tokens}; give a positive count")
        if self.logprob_token_chunk < 1:
            raise ValueError(f"logprob_token_chunk={self.logprob_token_chunk}; give a positive count")


def enum_value(obj: Any) -> Any:
    """An enum's value (TRL / HF settings like `optim`, `eval_strategy` parse to enums), else the object itself."""
    return getattr(obj, "value", obj)


def two_byte_dtype(model_args) -> str | None:
    """`model_args.dtype` by name when it loads 2-byte weights, else None ("auto": the checkpoint's dtype, bf16 for
    every Qwen)."""
    dtype = str(enum_value(model_args.dtype) or "auto").replace("torch.", "")
    return dtype if dtype in ("bfloat16", "float16", "auto") else None


def training_setup(
    task: str, script_args, args, model_args, layout: BatchLayout, context: RunContext
) -> TrainingSetup:
    """The `TrainingSetup` a parsed recipe implies on `context` (precision, optimizer, lengths, generator).

    `padding_free` is read with `getattr` (absent: padded), `expected_completion_tokens` from the script arguments
    (absent or None: `EXPECTED_COMPLETION_FRACTION`); the log-prob tile is TRL's fixed 4096 tokens.
    """
    two_byte = two_byte_dtype(model_args) is not None
    if args.use_vllm:
        generator = "server" if args.vllm_mode == "server" else "colocate"
    else:
        generator = "transformers"
    return TrainingSetup(
        precision="pure_bf16" if two_byte and not context.zero_stage else "fp32_master",
        zero_stage=context.zero_stage,
        world_size=context.world_size,
        ddp=context.distributed_type == "MULTI_GPU",
        optim=str(enum_value(args.optim)),
        lora_rank=model_args.lora_r if model_args.use_peft else None,
        gradient_checkpointing=bool(args.gradient_checkpointing),
        micro_batch=layout.per_device_train_batch_size,
        prompt_tokens=PROMPT_TOKENS.get(task, DEFAULT_PROMPT_TOKENS),
        completion_tokens=int(args.max_completion_length),
        eval_batch=layout.per_device_eval_batch_size,
        eval_generations=layout.eval_generations or 1,
        generator=generator,
        generation_batch=layout.generation_batch_per_process,
        vllm_gpu_memory_utilization=float(args.vllm_gpu_memory_utilization),
        vllm_sleep=bool(args.vllm_enable_sleep_mode),
        gpu_memory_gib=context.gpu_memory_gib or context.memory_limit_gib,
        padding_free=bool(getattr(args, "padding_free", False)),
        expected_completion_tokens=getattr(script_args, "expected_completion_tokens", None),
        beta=float(args.beta),
    )
