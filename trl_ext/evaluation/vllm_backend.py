"""The vLLM generation backend (GPU, or vLLM's CPU build): engine and sampling parameters, raw log-probs.

vllm is imported inside `generate_vllm` only, so `import trl_ext.evaluation` works without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from trl_ext.evaluation.samples import Sample
from trl_ext.grpo.vllm.cpu_sampler import sampler_engine_kwargs

if TYPE_CHECKING:
    from trl_ext.evaluation.config import EvalConfig

# KV cache of the CPU engine when VLLM_CPU_KVCACHE_SPACE (vLLM's own variable, GiB) is unset. On the CPU backend
# vLLM reads `gpu_memory_utilization` as a share of the machine's RAM and reserves it at start (0.9 by default);
# an explicit size reserves only what a run needs.
CPU_KV_CACHE_BYTES = 256 * 2**20


def vllm_sampling_kwargs(cfg: EvalConfig) -> dict[str, Any]:
    """The `vllm.SamplingParams(**kwargs)` the vLLM backend builds (pure, testable without vLLM).

    As the courses do: stop at `</answer>` with the stop string kept in the output. `logprobs=0` returns the sampled
    token's log-prob at each position (vLLM's default `raw_logprobs` mode: before temperature / top-p).
    """
    return {
        "n": cfg.n,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_tokens": max(cfg.max_tokens),
        "seed": cfg.seed,
        "stop": list(cfg.stop),
        "include_stop_str_in_output": True,
        "min_tokens": cfg.min_tokens,
        "logprobs": 0,
    }


def vllm_engine_kwargs(cfg: EvalConfig, max_model_len: int | None = None, cpu: bool = False) -> dict[str, Any]:
    """The `vllm.LLM(**kwargs)` the vLLM backend builds (pure).

    Args:
        cfg: the run's settings.
        max_model_len: longest prompt + largest budget, in tokens; None leaves vLLM's default (the model's context).
        cpu: the engine is vLLM's CPU build. There `cfg.dtype` is used as given (float32 by default, as the
            transformers backend, so the two agree token for token; vLLM would turn a float32 checkpoint into
            bfloat16 under `auto`), the KV cache gets an explicit size (`CPU_KV_CACHE_BYTES`, or
            VLLM_CPU_KVCACHE_SPACE), the model runs eagerly (no torch.compile at start) and the sampler with
            `trl_ext.grpo.vllm.cpu_sampler`'s fix. On a GPU the float32
            default means the checkpoint's dtype (`auto`); any other dtype is passed on.
    """
    kwargs: dict[str, Any] = {"model": cfg.model, "seed": cfg.seed}
    if cpu:
        kwargs.update(dtype=cfg.dtype, enforce_eager=True)
        kwargs.update(sampler_engine_kwargs())  # vLLM's compiled CPU sampler skips tokens on AVX2 (cpu_sampler)
        if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    else:
        kwargs["dtype"] = "auto" if cfg.dtype == "float32" else cfg.dtype
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    return kwargs


def generate_vllm(cfg: EvalConfig, prompts: list[str], tokenizer) -> list[list[Sample]]:
    """Samples `(P, n)` with vLLM. vllm is imported here only.

    Prompts are tokenized here as the transformers backend does (no special tokens added), and the engine gets the
    token ids, so both backends continue the same sequence.
    """
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    max_model_len = max(len(ids) for ids in prompt_ids) + max(cfg.max_tokens)
    llm = LLM(**vllm_engine_kwargs(cfg, max_model_len, cpu=current_platform.is_cpu()))
    requests = [{"prompt_token_ids": ids} for ids in prompt_ids]
    try:
        outputs = llm.generate(requests, SamplingParams(**vllm_sampling_kwargs(cfg)))
    finally:
        # The engine (its process and, on a GPU, the memory it reserved) ends here, not whenever `llm` is collected:
        # a second engine in this process (`trl-ext eval --compare`) was seen starting beside the first one, still
        # alive until the interpreter exited.
        llm.llm_engine.engine_core.shutdown()
    result = []
    for request in outputs:
        samples = []
        for completion in request.outputs:
            ids = list(completion.token_ids)
            lps = [float(pos[tok].logprob) for tok, pos in zip(ids, completion.logprobs or [], strict=False)]
            samples.append(Sample(token_ids=ids, logprobs=lps))
        result.append(samples)
    return result
