"""What the learning-outcome tests share: the torch thread count the outcome matrix varies, and a record of each
measured margin.

A test that trains and then compares numbers must hold on any x86 CPU: float rounding differs with the kernels torch
picks (`ATEN_CPU_CAPABILITY=default / avx2 / avx512`) and with the thread count, and a trajectory that is
deterministic on one machine is another trajectory on the next. `tests/scripts/outcome_matrix.py` (`make
outcome-matrix`) runs these tests under each setting and tabulates what `record_margin` wrote, so a reader sees
how far each run cleared its bound; docs/testing.md has the rule and each test's bound and margins.
"""

from __future__ import annotations

import json
import os
import time

# Torch threads per training process in the outcome tests: 1 in `make test` (one per pytest worker); the matrix
# sets 2 as well, because a parallel reduction's order (and so its rounding) depends on the thread count.
TEST_THREADS = int(os.environ.get("TRL_EXT_TEST_THREADS", "1"))
# Where `record_margin` appends its JSON lines (unset: printed only).
LOG_ENV = "TRL_EXT_OUTCOME_LOG"


def record_margin(test: str, **values) -> None:
    """Print a test's measured numbers (`pytest -s` / `-rA` show them) and, when `$TRL_EXT_OUTCOME_LOG` names a
    file, append them there as one JSON line `{"test", "values", "capability", "threads", "time"}`."""
    import torch

    shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"[margin {test}] {shown}")
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    row = {
        "test": test,
        "values": values,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "time": round(time.time(), 1),
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
