"""Run untrusted Python (a model-written program) in a contained child process and read one global back as data.

The only place in trl_ext where model-written code runs. The program never enters this process: a fresh interpreter
(`python -I`, started through `_sandbox_launcher.py`) executes it and sends the requested global back as one JSON
line on a pipe; this side only parses JSON, with a size cap. What contains the program (see docs/kissing.md for
what is and is not guaranteed):

- a new session, killed as a whole (and PID 1 of its PID namespace, which takes every descendant with it) at the
  wall-clock limit, when its output passes the cap, or when it ends;
- as root, a private unused uid/gid per run; namespaces (network with no interface up, mount, PID; as a non-root
  user inside a user namespace); a read-only view of the file system with private size-capped /tmp, /var/tmp and
  /dev/shm, the working directory being a fresh /tmp/work;
- rlimits: CPU seconds, address space, processes (RLIMIT_NPROC), file size, open files, no core dumps;
- an audit hook in the child that turns sockets, new processes and writes outside the working directory into
  `PermissionError`s with a readable message (a courtesy: the kernel-side limits are the boundary).

Which of these applied is reported per run under `isolation`.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["SandboxLimits", "run_python"]

_HERE = Path(__file__).resolve().parent
LAUNCHER = _HERE / "_sandbox_launcher.py"
CHILD = _HERE / "_sandbox_child.py"
OUTPUT_TAIL = 4096
# Root runs each program under its own unused uid (RLIMIT_NPROC is per uid; root is exempt from it).
_UID_BASE = 1_000_000_000
_uid_counter = itertools.count()
_uid_lock = threading.Lock()


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run.

    Args:
        time_limit_s: wall-clock seconds from start (interpreter start-up included) until the run is killed.
        memory_mb: address space of each process (RLIMIT_AS), MiB.
        processes: processes and threads the program may have at once (RLIMIT_NPROC).
        file_mb: largest file the program may write (RLIMIT_FSIZE), MiB.
        open_files: open file descriptors per process (RLIMIT_NOFILE).
        tmpfs_mb: size of each private tmpfs (/tmp with the working directory, /var/tmp, /dev/shm), MiB.
        max_output_bytes: printed output (stdout + stderr) beyond which the run is killed.
        max_result_bytes: size of the returned global as JSON beyond which it is refused.
    """

    time_limit_s: float = 10.0
    memory_mb: int = 1024
    processes: int = 16
    file_mb: int = 16
    open_files: int = 64
    tmpfs_mb: int = 64
    max_output_bytes: int = 1 << 20
    max_result_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")
        if self.processes < 2:
            raise ValueError(f"SandboxLimits.processes must be >= 2 (launcher and program), got {self.processes}")


def _next_uid() -> int:
    with _uid_lock:
        return _UID_BASE + ((os.getpid() & 0x3FFFFF) << 6 | next(_uid_counter) & 0x3F)


def _live_pids(uid: int | None = None, pids: tuple[int, ...] = ()) -> list[int]:
    """Processes, zombies aside, whose real uid is `uid` or whose pid is in `pids`."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        if uid is None and int(name) not in pids:
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if int(name) in pids or (uid is not None and int(fields.get("Uid", "-1 ").split()[0]) == uid):
            found.append(int(name))
    return found


def _kill_user(uid: int) -> None:
    """SIGKILL every process of `uid` (root only): a helper switches to `uid` and calls kill(-1), which the kernel
    applies to all of that user's processes at once, so forks cannot outrun it."""
    ids = f"{uid}, {uid}, {uid}"
    code = f"import os; os.setgroups([]); os.setresgid({ids}); os.setresuid({ids}); os.kill(-1, 9)"
    subprocess.run([sys.executable, "-I", "-c", code], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)


def _wait_gone(uid: int | None, pids: tuple[int, ...], timeout: float = 5.0) -> bool:
    """Wait until no process of the run is alive; SIGKILL is asynchronous and a PID namespace is torn down after
    its init dies. As root, stragglers of the private uid are killed outright after a short wait."""
    start = time.monotonic()
    killed = False
    while _live_pids(uid, pids):
        waited = time.monotonic() - start
        if waited > timeout:
            return False
        if uid is not None and not killed and waited > 0.5:
            _kill_user(uid)
            killed = True
        time.sleep(0.01)
    return True


def _is_namespace_init(pid: int) -> bool:
    """Whether `pid` is PID 1 of a child PID namespace (a check against killing a reused pid)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            nspids = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
    except OSError:
        return False
    return len(nspids) > 1 and nspids[-1] == "1"


def _exited(pid: int) -> bool:
    """Whether `pid` has exited, without reaping it (its pid and process group stay reserved until `wait`)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _records(data: bytes) -> list[dict]:
    records = []
    for line in data.split(b"\n"):
        if line.strip():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                record = {"error": "the sandbox result line is not valid JSON"}
            records.append(record if isinstance(record, dict) else {"error": "malformed sandbox result"})
    return records


class _Run:
    """One sandboxed run: start, pump the pipes until the end or a limit, kill, collect."""

    def __init__(self, source: str, name: str, limits: SandboxLimits) -> None:
        self.name, self.limits = name, limits
        self.uid = _next_uid() if os.geteuid() == 0 else None
        self.rundir = tempfile.mkdtemp(prefix="trl_ext_sandbox_")
        Path(self.rundir, "program.py").write_text(source, encoding="utf-8", errors="replace")
        self.buffers = {"output": bytearray(), "result": bytearray(), "control": bytearray()}
        self.output_bytes = 0
        self.verdict: str | None = None

    def start(self) -> None:
        result_r, result_w = os.pipe()
        control_r, control_w = os.pipe()
        cpu = int(self.limits.time_limit_s) + 1
        config = {
            "python": sys.executable,
            "bootstrap": str(CHILD),
            "rundir": self.rundir,
            "parent_pid": os.getpid(),
            "uid": self.uid,
            "result_fd": result_w,
            "control_fd": control_w,
            "limits": {
                "cpu_s": cpu,
                "memory_mb": self.limits.memory_mb,
                "processes": self.limits.processes,
                "file_mb": self.limits.file_mb,
                "open_files": self.limits.open_files,
                "tmpfs_mb": self.limits.tmpfs_mb,
            },
            "child_args": [self.name, str(self.limits.max_result_bytes)],
        }
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(LAUNCHER), json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(result_w, control_w),
                start_new_session=True,
                cwd=self.rundir,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
        finally:
            os.close(result_w)
            os.close(control_w)
        self.fds = {self.proc.stdout.fileno(): "output", result_r: "result", control_r: "control"}
        self.owned = [result_r, control_r]

    def _take(self, kind: str, data: bytes) -> None:
        if kind == "output":
            self.output_bytes += len(data)
            tail = self.buffers["output"] + data
            self.buffers["output"] = tail[-OUTPUT_TAIL:]
            if self.output_bytes > self.limits.max_output_bytes:
                self.verdict = self.verdict or (
                    f"output limit: the program printed more than {self.limits.max_output_bytes} bytes and was killed"
                )
            return
        self.buffers[kind] += data
        if len(self.buffers[kind]) > self.limits.max_result_bytes + 65536:
            self.verdict = self.verdict or (
                f"`{self.name}` is more than {self.limits.max_result_bytes} bytes as JSON and was refused"
            )

    def pump(self, deadline: float) -> None:
        """Read all pipes until they close, the deadline passes or a cap is hit."""
        selector = selectors.DefaultSelector()
        for fd in self.fds:
            selector.register(fd, selectors.EVENT_READ)
        exited_at = None
        while selector.get_map() and self.verdict is None:
            now = time.monotonic()
            if now >= deadline:
                limit = self.limits.time_limit_s
                self.verdict = f"time limit: the program ran for more than {limit:g} s and was killed"
                break
            # Without a PID namespace a background child of the program can hold the pipes open after the program
            # ended: give it a moment, then stop listening (it is killed below).
            if exited_at is None and _exited(self.proc.pid):
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:
                break
            for key, _ in selector.select(min(deadline - now, 0.1)):
                data = os.read(key.fd, 1 << 16)
                if data:
                    self._take(self.fds[key.fd], data)
                else:
                    selector.unregister(key.fd)
        selector.close()

    def kill(self) -> None:
        """Kill the session (and PID 1 of the namespace, with everything in it), then reap the launcher."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher is not reaped yet, so its group id is ours
        except (ProcessLookupError, PermissionError):
            pass
        control = _records(bytes(self.buffers["control"]))
        inits = tuple(r["child_pid"] for r in control if isinstance(r.get("child_pid"), int))
        inits = tuple(pid for pid in inits if _is_namespace_init(pid))
        for pid in inits:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        self.leftover = not _wait_gone(self.uid, inits)

    def close(self) -> None:
        self.proc.stdout.close()
        for fd in self.owned:
            os.close(fd)
        shutil.rmtree(self.rundir, ignore_errors=True)


def _signal_text(sig: int, limits: SandboxLimits) -> str:
    notes = {
        signal.SIGXCPU: f"CPU time limit ({int(limits.time_limit_s) + 1} s) exceeded",
        signal.SIGXFSZ: f"file size limit: the program wrote a file larger than {limits.file_mb} MiB",
        signal.SIGKILL: "killed (SIGKILL)",
    }
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = str(sig)
    return notes.get(sig, f"the program died from signal {name}")


def _error_text(record: dict, limits: SandboxLimits) -> str:
    """The child's error record as a verdict; an exception gets the limit it most likely hit."""
    error, exception = record["error"], record.get("exception")
    if exception is None:
        return error
    notes = {
        "MemoryError": f" (memory limit {limits.memory_mb} MiB)",
        "BlockingIOError": f" (process limit {limits.processes})",
        "RecursionError": "",
    }
    first, _, rest = error.partition("\n")
    return f"the program raised {first}{notes.get(exception, '')}" + (f"\n{rest}" if rest else "")


def run_python(source: str, name: str = "points", limits: SandboxLimits | None = None) -> dict:
    """Run `source` in the sandbox and return its global `name` as JSON data.

    Args:
        source: the program's Python source (any string; it never runs in this process).
        name: the global to send back; a list, tuple, set or numpy array, nested at most three deep, of ints,
            floats, strings, bools or None (numpy scalars and arrays become Python values).
        limits: the run's limits (default `SandboxLimits()`).

    Returns:
        `{"value": the global or None, "error": None or a one-paragraph verdict, "seconds": wall time,
        "output": the last 4 KiB the program printed, "isolation": what contained it}`.
    """
    limits = limits or SandboxLimits()
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    start = time.monotonic()
    run = _Run(source, name, limits)
    try:
        run.start()
        run.pump(start + limits.time_limit_s)
        run.kill()
    finally:
        if hasattr(run, "proc"):
            run.close()
        else:
            shutil.rmtree(run.rundir, ignore_errors=True)
    seconds = time.monotonic() - start
    control = _records(bytes(run.buffers["control"]))
    isolation = next((r["isolation"] for r in control if isinstance(r.get("isolation"), dict)), {})
    setup_error = next((r["setup_error"] for r in control if "setup_error" in r), None)
    results = _records(bytes(run.buffers["result"]))
    output = bytes(run.buffers["output"]).decode("utf-8", errors="replace")
    if run.leftover:
        isolation["leftover_processes"] = True  # still alive 5 s after SIGKILL (say so rather than hide it)
    out = {"value": None, "error": None, "seconds": seconds, "output": output, "isolation": isolation}
    if setup_error is not None:
        out["error"] = f"sandbox setup failed: {setup_error}"
    elif run.verdict is not None:
        out["error"] = run.verdict
    elif results and "value" in results[-1]:
        out["value"] = results[-1]["value"]
    elif results and isinstance(results[-1].get("error"), str):
        out["error"] = _error_text(results[-1], limits)
    elif run.proc.returncode < 0 and -run.proc.returncode != signal.SIGKILL:
        out["error"] = _signal_text(-run.proc.returncode, limits)
    elif run.proc.returncode != 0:
        out["error"] = f"the program ended with status {run.proc.returncode} without a result"
    else:
        out["error"] = "the program ended without a result"
    if out["error"] and out["value"] is None and output.strip() and not out["error"].startswith("sandbox"):
        out["error"] += "\nlast output:\n" + output[-1000:]
    return out
