"""A pool of math-verify worker processes with a hard per-answer time cap that holds under concurrency.

Each symbolic comparison runs in a worker process (forked from a warm template, see `_grader_worker.py`); the
calling thread waits on the worker's socket at most `timeout` seconds, then kills the worker and raises
`GradingTimeout`. Nothing else waits for that: the other workers keep serving, and a killed worker is replaced by
a fresh fork (milliseconds; forks of the warm template start warm) when the next answer needs one. A comparison
that has run for half its cap, or burnt a quarter of it in CPU time, is likely pathological (MATH comparisons
take milliseconds): while answers wait, such slow comparisons do not count as capacity, and the pool forks extra
workers (up to `max_workers`) so that `workers` processes stay available to the others; a slow answer holds up
only itself. Extra workers exit when they fall idle.

The cap is wall-clock time in the worker, counted from the moment the answer is sent; the wait for a free
worker is not counted (it is bounded by the others' caps: at most half a cap plus a fork when every worker is
held by a slow answer and fewer than `max_workers` run). On a machine loaded by other work a legitimate
comparison can reach the cap: that scores 0 like any timeout and is counted, but is not a verdict.

Usable from any number of threads (waiting answers are served first come, first served) and after a fork of
the parent (the child gets its own pool). `verify_many` runs a batch concurrently on the pool.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

__all__ = ["DEFAULT_WORKERS", "GradingPool", "GradingTimeout", "configure_grading_pool", "get_grading_pool"]


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# Workers kept warm: one per CPU this process may run on (at least 2, so one slow answer never idles the pool),
# at most 16 (each holds sympy, ~150 MB, mostly shared with the template).
DEFAULT_WORKERS = max(2, min(16, _cpu_count()))
WORKERS_ENV = "TRL_EXT_GRADING_WORKERS"


class GradingTimeout(Exception):
    """A comparison ran past its time cap; its worker was killed. Not a verdict: the answer may be right."""


class _Worker:
    __slots__ = ("buffer", "pid", "pidfd", "process", "slow_at", "slow_cpu", "sock")

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock, self.buffer = pid, sock, b""
        self.slow_at = self.slow_cpu = math.inf  # see `start`

        # A pidfd names this process even after its pid is reused (the template reaps exited workers at once).
        try:
            self.pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        except OSError:  # already gone: reads see EOF and the pool replaces it
            self.pidfd = None
        try:
            self.process = psutil.Process(pid)
        except psutil.Error:
            self.process = None

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds this process has used (psutil), or None where unknown."""
        if self.process is None:
            return None
        try:
            times = self.process.cpu_times()
        except (psutil.Error, OSError):
            return None
        return times.user + times.system

    def start(self, timeout: float) -> None:
        """Mark a comparison as begun: it counts as slow (likely pathological) after half its cap on the clock or
        a quarter of it in CPU time (where the machine tells)."""
        cpu = self.cpu_seconds()
        self.slow_at = time.monotonic() + timeout / 2
        self.slow_cpu = math.inf if cpu is None else cpu + timeout / 4

    def slow(self, now: float) -> bool:
        if now >= self.slow_at:
            return True
        if self.slow_cpu == math.inf:
            return False
        cpu = self.cpu_seconds()
        return cpu is None or cpu >= self.slow_cpu

    def read_line(self, deadline: float) -> bytes | None:
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                return None
            chunk = self.sock.recv(4096)
            if not chunk:
                raise EOFError("a grading worker died")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.strip()

    def alive(self) -> bool:
        """False once the process is gone (its end of the socket reads EOF); for idle workers only."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def kill(self) -> None:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.close()

    def close(self) -> None:
        self.sock.close()  # an idle worker sees EOF and exits
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class _Waiter:
    __slots__ = ("event", "worker")

    def __init__(self) -> None:
        self.event, self.worker = threading.Event(), None


class GradingPool:
    """Worker processes for math-verify comparisons, each bounded by a wall-clock cap.

    Args:
        workers: processes kept warm (default: `DEFAULT_WORKERS`, from the CPU count, or `$TRL_EXT_GRADING_WORKERS`).
        max_workers: upper bound including the extra workers forked while slow answers hold the others
            (default: 4 x `workers`).
    """

    _SCRIPT = str(Path(__file__).with_name("_grader_worker.py"))
    _START_TIMEOUT_S = 120.0  # importing sympy on a busy machine; never counted against an answer's cap
    _FORK_TIMEOUT_S = 30.0
    _POLL_S = 0.05  # how often a waiting answer re-checks whether the workers have turned slow

    def __init__(self, workers: int | None = None, max_workers: int | None = None):
        if workers is None:
            value = os.environ.get(WORKERS_ENV, str(DEFAULT_WORKERS))
            if not value.strip().isdigit():
                raise ValueError(f"${WORKERS_ENV} must be a positive integer, got {value!r}")
            workers = int(value)
        max_workers = 4 * workers if max_workers is None else max_workers
        if not 1 <= workers <= max_workers:
            raise ValueError(f"need 1 <= workers <= max_workers, got workers={workers}, max_workers={max_workers}")
        self.workers, self.max_workers = workers, max_workers
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._template_lock = threading.Lock()
        self._template: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._waiters: deque[_Waiter] = deque()
        self._executor: ThreadPoolExecutor | None = None
        self.stats = {"comparisons": 0, "timeouts": 0, "workers_forked": 0, "workers_lost": 0}

    def verify(self, gold: str, prediction: str, timeout: float) -> bool:
        """math-verify's `verify(parse(gold), parse(prediction))` in a worker; False when it errs.

        Raises:
            GradingTimeout: past `timeout` seconds in the worker (its worker is killed).
        """
        request = (json.dumps([gold, prediction]) + "\n").encode()
        for _ in range(3):  # a worker that died under us (killed from outside): retried on another one
            worker = self._acquire()
            try:
                worker.start(timeout)
                deadline = time.monotonic() + timeout
                worker.sock.sendall(request)
                line = worker.read_line(deadline)
            except (OSError, EOFError):
                self._discard(worker, "workers_lost")
                continue
            if line is None:
                self._discard(worker, "timeouts")
                raise GradingTimeout(f"grading took over {timeout} s: {prediction[:80]!r} vs {gold[:80]!r}")
            self._release(worker)
            with self._lock:
                self.stats["comparisons"] += 1
            return line == b"1"
        return False

    def verify_many(self, pairs: list[tuple[str, str]], timeout: float) -> list[bool | None]:
        """`verify` for each `(gold, prediction)`, run concurrently; None where the time cap was hit."""
        if len(pairs) <= 1:
            return [self._verify_or_none(pair, timeout) for pair in pairs]
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="trl_ext-grading")
            executor = self._executor
        return list(executor.map(lambda pair: self._verify_or_none(pair, timeout), pairs))

    def _verify_or_none(self, pair: tuple[str, str], timeout: float) -> bool | None:
        try:
            return self.verify(pair[0], pair[1], timeout)
        except GradingTimeout:
            return None

    def _acquire(self) -> _Worker:
        """An idle worker, a freshly forked one, or the next one released (first come, first served)."""
        waiter = None
        while True:
            with self._lock:
                if waiter is not None and waiter.worker is not None:
                    return waiter.worker
                if waiter is None and not self._waiters:
                    worker = self._take_idle()
                    if worker is not None:
                        return worker
                if self._may_fork():
                    if waiter is not None:
                        self._waiters.remove(waiter)
                    self._starting += 1
                    break
                if waiter is None:
                    waiter = _Waiter()
                    self._waiters.append(waiter)
            waiter.event.wait(self._POLL_S)
            waiter.event.clear()
        try:
            worker = self._fork()
        finally:
            with self._lock:
                self._starting -= 1
        with self._lock:
            self._busy.add(worker)
            self.stats["workers_forked"] += 1
        return worker

    def _take_idle(self) -> _Worker | None:
        """An idle worker that is still alive (call with the lock held); dead ones are dropped."""
        while self._idle:
            worker = self._idle.pop()
            if worker.alive():
                self._busy.add(worker)
                return worker
            worker.kill()
            self.stats["workers_lost"] += 1
        return None

    def _may_fork(self) -> bool:
        live = len(self._idle) + len(self._busy) + self._starting
        if live < self.workers:
            return True
        if live >= self.max_workers:
            return False
        now = time.monotonic()
        slow = sum(worker.slow(now) for worker in self._busy)
        return live - slow < self.workers

    def _release(self, worker: _Worker) -> None:
        worker.slow_at = worker.slow_cpu = math.inf
        with self._lock:
            if self._waiters:  # hand over directly: a releasing thread cannot jump the queue
                waiter = self._waiters.popleft()
                waiter.worker = worker
                waiter.event.set()
                return
            self._busy.discard(worker)
            if len(self._idle) + len(self._busy) + self._starting >= self.workers:
                worker.close()  # an extra worker forked while others were slow
            else:
                self._idle.append(worker)

    def _discard(self, worker: _Worker, counter: str) -> None:
        worker.kill()
        with self._lock:
            self._busy.discard(worker)
            self.stats[counter] += 1
            for waiter in self._waiters:  # capacity fell: let a waiter fork the replacement now
                waiter.event.set()

    def _fork(self) -> _Worker:
        with self._template_lock:
            for _ in range(2):
                if self._template is None or self._template.poll() is not None:
                    self._start_template()
                ours, theirs = socket.socketpair()
                try:
                    socket.send_fds(self._control, [b"fork"], [theirs.fileno()])
                    line = self._read_control(self._FORK_TIMEOUT_S)
                except OSError:
                    line = None
                finally:
                    theirs.close()
                if line:
                    return _Worker(int(line), ours)
                ours.close()
                self._stop_template()
            raise RuntimeError("the math-verify template process does not fork workers")

    def _start_template(self) -> None:
        self._stop_template()
        ours, theirs = socket.socketpair()
        self._template = subprocess.Popen(
            [sys.executable, "-P", self._SCRIPT, str(os.getpid()), str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        theirs.close()
        self._control = ours
        if self._read_control(self._START_TIMEOUT_S) != b"ready":
            self._stop_template()
            raise RuntimeError("the math-verify template process did not start (is math-verify installed?)")

    def _read_control(self, timeout: float) -> bytes | None:
        line = b""
        deadline = time.monotonic() + timeout
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._control], [], [], remaining)[0]:
                return None
            chunk = self._control.recv(1)  # one byte at a time: replies are a few bytes, and nothing is lost
            if not chunk:
                return None
            line += chunk
        return line.strip()

    def _stop_template(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._template is not None:
            self._template.kill()
            self._template.wait()
            self._template = None

    def close(self) -> None:
        """Kill every worker and the template; a later call starts them again."""
        if self._pid != os.getpid():
            return
        with self._lock:
            workers = self._idle + list(self._busy)
            self._idle, self._busy = [], set()
            executor, self._executor = self._executor, None
        for worker in workers:
            worker.kill()
        with self._template_lock:
            self._stop_template()
        if executor is not None:
            executor.shutdown(wait=False)


_POOL: GradingPool | None = None
_POOL_LOCK = threading.Lock()
_POOL_ARGS: dict = {}


def get_grading_pool() -> GradingPool:
    """The process-wide pool (a new one in a forked child: the parent's sockets are not ours)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._pid != os.getpid():
            _POOL = GradingPool(**_POOL_ARGS)
        return _POOL


def configure_grading_pool(workers: int | None = None, max_workers: int | None = None) -> GradingPool:
    """Replace the process-wide pool by one of this size (closing the old one's processes)."""
    global _POOL
    with _POOL_LOCK:
        new = GradingPool(workers, max_workers)
        _POOL_ARGS.update(workers=workers, max_workers=max_workers)
        old, _POOL = _POOL, new
    if old is not None:
        old.close()
    return new


@atexit.register
def _close_pool() -> None:
    if _POOL is not None:
        _POOL.close()
