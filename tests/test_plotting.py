"""`trl-ext plot` on two short real AblationGRPOTrainer runs (with periodic validation), the rollout callback, and the
pass@N figure."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from conftest import shared_path
from test_trainer_helpers import freeze_imports

from trl_ext.reporting.plot import PANELS, find_trainer_state, metric_key, plot_pass_at_n, plot_runs, wall_clock

RUNS = {"grpo_clip": "grpo_clip", "reinforce": "reinforce_with_baseline"}


def digit_share(completions, **kwargs) -> list[float]:
    """Share of digits in the completion: a dense reward a random tiny model already varies on."""
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in completions]


def _train(tmp_path, name, loss_type, rollouts: bool):
    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer

    class RecordingTrainer(AblationGRPOTrainer):
        """Keeps every generation batch's completions with the mode (train / eval) it was made in."""

        generations: list = []

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.generations.append((self.model.training, list(self._logs["completion"])[-len(inputs) :]))
            return out

    from trl_ext.grpo.callbacks import RolloutSamplesCallback
    from trl_ext.rewards import countdown_reward
    from trl_ext.tasks import load_task
    from trl_ext.tiny import build_char_tokenizer, build_tiny_qwen3

    data = shared_path("countdown", "dev.parquet")
    train = load_task("countdown", source=str(data), split="train[:32]", prompt="compact")
    valid = load_task("countdown", source=str(data), split="train[32:36]", prompt="compact")
    tokenizer = build_char_tokenizer()
    model = build_tiny_qwen3(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    args = AblationGRPOConfig(
        output_dir=str(tmp_path / name),
        pg_loss_type=loss_type,
        report_to="none",
        use_cpu=True,
        max_steps=4,
        logging_steps=1,
        eval_strategy="steps",
        # the rollout run evaluates every step and reuses each rollout batch for 2 steps: a training step then
        # follows an evaluation without generating, which the callback must not report as evaluation samples
        eval_steps=1 if rollouts else 2,
        num_iterations=2 if rollouts else 1,
        per_device_eval_batch_size=8,
        save_strategy="steps",
        save_steps=4,
        max_completion_length=8,
        num_generations=4,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        seed=0,
        bf16=False,
        dataloader_num_workers=0,
    )
    trainer = RecordingTrainer(
        model,
        [countdown_reward, digit_share],
        args=args,
        train_dataset=train,
        eval_dataset=valid,
        processing_class=tokenizer,
    )
    if rollouts:
        trainer.add_callback(RolloutSamplesCallback(trainer, every_n_steps=1, num_samples=3))
    trainer.train()
    return tmp_path / name, trainer


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    freeze_imports()  # the trainers' end-of-run collections then skip the imported modules
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("runs")
    try:
        runs = {name: _train(tmp, name, loss, rollouts=(name == "grpo_clip")) for name, loss in RUNS.items()}
    finally:
        torch.set_num_threads(threads)
    return runs


def test_plot_two_runs_one_line_per_run_per_panel(two_runs, tmp_path):
    dirs = [two_runs[name][0] for name in RUNS]
    # save_strategy="steps": the history is in checkpoint-4/trainer_state.json
    assert find_trainer_state(dirs[0]) == dirs[0] / "checkpoint-4" / "trainer_state.json"
    out = tmp_path / "curves.png"
    fig = plot_runs(dirs, out)
    assert out.stat().st_size > 10_000

    histories = {name: two_runs[name][1].state.log_history for name in RUNS}
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    expected = {
        "train reward": "reward",
        "validation reward": "eval_reward",
        "validation format reward": "eval_rewards/countdown_reward/format_reward",
        "validation answer reward": "eval_rewards/countdown_reward/answer_reward",
        "entropy": "entropy",
        "grad norm": "grad_norm",
        "response length (tokens)": "completions/mean_length",
    }
    # 8 panels x (step, wall-clock); the grid's unused cells are hidden
    titles = {f"{title} vs {x}" for title, _ in PANELS for x in ("step", "wall-clock")}
    assert set(axes) == titles
    for title, key in expected.items():
        for x_axis, x_label in (("step", "step"), ("wall-clock", "wall-clock (s)")):
            ax = axes[f"{title} vs {x_axis}"]
            assert ax.get_xlabel() == x_label
            lines = {line.get_label(): line for line in ax.get_lines()}
            assert set(lines) == set(RUNS), (title, x_axis)  # one line per run, named after the run folder
            for name, line in lines.items():
                # wall-clock seconds of each log entry, from the function checked by hand in the next test
                times = wall_clock(histories[name])
                logged = [(e["step"], t, e[key]) for e, t in zip(histories[name], times, strict=True) if key in e]
                assert list(line.get_ydata()) == pytest.approx([v for _, _, v in logged]), (title, name)
                want_x = [s for s, _, _ in logged] if x_axis == "step" else [t for _, t, _ in logged]
                assert list(line.get_xdata()) == pytest.approx(want_x), (title, x_axis, name)
    # 4 steps, validation every step (grpo_clip) / every 2 steps (reinforce); train points at 1..4
    xs = {ln.get_label(): list(ln.get_xdata()) for ln in axes["validation reward vs step"].get_lines()}
    assert xs == {"grpo_clip": [1, 2, 3, 4], "reinforce": [2, 4]}
    # grpo_clip generates at steps 1 and 3 only (2 steps per rollout batch): reward is logged there
    xs = {ln.get_label(): list(ln.get_xdata()) for ln in axes["train reward vs step"].get_lines()}
    assert xs == {"grpo_clip": [1, 3], "reinforce": [1, 2, 3, 4]}
    # clip fraction: only grpo_clip logs TRL's clip_ratio/region_mean, so the panel has that one line
    assert [ln.get_label() for ln in axes["clip fraction vs step"].get_lines()] == ["grpo_clip"]

    # the CSV holds exactly the numbers drawn: for each run and panel, the step line's points and the wall-clock x
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    drawn = set()
    for title, _ in PANELS:
        by_step = {ln.get_label(): ln for ln in axes[f"{title} vs step"].get_lines()}
        by_time = {ln.get_label(): ln for ln in axes[f"{title} vs wall-clock"].get_lines()}
        for name in by_step:
            got = [r for r in rows if r["run"] == name and r["panel"] == title]
            assert [int(r["step"]) for r in got] == list(by_step[name].get_xdata()), (title, name)
            assert [float(r["value"]) for r in got] == pytest.approx(list(by_step[name].get_ydata()))
            assert [float(r["wall_clock_s"]) for r in got] == pytest.approx(list(by_time[name].get_xdata()))
            drawn.add((name, title))
    assert {(r["run"], r["panel"]) for r in rows} == drawn


def test_wall_clock_rebuilt_from_step_time_and_eval_runtime(two_runs):
    history = two_runs["grpo_clip"][1].state.log_history
    times = wall_clock(history)
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))
    expected = sum(e.get("step_time", 0.0) for e in history if "loss" in e) + sum(
        e["eval_runtime"] for e in history if "eval_runtime" in e
    )  # logging_steps=1: each train entry covers exactly one step
    assert times[-1] == pytest.approx(expected)
    assert wall_clock(
        [{"step": 2, "step_time": 1.5}, {"step": 2, "eval_runtime": 4.0}, {"step": 6, "step_time": 2}]
    ) == [
        3.0,
        7.0,
        15.0,
    ]


def test_rollouts_file_matches_the_trainer_logs(two_runs):
    from trl_ext.grpo.callbacks import read_rollouts
    from trl_ext.rewards import countdown_reward_fn

    run_dir, trainer = two_runs["grpo_clip"]
    rows = read_rollouts(run_dir)
    assert [r["step"] for r in rows] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    for r in rows:  # the stored reward is the Countdown reward of the stored completion
        nums, target = [int(x) for x in r["prompt"].split("]")[0][1:].split(",")], int(r["prompt"].split()[-2])
        expected = countdown_reward_fn(r["completion"], {"numbers": nums, "target": target})
        assert r["rewards"]["countdown_reward"] == pytest.approx(expected)
        assert r["rewards"]["digit_share"] == pytest.approx(digit_share([r["completion"]])[0])
        assert r["reward"] == pytest.approx(expected + r["rewards"]["digit_share"])
    # training generations happen at steps 1 and 3 (each batch used twice), evaluations after every step
    train_batches = [c for training, c in trainer.generations if training]
    # 4 evaluations of 4 prompts x 4 samples, in batches of 8
    assert len(train_batches) == 2 and len(trainer.generations) == 2 + 4 * 2
    for r in rows:
        assert train_batches[(r["step"] - 1) // 2][r["index"]] == r["completion"]
    assert not (two_runs["reinforce"][0] / "rollouts.jsonl").exists()


def test_metric_table_fallbacks(two_runs):
    from trl_ext.reporting.plot import load_run

    run = load_run(two_runs["grpo_clip"][0])
    panel = dict(PANELS)
    assert metric_key(run, panel["clip fraction"]) == "clip_ratio/region_mean"
    assert metric_key(run, ["clip_fraction", "no_such_key"]) is None


def test_plot_cli_and_missing_run(two_runs, tmp_path):
    from typer.testing import CliRunner

    from trl_ext.cli import app

    runner = CliRunner()
    out = tmp_path / "c.png"
    result = runner.invoke(app, ["plot", *(str(two_runs[n][0]) for n in RUNS), "-o", str(out), "--labels", "A,B"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    # --labels renames the runs in order: A is grpo_clip, whose validation rewards are those it logged
    assert {r["run"] for r in rows} == {"A", "B"}
    logged = [e["eval_reward"] for e in two_runs["grpo_clip"][1].state.log_history if "eval_reward" in e]
    assert [float(r["value"]) for r in rows if r["run"] == "A" and r["key"] == "eval_reward"] == pytest.approx(logged)
    bad = runner.invoke(app, ["plot", str(tmp_path / "nope")])
    assert bad.exit_code != 0 and "run folder not found" in bad.output


def test_pass_at_n_figure(tmp_path):
    """The curves are the summary's numbers in the order of N; "16" < "4" as strings, so a string sort shows up."""
    summary = {"pass_at_n": {"1": 0.25, "16": 0.75, "4": 0.5}, "best_at_n": {"1": 0.25, "16": 0.4, "4": 0.3}}
    json.loads(json.dumps(summary))  # the JSON form `trl-ext eval` writes (string keys)
    fig = plot_pass_at_n(summary, tmp_path / "p.png", title="m gsm8k L256")
    (ax,) = fig.axes
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}
    assert lines == {"pass@N": ([1, 4, 16], [0.25, 0.5, 0.75]), "Best@N": ([1, 4, 16], [0.25, 0.3, 0.4])}
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title(), ax.get_xscale()) == (
        "N (samples)", "accuracy", "m gsm8k L256", "log",
    )  # fmt: skip
    assert ax.get_ylim() == pytest.approx((-0.02, 1.02))  # accuracy axis fixed to [0, 1], comparable across runs
    assert (tmp_path / "p.png").stat().st_size > 0
