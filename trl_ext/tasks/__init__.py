"""Task data: loaders that turn Countdown, GSM8K and MATH rows into prompts plus the columns the rewards read.

| task | default source | prompts (first = default) | ground truth |
|---|---|---|---|
| countdown | `justinphan3110/Countdown-Tasks-3to4` | tinyzero, countdown, r1_zero, compact | `nums`, `target` |
| gsm8k | `openai/gsm8k` (config `main`) | r1_zero, question_only | `ground_truth` |
| math | `hiyouga/math12k`; `HuggingFaceH4/MATH-500` (test) | r1_zero, question_only, intellect | `ground_truth` |

`load_task(name, source, split, prompt, chat, limit)` dispatches; `source` may be a local `.parquet`/`.jsonl`.
`choose_splits` resolves a recipe's `auto` splits (the source's own held-out split, else the tail of `train`).
`datasets` is imported only when a loader runs, so importing this package is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trl_ext.tasks._io import RowError
from trl_ext.tasks.countdown import (
    COUNTDOWN_QUESTION,
    NYU_A3_COUNTDOWN_QUESTION,
    compact_completion,
    compact_prompt,
    countdown_key,
    countdown_prompt,
    countdown_question,
    load_countdown,
    make_countdown_demo_splits,
)
from trl_ext.tasks.countdown_solver import (
    countdown_solutions,
    countdown_working,
    make_countdown_problems,
    solve_countdown,
)
from trl_ext.tasks.gsm8k import gsm8k_final_answer, load_gsm8k
from trl_ext.tasks.kissing import kissing_prompt, load_kissing
from trl_ext.tasks.math import load_math
from trl_ext.tasks.prompts import CHAT_PROMPTS, PROMPTS, format_prompt, get_prompt
from trl_ext.tasks.splits import AUTO, SplitChoice, choose_splits, split_names

#: Loader of each task name.
TASKS = {"countdown": load_countdown, "gsm8k": load_gsm8k, "math": load_math, "kissing": load_kissing}


def load_task(
    name: str,
    source: str | Path | Any = None,
    split: str = "train",
    prompt: str | None = None,
    chat: bool = False,
    limit: int | None = None,
    **kwargs: Any,
):
    """Load task `name` (`countdown`, `gsm8k`, `math`) as a `datasets.Dataset` with a `prompt` column.

    Args:
        name: the task.
        source: Hub id, local `.parquet`/`.jsonl`/`.json`, or a `datasets.Dataset`; None means the task's Hub default.
        split: Hub split.
        prompt: prompt name; None means the task's default (`tinyzero` for Countdown, `r1_zero` otherwise).
        chat: chat messages (`[{"role": "user", "content": ...}]`) instead of plain text.
        limit: keep the first `limit` rows.
        **kwargs: `config=` / `data_files=` for `datasets.load_dataset`.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    return TASKS[name](source=source, split=split, prompt=prompt, chat=chat, limit=limit, **kwargs)


__all__ = [
    "AUTO",
    "CHAT_PROMPTS",
    "COUNTDOWN_QUESTION",
    "NYU_A3_COUNTDOWN_QUESTION",
    "PROMPTS",
    "TASKS",
    "RowError",
    "SplitChoice",
    "compact_completion",
    "choose_splits",
    "compact_prompt",
    "countdown_key",
    "countdown_prompt",
    "countdown_question",
    "countdown_solutions",
    "countdown_working",
    "format_prompt",
    "get_prompt",
    "gsm8k_final_answer",
    "kissing_prompt",
    "load_countdown",
    "load_gsm8k",
    "load_kissing",
    "load_math",
    "load_task",
    "make_countdown_demo_splits",
    "make_countdown_problems",
    "solve_countdown",
    "split_names",
]
