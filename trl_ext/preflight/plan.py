"""The preflight of one GRPO run: every check before anything starts, and the plan it prints.

`check_recipe` takes a parsed plan (the recipe as `trl_ext.recipes.parse_recipe_args` parsed it, the fields it
states) and where it will run (`RunContext`: processes, GPUs, memory limit), and returns a `Preflight`: the batch
layout for the actual world size, the peak-memory estimate against the limit, the checkpoint sizes, the NCCL group
port, the output_dir decision, wandb's mode, the model and data sources and the packages the settings need. It
parses nothing and starts nothing: `trl_ext.recipes.entry` parses and calls it, the entry points and the launcher
start. `Preflight.render()` is the plan the recipe entry points and `trl-ext launch` (dry-run too) print;
`raise_if_failed()` raises one `PreflightError` listing every problem with its fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_ext.host import available_memory_bytes
from trl_ext.preflight.async_plan import check_async, plan_async
from trl_ext.preflight.attention import choose_attention, requested_attention
from trl_ext.preflight.batch import BatchLayout, check_batches, micro_batch_choices, suggest_batch_fixes
from trl_ext.preflight.context import RunContext
from trl_ext.preflight.disk import DiskPlan, plan_disk, saves_during_run
from trl_ext.preflight.environment import (
    WandbStatus,
    check_data_source,
    check_model_source,
    check_packages,
    choose_port,
    resolve_wandb,
    world_size_from_env,
)
from trl_ext.preflight.fit import MemoryFit, fit_memory
from trl_ext.preflight.memory import MemoryEstimate
from trl_ext.preflight.models import ModelShape, PlannedModel, load_model_shape
from trl_ext.preflight.packed_models import padding_free_problems
from trl_ext.preflight.problems import PreflightError, Problem
from trl_ext.preflight.rundir import RUN_RECORD, OutputDirPlan, make_record, plan_output_dir
from trl_ext.preflight.setup import (
    DEFAULT_PROMPT_TOKENS,
    PROMPT_TOKENS,
    TrainingSetup,
    enum_value,
    training_setup,
    two_byte_dtype,
)
from trl_ext.preflight.trl_defaults import trl_default


@dataclass
class Preflight:
    """The outcome of `check_recipe`: what will run, and every problem found."""

    recipe: str
    context: RunContext
    layout: BatchLayout | None = None
    estimate: MemoryEstimate | None = None
    disk: DiskPlan | None = None
    shape: ModelShape | None = None
    output: OutputDirPlan | None = None
    wandb: WandbStatus | None = None
    record: dict | None = None
    lines: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        head = f"preflight: {self.recipe}" + (f" on {self.context.label}" if self.context.label else "")
        body = [f"  {line}" for line in self.lines]
        if self.wandb is not None and self.wandb.message:
            body.append(f"  warning: {self.wandb.message}")
        if self.problems:
            body.append(f"  FAILED: {len(self.problems)} problem(s)")
            body += [f"  - {p.render()}" for p in self.problems]
        return "\n".join([head, *body])

    def raise_if_failed(self) -> None:
        if self.problems:
            raise PreflightError(self.problems, f"{self.recipe} on {self.context.label or 'this machine'}")


def _batch_values(stated: Mapping[str, Any], script_args, args) -> dict[str, Any]:
    values = dict(stated)
    values.setdefault("n_grpo_steps", script_args.n_grpo_steps)
    values["eval_limit"] = script_args.eval_limit
    values["eval_split"] = script_args.eval_split
    values["eval_strategy"] = str(enum_value(args.eval_strategy))
    return values


def check_layout(stated: Mapping[str, Any], world_size: int) -> tuple[BatchLayout | None, list[Problem]]:
    """The batch check with fixes, on the stated values alone (runs before the recipe is parsed)."""
    layout, problems = check_batches(stated, world_size)
    if layout is not None:
        return layout, []
    fix = "; or ".join(suggest_batch_fixes(stated, world_size))
    return None, [Problem(p.field, p.message, p.fix or fix) for p in problems]


def check_recipe(
    task: str,
    recipe: str | Path | None,
    argv: Sequence[str],
    parsed: tuple,
    context: RunContext,
    stated: Mapping[str, Any],
    environ: dict[str, str] | None = None,
    planned_model: PlannedModel | None = None,
) -> Preflight:
    """Every preflight check of a parsed GRPO recipe on `context` (module docstring).

    Args:
        task: the recipe's task (`countdown`, `gsm8k`, `math`, `kissing`).
        recipe: the recipe YAML (for messages and the run record), or None.
        argv: the recipe's command line (for the run record).
        parsed: `(script_args, training_args, model_args)` as the recipe parser returned them.
        context: where it runs.
        stated: the fields the recipe states (YAML chain and flags; `trl_ext.recipes.stated_values`).
        environ: the environment wandb's mode is read from and written to (default `os.environ`).
        planned_model: the model a step of the run builds before training (`model_name_or_path`), if any.
    """
    script_args, args, model_args = parsed
    report = Preflight(recipe=str(recipe or "(no --config)"), context=context)
    pending = planned_model if planned_model is not None and not planned_model.built else None
    problems = report.problems
    _placement(report, args)

    values = _batch_values(stated, script_args, args)
    layout, batch_problems = check_layout(values, context.world_size)
    problems += batch_problems
    if layout is not None:
        report.layout = layout
        report.lines += layout.render()
        parsed_here = context.world_size == world_size_from_env()
        if parsed_here and layout.per_device_train_batch_size != args.per_device_train_batch_size:
            problems.append(
                Problem(
                    "per_device_train_batch_size",
                    f"the parsed config has {args.per_device_train_batch_size}, the preflight "
                    f"{layout.per_device_train_batch_size} for {context.world_size} process(es): WORLD_SIZE and the "
                    "accelerate config disagree",
                    "launch with the accelerate config's num_processes",
                )
            )
        _sleep(report, args, layout)
        queued = plan_async(args, layout, PROMPT_TOKENS.get(task, DEFAULT_PROMPT_TOKENS))
        if queued is not None:  # async rollouts: the staleness and the batch waiting in host memory
            report.lines += queued.render(args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max)
            report.problems += check_async(queued, available_memory_bytes())
        _memory_and_disk(report, task, script_args, args, model_args, layout, values, pending)
    _semantics(report, script_args, args, model_args)
    _group_port(report, args)
    _output(report, recipe, argv, stated, script_args, args, model_args)
    report.wandb = resolve_wandb(args.report_to, environ)
    wandb_line = report.wandb.mode + (" (switched: no login)" if report.wandb.switched_offline else "")
    if report.wandb.mode == "missing":
        problems.append(
            Problem("report_to", "includes wandb, which is not installed", "pip install wandb, or --report_to none")
        )
    report.lines.append(
        f"logs:    {args.output_dir} (trainer_state.json, rollouts.jsonl, {RUN_RECORD}); wandb {wandb_line}"
    )
    if planned_model is not None:
        report.lines.append(planned_model.render())
    if pending is None:  # a folder a step builds first is checked by that step
        problems += check_model_source(model_args.model_name_or_path)
    if getattr(args, "padding_free", False):  # a model whose packed rows could attend to each other
        problems += padding_free_problems(model_args.model_name_or_path or "")
    problems += check_data_source(script_args.dataset_source, "dataset_source")
    problems += check_data_source(script_args.eval_source, "eval_source")
    data = script_args.dataset_source or f"the {task} default"
    if getattr(script_args, "demo_warm_start", False):
        report.lines.append(
            f"data:    the CPU demo's unlabelled problems, validation on the first {script_args.eval_limit} of its "
            "held-out problems (demo_warm_start)"
        )
    else:
        report.lines.append(
            f"data:    {data} [{script_args.dataset_split}], validation [{script_args.eval_split}] up to "
            f"{script_args.eval_limit} problems"
        )
    if context.check_packages:
        problems += check_packages(_package_needs(args, model_args, context))
    return report


def _placement(report: Preflight, args) -> None:
    context = report.context
    train = ",".join(context.train_devices) or _cpu(context.train_cpu_cores)
    mode = {"MULTI_GPU": "DDP", "DEEPSPEED": f"DeepSpeed ZeRO-{context.zero_stage}"}.get(context.distributed_type, "")
    line = f"gpus:    training on {train} ({context.world_size} process(es){', ' + mode if mode else ''})"
    if args.use_vllm and args.vllm_mode == "server":
        server = ",".join(context.server_devices) or context.server_place or "a server you start (vllm_server_host)"
        if context.server_cpu_cores is not None:  # `trl-ext launch` starts it on the CPU; gloo weight sync
            server = f"{_cpu(context.server_cpu_cores)} (vLLM's CPU build; weights synced over gloo)"
        line += f"; vLLM server on {server}" + (f" (tp {context.server_tp})" if context.server_devices else "")
    elif args.use_vllm:
        line += f"; vLLM colocated on each training GPU ({args.vllm_gpu_memory_utilization:g} of its memory" + (
            ", sleeping while training)" if args.vllm_enable_sleep_mode else ")"
        )
    else:
        line += "; generation with transformers on the training GPUs"
    report.lines.append(line)


def _cpu(cores: tuple[int, ...]) -> str:
    return f"CPU core(s) {','.join(map(str, cores))}" if cores else "CPU"


def _memory_and_disk(
    report: Preflight,
    task: str,
    script_args,
    args,
    model_args,
    layout: BatchLayout,
    values: Mapping[str, Any],
    pending: PlannedModel | None = None,
) -> None:
    """One pass: the model's shape and the run's `TrainingSetup`, each read once (from the config a step of the run
    will write, for a `pending` model); the memory fit against the limit (`fit_memory`: the estimate, the
    padding-free pick, the knobs) and the disk plan, both from them."""
    context = report.context
    if pending is not None:
        shape, source = ModelShape.from_config(pending.config, name=pending.path), "the config its build step writes"
    else:
        shape, source = load_model_shape(model_args.model_name_or_path or "")
    if shape is None:
        report.lines.append(f"memory:  no estimate ({source})")
        return
    report.shape = shape
    setup = training_setup(task, script_args, args, model_args, layout, context)
    if setup.expected_completion_tokens is not None and not setup.padding_free:
        report.problems.append(
            Problem(
                "expected_completion_tokens",
                f"is {setup.expected_completion_tokens}, but this run pads every row to max_completion_length "
                f"({setup.completion_tokens}), so the estimate would ignore it",
                "unset --expected_completion_tokens, or add --padding_free true",
            )
        )
    limit = context.memory_limit_gib
    choices = micro_batch_choices(values, context.world_size) if setup.padding_free and limit is not None else None
    fit = fit_memory(shape, setup, limit, choices)
    report.estimate = fit.estimate
    _render_memory(report, shape, source, setup, fit)
    saves = saves_during_run(layout.max_steps, str(enum_value(args.save_strategy)), float(args.save_steps))
    report.disk = plan_disk(shape, setup, saves, args.save_total_limit)
    report.lines.append(report.disk.render())


def _render_memory(report: Preflight, shape: ModelShape, source: str, setup: TrainingSetup, fit: MemoryFit) -> None:
    context, estimate, limit = report.context, fit.estimate, fit.limit_gib
    where = "per training GPU" if context.train_devices or context.gpu_memory_gib else "per training process"
    report.lines.append(
        f"memory:  {shape.name}: {shape.params / 1e9:.2f} B parameters ({source}); {setup.precision}, "
        f"{setup.optim}, micro-batch {setup.micro_batch} x ({setup.prompt_tokens} + {_completion(setup)}) tokens"
    )
    report.lines += [f"         {line}" for line in estimate.render()]
    if limit is None:
        report.lines.append(f"         no GPU memory limit known {where}: pass --gpu-memory-gb to check against one")
        return
    limit_source = f" ({context.limit_source})" if context.limit_source else ""
    report.lines.append(f"         limit {_gib(limit)} GiB {where}{limit_source}")
    if fit.choices is not None:
        report.lines.append(_pick_line(fit, setup))
    if fit.over:
        knobs = "; or ".join(k.render() for k in fit.knobs)
        fix = knobs or "more GPUs with zero3.yaml, or a smaller model"
        report.problems.append(
            Problem(
                "gpu memory",
                f"estimated peak {estimate.peak_gib:.1f} GiB {where} exceeds the {_gib(limit)} GiB limit "
                f"({context.limit_source or '--gpu-memory-gb'}; {estimate.peak_phase} phase)",
                fix,
            )
        )


def _completion(setup: TrainingSetup) -> str:
    """The completion tokens per row the estimate assumes, and where that number comes from."""
    if not setup.padding_free:
        return str(setup.completion_tokens)
    given = setup.expected_completion_tokens is not None
    how = "--expected_completion_tokens" if given else "default half of it; state --expected_completion_tokens"
    return f"{setup.row_completion_tokens} expected of {setup.completion_tokens}, padding-free: {how}"


def _pick_line(fit: MemoryFit, setup: TrainingSetup) -> str:
    """The plan's line: the largest micro-batch the batch arithmetic allows whose padding-free estimate fits."""
    limit, pick = _gib(fit.limit_gib), fit.pick
    if pick is None:
        return f"pick:    padding-free: no micro-batch of {sorted(fit.choices)} fits {limit} GiB"
    return (
        f"pick:    padding-free on {limit} GiB: --per_device_train_batch_size {pick.micro_batch} "
        f"--gradient_accumulation_steps {pick.gradient_accumulation_steps} (largest micro-batch the batch arithmetic "
        f"allows that fits: {pick.estimate.peak_gib:.1f} GiB expected, {pick.worst.peak_gib:.1f} GiB if all its "
        f"completions reach {setup.completion_tokens}; padded, the largest that fits is "
        f"{pick.padded_micro_batch or 'none'})"
    )


def _sleep(report: Preflight, args, layout: BatchLayout) -> None:
    """A colocated vLLM that sleeps re-pushes every weight at each generation call (TRL 1.16 sleeps at level 2,
    which discards them), and each validation batch is one call: say how many a validation makes."""
    if not (args.use_vllm and args.vllm_mode == "colocate" and args.vllm_enable_sleep_mode):
        return
    calls = f"{layout.eval_requests} per validation" if layout.eval_requests else "one per validation batch"
    report.lines.append(
        f"sleep:   vLLM sleeps at level 2: every generation call re-pushes all weights ({calls}, "
        f"{layout.per_device_eval_batch_size} prompts each; one per rollout batch)"
    )


def _gib(value: float) -> str:
    """24 -> "24", 79.63 -> "79.6"."""
    return f"{value:.1f}".removesuffix(".0")


def _semantics(report: Preflight, script_args, args, model_args) -> None:
    kwargs = args.chat_template_kwargs or {}
    if kwargs and not script_args.chat_template:
        report.problems.append(
            Problem(
                "chat_template_kwargs",
                f"{kwargs} applies to the chat template, which this recipe does not use (chat_template: false)",
                "remove chat_template_kwargs, or set chat_template: true",
            )
        )
    report.lines.append(choose_attention(requested_attention(args, model_args), bool(args.use_cpu)).render())
    dtype = two_byte_dtype(model_args)
    if report.context.zero_stage == 0 and dtype is not None:
        report.lines.append(
            f"precision: pure {dtype} weights and optimizer states (dtype {dtype}): lr {args.learning_rate:g} updates "
            "below half a bf16 ulp are lost; dtype float32 + bf16 keeps fp32 master weights (docs/gpu.md)"
        )


def _group_port(report: Preflight, args) -> None:
    """TRL's weight-sync group binds `vllm_group_port` on training rank 0 (server mode): it must be free. The
    launcher picks free ports before this check; the server's own port is the launcher's to check."""
    if not (args.use_vllm and args.vllm_mode == "server"):
        return
    free, problems = choose_port("vllm_group_port", int(args.vllm_group_port), trl_default("vllm_group_port"))
    report.problems += problems
    state = "free" if free is not None else "in use"
    report.lines.append(
        f"ports:   vllm_server_port {args.vllm_server_port}, vllm_group_port {args.vllm_group_port} ({state})"
    )


def _output(report: Preflight, recipe, argv, stated, script_args, args, model_args) -> None:
    config: dict[str, Any] = {}
    for obj in (script_args, args, model_args):
        config.update({k: v for k, v in vars(obj).items() if not k.startswith("_")})
    report.record = make_record(recipe, argv, stated, config)
    resume = bool(getattr(script_args, "resume", False))
    plan, problems = plan_output_dir(args.output_dir, report.record, resume, args.resume_from_checkpoint)
    report.problems += problems
    report.output = plan
    if plan is not None:
        where = f"resume from {plan.checkpoint}" if plan.checkpoint else plan.action
        report.lines.append(f"output:  {args.output_dir} ({where})" + (f"; {plan.note}" if plan.note else ""))


def _package_needs(args, model_args, context: RunContext) -> dict[str, str]:
    needs: dict[str, str] = {}
    if args.use_vllm:
        needs["vllm"] = "use_vllm: vLLM generation"
    if context.zero_stage:
        needs["deepspeed"] = f"distributed_type: DeepSpeed ZeRO-{context.zero_stage}"
    if "8bit" in str(enum_value(args.optim)):
        needs["bitsandbytes"] = f"optim: {enum_value(args.optim)}"
    if model_args.use_peft:
        needs["peft"] = "use_peft: LoRA"
    return needs
