"""The server layout on a machine without a GPU: vLLM's CPU build serves on some cores, the trainer runs on the
others, and the weights go from the trainer into the server over gloo after every optimizer step.

TRL's `trl vllm-serve` selects vLLM's NCCL weight-transfer engine, which needs CUDA; on the CPU the server gets
`--weight-transfer-config '{"backend": "trl_ext_gloo"}'` (a later flag wins over TRL's), the engine our
`vllm.general_plugins` entry point registers (`trl_ext.grpo.weight_sync.plugin`). The cores this process may use are
split in two halves, the server's first (`taskset -c`, inherited by every process either side starts; vLLM binds
its OpenMP threads to the cores it is allowed, torch sizes its thread pool to them), so generation and training do
not compete for a core. With one core there is nothing to split: both run unpinned.

On the CPU, `gpu_memory_utilization` is a share of the machine's RAM that vLLM reserves and touches (TRL's server
default 0.9; the recipes' 0.85 is meant for a GPU), so the server gets an explicit KV cache of `CPU_KV_CACHE_BYTES`
instead, unless `--vllm-args` size it; the plan says so. A trainer that computes without autocast (`bf16: false`)
gets a server in its own dtype (`--dtype`; vLLM's `auto` runs a float32 checkpoint in bfloat16 on the CPU), so the
server samples from the trainer's distribution to float rounding.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace

from trl_ext.grpo.vllm.cpu_sampler import sampler_server_args, stated_flags
from trl_ext.grpo.weight_sync.plugin import BACKEND, SERVER_LOG_ENV, server_args
from trl_ext.launch.configs import LaunchError
from trl_ext.launch.planning import Command

CPU_KV_CACHE_BYTES = 256 * 2**20
_KV_FLAGS = {"kv-cache-memory-bytes", "kv-cache-memory", "gpu-memory-utilization"}


@dataclass(frozen=True)
class CpuLayout:
    """Where the server and the trainer run on the CPU: their cores (empty: unpinned) and the plan's note."""

    server_cores: tuple[int, ...] = ()
    train_cores: tuple[int, ...] = ()
    note: str = ""


def allowed_cores() -> list[int]:
    """The cores this process may run on (`sched_getaffinity`), sorted; all `os.cpu_count()` where unknown."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def split_cores(cores: Sequence[int] | None = None, taskset: str | None = "") -> CpuLayout:
    """The server gets the first half of `cores` (at least one), the trainer the rest; unpinned with one core or
    without `taskset`.

    Args:
        cores: the cores to split (default `allowed_cores()`).
        taskset: the `taskset` executable (default: looked up on PATH; None: not available).
    """
    cores = sorted(allowed_cores() if cores is None else cores)
    taskset = shutil.which("taskset") if taskset == "" else taskset
    transfer = f"weights synced after every optimizer step over gloo (weight-transfer backend {BACKEND})"
    if len(cores) < 2 or taskset is None:
        why = f"{len(cores)} core" if len(cores) < 2 else "no `taskset` on PATH"
        return CpuLayout(note=f"CPU server layout: server and trainer share the CPU ({why}, not pinned); {transfer}")
    half = max(1, len(cores) // 2)
    server, train = tuple(cores[:half]), tuple(cores[half:])
    note = (
        f"CPU server layout: vLLM server pinned to core(s) {_cores(server)}, trainer to core(s) {_cores(train)} "
        f"(taskset -c); {transfer}"
    )
    return CpuLayout(server, train, note)


def cpu_server_args(
    vllm_args: Sequence[str], recipe_share: float | None, compute_dtype: str | None = None
) -> tuple[list[str], str]:
    """`vllm_args` plus the CPU weight transfer's flags, the sampler fix (`--use-fp64-gumbel`,
    `trl_ext.grpo.vllm.cpu_sampler`), `--dtype compute_dtype` (the trainer's, without autocast) and
    `--kv-cache-memory-bytes CPU_KV_CACHE_BYTES`, each unless `vllm_args` state it; and the plan's note on the KV cache
    (the recipe's GPU share `recipe_share` is not used)."""
    stated = stated_flags(vllm_args)
    refuse_speculative(stated)
    args = list(vllm_args)
    if "weight-transfer-config" not in stated:
        args += server_args()
    args = sampler_server_args(args)  # vLLM's compiled CPU sampler skips tokens on AVX2 (cpu_sampler)
    if compute_dtype is not None and "dtype" not in stated:
        args += ["--dtype", compute_dtype]
    if stated & _KV_FLAGS:
        return args, "the CPU server's KV cache: as --vllm-args size it"
    args += ["--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
    unused = ""
    if recipe_share is not None:
        unused = f" (the recipe's vllm_gpu_memory_utilization {recipe_share:g}, a GPU share, is not used)"
    note = (
        f"the CPU server's KV cache: {CPU_KV_CACHE_BYTES // 2**20} MiB{unused}; "
        "--vllm-args '--kv-cache-memory-bytes N' sets another size"
    )
    return args, note


def refuse_speculative(stated: set[str]) -> None:
    """Raises LaunchError when the CPU server's flags (`stated`, dashed names) ask for speculative decoding: with it
    vLLM 0.31's CPU server answers every request TRL sends (`logprobs=0`) with HTTP 400 ("Out of range float values
    are not JSON compliant"), after the server's start."""
    for flag in ("speculative-config", "speculative-model", "num-speculative-tokens"):
        if flag in stated:
            raise LaunchError(
                f"--vllm-args --{flag}: vLLM's CPU server answers TRL's generation requests (logprobs=0, the "
                "sampled tokens' log-probs) with HTTP 400 when it decodes speculatively; remove --"
                f"{flag} from --vllm-args (speculative decoding works on a GPU server)"
            )


def pin(command: Command, cores: Sequence[int]) -> Command:
    """`command` under `taskset -c CORES` (unchanged for no cores)."""
    if not cores:
        return command
    return replace(command, argv=("taskset", "-c", _cores(cores), *command.argv))


def with_server_log(command: Command, log) -> Command:
    """The trainer `command` told where the server logs, so a lost server is named with its log."""
    return replace(command, env={**command.env, SERVER_LOG_ENV: str(log)})


def _cores(cores: Sequence[int]) -> str:
    return ",".join(map(str, cores))
