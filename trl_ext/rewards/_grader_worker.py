"""The child side of the math grading pool: a template process that imports math-verify once and forks workers.

`trl_ext.rewards.grading_pool` starts this script (`python -P _grader_worker.py PARENT_PID CONTROL_FD`, not through
`multiprocessing`, which would re-import the user's `__main__` in the child). It imports math-verify, warms it up,
answers `ready` on the control socket and then only forks: for each `fork` message, which carries one end of a
fresh socket pair, it forks a worker that serves comparisons on that socket and answers the worker's pid. A fork
of the warm template takes milliseconds where a fresh interpreter needs about a second to import sympy, so the
pool can replace a killed worker, or add one when all are held by slow answers, without making anyone wait.

Worker protocol: one JSON line `[gold, prediction]` in, one line `1` or `0` out. math-verify's own timeouts are
off (they use `signal.alarm`, main thread only): the parent kills a worker that runs past its time cap.

Lifetime: the template exits when its parent does (it polls `getppid` between messages; it never runs model
text, so it is never busy for long) or when the control socket closes. Workers are its children: Linux's
PR_SET_PDEATHSIG kills them with the template even when busy in C code (a huge integer power holds the GIL),
EOF on their socket ends them when the pool closes it, and SIGCHLD is ignored here so the kernel reaps them at
once (no zombies).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import sys
import time
from functools import lru_cache

# The shapes of MATH answers: polynomials, fractions, roots, intervals, sets, tuples, matrices, text, trig, logs.
_WARM_UP = [
    "x^2+1",
    "\\frac{3}{4}",
    "\\dfrac{\\sqrt{3}}{2}",
    "2\\sqrt{13}",
    "(-\\infty, 3] \\cup (5, \\infty)",
    "\\{1, 2, 3\\}",
    "(3, \\frac{\\pi}{2})",
    "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
    "\\text{(C)}",
    "\\sin \\theta + \\cos^2 x",
    "\\log_2 8 - \\ln e",
    "x = 5",
    "10\\%",
    "90^\\circ",
    "a_1 + b^{n}",
    "3.14",
]


def _die_with_parent(parent: int) -> None:
    """Exit when `parent` dies, even if this process is busy in C code (Linux); elsewhere a polling thread."""
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) == 0:  # 1 = PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before the call above
                os._exit(0)
            return
    except (OSError, AttributeError):
        pass
    import threading

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=poll, daemon=True).start()


def _serve(connection: socket.socket, parse, verify) -> None:
    @lru_cache(maxsize=4096)
    def parsed(answer: str):
        # `\boxed{}` gives the answer text priority over math-verify's other extraction patterns.
        return parse(f"\\boxed{{{answer}}}", parsing_timeout=None)

    reader, writer = connection.makefile("rb"), connection.makefile("wb", buffering=0)
    for line in reader:
        try:
            gold, prediction = json.loads(line)
            ok = verify(parsed(gold), parsed(prediction), timeout_seconds=None)
        except Exception:  # a malformed answer is a wrong answer, never a crash of the worker
            ok = False
        writer.write(b"1\n" if ok else b"0\n")
    os._exit(0)


def main() -> None:
    parent, control_fd = int(sys.argv[1]), int(sys.argv[2])
    # Anything a library prints goes to stderr (the parent discards it); the protocol runs on sockets only.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    control = socket.socket(fileno=control_fd)
    logging.disable(logging.WARNING)  # math-verify warns on every call that its timeout is disabled
    from math_verify import parse, verify

    # Forked workers inherit what this warms: lazy imports and the parser's adaptive caches (a cold worker spends
    # about twice the CPU on its first comparisons).
    reference = parse(f"\\boxed{{{_WARM_UP[0]}}}")
    for answer in _WARM_UP:
        parsed = parse(f"\\boxed{{{answer}}}")
        verify(parsed, parsed, timeout_seconds=None)
        verify(reference, parsed, timeout_seconds=None)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps exited workers
    control.sendall(b"ready\n")
    while os.getppid() == parent:
        if not select.select([control], [], [], 0.5)[0]:
            continue
        message, fds, _, _ = socket.recv_fds(control, 16, 1)
        if not message:  # the pool closed the control socket
            break
        if message != b"fork" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            template = os.getppid()
            _die_with_parent(template)
            _serve(socket.socket(fileno=fds[0]), parse, verify)
        os.close(fds[0])
        control.sendall(f"{pid}\n".encode())


if __name__ == "__main__":
    main()
