"""The one batch arithmetic of a GRPO run for the actual number of training processes: the preflight checks a recipe
with it, `AblationGRPOConfig` maps the courses' fields with it, the trainer checks its world size and asynchronous
rollouts their whole optimizer steps with it; every rule has one message (`field: message` in the preflight,
`field=message` in a config error). Pure: TRL's defaults are read from `trl.GRPOConfig` on first use.

A recipe states the courses' batch vocabulary; the world size W (training processes) decides how it splits:

    rollout_batch_size   = prompts per rollout x group_size                  (generation_batch_size)
    train_batch_size     = per_device_train_batch_size x gradient_accumulation_steps x W
    steps_per_generation = rollout_batch_size / (per_device_train_batch_size x W)
    optimizer steps per rollout = epochs_per_rollout_batch x steps_per_generation / gradient_accumulation_steps
    max_steps            = n_grpo_steps x optimizer steps per rollout

When a recipe gives `train_batch_size` and `per_device_train_batch_size` (the micro-batch, what memory depends on)
but not `gradient_accumulation_steps`, GA is derived for W: `train_batch_size / (per_device x W)`. That is how the
shipped recipes keep the courses' 256 completions per step on 1, 2, 4 or 8 GPUs. A recipe that gives GA instead gets
the per-device batch derived from it. Every failure the preflight reports comes with fixes that were re-checked here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trl_ext.preflight.problems import PreflightError, Problem
from trl_ext.preflight.trl_defaults import trl_default

_MAX_SUGGESTED_PROCESSES = 16


@dataclass(frozen=True)
class BatchLayout:
    """How one rollout batch is generated, split and trained on W processes.

    Attributes:
        world_size: training processes (W).
        group_size: completions per prompt.
        rollout_batch_size: completions per rollout (generation) batch.
        train_batch_size: completions per optimizer step, over all processes.
        per_device_train_batch_size: micro-batch of one process.
        gradient_accumulation_steps: micro-batches per optimizer step on each process.
        ga_derived: GA was derived from W (the recipe gave the micro-batch, not GA).
        steps_per_generation: micro-batches per process per rollout batch.
        num_iterations: passes over each rollout batch.
        optimizer_steps_per_rollout: optimizer steps per rollout batch.
        n_grpo_steps: the courses' GRPO steps, or None.
        max_steps: optimizer steps of the run (-1: TRL's epoch-based default).
        per_device_eval_batch_size: prompts per process per validation batch (0: no validation).
        eval_generations: completions per validation prompt.
        eval_requests: generation calls per validation pass (None when the split size is unknown).
    """

    world_size: int
    group_size: int
    rollout_batch_size: int
    train_batch_size: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    ga_derived: bool
    steps_per_generation: int
    num_iterations: int
    optimizer_steps_per_rollout: int
    n_grpo_steps: int | None
    max_steps: int
    per_device_eval_batch_size: int
    eval_generations: int
    eval_requests: int | None

    @property
    def prompts_per_rollout(self) -> int:
        return self.rollout_batch_size // self.group_size

    @property
    def generation_batch_per_process(self) -> int:
        """Completions one process generates at once with the transformers backend (its slice of a rollout)."""
        return self.rollout_batch_size // self.world_size

    def render(self) -> list[str]:
        ga = f"GA {self.gradient_accumulation_steps}" + (" (derived for this W)" if self.ga_derived else "")
        lines = [
            f"rollout: {self.rollout_batch_size} completions = {self.prompts_per_rollout} prompts x group_size "
            f"{self.group_size}; {self.steps_per_generation} micro-batches per process",
            f"train:   {self.train_batch_size} completions per optimizer step = per-device "
            f"{self.per_device_train_batch_size} x {ga} x {self.world_size} process(es); "
            f"{self.optimizer_steps_per_rollout} optimizer step(s) per rollout ({self.num_iterations} epoch(s))",
        ]
        if self.n_grpo_steps is not None:
            lines.append(f"steps:   {self.n_grpo_steps} GRPO steps -> max_steps {self.max_steps}")
        elif self.max_steps > 0:
            lines.append(f"steps:   max_steps {self.max_steps}")
        if self.per_device_eval_batch_size:
            requests = "" if self.eval_requests is None else f" in {self.eval_requests} generation call(s)"
            lines.append(
                f"eval:    {self.per_device_eval_batch_size} prompts per process x {self.world_size} per batch, "
                f"{self.eval_generations} completion(s) each{requests}"
            )
        return lines


# The TRL fields of the arithmetic; an absent one takes `trl.GRPOConfig`'s default.
TRL_BATCH_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "num_generations_eval",
    "num_iterations",
    "generation_batch_size",
    "steps_per_generation",
    "per_device_eval_batch_size",
    "eval_strategy",
    "max_steps",
)
# The courses' vocabulary (`trl_ext.grpo.config` maps it onto TRL's fields); no TRL default.
SEED_BATCH_FIELDS = (
    "group_size",
    "rollout_batch_size",
    "train_batch_size",
    "epochs_per_rollout_batch",
    "n_grpo_steps",
)
_COUNTS = (*SEED_BATCH_FIELDS, *(f for f in TRL_BATCH_FIELDS if f not in ("eval_strategy", "max_steps")))


def batch_error(problem: Problem) -> ValueError:
    """A batch problem as the config and the trainer raise it, `field=message` (the preflight: `field: message`)."""
    return ValueError(f"{problem.field}={problem.message}")


def _value(values: Mapping[str, Any], key: str) -> Any:
    value = values.get(key)
    return trl_default(key) if value is None and key in TRL_BATCH_FIELDS else value


def _eval_on(values: Mapping[str, Any]) -> bool:
    split = values.get("eval_split", "")
    disabled = split is not None and str(split).lower() in ("none", "no")
    return str(_value(values, "eval_strategy")).lower() not in ("no", "intervalstrategy.no") and not disabled


def _as_int(values: Mapping[str, Any], key: str, problems: list[Problem]) -> int | None:
    value = values.get(key)
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not (isinstance(value, int) or text.isdigit()) or int(text) < 1:
        problems.append(Problem(key, f"{value!r} must be a positive integer"))
        return None
    return int(text)


@dataclass(frozen=True)
class _TrainSplit:
    train: int
    per_device: int
    ga: int
    ga_derived: bool


def _train_split(ints: Mapping[str, int | None], w: int) -> tuple[_TrainSplit | None, Problem | None]:
    """Completions per optimizer step as per-device x GA x W: GA derived from the micro-batch when the recipe gives
    `train_batch_size` and `per_device_train_batch_size` but no GA, the micro-batch derived from GA otherwise."""
    train, given_per_device, given_ga = (
        ints["train_batch_size"],
        ints["per_device_train_batch_size"],
        ints["gradient_accumulation_steps"],
    )
    if train is not None and given_per_device and not given_ga:
        ga = _split_train_batch(train, given_per_device, w)
        if ga is None:
            return None, Problem(
                "train_batch_size",
                f"{train} completions per optimizer step do not split into per_device_train_batch_size="
                f"{given_per_device} x gradient_accumulation_steps x {w} process(es) "
                f"({train} / {given_per_device * w} = {train / (given_per_device * w):.4g})",
            )
        return _TrainSplit(train, given_per_device, ga, True), None
    ga = given_ga or trl_default("gradient_accumulation_steps")
    if train is None:
        per_device = given_per_device or trl_default("per_device_train_batch_size")
        return _TrainSplit(per_device * ga * w, per_device, ga, False), None
    if train % (ga * w):
        return None, Problem(
            "train_batch_size",
            f"{train} must be divisible by gradient_accumulation_steps={ga} x {w} process(es) = {ga * w}",
        )
    per_device = train // (ga * w)
    if given_per_device and given_per_device != per_device:
        return None, Problem(
            "per_device_train_batch_size",
            f"{given_per_device} contradicts train_batch_size={train} / (gradient_accumulation_steps={ga} x {w} "
            f"process(es)) = {per_device}; set only one of them",
        )
    return _TrainSplit(train, per_device, ga, False), None


def _rollout_problems(ints: Mapping[str, int | None], split: _TrainSplit, group: int, w: int) -> tuple[int, list]:
    """Completions per rollout (`rollout_batch_size`, else TRL's `generation_batch_size`, else `steps_per_generation`
    micro-batches, else one optimizer step's) and the courses' and TRL's rules on it."""
    micro_global = split.per_device * w
    steps = ints["steps_per_generation"]
    rollout = ints["rollout_batch_size"] or ints["generation_batch_size"] or (steps or 0) * micro_global or split.train
    if ints["rollout_batch_size"] and steps and steps * micro_global != rollout:
        message = (
            f"{rollout} contradicts steps_per_generation={steps} (which implies {steps * micro_global} completions "
            "per rollout); set only one of them"
        )
        return rollout, [Problem("rollout_batch_size", message)]
    problems = []
    if rollout % group:
        problems.append(
            Problem(
                "rollout_batch_size", f"{rollout} must be divisible by group_size={group} (whole groups per rollout)"
            )
        )
    if split.train < group:
        problems.append(Problem("train_batch_size", f"{split.train} must be >= group_size={group} (one whole group)"))
    if rollout % split.train:
        problems.append(
            Problem(
                "rollout_batch_size",
                f"{rollout} must be a multiple of train_batch_size={split.train} (whole optimizer steps per rollout)",
            )
        )
    if rollout % micro_global:
        problems.append(
            Problem(
                "rollout_batch_size",
                f"{rollout} must be divisible by per_device_train_batch_size={split.per_device} x {w} process(es) = "
                f"{micro_global} (TRL: generation_batch_size must be divisible by the global batch)",
            )
        )
    return rollout, problems


def whole_optimizer_steps(steps_per_generation: int, num_iterations: int, ga: int) -> tuple[int | None, list]:
    """Optimizer steps per rollout batch, `steps_per_generation x num_iterations / GA`, or the problem when that is not
    a whole number (a rollout batch would then start inside an optimizer step)."""
    micro = steps_per_generation * num_iterations
    if micro % ga:
        message = (
            f"{ga} does not divide the {micro} micro-batches per rollout (steps_per_generation={steps_per_generation} "
            f"x num_iterations={num_iterations}): not whole optimizer steps per rollout; change one of them "
            "(in the courses' terms: rollout_batch_size x epochs_per_rollout_batch must be a multiple of "
            "train_batch_size)"
        )
        return None, [Problem("gradient_accumulation_steps", message)]
    return micro // ga, []


def world_size_problem(train: int | None, per_device: int, ga: int, world_size: int) -> Problem | None:
    """A `train_batch_size` the processes actually running do not make (the config was built for another W)."""
    actual = per_device * ga * world_size
    if train is None or actual == train:
        return None
    return Problem(
        "train_batch_size",
        f"{train} but per_device_train_batch_size x gradient_accumulation_steps x num_processes = {per_device} x "
        f"{ga} x {world_size} = {actual}: the config was built with WORLD_SIZE unset or different; build it inside "
        "the launched processes",
    )


def _eval_batches(values: Mapping[str, Any], ints: Mapping[str, int | None], group: int, w: int):
    """(per-device eval batch, completions per prompt, generation calls per pass or None), or a problem."""
    if not _eval_on(values):
        return (0, 0, None), []
    eval_batch = ints["per_device_eval_batch_size"] or trl_default("per_device_eval_batch_size")
    generations = ints["num_generations_eval"] or group
    if (eval_batch * w) % generations:
        message = (
            f"{eval_batch} x {w} process(es) must be a multiple of the {generations} completions per validation "
            "prompt (TRL)"
        )
        return None, [Problem("per_device_eval_batch_size", message)]
    limit = values.get("eval_limit")
    requests = math.ceil(int(limit) / (eval_batch * w // generations)) if limit else None
    return (eval_batch, generations, requests), []


def check_batches(values: Mapping[str, Any], world_size: int) -> tuple[BatchLayout | None, list[Problem]]:
    """The layout of a recipe's batches on `world_size` processes, or the problems (without fixes).

    The one batch arithmetic: the preflight, `trl_ext.grpo.config` (the courses' fields) and the trainer use it.

    Args:
        values: recipe fields (YAML chain plus command-line overrides); absent keys take TRL's defaults.
        world_size: training processes.
    """
    problems: list[Problem] = []
    ints = {key: _as_int(values, key, problems) for key in _COUNTS}
    if problems:
        return None, problems
    w = world_size
    group = ints["group_size"] or ints["num_generations"] or trl_default("num_generations")
    epochs = ints["epochs_per_rollout_batch"] or ints["num_iterations"] or trl_default("num_iterations")
    split, problem = _train_split(ints, w)
    if problem is not None:
        return None, [problem]
    rollout, problems = _rollout_problems(ints, split, group, w)
    if problems:
        return None, problems
    steps_per_generation = rollout // (split.per_device * w)
    per_rollout, problems = whole_optimizer_steps(steps_per_generation, epochs, split.ga)
    if problems:
        return None, problems
    evaluation, problems = _eval_batches(values, ints, group, w)
    if problems:
        return None, problems
    n_grpo = ints["n_grpo_steps"]
    layout = BatchLayout(
        world_size=w,
        group_size=group,
        rollout_batch_size=rollout,
        train_batch_size=split.train,
        per_device_train_batch_size=split.per_device,
        gradient_accumulation_steps=split.ga,
        ga_derived=split.ga_derived,
        steps_per_generation=steps_per_generation,
        num_iterations=epochs,
        optimizer_steps_per_rollout=per_rollout,
        n_grpo_steps=n_grpo,
        max_steps=n_grpo * per_rollout if n_grpo else int(_value(values, "max_steps")),
        per_device_eval_batch_size=evaluation[0],
        eval_generations=evaluation[1],
        eval_requests=evaluation[2],
    )
    return layout, []


def _works(values: Mapping[str, Any], overrides: Mapping[str, Any], world_size: int) -> bool:
    return check_batches({**values, **overrides}, world_size)[0] is not None


def _flags(overrides: Mapping[str, Any]) -> str:
    return " ".join(f"--{key} {value}" for key, value in overrides.items())


def suggest_batch_fixes(values: Mapping[str, Any], world_size: int) -> list[str]:
    """Changes that make `check_batches` pass on `world_size` (each re-checked), most local first."""
    fixes: list[str] = []
    counts = [w for w in range(1, _MAX_SUGGESTED_PROCESSES + 1) if _works(values, {}, w)]
    if counts:
        fixes.append(
            f"train on {' / '.join(map(str, counts))} process(es) (`num_processes` and `gpu_ids` of the accelerate "
            "config)"
        )
    train = values.get("train_batch_size")
    if train is not None:
        # Keep the completions per step; split them differently on this W (flags override the YAML's fields).
        current = values.get("per_device_train_batch_size")
        for per_device in dict.fromkeys(([int(current)] if current else []) + [2, 1, 4, 8]):
            if int(train) % (per_device * world_size):
                continue
            overrides = {
                "per_device_train_batch_size": per_device,
                "gradient_accumulation_steps": int(train) // (per_device * world_size),
            }
            if _works(values, overrides, world_size):
                fixes.append(_flags(overrides))
                break
    rollout = values.get("rollout_batch_size")
    if train and rollout and int(rollout) % int(train) == 0:
        ratio = int(rollout) // int(train)
        group = int(values.get("group_size") or values.get("num_generations") or trl_default("num_generations"))
        per_device = int(values.get("per_device_train_batch_size") or 1)
        step = math.lcm(per_device * world_size, group)
        for candidate in sorted({max(step, int(train) // step * step), (int(train) // step + 1) * step}):
            overrides = {"rollout_batch_size": candidate * ratio, "train_batch_size": candidate}
            if candidate != int(train) and _works(values, overrides, world_size):
                fixes.append(_flags(overrides) + " (fewer / more completions than the courses' per step)")
    return fixes


def micro_batch_choices(values: Mapping[str, Any], world_size: int) -> dict[int, int]:
    """`{per_device_train_batch_size: gradient_accumulation_steps}` for every split of the recipe's completions per
    optimizer step on `world_size` that `check_batches` accepts (rollout split included); empty if the recipe's own
    layout fails."""
    layout, _ = check_batches(values, world_size)
    if layout is None:
        return {}
    per_process = layout.train_batch_size // world_size
    choices = {}
    for per_device in range(1, per_process + 1):
        if per_process % per_device:
            continue
        ga = per_process // per_device
        if _works(values, {"per_device_train_batch_size": per_device, "gradient_accumulation_steps": ga}, world_size):
            choices[per_device] = ga
    return choices


def plan_batches(values: Mapping[str, Any], world_size: int) -> BatchLayout:
    """`check_batches`, raising `PreflightError` whose problems carry fixes (see `suggest_batch_fixes`)."""
    layout, problems = check_batches(values, world_size)
    if layout is not None:
        return layout
    fixes = suggest_batch_fixes(values, world_size)
    fix = "; or ".join(fixes) if fixes else "change the batch fields so that the equations above hold"
    raise PreflightError([Problem(p.field, p.message, p.fix or fix) for p in problems], f"{world_size} process(es)")


def derive_gradient_accumulation(values: Mapping[str, Any], world_size: int) -> int | None:
    """GA for a recipe that gives `train_batch_size` and `per_device_train_batch_size` but no GA, else None.

    The recipe layer sets it before the config is built, so `train_batch_size` means the same number of
    completions per optimizer step on any W; an indivisible split is left to the config to report.
    """
    if values.get("gradient_accumulation_steps") is not None:
        return None
    train, per_device = values.get("train_batch_size"), values.get("per_device_train_batch_size")
    if train is None or per_device is None:
        return None
    train, per_device = int(train), int(per_device)
    return None if per_device < 1 else _split_train_batch(train, per_device, world_size)


def _split_train_batch(train: int, per_device: int, world_size: int) -> int | None:
    """The GA that splits `train` completions per step into `per_device` x GA x `world_size`; None when it does not
    divide (the one rule of a derived GA, for `check_batches` and `derive_gradient_accumulation`)."""
    return None if train % (per_device * world_size) else train // (per_device * world_size)
