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


def local_ranges(split: str | None, n_rows: int) -> list[tuple[int, int]]:
    """Row ranges `[(start, stop), ...]` that `split` selects from a local file's `n_rows` rows.

    A local file is a single split, so the split's name is ignored and only its slice counts, in `datasets`'
    syntax: `"train"` -> all rows, `"train[:-1024]"` -> all but the last 1024, `"test[10%:20%]+test[:5]"`.
    """
    if split is None or "[" not in split:
        return [(0, n_rows)]
    import datasets

    names = {part.split("[", 1)[0].strip() for part in split.split("+")}
    try:
        instructions = datasets.ReadInstruction.from_spec(split).to_absolute(dict.fromkeys(names, n_rows))
    except (ValueError, AssertionError) as err:
        raise ValueError(f"bad split {split!r}: {err}") from None
    return [(ins.from_, ins.to) for ins in instructions]


def read_rows(
    source: str | Path | Any,
    split: str | None = "train",
    config: str | None = None,
    data_files: Any = None,
    limit: int | None = None,
) -> tuple[list[tuple[int, dict]], str]:
    """Rows of `source` as `(row index, plain dict)` pairs, and the name to use for the source in error messages.

    Args:
        source: a local `.jsonl`/`.json`/`.parquet` file, a `datasets.Dataset`, or a Hub id / `datasets` builder
            name for `datasets.load_dataset(source, config, split=split, data_files=data_files)`.
        split: the Hub split, with `datasets`' slicing (`"train[:-1024]"`). A local file is one split: only the
            slice applies (see `local_ranges`), and row indices stay those of the file.
        config: the Hub dataset's configuration name (e.g. `"main"` for `openai/gsm8k`).
        data_files: passed to `load_dataset` (lets the Hub path run on local files: `source="parquet"`).
        limit: keep the first `limit` selected rows.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if is_local(source):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path}")
        is_parquet = path.suffix.lower() == ".parquet"
        if is_parquet:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            n_rows = table.num_rows
        else:
            records = _read_jsonl(path)
            n_rows = len(records)
        rows: list[tuple[int, dict]] = []
        for start, stop in local_ranges(split, n_rows):
            if limit is not None:
                stop = min(stop, start + limit - len(rows))
            if stop <= start:
                continue
            chunk = table.slice(start, stop - start).to_pylist() if is_parquet else records[start:stop]
            rows.extend(zip(range(start, stop), chunk, strict=True))
        return rows, str(path)

    import datasets

    if isinstance(source, datasets.Dataset):
        dataset, name = source, "dataset"
    else:
        split = split or "train"
        dataset = datasets.load_dataset(source, config, split=split, data_files=data_files)
        name = f"{source}[{split}]" if data_files is None else f"{data_files} ({source}[{split}])"
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return list(enumerate(dataset.to_list())), name


def build_dataset(rows: Iterable[dict], columns: list[str]):
    """A `datasets.Dataset` with exactly `columns`, in order, from already-converted rows."""
    import datasets

    data = {name: [] for name in columns}
    for row in rows:
        for name in columns:
            data[name].append(row[name])
    return datasets.Dataset.from_dict(data)


def convert_rows(rows: list[tuple[int, dict]], origin: str, convert: Callable[[dict], dict]) -> list[dict]:
    """Apply `convert` to each row; a ValueError/KeyError/TypeError inside becomes a RowError naming origin and row."""
    out = []
    for i, row in rows:
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
