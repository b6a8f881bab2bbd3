"""math-verify in a child process, so the parent can bound every comparison with a hard wall-clock limit.

math-verify's own timeout uses `signal.alarm`, which only works in the main thread; here both its timeouts are
off and the parent (`trl_ext.rewards.math`) kills this process when an answer takes too long (`9^{9^{9^9}}` never
returns). Run as a script, not with `multiprocessing`: spawning through `multiprocessing` would re-import the
user's `__main__` module in the child.

Usage: `python -P _grader_worker.py PARENT_PID`. Protocol: one JSON line `[gold, prediction]` in on stdin, one
line `1` or `0` out on stdout. The first line written is `ready`, once math-verify is imported.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from functools import lru_cache


def _die_with_parent(parent: int) -> None:
    """Exit when the parent process dies, even if it was killed outright and we are busy in C code.

    An idle worker sees EOF on stdin anyway; a busy one (a huge integer power holds the GIL) needs the kernel:
    Linux's PR_SET_PDEATHSIG. Elsewhere a polling thread covers the Python-level cases.
    """
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) == 0:  # 1 = PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before the call above
                os._exit(0)
            return
    except (OSError, AttributeError):
        pass

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=poll, daemon=True).start()


def main() -> None:
    # Protocol lines go to a private copy of stdout; anything a library prints lands on stderr instead.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _die_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
    logging.disable(logging.WARNING)  # math-verify warns on every call that its timeout is disabled
    from math_verify import parse, verify

    @lru_cache(maxsize=4096)
    def parsed(answer: str):
        # `\boxed{}` gives the answer text priority over math-verify's other extraction patterns.
        return parse(f"\\boxed{{{answer}}}", parsing_timeout=None)

    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            gold, prediction = json.loads(line)
            ok = verify(parsed(gold), parsed(prediction), timeout_seconds=None)
        except Exception:  # a malformed answer is a wrong answer, never a crash of the worker
            ok = False
        out.write("1\n" if ok else "0\n")
        out.flush()


if __name__ == "__main__":
    main()
