"""The vLLM generation backend (GPU): engine and sampling parameters, and sampling with raw log-probs.

vllm is imported inside `generate_vllm` only, so `import trl_ext.evaluation` works without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trl_ext.evaluation.samples import Sample

if TYPE_CHECKING:
    from trl_ext.evaluation.config import EvalConfig


def vllm_sampling_kwargs(cfg: EvalConfig) -> dict[str, Any]:
    """The `vllm.SamplingParams(**kwargs)` the vLLM backend builds (pure, testable without vLLM).

    As the seeds: stop at `</answer>` with the stop string kept in the output. `logprobs=0` returns the sampled
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


def vllm_engine_kwargs(cfg: EvalConfig) -> dict[str, Any]:
    """The `vllm.LLM(**kwargs)` the vLLM backend builds (pure). The float32 default is the CPU backend's; on a GPU
    vLLM picks the checkpoint's dtype (`auto`) unless another dtype was asked for."""
    return {"model": cfg.model, "seed": cfg.seed, "dtype": "auto" if cfg.dtype == "float32" else cfg.dtype}


def generate_vllm(cfg: EvalConfig, prompts: list[str]) -> list[list[Sample]]:
    """Samples `(P, n)` with vLLM (GPU). vllm is imported here only."""
    from vllm import LLM, SamplingParams

    llm = LLM(**vllm_engine_kwargs(cfg))
    outputs = llm.generate(prompts, SamplingParams(**vllm_sampling_kwargs(cfg)))
    result = []
    for request in outputs:
        samples = []
        for completion in request.outputs:
            ids = list(completion.token_ids)
            lps = [float(pos[tok].logprob) for tok, pos in zip(ids, completion.logprobs or [], strict=False)]
            samples.append(Sample(token_ids=ids, logprobs=lps))
        result.append(samples)
    return result
