"""`trl_ext.run_status` and its trainer side `trl_ext.recipes.run_control`, on HF's own `TrainerState` /
`TrainerControl` / `TrainingArguments` (a trainer that honours a stop request at a real step end, across two nodes and
a requeue: tests/test_study_two_nodes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from trl_ext.recipes.run_control import StatusFileCallback, StopRequestCallback
from trl_ext.run_status import STATUS_FILE, STOP_FILE, RunStatus, read_status, request_stop


@pytest.fixture
def args(tmp_path):
    return TrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, report_to="none")


def test_a_stop_request_saves_at_this_step_and_stops_then_is_consumed(args, tmp_path):
    stop, control = StopRequestCallback(), TrainerControl()
    state = TrainerState(global_step=3, max_steps=10)
    stop.on_step_end(args, state, control)
    assert not (control.should_save or control.should_training_stop) and stop.stopped_at is None
    path = request_stop(args.output_dir)
    assert path == tmp_path / "run" / STOP_FILE
    stop.on_step_end(args, state, control)
    assert control.should_save and control.should_training_stop and stop.stopped_at == 3
    stop.on_save(args, state, control)  # the Trainer saved checkpoint-3: the request is done
    assert not path.exists()


def test_only_the_main_process_reads_the_request(args):
    """A process other than the main one takes the main one's answer (an all-reduce under a process group; here
    without one, its own False), so every process stops at the same step."""
    request_stop(args.output_dir)
    control = TrainerControl()
    StopRequestCallback().on_step_end(args, TrainerState(global_step=1, is_world_process_zero=False), control)
    assert not control.should_training_stop


def test_the_status_file_follows_the_steps_of_a_resumed_run(args, monkeypatch):
    """Resumed at step 4 of 10: the status counts its pace from there, with the last logged train reward."""
    now = [100.0]
    monkeypatch.setattr("trl_ext.recipes.run_control.time.time", lambda: now[0])
    status, control = StatusFileCallback(), TrainerControl()
    state = TrainerState(global_step=4, max_steps=10)
    status.on_train_begin(args, state, control)
    assert read_status(args.output_dir) == RunStatus(4, 10, time=100.0, started=100.0, start_step=4)
    state.global_step, now[0] = 7, 130.0
    status.on_log(args, state, control, logs={"reward": 0.25, "loss": 0.5, "step_time": 1.0})
    status.on_step_end(args, state, control)
    written = read_status(args.output_dir)
    assert (written.step, written.reward, written.loss, written.time) == (7, 0.25, 0.5, 130.0)
    assert written.eta_s() == pytest.approx(30.0)  # 30 s for 3 steps, 3 to go
    status.on_log(args, state, control, logs={"eval_reward": 0.9})  # an evaluation leaves the train reward
    assert read_status(args.output_dir).reward == 0.25
    assert json.loads((Path(args.output_dir) / STATUS_FILE).read_text())["step"] == 7  # one small JSON object
