"""Wiring shared by the recipe entry points (`recipes/*.py`): YAML `base:` chains, parsing, data, trainer, run.

A recipe is one YAML file holding only what differs from its `base:` (a path relative to the file). Keys are the
fields of three dataclasses, parsed by `trl.TrlParser` as in TRL's own scripts: the script arguments below, the
training config (`trl_ext.AblationGRPOConfig` or `trl.SFTConfig`) and `trl.ModelConfig`. Precedence, lowest first:
dataclass defaults < base YAML < child YAML < command-line flags.

The entry points follow open-r1's `src/open_r1/grpo.py`, one helper per step: `parse_recipe_args` ->
`load_grpo_datasets` (`trl_ext.tasks`) -> `get_reward_funcs` (`trl_ext.rewards`) -> `build_grpo_trainer`
(`AblationGRPOTrainer`; TRL loads the model from `model_name_or_path`) -> `train_save_evaluate` (train, save,
final evaluation on the validation split). Data and names are checked before any model loads.

Module top-level imports are stdlib only; torch / TRL / datasets load inside the functions that need them.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

BASE_KEY = "base"
# Per task: default prompt, reward functions, and the splits that keep training and validation disjoint.
# The Countdown hub set has only a train split, so its last 1024 rows are held out (as TinyZero does).
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "countdown": {
        "prompt": "countdown",
        "reward_funcs": ["countdown"],
        "dataset_split": "train[:-1024]",
        "eval_split": "train[-1024:]",
    },
    "gsm8k": {"prompt": "r1_zero", "reward_funcs": ["r1_zero"], "dataset_split": "train", "eval_split": "test"},
    "math": {"prompt": "r1_zero", "reward_funcs": ["r1_zero"], "dataset_split": "train", "eval_split": "test"},
}
# Sampling options only vLLM understands; the transformers backend gets an equivalent or a warning (see
# `adapt_generation_kwargs`).
VLLM_ONLY_GENERATION_KWARGS = ("stop", "include_stop_str_in_output")
SFT_DEFAULT_DATASET = "PrimeIntellect/INTELLECT-MATH-SFT-Data"


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the YAML file (and the key) at fault."""


def load_recipe_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Load a recipe YAML with its `base:` chain resolved into one flat mapping.

    `base:` is a path relative to the file that names it. A child's top-level key replaces the base's value
    (mappings too, so a child's `generation_kwargs` is complete on its own); only `env` mappings are merged.

    Args:
        path: the recipe YAML.

    Returns:
        The merged mapping, without the `base` key.

    Raises:
        RecipeError: missing file (naming the file whose `base:` points to it), a `base:` cycle (listing the
            chain), invalid YAML or a file that is not a mapping.
    """
    return load_recipe_yaml_with_sources(path)[0]


def load_recipe_yaml_with_sources(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Path]]:
    """`load_recipe_yaml` plus, for each key, the file of the chain that set it (for error messages)."""
    return _resolve_recipe(Path(path), ())


def _resolve_recipe(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, Path]]:
    import yaml

    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain[chain.index(path) :], path))
        raise RecipeError(f"{chain[-1]}: `base:` cycle: {cycle}")
    if not path.is_file():
        if chain:
            raise RecipeError(f"{chain[-1]}: `base:` file not found: {path}")
        raise RecipeError(f"recipe file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: invalid YAML: {err}") from err
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping of `field: value`, got {type(data).__name__}")

    base = data.pop(BASE_KEY, None)
    merged: dict[str, Any] = {}
    sources: dict[str, Path] = {}
    if base is not None:
        if not isinstance(base, str) or not base:
            raise RecipeError(f"{path}: `base:` must be a path to another recipe YAML, got {base!r}")
        merged, sources = _resolve_recipe(path.parent / base, (*chain, path))
    for key, value in data.items():
        if key == "env" and isinstance(value, dict) and isinstance(merged.get("env"), dict):
            value = {**merged["env"], **value}
        merged[key] = value
        sources[key] = path
    return merged, sources


@dataclass
class GRPOScriptArguments:
    """Recipe fields that are neither training-config nor model fields (GRPO recipes: countdown, gsm8k, math).

    `None` means the task's default (`trl_ext.recipes.TASK_DEFAULTS`), filled in by `apply_task_defaults`.
    """

    dataset_source: str | None = field(
        default=None,
        metadata={"help": "Training problems: a hub dataset id or a local .parquet/.jsonl file. Default: the task's."},
    )
    dataset_split: str | None = field(
        default=None,
        metadata={
            "help": "Split of dataset_source, with datasets' slicing (e.g. 'train[:-1024]'). Default: the task's "
            "(Countdown: 'train[:-1024]'; GSM8K, MATH: 'train')."
        },
    )
    limit: int | None = field(default=None, metadata={"help": "Use only the first N training problems."})
    prompt: str | None = field(
        default=None,
        metadata={
            "help": "Prompt template name in trl_ext.tasks (r1_zero, question_only, countdown, tinyzero, intellect). "
            "Default: the task's (Countdown: countdown; GSM8K, MATH: r1_zero)."
        },
    )
    chat_template: bool = field(
        default=False,
        metadata={
            "help": "Send prompts as chat messages, so the tokenizer's chat template wraps them (instruct models); "
            "else as plain text (base models, R1-Zero style)."
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions, names from trl_ext.rewards.REWARD_FUNCS (countdown, r1_zero, question_only). "
            "Default: the task's."
        },
    )
    eval_source: str | None = field(
        default=None,
        metadata={"help": "Validation problems: hub id or local file. Default: the task's source for eval_split."},
    )
    eval_split: str | None = field(
        default=None,
        metadata={
            "help": "Split of eval_source used for validation during and after training; 'none' disables it. "
            "Default: the task's (Countdown: 'train[-1024:]'; GSM8K, MATH: 'test')."
        },
    )
    eval_limit: int | None = field(
        default=1024,
        metadata={"help": "Validate on the first N problems of the eval split (seeds: >= 1024 where available)."},
    )
    n_grpo_steps: int | None = field(
        default=None,
        metadata={
            "help": "Seeds' GRPO steps (rollout batches). Sets max_steps = n_grpo_steps * num_iterations * "
            "steps_per_generation / gradient_accumulation_steps (optimizer steps per rollout batch). Setting "
            "max_steps to a different value as well is an error."
        },
    )
    rollout_log_steps: int = field(
        default=10,
        metadata={"help": "Write example rollouts to <output_dir>/rollouts.jsonl every N steps (0: never)."},
    )
    final_eval: bool = field(
        default=True, metadata={"help": "Evaluate on the validation split after training and save eval metrics."}
    )


@dataclass
class SFTScriptArguments:
    """Recipe fields of the SFT recipe (MATH reasoning traces in `messages` form)."""

    dataset_source: str = field(
        default=SFT_DEFAULT_DATASET,
        metadata={
            "help": "Reasoning traces: a hub dataset id or local .jsonl/.parquet file whose rows hold `messages` "
            "(system?, user, assistant). Trained as prompt (all but the last assistant turn) -> completion "
            "(the last assistant turn), loss on the completion only."
        },
    )
    dataset_split: str = field(default="train[:-1024]", metadata={"help": "Training split (datasets' slicing)."})
    limit: int | None = field(
        default=None, metadata={"help": "Dataset size: use only the first N examples (seed 001: 128 ... 1024, full)."}
    )
    eval_source: str | None = field(
        default=None, metadata={"help": "Validation traces (hub id or local file). Default: dataset_source."}
    )
    eval_split: str = field(
        default="train[-1024:]", metadata={"help": "Validation split of eval_source; 'none' disables validation."}
    )
    eval_limit: int | None = field(default=1024, metadata={"help": "Validate on the first N examples."})
    final_eval: bool = field(default=True, metadata={"help": "Evaluate after training and save eval metrics."})


def apply_task_defaults(task: str, script_args: GRPOScriptArguments) -> GRPOScriptArguments:
    """Fill the `None` fields of `script_args` with `TASK_DEFAULTS[task]` (in place; returned for chaining)."""
    if task not in TASK_DEFAULTS:
        raise RecipeError(f"unknown task {task!r}; choose one of {sorted(TASK_DEFAULTS)}")
    for key, value in TASK_DEFAULTS[task].items():
        if getattr(script_args, key) is None:
            setattr(script_args, key, list(value) if isinstance(value, list) else value)
    return script_args


def _recipe_parser_class():
    from trl import TrlParser

    class RecipeParser(TrlParser):
        """`TrlParser` whose `--config` YAML may have a `base:` chain; unknown keys name their file."""

        def parse_args_and_config(self, args: Sequence[str] | None = None, **kwargs):
            args = list(sys.argv[1:] if args is None else args)
            config_path = _pop_config_flag(args)
            if config_path is None:
                return self.parse_args_into_dataclasses(args=args)
            config, sources = load_recipe_yaml_with_sources(config_path)
            env = config.pop("env", None) or {}
            if not isinstance(env, dict):
                raise RecipeError(f"{sources['env']}: `env` must be a mapping of variable: value")
            known = {action.dest for action in self._actions}
            for key in config:
                if key not in known:
                    close = difflib.get_close_matches(key, sorted(known), n=3)
                    hint = f"; did you mean {', '.join(close)}?" if close else ""
                    raise RecipeError(
                        f"{sources[key]}: unknown key {key!r} (not a field of "
                        f"{', '.join(t.__name__ for t in self.dataclass_types)}){hint}"
                    )
            for name, value in env.items():
                os.environ[str(name)] = str(value)
            # Runs land in runs/<recipe folder>/<recipe name> unless the recipe or the command line says otherwise.
            name = f"{Path(config_path).resolve().parent.name}/{Path(config_path).stem}"
            if "output_dir" in known:
                config.setdefault("output_dir", str(Path("runs") / name))
            if "run_name" in known:
                config.setdefault("run_name", name)
            self.set_defaults_with_config(**config)
            try:
                return self.parse_args_into_dataclasses(args=args)
            except (ValueError, TypeError) as err:
                if isinstance(err, RecipeError):
                    raise
                raise RecipeError(f"{Path(config_path).resolve()}: {err}") from err

    return RecipeParser


def _pop_config_flag(args: list[str]) -> str | None:
    """Remove `--config PATH` / `--config=PATH` from `args` and return PATH (None when absent)."""
    for i, arg in enumerate(args):
        if arg == "--config":
            if i + 1 >= len(args):
                raise RecipeError("--config needs a path to a recipe YAML")
            path = args[i + 1]
            del args[i : i + 2]
            return path
        if arg.startswith("--config="):
            del args[i]
            return arg.split("=", 1)[1]
    return None


def make_parser(kind: str = "grpo", prog: str | None = None, task: str | None = None):
    """The recipe parser for `kind` ("grpo" or "sft"): (script args, training config, `trl.ModelConfig`)."""
    from trl import ModelConfig, SFTConfig

    if kind == "grpo":
        from trl_ext.config import AblationGRPOConfig

        types = (GRPOScriptArguments, AblationGRPOConfig, ModelConfig)
    elif kind == "sft":
        types = (SFTScriptArguments, SFTConfig, ModelConfig)
    else:
        raise ValueError(f"kind={kind!r}; choose 'grpo' or 'sft'")
    epilog = (
        "--config YAML: a recipe (recipes/<task>/*.yaml) whose keys are the flags above; `base: other.yaml` "
        "inherits from another recipe; command-line flags override the YAML."
    )
    if task == "countdown":
        epilog += " Without --config, recipes/countdown.py runs the embedded CPU demo (python -m trl_ext.demo --help)."
    return _recipe_parser_class()(types, prog=prog, epilog=epilog)


def parse_recipe_args(task: str, argv: Sequence[str] | None = None):
    """Parse a recipe's command line (`--config YAML` plus overrides) for `task`.

    Args:
        task: "countdown", "gsm8k", "math" (GRPO) or "sft".
        argv: command-line arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        `(script_args, training_args, model_args)`; for GRPO tasks the task defaults are applied and `max_steps`
        is derived from `n_grpo_steps`.
    """
    kind = "sft" if task == "sft" else "grpo"
    script_args, training_args, model_args = make_parser(kind, task=task).parse_args_and_config(argv)
    if kind == "grpo":
        apply_task_defaults(task, script_args)
        resolve_max_steps(script_args, training_args)
    return script_args, training_args, model_args


def optimizer_steps_per_rollout(training_args) -> int:
    """Optimizer steps TRL takes per rollout (generation) batch.

    One rollout batch holds `generation_batch_size` completions; TRL cuts it into `steps_per_generation`
    micro-batches per process and passes over it `num_iterations` times; each optimizer step consumes
    `gradient_accumulation_steps` micro-batches:

        steps = num_iterations * steps_per_generation / gradient_accumulation_steps
              = epochs_per_rollout_batch * rollout_batch_size / train_batch_size      (seed vocabulary)
    """
    micro = training_args.num_iterations * training_args.steps_per_generation
    ga = training_args.gradient_accumulation_steps
    if micro % ga:
        raise RecipeError(
            f"num_iterations * steps_per_generation = {micro} micro-batches per rollout batch is not a whole number "
            f"of optimizer steps (gradient_accumulation_steps={ga}); make rollout_batch_size a multiple of "
            "train_batch_size"
        )
    return micro // ga


def resolve_max_steps(script_args: GRPOScriptArguments, training_args) -> None:
    """Set `training_args.max_steps` from `n_grpo_steps` (one GRPO step = one rollout batch)."""
    if script_args.n_grpo_steps is None:
        return
    if script_args.n_grpo_steps < 1:
        raise RecipeError(f"n_grpo_steps={script_args.n_grpo_steps} must be >= 1")
    max_steps = script_args.n_grpo_steps * optimizer_steps_per_rollout(training_args)
    if training_args.max_steps > 0 and training_args.max_steps != max_steps:
        raise RecipeError(
            f"max_steps={training_args.max_steps} contradicts n_grpo_steps={script_args.n_grpo_steps} (which gives "
            f"max_steps={max_steps}); set only one of them"
        )
    training_args.max_steps = max_steps


def adapt_generation_kwargs(training_args) -> list[str]:
    """Make `generation_kwargs` (written for vLLM's SamplingParams) valid for the generation backend in use.

    vLLM (server and colocate modes) takes `stop`, `include_stop_str_in_output` and `min_tokens` as they are.
    The transformers backend (`use_vllm: false`) gets `min_tokens` renamed to `min_new_tokens`; its stop strings
    need a tokenizer passed to `generate()`, which TRL does not do, so `stop` / `include_stop_str_in_output` are
    dropped there (with a warning): completions then run to EOS or `max_completion_length`, and the rewards grade
    the first `</answer>`-closed answer anyway.

    Returns:
        The dropped keys (empty with vLLM).
    """
    kwargs = training_args.generation_kwargs
    if training_args.use_vllm or not kwargs:
        return []
    kwargs = dict(kwargs)
    if "min_tokens" in kwargs:
        kwargs["min_new_tokens"] = kwargs.pop("min_tokens")
    dropped = [key for key in VLLM_ONLY_GENERATION_KWARGS if kwargs.pop(key, None) is not None]
    if dropped:
        logger.warning(
            "generation_kwargs %s apply to vLLM only; the transformers backend ignores them (no stop at </answer>)",
            dropped,
        )
    training_args.generation_kwargs = kwargs or None
    return dropped


def _is_disabled(split: str | None) -> bool:
    return split is None or str(split).lower() in ("none", "no", "")


def load_grpo_datasets(task: str, script_args: GRPOScriptArguments, training_args=None):
    """Training and validation datasets of a GRPO recipe through `trl_ext.tasks.load_task`.

    Returns:
        `(train_dataset, eval_dataset)`; `eval_dataset` is None when `eval_split` is 'none' or
        `training_args.eval_strategy` is "no" and `final_eval` is off.
    """
    from trl_ext.tasks import load_task

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
    """Reasoning traces as TRL prompt-completion conversations (loss on the completion only).

    Each row's `messages` (a list of `{"role", "content"}`) is split into `prompt` = every message before the
    last one and `completion` = [the last message], which must be the assistant's. Other columns are dropped.

    Args:
        source: hub dataset id or a local .jsonl / .json / .parquet file.
        split: split name with datasets' slicing ("train[:-1024]"); for a local file it slices its only split.
        limit: keep the first N rows.

    Raises:
        RecipeError: a row without `messages`, or whose last message is not a non-empty assistant turn, naming
            the source and the row index.
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
    if "messages" not in dataset.column_names:
        raise RecipeError(f"{source}: SFT data needs a `messages` column; found {dataset.column_names}")
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
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


def load_sft_datasets(script_args: SFTScriptArguments):
    """Training and validation traces of an SFT recipe; validation is None when `eval_split` is 'none'."""
    train = load_sft_dataset(script_args.dataset_source, script_args.dataset_split, script_args.limit)
    _require_rows(train, script_args.dataset_source, script_args.dataset_split, "dataset")
    if _is_disabled(script_args.eval_split):
        return train, None
    source = script_args.eval_source or script_args.dataset_source
    evaluation = load_sft_dataset(source, script_args.eval_split, script_args.eval_limit)
    _require_rows(evaluation, source, script_args.eval_split, "eval")
    return train, evaluation


def _on_train_split(split: str) -> str:
    """A local file has one split, 'train'; keep any slice of the requested split ('test[:10]' -> 'train[:10]')."""
    bracket = split.find("[")
    return "train" + (split[bracket:] if bracket >= 0 else "")


def model_init_kwargs(model_args, training_args) -> dict[str, Any]:
    """`from_pretrained` kwargs from `ModelConfig`, under `training_args.model_init_kwargs` (as TRL's scripts do)."""
    kwargs: dict[str, Any] = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    kwargs.update(training_args.model_init_kwargs or {})
    return kwargs


def add_rollout_logging(trainer, every_n_steps: int):
    """Attach `trl_ext.callbacks.RolloutSamplesCallback` (example rollouts to `<output_dir>/rollouts.jsonl` every
    `every_n_steps` steps) when that module is installed; returns the callback or None."""
    if not every_n_steps:
        return None
    try:
        from trl_ext.callbacks import RolloutSamplesCallback
    except ImportError:
        return None
    callback = RolloutSamplesCallback(trainer, every_n_steps=every_n_steps)
    trainer.add_callback(callback)
    return callback


def build_grpo_trainer(script_args, training_args, model_args, reward_funcs, train_dataset, eval_dataset):
    """`AblationGRPOTrainer` for a parsed recipe; TRL loads the model from `model_name_or_path`."""
    from trl import get_peft_config, get_quantization_config

    from trl_ext.trainer import AblationGRPOTrainer

    _require_model(model_args)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    if eval_dataset is None and training_args.eval_strategy != "no":
        logger.warning("no validation split: eval_strategy %r turned off", str(training_args.eval_strategy))
        training_args.eval_strategy = "no"
    trainer = AblationGRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
    )
    add_rollout_logging(trainer, script_args.rollout_log_steps)
    return trainer


def build_sft_trainer(training_args, model_args, train_dataset, eval_dataset):
    """`trl.SFTTrainer` for a parsed SFT recipe; TRL loads the model from `model_name_or_path`."""
    from trl import SFTTrainer, get_peft_config, get_quantization_config

    _require_model(model_args)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    if eval_dataset is None and training_args.eval_strategy != "no":
        training_args.eval_strategy = "no"
    return SFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
    )


def _require_model(model_args) -> None:
    if not model_args.model_name_or_path:
        raise RecipeError("model_name_or_path is not set (recipe key or --model_name_or_path)")


def train_save_evaluate(trainer, training_args, script_args, dataset_name: str | None = None) -> dict[str, float]:
    """Train (resuming from the last checkpoint in output_dir if any), save, evaluate; returns the eval metrics."""
    from transformers.trainer_utils import get_last_checkpoint

    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is None and os.path.isdir(training_args.output_dir):
        checkpoint = get_last_checkpoint(training_args.output_dir)
        if checkpoint is not None:
            logger.info("resuming from %s", checkpoint)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"model saved to {training_args.output_dir}")

    metrics: dict[str, float] = {}
    if script_args.final_eval and trainer.eval_dataset is not None:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish the trackers, destroy the process group
        trainer.end()
    return metrics


def run_grpo_recipe(task: str, argv: Sequence[str] | None = None) -> dict[str, float]:
    """A GRPO recipe end to end: parse -> task data -> rewards -> AblationGRPOTrainer -> train, save, validate."""
    from trl_ext.rewards import get_reward_funcs

    script_args, training_args, model_args = parse_recipe_args(task, argv)
    adapt_generation_kwargs(training_args)
    # Data and reward names are checked before the model loads: a bad file or name fails in seconds.
    train_dataset, eval_dataset = load_grpo_datasets(task, script_args, training_args)
    reward_funcs = get_reward_funcs(script_args.reward_funcs)
    trainer = build_grpo_trainer(script_args, training_args, model_args, reward_funcs, train_dataset, eval_dataset)
    return train_save_evaluate(trainer, training_args, script_args, dataset_name=script_args.dataset_source)
