"""Colocated vLLM weight sync that works on vLLM's CPU backend, where TRL's per-parameter sync cannot.

TRL 1.16 pushes the trainer's weights into a colocated engine one parameter at a time,
`model_runner.model.load_weights([(name, param)])` (`trl/generation/vllm_generation.py`, `sync_weights`). On the
CPU backend vLLM repacks every linear layer once its weights are loaded: `UnquantizedLinearMethod.
process_weights_after_loading` calls `dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`
(`vllm/model_executor/layers/linear.py`), which packs the weight for the oneDNN / sgl kernels into a closure
(`layer.cpu_linear`) and replaces `layer.weight` by an empty Parameter without a `weight_loader`. The next
`load_weights` then fails with `AttributeError: 'Parameter' object has no attribute 'weight_loader'`, and even a
write into the old storage would not reach the packed copy the kernels read.

vLLM's own in-place reload, `model_runner.reload_weights(weights_iterator=...)`, restores each layer to its
checkpoint layout, loads the new tensors and runs `process_weights_after_loading` again, so the layers are
repacked from the new weights. One gap remains: a tied `lm_head` gets no weights of its own, so its packed copy
(`dispatch_cpu_unquantized_gemm(..., remove_weight=False)` of the embedding) keeps the old logits weights;
`sync_weights_cpu` repacks such layers from their (updated) weight afterwards.

`trl_ext.grpo.vllm.generation.TrlExtVLLMGeneration.sync_weights` calls `sync_weights_cpu` for a colocated engine on
vLLM's CPU platform; on GPUs nothing here runs: TRL's own sync is used. The vLLM workers of a server run the same
repack after each update (`trl_ext.grpo.weight_sync.engine`). Imports nothing from vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator


def _named_params(vllm_generation) -> Iterator[tuple[str, object]]:
    # vLLM buffers a layer's tensors until all of them arrived; a copy stays valid after TRL's gather context ends.
    for name, param in vllm_generation._iter_named_params():
        yield name, param.detach().clone()


def repack_kept_weight_layers(model) -> int:
    """Rebuild the packed CPU GEMM of every layer that kept its weight (embeddings, tied or not, and LM heads).

    Args:
        model: the vLLM model (`model_runner.model`).

    Returns:
        How many layers were repacked.
    """
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if hasattr(module, "cpu_linear") and method is not None and weight is not None and weight.numel() > 0:
            method.process_weights_after_loading(module)
            count += 1
    return count


def sync_weights_cpu(vllm_generation) -> None:
    """Push the trainer's current weights into a colocated vLLM engine on the CPU backend.

    In place of TRL's `VLLMGeneration.sync_weights` (colocate mode): the same parameters, named as TRL names them
    (FSDP / DeepSpeed gathering and PEFT merging are TRL's `_iter_named_params`), loaded through vLLM's layerwise
    reload instead of per-parameter `load_weights`; then the prefix cache is reset, as TRL does.

    Args:
        vllm_generation: the trainer's `trl.generation.vllm_generation.VLLMGeneration`.
    """
    llm = vllm_generation.llm
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=_named_params(vllm_generation))
    repack_kept_weight_layers(runner.model)
    llm.reset_prefix_cache()
