"""The load a speed benchmark ran under, recorded in its result file; a loaded machine's results are refused unless
marked.

A speed figure from a machine that other jobs share is that machine's, not the code's: on 2 cores a load average of
3 to 5 turned an asynchronous speedup of 1.48 into 1.11. So every speed benchmark measures what else ran during its
measurement and writes its results only when the machine was idle, or when `--loaded` says the figures are a loaded
machine's (the result file then says so in `load.loaded`).

What is recorded (`MachineLoad.record()`, under `load` in the result file):

- `cpu_count`, and `loadavg_before` / `loadavg_after`: `os.getloadavg()` (1, 5 and 15 minutes) when the measurement
  starts and ends. The 1-minute figure at the end includes the benchmark's own processes. Both are recorded, not
  judged: a load average lags a minute behind the machine (it is still decaying from a job that just ended).
- `others_cores_before`: the busy cores of other work in a short window (`START_WINDOW_S`) just before the
  measurement, while the benchmark itself waits: all CPUs' busy time from `/proc/stat` minus this process's own
  (elsewhere the 1-minute load average).
- `own_cores`: the benchmark's CPU seconds (this process and every process it started, sampled each second) per
  wall second.
- `others_cores`: the CPU the rest of the machine used meanwhile, in cores: all CPUs' busy time from `/proc/stat`
  over the measurement minus the benchmark's own, per wall second (Linux; elsewhere the end's 1-minute load average
  minus `own_cores`).
- `loaded`: `others_cores_before` or `others_cores`, per core, above `LIMIT_PER_CORE`.
"""

from __future__ import annotations

import argparse
import os
import resource
import threading
import time
from pathlib import Path

import psutil

#: A machine counts as loaded above this many busy cores of other work per core (before the start, or meanwhile).
LIMIT_PER_CORE = 0.5
#: Seconds of the window before the start in which other work is measured.
START_WINDOW_S = 3.0


def add_load_argument(parser: argparse.ArgumentParser) -> None:
    """The `--loaded` flag: write results measured on a loaded machine, marked as such."""
    parser.add_argument(
        "--loaded",
        action="store_true",
        help=f"Write the results even when other work loaded the machine (more than {LIMIT_PER_CORE} busy cores "
        "per core before or during the measurement); the result file then says `load.loaded: true`.",
    )


def is_loaded(others_before: float, others_cores: float, cpu_count: int) -> bool:
    """Loaded: the other work's busy cores just before the start, or meanwhile, above `LIMIT_PER_CORE` per core."""
    return max(others_before, others_cores) / cpu_count > LIMIT_PER_CORE


class _TreeCPU(threading.Thread):
    """CPU seconds of this process and of every process below it. Two accounts of the children: the ones waited for
    (`RUSAGE_CHILDREN`: exact, with their own waited children) and a sample of every descendant each `interval`
    seconds (which also sees a child that ends unwaited, such as an inference server's engine, at its last sample);
    the larger counts. Either account can only miss CPU, and CPU missed here counts as other work: a loaded verdict,
    never a wrong idle one."""

    def __init__(self, interval: float = 1.0):
        super().__init__(daemon=True)
        self.interval, self._done = interval, threading.Event()
        self._me = psutil.Process()
        self._base = self._cpu(self._me)
        self._waited_base = self._waited()
        self._children_base = {key: cpu for key, cpu in self._children()}
        self._seen: dict = {}

    @staticmethod
    def _waited() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    @staticmethod
    def _cpu(proc) -> float:
        times = proc.cpu_times()
        return times.user + times.system

    def _children(self):
        for child in self._me.children(recursive=True):
            try:
                yield (child.pid, child.create_time()), self._cpu(child)
            except psutil.Error:  # ended meanwhile
                continue

    def sample(self) -> None:
        for key, cpu in self._children():
            self._seen[key] = cpu

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.sample()

    def stop(self) -> float:
        """The tree's CPU seconds since the start."""
        self._done.set()
        self.sample()
        sampled = sum(cpu - self._children_base.get(key, 0.0) for key, cpu in self._seen.items())
        return self._cpu(self._me) - self._base + max(sampled, self._waited() - self._waited_base)


def _busy_and_total_seconds() -> tuple[float, float] | None:
    """All CPUs' busy and total seconds since boot from `/proc/stat` (None where there is none)."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return None
    fields = [float(x) for x in stat.read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    # guest time is counted in user time already (the last two fields)
    total = sum(fields[:8])
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick


def _busy_cores(stat0, stat1, cpu_count: int) -> tuple[float, str]:
    """All CPUs' busy cores between two `_busy_and_total_seconds()` samples, and where the figure comes from:
    `/proc/stat`, or the 1-minute load average where there are no samples."""
    if stat0 is not None and stat1 is not None and stat1[1] > stat0[1]:
        return (stat1[0] - stat0[0]) / (stat1[1] - stat0[1]) * cpu_count, "/proc/stat"
    return os.getloadavg()[0], "loadavg"


def other_cores_now(window_s: float = START_WINDOW_S) -> tuple[float, str]:
    """Busy cores of work other than this process over the next `window_s` seconds (this process sleeps meanwhile),
    and where the figure comes from (`_busy_cores`)."""
    me = psutil.Process()
    stat0, own0, wall0 = _busy_and_total_seconds(), _TreeCPU._cpu(me), time.perf_counter()
    time.sleep(window_s)
    own, wall = _TreeCPU._cpu(me) - own0, max(time.perf_counter() - wall0, 1e-9)
    busy, source = _busy_cores(stat0, _busy_and_total_seconds(), os.cpu_count() or 1)
    return max(0.0, busy - own / wall), source


class MachineLoad:
    """Start it before the measurement (`MachineLoad()`), `stop()` it after; `record()` for the result file.
    Starting it takes `START_WINDOW_S` seconds: the other work just before the start is measured, not read off the
    load average."""

    def __init__(self, window_s: float = START_WINDOW_S) -> None:
        self.cpu_count = os.cpu_count() or 1
        self.loadavg_before = list(os.getloadavg())
        self.others_before, self._others_before_source = other_cores_now(window_s)
        self._tree = _TreeCPU()
        self._tree.start()
        self._start = (time.perf_counter(), _busy_and_total_seconds())
        self._stopped: dict | None = None

    def stop(self) -> dict:
        """Ends the measurement window; returns `record()`."""
        wall0, stat0 = self._start
        wall = max(time.perf_counter() - wall0, 1e-9)
        own_cores = self._tree.stop() / wall
        after = list(os.getloadavg())
        busy_cores, source = _busy_cores(stat0, _busy_and_total_seconds(), self.cpu_count)
        others = max(0.0, busy_cores - own_cores)
        self._stopped = {
            "cpu_count": self.cpu_count,
            "loadavg_before": [round(x, 2) for x in self.loadavg_before],
            "others_cores_before": round(self.others_before, 3),
            "others_before_source": self._others_before_source,
            "loadavg_after": [round(x, 2) for x in after],
            "wall_s": round(wall, 1),
            "own_cores": round(own_cores, 3),
            "others_cores": round(others, 3),
            "others_source": source,
            "limit_per_core": LIMIT_PER_CORE,
            "loaded": is_loaded(self.others_before, others, self.cpu_count),
        }
        return self._stopped

    def record(self) -> dict:
        if self._stopped is None:
            raise RuntimeError("MachineLoad.record() before stop()")
        return dict(self._stopped)


def refuse_if_loaded(load: dict, allow_loaded: bool, out: str | os.PathLike) -> None:
    """Raises SystemExit (nothing written to `out`) when `load` says loaded and `--loaded` was not given (a
    `--quick` dry run passes `allow_loaded=True`: its figures are not results)."""
    if load["loaded"] and not allow_loaded:
        raise SystemExit(
            f"not writing {out}: the machine was loaded ({load['others_cores_before']} cores of other work just "
            f"before the start, {load['others_cores']} during the measurement, on {load['cpu_count']} cores; "
            f"the limit is {LIMIT_PER_CORE} per core). Rerun on an idle machine, or add --loaded to write the "
            "figures marked as a loaded machine's."
        )
