"""Countdown: prompts, problem keys, the loader, and the tiny CPU demo's data (solver and generator in
`trl_ext.tasks.countdown_solver`, re-exported here)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trl_ext.tasks._io import RowError, as_int, build_dataset, convert_rows, read_rows
from trl_ext.tasks.countdown_solver import countdown_solutions as countdown_solutions
from trl_ext.tasks.countdown_solver import countdown_working as countdown_working
from trl_ext.tasks.countdown_solver import make_countdown_problems
from trl_ext.tasks.countdown_solver import solve_countdown as solve_countdown
from trl_ext.tasks.prompts import format_prompt, get_prompt

DEFAULT_HUB_ID = "justinphan3110/Countdown-Tasks-3to4"
PROMPT_NAMES = ("tinyzero", "countdown", "r1_zero", "compact")
DEFAULT_PROMPT = "tinyzero"
COLUMNS = ["prompt", "nums", "target"]

#: TinyZero's question sentence, used by the `tinyzero` and `r1_zero` prompts.
COUNTDOWN_QUESTION = (
    "Using the numbers {numbers}, create an equation that equals {target}. "
    "You can use basic arithmetic operations (+, -, *, /) and each number can only be used once."
)
#: NYU Assignment 3's question (section 5, as it prints its prompt), used by its `countdown` prompt: "in the list", and
# the
#: constraint on a line of its own (the template puts "Your solution ..." on the next).
NYU_A3_COUNTDOWN_QUESTION = (
    "Using the numbers in the list {numbers}, create an equation that equals {target}.\n"
    "You can use basic arithmetic operations (+, -, *, /) and each number can only be used once."
)


def countdown_question(nums: Sequence[int], target: int, prompt: str = DEFAULT_PROMPT) -> str:
    """The question for prompt `prompt`: NYU Assignment 3's for `countdown` (`"Using the numbers in the list [3, 5, 2],
    create an equation that equals 8.\nYou can use ..."`), TinyZero's for the others (`"Using the numbers [3, 5, 2],
    create an equation that equals 8. You can use ..."`)."""
    numbers = str([int(x) for x in nums])  # numpy ints from parquet would print as np.int64(3)
    template = NYU_A3_COUNTDOWN_QUESTION if prompt == "countdown" else COUNTDOWN_QUESTION
    return template.replace("{numbers}", numbers).replace("{target}", str(int(target)))


def compact_prompt(nums: Sequence[int], target: int) -> str:
    """The tiny demo's prompt, `"[14, 1, 10] -> 5 :"`."""
    return format_prompt("compact", numbers=str([int(x) for x in nums]), target=int(target))


def compact_completion(expression: str, steps: Sequence[str] = ()) -> str:
    """The tiny demo's completion, `"<answer>14-(10-1)</answer>"`; with `steps` (a worked search,
    `countdown_working`) they come first, comma-separated: `"10-1=9,14-9=5<answer>14-(10-1)</answer>"`."""
    return f"{','.join(steps)}<answer>{expression}</answer>"


def countdown_prompt(
    nums: Sequence[int], target: int, prompt: str = DEFAULT_PROMPT, chat: bool = False
) -> str | list[dict[str, str]]:
    """The prompt for one problem: `compact` renders the numbers directly, `countdown` NYU Assignment 3's question, the
    others TinyZero's question."""
    if prompt not in PROMPT_NAMES:
        raise ValueError(f"unknown Countdown prompt {prompt!r}; valid prompts: {', '.join(PROMPT_NAMES)}")
    if prompt == "compact":
        text = compact_prompt(nums, target)
        return [{"role": "user", "content": text}] if chat else text
    return format_prompt(prompt, chat=chat, question=countdown_question(nums, target, prompt))


def countdown_key(nums: Iterable[int], target: int) -> tuple[tuple[int, ...], int]:
    """Identity of a problem regardless of number order: `((sorted numbers), target)`."""
    return tuple(sorted(int(x) for x in nums)), int(target)


def make_countdown_demo_splits(
    n_train: int,
    n_eval: int,
    seed: int = 0,
    num_count: Sequence[int] = (3,),
    max_number: int = 20,
    max_target: int = 100,
):
    """Train and held-out datasets for the tiny CPU demo, in the compact format.

    The held-out problems are drawn first (so they depend only on `seed`, `n_eval` and the ranges, not on the
    training size), then the training problems exclude their keys: the splits never share a (sorted numbers,
    target) pair.

    Returns:
        `(train, held_out)` `datasets.Dataset`s with columns `prompt` (`"[14, 1, 10] -> 5 :"`), `completion`
        (`"<answer>14-(10-1)</answer>"`), `nums`, `target`.
    """
    kwargs = dict(num_count=num_count, max_number=max_number, max_target=max_target)
    held_out = make_countdown_problems(n_eval, seed=seed * 2 + 1, **kwargs)
    held_keys = {countdown_key(p["nums"], p["target"]) for p in held_out}
    train = make_countdown_problems(n_train, seed=seed * 2, exclude=held_keys, **kwargs)

    def to_dataset(problems):
        rows = [
            {
                "prompt": compact_prompt(p["nums"], p["target"]),
                "completion": compact_completion(p["solution"]),
                "nums": p["nums"],
                "target": p["target"],
            }
            for p in problems
        ]
        return build_dataset(rows, ["prompt", "completion", "nums", "target"])

    return to_dataset(train), to_dataset(held_out)


def _numbers_of(row: dict) -> tuple[list[int], int]:
    """(nums, target) of a row in either layout; TinyZero's reward_model.ground_truth must agree with them."""
    reward_model = row.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    nums = row["nums"] if row.get("nums") is not None else row.get("numbers")
    target = row.get("target")
    if isinstance(ground_truth, dict):
        nums = ground_truth.get("numbers") if nums is None else nums
        target = ground_truth.get("target") if target is None else target
    else:
        ground_truth = None
    if nums is None:
        raise KeyError("nums")
    if target is None:
        raise KeyError("target")
    if isinstance(nums, (str, bytes)) or not hasattr(nums, "__iter__"):
        raise ValueError(f"field 'nums' must be a list of integers, got {nums!r}")
    nums = [as_int(x, "nums") for x in nums]
    if not nums:
        raise ValueError("field 'nums' is empty")
    target = as_int(target, "target")
    if ground_truth is not None:
        gt_nums, gt_target = ground_truth.get("numbers"), ground_truth.get("target")
        gt_sorted = None if gt_nums is None else sorted(as_int(x, "ground_truth.numbers") for x in gt_nums)
        nums_differ = gt_sorted is not None and gt_sorted != sorted(nums)
        if nums_differ or (gt_target is not None and as_int(gt_target, "ground_truth.target") != target):
            raise ValueError(f"reward_model.ground_truth {ground_truth!r} disagrees with nums={nums}, target={target}")
    return nums, target


def load_countdown(
    source: str | Path | Any = None,
    split: str = "train",
    prompt: str | None = None,
    chat: bool = False,
    limit: int | None = None,
    config: str | None = None,
    data_files: Any = None,
):
    """Countdown problems with their prompts.

    Args:
        source: local `.parquet`/`.jsonl`/`.json` (TinyZero layout with `reward_model.ground_truth`, or plain
            `{nums, target}`), a `datasets.Dataset`, or a Hub id (default `justinphan3110/Countdown-Tasks-3to4`).
        split: Hub split.
        prompt: one of `tinyzero` (default), `countdown`, `r1_zero`, `compact`. The source's own `prompt` is replaced.
        chat: chat messages instead of plain text.
        limit: keep the first `limit` rows.
        config, data_files: passed to `datasets.load_dataset` for Hub sources.

    Returns:
        A `datasets.Dataset` with columns `prompt`, `nums` (list[int]), `target` (int): what
        `trl_ext.rewards.countdown_reward` reads.
    """
    prompt = prompt or DEFAULT_PROMPT
    if prompt not in PROMPT_NAMES:
        get_prompt(prompt)  # an unknown name lists every prompt
        raise ValueError(f"prompt {prompt!r} is not for Countdown; valid prompts: {', '.join(PROMPT_NAMES)}")
    rows, origin = read_rows(source or DEFAULT_HUB_ID, split=split, config=config, data_files=data_files, limit=limit)

    def convert(row: dict) -> dict:
        nums, target = _numbers_of(row)
        return {"prompt": countdown_prompt(nums, target, prompt=prompt, chat=chat), "nums": nums, "target": target}

    return build_dataset(convert_rows(rows, origin, convert), COLUMNS)


__all__ = [
    "COUNTDOWN_QUESTION",
    "NYU_A3_COUNTDOWN_QUESTION",
    "DEFAULT_HUB_ID",
    "PROMPT_NAMES",
    "RowError",
    "compact_completion",
    "compact_prompt",
    "countdown_key",
    "countdown_prompt",
    "countdown_question",
    "load_countdown",
    "make_countdown_demo_splits",
    "make_countdown_problems",
    "solve_countdown",
]
