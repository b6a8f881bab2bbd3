"""`trl-ext study report`: the study's numbers from its run folders, into `runs/<study>/report/` (report.md,
report.json, curves.png, arms.png, lengths.png).

- Per arm and metric: the metric's last validation value of each finished seed; the mean, and a 95% Student-t
  interval over seeds (`scipy.stats.t.interval`; none with one seed).
- Against the reference arm: paired by seed (the same seed's run of each arm, so the same data order and the same
  held-out problems; the runs keep aggregate validation metrics only, no per-problem results): the mean difference,
  its t interval and the paired t-test's p (`scipy.stats.ttest_rel`).
- Curves: per arm the mean over seeds with a band from the lowest to the highest seed, by optimizer step and by
  wall clock (`trl_ext.reporting.run_logs`'s rebuilt clock, on a common grid by linear interpolation).
- Response length of correct and of incorrect completions: from the example rollouts each run writes
  (`rollouts.jsonl`, a few per logged step); a completion is correct when its reward is >= 1 (the answer reward's
  value); length in characters of the completion text. The entropy: the trainer's logged `entropy`.
- Claims (the study file's `claims:`, `trl_ext.study.claims`): each judged shown / refuted / cannot tell from its
  paired differences, with the seeds a power calculation says a decision would take.
- Per arm (`arms.png`): one row per arm, the seeds' mean and band of the accuracy metrics by step and by wall clock,
  of the length metrics and of the entropy by step.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
from scipy import stats

from trl_ext.reporting.figures import pyplot, save
from trl_ext.reporting.run_logs import band, last_value, load_run, metric_key, series
from trl_ext.study.claims import CONFIDENCE, judge
from trl_ext.study.progress import is_finished
from trl_ext.study.spec import DEFAULT_METRICS, Study

CURVES = (("train reward", "reward"), ("validation accuracy", "eval_rewards/*/answer_reward"), ("entropy", "entropy"))
#: The logged wall-clock seconds of a run's training loop (HF Trainer's last train entry; evaluations inside the loop
#: included, model loading and saving not).
WALL_CLOCK = "train_runtime"


def curves_of(study: Study) -> tuple[tuple[str, str], ...]:
    """The panels: `CURVES` for the default metric; otherwise the train reward, each of the study's metrics, and the
    training entropy."""
    if tuple(study.metrics) == DEFAULT_METRICS:
        return CURVES
    panels = [("train reward", "reward"), *((m, m) for m in study.metrics)]
    return (*panels, *((("train entropy", "entropy"),) if "entropy" not in study.metrics else ()))


def mean_ci(values: list[float], confidence: float = CONFIDENCE) -> dict:
    """Mean and Student-t interval over seeds (scipy); no interval below two values or with zero spread."""
    values = [float(v) for v in values]
    out = {"n": len(values), "mean": float(np.mean(values)) if values else None, "low": None, "high": None}
    if len(values) >= 2:
        sem = stats.sem(values)
        if sem > 0:
            low, high = stats.t.interval(confidence, len(values) - 1, loc=np.mean(values), scale=sem)
            out["low"], out["high"] = float(low), float(high)
        else:
            out["low"] = out["high"] = out["mean"]
    return out


def paired(values: dict[int, float], reference: dict[int, float]) -> dict:
    """The arm minus the reference over the seeds both finished: mean, t interval, paired t-test p (scipy)."""
    seeds = sorted(set(values) & set(reference))
    diffs = [values[s] - reference[s] for s in seeds]
    out = {"seeds": seeds, **{k: v for k, v in mean_ci(diffs).items() if k != "n"}, "p": None}
    if len(seeds) >= 2 and np.std(diffs) > 0:
        out["p"] = float(stats.ttest_rel([values[s] for s in seeds], [reference[s] for s in seeds]).pvalue)
    return out


def curve_mean(log, pattern: str) -> float | None:
    """The mean of every logged number of the metric `pattern` in a run (`metric_key` resolves it): over equally
    spaced validations, the area under the held-out curve per step."""
    key = metric_key(log, [pattern])
    values = series(log, key)[1] if key is not None else []
    return float(np.mean(values)) if values else None


def completion_lengths(run_dir: Path) -> dict[int, dict[str, list[int]]]:
    """`{step: {"correct": [chars], "incorrect": [chars]}}` from the run's `rollouts.jsonl` (module docstring)."""
    path = run_dir / "rollouts.jsonl"
    out: dict[int, dict[str, list[int]]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        completion = row.get("completion")
        if isinstance(completion, list):  # chat messages
            completion = "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in completion)
        kind = "correct" if float(row.get("reward") or 0.0) >= 1.0 else "incorrect"
        out.setdefault(int(row["step"]), {"correct": [], "incorrect": []})[kind].append(len(str(completion)))
    return out


def collect(study: Study) -> dict:
    """Everything the report shows, as plain data (what report.json holds)."""
    arms = {}
    for arm in study.arms:
        seeds = {}
        for seed in study.seeds:
            folder = study.folder / arm.name / f"seed{seed}"
            if not is_finished(folder):
                continue
            log = load_run(folder)
            seeds[seed] = {
                "folder": str(folder),
                "metrics": {m: last_value(log.history, m) for m in study.metrics},
                "curve_means": {m: curve_mean(log, m) for m in study.metrics},
                "log": log,
                "lengths": completion_lengths(folder),
            }
        arms[arm.name] = seeds
    summary = {"study": study.name, "reference": study.reference, "seeds": list(study.seeds), "arms": {}}
    for name, seeds in arms.items():
        entry = {"seeds_finished": sorted(seeds), "metrics": {}, "vs_reference": {}}
        for m in study.metrics:
            values = {s: d["metrics"][m] for s, d in seeds.items() if d["metrics"][m] is not None}
            ref = {s: d["metrics"][m] for s, d in arms[study.reference].items() if d["metrics"][m] is not None}
            entry["metrics"][m] = {**mean_ci(list(values.values())), "per_seed": values}
            if name != study.reference:
                entry["vs_reference"][m] = paired(values, ref)
        lengths: dict[str, list[int]] = {"correct": [], "incorrect": []}
        for d in seeds.values():
            for per_step in d["lengths"].values():
                for kind in lengths:
                    lengths[kind] += per_step[kind]
        entry["mean_length_chars"] = {k: (float(np.mean(v)) if v else None) for k, v in lengths.items()}
        entries = [last_value(d["log"].history, "entropy") for d in seeds.values()]
        entry["final_entropy"] = mean_ci([e for e in entries if e is not None])
        walls = {s: last_value(d["log"].history, WALL_CLOCK) for s, d in seeds.items()}
        entry["wall_clock_s"] = {**mean_ci([w for w in walls.values() if w is not None]), "per_seed": walls}
        summary["arms"][name] = entry
    summary["claims"] = [judge_claim(claim, arms) for claim in study.claims]
    return {"summary": summary, "raw": arms}


def judge_claim(claim, arms: dict) -> dict:
    """A claim's entry of the summary: its fields, the per-seed differences `arm - baseline` and the verdict."""
    field = "metrics" if claim.value == "last" else "curve_means"
    arm, base = arms[claim.arm], arms[claim.baseline]
    diffs = {
        s: arm[s][field][claim.metric] - base[s][field][claim.metric]
        for s in sorted(set(arm) & set(base))
        if arm[s][field][claim.metric] is not None and base[s][field][claim.metric] is not None
    }
    return {**asdict(claim), "per_seed": diffs, **judge(claim, list(diffs.values()))}


def plot(study: Study, data: dict, folder: Path) -> list[Path]:
    """`curves.png` (per arm and panel the mean over seeds, and the band from the lowest to the highest seed, by
    optimizer step and by wall clock) and, when the runs logged example rollouts, `lengths.png`; returns the paths."""
    plt = pyplot()
    raw = data["raw"]
    paths = []
    panels = curves_of(study)
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.2 * len(panels)), squeeze=False)
    for row, (title, key) in enumerate(panels):
        for col, axis in enumerate(("step", "wall_clock")):
            ax = axes[row][col]
            for arm, seeds in raw.items():
                curve = band([d["log"] for d in seeds.values()], key, axis)
                if curve is None:
                    continue
                grid, mean, low, high = curve
                (line,) = ax.plot(grid, mean, label=f"{arm} ({len(seeds)} seeds)")
                ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
            ax.set_title(f"{title} by {'step' if axis == 'step' else 'wall clock'}")
            ax.set_xlabel("optimizer step" if axis == "step" else "wall clock (s)")
            if ax.lines:
                ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(save(fig, folder / "curves.png", dpi=90))

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
    paths.append(save(fig, lengths_png, dpi=90))
    return paths


def _kind(metric: str) -> str:
    """The per-arm figure's panel of a metric: `length`, `entropy` or `score` (accuracies, rewards)."""
    name = metric.lower()
    return "length" if "length" in name else "entropy" if "entropy" in name else "score"


def plot_arms(study: Study, data: dict, path: Path) -> Path | None:
    """`arms.png`: a row per arm; columns: the score metrics by step and by wall clock, the length metrics by step,
    the entropy by step (the study's entropy metric, else the trainer's); each the seeds' mean with their band."""
    raw = data["raw"]
    if not any(raw.values()):
        return None
    by_kind = {k: [m for m in study.metrics if _kind(m) == k] for k in ("score", "length", "entropy")}
    columns = [
        ("accuracy", by_kind["score"], "step"),
        ("accuracy", by_kind["score"], "wall_clock"),
        ("length", by_kind["length"], "step"),
        ("entropy", by_kind["entropy"] or ["entropy"], "step"),
    ]
    columns = [c for c in columns if c[1]]
    plt = pyplot()
    fig, axes = plt.subplots(
        len(raw), len(columns), figsize=(3.8 * len(columns), 2.5 * len(raw)), squeeze=False, sharex="col",
        sharey="col",
    )  # fmt: skip
    for row, (arm, seeds) in enumerate(raw.items()):
        for col, (title, keys, axis) in enumerate(columns):
            ax = axes[row][col]
            for key in keys:
                curve = band([d["log"] for d in seeds.values()], key, axis)
                if curve is None:
                    continue
                grid, mean, low, high = curve
                (line,) = ax.plot(grid, mean, label=key.rsplit("/", 1)[-1])
                ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
            ax.set_title(f"{arm} ({len(seeds)} seeds): {title}", fontsize=8)
            if row == len(raw) - 1:
                ax.set_xlabel("optimizer step" if axis == "step" else "wall clock (s)")
            if row == 0 and ax.lines:
                ax.legend(fontsize=6)
    fig.tight_layout()
    return save(fig, path, dpi=80)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}"


_SIGN = {"greater": "> {m}", "less": "< -{m}", "equivalent": "within +-{m}"}


def render_claims(claims: list[dict]) -> list[str]:
    """The claims table: each claim, the paired comparison it rests on, the verdict and what deciding would take."""
    lines = [
        "## Claims",
        "",
        "Paired by seed: arm minus baseline, mean [95% Student-t interval] (pairs). Shown: the interval lies on the "
        "claimed side; refuted: on the other; else the seeds a power calculation (noncentral t, power 0.8) says a "
        "decision would take if the measured mean and spread were the true ones.",
        "",
        "| claim | arm - baseline, metric | claimed | difference | verdict | seeds to decide |",
        "|---|---|---|---|---|---|",
    ]
    for c in claims:
        value = "curve mean" if c["value"] == "mean" else "last"
        claimed = _SIGN[c["direction"]].format(m=_fmt(c["margin"]))
        if not c["margin"]:  # no margin: "> 0" / "< 0", not "< -0"
            claimed = claimed.replace("-0", "0")
        if c["low"] is not None:
            diff = f"{_fmt(c['mean'])} [{_fmt(c['low'])}, {_fmt(c['high'])}] ({c['n']})"
        else:
            diff = f"{_fmt(c['mean'])} ({c['n']})"
        if c["verdict"] == "cannot tell":
            needed = str(c["seeds_to_decide"]) if c["seeds_to_decide"] is not None else "more than 1000"
        else:
            needed = "-"
        lines.append(
            f"| {c['claim']} | `{c['arm']}` - `{c['baseline']}`, {c['metric']} ({value}) | {claimed} | {diff} | "
            f"**{c['verdict']}** | {needed} |"
        )
    return [*lines, ""]


def render_markdown(
    study: Study,
    summary: dict,
    curves: str = "curves.png",
    lengths: str | None = "lengths.png",
    arms: str | None = None,
) -> str:
    lines = [f"# Study {study.name}", ""]
    if study.description:
        lines += [study.description, ""]
    lines += [
        f"Reference arm: `{study.reference}`. Seeds: {', '.join(map(str, study.seeds))}. Intervals: 95% Student-t "
        "over seeds (scipy). Comparisons are paired by seed (the runs keep aggregate validation metrics, not "
        "per-problem results).",
        "",
    ]
    if summary.get("claims"):
        lines += render_claims(summary["claims"])
    for m in study.metrics:
        lines += [
            f"## {m} (last validation)",
            "",
            "| arm | seeds | mean | 95% CI | vs reference (mean diff, 95% CI, paired t p) |",
            "|---|---|---|---|---|",
        ]
        for arm, entry in summary["arms"].items():
            s = entry["metrics"][m]
            ci = f"[{_fmt(s['low'])}, {_fmt(s['high'])}]" if s["low"] is not None else "-"
            vs = entry["vs_reference"].get(m)
            if vs is None:
                cmp = "reference"
            else:
                vci = f"[{_fmt(vs['low'])}, {_fmt(vs['high'])}]" if vs["low"] is not None else "-"
                cmp = f"{_fmt(vs['mean'])}, {vci}, p {_fmt(vs['p'])} ({len(vs['seeds'])} pairs)"
            lines.append(f"| {arm} | {s['n']} | {_fmt(s['mean'])} | {ci} | {cmp} |")
        lines.append("")
    lines += [
        "## Response length and entropy",
        "",
        "| arm | mean length, correct (chars) | mean length, incorrect (chars) | final entropy (mean over seeds) |",
        "|---|---|---|---|",
    ]
    for arm, entry in summary["arms"].items():
        ln = entry["mean_length_chars"]
        lines.append(
            f"| {arm} | {_fmt(ln['correct'])} | {_fmt(ln['incorrect'])} | {_fmt(entry['final_entropy']['mean'])} |"
        )
    lines += [
        "",
        f"## Wall clock ({WALL_CLOCK}: the training loop with its validations, per run)",
        "",
        "| arm | seeds | mean (s) | 95% CI | per seed (s) |",
        "|---|---|---|---|---|",
    ]
    for arm, entry in summary["arms"].items():
        w = entry["wall_clock_s"]
        ci = f"[{_fmt(w['low'])}, {_fmt(w['high'])}]" if w["low"] is not None else "-"
        per = ", ".join(f"{s}: {_fmt(v)}" for s, v in sorted(w["per_seed"].items()))
        lines.append(f"| {arm} | {w['n']} | {_fmt(w['mean'])} | {ci} | {per} |")
    lines += ["", f"![curves]({curves})", ""]
    if lengths is not None:
        lines += [f"![lengths]({lengths})", ""]
    if arms is not None:
        lines += [f"![per arm]({arms})", ""]
    return "\n".join(lines)


def write_report(study: Study, out: str | Path | None = None) -> dict:
    """Writes report.md, report.json, curves.png, arms.png (per arm) and lengths.png (when the runs logged example
    rollouts) under `runs/<study>/report/`; returns the summary.

    With `out` (a path without suffix, e.g. `benchmarks/results/ablations`) also the copies to ship: `<out>.md`,
    `<out>.json`, `<out>.png` (the curves), `<out>_arms.png` and `<out>_lengths.png`, the Markdown pointing at those
    figures."""
    import shutil

    data = collect(study)
    folder = study.report_dir
    folder.mkdir(parents=True, exist_ok=True)
    summary = data["summary"]
    (folder / "report.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    has_lengths = folder / "lengths.png" in plot(study, data, folder)
    has_arms = plot_arms(study, data, folder / "arms.png") is not None
    (folder / "report.md").write_text(
        render_markdown(
            study, summary, lengths="lengths.png" if has_lengths else None, arms="arms.png" if has_arms else None
        )
    )
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / "report.json", out.with_name(out.name + ".json"))
        shutil.copyfile(folder / "curves.png", out.with_name(out.name + ".png"))
        lengths = None
        if has_lengths:
            lengths = f"{out.name}_lengths.png"
            shutil.copyfile(folder / "lengths.png", out.with_name(lengths))
        arms = None
        if has_arms:
            arms = f"{out.name}_arms.png"
            shutil.copyfile(folder / "arms.png", out.with_name(arms))
        markdown = render_markdown(study, summary, f"{out.name}.png", lengths, arms)
        out.with_name(out.name + ".md").write_text(markdown)
    return summary
