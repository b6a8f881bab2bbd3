"""Training-run logs for `trl-ext plot`: a run folder's `trainer_state.json` history, the logged metric behind each
panel, and every entry's position on each x-axis.

The x-axes:

- `step`: the optimizer step HF logs.
- `grpo_step`: GRPO steps (rollout batches) done, `step / k` with `k = num_iterations x steps_per_generation /
  gradient_accumulation_steps` optimizer steps per rollout, read from the run's `trl_ext_run.json` (the recipes
  write it): the 4 optimizer steps of an E2 / T128 grid point's first rollout batch sit at 0.25 ... 1.0. The off-policy
  grid points take 1 to 16 optimizer steps per GRPO step; on this axis they line up. An expert-iteration run's
  entries carry `ei_step`: EI step k's SFT steps spread evenly over (k - 1, k], its validation at k. Runs with
  neither (SFT) are left off this axis.
- `validation_step`: the how-many-th validation the entry belongs to: the distinct steps (and EI steps) with an
  evaluation entry, numbered 1, 2, ... (an evaluation at step 0, `eval_on_start`, is validation step 0; a second
  entry at the same step, such as the recipes' final evaluation, is the same validation step). Only evaluation
  entries (keys `eval_*`) have one, so only the validation panels are drawn against it.
- `wall_clock`: seconds, rebuilt as below.

Wall-clock time is rebuilt from the log, as `log_history` has no timestamps: TRL logs `step_time` (the mean time
of the optimizer steps since the previous log), so a train entry adds `step_time * (step - previous train step)`,
and an evaluation entry adds its `eval_runtime`. Time spent outside steps and evaluation (checkpoint saving,
start-up) is not counted.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

#: The x-axes every entry gets a value on (None where it has none); see the module docstring.
AXES = ("step", "grpo_step", "validation_step", "wall_clock")


@dataclass
class RunLog:
    """One training run's log: `history` is HF Trainer's `log_history` (a list of dicts with `step`); `x` holds, per
    x-axis, the value at each history entry (None where the entry has none)."""

    name: str
    path: Path
    history: list[dict]
    wall_clock: list[float] = field(default_factory=list)  # seconds at each history entry
    x: dict[str, list[float | None]] = field(default_factory=dict)


def find_trainer_state(run_dir: str | Path) -> Path:
    """`trainer_state.json` of a run folder: its own or its latest checkpoint's, whichever reached more steps."""
    run_dir = Path(run_dir)
    if run_dir.is_file() and run_dir.name == "trainer_state.json":
        return run_dir
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder not found: {run_dir}")
    candidates = [run_dir / "trainer_state.json"] if (run_dir / "trainer_state.json").is_file() else []
    checkpoints = [p for p in run_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    if checkpoints:
        latest = max(checkpoints, key=lambda p: int(p.name.split("-")[-1]))
        if (latest / "trainer_state.json").is_file():
            candidates.append(latest / "trainer_state.json")
    if not candidates:
        raise FileNotFoundError(
            f"{run_dir}: no trainer_state.json in the folder or its checkpoint-*/ folders "
            "(save a checkpoint, or call trainer.save_state())"
        )
    return max(candidates, key=lambda p: json.loads(p.read_text()).get("global_step", 0))


def wall_clock(history: list[dict]) -> list[float]:
    """Seconds elapsed at each log entry: sum of `step_time * steps` of train entries and `eval_runtime` of
    evaluation entries up to and including it (see the module docstring)."""
    elapsed, last_step, out = 0.0, 0, []
    for entry in history:
        step = entry.get("step", last_step)
        if entry.get("step_time") is not None:
            elapsed += float(entry["step_time"]) * max(step - last_step, 0)
            last_step = step
        if entry.get("eval_runtime") is not None:
            elapsed += float(entry["eval_runtime"])
        out.append(elapsed)
    return out


def is_evaluation(entry: dict) -> bool:
    """An evaluation entry: HF prefixes every key an evaluation logs with `eval_`."""
    return any(key.startswith("eval_") for key in entry)


def validation_steps(history: list[dict]) -> list[int | None]:
    """The validation step of each entry (module docstring): evaluation entries at the k-th distinct position with an
    evaluation get k, those at step 0 get 0; other entries None. A position is the step and, for expert iteration,
    the EI step (an EI step that kept nothing validates at the same optimizer step as the one before it)."""

    def position(entry: dict) -> tuple[int, int]:
        return entry.get("step", 0), entry.get("ei_step") or 0

    positions = sorted({position(e) for e in history if is_evaluation(e) and e.get("step", 0) > 0})
    rank = {p: i + 1 for i, p in enumerate(positions)}
    return [(rank.get(position(e), 0)) if is_evaluation(e) else None for e in history]


def steps_per_rollout(run_path: Path) -> float | None:
    """Optimizer steps per GRPO step, `num_iterations x steps_per_generation / gradient_accumulation_steps`, from the
    run's `trl_ext_run.json`; None without a record or without those fields (an SFT run)."""
    record = run_path / "trl_ext_run.json"
    if not record.is_file():
        return None
    config = json.loads(record.read_text()).get("config", {})
    keys = ("num_iterations", "steps_per_generation", "gradient_accumulation_steps")
    if any(config.get(key) is None for key in keys):
        return None
    return config["num_iterations"] * config["steps_per_generation"] / config["gradient_accumulation_steps"]


def grpo_steps(history: list[dict], per_rollout: float | None) -> list[float | None]:
    """The GRPO steps done at each entry (module docstring): `step / per_rollout`; for expert iteration (entries
    with `ei_step`), EI step k's SFT steps spread over (k - 1, k] and its other entries at k. None when neither."""
    if any(e.get("ei_step") is not None for e in history):
        sft_steps: dict[int, list[int]] = {}
        for e in history:
            if e.get("ei_step") is not None and "loss" in e and not is_evaluation(e):
                sft_steps.setdefault(int(e["ei_step"]), []).append(e.get("step", 0))
        out: list[float | None] = []
        for e in history:
            k = e.get("ei_step")
            steps = sorted(set(sft_steps.get(int(k), []))) if k is not None else []
            if k is None:
                out.append(None)
            elif "loss" in e and not is_evaluation(e) and e.get("step", 0) in steps:
                out.append(k - 1 + (steps.index(e.get("step", 0)) + 1) / len(steps))
            else:
                out.append(float(k))
        return out
    if not per_rollout:
        return [None] * len(history)
    return [e.get("step", 0) / per_rollout for e in history]


def load_run(run_dir: str | Path, name: str | None = None) -> RunLog:
    """A run's log history and its x-axis values; `name` defaults to the folder's name (the recipe's run name)."""
    path = find_trainer_state(run_dir)
    state = json.loads(path.read_text())
    history = state.get("log_history")
    if not isinstance(history, list):
        raise ValueError(f"{path}: no 'log_history' list")
    run_root = path.parent.parent if path.parent.name.startswith("checkpoint-") else path.parent
    clock = wall_clock(history)
    x = {
        "step": [e.get("step", 0) for e in history],
        "grpo_step": grpo_steps(history, steps_per_rollout(run_root)),
        "validation_step": validation_steps(history),
        "wall_clock": clock,
    }
    return RunLog(name=name or run_root.name, path=run_root, history=history, wall_clock=clock, x=x)


def metric_key(run: RunLog, candidates: list[str]) -> str | None:
    """The first candidate key (wildcards allowed) that the run logged with a number."""
    logged = sorted({k for e in run.history for k, v in e.items() if isinstance(v, int | float)})
    for pattern in candidates:
        matches = fnmatch.filter(logged, pattern)
        if matches:
            return matches[0]
    return None


def series(run: RunLog, key: str) -> tuple[list[dict[str, float | None]], list[float]]:
    """`(x values, values)` of one logged key over the entries where it is a number: each x value a dict of every
    x-axis's value at that entry (`AXES` names, None where the axis has none)."""
    xs, values = [], []
    for i, entry in enumerate(run.history):
        value = entry.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value == value:  # NaN-free
            xs.append({axis: run.x[axis][i] for axis in AXES})
            values.append(float(value))
    return xs, values


def last_value(history: list[dict], pattern: str) -> float | None:
    """The last number logged under the first key matching `pattern` (`fnmatch`, `*` for a reward function's name),
    NaN left out; None when there is none."""
    for entry in reversed(history):
        for key in sorted(entry):
            value = entry[key]
            if fnmatch.fnmatch(key, pattern) and isinstance(value, int | float) and not isinstance(value, bool):
                if not math.isnan(value):
                    return float(value)
    return None


def band(runs: list[RunLog], pattern: str, axis: str, points: int = 50):
    """A metric over several runs on a common x grid (linear interpolation between each run's logged points): the
    grid, the mean over runs, the lowest and the highest, over the x range all runs cover.

    Args:
        runs: the runs (seeds of one arm).
        pattern: the metric's log key (`metric_key` resolves `*`).
        axis: one of `AXES`.
        points: grid points.

    Returns:
        `(grid, mean, low, high)`, numpy arrays of `points` values (1 when the runs share one x), or None when no run
        logged the metric on that axis or their ranges do not overlap.
    """
    import numpy as np

    curves = []
    for run in runs:
        key = metric_key(run, [pattern])
        if key is None:
            continue
        xs, values = series(run, key)
        pairs = [(x[axis], v) for x, v in zip(xs, values, strict=True) if x[axis] is not None]
        if pairs:
            curves.append(pairs)
    if not curves:
        return None
    end = min(max(x for x, _ in c) for c in curves)
    start = max(min(x for x, _ in c) for c in curves)
    if end < start:
        return None
    grid = np.linspace(start, end, points) if end > start else np.array([start])
    stacked = np.array([np.interp(grid, [x for x, _ in c], [v for _, v in c]) for c in curves])
    return grid, stacked.mean(0), stacked.min(0), stacked.max(0)
