"""Two small files in a run's folder that the trainer and whoever watches it share (stdlib only):

- `trl_ext_status.json`: the trainer's main process rewrites it at the end of every optimizer step and at every log:
  `{"step", "max_steps", "reward", "loss", "time", "started", "start_step"}` (the last logged train reward and loss,
  `time.time()` of the write, when this process began training and at which step: a resumed run begins at its
  checkpoint's). `trl-ext study` reads it for each run's progress and ETA. Written whole (a temporary file renamed
  over it), so a reader never sees half of it.
- `trl_ext_stop`: a request to stop. A trainer that finds it at the end of a step saves a checkpoint there, removes
  the file and ends without the final save, so `--resume true` continues from that step. A study's Slurm job writes
  it when Slurm warns of the time limit (then requeues itself); anyone may write it (`touch RUN_DIR/trl_ext_stop`).

The trainer's side is `trl_ext.recipes.run_control` (the two `TrainerCallback`s).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

STATUS_FILE = "trl_ext_status.json"
STOP_FILE = "trl_ext_stop"


@dataclass
class RunStatus:
    """What `trl_ext_status.json` holds (module docstring)."""

    step: int
    max_steps: int | None = None
    reward: float | None = None
    loss: float | None = None
    time: float | None = None
    started: float | None = None
    start_step: int = 0

    def eta_s(self) -> float | None:
        """Seconds to `max_steps` at the pace of this process's steps so far; None before its first step."""
        done = self.step - self.start_step
        if not self.max_steps or done <= 0 or self.time is None or self.started is None:
            return None
        return (self.time - self.started) / done * max(self.max_steps - self.step, 0)


def write_status(run_dir: str | Path, status: RunStatus) -> None:
    """Writes `status` to `run_dir/trl_ext_status.json` whole (a temporary file renamed over it)."""
    path = Path(run_dir) / STATUS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{STATUS_FILE}.{os.getpid()}")
    partial.write_text(json.dumps(asdict(status)))
    os.replace(partial, path)


def read_status(run_dir: str | Path) -> RunStatus | None:
    """The run's last status, or None when it wrote none (or the file is not a status)."""
    try:
        data = json.loads((Path(run_dir) / STATUS_FILE).read_text())
        return RunStatus(**data)
    except (OSError, ValueError, TypeError):
        return None


def stop_requested(run_dir: str | Path) -> bool:
    return (Path(run_dir) / STOP_FILE).is_file()


def request_stop(run_dir: str | Path) -> Path:
    """Asks the run in `run_dir` to save a checkpoint at the end of its step and end; returns the request file."""
    path = Path(run_dir) / STOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path
