"""The launcher's preflight: `trl_ext.preflight` for the GPU split `plan_launch` is about to make, and the free ports
it picks (vLLM server, TRL's NCCL weight-sync group, torch's rendezvous), before any server or trainer starts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trl_ext.launch.configs import AccelerateSetup, LaunchError

TORCH_RENDEZVOUS_PORT = 29500


def recipe_script_task(recipe: str | Path) -> str | None:
    """The GRPO task of a trl_ext recipe script (`recipes/countdown.py` -> "countdown"), else None."""
    from trl_ext.recipes import TASK_DEFAULTS

    stem = Path(recipe).stem
    return stem if stem in TASK_DEFAULTS else None


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
):
    """Every preflight check of a trl_ext GRPO recipe on this launch; None for other scripts (nothing to check).

    Training runs `setup.num_processes` processes on `train_gpus`; the memory limit is `gpu_memory_gb`, else the
    smallest training GPU's memory per `nvidia-smi`. Ports the recipe leaves unset are picked free.

    Raises:
        LaunchError: the recipe does not parse, or the preflight found problems (each with its fix).
    """
    from trl_ext.preflight.entry import preflight_recipe
    from trl_ext.preflight.environment import nvidia_smi_memory_gib
    from trl_ext.preflight.plan import RunContext
    from trl_ext.preflight.problems import PreflightError

    task = recipe_script_task(recipe)
    if task is None or config is None:
        return None
    # Training on the CPU (cpu.yaml) has no GPU memory to check against.
    memory = nvidia_smi_memory_gib(list(train_gpus)) if train_gpus else None
    limit = (gpu_memory_gb if gpu_memory_gb is not None else memory) if train_gpus else None
    context = RunContext(
        world_size=setup.num_processes,
        distributed_type=setup.distributed_type,
        zero_stage=setup.zero_stage,
        train_devices=tuple(train_gpus),
        server_devices=tuple(server_gpus),
        server_tp=server_tp,
        gpu_memory_gib=memory,
        memory_limit_gib=limit,
        pick_ports=True,
        check_packages=check_packages,
        label=f"{setup.path} ({setup.num_processes} training process(es))",
    )
    argv = ["--config", str(config), *extra_args]
    if not _cuda_here():
        # Planning on a machine without a GPU (a dry run on a laptop): TrainingArguments refuses `bf16: true` there
        # unless told it trains on the CPU. The flag is for this parse only; the trainer parses its own command.
        argv += ["--use_cpu", "true"]
    try:
        _, report = preflight_recipe(task, argv, setup.num_processes, lambda parsed: context)
    except PreflightError as exc:
        raise LaunchError(str(exc)) from None
    except ValueError as exc:  # trl_ext.recipes.RecipeError: the recipe does not parse
        raise LaunchError(f"recipe config: {exc}") from None
    if report.problems:
        raise LaunchError(report.render())
    return report


def _cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()


def rendezvous_args(setup: AccelerateSetup) -> list[str]:
    """`--main_process_port P` with a free P for a one-machine multi-process launch whose config sets no port, so
    two runs on one node never meet on torch's default 29500."""
    from trl_ext.preflight.environment import pick_free_port

    if setup.num_processes < 2 or setup.num_machines > 1 or setup.main_process_port is not None:
        return []
    port = pick_free_port(TORCH_RENDEZVOUS_PORT)
    if port is None:
        raise LaunchError("no free port from 29500 for torch's rendezvous; set main_process_port in the config")
    return ["--main_process_port", str(port)]
