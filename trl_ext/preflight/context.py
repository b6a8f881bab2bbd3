"""Where a run will run (`RunContext`), and the GPU memory a plan is checked against.

The memory limit is a training GPU's FREE memory, not its total: another job's allocation on the same GPU is memory
this run cannot have. A colocated vLLM still takes `vllm_gpu_memory_utilization x total` (vLLM sizes its share from
the total), so both numbers are kept.

GPU numbering: nvidia-smi lists GPUs in PCI bus order, while CUDA numbers them fastest first unless
`CUDA_DEVICE_ORDER=PCI_BUS_ID`; an id in `CUDA_VISIBLE_DEVICES` means a CUDA index under the process's
`CUDA_DEVICE_ORDER`. `trl-ext launch` sets `CUDA_DEVICE_ORDER=PCI_BUS_ID` for the server and the trainer, so the ids
it reads from nvidia-smi name the GPUs they run on (`cuda_device_order_problem` refuses another order). Ids given as
UUIDs (`GPU-...`) are matched by UUID.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trl_ext.preflight.driver import nvidia_smi
from trl_ext.preflight.environment import world_size_from_env
from trl_ext.preflight.problems import Problem

PCI_BUS_ID = "PCI_BUS_ID"
NVIDIA_SMI_QUERY = ("--query-gpu=index,uuid,memory.total,memory.free", "--format=csv,noheader,nounits")


# Where `trl-ext launch` started the vLLM server, for the trainer's preflight line (trl_ext.launch.server_place).
LAUNCH_SERVER_ENV = "TRL_EXT_LAUNCH_SERVER"


@dataclass(frozen=True)
class RunContext:
    """Where a recipe runs.

    Attributes:
        world_size: training processes.
        distributed_type: accelerate's `distributed_type` (`NO`, `MULTI_GPU`, `DEEPSPEED`, ...).
        zero_stage: DeepSpeed ZeRO stage (0 without DeepSpeed).
        train_devices: GPU ids training uses on this machine (empty: CPU).
        server_devices: GPU ids of the vLLM server started by `trl-ext launch`, with its tensor-parallel size.
        server_tp: the server's tensor-parallel size.
        server_cpu_cores: the cores of a vLLM server `trl-ext launch` starts on the CPU (empty: not pinned); None when
            it starts none there.
        train_cpu_cores: the cores training is pinned to beside such a server (empty: not pinned).
        gpu_memory_gib: total memory of one training GPU, when known (a colocated vLLM's share is a part of it).
        memory_limit_gib: refuse a plan whose estimate exceeds this (`--gpu-memory-gb`, default the free memory).
        limit_source: where the limit came from, for the printed plan.
        check_packages: check that the extras the settings need are installed (off for planning elsewhere).
        label: the accelerate config or entry point, for messages.
        server_place: where `trl-ext launch` started the vLLM server, as a training process learns it
            (`LAUNCH_SERVER_ENV`); empty when no launcher said.
    """

    world_size: int = 1
    distributed_type: str = "NO"
    zero_stage: int = 0
    train_devices: tuple[str, ...] = ()
    server_devices: tuple[str, ...] = ()
    server_tp: int = 1
    server_cpu_cores: tuple[int, ...] | None = None
    train_cpu_cores: tuple[int, ...] = ()
    gpu_memory_gib: float | None = None
    memory_limit_gib: float | None = None
    limit_source: str = ""
    check_packages: bool = True
    label: str = ""
    server_place: str = ""


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as nvidia-smi reports it (MiB converted to GiB)."""

    index: str
    uuid: str
    total_gib: float
    free_gib: float


def parse_gpu_memory(text: str) -> list[GpuMemory]:
    """The rows of `nvidia-smi --query-gpu=index,uuid,memory.total,memory.free --format=csv,noheader,nounits`
    (lines like `0, GPU-5f1c..., 81559, 80871`); lines that do not parse are skipped."""
    gpus = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            continue
        gpus.append(GpuMemory(parts[0], parts[1], int(parts[2]) / 1024, int(parts[3]) / 1024))
    return gpus


def nvidia_smi_gpus() -> list[GpuMemory]:
    """Every GPU per nvidia-smi (PCI bus order); empty without nvidia-smi."""
    return parse_gpu_memory(nvidia_smi(*NVIDIA_SMI_QUERY))


def gpus_memory(gpu_ids: Sequence[str], gpus: Sequence[GpuMemory]) -> tuple[float, float] | None:
    """(smallest total, smallest free) GiB over `gpu_ids` (nvidia-smi indices or UUIDs); None when any is unknown."""
    by_id = {gpu.index: gpu for gpu in gpus} | {gpu.uuid: gpu for gpu in gpus}
    chosen = [by_id.get(str(gpu)) for gpu in gpu_ids]
    if not chosen or any(gpu is None for gpu in chosen):
        return None
    return min(gpu.total_gib for gpu in chosen), min(gpu.free_gib for gpu in chosen)


def cuda_device_order_problem(environ: Mapping[str, str]) -> Problem | None:
    """A problem when `CUDA_DEVICE_ORDER` is set to anything but PCI_BUS_ID (the order of nvidia-smi's indices)."""
    order = environ.get("CUDA_DEVICE_ORDER")
    if order is None or order == PCI_BUS_ID:
        return None
    return Problem(
        "CUDA_DEVICE_ORDER",
        f"is {order!r}: CUDA then numbers GPUs fastest first, while the launcher reads nvidia-smi's PCI bus order, "
        "so a GPU id could name another GPU than the one whose memory was checked",
        "unset CUDA_DEVICE_ORDER (the launcher sets PCI_BUS_ID for the server and the trainer), or set PCI_BUS_ID",
    )


def context_from_environment(script_args, training_args, environ: Mapping[str, str] | None = None) -> RunContext:
    """Where this process runs, as `accelerate launch` describes it in the environment (a training process)."""
    environ = os.environ if environ is None else environ
    world = world_size_from_env(environ)
    zero = int(environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "0") or 0)
    if environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        distributed = "DEEPSPEED"
    else:
        distributed, zero = ("MULTI_GPU" if world > 1 else "NO"), 0
    devices: tuple[str, ...] = ()
    total = free = None
    if not training_args.use_cpu:
        import torch

        if torch.cuda.is_available():
            local = int(environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
            visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
            devices = (visible[local] if local < len(visible) else str(local),)
            free_bytes, total_bytes = torch.cuda.mem_get_info(local)
            total, free = total_bytes / (1 << 30), free_bytes / (1 << 30)
    given = script_args.gpu_memory_gb
    return RunContext(
        world_size=world,
        distributed_type=distributed,
        zero_stage=zero,
        train_devices=devices,
        gpu_memory_gib=total,
        memory_limit_gib=given if given is not None else free,
        limit_source="--gpu-memory-gb" if given is not None else ("free per torch" if free is not None else ""),
        label=f"{world} process(es)" + (f", GPU {devices[0]}" if devices else ", CPU"),
        server_place=environ.get(LAUNCH_SERVER_ENV, ""),
    )
