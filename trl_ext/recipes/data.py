"""Recipe datasets: GRPO problems through `trl_ext.tasks`; SFT examples as NYU Assignment 3's prompt / response strings
or as prompt-completion conversations."""

from __future__ import annotations

import logging
from pathlib import Path

from trl_ext.recipes.arguments import GRPOScriptArguments, SFTScriptArguments
from trl_ext.recipes.yaml_chain import RecipeError

logger = logging.getLogger(__name__)


def _is_disabled(split: str | None) -> bool:
    return split is None or str(split).lower() in ("none", "no", "")


def load_grpo_datasets(task: str, script_args: GRPOScriptArguments, training_args=None):
    """Training and validation datasets of a GRPO recipe through `trl_ext.tasks.load_task`.

    `auto` splits (Countdown's default) are resolved here from the source's own splits
    (`trl_ext.tasks.choose_splits`); `script_args` then holds the splits read, and the log says which and why.

    Returns:
        `(train_dataset, eval_dataset)`; `eval_dataset` is None when `eval_split` is 'none' or
        `training_args.eval_strategy` is "no" and `final_eval` is off.
    """
    from trl_ext.tasks import AUTO, choose_splits, load_task

    if AUTO in (script_args.dataset_split, script_args.eval_split):
        try:
            splits = choose_splits(
                task,
                script_args.dataset_source,
                script_args.dataset_split,
                script_args.eval_split,
                script_args.eval_source,
            )
        except ValueError as err:
            raise RecipeError(f"dataset_split / eval_split 'auto': {err}") from None
        logger.warning("%s: training on %r, %s", task, splits.train, splits.reason)
        script_args.dataset_split, script_args.eval_split = splits.train, splits.eval
    common = {"prompt": script_args.prompt, "chat": script_args.chat_template}
    train = load_task(
        task, source=script_args.dataset_source, split=script_args.dataset_split, limit=script_args.limit, **common
    )
    _require_rows(train, script_args.dataset_source, script_args.dataset_split, "dataset")
    wants_eval = script_args.final_eval or (training_args is not None and training_args.eval_strategy != "no")
    if _is_disabled(script_args.eval_split) or not wants_eval:
        return train, None
    source = script_args.eval_source if script_args.eval_source is not None else script_args.dataset_source
    evaluation = load_task(task, source=source, split=script_args.eval_split, limit=script_args.eval_limit, **common)
    _require_rows(evaluation, source, script_args.eval_split, "eval")
    return train, evaluation


def _require_rows(dataset, source, split, field_prefix: str) -> None:
    """An empty split would train for zero steps (or validate on nothing) without complaint; refuse it."""
    if len(dataset) == 0:
        raise RecipeError(
            f"{source or 'the task default source'} split {split!r} has no rows; check {field_prefix}_source / "
            f"{field_prefix}_split (a slice like 'train[:-1024]' of a small file can be empty)"
        )


def load_sft_dataset(source: str, split: str, limit: int | None = None):
    """SFT examples in one of two layouts, checked row by row.

    - NYU Assignment 3's course format (its `sft.jsonl`): rows `{"prompt": str, "response": str}`, kept as the two
    strings;
      `tokenize_prompt_response` turns them into training rows as the course does (plain text, no chat template).
    - Reasoning traces: rows with `messages` (a list of `{"role", "content"}`), split into TRL prompt-completion
      conversations, `prompt` = every message before the last one and `completion` = [the last message], which
      must be the assistant's (trained through the model's chat template). Other columns are dropped.

    Args:
        source: hub dataset id or a local .jsonl / .json / .parquet file.
        split: split name with datasets' slicing ("train[:-1024]"); for a local file it slices its only split.
        limit: keep the first N rows.

    Raises:
        RecipeError: rows in neither layout, a `prompt` / `response` that is not a non-empty string, or `messages`
            whose last message is not a non-empty assistant turn, naming the source and the row index.
    """
    from datasets import load_dataset

    path = Path(source)
    if path.suffix in (".jsonl", ".json", ".parquet"):
        if not path.is_file():
            raise RecipeError(f"SFT data file not found: {path}")
        builder = "parquet" if path.suffix == ".parquet" else "json"
        dataset = load_dataset(builder, data_files={"train": str(path)}, split=_on_train_split(split))
    else:
        dataset = load_dataset(source, split=split)
    columns = dataset.column_names
    if "messages" not in columns and not {"prompt", "response"} <= set(columns):
        raise RecipeError(
            f"{source}: SFT data needs `prompt` and `response` strings (NYU Assignment 3's sft.jsonl) or a `messages` "
            f"column; found {columns}"
        )
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    if "messages" not in columns:
        for index, row in enumerate(dataset):
            for name in ("prompt", "response"):
                if not isinstance(row[name], str) or not row[name].strip():
                    raise RecipeError(f"{source}: row {index}: `{name}` must be a non-empty string, got {row[name]!r}")
        return dataset.select_columns(["prompt", "response"])
    for index, messages in enumerate(dataset["messages"]):
        last = messages[-1] if messages else None
        if not last or last.get("role") != "assistant" or not str(last.get("content") or "").strip():
            raise RecipeError(
                f"{source}: row {index}: `messages` must end with a non-empty assistant turn, got "
                f"{(last or {}).get('role')!r}"
            )
    return dataset.map(
        lambda row: {"prompt": row["messages"][:-1], "completion": row["messages"][-1:]},
        remove_columns=dataset.column_names,
    )


def is_prompt_response(dataset) -> bool:
    """Whether `dataset` (from `load_sft_dataset`) holds NYU Assignment 3's `{"prompt", "response"}` strings."""
    return dataset is not None and "response" in dataset.column_names


def tokenize_prompt_response(dataset, tokenizer):
    """NYU Assignment 3's SFT rows as the course tokenizes them (`tokenize_prompt_and_output`): the prompt and the
    response tokenized separately, without special tokens (no BOS, no EOS added), and concatenated; no chat template.

    Returns:
        A dataset of `input_ids = tok(prompt) + tok(response)` and `completion_mask = [0] * len(tok(prompt)) +
        [1] * len(tok(response))`, which TRL's `SFTTrainer` trains on as is (labels -100 on the prompt with
        `completion_only_loss`; no EOS appended: the course's examples carry none).
    """

    def tokenize(row: dict) -> dict:
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        response = tokenizer(row["response"], add_special_tokens=False)["input_ids"]
        return {"input_ids": prompt + response, "completion_mask": [0] * len(prompt) + [1] * len(response)}

    return dataset.map(tokenize, remove_columns=dataset.column_names)


def load_sft_datasets(script_args: SFTScriptArguments):
    """Training and validation examples of an SFT recipe (one layout for both); validation is None when
    `eval_split` is 'none'."""
    train = load_sft_dataset(script_args.dataset_source, script_args.dataset_split, script_args.limit)
    _require_rows(train, script_args.dataset_source, script_args.dataset_split, "dataset")
    if _is_disabled(script_args.eval_split):
        return train, None
    source = script_args.eval_source or script_args.dataset_source
    evaluation = load_sft_dataset(source, script_args.eval_split, script_args.eval_limit)
    _require_rows(evaluation, source, script_args.eval_split, "eval")
    if is_prompt_response(train) != is_prompt_response(evaluation):
        raise RecipeError(
            f"dataset_source {script_args.dataset_source} and eval_source {source} hold different SFT layouts "
            "(prompt / response strings against messages): the validation loss must see what training sees"
        )
    return train, evaluation


def _on_train_split(split: str) -> str:
    """A local file has one split, 'train'; keep any slice of the requested split ('test[:10]' -> 'train[:10]')."""
    bracket = split.find("[")
    return "train" + (split[bracket:] if bracket >= 0 else "")
