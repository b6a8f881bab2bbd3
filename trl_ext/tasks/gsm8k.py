"""GSM8K loader: grade-school word problems whose reference solution ends in `#### N`.

The ground truth is that final `N` (commas stripped), the string `trl_ext.rewards` grades numerically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trl_ext.tasks._io import as_text, build_dataset, convert_rows, first_field, read_rows
from trl_ext.tasks.prompts import format_prompt, get_prompt

DEFAULT_HUB_ID = "openai/gsm8k"
DEFAULT_CONFIG = "main"
PROMPT_NAMES = ("r1_zero", "question_only")
DEFAULT_PROMPT = "r1_zero"
COLUMNS = ["prompt", "question", "ground_truth", "solution"]


def gsm8k_final_answer(solution: str) -> str:
    """The value after the last `####` of a GSM8K solution, commas removed: `"... #### 1,000"` -> `"1000"`.

    The extraction is `trl_ext.rewards.math.extract_gsm8k_answer`, the one the GSM8K reward grades against; this
    adds the check that the value is not empty.

    Raises:
        ValueError: the solution has no `####` or nothing after it.
    """
    from trl_ext.rewards.math import extract_gsm8k_answer

    answer = extract_gsm8k_answer(solution)
    if not answer:
        raise ValueError("field 'answer' has an empty '####' final answer")
    return answer


def load_gsm8k(
    source: str | Path | Any = None,
    split: str = "train",
    prompt: str | None = None,
    chat: bool = False,
    limit: int | None = None,
    config: str | None = None,
    data_files: Any = None,
):
    """GSM8K with the `r1_zero` (default) or `question_only` prompt.

    Args:
        source: local `.jsonl` with `question` and `answer` (the solution ending in `#### N`), a
            `datasets.Dataset`, or a Hub id (default `openai/gsm8k`, config `main`).
        split: Hub split (`train` or `test`).
        prompt: `r1_zero` or `question_only`.
        chat: chat messages instead of plain text.
        limit: keep the first `limit` rows.
        config, data_files: passed to `datasets.load_dataset` for Hub sources.

    Returns:
        A `datasets.Dataset` with columns `prompt`, `question`, `ground_truth` (the `#### N` value as a string) and
        `solution` (the reference solution).
    """
    prompt = prompt or DEFAULT_PROMPT
    if prompt not in PROMPT_NAMES:
        get_prompt(prompt)  # an unknown name lists every prompt
        raise ValueError(f"prompt {prompt!r} is not for GSM8K; valid prompts: {', '.join(PROMPT_NAMES)}")
    if source is None:
        source, config = DEFAULT_HUB_ID, config or DEFAULT_CONFIG
    rows, origin = read_rows(source, split=split, config=config, data_files=data_files, limit=limit)

    def convert(row: dict) -> dict:
        question = as_text(first_field(row, ("question",)), "question")
        solution = as_text(first_field(row, ("answer",)), "answer")
        return {
            "prompt": format_prompt(prompt, chat=chat, question=question),
            "question": question,
            "ground_truth": gsm8k_final_answer(solution),
            "solution": solution,
        }

    return build_dataset(convert_rows(rows, origin, convert), COLUMNS)
