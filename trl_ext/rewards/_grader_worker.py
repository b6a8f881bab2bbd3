"""math-verify in a child process, so the parent can bound every comparison with a hard wall-clock limit.

math-verify's own timeout uses `signal.alarm`, which only works in the main thread; here both its timeouts are
off and the parent (`trl_ext.rewards.math`) kills this process when an answer takes too long (`9^{9^{9^9}}` never
returns). Run as a script, not with `multiprocessing`: spawning through `multiprocessing` would re-import the
user's `__main__` module in the child.

Protocol: one JSON line `[gold, prediction]` in on stdin, one line `1` or `0` out on stdout. The first line written
is `ready`, once math-verify is imported.
"""

from __future__ import annotations

import json
import logging
import sys
from functools import lru_cache


def main() -> None:
    logging.disable(logging.WARNING)  # math-verify warns on every call that its timeout is disabled
    from math_verify import parse, verify

    @lru_cache(maxsize=4096)
    def parsed(answer: str):
        # `\boxed{}` gives the answer text priority over math-verify's other extraction patterns.
        return parse(f"\\boxed{{{answer}}}", parsing_timeout=None)

    out = sys.stdout
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
