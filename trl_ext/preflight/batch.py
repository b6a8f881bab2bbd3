"""Batch arithmetic of a GRPO recipe for the actual number of training processes (pure; no TRL import).

A recipe states the seeds' batch vocabulary; the world size W (training processes) decides how it splits:

    rollout_batch_size   = prompts per rollout x group_size                  (generation_batch_size)
    train_batch_size     = per_device_train_batch_size x gradient_accumulation_steps x W
    steps_per_generation = rollout_batch_size / (per_device_train_batch_size x W)
    optimizer steps per rollout = epochs_per_rollout_batch x steps_per_generation / gradient_accumulation_steps
    max_steps            = n_grpo_steps x optimizer steps per rollout

When a recipe gives `train_batch_size` and `per_device_train_batch_size` (the micro-batch, what memory depends on)
but not `gradient_accumulation_steps`, GA is derived for W: `train_batch_size / (per_device x W)`. That is how the
shipped recipes keep the seeds' 256 completions per step on 1, 2, 4 or 8 GPUs. A recipe that gives GA instead gets
the per-device batch derived from it (`trl_ext.grpo.config`). Every failure comes with fixes that were re-checked here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trl_ext.preflight.problems import PreflightError, Problem

# TRL 1.16 GRPOConfig defaults of the fields below (tests/test_preflight_batch.py checks them against TRL).
TRL_BATCH_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 8,
    "num_generations_eval": None,
    "num_iterations": 1,
    "generation_batch_size": None,
    "steps_per_generation": None,
    "per_device_eval_batch_size": 8,
    "eval_strategy": "no",
    "max_steps": -1,
}
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
        n_grpo_steps: the seeds' GRPO steps, or None.
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


def _value(values: Mapping[str, Any], key: str) -> Any:
    value = values.get(key)
    return TRL_BATCH_DEFAULTS.get(key) if value is None else value


def _eval_on(values: Mapping[str, Any]) -> bool:
    split = values.get("eval_split", "")
    disabled = split is not None and str(split).lower() in ("none", "no")
    return str(_value(values, "eval_strategy")).lower() not in ("no", "intervalstrategy.no") and not disabled


def _as_int(values: Mapping[str, Any], key: str, problems: list[Problem]) -> int | None:
    value = values.get(key)
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not (isinstance(value, int) or text.isdigit()):
        problems.append(Problem(key, f"{value!r} is not a positive integer"))
        return None
    number = int(text)
    if number < 1:
        problems.append(Problem(key, f"{number} must be >= 1"))
        return None
    return number


def check_batches(values: Mapping[str, Any], world_size: int) -> tuple[BatchLayout | None, list[Problem]]:
    """The layout of a recipe's batches on `world_size` processes, or the problems (without fixes).

    Args:
        values: recipe fields (YAML chain plus command-line overrides); absent keys take TRL's defaults.
        world_size: training processes.
    """
    problems: list[Problem] = []
    ints = {
        key: _as_int(values, key, problems)
        for key in (
            "group_size",
            "rollout_batch_size",
            "train_batch_size",
            "epochs_per_rollout_batch",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "num_generations",
            "num_iterations",
            "generation_batch_size",
            "steps_per_generation",
            "per_device_eval_batch_size",
            "num_generations_eval",
            "n_grpo_steps",
        )
    }
    if problems:
        return None, problems

    def get(key: str) -> int | None:
        return ints[key] if ints[key] is not None else TRL_BATCH_DEFAULTS.get(key)

    w = world_size
    group = ints["group_size"] or get("num_generations")
    epochs = ints["epochs_per_rollout_batch"] or get("num_iterations")
    train = ints["train_batch_size"]
    ga_derived = False
    if train is not None and ints["per_device_train_batch_size"] and not ints["gradient_accumulation_steps"]:
        per_device = ints["per_device_train_batch_size"]
        ga = _split_train_batch(train, per_device, w)
        if ga is None:
            problems.append(
                Problem(
                    "train_batch_size",
                    f"{train} completions per optimizer step do not split into per_device_train_batch_size "
                    f"{per_device} x gradient_accumulation_steps x {w} process(es) ({train} / {per_device * w} = "
                    f"{train / (per_device * w):.4g})",
                )
            )
            return None, problems
        ga_derived = True
    elif train is not None:
        ga = get("gradient_accumulation_steps")
        if train % (ga * w):
            problems.append(
                Problem(
                    "train_batch_size",
                    f"{train} must be divisible by gradient_accumulation_steps x world size = {ga} x {w} = {ga * w}",
                )
            )
            return None, problems
        per_device = train // (ga * w)
        if ints["per_device_train_batch_size"] and ints["per_device_train_batch_size"] != per_device:
            problems.append(
                Problem(
                    "per_device_train_batch_size",
                    f"{ints['per_device_train_batch_size']} contradicts train_batch_size {train} / "
                    f"(gradient_accumulation_steps {ga} x {w} process(es)) = {per_device}",
                )
            )
            return None, problems
    else:
        per_device, ga = get("per_device_train_batch_size"), get("gradient_accumulation_steps")
        train = per_device * ga * w

    if ints["rollout_batch_size"]:
        rollout = ints["rollout_batch_size"]
    elif ints["generation_batch_size"]:
        rollout = ints["generation_batch_size"]
    elif ints["steps_per_generation"]:
        rollout = ints["steps_per_generation"] * per_device * w
    else:
        rollout = train
    if rollout % group:
        problems.append(Problem("rollout_batch_size", f"{rollout} is not a whole number of groups of {group}"))
    if train < group:
        problems.append(Problem("train_batch_size", f"{train} is smaller than one group ({group})"))
    if rollout % train:
        problems.append(Problem("rollout_batch_size", f"{rollout} is not a whole number of train batches of {train}"))
    if rollout % (per_device * w):
        problems.append(
            Problem(
                "rollout_batch_size",
                f"{rollout} does not split into per-device {per_device} x {w} process(es) (TRL: generation_batch_size "
                "must be divisible by the global batch)",
            )
        )
    if problems:
        return None, problems
    steps_per_generation = rollout // (per_device * w)
    micro = epochs * steps_per_generation
    if micro % ga:
        problems.append(
            Problem(
                "gradient_accumulation_steps",
                f"{micro} micro-batches per rollout ({epochs} epoch(s) x {steps_per_generation}) is not a whole "
                f"number of optimizer steps of GA {ga}",
            )
        )
        return None, problems
    per_rollout = micro // ga
    n_grpo = ints["n_grpo_steps"]
    max_steps = n_grpo * per_rollout if n_grpo else int(_value(values, "max_steps"))

    eval_batch, eval_generations, requests = 0, 0, None
    if _eval_on(values):
        eval_batch = get("per_device_eval_batch_size")
        eval_generations = ints["num_generations_eval"] or group
        if (eval_batch * w) % eval_generations:
            problems.append(
                Problem(
                    "per_device_eval_batch_size",
                    f"the global eval batch {eval_batch} x {w} is not a multiple of the {eval_generations} "
                    "completions per validation prompt (TRL)",
                )
            )
            return None, problems
        limit = values.get("eval_limit")
        if limit:
            prompts_per_call = eval_batch * w // eval_generations
            requests = math.ceil(int(limit) / prompts_per_call)
    layout = BatchLayout(
        world_size=w,
        group_size=group,
        rollout_batch_size=rollout,
        train_batch_size=train,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=ga,
        ga_derived=ga_derived,
        steps_per_generation=steps_per_generation,
        num_iterations=epochs,
        optimizer_steps_per_rollout=per_rollout,
        n_grpo_steps=n_grpo,
        max_steps=max_steps,
        per_device_eval_batch_size=eval_batch,
        eval_generations=eval_generations,
        eval_requests=requests,
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
        group = int(values.get("group_size") or values.get("num_generations") or 8)
        per_device = int(values.get("per_device_train_batch_size") or 1)
        step = math.lcm(per_device * world_size, group)
        for candidate in sorted({max(step, int(train) // step * step), (int(train) // step + 1) * step}):
            overrides = {"rollout_batch_size": candidate * ratio, "train_batch_size": candidate}
            if candidate != int(train) and _works(values, overrides, world_size):
                fixes.append(_flags(overrides) + " (fewer / more completions than the seeds' per step)")
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
