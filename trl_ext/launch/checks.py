"""The launcher's checks over a planned launch, before any server or trainer starts: the machine (GPU numbering,
the NVIDIA driver against torch's CUDA) and the recipe's preflight (`trl_ext.recipes.preflight_recipe`: batches for
the planned number of training processes, memory against the training GPUs' free memory, the NCCL group port,
output_dir, wandb, sources).

They take what `trl_ext.launch.planning` decided and return or raise; they decide nothing of the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from trl_ext.launch.configs import AccelerateSetup, LaunchError
from trl_ext.preflight.context import RunContext, cuda_device_order_problem, gpus_memory, nvidia_smi_gpus
from trl_ext.preflight.driver import driver_problem, nvidia_smi
from trl_ext.preflight.plan import Preflight
from trl_ext.preflight.problems import PreflightError
from trl_ext.recipes import TASK_DEFAULTS, preflight_recipe


def recipe_script_task(recipe: str | Path) -> str | None:
    """The GRPO task of a trl_ext recipe script (`recipes/countdown.py` -> "countdown"), else None."""
    stem = Path(recipe).stem
    return stem if stem in TASK_DEFAULTS else None


def check_machine(environ: Mapping[str, str], uses_gpus: bool) -> None:
    """GPU numbering and the driver, when the launch puts anything on a GPU.

    Raises:
        LaunchError: `CUDA_DEVICE_ORDER` is not PCI_BUS_ID, or the driver is too old for the installed torch.
    """
    if not uses_gpus:
        return
    problem = cuda_device_order_problem(environ)
    if problem is not None:
        raise LaunchError(problem.render())
    import torch

    if torch.version.cuda and not torch.cuda.is_available():
        message = driver_problem(nvidia_smi(), torch.version.cuda, f"the installed torch {torch.__version__}")
        if message:
            raise LaunchError(message)


def launch_preflight(
    setup: AccelerateSetup,
    recipe: str | Path,
    config: str | Path | None,
    extra_args: Sequence[str],
    train_gpus: Sequence[str],
    server_gpus: Sequence[str] = (),
    server_tp: int = 1,
    gpu_memory_gb: float | None = None,
    check_packages: bool = True,
    cpu_cores: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
) -> tuple[tuple, Preflight] | None:
    """Every preflight check of a trl_ext GRPO recipe on this launch; None for other scripts (nothing to check).

    Training runs `setup.num_processes` processes on `train_gpus`; the memory limit is `gpu_memory_gb`, else the
    smallest FREE memory of the training GPUs per nvidia-smi (the colocated vLLM share is a part of their total).
    `cpu_cores`: `(server cores, trainer cores)` of a server layout on the CPU (empty: not pinned), or None.

    Returns:
        The parsed recipe `(script_args, training_args, model_args)` and its `Preflight` (no problems).

    Raises:
        LaunchError: the recipe does not parse, or the preflight found problems (each with its fix).
    """
    task = recipe_script_task(recipe)
    if task is None or config is None:
        return None
    memory = gpus_memory(list(train_gpus), nvidia_smi_gpus()) if train_gpus else None
    total, free = memory if memory is not None else (None, None)
    if not train_gpus:  # training on the CPU (cpu.yaml) has no GPU memory to check against
        limit, source = None, ""
    elif gpu_memory_gb is not None:
        limit, source = gpu_memory_gb, "--gpu-memory-gb"
    else:
        limit, source = free, ("free per nvidia-smi" if free is not None else "")
    context = RunContext(
        world_size=setup.num_processes,
        distributed_type=setup.distributed_type,
        zero_stage=setup.zero_stage,
        train_devices=tuple(train_gpus),
        server_devices=tuple(server_gpus),
        server_tp=server_tp,
        server_cpu_cores=None if cpu_cores is None else cpu_cores[0],
        train_cpu_cores=() if cpu_cores is None else cpu_cores[1],
        gpu_memory_gib=total if total is not None else gpu_memory_gb,
        memory_limit_gib=limit,
        limit_source=source,
        check_packages=check_packages,
        label=f"{setup.path} ({setup.num_processes} training process(es))",
    )
    argv = ["--config", str(config), *extra_args]
    if not _cuda_here():
        # Planning on a machine without a GPU (a dry run on a laptop): TrainingArguments refuses `bf16: true` there
        # unless told it trains on the CPU. The flag is for this parse only; the trainer parses its own command.
        argv += ["--use_cpu", "true"]
    try:
        parsed, report = preflight_recipe(task, argv, setup.num_processes, lambda parsed: context)
    except PreflightError as exc:
        raise LaunchError(str(exc)) from None
    except ValueError as exc:  # RecipeError, or a config value TRL's dataclasses refuse
        raise LaunchError(f"recipe config: {exc}") from None
    if report.problems:
        raise LaunchError(report.render())
    return parsed, report


def _cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()
