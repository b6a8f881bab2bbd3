"""Facts of this machine that several layers read, each read in one place: the memory available now (psutil) and
the last lines of a log. (The GPUs are read by `trl_ext.preflight.driver.nvidia_smi`, which `make install` runs by
path before anything is installed; a grading worker's CPU time through psutil by `trl_ext.rewards.grading_pool`.)

A reader answers "unknown" (None, an empty string, a note) where the machine cannot tell: the callers plan around an
unknown, they do not fail on it.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import psutil


def available_memory_bytes() -> int | None:
    """This machine's available physical memory (Linux: `MemAvailable`), or None where it cannot be read."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None


def log_tail(path: str | Path | None, lines: int) -> str:
    """The last `lines` lines of the log at `path` (undecodable bytes replaced); "" without a path, a note saying
    so where the file cannot be read."""
    if path is None:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip()
    except OSError:
        return "(the log cannot be read)"
