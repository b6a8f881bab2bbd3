"""What the demo reports: the paired sign test, the GRPO-versus-control table and `curve.png` (drawn with
`trl_ext.reporting.figures`)."""

from __future__ import annotations

from pathlib import Path

from trl_ext.reporting.figures import pyplot, save


def paired_sign_test(before: list[int], after: list[int]) -> dict:
    """Exact two-sided sign test on paired per-problem results (0/1 correctness or counts of correct samples).

    `gained` counts problems where `after > before`, `lost` those where `after < before`; ties carry no information
    and drop out. p: `scipy.stats.binomtest` of `gained` among the untied problems against a fair coin, two-sided
    (for 0/1 results this is the exact McNemar test); 1 when every problem ties.
    """
    from scipy.stats import binomtest

    lost = sum(1 for b, a in zip(before, after, strict=True) if a < b)
    gained = sum(1 for b, a in zip(before, after, strict=True) if a > b)
    p_value = binomtest(gained, lost + gained, 0.5).pvalue if lost + gained else 1.0
    return {"lost": lost, "gained": gained, "p_value": float(p_value)}


def compare(a: dict, b: dict) -> dict:
    """Arm `b` against arm `a` (held-out results of `heldout.evaluate`): point differences and paired sign tests."""
    out = {"greedy_points": round(100 * (b["greedy_accuracy"] - a["greedy_accuracy"]), 2)}
    out["greedy_test"] = paired_sign_test(a["greedy_correct"], b["greedy_correct"])
    if "sampled_correct" in a and "sampled_correct" in b:
        out["sampled_points"] = round(100 * (b["sampled_accuracy"] - a["sampled_accuracy"]), 2)
        out["sampled_test"] = paired_sign_test(a["sampled_correct"], b["sampled_correct"])
        k = next(key for key in b if key.startswith("pass@"))
        out["pass_points"] = round(100 * (b[k] - a[k]), 2)
    return out


def _pct(r: dict, key: str) -> str:
    return f"{100 * r[key]:.1f}%" if key in r else "-"


def comparison_table(rows: list[tuple[str, dict, dict | None]], num_problems: int) -> str:
    """A plain-text table: one row per arm `(name, held-out result, clock or None)`."""
    pass_key = next((k for _, r, _ in rows for k in r if k.startswith("pass@")), "pass@k")
    header = f"{'held-out (' + str(num_problems) + ' problems)':<34} {'greedy':>7} {'sampled':>8} {pass_key:>7}"
    lines = [header + f" {'steps':>6} {'train CPU s':>11}"]
    for name, r, clock in rows:
        cells = f"{name:<34} {_pct(r, 'greedy_accuracy'):>7} {_pct(r, 'sampled_accuracy'):>8} {_pct(r, pass_key):>7}"
        if clock:
            cells += f" {clock['steps']:>6} {clock['train_cpu_s']:>11.0f}"
        lines.append(cells)
    return "\n".join(lines)


def plot_curve(metrics: dict, path: Path) -> None:
    """Held-out greedy accuracy against training CPU seconds (SFT warm start before 0, then GRPO and the control
    from the same start at 0), with sampled accuracy at each phase's ends; and the GRPO training reward."""
    plt = pyplot()
    arms = metrics["arms"]
    start = arms["start"]["heldout"]
    fig, (ax_acc, ax_reward) = plt.subplots(1, 2, figsize=(12, 4.2))
    sft = [c for c in metrics["curve"] if c["phase"] == "sft"]
    if sft:
        offset = sft[-1]["train_cpu_s"]
        xs = [-offset] + [c["train_cpu_s"] - offset for c in sft]
        ys = [metrics["random_init"]["greedy_accuracy"]] + [c["greedy_accuracy"] for c in sft]
        ax_acc.plot(xs, [100 * y for y in ys], marker=".", color="gray", label="SFT warm start (labelled)")
    colors = {"grpo": "tab:blue", "control": "tab:orange"}
    labels = {"grpo": "GRPO (unlabelled, verifier)", "control": "SFT-only control (labelled)"}
    for arm in ("grpo", "control"):
        if arm not in arms:
            continue
        points = [(0.0, start["greedy_accuracy"])]
        points += [(c["train_cpu_s"], c["greedy_accuracy"]) for c in metrics["curve"] if c["phase"] == arm]
        ax_acc.plot(
            [x for x, _ in points], [100 * y for _, y in points], marker="o", color=colors[arm], label=labels[arm]
        )
        end = arms[arm]
        if "sampled_accuracy" in end["heldout"]:
            ax_acc.plot(
                [0.0, end["clock"]["train_cpu_s"]],
                [100 * start["sampled_accuracy"], 100 * end["heldout"]["sampled_accuracy"]],
                marker="s",
                linestyle="--",
                color=colors[arm],
                alpha=0.6,
                label=f"{arm} sampled (T=1)",
            )
    ax_acc.axvline(0.0, color="gray", linestyle=":")
    ax_acc.set(
        xlabel="training CPU seconds (held-out evaluations excluded; 0 = end of the warm start)",
        ylabel="held-out accuracy (%)",
        title=f"greedy accuracy, {len(start['greedy_correct'])} held-out problems",
    )
    ax_acc.legend(fontsize=8)
    log = [h for h in metrics.get("grpo_log", []) if "reward" in h]
    ax_reward.plot([h["step"] for h in log], [h["reward"] for h in log], marker=".")
    ax_reward.set(xlabel="GRPO step", ylabel="mean reward of rollouts", title="GRPO training reward")
    fig.tight_layout()
    save(fig, path, dpi=100)


ARM_STYLE = {
    "grpo": ("tab:blue", "GRPO (unlabelled, verifier)"),
    "ei": ("tab:green", "expert iteration (unlabelled, verifier)"),
    "control": ("tab:orange", "SFT-only control (labelled)"),
}


def arm_series(metrics: dict, arm: str, key: str) -> list[tuple[float, float]]:
    """`(training CPU seconds, value)` of one arm's curve, starting at the common start (0 s); `key` is
    `greedy_accuracy` or a response statistic (`response_entropy`, `response_mean_length`, `response_accuracy`)."""
    start = metrics["arms"]["start"]
    first = start["heldout"]["greedy_accuracy"] if key == "greedy_accuracy" else start["response"][key[9:]]
    points = [(c["train_cpu_s"], c[key]) for c in metrics["curve"] if c["phase"] == arm]
    return [(0.0, first), *points]


def plot_arms(metrics: dict, path: Path) -> None:
    """The arms side by side on one axis of training CPU seconds: held-out greedy accuracy (and the accuracy of one
    sample per problem at T=1, dashed), the entropy of the sampled responses, and their length."""
    plt = pyplot()
    panels = [
        ("held-out accuracy (%)", "greedy_accuracy", 100.0),
        ("entropy of sampled responses (nats / token)", "response_entropy", 1.0),
        ("length of sampled responses (tokens)", "response_mean_length", 1.0),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for ax, (ylabel, key, scale) in zip(axes, panels, strict=True):
        for arm, (color, label) in ARM_STYLE.items():
            if arm not in metrics["arms"]:
                continue
            xs, ys = zip(*arm_series(metrics, arm, key), strict=True)
            ax.plot(xs, [scale * y for y in ys], marker="o", color=color, label=label)
            if key == "greedy_accuracy":
                xs, ys = zip(*arm_series(metrics, arm, "response_accuracy"), strict=True)
                ax.plot(xs, [scale * y for y in ys], linestyle="--", color=color, alpha=0.6)
        ax.set(xlabel="training CPU seconds (held-out measurements excluded)", ylabel=ylabel)
    axes[0].set_title(f"greedy (solid), one sample at T=1 (dashed); {metrics['num_eval_problems']} held-out problems")
    axes[1].set_title("entropy, one sample per held-out problem")
    axes[2].set_title("response length, the same samples")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, dpi=100)
