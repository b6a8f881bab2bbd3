"""MATH loader: competition problems with a final answer string (hiyouga/math12k train, MATH-500 test).

The ground truth is the dataset's `answer` field verbatim (LaTeX such as `\\frac{14}{3}`); `trl_ext.rewards.grade`
decides equivalence.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from trl_ext.rewards.ground_truth import MISSING_MARKERS
from trl_ext.tasks._io import as_text, build_dataset, convert_rows, first_field, read_rows
from trl_ext.tasks.prompts import format_prompt, get_prompt

TRAIN_HUB_ID = "hiyouga/math12k"
TEST_HUB_ID = "HuggingFaceH4/MATH-500"
PROMPT_NAMES = ("r1_zero", "question_only", "intellect")
DEFAULT_PROMPT = "r1_zero"
COLUMNS = ["prompt", "question", "ground_truth"]
#: Columns kept when the source has them (MATH-500 does), for per-subject / per-level breakdowns.
EXTRA_COLUMNS = ("solution", "subject", "level", "unique_id")


def _user_turn(messages: Any) -> Any:
    """The content of the one user message of a trace's `messages` (its question); KeyError naming the field
    otherwise."""
    users = [m.get("content") for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
    if len(users) != 1:
        raise KeyError(f"messages: one user turn (the question), found {len(users)}")
    return users[0]


def _missing_answer(answer: Any) -> bool:
    """An `answer` string that holds no answer: empty, or what a missing value becomes when written out."""
    return isinstance(answer, str) and (not answer.strip() or answer.strip().lower() in MISSING_MARKERS)


def load_math(
    source: str | Path | Any = None,
    split: str = "train",
    prompt: str | None = None,
    chat: bool = False,
    limit: int | None = None,
    config: str | None = None,
    data_files: Any = None,
):
    """MATH problems with the `r1_zero` (default), `question_only` or `intellect` prompt.

    Args:
        source: local `.jsonl` with `problem` (or `question`) and `answer`, a `datasets.Dataset`, or a Hub id.
            Default: `hiyouga/math12k` for split `train`, `HuggingFaceH4/MATH-500` for any other split. Prime
            Intellect's SFT traces (`messages` with one user turn, `ground_truth`: NYU Assignment 3's SFT test set)
            load as the user turn's question and the `ground_truth` answer.
        split: Hub split.
        prompt: `r1_zero`, `question_only` or `intellect` (a system prompt; see `trl_ext.tasks.prompts`).
        chat: chat messages instead of plain text.
        limit: keep the first `limit` rows.
        config, data_files: passed to `datasets.load_dataset` for Hub sources.

    Returns:
        A `datasets.Dataset` with columns `prompt`, `question`, `ground_truth` (the `answer` string), plus those of
        `solution`, `subject`, `level`, `unique_id` the source has. Rows whose `answer` is an empty string or a
        missing-value marker (`"None"`, `"nan"`, `"null"`, `"<NA>"`) are dropped with a warning naming them; any
        other malformed row raises `RowError`.
    """
    prompt = prompt or DEFAULT_PROMPT
    if prompt not in PROMPT_NAMES:
        get_prompt(prompt)  # an unknown name lists every prompt
        raise ValueError(f"prompt {prompt!r} is not for MATH; valid prompts: {', '.join(PROMPT_NAMES)}")
    if source is None:
        source = TRAIN_HUB_ID if (split or "train").split("[")[0].strip() == "train" else TEST_HUB_ID
    rows, origin = read_rows(source, split=split, config=config, data_files=data_files, limit=limit)
    # hiyouga/math12k has two problems whose `answer` is "" (train rows 1165 and 8125) and two whose `answer` is the
    # string "None" (rows 4012 and 10891: a missing value written out; their true answers are 2 and 9). Nothing can
    # grade them, and failing would make the real training set unloadable, so they are dropped loudly.
    # Prime Intellect's test traces hold three proofs whose `ground_truth` is "" (rows 19, 46 and 129): dropped alike.
    missing = {i for i, row in rows if _missing_answer(row.get("ground_truth" if "messages" in row else "answer"))}
    if missing:
        warnings.warn(
            f"{origin}: dropped {len(missing)} row(s) with an empty or missing-value 'answer' (nothing to grade): "
            f"rows {sorted(missing)}",
            stacklevel=2,
        )
        rows = [(i, row) for i, row in rows if i not in missing]
    extras = [name for name in EXTRA_COLUMNS if rows and name in rows[0][1]]

    def convert(row: dict) -> dict:
        # Prime Intellect's traces (NYU Assignment 3's SFT test set): the user turn, `ground_truth`
        if "messages" in row:
            question = as_text(_user_turn(row["messages"]), "messages")
            answer = as_text(first_field(row, ("ground_truth",)), "ground_truth")
        else:
            question = as_text(first_field(row, ("problem", "question")), "problem")
            answer = as_text(first_field(row, ("answer",)), "answer")
        out = {
            "prompt": format_prompt(prompt, chat=chat, question=question),
            "question": question,
            "ground_truth": answer,
        }
        out.update({name: row.get(name) for name in extras})
        return out

    return build_dataset(convert_rows(rows, origin, convert), COLUMNS + extras)
