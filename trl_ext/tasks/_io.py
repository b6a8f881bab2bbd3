"""Reading task rows from a local file or the Hugging Face Hub, and the row checks shared by the loaders.

Local `.jsonl`/`.json` files are parsed line by line here (not by Arrow's schema inference) so a bad row is reported
with its own index and keeps its own types; local `.parquet` files are read with pyarrow. Anything else is a Hub
dataset id (or a `datasets` builder name such as `"parquet"` with `data_files=`) handed to `datasets.load_dataset`.
`datasets` and `pyarrow` are imported inside the functions so `import trl_ext.tasks` stays light.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


class RowError(ValueError):
    """A malformed task row; the message names the source (file or hub id) and the row index."""


def is_local(source: Any) -> bool:
    """Whether `source` names a local data file (by suffix, or because the path exists)."""
    if not isinstance(source, (str, Path)):
        return False
    path = Path(source)
    return path.suffix.lower() in LOCAL_SUFFIXES or path.is_file()


def _read_jsonl(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" and stripped.startswith("["):
        records = json.loads(text)
        if not isinstance(records, list):
            raise RowError(f"{path}: expected a JSON list of objects")
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                raise RowError(f"{path}: row {i}: expected a JSON object, got {type(record).__name__}")
        return records
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise RowError(f"{path}: row {len(records)} (line {lineno}): invalid JSON: {err.msg}") from None
        if not isinstance(record, dict):
            raise RowError(f"{path}: row {len(records)} (line {lineno}): expected a JSON object")
        records.append(record)
    return records


def read_rows(
    source: str | Path | Any,
    split: str = "train",
    config: str | None = None,
    data_files: Any = None,
    limit: int | None = None,
) -> tuple[list[dict], str]:
    """Rows of `source` as plain dicts, and the name to use for it in error messages.

    Args:
        source: a local `.jsonl`/`.json`/`.parquet` file, a `datasets.Dataset`, or a Hub id / `datasets` builder
            name for `datasets.load_dataset(source, config, split=split, data_files=data_files)`.
        split: the split to load from the Hub (ignored for local files, which are one split).
        config: the Hub dataset's configuration name (e.g. `"main"` for `openai/gsm8k`).
        data_files: passed to `load_dataset` (lets the Hub path run on local files: `source="parquet"`).
        limit: keep the first `limit` rows.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if is_local(source):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path}")
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            if limit is not None:
                table = table.slice(0, limit)
            return table.to_pylist(), str(path)
        rows = _read_jsonl(path)
        return (rows if limit is None else rows[:limit]), str(path)

    import datasets

    if isinstance(source, datasets.Dataset):
        dataset, name = source, "dataset"
    else:
        dataset = datasets.load_dataset(source, config, split=split, data_files=data_files)
        name = f"{source}[{split}]" if data_files is None else f"{data_files} ({source}[{split}])"
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return dataset.to_list(), name


def build_dataset(rows: Iterable[dict], columns: list[str]):
    """A `datasets.Dataset` with exactly `columns`, in order, from already-converted rows."""
    import datasets

    data = {name: [] for name in columns}
    for row in rows:
        for name in columns:
            data[name].append(row[name])
    return datasets.Dataset.from_dict(data)


def convert_rows(rows: list[dict], origin: str, convert: Callable[[dict], dict]) -> list[dict]:
    """Apply `convert` to each row; a ValueError/KeyError/TypeError inside becomes a RowError naming origin and row."""
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(convert(row))
        except (ValueError, TypeError, KeyError) as err:
            reason = f"missing field {err.args[0]!r}" if isinstance(err, KeyError) else str(err)
            raise RowError(f"{origin}: row {i}: {reason}") from None
    return out


def as_int(value: Any, field: str) -> int:
    """`value` as an int; integral floats (Arrow may widen a column to float) pass, anything else -> ValueError."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"field {field!r} must be an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and float(value).is_integer():
        return int(value)
    raise ValueError(f"field {field!r} must be an integer, got {value!r}")


def as_text(value: Any, field: str) -> str:
    """`value` as a non-empty string (numbers such as a MATH answer `2` become `"2"`); else ValueError."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"field {field!r} must be a non-empty string, got {value!r}")
    if isinstance(value, numbers.Number):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"field {field!r} must be a non-empty string, got {value!r}")
    return value


def first_field(row: dict, names: tuple[str, ...]) -> Any:
    """The value of the first of `names` present (not None) in `row`; KeyError naming them all when none is."""
    for name in names:
        if row.get(name) is not None:
            return row[name]
    raise KeyError(" or ".join(names))
