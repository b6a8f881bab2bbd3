"""The trainer's side of `trl_ext.run_status`: a status file each step, and a stop request honoured at a step's end.

- `StatusFileCallback` writes `trl_ext_status.json` from the main process at every step's end and every log (step,
  max steps, the last logged train reward and loss, the time), so a study shows progress without reading the
  trainer's console output.
- `StopRequestCallback` looks for `trl_ext_stop` at every step's end (the main process looks; every process takes
  its answer, one all-reduce of one number, so all stop at the same step), and on a request has the Trainer save a
  checkpoint there and stop. `train_save_evaluate` then ends without the final save: the run is not finished, and
  `--resume true` continues from that checkpoint.

Both are HF `TrainerCallback`s: events the Trainer already raises, nothing wrapped.
"""

from __future__ import annotations

import time
from pathlib import Path

from transformers import TrainerCallback

from trl_ext.run_status import STOP_FILE, RunStatus, stop_requested, write_status


class StatusFileCallback(TrainerCallback):
    """Rewrites `<output_dir>/trl_ext_status.json` at every step's end and every log (main process only)."""

    def __init__(self):
        self.status: RunStatus | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        # The Trainer has loaded a resumed run's state by now: its steps count from the checkpoint's.
        now = time.time()
        step = state.global_step
        self.status = RunStatus(step, state.max_steps, time=now, started=now, start_step=step)
        self._write(args, state)
        return control

    def _write(self, args, state) -> None:
        if self.status is None or not state.is_world_process_zero:
            return
        self.status.step, self.status.max_steps, self.status.time = state.global_step, state.max_steps, time.time()
        write_status(args.output_dir, self.status)

    def on_step_end(self, args, state, control, **kwargs):
        self._write(args, state)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.status is not None and logs:
            if "reward" in logs:
                self.status.reward = float(logs["reward"])
            if "loss" in logs:
                self.status.loss = float(logs["loss"])
        self._write(args, state)
        return control


class StopRequestCallback(TrainerCallback):
    """At every step's end: a stop request (`<output_dir>/trl_ext_stop`, read by the main process, its answer shared
    by all) makes the Trainer save a checkpoint at this step and stop; the request file is removed once saved.
    `stopped_at` is the step it stopped at (None: it did not)."""

    def __init__(self):
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        asked = state.is_world_process_zero and stop_requested(args.output_dir)
        if _any_process(asked, args):
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.stopped_at == state.global_step and state.is_world_process_zero:
            (Path(args.output_dir) / STOP_FILE).unlink(missing_ok=True)
        return control


def _any_process(flag: bool, args) -> bool:
    """Whether `flag` is true on any process (one all-reduce of one number when a process group runs)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=args.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def attach_run_control(trainer) -> StopRequestCallback:
    """Adds both callbacks to `trainer`; returns the stop callback (its `stopped_at`)."""
    trainer.add_callback(StatusFileCallback())
    stop = StopRequestCallback()
    trainer.add_callback(stop)
    return stop
