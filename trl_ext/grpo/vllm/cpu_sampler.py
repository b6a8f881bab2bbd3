"""vLLM's CPU engine sampling from the right distribution, wherever trl_ext starts one.

vLLM 0.31 samples on the CPU with `compiled_random_sample` (`vllm/v1/sample/ops/topk_topp_sampler.py`): softmax,
exponential noise drawn inside the compiled graph, `argmax(probs / noise)`, all compiled by torch's inductor into one
C++ kernel. Compiled for AVX2 (`ATEN_CPU_CAPABILITY=avx2` on an AVX-512 host) it was measured never to draw about
half of a 103-token vocabulary (2,000 draws: 52 tokens seen; 98 with the AVX-512 kernels, 102 with the same code
run eagerly under `TORCHDYNAMO_DISABLE=1`). The log-probs of the drawn tokens stay right, so nothing downstream (TRL's
importance ratio, a pass@N) notices. docs/launch.md has the smallest reproduction.

The fix is vLLM's own `use_fp64_gumbel` setting (`--use-fp64-gumbel` for `vllm serve` / `trl vllm-serve`,
`LLM(use_fp64_gumbel=True)`): with it `TopKTopPSampler.forward_cpu` skips the compiled kernel and samples eagerly
(`exponential_` in float64, then `argmax(probs / noise)`), the same exponential-race sampling without inductor. It
touches nothing else (the model still runs as configured), which is narrower than `TORCHDYNAMO_DISABLE=1` (every
torch.compile of the process). The launcher's CPU server layout (`trl_ext.launch.cpu_layout`), the evaluation's
vLLM backend (`trl_ext.evaluation.vllm_backend`) and the tests' servers apply it; an engine colocated on the CPU (TRL
builds it, without a way to pass the setting) gets it from `fix_engine_sampler` as soon as TRL built it, in
`TrlExtVLLMGeneration._init_vllm` (`trl_ext.grpo.vllm.generation`: the GRPO and expert-iteration trainers and SFT
validation's colocated engine). `fix_engine_sampler` sets the sampler's flag, which its `forward_cpu` reads at every
step; it replaces no method.
benchmarks/bench_vllm_cpu_sampler.py measures what it costs in tokens/s.

Imports nothing heavy: vLLM objects are only touched where they are passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The `vllm serve` flag and the `vllm.LLM` / `EngineArgs` field of the fix.
SAMPLER_FLAG = "--use-fp64-gumbel"
SAMPLER_FIELD = "use_fp64_gumbel"


def sampler_engine_kwargs() -> dict[str, Any]:
    """The `vllm.LLM(**kwargs)` entries of the fix (for a CPU engine)."""
    return {SAMPLER_FIELD: True}


def stated_flags(vllm_args: Sequence[str]) -> set[str]:
    """The flag names `vllm_args` state, dashed and without their dashes or values (`--max_model_len=64` ->
    `max-model-len`): vLLM's CLI takes either spelling."""
    return {arg.lstrip("-").split("=")[0].replace("_", "-") for arg in vllm_args if arg.startswith("-")}


def sampler_server_args(vllm_args: Sequence[str]) -> list[str]:
    """`vllm_args` plus `--use-fp64-gumbel` unless they state it (`--use-fp64-gumbel` / `--no-use-fp64-gumbel`)."""
    if stated_flags(vllm_args) & {"use-fp64-gumbel", "no-use-fp64-gumbel"}:
        return list(vllm_args)
    return [*vllm_args, SAMPLER_FLAG]


def engine_sampler(llm):
    """The `TopKTopPSampler` of an in-process `vllm.LLM` (colocated with `distributed_executor_backend=
    "external_launcher"`, or `VLLM_ENABLE_V1_MULTIPROCESSING=0`), or of the engine a `RecordingEngine` holds."""
    executor = llm.llm_engine.model_executor
    worker = executor.driver_worker
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    return runner.sampler.topk_topp_sampler


def fix_engine_sampler(llm, on: bool = True) -> None:
    """Turn the fix on (or off, for the reproduction) in an in-process engine built without it: `forward_cpu` reads
    the flag at every step. TRL builds a colocated `LLM` itself, without a way to pass `use_fp64_gumbel`."""
    engine_sampler(llm).use_fp64_gumbel = on
