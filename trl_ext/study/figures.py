"""The study report's figures: `curves.png` (every arm on one axis per metric, by step and by wall clock),
`lengths.png` (example rollouts' lengths), `arms.png` (a row per arm). Each curve is the seeds' mean with a band from
the lowest to the highest seed, on a common grid by linear interpolation."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trl_ext.run_logs import metric_key, series
from trl_ext.study.spec import DEFAULT_METRICS, Study

CURVES = (("train reward", "reward"), ("validation accuracy", "eval_rewards/*/answer_reward"), ("entropy", "entropy"))


def curves_of(study: Study) -> tuple[tuple[str, str], ...]:
    """The panels: `CURVES` for the default metric; otherwise the train reward, each of the study's metrics, and the
    training entropy."""
    if tuple(study.metrics) == DEFAULT_METRICS:
        return CURVES
    panels = [("train reward", "reward"), *((m, m) for m in study.metrics)]
    return (*panels, *((("train entropy", "entropy"),) if "entropy" not in study.metrics else ()))


def _band(runs: list, key_pattern: str, axis: str, points: int = 50):
    """(x grid, mean, low, high) of a metric over a set of runs on a common x grid (linear interpolation)."""
    curves = []
    for log in runs:
        key = metric_key(log, [key_pattern])
        if key is None:
            continue
        xs, values = series(log, key)
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


def plot(study: Study, data: dict, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    raw = data["raw"]
    paths = []
    panels = curves_of(study)
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.2 * len(panels)), squeeze=False)
    for row, (title, key) in enumerate(panels):
        for col, axis in enumerate(("step", "wall_clock")):
            ax = axes[row][col]
            for arm, seeds in raw.items():
                band = _band([d["log"] for d in seeds.values()], key, axis)
                if band is None:
                    continue
                grid, mean, low, high = band
                (line,) = ax.plot(grid, mean, label=f"{arm} ({len(seeds)} seeds)")
                ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
            ax.set_title(f"{title} by {'step' if axis == 'step' else 'wall clock'}")
            ax.set_xlabel("optimizer step" if axis == "step" else "wall clock (s)")
            if ax.lines:
                ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(folder / "curves.png")
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)

    lengths_png = folder / "lengths.png"
    lengths_png.unlink(missing_ok=True)  # a figure from an earlier report would outlive the data it drew
    if not any(per[k] for seeds in raw.values() for d in seeds.values() for per in d["lengths"].values() for k in per):
        return paths  # no run logged example rollouts (`rollout_log_steps: 0`): nothing to draw
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5), squeeze=False)
    for col, kind in enumerate(("correct", "incorrect")):
        ax = axes[0][col]
        for arm, seeds in raw.items():
            by_step: dict[int, list[int]] = {}
            for d in seeds.values():
                for step, per in d["lengths"].items():
                    by_step.setdefault(step, []).extend(per[kind])
            steps = sorted(s for s, v in by_step.items() if v)
            if steps:
                ax.plot(steps, [np.mean(by_step[s]) for s in steps], marker=".", label=arm)
        ax.set_title(f"mean length of {kind} completions (characters)")
        ax.set_xlabel("optimizer step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(lengths_png)
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)
    return paths


def _kind(metric: str) -> str:
    """The per-arm figure's panel of a metric: `length`, `entropy` or `score` (accuracies, rewards)."""
    name = metric.lower()
    return "length" if "length" in name else "entropy" if "entropy" in name else "score"


def plot_arms(study: Study, data: dict, path: Path) -> Path | None:
    """`arms.png`: a row per arm; columns: the score metrics by step and by wall clock, the length metrics by step,
    the entropy by step (the study's entropy metric, else the trainer's); each the seeds' mean with their band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_kind = {k: [m for m in study.metrics if _kind(m) == k] for k in ("score", "length", "entropy")}
    columns = [
        ("accuracy", by_kind["score"], "step"),
        ("accuracy", by_kind["score"], "wall_clock"),
        ("length", by_kind["length"], "step"),
        ("entropy", by_kind["entropy"] or ["entropy"], "step"),
    ]
    columns = [c for c in columns if c[1]]
    raw = data["raw"]
    if not any(raw.values()):
        return None
    fig, axes = plt.subplots(
        len(raw), len(columns), figsize=(3.8 * len(columns), 2.5 * len(raw)), squeeze=False, sharex="col",
        sharey="col",
    )  # fmt: skip
    for row, (arm, seeds) in enumerate(raw.items()):
        for col, (title, keys, axis) in enumerate(columns):
            ax = axes[row][col]
            for key in keys:
                band = _band([d["log"] for d in seeds.values()], key, axis)
                if band is None:
                    continue
                grid, mean, low, high = band
                (line,) = ax.plot(grid, mean, label=key.rsplit("/", 1)[-1])
                ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
            ax.set_title(f"{arm} ({len(seeds)} seeds): {title}", fontsize=8)
            if row == len(raw) - 1:
                ax.set_xlabel("optimizer step" if axis == "step" else "wall clock (s)")
            if row == 0 and ax.lines:
                ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
