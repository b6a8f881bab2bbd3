"""A run's state read from its folder and its launch log while it writes them (pure file reads).

- finished: the recipe wrote `train_results.json` (after training and the model save) and, when the run validates
  at the end (`final_eval` with a validation set), `eval_results.json`;
- the step and `max_steps`: the latest `N/M [` of HF's training progress bar in the log (the unlabelled bar whose
  total is the `max_steps` the launcher's preflight printed), else the latest checkpoint's `trainer_state.json`;
- the last train reward: the latest `'reward': X` the trainer logged;
- the ETA: seconds since the run started x the steps left / the steps done since then.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from trl_ext.reporting.run_logs import find_trainer_state

# HF's training bar has no label (`Map: 46/46 [...]`, `Writing model shards: 1/1 [...]` have one).
_STEP = re.compile(r"(?:^|[\r\n])\s*\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+) \[[^\]\r\n]*(?:it/s|s/it)")
_MAX_STEPS = re.compile(r"-> max_steps (\d+)")  # the launcher's preflight print
_REWARD = re.compile(r"'reward': '?(-?[0-9.]+(?:e-?\d+)?)'?")


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


def _tail_text(path: Path, size: int = 200_000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_progress(output_dir: str | Path, log: str | Path | None, started: float | None = None) -> RunProgress:
    """The run's progress (module docstring); `started`: its start time (`time.time()`), for the ETA."""
    text = _tail_text(Path(log)) if log is not None else ""
    progress = RunProgress()
    steps = _STEP.findall(text)
    # The evaluation's bars have no label either: the training bar is the one whose total is max_steps as the
    # preflight printed it, else the one with the largest total.
    stated = _MAX_STEPS.findall(text)
    if stated and any(int(m) == int(stated[-1]) for _, m in steps):
        steps = [(n, m) for n, m in steps if int(m) == int(stated[-1])]
    if steps:
        total = max(int(m) for _, m in steps)
        done = [int(n) for n, m in steps if int(m) == total]
        progress.step, progress.max_steps = done[-1], total
    else:
        try:
            state = json.loads(find_trainer_state(output_dir).read_text())
        except FileNotFoundError:
            state = None
        if state is not None:
            progress.step, progress.max_steps = state.get("global_step"), state.get("max_steps")
    rewards = _REWARD.findall(text)
    if rewards:
        progress.reward = float(rewards[-1])
    if started is not None:
        progress.elapsed_s = time.time() - started
    if started is not None and progress.step and progress.max_steps:
        elapsed = time.time() - started
        progress.eta_s = elapsed * (progress.max_steps - progress.step) / progress.step
    return progress


def log_tail(path: str | Path, lines: int = 20) -> str:
    """The last `lines` lines of a log (progress-bar carriage returns folded), for a failed run's report."""
    text = _tail_text(Path(path), 50_000).replace("\r", "\n")
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])
