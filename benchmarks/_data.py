"""Where the benchmarks read real data: `$TRL_EXT_SHARED_DATA`, else `../shared/data` beside a developer's
checkout, else `tests/data`, the subset that ships with the repository (same layout; it holds the whole Countdown
dev and test sets, GSM8K test, MATH500 and the Qwen3 tokenizer, which is all the benchmarks read)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """The first data folder that exists, in the order above (`tests/data` when none does)."""
    if "TRL_EXT_SHARED_DATA" in os.environ:
        return Path(os.environ["TRL_EXT_SHARED_DATA"])
    shared = ROOT.parent / "shared" / "data"
    return shared if shared.exists() else ROOT / "tests" / "data"
