"""Kissing-configuration task (NLPDL HW3, section 7): one open problem, asked as often as training needs.

Every row is the same request: write a Python program defining `points`, a large kissing configuration in
dimension d (default 11). There is no ground truth; the `kissing` reward scores the program in the sandbox with
the exact verifier. The `dimension` column tells the reward which d a row asks for. Training and validation rows
are the same prompt; validation measures how often, and how large, the policy's sampled programs are valid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["ANSWER_FORMAT", "KISSING_PROMPT", "kissing_prompt", "load_kissing"]

PROMPT_NAMES = ("kissing",)
DEFAULT_ROWS = 1024

# NLPDL HW3's baseline prompt (section 7.4) in its own words, the dimension filled in (the course's is 11); the test
# pins it to the text typed from the assignment (tests/data/course_prompts/nlpdl_hw3_kissing_baseline.txt).
KISSING_PROMPT = (
    "I need to find a set of integer vectors C in {dimension} dimensions such that 0 is not in C and "
    "$\\min_{{x \\neq y \\in C}} \\|x - y\\| \\geq \\max_{{x \\in C}} \\|x\\|$. My score is the number of vectors "
    "in C. Please write a Python program that defines a global variable `points` as a list of such vectors."
)
# The one sentence of ours after the course's prompts: the reward and the discovery loop read the program from a fenced
# block (`trl_ext.rewards.kissing.extract_program`), which the course's words do not ask for.
ANSWER_FORMAT = "Reply with the complete program in one ```python code block."


def kissing_prompt(dimension: int = 11) -> str:
    """The task: NLPDL HW3's baseline prompt for `dimension`, then `ANSWER_FORMAT` on a line of its own."""
    return f"{KISSING_PROMPT.format(dimension=dimension)}\n\n{ANSWER_FORMAT}"


def load_kissing(
    source: str | Path | Any = None,
    split: str = "train",
    prompt: str | None = None,
    chat: bool = False,
    limit: int | None = None,
    dimension: int = 11,
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
    texts = {d: kissing_prompt(d) for d in set(dimensions)}
    prompts = [[{"role": "user", "content": texts[d]}] if chat else texts[d] for d in dimensions]
    return Dataset.from_dict({"prompt": prompts, "dimension": dimensions})


def _dimension(row: dict) -> int:
    # Stricter than `_io.as_int`: a dimension written as 11.0 is refused, as it always was.
    value = row.get("dimension")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"'dimension' must be a positive integer, got {value!r}")
    return value
