"""Which rows train and which validate when a recipe says `auto`: the dataset's own held-out split when it has one,
else the last rows of its train split (and training on the rest).

Countdown's default source, `justinphan3110/Countdown-Tasks-3to4`, is read for its splits at load time rather than
assumed: a `validation` / `valid` / `dev` / `test` split is used as it is (the first found, in that order), a source
with only `train` gives up its last `TAIL_ROWS` rows. Local files are one split each (tail); a local folder of
`train.parquet` + `test.parquet` files has both, as on the hub. `SplitChoice.reason` says which, for the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trl_ext.tasks._io import is_local
from trl_ext.tasks.countdown import DEFAULT_HUB_ID as COUNTDOWN_HUB_ID
from trl_ext.tasks.gsm8k import DEFAULT_CONFIG as GSM8K_CONFIG
from trl_ext.tasks.gsm8k import DEFAULT_HUB_ID as GSM8K_HUB_ID
from trl_ext.tasks.math import TRAIN_HUB_ID as MATH_HUB_ID

AUTO = "auto"
# What each task's loader reads when no source is given (its hub id and configuration).
DEFAULT_SOURCES = {
    "countdown": (COUNTDOWN_HUB_ID, None),
    "gsm8k": (GSM8K_HUB_ID, GSM8K_CONFIG),
    "math": (MATH_HUB_ID, None),  # its non-train splits load MATH-500 (trl_ext.tasks.math)
}
HELD_OUT_SPLITS = ("validation", "valid", "dev", "test")
TAIL_ROWS = 1024


@dataclass(frozen=True)
class SplitChoice:
    """The resolved `dataset_split` / `eval_split` and one line saying why."""

    train: str
    eval: str
    reason: str


def split_names(source: str | Path | Any, config: str | None = None) -> list[str]:
    """The split names of `source`: `["train"]` for a local file or a `datasets.Dataset` (one split each), else what
    `datasets` lists for the hub id or local folder (from the hub, its cache, or the folder's file names).

    Raises:
        ValueError: the splits cannot be listed (offline without a cache, a wrong id), naming the source.
    """
    if not isinstance(source, (str, Path)) or is_local(source):
        return ["train"]
    import datasets

    try:
        return list(datasets.get_dataset_split_names(str(source), config))
    except Exception as err:  # datasets raises many kinds (connection, missing repo, missing files)
        raise ValueError(
            f"cannot list the splits of {source} to choose its held-out split ({type(err).__name__}: {err}); "
            "set eval_split (and dataset_split) explicitly"
        ) from None


def choose_splits(
    task: str,
    source: str | Path | Any,
    train_split: str,
    eval_split: str,
    eval_source: str | Path | Any = None,
) -> SplitChoice:
    """Resolve `auto` in `train_split` / `eval_split` (other values pass through; no source is read then).

    Args:
        task: `countdown`, `gsm8k` or `math` (whose default source `None` stands for).
        source: the training source (hub id, local file or folder, `datasets.Dataset`), None for the task's.
        train_split: `auto` or a split with `datasets`' slicing.
        eval_split: `auto` or a split; `auto` reads `eval_source` (default: `source`).
        eval_source: the validation source when it differs from `source`.

    Returns:
        The splits and the reason: the held-out split found, or the tail of `train` because there is none.
        `auto` training is `train` unless validation takes the tail of the same source's `train`, then
        `train[:-TAIL_ROWS]`.
    """
    same_source = eval_source is None or eval_source == source
    reason = f"validation split {eval_split!r} as given"
    if eval_split == AUTO:
        evaluated, config = (source, None) if same_source else (eval_source, None)
        if evaluated is None:
            if task not in DEFAULT_SOURCES:
                raise ValueError(f"eval_split 'auto' needs a source with splits; task {task!r} has none, set it")
            evaluated, config = DEFAULT_SOURCES[task]
        names = split_names(evaluated, config)
        held_out = next((name for name in HELD_OUT_SPLITS if name in names), None)
        if held_out is not None:
            eval_split, reason = held_out, f"validation on the dataset's own {held_out!r} split ({names})"
        else:
            eval_split = f"train[-{TAIL_ROWS}:]"
            reason = f"validation on the last {TAIL_ROWS} rows of 'train': the source has no held-out split ({names})"
    if train_split == AUTO:
        same_rows = same_source and eval_split.split("[", 1)[0].strip() == "train"
        train_split = f"train[:-{TAIL_ROWS}]" if same_rows else "train"
    return SplitChoice(train=train_split, eval=eval_split, reason=reason)
