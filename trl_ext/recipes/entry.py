"""Where a recipe run starts: parse the recipe, check it (`trl_ext.preflight`), and hand it on to be started.

The one place that knows all three steps, above the parser (`trl_ext.recipes.parsing`) and the checks
(`trl_ext.preflight`, which parse nothing): a recipe entry point (`run_grpo_recipe`, inside `accelerate launch`)
and `trl-ext launch` (before any server or trainer starts) both go through `preflight_recipe`:

1. the stated fields (`stated_values`) -> the batch check for the actual number of training processes, with fixes,
   before TRL's parser sees contradictory values;
2. `parse_recipe_args` for that many processes (in this process: `$WORLD_SIZE`; the launcher is not a rank);
3. `check_recipe` on the parsed plan and where it runs (`make_context(parsed)`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trl_ext.preflight.attention import choose_attention, requested_attention
from trl_ext.preflight.context import RunContext, context_from_environment
from trl_ext.preflight.environment import (
    check_model_source,
    is_main_process,
    resolve_wandb,
    warn_once,
    world_size_from_env,
)
from trl_ext.preflight.plan import Preflight, check_layout, check_recipe
from trl_ext.preflight.problems import PreflightError, Problem
from trl_ext.preflight.rundir import OutputDirPlan, make_record, plan_output_dir
from trl_ext.recipes.parsing import parse_recipe_args, pop_config_flag
from trl_ext.recipes.stated import stated_values
from trl_ext.recipes.yaml_chain import RecipeError
from trl_ext.tiny import ensure_tiny_model


def config_from_argv(argv: Sequence[str]) -> str | None:
    """The `--config PATH` / `--config=PATH` of a recipe command line (read as the recipe parser reads it)."""
    return pop_config_flag(list(argv))


@dataclass(frozen=True)
class ParsedRecipe:
    """A recipe command line, parsed: the YAML, the command line, the fields it states, the parsed dataclasses."""

    task: str
    config: str | None
    argv: tuple[str, ...]
    stated: dict[str, Any]
    parsed: tuple


def parse_recipe(task: str, argv: Sequence[str], world_size: int) -> ParsedRecipe:
    """Parse a GRPO recipe after checking its batches for `world_size` training processes.

    Raises:
        PreflightError: the batch arithmetic fails for this world size (before parsing, with fixes).
        trl_ext.recipes.RecipeError: the recipe does not parse (unknown key, bad value).
    """
    config = config_from_argv(argv)
    stated = stated_values(config, argv)
    _, problems = check_layout(stated, world_size)
    if problems:
        raise PreflightError(problems, f"{config or task} on {world_size} training process(es)")
    return ParsedRecipe(task, config, tuple(argv), stated, parse_recipe_args(task, list(argv)))


def preflight_recipe(
    task: str,
    argv: Sequence[str],
    world_size: int,
    make_context: Callable[[tuple], RunContext],
    environ: dict[str, str] | None = None,
) -> tuple[tuple, Preflight]:
    """Parse (`parse_recipe`) and check (`check_recipe` on `make_context(parsed)`) a GRPO recipe.

    Returns:
        The parsed `(script_args, training_args, model_args)` and the `Preflight` (problems not raised).
    """
    recipe = parse_recipe(task, argv, world_size)
    return recipe.parsed, check_parsed_recipe(recipe, make_context, environ)


def check_parsed_recipe(
    recipe: ParsedRecipe, make_context: Callable[[tuple], RunContext], environ: dict[str, str] | None = None
) -> Preflight:
    """The checks of a parsed recipe (`check_recipe` on `make_context(recipe.parsed)`); problems not raised.

    `trl-ext launch` parses the recipe once (`parse_recipe`, before it plans) and checks it here after planning."""
    script_args, training_args, model_args = recipe.parsed
    if getattr(script_args, "tiny_model", False):  # built before the checks (and the server) look for it
        ensure_tiny_model(model_args.model_name_or_path)
    planned = None
    if getattr(script_args, "demo_working", False) and not getattr(script_args, "demo_warm_start", False):
        raise RecipeError("demo_working chooses which demo warm start to train from; it needs demo_warm_start: true")
    if getattr(script_args, "demo_warm_start", False):  # checked here; built by the run's first step (planned)
        if recipe.task != "countdown":
            raise RecipeError(f"demo_warm_start trains the Countdown demo's model; {recipe.task} has no warm start")
        from trl_ext.recipes.demo_warm_start import check_demo_recipe, check_warm_start_folder, warm_start_config
        from trl_ext.testbed.warm_start import planned_warm_start

        check_demo_recipe(recipe.stated, script_args, training_args)
        check_warm_start_folder(model_args.model_name_or_path, script_args)
        planned = planned_warm_start(model_args.model_name_or_path, warm_start_config(script_args))
    context = make_context(recipe.parsed)
    return check_recipe(
        recipe.task, recipe.config, list(recipe.argv), recipe.parsed, context, recipe.stated, environ, planned
    )


def entry_preflight(task: str, argv: Sequence[str] | None = None) -> tuple[tuple, Preflight]:
    """The preflight of a recipe entry point: parse, check where this process runs, print the plan (main process),
    raise on any problem."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parsed, report = preflight_recipe(
        task, argv, world_size_from_env(), lambda parsed: context_from_environment(parsed[0], parsed[1])
    )
    if is_main_process():  # the plan, with wandb's one warning when it was switched offline
        print(report.render(), file=sys.stderr, flush=True)
    report.raise_if_failed()
    return parsed, report


def sft_entry_preflight(argv: Sequence[str], parsed: tuple) -> tuple[OutputDirPlan, dict]:
    """The checks an SFT run shares with GRPO (output_dir and explicit resume, wandb without a login, the model);
    returns the output_dir decision and the run record to write."""
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
    if is_main_process():
        attention = choose_attention(requested_attention(args, model_args), bool(args.use_cpu)).render()
        print(f"preflight: {config or 'sft'}\n  {attention}", file=sys.stderr, flush=True)
    if problems or plan is None:
        raise PreflightError(problems, str(config or "sft"))
    return plan, record
