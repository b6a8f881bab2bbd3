"""The sandbox with hostile programs: each gets a clear verdict within its time limit and nothing outlives the run.

Two layers are tested separately: the audit hook's readable refusals (plain `os.fork`, `socket`, `open`) and the
kernel's containment underneath (the same attacks through `ctypes` and libc, which bypass the hook). Kernel checks
that depend on an isolation the machine may not grant (a network namespace, a read-only root) skip, naming the
missing piece, when the run reports it did not apply.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from trl_ext.rewards.kissing import run_points_program
from trl_ext.rewards.sandbox import SandboxLimits, run_python

SHORT = 1.0  # seconds: the limit of the cases that must be killed (each burns up to that much CPU)
GRACE = 30.0  # generous slack for a loaded 2-core machine; an unbounded run would never return at all


def _leftovers(uid: int | None) -> list[int]:
    """Live processes (zombies are dead, waiting for init to reap them) of the run's private uid (root mode);
    [] when runs share the caller's uid."""
    if uid is None or uid == os.getuid():
        return []
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) == uid and not status["State"].strip().startswith("Z"):
            found.append(int(pid))
    return found


def _run(source: str, time_limit_s: float = 10.0, **limits) -> dict:
    start = time.monotonic()
    result = run_python(source, "points", SandboxLimits(time_limit_s=time_limit_s, **limits))
    assert time.monotonic() - start < time_limit_s + GRACE
    assert _leftovers(result["isolation"].get("uid")) == [], "a sandboxed process outlived its run"
    return result


HOSTILE = [
    # (case, program, limits, verdict substring)
    (
        "infinite loop",
        "while True:\n    pass",
        {"time_limit_s": SHORT},
        "time limit: the program ran for more than 1 s and was killed",
    ),
    ("sleeps forever", "import time\nwhile True:\n    time.sleep(1)", {"time_limit_s": SHORT}, "time limit"),
    (
        "fork bomb (os.fork)",
        "import os\nwhile True:\n    os.fork()",
        {},
        "PermissionError: starting processes (os.fork) is disabled in the sandbox",
    ),
    (
        "fork bomb (libc fork, past the audit hook)",
        "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()",
        {"time_limit_s": SHORT},
        "time limit",
    ),
    (
        "memory bomb",
        "x = []\nwhile True:\n    x.append(bytearray(10**7))",
        {"memory_mb": 512},
        "the program raised MemoryError (memory limit 512 MiB)",
    ),
    (
        "huge points",
        "points = [[123456789] * 11] * 20000",
        {"max_result_bytes": 1 << 20},
        # 20000 rows of 11 nine-digit ints: 20000 * 121 + 19999 * 2 + 2 characters, plus 11 for '{"value": ...}'
        "`points` is 2460011 bytes as JSON, over the limit of 1048576",
    ),
    (
        "prints megabytes",
        "print('x' * 5_000_000)\npoints = [[1] * 11]",
        {},
        "output limit: the program printed more than 1048576 bytes and was killed",
    ),
    (
        "fills the disk",
        "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * 10**6)",
        {"file_mb": 4},
        "the program raised OSError: [Errno 27] File too large",
    ),
    (
        "opens a socket",
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
        {},
        "the program raised PermissionError: network access is disabled in the sandbox",
    ),
    ("points is not a list", "points = 'hello'", {}, "`points` must be a list of vectors, got str"),
    ("points of objects", "points = [[object()]]", {}, "`points[0][0]` is a object; send plain lists of ints"),
    ("no points", "x = 1", {}, "the program did not define a global `points`"),
    ("raises", "1 / 0", {}, "the program raised ZeroDivisionError: division by zero\n  line 1: 1 / 0"),
    ("exits non-zero", "import sys\nsys.exit(3)", {}, "program exited with status 3"),
    ("syntax error", "points = [[1, 2]", {}, "the program raised SyntaxError"),
]


@pytest.mark.parametrize(("case", "source", "limits", "verdict"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_program_gets_a_clear_verdict(case, source, limits, verdict):
    result = _run(source, **limits)
    assert result["value"] is None
    assert verdict in result["error"], (case, result["error"])


def test_writing_outside_the_working_directory_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    result = _run(f"open({str(target)!r}, 'w').write('x')\npoints = [[1]]")
    assert "the sandbox allows changes only inside its working directory" in result["error"]
    assert not target.exists()


def test_writing_outside_through_libc_is_refused_by_the_kernel():
    """Past the audit hook: a read-only root (namespaces) or a private uid (root) must stop the write. The target
    is in the interpreter's prefix, which the sandbox always sees (a path elsewhere under /tmp, where a CI clone may
    live, would simply not exist behind its private /tmp)."""
    outside = tempfile.mkdtemp(dir=sys.prefix, prefix=".sandbox_probe_")
    os.chmod(outside, 0o777)  # writable by anyone: only the read-only mount can stop the write
    target = Path(outside) / "escaped.txt"
    source = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"fd = libc.open({str(target).encode()!r}, os.O_CREAT | os.O_WRONLY, 0o644)\n"
        "points = [[fd, ctypes.get_errno()]]"
    )
    result = _run(source)
    iso = result["isolation"]
    if not iso.get("read_only_root"):
        shutil.rmtree(outside)
        pytest.skip(f"no read-only root on this machine: {iso}")
    try:
        fd, errno = result["value"][0]
        assert fd == -1 and errno in (13, 30)  # EACCES (private uid) or EROFS (read-only root)
        assert not target.exists()
    finally:
        shutil.rmtree(outside)


def test_socket_through_libc_has_no_network():
    source = (
        "import ctypes, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)\n"
        "addr = struct.pack('=H', socket.AF_INET) + struct.pack('!H', 80) + bytes([1, 1, 1, 1]) + bytes(8)\n"
        "points = [[fd, libc.connect(fd, addr, 16), ctypes.get_errno()]]"
    )
    result = _run(source)
    if "net" not in result["isolation"].get("namespaces", []):
        pytest.skip(f"no network namespace on this machine: {result['isolation']}")
    _, connected, errno = result["value"][0]
    assert connected == -1 and errno == 101  # ENETUNREACH: the namespace has no interface up


def test_process_limit_caps_forks_past_the_audit_hook():
    """Catches a missing RLIMIT_NPROC (or root ignoring it): at most `processes` tasks, the rest of 40 forks fail."""
    source = (
        "import ctypes, os, time\nlibc = ctypes.CDLL(None)\nok = failed = 0\n"
        "for _ in range(40):\n    pid = libc.fork()\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    ok, failed = (ok + 1, failed) if pid > 0 else (ok, failed + 1)\n"
        "points = [[ok, failed]]"
    )
    result = _run(source, processes=8)
    ok, failed = result["value"][0]
    assert ok + failed == 40 and ok > 0 and failed > 0
    iso = result["isolation"]
    if iso.get("root") or "user" in iso.get("namespaces", []):  # the limit counts this run's tasks only
        assert ok < 8  # 8 tasks: the program, its forks (and with a PID namespace the launcher)
    # the 30 s sleepers died with the run (checked in _run): the whole run took far less than 30 s
    assert result["seconds"] < 30


def test_a_process_that_leaves_the_session_still_dies_with_the_run():
    """Double fork + setsid through libc escapes a process-group kill; the PID namespace or the private uid must
    still end it. The escapee reports its host pid (/proc/self is the host's view) so we can look for it."""
    source = (
        "import ctypes, os, time\nlibc = ctypes.CDLL(None)\nr, w = os.pipe()\n"
        "if libc.fork() == 0:\n    libc.setsid()\n"
        "    if libc.fork() == 0:\n        os.write(w, os.readlink('/proc/self').encode())\n        time.sleep(60)\n"
        "    os._exit(0)\n"
        "points = [[int(os.read(r, 32))]]"
    )
    result = _run(source)
    (escapee,) = result["value"][0]
    iso = result["isolation"]
    if "pid" not in iso.get("namespaces", []) and not iso.get("root"):
        os.kill(escapee, 9)
        pytest.skip(f"no PID namespace and no private uid: an escapee outlives the run here (docs/kissing.md): {iso}")
    try:
        with open(f"/proc/{escapee}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
    except FileNotFoundError:
        state = "gone"
    assert state == "gone" or "Z" in state, f"the escapee {escapee} is alive after the run: {state}"
    assert result["seconds"] < 30  # the 60 s sleeper did not hold the run open


def test_valid_programs_return_data_and_numpy_becomes_lists():
    result = run_points_program("import numpy as np\nprint('hello')\npoints = np.eye(11, dtype=np.int64)[:3]")
    assert result["error"] is None
    assert result["points"] == [[1 if j == i else 0 for j in range(11)] for i in range(3)]
    assert result["output"] == "hello\n" and result["seconds"] > 0
    tuples = run_points_program("points = {(1, 0), (0, 1)}")  # a set of tuples arrives as a list of lists
    assert sorted(tuples["points"]) == [[0, 1], [1, 0]]


def test_the_program_runs_in_a_fresh_empty_directory_and_leaves_nothing_behind(monkeypatch):
    # A temporary root of our own: other tests' runs (pytest -n 2) create their directories in the shared one.
    root = tempfile.mkdtemp()
    os.chmod(root, 0o711)  # traversable by a private uid, as /tmp is
    monkeypatch.setattr(tempfile, "tempdir", root)
    try:
        result = run_points_program("import os\nopen('note', 'w').write('x')\npoints = [sorted(os.listdir('.'))]")
        assert result["points"] == [["note", "program.py"]]
        assert os.listdir(root) == []
    finally:
        shutil.rmtree(root)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="SandboxLimits.memory_mb must be a positive number"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(ValueError, match="SandboxLimits.processes must be >= 2"):
        SandboxLimits(processes=1)
    with pytest.raises(TypeError, match="source must be a str"):
        run_python(b"points = []")


def test_an_interpreter_under_tmp_stays_visible_and_read_only():
    """A clone and its virtual environment under /tmp (as CI may place them) must survive the sandbox's private
    /tmp: catches a tmpfs mounted over /tmp without the interpreter's paths bound back (every program then ended
    with status 70), and bound-back paths that are writable or that bring the rest of /tmp along."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="trl_ext_venv_probe_"))
    try:
        base.chmod(0o755)  # as a clone's folder: the sandbox's private uid may traverse it
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True, timeout=120)
        site = next((base / "venv" / "lib").glob("python*/site-packages"))
        outer = [str(Path(__file__).resolve().parents[1])] + [p for p in sys.path if p and os.path.isdir(p)]
        (site / "outer.pth").write_text("\n".join(outer) + "\n")  # this checkout and the test's packages
        (base / "secret.txt").write_text("beside the venv, not part of the interpreter")
        program = (
            "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "fd = libc.open((sys.prefix + '/escaped.txt').encode(), os.O_CREAT | os.O_WRONLY, 0o644)\n"
            f"points = [[sys.prefix, fd, ctypes.get_errno(), os.path.exists({str(base / 'secret.txt')!r})]]"
        )
        runner = "import json, sys\nfrom trl_ext.rewards.sandbox import run_python\n"
        runner += "print(json.dumps(run_python(sys.argv[1])))"
        python = str(base / "venv" / "bin" / "python")
        proc = subprocess.run([python, "-c", runner, program], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout)
        if not result["isolation"].get("private_tmp"):
            pytest.skip(f"no private /tmp (mount namespace) on this machine: {result['isolation']}")
        assert result["error"] is None, result
        prefix, fd, errno, sees_secret = result["value"][0]
        assert prefix == str(base / "venv")
        assert fd == -1 and errno in (13, 30)  # EACCES (private uid) or EROFS (read-only bind)
        assert sees_secret is False
        assert not (base / "venv" / "escaped.txt").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)
