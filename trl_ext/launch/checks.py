"""The launcher's checks over a planned launch, before any server or trainer starts: the machine (GPU numbering,
the NVIDIA driver against torch's CUDA) and the recipe's preflight (the recipe parsed once by `parse_launch_recipe`
before planning, then `trl_ext.recipes.check_parsed_recipe`: batches for the planned number of training processes,
memory against the training GPUs' free memory, the NCCL group port, output_dir, wandb, sources).

They take what `trl_ext.launch.planning` decided and return or raise; they decide nothing of the plan.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from trl_ext.launch.configs import AccelerateSetup, LaunchError
from trl_ext.preflight.context import RunContext, cuda_device_order_problem, gpus_memory, nvidia_smi_gpus
from trl_ext.preflight.driver import driver_problem, nvidia_smi
from trl_ext.preflight.plan import Preflight
from trl_ext.preflight.problems import PreflightError
from trl_ext.recipes import script_task
from trl_ext.recipes.entry import ParsedRecipe, check_parsed_recipe, parse_recipe
from trl_ext.recipes.stated import cli_overrides


def recipe_script_task(recipe: str | Path) -> str | None:
    """The GRPO task of a trl_ext recipe script (`recipes/countdown.py` -> "countdown", `recipes/math_grpo.py` ->
    "math"), else None."""
    return script_task(recipe)


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


def parse_launch_recipe(
    setup: AccelerateSetup, recipe: str | Path, config: str | Path | None, extra_args: Sequence[str]
) -> ParsedRecipe | None:
    """A trl_ext GRPO recipe parsed once, by the trainer's parser (`trl_ext.recipes.parse_recipe`, after its batch
    check for `setup.num_processes`), before the launch is planned; None for other scripts or without `--config`.

    Raises:
        LaunchError: the batches do not divide for this many processes, or the recipe does not parse.
    """
    task = recipe_script_task(recipe)
    if task is None or config is None:
        return None
    try:
        return parse_recipe(task, _launch_argv(config, extra_args), setup.num_processes)
    except PreflightError as exc:
        raise LaunchError(str(exc)) from None
    except ValueError as exc:  # RecipeError, or a config value TRL's dataclasses refuse
        raise LaunchError(f"recipe config: {exc}") from None


def launch_preflight(
    setup: AccelerateSetup,
    recipe: ParsedRecipe | None,
    extra_args: Sequence[str],
    launcher_flags: Sequence[str],
    train_gpus: Sequence[str],
    server_gpus: Sequence[str] = (),
    server_tp: int = 1,
    gpu_memory_gb: float | None = None,
    check_packages: bool = True,
    cpu_cores: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
) -> tuple[tuple, Preflight] | None:
    """Every preflight check of a trl_ext GRPO recipe (`parse_launch_recipe`) on this launch; None for other scripts
    (nothing to check).

    The recipe is checked as the trainer will get it: `extra_args` (the recipe args given) followed by the
    `launcher_flags` the plan adds (the server's host and ports). Training runs `setup.num_processes` processes on
    `train_gpus`; the memory limit is `gpu_memory_gb`, else the smallest FREE memory of the training GPUs per
    nvidia-smi (the colocated vLLM share is a part of their total). `cpu_cores`: `(server cores, trainer cores)` of
    a server layout on the CPU (empty: not pinned), or None.

    Returns:
        The parsed recipe `(script_args, training_args, model_args)` and its `Preflight` (no problems).

    Raises:
        LaunchError: the preflight found problems (each with its fix).
    """
    if recipe is None:
        return None
    if launcher_flags:
        recipe = _with_launcher_flags(recipe, extra_args, launcher_flags)
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
    try:
        report = check_parsed_recipe(recipe, lambda parsed: context)
    except PreflightError as exc:
        raise LaunchError(str(exc)) from None
    except ValueError as exc:  # a config value the checks refuse
        raise LaunchError(f"recipe config: {exc}") from None
    if report.problems:
        raise LaunchError(report.render())
    return recipe.parsed, report


def _launch_argv(config: str | Path, extra_args: Sequence[str]) -> list[str]:
    """The recipe command line the launcher parses and checks."""
    argv = ["--config", str(config), *extra_args]
    if not _cuda_here():
        # Planning on a machine without a GPU (a dry run on a laptop): TrainingArguments refuses `bf16: true` there
        # unless told it trains on the CPU. The flag is for this parse only; the trainer parses its own command.
        argv += ["--use_cpu", "true"]
    return argv


def _with_launcher_flags(recipe: ParsedRecipe, extra_args: Sequence[str], flags: Sequence[str]) -> ParsedRecipe:
    """The parsed recipe with the flags the launcher adds to the trainer's command (`--vllm_server_host`,
    `--vllm_server_port`, `--vllm_group_port`, `--vllm_server_base_url`: plain values TRL's config takes as they
    are), set on a copy of the parsed training arguments rather than parsed again."""
    added = cli_overrides(flags)
    args = copy.copy(recipe.parsed[1])
    for key, value in added.items():
        current = getattr(args, key)
        setattr(args, key, value if current is None else type(current)(value))
    parsed = (recipe.parsed[0], args, *recipe.parsed[2:])
    argv = tuple(_launch_argv(recipe.config, [*extra_args, *flags]))
    return replace(recipe, argv=argv, stated={**recipe.stated, **added}, parsed=parsed)


def _cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()
