"""`trl-ext plot`'s x-axes (optimizer step, GRPO step, validation step, wall-clock) and several kinds of runs on one
figure: an off-policy grid point, its on-policy reference and an expert-iteration run, each a `trainer_state.json` of
the shape the trainers log, with the `trl_ext_run.json` record the recipes write from the real recipe YAMLs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from trl_ext.reporting.plot import PANELS, grpo_steps, load_run, plot_runs, validation_steps

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
KEY = "eval_rewards/countdown_reward/answer_reward"


def _grpo_history(max_steps: int, eval_every: int, generate_every: int) -> list[dict]:
    """Log entries as TRL's GRPO logs them: a train entry per optimizer step (`reward` only where a rollout batch
    was generated), an evaluation entry every `eval_every` steps, and a final evaluation at the last step."""
    history = []
    for step in range(1, max_steps + 1):
        entry = {"step": step, "loss": 0.1 * step, "entropy": 2.0 - 0.01 * step, "step_time": 2.0}
        if (step - 1) % generate_every == 0:
            entry["reward"] = 0.01 * step
        history.append(entry)
        if step % eval_every == 0:
            history.append({"step": step, KEY: step / 100, "eval_entropy": 1.5, "eval_runtime": 3.0})
    history.append({"step": max_steps, KEY: max_steps / 100, "eval_entropy": 1.5, "eval_runtime": 3.0})
    return history


def _run_dir(root: Path, name: str, history: list[dict], recipe: str | None) -> Path:
    """A run folder: trainer_state.json, and the run record `recipes/*.py` write for `recipe` on one process."""
    from trl_ext.preflight.rundir import make_record, write_record
    from trl_ext.recipes import parse_recipe_args

    run = root / name
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": history[-1]["step"], "log_history": history}))
    if recipe is not None:
        argv = ["--config", str(RECIPES / recipe), "--use_cpu", "true"]
        parsed = parse_recipe_args("countdown", argv)
        values = {k: v for obj in parsed for k, v in vars(obj).items() if not k.startswith("_")}
        write_record(run, make_record(str(RECIPES / recipe), argv, [], values))
    return run


def _ei_history() -> list[dict]:
    """Expert iteration as `ExpertIterationTrainer` logs it: validation at the start, SFT steps tagged with their
    EI step (3, 0 and 2 SFT steps: the second EI step kept nothing and logs its rollout metrics alone), validation
    after each EI step."""
    history = [{"step": 0, "ei_step": 0, KEY: 0.1, "eval_entropy": 2.0, "eval_runtime": 3.0}]
    step = 0
    for ei_step, sft_steps in ((1, 3), (2, 0), (3, 2)):
        if not sft_steps:
            history.append({"step": step, "ei_step": ei_step, "reward": 0.0, "ei/kept": 0.0})
        for k in range(sft_steps):
            step += 1
            entry = {"step": step, "ei_step": ei_step, "loss": 1.0, "entropy": 1.0, "step_time": 1.0}
            history.append({**entry, "reward": 0.2} if k == 0 else entry)
        history.append({"step": step, "ei_step": ei_step, KEY: 0.1 * ei_step, "eval_entropy": 1.0})
    return history


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("runs")
    # CS336 A5's grid at rollout 256: E2 / T128 takes 2 x 256 / 128 = 4 optimizer steps per GRPO step; validation
    # every 10 GRPO steps = 40 optimizer steps (the recipes' eval_steps 0.05 of 800)
    grid = _run_dir(tmp_path, "offpolicy_e2_tb128", _grpo_history(80, 40, 4), "countdown/offpolicy_e2_tb128.yaml")
    onpolicy = _run_dir(tmp_path, "offpolicy_e1_tb256", _grpo_history(20, 10, 1), "countdown/offpolicy_e1_tb256.yaml")
    ei = _run_dir(tmp_path, "expert_iteration", _ei_history(), None)
    return {"grid": grid, "onpolicy": onpolicy, "ei": ei}


def test_grpo_step_of_an_off_policy_run_counts_rollout_batches(runs):
    """E2 / T128 on one process: GA 64, 128 micro-batches per rollout, 2 passes -> k = 2 x 128 / 64 = 4 optimizer
    steps per GRPO step; after optimizer step s, s / 4 GRPO steps are done: 1 -> 0.25, 4 -> 1, 40 -> 10, 80 -> 20.
    Catches k read as 1 (an on-policy run), as epochs x rollout / micro-batch (8), or as rollout / train (2)."""
    grid = load_run(runs["grid"])
    record = json.loads((runs["grid"] / "trl_ext_run.json").read_text())["config"]
    assert (record["num_iterations"], record["steps_per_generation"], record["gradient_accumulation_steps"]) == (
        2, 128, 64,
    )  # fmt: skip
    by_step = {e["step"]: g for e, g in zip(grid.history, grid.x["grpo_step"], strict=True) if "loss" in e}
    assert [by_step[s] for s in (1, 2, 3, 4, 5, 8, 40, 41, 80)] == [0.25, 0.5, 0.75, 1, 1.25, 2, 10, 10.25, 20]
    onpolicy = load_run(runs["onpolicy"])  # E1 / T256: one optimizer step per GRPO step
    assert [g for e, g in zip(onpolicy.history, onpolicy.x["grpo_step"], strict=True) if "loss" in e] == list(
        range(1, 21)
    )
    assert grpo_steps([{"step": 3}], None) == [None]  # no record, no ei_step: not on this axis


def test_grpo_step_of_expert_iteration_spreads_its_sft_steps():
    """EI step 1's three SFT steps at 1/3, 2/3, 1; EI step 2 kept nothing (its rollout entry and validation at 2);
    EI step 3's two at 2.5, 3; validations at their EI steps, the one before training at 0."""
    history = _ei_history()
    got = [(e["step"], "loss" in e, round(x, 4)) for e, x in zip(history, grpo_steps(history, None), strict=True)]
    assert got == [
        (0, False, 0), (1, True, 0.3333), (2, True, 0.6667), (3, True, 1), (3, False, 1), (3, False, 2),
        (3, False, 2), (4, True, 2.5), (5, True, 3), (5, False, 3),
    ]  # fmt: skip


def test_validation_step_counts_distinct_evaluation_steps():
    history = [
        {"step": 0, "eval_loss": 1.0},  # eval_on_start: validation step 0
        {"step": 3, "loss": 1.0},
        {"step": 5, "eval_loss": 1.0},
        {"step": 5, "eval_rewards/f/answer_reward": 0.5},  # a second entry of the same validation (SFT accuracy)
        {"step": 10, "eval_loss": 1.0},
        {"step": 10, "eval_loss": 1.0},  # the recipes' final evaluation after the last periodic one
        {"step": 12, "eval_loss": 1.0},
    ]
    assert validation_steps(history) == [0, None, 1, 1, 2, 2, 3]


def test_grid_point_on_policy_run_and_ei_on_one_figure(runs, tmp_path):
    """Three runs, four x-axes. By validation step the runs line up: the grid point validates at optimizer steps 40
    and 80 (GRPO steps 10 and 20), the on-policy run at 10 and 20, both validation steps 1, 2 (the final evaluation
    repeats step 2); EI at 0, 1, 2, 3. By GRPO step the grid's train entries sit at step / 4 and EI's within their
    EI steps. The CSV holds the same numbers in its x columns."""
    out = tmp_path / "overlay.png"
    axes_names = ["step", "grpo_step", "validation_step", "wall_clock"]
    shown = ("train reward", "validation answer reward", "entropy", "validation entropy")
    panels = [p for p in PANELS if p[0] in shown]
    fig = plot_runs([runs["grid"], runs["onpolicy"], runs["ei"]], out, panels=panels, x_axes=axes_names)
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}

    def lines(title):
        return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in axes[title].get_lines()}

    by_validation = lines("validation answer reward vs validation step")
    assert by_validation["offpolicy_e2_tb128"] == ([1, 2, 2], [0.4, 0.8, 0.8])
    assert by_validation["offpolicy_e1_tb256"] == ([1, 2, 2], [0.1, 0.2, 0.2])
    assert by_validation["expert_iteration"] == ([0, 1, 2, 3], pytest.approx([0.1, 0.1, 0.2, 0.3]))
    by_grpo = lines("validation answer reward vs GRPO step")
    assert by_grpo["offpolicy_e2_tb128"][0] == [10, 20, 20] and by_grpo["offpolicy_e1_tb256"][0] == [10, 20, 20]
    assert by_grpo["expert_iteration"][0] == [0, 1, 2, 3]
    assert lines("validation answer reward vs step")["offpolicy_e2_tb128"][0] == [40, 80, 80]
    # train reward: logged at the generating steps 1, 5, 9, ... of the grid point: 0.25, 1.25, 2.25, ...
    assert lines("train reward vs GRPO step")["offpolicy_e2_tb128"][0] == [g + 0.25 for g in range(20)]
    assert lines("train reward vs GRPO step")["expert_iteration"][0] == pytest.approx([1 / 3, 2, 2.5])
    assert lines("entropy vs GRPO step")["expert_iteration"][0] == pytest.approx([1 / 3, 2 / 3, 1, 2.5, 3])
    # train panels have no validation step: hidden on that row; validation panels are drawn there
    assert "train reward vs validation step" not in axes and "entropy vs validation step" not in axes
    assert set(lines("validation entropy vs validation step")) == {"offpolicy_e2_tb128", "offpolicy_e1_tb256",
                                                                     "expert_iteration"}  # fmt: skip
    # wall clock: 40 steps x 2 s + 3 s of validation at the first validation of the grid point
    assert lines("validation answer reward vs wall-clock")["offpolicy_e2_tb128"][0][0] == pytest.approx(83.0)

    rows = [r for r in csv.DictReader(open(out.with_suffix(".csv"))) if r["panel"] == "validation answer reward"]
    grid_rows = [r for r in rows if r["run"] == "offpolicy_e2_tb128"]
    assert [(r["step"], r["grpo_step"], r["validation_step"]) for r in grid_rows] == [
        ("40", "10.0", "1"), ("80", "20.0", "2"), ("80", "20.0", "2"),
    ]  # fmt: skip


def test_x_axis_errors_name_the_axis(runs, tmp_path):
    from typer.testing import CliRunner

    from trl_ext.cli import app

    with pytest.raises(ValueError, match="x-axis \\['epoch'\\]"):
        plot_runs([runs["grid"]], tmp_path / "a.png", x_axes=["epoch"])
    bare = _run_dir(tmp_path, "bare_grpo", [e for e in _grpo_history(4, 2, 1) if "reward" in e or KEY in e], None)
    with pytest.raises(ValueError, match="grpo_step: none of the runs.*trl_ext_run.json"):
        plot_runs([bare], tmp_path / "b.png", x_axes=["grpo_step"])
    result = CliRunner().invoke(
        app, ["plot", str(runs["grid"]), str(bare), "-o", str(tmp_path / "c.png"), "--x", "grpo_step,validation_step"]
    )
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(open(tmp_path / "c.csv")))
    assert {r["grpo_step"] for r in rows if r["run"] == "bare_grpo"} == {""}  # left off the GRPO-step axis only
    assert {r["validation_step"] for r in rows if r["run"] == "bare_grpo" and r["key"] == KEY} == {"1", "2"}
