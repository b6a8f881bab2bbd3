"""A run's state read from its folder (pure file reads).

- finished: the recipe wrote `train_results.json` (after training and the model save) and, when the run validates
  at the end (`final_eval` with a validation set), `eval_results.json`;
- the step, `max_steps`, the last train reward and the ETA: from the status file the trainer rewrites at every step
  (`trl_ext.run_status`), else (a run that has not trained a step in this attempt) the latest checkpoint's
  `trainer_state.json`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from trl_ext.reporting.run_logs import find_trainer_state
from trl_ext.run_status import read_status


@dataclass
class RunProgress:
    step: int | None = None
    max_steps: int | None = None
    reward: float | None = None
    eta_s: float | None = None
    elapsed_s: float | None = None

    def render(self) -> str:
        step = f"step {self.step}/{self.max_steps}" if self.step is not None else "starting"
        if self.elapsed_s is not None:
            step += f" ({_clock(self.elapsed_s)} in)"
        reward = f", reward {self.reward:.3g}" if self.reward is not None else ""
        eta = f", ETA {_clock(self.eta_s)}" if self.eta_s is not None else ""
        return step + reward + eta


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def is_finished(output_dir: str | Path) -> bool:
    """Whether the run in `output_dir` ended (module docstring)."""
    folder = Path(output_dir)
    if not (folder / "train_results.json").is_file():
        return False
    try:
        config = json.loads((folder / "trl_ext_run.json").read_text()).get("config", {})
    except (OSError, json.JSONDecodeError):
        config = {}
    validates = config.get("final_eval", False) and str(config.get("eval_split", "")).lower() != "none"
    return not validates or (folder / "eval_results.json").is_file()


def read_progress(output_dir: str | Path, started: float | None = None) -> RunProgress:
    """The run's progress (module docstring); `started`: when its launch started (`time.time()`), for the time
    it has run."""
    progress = RunProgress(elapsed_s=None if started is None else time.time() - started)
    status = read_status(output_dir)
    if status is not None:
        progress.step, progress.max_steps, progress.reward = status.step, status.max_steps, status.reward
        progress.eta_s = status.eta_s()
        return progress
    try:
        state = json.loads(find_trainer_state(output_dir).read_text())
    except (FileNotFoundError, ValueError):
        return progress
    progress.step, progress.max_steps = state.get("global_step"), state.get("max_steps")
    return progress
