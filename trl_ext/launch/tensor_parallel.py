"""The vLLM server's tensor parallelism: which sizes vLLM accepts for a model, and which one the plan picks and why.

Valid sizes (vLLM 0.31): TP shards the attention heads, the KV heads and the MLP over the TP ranks, and vLLM refuses
a size that does not divide them (`vllm/config/model.py` `verify_with_parallel_config`: "Total number of attention
heads ... must be divisible by tensor parallel size"; `QKVParallelLinear` divides the KV heads by TP or TP by the KV
heads; the column-parallel MLP divides `intermediate_size` by TP). `VocabParallelEmbedding` and the LM head pad the
vocabulary to a multiple of 64 (`pad_vocab_size(V, 64)`) and divide that by TP (`divide(num_embeddings_padded,
tp_size)`, which asserts; `vllm/model_executor/layers/vocab_parallel_embedding.py`). Qwen's 151,936 = 2^7 x 1187
allows any power of two up to 128.

The pick (`choose_tensor_parallel`): not the largest valid size. A small model decodes about as fast unsharded: a
decode step of a 1.7 B model reads ~3.4 GB of bf16 weights (about a millisecond at an H100's bandwidth) and TP adds
two all-reduces per layer per step, so past TP 1-2 the server gains little while the GPUs it takes could train. The
rule: the smallest valid size that puts at most `SERVER_PARAMS_PER_GPU` (4 B) parameters, 8 GB of bf16 weights, on
each server GPU, so that most of each holds KV cache; the largest valid size when the free GPUs allow no such one.
Every shipped model (0.6-1.7 B) gets TP 1; a 7-8 B model TP 2, a 14 B model TP 4. `--vllm-tp N` overrides it.
"""

from __future__ import annotations

from collections.abc import Sequence

from trl_ext.preflight.models import ModelShape

# vLLM 0.31 pads the vocabulary to a multiple of this before sharding it (DEFAULT_VOCAB_PADDING_SIZE).
VLLM_VOCAB_PADDING = 64
# The rule above: the smallest TP that puts at most this many parameters on each server GPU.
SERVER_PARAMS_PER_GPU = 4e9


def padded_vocab(vocab_size: int) -> int:
    """The vocabulary as vLLM shards it: rounded up to a multiple of 64 (`pad_vocab_size`)."""
    return -(-vocab_size // VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING


def tensor_parallel_ok(shape: ModelShape, tp: int) -> bool:
    """Whether vLLM can shard `shape` over `tp` ranks: TP divides the attention heads, the MLP width and the
    64-padded vocabulary, and the KV heads divide TP (replicated) or TP divides them (module docstring)."""
    kv = shape.num_kv_heads
    kv_ok = tp % kv == 0 if tp >= kv else kv % tp == 0
    divides = shape.num_heads % tp == 0 and shape.intermediate_size % tp == 0
    return divides and kv_ok and padded_vocab(shape.vocab_size) % tp == 0


def tensor_parallel_sizes(shape: ModelShape | None, max_gpus: int) -> list[int]:
    """The tensor-parallel sizes up to `max_gpus` that shard `shape` (powers of two when the shape is unknown:
    head counts are a power of two times a small factor)."""
    if shape is None:
        return [1 << i for i in range(max(max_gpus, 1).bit_length())]
    return [tp for tp in range(1, max_gpus + 1) if tensor_parallel_ok(shape, tp)]


def choose_tensor_parallel(shape: ModelShape | None, sizes: Sequence[int]) -> int:
    """The server's TP among `sizes` (those that shard the model and fit the free GPUs), by the module docstring's
    rule: the smallest with at most `SERVER_PARAMS_PER_GPU` parameters per GPU, else the largest. With the model's
    shape unknown: the largest (its size is unknown too)."""
    if shape is None:
        return max(sizes)
    return next((t for t in sorted(sizes) if shape.params / t <= SERVER_PARAMS_PER_GPU), max(sizes))


def tensor_parallel_note(shape: ModelShape | None, tp: int, free: int) -> str:
    """Why the server runs at `tp` on `free` free GPUs (a line of the plan): the rule, and what the rest could do."""
    if shape is None:
        return f"tp {tp}: the largest power of two up to the {free} free GPU(s) (the model's size is unknown)"
    per_gpu = shape.params / tp
    if per_gpu > SERVER_PARAMS_PER_GPU:
        return (
            f"tp {tp}: the largest size that shards {shape.name} on {free} free GPU(s) "
            f"({per_gpu / 1e9:.2f} B parameters per GPU, above the rule's {SERVER_PARAMS_PER_GPU / 1e9:g} B)"
        )
    note = (
        f"tp {tp}: the smallest size that shards {shape.name} with at most {SERVER_PARAMS_PER_GPU / 1e9:g} B "
        f"parameters per GPU ({per_gpu / 1e9:.2f} B, {2 * per_gpu / 1e9:.1f} GB of bf16 weights)"
    )
    if free > tp:
        note += "; more TP gains a model this size little: the other free GPU(s) could train, or pass --vllm-tp N"
    return note
