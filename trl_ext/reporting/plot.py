"""Training curves and pass@N / Best@N plots.

`trl-ext plot RUN_DIR...` reads each run's `trainer_state.json` (the run folder's own, or that of its latest
`checkpoint-N`, whichever has more steps), takes the logged metrics by the table `PANELS` (the first key a run
has, so TRL's `GRPOTrainer`, `AblationGRPOTrainer`, expert-iteration and SFT runs plot side by side) and draws one
PNG: one panel per metric, one line per run, against each x-axis asked for (`X_AXES`; default the optimizer step and
wall-clock time), plus a CSV of every number drawn.

The x-axes (`step`, `grpo_step`, `validation_step`, `wall_clock`) and how a run's log is read are
`trl_ext.reporting.run_logs`'s.

`--smoothing S` (default `DEFAULT_SMOOTHING`, 0 = off) draws each line smoothed, the raw points faint behind it,
with the smoothing of wandb's charts by default: its time-weighted exponential moving average, debiased
(`smooth_ema`). The CSV keeps the raw value and adds the smoothed one.

`--baseline DIR` draws zero-shot reference lines on the validation accuracy panel (`eval_rewards/*/answer_reward`:
the answer reward without the format bonus): DIR is a `trl-ext eval --recipe ... --max-tokens 256,512,1024` output,
and each run gets the accuracy at its own `max_completion_length` (from its `trl_ext_run.json`; a run without one
gets every budget).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import typer

from trl_ext.reporting.figures import pyplot, save
from trl_ext.reporting.run_logs import (
    AXES,
    RunLog,
    find_trainer_state,
    grpo_steps,
    load_run,
    metric_key,
    series,
    validation_steps,
    wall_clock,
)

#: (panel title, candidate log keys in order of preference; `*` matches a reward function's name)
PANELS: list[tuple[str, list[str]]] = [
    ("train reward", ["reward"]),
    ("validation reward", ["eval_reward"]),
    ("validation format reward", ["eval_rewards/*/format_reward"]),
    ("validation answer reward", ["eval_rewards/*/answer_reward"]),
    ("entropy", ["entropy"]),
    ("validation entropy", ["eval_entropy"]),
    ("grad norm", ["grad_norm"]),
    ("clip fraction", ["clip_fraction", "clip_ratio/region_mean"]),
    ("response length (tokens)", ["completions/mean_length"]),
    ("validation response length (tokens)", ["eval_completions/mean_length"]),
    ("train loss", ["loss"]),
    ("validation loss", ["eval_loss"]),
]
#: x-axis name -> (title suffix, axis label); see the module docstring.
X_AXES: dict[str, tuple[str, str]] = {
    "step": ("step", "step"),
    "grpo_step": ("GRPO step", "GRPO steps (EI steps for EI runs)"),
    "validation_step": ("validation step", "validation step"),
    "wall_clock": ("wall-clock", "wall-clock (s)"),
}
DEFAULT_X_AXES = ("step", "wall_clock")
__all__ = [
    "ACCURACY_PANEL", "DEFAULT_SMOOTHING", "DEFAULT_X_AXES", "PANELS", "X_AXES", "RunLog", "find_trainer_state",
    "grpo_steps", "load_run", "metric_key", "plot_pass_at_n", "plot_runs", "series", "smooth_ema",
    "validation_steps", "wall_clock",
]  # fmt: skip
ACCURACY_PANEL = "validation answer reward"
#: `trl-ext plot --smoothing`'s default (`plot_runs` draws raw lines unless given one)
DEFAULT_SMOOTHING = 0.6


def smooth_ema(values: list[float], smoothing: float) -> list[float]:
    """The debiased exponential moving average of wandb's charts (their default smoothing, "time weighted EMA").

    As wandb documents it: the weight is `s = min(sqrt(smoothing), 0.999)`; at each point the running sum of values
    and the running sum of weights both decay by `s` per unit of x and add the point, and the smoothed value is
    their ratio (the ratio removes the bias toward 0 of an average started at 0). Here one unit is one logged point:
    wandb measures it in units of its chart's visible x-range, so on a chart its decay per point depends on how many
    points are in view, where here it is the same on every panel and x-axis. `smoothing` 0 returns the values.

    Raises:
        ValueError: `smoothing` outside [0, 1].
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1] (0 = off), got {smoothing}")
    weight = min(smoothing**0.5, 0.999)
    total = norm = 0.0
    smoothed = []
    for value in values:
        total = total * weight + value
        norm = norm * weight + 1.0
        smoothed.append(total / norm)
    return smoothed


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
    x_axes: tuple[str, ...] | list[str] = DEFAULT_X_AXES,
    smoothing: float = 0.0,
):
    """Draw every panel for every run against each of `x_axes`.

    Args:
        run_dirs: training output folders (or `trainer_state.json` files).
        output: the PNG to write.
        labels: legend names, one per run (default: folder names).
        panels: `(title, candidate keys)` pairs (default `PANELS`); panels no run logged are left out.
        csv_path: the numbers drawn, long format `run,panel,key,step,grpo_step,validation_step,wall_clock_s,value`
            (default: `output` with `.csv`; an x-axis's cell is empty where the entry has none).
        baseline: a `trl-ext eval` output folder (or its `summary.json`): its accuracy at each run's budget is drawn
            as a dashed horizontal line labelled `zero-shot L<budget>` on the validation answer reward panel, and
            written to the CSV with key `zero-shot accuracy`.
        x_axes: names of `X_AXES`, in the order of the rows.
        smoothing: 0 (the default here) draws the logged points; above 0, each line is `smooth_ema` of its points
            in log order, with the raw points drawn faint (alpha 0.25, no legend entry) behind it; the CSV's
            `smoothed` column holds the smoothed values (empty when 0).

    Returns:
        The matplotlib figure: one block of rows per x-axis, in `x_axes` order, holding the panels with points on
        that axis. Axes are titled `"<panel> vs <x-axis title>"` (`vs step`, `vs GRPO step`, `vs validation step`,
        `vs wall-clock`) and hold one line per run with points on that axis, labelled with the run's name.

    Raises:
        ValueError: an unknown x-axis, or one no run has a value on (e.g. `grpo_step` for runs without a record).
    """
    smooth_ema([], smoothing)  # the range check, before anything is read
    x_axes = tuple(x_axes)
    runs = _load_runs(run_dirs, labels, x_axes)
    panels = PANELS if panels is None else panels
    references = baseline_lines(baseline, runs) if baseline is not None else []
    keyed = [(title, [(run, metric_key(run, cands)) for run in runs]) for title, cands in panels]
    keyed = [(title, pairs) for title, pairs in keyed if any(k for _, k in pairs)]
    if not keyed:
        raise ValueError(f"none of the runs logged any of {[c for _, cs in panels for c in cs]}")
    fig = _draw(keyed, x_axes, smoothing, references)
    output = save(fig, output, dpi=110, close=False)  # returned to the caller, who may look at it
    csv_path = Path(csv_path) if csv_path else output.with_suffix(".csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["run", "panel", "key", "step", "grpo_step", "validation_step", "wall_clock_s", "value", "smoothed"]
        )
        writer.writerows(_csv_rows(keyed, smoothing, references))
    return fig


def _load_runs(run_dirs: list[str | Path], labels: list[str] | None, x_axes: tuple[str, ...]) -> list[RunLog]:
    """The runs, named; raises ValueError for an unknown x-axis, a label count that does not match, or an x-axis no
    run has a value on."""
    unknown = [axis for axis in x_axes if axis not in X_AXES]
    if unknown or not x_axes:
        raise ValueError(f"x-axis {unknown or '(none)'}: choose from {', '.join(X_AXES)}")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"labels: {len(labels)} labels for {len(run_dirs)} runs")
    runs = [load_run(d, labels[i] if labels else None) for i, d in enumerate(run_dirs)]
    if labels is None:
        _unique_names(runs)
    for axis in x_axes:
        if not any(v is not None for run in runs for v in run.x[axis]):
            why = " (GRPO runs need the trl_ext_run.json the recipes write)" if axis == "grpo_step" else ""
            raise ValueError(f"x-axis {axis}: none of the runs has values on it{why}")
    return runs


def _csv_rows(keyed, smoothing: float, references: list[tuple[int, float]]) -> list[tuple]:
    """The CSV's rows: every logged point of every (panel, run), and the zero-shot references."""
    rows = []
    for title, pairs in keyed:
        for run, key in pairs:
            if key is not None:
                xs, values = series(run, key)
                smoothed = smooth_ema(values, smoothing) if smoothing else [""] * len(values)
                rows += [
                    _csv_row(run.name, title, key, x, v, sm) for x, v, sm in zip(xs, values, smoothed, strict=True)
                ]
        if title == ACCURACY_PANEL:
            rows += [(f"zero-shot L{b}", title, "zero-shot accuracy", "", "", "", "", a, "") for b, a in references]
    return rows


def _draw(keyed, x_axes: tuple[str, ...], smoothing: float, references: list[tuple[int, float]]):
    """The figure: one block of rows per x-axis, holding the panels with points on that axis (train panels have no
    validation step)."""
    plt = pyplot()
    cells = [(axis, title, pairs) for axis in x_axes for title, pairs in keyed if _has_points(pairs, axis)]
    blocks = [sum(1 for cell in cells if cell[0] == axis) for axis in x_axes]
    ncols = min(4, max(blocks))  # no empty column when every block has fewer panels
    nrows = sum(-(-n // ncols) for n in blocks)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    row = 0
    for axis, count in zip(x_axes, blocks, strict=True):
        suffix, x_label = X_AXES[axis]
        for i, (_, title, pairs) in enumerate(cell for cell in cells if cell[0] == axis):
            ax = axes[row + i // ncols][i % ncols]
            ax.set_visible(True)
            ax.set_title(f"{title} vs {suffix}", fontsize=9)
            ax.set_xlabel(x_label, fontsize=8)
            for run, key in pairs:
                _draw_line(ax, run, key, axis, smoothing)
            if title == ACCURACY_PANEL:
                for budget, accuracy in references:
                    ax.axhline(accuracy, linestyle="--", color="grey", label=f"zero-shot L{budget} ({accuracy:.1%})")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        row += -(-count // ncols)
    fig.tight_layout()
    return fig


def _draw_line(ax, run: RunLog, key: str | None, axis: str, smoothing: float) -> None:
    """One run's line on `ax`: the logged points, or with `smoothing` the smoothed line over the faint raw points."""
    points = _points(run, key, axis, smoothing)
    if not points:
        return
    xs = [p for p, _, _ in points]
    if smoothing:
        (line,) = ax.plot(xs, [v for _, v, _ in points], marker=".", alpha=0.25, label=f"_{run.name} raw")
        ax.plot(xs, [sm for _, _, sm in points], color=line.get_color(), label=run.name)
    else:
        ax.plot(xs, [v for _, v, _ in points], marker=".", label=run.name)


def _points(run: RunLog, key: str | None, axis: str, smoothing: float = 0.0) -> list[tuple[float, float, float]]:
    """`(x, value, smoothed value)` of the points with an `axis` value; smoothed over all the key's points in log
    order (so every x-axis shows the same smoothed values)."""
    if key is None:
        return []
    xs, values = series(run, key)
    smoothed = smooth_ema(values, smoothing)
    return [(x[axis], v, sm) for x, v, sm in zip(xs, values, smoothed, strict=True) if x[axis] is not None]


def _has_points(pairs: list[tuple[RunLog, str | None]], axis: str) -> bool:
    return any(_points(run, key, axis) for run, key in pairs)


def _csv_row(run: str, panel: str, key: str, x: dict, value: float, smoothed: float | str = "") -> tuple:
    cells = ["" if x[axis] is None else x[axis] for axis in AXES]
    return (run, panel, key, *cells, value, smoothed)


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
    fig, ax = pyplot().subplots(figsize=(4.5, 3.2))
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
    save(fig, output, dpi=110)
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
        x: str = typer.Option(
            ",".join(DEFAULT_X_AXES),
            "--x",
            help=f"Comma-separated x-axes, one row each: {', '.join(X_AXES)} (GRPO step: rollout batch, or EI step).",
        ),
        smoothing: float = typer.Option(
            DEFAULT_SMOOTHING,
            "--smoothing",
            help="Smoothing in [0, 1], 0 = off: wandb's default chart smoothing, its time-weighted exponential moving "
            "average with debiasing (weight sqrt(S) per logged point); the raw points stay drawn faint.",
        ),
    ) -> None:
        """Training curves (rewards, validation accuracy, entropy, response length, grad norm, clip fraction, losses)
        of several runs against optimizer step, GRPO step, validation step or wall-clock time."""
        names = [s.strip() for s in labels.split(",")] if labels else None
        axes = [a.strip() for a in x.split(",") if a.strip()]
        try:
            plot_runs(run_dirs, output, labels=names, baseline=baseline, x_axes=axes, smoothing=smoothing)
        except (FileNotFoundError, ValueError) as err:
            raise typer.BadParameter(str(err)) from None
        typer.echo(f"wrote {output} and {Path(output).with_suffix('.csv')}")
