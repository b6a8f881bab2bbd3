"""Peak GPU memory of one training process, estimated from the model config, batch, lengths and precision (pure).

A step of GRPO training goes through these phases; the estimate is the largest of them plus a fixed allowance
for the CUDA context and allocator slack (`RUNTIME_OVERHEAD_GIB`):

- train: weights + gradients + optimizer states + activations of one micro-batch + TRL's log-prob head + autocast's
  weight cache (+ DDP's gradient buckets; + the colocated vLLM share, or its sleeping allowance); the optimizer step
  adds the foreach temporaries of `torch.optim.AdamW` (one state-sized buffer; none for the fused or 8-bit
  optimizers).
- generation: weights + optimizer states (gradients are freed after the step) + the generator: nothing on the
  training GPU in server mode, the colocated vLLM share (`vllm_gpu_memory_utilization x GPU memory`), or the
  transformers KV cache of the process's whole rollout slice.
- reference (with a reference model): its no-grad forward of one micro-batch after each generation, with its
  autocast cache, beside the colocated engine as it is while training.
- eval: a no-grad forward of one validation batch with its autocast cache, beside the generator as it is after the
  batch's generation (a colocated engine asleep in sleep mode; the transformers KV cache counted as still held).

Bytes per parameter (P parameters, W processes; ZeRO after https://arxiv.org/abs/1910.02054):

    precision                     weights  gradients  optimizer (AdamW)
    fp32_master (fp32 + autocast)   4 P      4 P        8 P  (8-bit AdamW: 2 P + 6 E)
    pure_bf16 (bf16 everything)     2 P      2 P        4 P  (8-bit AdamW: 2 P + 6 E)
    DeepSpeed ZeRO-2 (bf16)         2 P      2 P / W    (4 + 8) P / W   (fp32 master copy + fp32 states, sharded)
    DeepSpeed ZeRO-3 (bf16)         2 P / W  2 P / W    (4 + 8) P / W   + two gathered layers and the embedding

DeepSpeed's bf16 optimizer keeps the master copy and AdamW's two moments in fp32 whatever the module's dtype: the
ZeRO paper's K = 12 bytes per parameter (`(4 + K') P / W` with K' the fp32 states of the optimizer: 8 for AdamW,
2 + 6 E / P for bitsandbytes' 8-bit AdamW).

The reference model: with `beta != 0` and no LoRA, TRL 1.16's `GRPOTrainer.__init__` loads a second copy of the
model with the policy's `model_init_kwargs` (its dtype: 4 P under fp32 master weights, 2 P in pure bf16); DeepSpeed
prepares it at stage 0 unless ZeRO-3 (`trl.models.utils.prepare_deepspeed`), as a bf16 engine: 2 P, or 2 P / W
under ZeRO-3. It stays in every phase and runs one no-grad forward per micro-batch after generation. With LoRA the
reference is the base with the adapter disabled: no copy.

Autocast's weight cache: `torch.autocast` keeps the bf16 cast of each fp32 leaf tensor that requires grad until
the outermost autocast region exits (`cached_cast` in aten/src/ATen/autocast_mode.cpp; TRL wraps each log-prob
forward in one region, `accelerator.autocast()`). Under fp32 master weights that is every decoder linear layer's
weight and bias, 2 bytes each (2.62 GiB for Qwen3-1.7B), in the training forward and in the no-grad validation and
reference forwards alike (no_grad does not change `requires_grad`); not the embedding (`F.embedding` is no autocast
op), the norms (elementwise) or TRL's fused head (it casts its own slices). None in pure bf16 (nothing to cast) or
under DeepSpeed (accelerate does not autocast; the weights are bf16); with LoRA only the fp32 adapters (the frozen
base is cast anew at each use).

8-bit AdamW from bitsandbytes keeps 32-bit states for the token embedding (E = V x H parameters, the tied LM head
with it): the HF Trainer registers `optim_bits: 32` for every `nn.Embedding` when it builds a bitsandbytes 8-bit
optimizer (transformers 5.17, `trainer.py` `create_optimizer`: `manager.register_module_override(module, "weight",
{"optim_bits": 32})`), so E costs 8 bytes instead of 2: +1.3 GiB for Qwen2.5-1.5B, +1.7 GiB for Qwen3-1.7B.
torchao's `adamw_torch_8bit` has no such override. Not counted: bitsandbytes' per-block absmax (4 bytes per 256
values, 1.6% of the 8-bit states) and the 32-bit states it keeps for tensors under 4096 values (norms, biases).

A colocated vLLM that sleeps (`vllm_enable_sleep_mode`, level 2 in TRL 1.16) frees its weights and KV cache but
keeps what lives outside its sleep pools, chiefly the CUDA graphs it captured: `SLEEPING_VLLM_GIB` stays on the
GPU while the trainer steps (an allowance, not a measurement; vLLM logs its "CUDA graph pool memory" at start).
TRL's `VLLMGeneration.generate` puts it back to sleep right after `llm.generate`, so the reference and validation
forwards run beside the allowance too.

LoRA (`use_peft`) keeps the base weights frozen in their dtype; only the adapters, `r x (in + out)` per targeted
linear layer, have fp32 weights, gradients and states.

Activations of a micro-batch of N = b x (prompt + completion) tokens, per layer and token (bytes; residual stream in
the weight dtype, layer internals in bf16 under autocast): `4 H x res + 2 x (3 q + 3 kv + 2 H + 5 I)`. With gradient
checkpointing only each layer's input (`N x H x res`) is kept, plus two layers' worth during recomputation. A
no-grad forward (validation) holds one layer at a time: `2 H x res + 2 x (2 q + 2 kv + 3 I)` per token.

Log-prob head: TRL 1.16 never builds the `(tokens, vocab)` logits (`trl.kernels.ChunkedLogProbFunction`, which
`GRPOTrainer._get_per_token_logps_and_entropies` calls with `fused_lm_head=True` on the padded layout, and
`trl_ext.grpo.packing` on the packed one): it projects tiles of 4096 tokens x 32768 vocabulary entries and, in the
backward, accumulates the LM head's gradient in fp32 (`V x H x 4` bytes; 1.2 GiB for Qwen3's 151,936 x 2048) plus fp32
gradients of the scored hidden states. Materialised fp32 logits would cost `tokens x V x 4` (Qwen3-1.7B, 2 x 1024
completion tokens: 1.2 GiB; 256 x 1024 in one validation batch: 148 GiB); the estimate reports that number for
reference, and counts it instead of the tile when `TrainingSetup.chunked_logprobs` is False.

Padding-free (`padding_free`): a micro-batch's rows are packed into one sequence of their real tokens, so
its activations and scored hidden states follow `b x (prompt + E)` tokens, E the completion length a row is expected
to have (`expected_completion_tokens`; unset: `EXPECTED_COMPLETION_FRACTION x max_completion_length`), instead of
`b x (prompt + max_completion_length)`. The prompt stays the task's longest (conservative). That is an expected
micro-batch, not a bound: one whose completions all reach `max_completion_length` packs as many tokens as the padded
layout, so the estimate notes that worst case (the padded estimate) beside it. The validation forward runs through the
same packed log-prob path and gets the same `E`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from trl_ext.preflight.models import ModelShape
from trl_ext.preflight.setup import TrainingSetup

GIB = 1 << 30
# CUDA context, cuBLAS workspaces and caching-allocator fragmentation, not visible to the tensor accounting.
RUNTIME_OVERHEAD_GIB = 1.5
# trl/trainer/utils.py (TRL 1.16): _CHUNKED_LOGPROB_CHUNK_SIZE, the vocabulary entries of one log-prob tile.
LOGPROB_VOCAB_CHUNK = 32768
# HF `optim` names of the 8-bit optimizers: one byte per state (bitsandbytes' and torchao's).
EIGHT_BIT_OPTIMIZERS = (
    "adamw_bnb_8bit",
    "adamw_8bit",
    "paged_adamw_8bit",
    "adamw_torch_8bit",
    "lion_8bit",
    "paged_lion_8bit",
)
# The 8-bit optimizers HF builds from bitsandbytes, whose nn.Embedding weights get 32-bit states (module docstring).
_BNB_EIGHT_BIT = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "lion_8bit", "paged_lion_8bit")
# What a sleeping colocated vLLM keeps on the GPU (CUDA graph pool and buffers outside its sleep pools), GiB.
SLEEPING_VLLM_GIB = 1.0


def optimizer_state_bytes(optim: str, weight_bytes: int) -> tuple[float, float]:
    """Bytes per trainable parameter of the optimizer's states, and of its step's foreach temporaries.

    `torch.optim.AdamW` keeps `exp_avg` and `exp_avg_sq` in the weight dtype; its default foreach step allocates
    one more state-sized buffer (`_foreach_sqrt(exp_avg_sq)`), which the fused kernel does not. bitsandbytes' 8-bit
    optimizers keep both states in one byte each. Unknown optimizers are counted as AdamW.
    """
    name = optim.lower()
    if name in EIGHT_BIT_OPTIMIZERS:
        return (1.0 if "lion" in name else 2.0), 0.0
    if name.startswith("sgd"):
        return 0.0, 0.0
    if name in ("adafactor",):
        return 0.1 * weight_bytes, 0.0  # factored second moment: rows + columns, a small fraction of P
    fused = "fused" in name
    return 2.0 * weight_bytes, 0.0 if fused else float(weight_bytes)


def optimizer_states_bytes(shape: ModelShape, optim: str, weight_bytes: int, lora_rank: int | None = None) -> float:
    """Bytes of the optimizer states of every trainable parameter: `optimizer_state_bytes` per parameter, except a
    bitsandbytes 8-bit optimizer's 32-bit states for the embedding (module docstring). LoRA leaves the embedding
    frozen: no state for it."""
    if lora_rank is not None:
        return shape.lora_params(lora_rank) * optimizer_state_bytes(optim, weight_bytes)[0]
    per_param = optimizer_state_bytes(optim, weight_bytes)[0]
    if optim.lower() not in _BNB_EIGHT_BIT:
        return shape.params * per_param
    full = per_param * 4  # 32-bit: one or two fp32 states where the 8-bit optimizer keeps one byte each
    return (shape.params - shape.embedding_params) * per_param + shape.embedding_params * full


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated bytes of one training process, per phase and component.

    Attributes:
        phases: `{phase: {component: bytes}}` for `train`, `optimizer step`, `generation`, `eval`.
        overhead: the fixed runtime allowance in bytes.
        full_logits_bytes: what materialised fp32 logits of one micro-batch would take (for reference).
    """

    phases: dict[str, dict[str, float]]
    overhead: float = RUNTIME_OVERHEAD_GIB * GIB
    full_logits_bytes: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def phase_total(self, phase: str) -> float:
        return sum(self.phases[phase].values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_total)

    @property
    def tensors_bytes(self) -> float:
        """The largest phase: what `torch.cuda.max_memory_allocated` should come close to."""
        return self.phase_total(self.peak_phase)

    @property
    def peak_bytes(self) -> float:
        """Tensors plus the runtime allowance: compare with the GPU's memory."""
        return self.tensors_bytes + self.overhead

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    def render(self) -> list[str]:
        peak = self.peak_phase
        parts = ", ".join(f"{name} {value / GIB:.2f}" for name, value in self.phases[peak].items() if value)
        lines = [
            f"peak {self.peak_gib:.1f} GiB in the {peak} phase = {parts} + runtime {self.overhead / GIB:.1f} (GiB)",
            "phases: " + ", ".join(f"{name} {self.phase_total(name) / GIB:.1f}" for name in self.phases) + " GiB",
        ]
        return lines + list(self.notes)


def _activation_bytes_per_token_layer(shape: ModelShape, residual_bytes: int) -> int:
    """Bytes one token keeps for the backward in one decoder layer (module docstring)."""
    h, i = shape.hidden_size, shape.intermediate_size
    return 4 * h * residual_bytes + 2 * (3 * shape.q_dim + 3 * shape.kv_dim + 2 * h + 5 * i)


def _forward_bytes_per_token(shape: ModelShape, residual_bytes: int) -> int:
    """Bytes one token holds at the peak of a no-grad layer forward: residual in and out, and the bf16 q / k / v /
    attention output and the MLP's gate, up and their product."""
    return 2 * shape.hidden_size * residual_bytes + 2 * (
        2 * shape.q_dim + 2 * shape.kv_dim + 3 * shape.intermediate_size
    )


def estimate_memory(shape: ModelShape, setup: TrainingSetup) -> MemoryEstimate:
    """Peak memory of one training process (module docstring: the formulas and what they leave out). Pure: the same
    shape and setup give the same estimate; `trl_ext.preflight.fit` calls it for every alternative it tries."""
    notes = []
    if setup.generator == "colocate" and setup.gpu_memory_gib is None:
        notes.append("colocated vLLM share not counted: GPU memory unknown (pass --gpu-memory-gb)")
    if setup.padding_free:
        worst = MemoryEstimate(phases=_phases(shape, replace(setup, padding_free=False)))
        notes.append(
            f"padding-free: {setup.micro_batch} x ({setup.prompt_tokens} + {setup.row_completion_tokens} expected) "
            f"tokens per micro-batch; {worst.peak_gib:.1f} GiB if every completion of one reaches "
            f"{setup.completion_tokens} (the padded estimate)"
        )
    full_logits = setup.micro_batch * setup.row_completion_tokens * shape.vocab_size * 4
    return MemoryEstimate(phases=_phases(shape, setup), full_logits_bytes=float(full_logits), notes=tuple(notes))


def _phases(shape: ModelShape, setup: TrainingSetup) -> dict[str, dict[str, float]]:
    """`{phase: {component: bytes}}` of one training process (module docstring)."""
    resident, grads, temp = _model_states(shape, setup)
    residual = 2 if setup.weight_bytes == 2 else 4
    completion = setup.row_completion_tokens  # max_completion_length, or the expected length when padding-free
    tokens = setup.micro_batch * (setup.prompt_tokens + completion)
    per_layer = _activation_bytes_per_token_layer(shape, residual)
    if setup.gradient_checkpointing:
        activations = tokens * (shape.num_layers * shape.hidden_size * residual + 2 * per_layer)
    else:
        activations = tokens * shape.num_layers * per_layer
    scored = setup.micro_batch * completion
    logprob_head = _logprob_head_bytes(shape, setup, scored, residual, setup.lora_rank is not None)

    vllm_share = 0.0
    if setup.generator == "colocate" and setup.gpu_memory_gib is not None:
        vllm_share = setup.vllm_gpu_memory_utilization * setup.gpu_memory_gib * GIB
    awake_while_training = vllm_share if not setup.vllm_sleep else 0.0
    asleep = SLEEPING_VLLM_GIB * GIB if setup.generator == "colocate" and setup.vllm_sleep else 0.0

    train = {
        **resident,
        "gradients": grads,
        "activations": float(activations),
        "log-prob head": float(logprob_head),
    }
    if awake_while_training:
        train["colocated vLLM"] = awake_while_training
    autocast = autocast_cache_bytes(shape, setup)
    if autocast:
        train["autocast weight cache"] = autocast
    step = {**resident, "gradients": grads, "optimizer step temporaries": temp}
    if awake_while_training:
        step["colocated vLLM"] = awake_while_training
    if asleep:
        train["sleeping vLLM"] = step["sleeping vLLM"] = asleep
    vllm_beside_forward = {"sleeping vLLM": asleep} if asleep else {}
    if awake_while_training:
        vllm_beside_forward = {"colocated vLLM": awake_while_training}
    generation = {**resident, **_generator_bytes(shape, setup, setup.generation_batch, vllm_share)}
    phases = {"train": train, "optimizer step": step, "generation": generation}
    if setup.reference_model:
        # After each generation, TRL scores the rollout with the reference copy, one micro-batch at a time without
        # gradients, beside the colocated engine (asleep when sleep mode is on).
        reference = {**resident, **vllm_beside_forward}
        reference["reference forward"] = _no_grad_forward_bytes(shape, setup, setup.micro_batch, residual)
        if autocast:
            reference["autocast weight cache"] = autocast  # the reference's weights are fp32 leaves too
        phases["reference"] = reference
    if setup.eval_batch:
        # TRL's prediction_step runs the loss forward on the whole validation batch without gradients (the
        # reference's forward over the same batch, when there is one, comes before it and is the same size), after
        # the batch's generation: beside a colocated engine as it is while training (asleep in sleep mode), beside
        # the transformers KV cache of the batch (counted as if still held).
        eval_sequences = setup.eval_batch * setup.eval_generations
        if setup.generator == "colocate":
            beside = vllm_beside_forward
        else:
            beside = _generator_bytes(shape, setup, eval_sequences, vllm_share)
        phases["eval"] = {
            **resident,
            **beside,
            "validation forward": _no_grad_forward_bytes(shape, setup, eval_sequences, residual),
        }
        if autocast:
            phases["eval"]["autocast weight cache"] = autocast
    return phases


def _no_grad_forward_bytes(shape: ModelShape, setup: TrainingSetup, sequences: int, residual: int) -> float:
    """A log-prob forward of `sequences` rows without gradients: one layer's internals and the residual stream in
    and out per token, the scored hidden states, and one head tile at a time."""
    completion = setup.row_completion_tokens
    tokens, scored = sequences * (setup.prompt_tokens + completion), sequences * completion
    forward = tokens * _forward_bytes_per_token(shape, residual)
    return float(forward + scored * shape.hidden_size * residual + _head_tile_bytes(shape, setup, scored))


def autocast_cache_bytes(shape: ModelShape, setup: TrainingSetup) -> float:
    """bf16 copies autocast keeps of the fp32 weights that require grad, until the outermost autocast region (one
    forward) exits: every decoder linear layer's weight and bias (module docstring); LoRA: the adapters only."""
    if not setup.autocast_cache:
        return 0.0
    if setup.lora_rank is not None:
        return 2.0 * shape.lora_params(setup.lora_rank)
    return 2.0 * shape.num_layers * shape.layer_linear_params


def _model_states(shape: ModelShape, setup: TrainingSetup) -> tuple[dict[str, float], float, float]:
    """What the model keeps in every phase (weights, optimizer states, DDP buckets or ZeRO-3's gathered layers), its
    gradients, and the optimizer step's temporaries (module docstring's table)."""
    p, w = shape.params, setup.world_size
    zero = setup.zero_stage
    lora = setup.lora_rank is not None
    trainable = shape.lora_params(setup.lora_rank) if lora else p
    train_bytes = 4 if lora else setup.weight_bytes  # peft keeps adapters in fp32 (autocast_adapter_dtype)
    foreach = optimizer_state_bytes(setup.optim, train_bytes)[1]

    weights = float(p * setup.weight_bytes) + (trainable * 4 if lora else 0)
    grads = float(trainable * train_bytes)
    optimizer = optimizer_states_bytes(shape, setup.optim, train_bytes, setup.lora_rank)
    temp = float(trainable * foreach)
    buckets = 0.0
    if zero >= 1:
        # DeepSpeed: bf16 weights; the fp32 master copy and the optimizer's states, in fp32 whatever the weights' dtype
        # (AdamW: 4 + 8 bytes), sharded over W; ZeRO-2/3 shard the gradients too.
        optimizer = (trainable * 4 + optimizer_states_bytes(shape, setup.optim, 4, setup.lora_rank)) / w
        temp = 0.0
        if zero >= 2:
            grads = trainable * 2 / w
        if zero == 3:
            weights = p * 2 / w
            buckets = 2.0 * (2 * shape.layer_params + shape.embedding_params)  # gathered layers, embedding
    elif setup.ddp and w > 1:
        buckets = grads
    resident = {"weights": weights, "optimizer states": optimizer}
    if buckets:
        resident["ZeRO-3 gathered params" if zero == 3 else "DDP gradient buckets"] = buckets
    if setup.reference_model:
        # TRL loads the copy in the policy's dtype; DeepSpeed's engine casts it to bf16 and shards it under ZeRO-3.
        resident["reference model"] = p * 2 / w if zero == 3 else float(p * setup.weight_bytes)
    return resident, grads, temp


def _head_tile_bytes(shape: ModelShape, setup: TrainingSetup, scored_tokens: int) -> float:
    """One `(tokens, vocab)` tile of TRL's chunked log-prob kernel in bf16, or the materialised fp32 logits of every
    scored token when `chunked_logprobs` is off."""
    if not setup.chunked_logprobs:
        return float(scored_tokens * shape.vocab_size * 4)
    return float(min(scored_tokens, setup.logprob_token_chunk) * min(LOGPROB_VOCAB_CHUNK, shape.vocab_size) * 2)


def _logprob_head_bytes(shape: ModelShape, setup: TrainingSetup, scored: int, residual: int, lora: bool) -> float:
    """The training log-prob head: TRL's fp32 LM-head gradient accumulator (chunked kernel, full fine-tuning), fp32
    gradients and a copy of the scored hidden states, and one tile (or the full logits; `_head_tile_bytes`)."""
    head_grad = 0 if (lora or not setup.chunked_logprobs) else shape.embedding_params * 4
    return float(head_grad + scored * shape.hidden_size * (4 + residual) + _head_tile_bytes(shape, setup, scored))


def _generator_bytes(shape: ModelShape, setup: TrainingSetup, sequences: int, vllm_share: float) -> dict[str, float]:
    if setup.generator == "colocate":
        return {"colocated vLLM": vllm_share}
    if setup.generator == "server":
        return {}
    # transformers generate(): a bf16 KV cache for every sequence of the batch at full length, plus the fp32
    # logits and probabilities of the last position.
    length = setup.prompt_tokens + setup.completion_tokens
    kv = sequences * length * shape.kv_bytes_per_token(2)
    logits = sequences * shape.vocab_size * 4 * 2
    return {"KV cache (transformers generate)": float(kv + logits)}
