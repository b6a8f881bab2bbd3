"""Where the benchmarks read real data: the folder `$TRL_EXT_DATA` names, else `tests/data`.

`tests/data` is the subset that ships with the repository (provenance and licenses in tests/data/README.md); it holds
everything the benchmarks read: the whole Countdown dev and test sets, the GSM8K test set, MATH500, the MATH train
rows the SFT recipes validate on, the INTELLECT-MATH traces' head and the Qwen3 tokenizer. To run them on a fuller
copy (the same layout: `countdown/dev.parquet`, `gsm8k/test.jsonl`, `math/math500_test.jsonl`, ...), name it:

    TRL_EXT_DATA=/path/to/data python benchmarks/bench_rewards.py

The tests read the same variable (tests/conftest.py). Each benchmark prints which folder it read (`describe()`).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = "TRL_EXT_DATA"
SHIPPED = ROOT / "tests" / "data"


def data_dir() -> Path:
    """`$TRL_EXT_DATA` when set (it must be a folder), else the shipped `tests/data`.

    Raises:
        SystemExit: the variable names something that is not a folder (before any benchmark work starts).
    """
    value = os.environ.get(ENV)
    if not value:
        return SHIPPED
    path = Path(value)
    if not path.is_dir():
        raise SystemExit(f"{ENV}={value} is not a folder; set it to a data folder laid out as tests/data, or unset it")
    return path


def describe() -> str:
    """One line naming the data folder in use and why (for a benchmark's output)."""
    path = data_dir()
    if path == SHIPPED:
        return f"data: {path} (the subset shipped with the repository; {ENV}=/path/to/data reads a fuller copy)"
    return f"data: {path} (from ${ENV})"
