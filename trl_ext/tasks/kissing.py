"""Kissing-configuration task (seed 002, section 7): one open problem, asked as often as training needs.

Every row is the same request: write a Python program defining `points`, a large kissing configuration in
dimension d (default 11). There is no ground truth; the `kissing` reward scores the program in the sandbox with
the exact verifier. The `dimension` column tells the reward which d a row asks for. Training and validation rows
are the same prompt; validation measures how often, and how large, the policy's sampled programs are valid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["KISSING_PROMPT", "kissing_prompt", "load_kissing"]

PROMPT_NAMES = ("kissing",)
DEFAULT_ROWS = 1024

KISSING_PROMPT = """\
Find a large kissing configuration in dimension {dimension}: a set C of nonzero integer vectors in Z^{dimension} such \
that the minimum distance between two distinct vectors of C is at least the maximum norm of a vector of C:

    min_{{x != y in C}} ||x - y|| >= max_{{x in C}} ||x||

Then the unit spheres centred at 2x/||x|| all touch a central unit sphere without overlapping, so the kissing \
number in dimension {dimension} is at least |C|. Your score is |C| if the configuration is valid, else 0.{bounds}

Write a Python program that defines a global variable `points`: a list of lists of {dimension} integers. It runs \
in a sandbox (standard library and numpy, no network, {time_limit:g} s). A verifier checks it with exact integer \
arithmetic and reports either the size of a valid configuration or the first violation it finds. Reply with the \
complete program in one ```python code block."""


def kissing_prompt(dimension: int = 11, time_limit_s: float = 10.0) -> str:
    """The task text for `dimension`, with the seed's known bounds when it quotes them."""
    from trl_ext.rewards.kissing import KISSING_BOUNDS

    bounds = KISSING_BOUNDS.get(dimension)
    known = f" Known bounds: {bounds[0]} <= tau_{dimension} <= {bounds[1]}." if bounds else ""
    return KISSING_PROMPT.format(dimension=dimension, time_limit=time_limit_s, bounds=known)


def load_kissing(
    source: str | Path | Any = None,
    split: str = "train",
    prompt: str | None = None,
    chat: bool = False,
    limit: int | None = None,
    dimension: int = 11,
    time_limit_s: float = 10.0,
):
    """Rows of the kissing task: columns `prompt` and `dimension`.

    Args:
        source: None (the default: `limit` or 1024 rows of `dimension`), or a local `.jsonl` whose rows each give a
            `dimension`.
        split: every split is the same prompt; with a `source` file its slice selects rows (`"train[:8]"`, as
            `datasets` reads it).
        prompt: `kissing` (the only template).
        chat: a user message instead of plain text.
        limit: rows to produce (default 1024), or the first `limit` rows of `source`.
        dimension: the dimension when `source` is None.
        time_limit_s: the sandbox limit the prompt announces.

    Raises:
        ValueError: an unknown prompt, a missing file, or a row that is not a JSON object with a positive integer
            `dimension` (naming the file and the row).
    """
    from datasets import Dataset

    from trl_ext.tasks._io import convert_rows, read_rows

    if (prompt or "kissing") not in PROMPT_NAMES:
        raise ValueError(f"prompt {prompt!r} is not for the kissing task; valid prompts: {', '.join(PROMPT_NAMES)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if source is None:
        dimensions = [dimension] * (limit or DEFAULT_ROWS)
    else:
        path = Path(source)
        if path.suffix != ".jsonl" or not path.is_file():
            raise ValueError(f"kissing task source must be an existing .jsonl file of {{'dimension': d}} rows: {path}")
        rows, origin = read_rows(path, split=split, limit=limit)
        dimensions = convert_rows(rows, origin, _dimension)
    texts = {d: kissing_prompt(d, time_limit_s) for d in set(dimensions)}
    prompts = [[{"role": "user", "content": texts[d]}] if chat else texts[d] for d in dimensions]
    return Dataset.from_dict({"prompt": prompts, "dimension": dimensions})


def _dimension(row: dict) -> int:
    # Stricter than `_io.as_int`: a dimension written as 11.0 is refused, as it always was.
    value = row.get("dimension")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"'dimension' must be a positive integer, got {value!r}")
    return value
