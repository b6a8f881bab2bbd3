"""The expert-iteration recipe (`recipes/expert_iteration.py`): parse, preflight, data, rewards, trainer, run.

An EI recipe names its task (`task: gsm8k`) and otherwise holds the same fields as a GRPO recipe of that task
(`trl_ext.recipes.GRPOScriptArguments`: data, prompt, rewards, validation split and size), the training config
`trl_ext.expert_iteration.ExpertIterationConfig` and `trl.ModelConfig`. Data and rewards go through the same
functions as the GRPO recipes (`load_grpo_datasets`, `get_reward_funcs`), and validation is TRL's GRPO evaluation,
so an EI run validates exactly as the GRPO recipe with the same validation fields (tests/test_expert_iteration.py
compares the shipped pairs field by field).

The preflight is the GRPO recipes' where it applies: output_dir (fresh, or a refusal: EI does not resume), wandb,
model and data sources, packages, the vLLM weight-sync port, and the peak-memory estimate of the SFT micro-batch
and the validation batch. EI trains on one process; more is an error before anything loads.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from trl_ext.preflight.attention import choose_attention, requested_attention
from trl_ext.preflight.batch import BatchLayout
from trl_ext.preflight.context import context_from_environment
from trl_ext.preflight.environment import (
    check_data_source,
    check_model_source,
    check_packages,
    is_main_process,
    port_is_free,
    resolve_wandb,
    world_size_from_env,
)
from trl_ext.preflight.memory import estimate_memory
from trl_ext.preflight.models import load_model_shape
from trl_ext.preflight.plan import training_setup
from trl_ext.preflight.problems import PreflightError, Problem
from trl_ext.preflight.rundir import make_record, plan_output_dir, write_run_record
from trl_ext.recipes.arguments import TASK_DEFAULTS, apply_task_defaults
from trl_ext.recipes.data import load_grpo_datasets
from trl_ext.recipes.entry import config_from_argv
from trl_ext.recipes.parsing import adapt_generation_kwargs, make_parser
from trl_ext.recipes.stated import stated_values
from trl_ext.recipes.training import build_grpo_trainer, train_save_evaluate
from trl_ext.recipes.yaml_chain import RecipeError


def parse_ei_args(argv: Sequence[str] | None = None):
    """Parse an EI recipe's command line: `(EIScriptArguments, ExpertIterationConfig, ModelConfig)`, task defaults
    applied and reward names resolved (a bad name or import path fails here).

    Raises:
        RecipeError: no task, an unknown task, or a GRPO-only field set.
    """
    from trl_ext.rewards import get_reward_funcs

    script, args, model_args = make_parser("ei").parse_args_and_config(argv)
    if script.task is None:
        raise RecipeError(f"task is not set; an expert-iteration recipe names one of {sorted(TASK_DEFAULTS)}")
    apply_task_defaults(script.task, script)
    if script.n_grpo_steps is not None:
        raise RecipeError(f"n_grpo_steps={script.n_grpo_steps}: an expert-iteration run counts n_ei_steps")
    if script.resume:
        raise RecipeError("resume: expert iteration cannot resume a run; give it a fresh output_dir")
    get_reward_funcs(script.reward_funcs, args)
    return script, args, model_args


def ei_preflight(argv: Sequence[str], parsed: tuple, environ=None) -> tuple[list[str], dict, list]:
    """The checks of an EI run before any model loads (module docstring).

    Returns:
        `(plan lines, run record, problems)`.
    """
    script, args, model_args = parsed
    config = config_from_argv(argv)
    values: dict = {}
    for obj in parsed:
        values.update({k: v for k, v in vars(obj).items() if not k.startswith("_")})
    record = make_record(config, argv, stated_values(config, argv), values)
    problems: list = []
    world = world_size_from_env(environ)
    if world != 1:
        problems.append(Problem("num_processes", f"{world} training processes; expert iteration trains on one"))
    if str((os.environ if environ is None else environ).get("ACCELERATE_USE_DEEPSPEED", "")).lower() == "true":
        # Its SFT is a plain loop of its own (optimizer, backward) that DeepSpeed's engine would not drive.
        message = "DEEPSPEED (e.g. zero3.yaml): expert iteration's SFT loop does not run under DeepSpeed"
        fix = "launch with accelerate_configs/single_gpu.yaml or cpu.yaml"
        problems.append(Problem("distributed_type", message, fix))
    plan, output_problems = plan_output_dir(args.output_dir, record, False, args.resume_from_checkpoint)
    problems += output_problems
    if args.resume_from_checkpoint:
        problems.append(Problem("resume_from_checkpoint", "expert iteration cannot resume a run"))
    problems += check_model_source(model_args.model_name_or_path)
    problems += check_data_source(script.dataset_source, "dataset_source")
    problems += check_data_source(script.eval_source, "eval_source")
    problems += check_packages({"vllm": "use_vllm: vLLM generation"} if args.use_vllm else {})
    wandb = resolve_wandb(args.report_to, environ)
    if wandb.mode == "missing":
        problems.append(Problem("report_to", "includes wandb, which is not installed", "pip install wandb"))
    if args.use_vllm and args.vllm_mode == "server" and not port_is_free(int(args.vllm_group_port)):
        problems.append(Problem("vllm_group_port", f"port {args.vllm_group_port} is in use", "--vllm_group_port N"))
    generator = f"vLLM {args.vllm_mode}" if args.use_vllm else "transformers"
    lines = [
        f"expert iteration: {args.n_ei_steps} EI steps x {args.questions_per_step} questions x G "
        f"{args.num_generations} = {args.rollouts_per_step} rollouts per step ({generator}); keep reward >= "
        f"{args.keep_min_reward:g}; SFT {args.sft_epochs} epoch(s) of {args.sft_batch_size} completions per step "
        f"(micro-batch {args.per_device_train_batch_size} x GA {args.gradient_accumulation_steps})",
        f"data:    {script.dataset_source or f'the {script.task} default'} [{script.dataset_split}], validation "
        f"[{script.eval_split}] up to {script.eval_limit} problems",
        f"output:  {args.output_dir}; wandb {wandb.mode}",
        choose_attention(requested_attention(args, model_args), bool(args.use_cpu)).render(),
    ]
    shape, source = load_model_shape(model_args.model_name_or_path or "")
    if shape is not None and world == 1:
        layout = BatchLayout(
            world_size=1,
            group_size=args.num_generations,
            rollout_batch_size=args.generation_batch_size,
            train_batch_size=args.sft_batch_size,
            per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            ga_derived=False,
            steps_per_generation=args.steps_per_generation,
            num_iterations=1,
            optimizer_steps_per_rollout=0,
            n_grpo_steps=None,
            max_steps=-1,
            per_device_eval_batch_size=args.per_device_eval_batch_size if args.eval_strategy != "no" else 0,
            eval_generations=args.num_generations_eval or args.num_generations,
            eval_requests=None,
        )
        context = context_from_environment(script, args, environ)
        estimate = estimate_memory(shape, training_setup(script.task, script, args, model_args, layout, context))
        lines += [f"memory:  {shape.name} ({source})", *(f"         {line}" for line in estimate.render())]
        limit = context.memory_limit_gib
        if limit is not None and estimate.peak_gib > limit:
            problems.append(
                Problem("gpu memory", f"estimated peak {estimate.peak_gib:.1f} GiB exceeds the {limit:g} GiB limit")
            )
    else:
        lines.append(f"memory:  no estimate ({source})")
    if wandb.message:
        lines.append(f"warning: {wandb.message}")
    return lines, record, problems


def build_ei_trainer(
    script_args, training_args, model_args, reward_funcs, train_dataset, eval_dataset, trainer_class=None
):
    """`ExpertIterationTrainer` (or the subclass `trainer_class`) for a parsed EI recipe, built as the GRPO recipes
    build theirs (`build_grpo_trainer`); TRL loads the model from `model_name_or_path`."""
    from trl_ext.expert_iteration import ExpertIterationTrainer

    trainer_class = trainer_class or ExpertIterationTrainer
    return build_grpo_trainer(
        script_args, training_args, model_args, reward_funcs, train_dataset, eval_dataset, trainer_class
    )


def run_expert_iteration_recipe(argv: Sequence[str] | None = None, trainer_class=None) -> dict[str, float]:
    """An EI recipe end to end: parse -> preflight (prints the plan; raises listing every problem) -> task data ->
    rewards -> `ExpertIterationTrainer` (or the subclass `trainer_class`) -> train, save, validate. Nothing loads
    before the checks pass."""
    from trl_ext.rewards import get_reward_funcs

    argv = list(sys.argv[1:] if argv is None else argv)
    parsed = parse_ei_args(argv)
    script, args, model_args = parsed
    lines, record, problems = ei_preflight(argv, parsed)
    if is_main_process():
        print("\n".join([f"preflight: {record['recipe'] or 'expert iteration'}", *lines]), file=sys.stderr)
    if problems:
        raise PreflightError(problems, str(record["recipe"] or "expert iteration"))
    adapt_generation_kwargs(args)
    train_dataset, eval_dataset = load_grpo_datasets(script.task, script, args)
    reward_funcs = get_reward_funcs(script.reward_funcs, args)
    trainer = build_ei_trainer(script, args, model_args, reward_funcs, train_dataset, eval_dataset, trainer_class)
    write_run_record(trainer, args.output_dir, record)
    return train_save_evaluate(trainer, args, script, script.dataset_source)
