"""Training curves and pass@N / Best@N plots.

`trl-ext plot RUN_DIR...` reads each run's `trainer_state.json` (the run folder's own, or that of its latest
`checkpoint-N`, whichever has more steps), takes the logged metrics by the table `PANELS` (the first key a run
has, so TRL's `GRPOTrainer` and `AblationGRPOTrainer` runs plot side by side) and draws one PNG: one panel per
metric, one line per run, against the optimizer step and against wall-clock time, plus a CSV of every number drawn.

Wall-clock time is rebuilt from the log, as `log_history` has no timestamps: TRL logs `step_time` (the mean time
of the optimizer steps since the previous log), so a train entry adds `step_time * (step - previous train step)`,
and an evaluation entry adds its `eval_runtime`. Time spent outside steps and evaluation (checkpoint saving,
start-up) is not counted.

`--baseline DIR` draws zero-shot reference lines on the validation accuracy panel (`eval_rewards/*/answer_reward`:
the answer reward without the format bonus): DIR is a `trl-ext eval --recipe ... --max-tokens 256,512,1024` output,
and each run gets the accuracy at its own `max_completion_length` (from its `trl_ext_run.json`; a run without one
gets every budget).
"""

from __future__ import annotations

import csv
import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path

import typer

#: (panel title, candidate log keys in order of preference; `*` matches a reward function's name)
PANELS: list[tuple[str, list[str]]] = [
    ("train reward", ["reward"]),
    ("validation reward", ["eval_reward"]),
    ("validation format reward", ["eval_rewards/*/format_reward"]),
    ("validation answer reward", ["eval_rewards/*/answer_reward"]),
    ("entropy", ["entropy"]),
    ("grad norm", ["grad_norm"]),
    ("clip fraction", ["clip_fraction", "clip_ratio/region_mean"]),
    ("response length (tokens)", ["completions/mean_length"]),
]
X_AXES = ("step", "wall_clock_s")
ACCURACY_PANEL = "validation answer reward"


@dataclass
class RunLog:
    """One training run's log: `history` is HF Trainer's `log_history` (a list of dicts with `step`)."""

    name: str
    path: Path
    history: list[dict]
    wall_clock: list[float] = field(default_factory=list)  # seconds at each history entry


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


def load_run(run_dir: str | Path, name: str | None = None) -> RunLog:
    """A run's log history and wall clock; `name` defaults to the folder's name (the recipe's run name)."""
    path = find_trainer_state(run_dir)
    state = json.loads(path.read_text())
    history = state.get("log_history")
    if not isinstance(history, list):
        raise ValueError(f"{path}: no 'log_history' list")
    run_root = path.parent.parent if path.parent.name.startswith("checkpoint-") else path.parent
    return RunLog(name=name or run_root.name, path=run_root, history=history, wall_clock=wall_clock(history))


def metric_key(run: RunLog, candidates: list[str]) -> str | None:
    """The first candidate key (wildcards allowed) that the run logged with a number."""
    logged = sorted({k for e in run.history for k, v in e.items() if isinstance(v, int | float)})
    for pattern in candidates:
        matches = fnmatch.filter(logged, pattern)
        if matches:
            return matches[0]
    return None


def series(run: RunLog, key: str) -> tuple[list[float], list[float], list[float]]:
    """`(steps, wall_clock_s, values)` of one logged key (entries where it is a number)."""
    steps, times, values = [], [], []
    for entry, t in zip(run.history, run.wall_clock, strict=True):
        value = entry.get(key)
        if isinstance(value, int | float) and value == value:  # NaN-free
            steps.append(entry.get("step", 0))
            times.append(t)
            values.append(float(value))
    return steps, times, values


def _unique_names(runs: list[RunLog]) -> None:
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
    for run in runs:
        if seen[run.name] > 1:  # same folder name in different places: add the parent folder
            run.name = f"{run.path.parent.name}/{run.path.name}"


def plot_runs(
    run_dirs: list[str | Path],
    output: str | Path = "curves.png",
    labels: list[str] | None = None,
    panels: list[tuple[str, list[str]]] | None = None,
    csv_path: str | Path | None = None,
    baseline: str | Path | None = None,
):
    """Draw every panel for every run against step (top row of each pair) and wall-clock time.

    Args:
        run_dirs: training output folders (or `trainer_state.json` files).
        output: the PNG to write.
        labels: legend names, one per run (default: folder names).
        panels: `(title, candidate keys)` pairs (default `PANELS`); panels no run logged are left out.
        csv_path: the numbers drawn, long format `run,panel,key,step,wall_clock_s,value` (default: `output`
            with `.csv`).
        baseline: a `trl-ext eval` output folder (or its `summary.json`): its accuracy at each run's budget is drawn
            as a dashed horizontal line labelled `zero-shot L<budget>` on the validation answer reward panel, and
            written to the CSV with key `zero-shot accuracy`.

    Returns:
        The matplotlib figure. Axes are titled `"<panel> vs step"` / `"<panel> vs wall-clock"` and hold one line
        per run that logged the panel's metric, labelled with the run's name.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"labels: {len(labels)} labels for {len(run_dirs)} runs")
    runs = [load_run(d, labels[i] if labels else None) for i, d in enumerate(run_dirs)]
    if labels is None:
        _unique_names(runs)
    panels = PANELS if panels is None else panels
    references = baseline_lines(baseline, runs) if baseline is not None else []
    keyed = [(title, [(run, metric_key(run, cands)) for run in runs]) for title, cands in panels]
    keyed = [(title, pairs) for title, pairs in keyed if any(k for _, k in pairs)]
    if not keyed:
        raise ValueError(f"none of the runs logged any of {[c for _, cs in panels for c in cs]}")

    ncols = 4
    nrows = 2 * ((len(keyed) + ncols - 1) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows), squeeze=False)
    rows_csv = []
    for i, (title, pairs) in enumerate(keyed):
        row, col = 2 * (i // ncols), i % ncols
        for j, x_name in enumerate(X_AXES):
            ax = axes[row + j][col]
            ax.set_title(f"{title} vs {'step' if x_name == 'step' else 'wall-clock'}", fontsize=9)
            ax.set_xlabel("step" if x_name == "step" else "wall-clock (s)", fontsize=8)
            for run, key in pairs:
                if key is None:
                    continue
                steps, times, values = series(run, key)
                ax.plot(steps if x_name == "step" else times, values, marker=".", label=run.name)
                if j == 0:
                    rows_csv += [(run.name, title, key, s, t, v) for s, t, v in zip(steps, times, values, strict=True)]
            if title == ACCURACY_PANEL:
                for budget, accuracy in references:
                    ax.axhline(accuracy, linestyle="--", color="grey", label=f"zero-shot L{budget} ({accuracy:.1%})")
                    if j == 0:
                        rows_csv.append((f"zero-shot L{budget}", title, "zero-shot accuracy", "", "", accuracy))
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
    for k in range(len(keyed), (nrows // 2) * ncols):
        axes[2 * (k // ncols)][k % ncols].set_visible(False)
        axes[2 * (k // ncols) + 1][k % ncols].set_visible(False)
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    csv_path = Path(csv_path) if csv_path else output.with_suffix(".csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "panel", "key", "step", "wall_clock_s", "value"])
        writer.writerows(rows_csv)
    return fig


def load_baseline(path: str | Path) -> dict[int, float]:
    """`{budget: accuracy}` of a `trl-ext eval` run (its folder or `summary.json`)."""
    path = Path(path)
    summary = path / "summary.json" if path.is_dir() else path
    if not summary.is_file():
        raise FileNotFoundError(f"--baseline {path}: no summary.json (the output folder of `trl-ext eval`)")
    results = json.loads(summary.read_text()).get("results")
    if not isinstance(results, dict) or not results:
        raise ValueError(f"{summary}: no 'results' per budget (write it with `trl-ext eval`)")
    return {int(budget): float(result["accuracy"]) for budget, result in results.items()}


def run_budget(run: RunLog) -> int | None:
    """A run's `max_completion_length`, from the `trl_ext_run.json` the recipe entry points write."""
    record = run.path / "trl_ext_run.json"
    if not record.is_file():
        return None
    value = json.loads(record.read_text()).get("config", {}).get("max_completion_length")
    return None if value is None else int(value)


def baseline_lines(baseline: str | Path, runs: list[RunLog]) -> list[tuple[int, float]]:
    """`(budget, accuracy)` reference lines for `runs`: each run's own budget, or every budget for a run without
    a record. A budget the baseline lacks is an error naming both."""
    accuracy = load_baseline(baseline)
    budgets: set[int] = set()
    for run in runs:
        budget = run_budget(run)
        if budget is None:
            budgets |= set(accuracy)
        elif budget not in accuracy:
            raise ValueError(
                f"--baseline {baseline} has budgets {sorted(accuracy)}, not run {run.name}'s max_completion_length "
                f"{budget}; evaluate it with --max-tokens including {budget}"
            )
        else:
            budgets.add(budget)
    return [(budget, accuracy[budget]) for budget in sorted(budgets)]


def plot_pass_at_n(summary: dict, output: str | Path, title: str = ""):
    """pass@N and Best@N against N from an evaluation summary (`{"pass_at_n": {N: v}, "best_at_n": {N: v}}`).

    Returns:
        The matplotlib figure (one axes, two lines labelled `pass@N` and `Best@N`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for key, label in (("pass_at_n", "pass@N"), ("best_at_n", "Best@N")):
        points = sorted((int(k), float(v)) for k, v in summary[key].items())
        ax.plot([k for k, _ in points], [v for _, v in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (samples)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return fig


def register(app: typer.Typer) -> None:
    """Add `trl-ext plot` to the CLI."""

    @app.command("plot")
    def plot_command(
        run_dirs: list[str] = typer.Argument(..., help="Training output folders (several runs are overlaid)."),
        output: str = typer.Option("curves.png", "--output", "-o", help="PNG to write (a .csv goes beside it)."),
        labels: str | None = typer.Option(None, help="Comma-separated legend names, one per run."),
        baseline: str | None = typer.Option(
            None,
            help="A `trl-ext eval --recipe` output folder: zero-shot accuracy lines on the validation accuracy panel "
            "(each run at its max_completion_length).",
        ),
    ) -> None:
        """Training curves (reward, validation reward, entropy, grad norm, clip fraction, length) vs step and time."""
        names = [s.strip() for s in labels.split(",")] if labels else None
        try:
            plot_runs(run_dirs, output, labels=names, baseline=baseline)
        except (FileNotFoundError, ValueError) as err:
            raise typer.BadParameter(str(err)) from None
        typer.echo(f"wrote {output} and {Path(output).with_suffix('.csv')}")
