"""benchmarks/_data.py: the benchmarks read `$TRL_EXT_DATA` when it names a folder, else the shipped
tests/data, say which, and refuse a variable that names no folder. No benchmark runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import _data
finally:
    sys.path.pop(0)


@pytest.mark.parametrize("value", [None, ""])
def test_without_the_variable_the_shipped_subset_is_read(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("TRL_EXT_DATA", raising=False)
    else:
        monkeypatch.setenv("TRL_EXT_DATA", value)
    assert _data.data_dir() == REPO / "tests" / "data"
    assert (_data.data_dir() / "countdown" / "dev.parquet").is_file()
    assert _data.describe() == (
        f"data: {REPO / 'tests' / 'data'} (the subset shipped with the repository; "
        "TRL_EXT_DATA=/path/to/data reads a fuller copy)"
    )


def test_the_variable_names_the_folder_and_the_line_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("TRL_EXT_DATA", str(tmp_path))
    assert _data.data_dir() == tmp_path
    assert _data.describe() == f"data: {tmp_path} (from $TRL_EXT_DATA)"


def test_a_variable_naming_no_folder_stops_with_its_value(monkeypatch, tmp_path):
    """Bug caught: a mistyped path read as an empty data folder, or silently replaced by the shipped subset."""
    missing = tmp_path / "no_such_folder"
    monkeypatch.setenv("TRL_EXT_DATA", str(missing))
    with pytest.raises(SystemExit, match=f"TRL_EXT_DATA={missing} is not a folder"):
        _data.data_dir()
    a_file = tmp_path / "dev.parquet"
    a_file.write_bytes(b"")
    monkeypatch.setenv("TRL_EXT_DATA", str(a_file))
    with pytest.raises(SystemExit, match="is not a folder"):
        _data.data_dir()
