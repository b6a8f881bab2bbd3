"""`trl-ext plot --smoothing`: wandb's debiased exponential moving average, computed by hand, on a the GSM8K
report-like run (4 completions a step, so the raw train reward moves in steps of 0.25)."""

from __future__ import annotations

import csv
import json

import pytest

from trl_ext.reporting.plot import DEFAULT_SMOOTHING, plot_runs, smooth_ema


def test_smooth_ema_by_hand():
    # smoothing 0.25: weight s = sqrt(0.25) = 0.5; sums of values and of weights, each decayed by s, then divided
    #   1:  1 / 1 = 1;  2: (0.5 * 1 + 0) / (0.5 * 1 + 1) = 1/3;  3: (0.5 * 0.5 + 1) / (0.5 * 1.5 + 1) = 1.25 / 1.75
    assert smooth_ema([1.0, 0.0, 1.0], 0.25) == pytest.approx([1.0, 1 / 3, 5 / 7])
    # debiased: a constant stays that constant from the first point (a plain EMA started at 0 would start low)
    assert smooth_ema([0.5] * 4, 0.81) == pytest.approx([0.5] * 4)
    assert smooth_ema([0.25, 0.75], 0.0) == [0.25, 0.75]  # off
    # smoothing 1 caps the weight at 0.999, as wandb does: (0.999 * 0 + 1) / (0.999 + 1)
    assert smooth_ema([0.0, 1.0], 1.0) == pytest.approx([0.0, 1 / 1.999])
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\]"):
            smooth_ema([1.0], bad)


def _gsm8k_like_run(tmp_path):
    """A GRPO log with one question of 4 completions a step: the train reward is a multiple of 0.25."""
    rewards = [0.25, 0.5, 0.5, 0.75, 0.5, 1.0, 0.75, 0.5]
    history = [{"step": step, "reward": r, "loss": 0.0, "step_time": 1.0} for step, r in enumerate(rewards, start=1)]
    run = tmp_path / "gsm8k_run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": len(rewards), "log_history": history}))
    return run, rewards


def test_plot_draws_the_smoothed_line_over_the_faint_raw_points(tmp_path):
    run, rewards = _gsm8k_like_run(tmp_path)
    out = tmp_path / "curves.png"
    fig = plot_runs([run], out, smoothing=0.36)  # weight 0.6
    ax = next(ax for ax in fig.axes if ax.get_visible() and ax.get_title() == "train reward vs step")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"gsm8k_run", "_gsm8k_run raw"}  # the raw line has no legend entry (a leading underscore)
    raw, smooth = lines["_gsm8k_run raw"], lines["gsm8k_run"]
    assert list(raw.get_ydata()) == rewards and raw.get_alpha() == 0.25
    assert smooth.get_color() == raw.get_color() and smooth.get_alpha() is None
    want, total, norm = [], 0.0, 0.0
    for r in rewards:  # the debiased EMA written out: weight 0.6
        total, norm = 0.6 * total + r, 0.6 * norm + 1
        want.append(total / norm)
    assert list(smooth.get_ydata()) == pytest.approx(want)
    assert max(want) < max(rewards)  # the smoothed peak sits below the raw one, as the GSM8K report reads its curve
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["gsm8k_run"]
    rows = [r for r in csv.DictReader(open(out.with_suffix(".csv"))) if r["key"] == "reward"]
    assert [float(r["value"]) for r in rows] == rewards
    assert [float(r["smoothed"]) for r in rows] == pytest.approx(want)


def test_plot_cli_smooths_by_default_and_names_a_bad_value(tmp_path):
    from typer.testing import CliRunner

    from trl_ext.cli import app

    run, rewards = _gsm8k_like_run(tmp_path)
    out = tmp_path / "c.png"
    result = CliRunner().invoke(app, ["plot", str(run), "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = [r for r in csv.DictReader(open(out.with_suffix(".csv"))) if r["key"] == "reward"]
    assert [float(r["smoothed"]) for r in rows] == pytest.approx(smooth_ema(rewards, DEFAULT_SMOOTHING))
    off = CliRunner().invoke(app, ["plot", str(run), "-o", str(out), "--smoothing", "0"])
    assert off.exit_code == 0, off.output
    assert {r["smoothed"] for r in csv.DictReader(open(out.with_suffix(".csv")))} == {""}
    bad = CliRunner().invoke(app, ["plot", str(run), "-o", str(out), "--smoothing", "1.5"])
    assert bad.exit_code != 0 and "smoothing must be in [0, 1] (0 = off), got 1.5" in " ".join(bad.output.split())
