"""The preflight where a run starts: a recipe entry point (inside `accelerate launch`) and `trl-ext launch`.

Both go the same way: the recipe's stated fields -> the batch check for the actual number of training processes
(with fixes, before the recipe is even parsed) -> `trl_ext.recipes.parse_recipe_args` for that many processes ->
`check_recipe`. The entry point reads where it runs from its environment (`WORLD_SIZE`, accelerate's DeepSpeed
variables, the visible GPU); the launcher passes the GPU split it is about to make and picks free ports.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from trl_ext.preflight.environment import is_main_process, warn_once, world_size_from_env
from trl_ext.preflight.plan import Preflight, RunContext, check_layout, check_recipe, stated_values
from trl_ext.preflight.problems import PreflightError, Problem
from trl_ext.preflight.rundir import OutputDirPlan, make_record, plan_output_dir


def config_from_argv(argv: Sequence[str]) -> str | None:
    """The `--config PATH` / `--config=PATH` of a recipe command line (read as the recipe parser reads it)."""
    from trl_ext.recipes.parsing import pop_config_flag

    return pop_config_flag(list(argv))


def preflight_recipe(
    task: str,
    argv: Sequence[str],
    world_size: int,
    make_context: Callable[[tuple], RunContext],
    environ: dict[str, str] | None = None,
) -> tuple[tuple, Preflight]:
    """Check a GRPO recipe's batches for `world_size` processes, parse it, and run every check on
    `make_context(parsed)`. The parse itself is this process's (`$WORLD_SIZE`, 1 in the launcher): the launcher
    must not pretend to be a distributed rank, so the numbers that depend on W come from the batch check.

    Raises:
        PreflightError: the batch arithmetic fails for this world size (before parsing, with fixes).
        trl_ext.recipes.RecipeError: the recipe does not parse (unknown key, bad value).
    """
    from trl_ext.recipes import parse_recipe_args

    config = config_from_argv(argv)
    stated = stated_values(config, argv)
    _, problems = check_layout(stated, world_size)
    if problems:
        raise PreflightError(problems, f"{config or task} on {world_size} training process(es)")
    parsed = parse_recipe_args(task, list(argv))
    return parsed, check_recipe(task, config, argv, parsed, make_context(parsed), stated, environ)


def context_from_environment(script_args, training_args, environ: Mapping[str, str] | None = None) -> RunContext:
    """Where this process runs, as `accelerate launch` describes it in the environment."""
    environ = os.environ if environ is None else environ
    world = world_size_from_env(environ)
    zero = int(environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "0") or 0)
    if environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        distributed = "DEEPSPEED"
    else:
        distributed, zero = ("MULTI_GPU" if world > 1 else "NO"), 0
    devices: tuple[str, ...] = ()
    memory = None
    if not training_args.use_cpu:
        import torch

        if torch.cuda.is_available():
            local = int(environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
            visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
            devices = (visible[local] if local < len(visible) else str(local),)
            memory = torch.cuda.get_device_properties(local).total_memory / (1 << 30)
    limit = script_args.gpu_memory_gb if script_args.gpu_memory_gb is not None else memory
    return RunContext(
        world_size=world,
        distributed_type=distributed,
        zero_stage=zero,
        train_devices=devices,
        gpu_memory_gib=memory,
        memory_limit_gib=limit,
        label=f"{world} process(es)" + (f", GPU {devices[0]}" if devices else ", CPU"),
    )


def entry_preflight(task: str, argv: Sequence[str] | None = None) -> tuple[tuple, Preflight]:
    """The preflight of a recipe entry point: checks, prints the plan (main process), raises on any problem."""
    argv = list(sys.argv[1:] if argv is None else argv)
    world = world_size_from_env()
    parsed, report = preflight_recipe(task, argv, world, lambda p: context_from_environment(p[0], p[1]))
    if is_main_process():  # the plan, with wandb's one warning when it was switched offline
        print(report.render(), file=sys.stderr, flush=True)
    report.raise_if_failed()
    return parsed, report


def sft_entry_preflight(argv: Sequence[str], parsed: tuple) -> tuple[OutputDirPlan, dict]:
    """The checks an SFT run shares with GRPO (output_dir and explicit resume, wandb without a login, the model);
    returns the output_dir decision and the run record to write."""
    from trl_ext.preflight.environment import check_model_source, resolve_wandb

    script_args, args, model_args = parsed
    config = config_from_argv(argv)
    values: dict = {}
    for obj in parsed:
        values.update({k: v for k, v in vars(obj).items() if not k.startswith("_")})
    record = make_record(config, argv, stated_values(config, argv), values)
    plan, problems = plan_output_dir(args.output_dir, record, script_args.resume, args.resume_from_checkpoint)
    problems = [*problems, *check_model_source(model_args.model_name_or_path)]
    wandb = resolve_wandb(args.report_to)
    if wandb.mode == "missing":
        problems.append(Problem("report_to", "includes wandb, which is not installed", "pip install wandb"))
    warn_once(wandb.message)
    if problems or plan is None:
        raise PreflightError(problems, str(config or "sft"))
    return plan, record


def write_run_record(trainer, output_dir: str | Path, record: Mapping | None) -> None:
    """Write `trl_ext_run.json` once every process has passed its checks (the trainer exists: the process group
    has met), from the main process."""
    from trl_ext.preflight.rundir import write_record

    if record is not None and trainer.accelerator.is_main_process:
        write_record(output_dir, record)
