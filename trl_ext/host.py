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
    """The last `lines` lines of the log at `path` as a terminal shows them: a line a progress bar rewrote with
    carriage returns is its last version (undecodable bytes replaced); "" without a path, a note saying so where the
    file cannot be read."""
    if path is None:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace", newline="\n") as handle:
            kept = deque((_shown(line) for line in handle), maxlen=lines)
    except OSError:
        return "(the log cannot be read)"
    return "\n".join(kept).rstrip()


def _shown(line: str) -> str:
    """What a terminal shows of one written line: the text after its last carriage return."""
    line = line.rstrip("\n").rstrip("\r")
    return line.rsplit("\r", 1)[-1]
