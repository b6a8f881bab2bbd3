"""Recipe trainers: `AblationGRPOTrainer` or `trl.SFTTrainer` from parsed arguments, then train, save, evaluate."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from trl_ext.preflight.attention import choose_attention
from trl_ext.preflight.rundir import write_run_record
from trl_ext.recipes.data import load_grpo_datasets
from trl_ext.recipes.entry import entry_preflight, sft_entry_preflight
from trl_ext.recipes.parsing import adapt_generation_kwargs, parse_recipe_args
from trl_ext.recipes.yaml_chain import RecipeError

logger = logging.getLogger(__name__)


def model_init_kwargs(model_args, training_args) -> dict[str, Any]:
    """`from_pretrained` kwargs from `ModelConfig`, under `training_args.model_init_kwargs` (as TRL's scripts do).

    FlashAttention-2 where it cannot run (no `flash_attn`, or the CPU) becomes `sdpa` here, with a warning, before
    the model loads (`trl_ext.preflight.attention`)."""
    kwargs: dict[str, Any] = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    kwargs.update(training_args.model_init_kwargs or {})
    attention = choose_attention(kwargs["attn_implementation"], bool(getattr(training_args, "use_cpu", False)))
    if attention.fell_back:
        logger.warning(attention.message())
        kwargs["attn_implementation"] = attention.used
    return kwargs


def add_rollout_logging(trainer, every_n_steps: int):
    """Attach `trl_ext.grpo.callbacks.RolloutSamplesCallback` (example rollouts to `<output_dir>/rollouts.jsonl` every
    `every_n_steps` steps); returns the callback, or None when `every_n_steps` is 0."""
    from trl_ext.grpo.callbacks import RolloutSamplesCallback

    if not every_n_steps:
        return None
    callback = RolloutSamplesCallback(trainer, every_n_steps=every_n_steps)
    trainer.add_callback(callback)
    return callback


def build_grpo_trainer(
    script_args, training_args, model_args, reward_funcs, train_dataset, eval_dataset, trainer_class=None
):
    """`AblationGRPOTrainer` (or `trainer_class`, a `GRPOTrainer` subclass such as `ExpertIterationTrainer`) for a
    parsed recipe; TRL loads the model from `model_name_or_path`."""
    from trl import get_peft_config, get_quantization_config

    from trl_ext.grpo.trainer import AblationGRPOTrainer

    _require_model(model_args)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    if eval_dataset is None and training_args.eval_strategy != "no":
        logger.warning("no validation split: eval_strategy %r turned off", str(training_args.eval_strategy))
        training_args.eval_strategy, training_args.eval_on_start = "no", False
    trainer = (trainer_class or AblationGRPOTrainer)(
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


ACCURACY_FIELDS = {
    "task": "accuracy_task", "data_file": "accuracy_source", "split": "accuracy_split", "limit": "accuracy_limit",
    "prompt": "accuracy_prompt", "chat": "accuracy_chat", "max_tokens": "accuracy_max_tokens",
    "temperature": "accuracy_temperature", "batch_size": "accuracy_batch_size",
}  # fmt: skip
# The server's address and weight-sync port (`ValidationAccuracy`'s fields without `accuracy_`).
_SERVER_ACCURACY_FIELDS = ("accuracy_vllm_server_host", "accuracy_vllm_server_port", "accuracy_vllm_group_port")
_VLLM_ACCURACY_FIELDS = ("accuracy_vllm_mode", "accuracy_vllm_gpu_memory_utilization", *_SERVER_ACCURACY_FIELDS)


def validation_accuracy(script_args, training_args):
    """The SFT recipe's validation-accuracy settings (`accuracy_*` fields) with their problems loaded, or None for
    `accuracy_backend: none`. Runs before the model loads: a bad field or data file fails here.

    Raises:
        RecipeError: an `accuracy_*` field the chosen backend ignores, or one `trl_ext.evaluation.EvalConfig`
            refuses (named), or a problem set that does not load.
    """
    from dataclasses import fields

    from trl_ext.evaluation import EvalConfig, ground_truth_of, load_problems, reward_name_for
    from trl_ext.expert_iteration.sft_validation import ValidationAccuracy
    from trl_ext.recipes.arguments import SFTScriptArguments

    backend = script_args.accuracy_backend
    defaults = {f.name: f.default for f in fields(SFTScriptArguments)}
    ignored = {
        "none": [*ACCURACY_FIELDS.values(), *_VLLM_ACCURACY_FIELDS],
        "transformers": list(_VLLM_ACCURACY_FIELDS),
        "vllm": ["accuracy_batch_size"],
    }.get(backend)
    if ignored is None:
        raise RecipeError(f"accuracy_backend={backend!r}; choose none, transformers or vllm")
    combination = f"accuracy_backend={backend!r}"
    if backend == "vllm":  # the colocated engine's share of the GPU, or the server's address: not both
        mode = script_args.accuracy_vllm_mode
        ignored += ["accuracy_vllm_gpu_memory_utilization"] if mode == "server" else list(_SERVER_ACCURACY_FIELDS)
        combination += f" and accuracy_vllm_mode={mode!r}"
    for name in ignored:
        if getattr(script_args, name) != defaults[name]:
            raise RecipeError(f"{name}={getattr(script_args, name)!r} has no effect with {combination}")
    if backend == "none":
        return None
    if training_args.eval_strategy == "no":
        raise RecipeError(f"accuracy_backend={backend!r} measures at the evaluations: give an eval_strategy")
    settings = {key: getattr(script_args, name) for key, name in ACCURACY_FIELDS.items()}
    try:
        config = EvalConfig(model="(the policy)", backend=backend, seed=training_args.seed, ns=(1,), **settings)
        prompts, rows = load_problems(config)
        return ValidationAccuracy(
            config=config,
            prompts=prompts,
            ground_truths=[ground_truth_of(config.task, row) for row in rows],
            reward=reward_name_for(config.task, config.prompt, config.reward),
            vllm_mode=script_args.accuracy_vllm_mode,
            vllm_gpu_memory_utilization=script_args.accuracy_vllm_gpu_memory_utilization,
            **{name.removeprefix("accuracy_"): getattr(script_args, name) for name in _SERVER_ACCURACY_FIELDS},
        )
    except (ValueError, FileNotFoundError) as err:
        raise RecipeError(f"validation accuracy (accuracy_* fields): {err}") from err


def build_sft_trainer(training_args, model_args, train_dataset, eval_dataset, accuracy=None):
    """`trl_ext.expert_iteration.sft_validation.ValidatingSFTTrainer` (TRL's SFTTrainer, plus validation accuracy
    when `accuracy` is given, and `step_time`) for a parsed SFT recipe; TRL loads the model from
    `model_name_or_path`. NYU Assignment 3's `{"prompt", "response"}` examples are tokenized here as the course does
    (`trl_ext.recipes.data.tokenize_prompt_response`, with the model's tokenizer); without validation examples the
    evaluations measure accuracy alone."""
    from trl import get_peft_config, get_quantization_config

    from trl_ext.expert_iteration.sft_validation import ValidatingSFTTrainer
    from trl_ext.recipes.data import is_prompt_response, tokenize_prompt_response

    _require_model(model_args)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    if eval_dataset is None and accuracy is None and training_args.eval_strategy != "no":
        training_args.eval_strategy, training_args.eval_on_start = "no", False
    tokenizer = None
    if is_prompt_response(train_dataset):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
        train_dataset = tokenize_prompt_response(train_dataset, tokenizer)
        if eval_dataset is not None:
            eval_dataset = tokenize_prompt_response(eval_dataset, tokenizer)
    return ValidatingSFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        accuracy=accuracy,
    )


def _require_model(model_args) -> None:
    if not model_args.model_name_or_path:
        raise RecipeError("model_name_or_path is not set (recipe key or --model_name_or_path)")


def train_save_evaluate(
    trainer, training_args, script_args, dataset_name: str | None = None, checkpoint: str | os.PathLike | None = None
) -> dict[str, float] | None:
    """Train (from `checkpoint` when the preflight decided to resume; never implicitly), save, evaluate; returns the
    eval metrics, or None when a stop request ended training early (`trl_ext.recipes.run_control`: a checkpoint at
    that step, no final save: the run is not finished and `--resume true` continues it)."""
    from trl_ext.recipes.run_control import attach_run_control

    stop = attach_run_control(trainer)
    if checkpoint is not None:
        logger.info("resuming from %s", checkpoint)
    result = trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
    if stop.stopped_at is not None:
        trainer.accelerator.print(
            f"stopped on request at step {stop.stopped_at} of {trainer.state.max_steps}: checkpoint-{stop.stopped_at}"
            f" saved in {training_args.output_dir}; --resume true continues from it"
        )
        return None
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
    """A GRPO recipe end to end: parse and preflight (`trl_ext.preflight`: batches for this world size, memory,
    ports, output_dir, wandb, sources; the plan is printed) -> task data -> rewards -> AblationGRPOTrainer -> train,
    save, validate."""
    from trl_ext.rewards import get_reward_funcs

    (script_args, training_args, model_args), report = entry_preflight(task, argv)
    adapt_generation_kwargs(training_args)
    if script_args.demo_warm_start:  # the testbed's problems; its held-out set scored by a callback, not by TRL
        from trl_ext.recipes.demo_warm_start import heldout_callback, load_demo_datasets, warm_start_config
        from trl_ext.testbed.warm_start import ensure_warm_start

        # the plan's first step: build the warm start if absent
        ensure_warm_start(model_args.model_name_or_path, warm_start_config(script_args))
        train_dataset, held_out = load_demo_datasets(script_args, training_args.data_seed)
        reward_funcs = get_reward_funcs(script_args.reward_funcs, training_args)
        validation = heldout_callback(None, held_out, training_args, script_args.final_eval)
        training_args.eval_strategy, training_args.eval_on_start = "no", False
        trainer = build_grpo_trainer(script_args, training_args, model_args, reward_funcs, train_dataset, None)
        validation.tokenizer = trainer.processing_class
        trainer.add_callback(validation)
        write_run_record(trainer, training_args.output_dir, report.record)
        checkpoint = report.output.checkpoint if report.output is not None else None
        if train_save_evaluate(trainer, training_args, script_args, None, checkpoint) is None:
            return {}  # stopped on request: not finished
        last = [h for h in trainer.state.log_history if any(k.startswith("heldout/") for k in h)]
        metrics = {k: v for k, v in last[-1].items() if k != "step"} if last else {}
        if script_args.final_eval and metrics:  # eval_results.json: the study's sign that a validating run ended
            trainer.save_metrics("eval", metrics)
        return metrics
    # Data and reward names are checked before the model loads: a bad file or name fails in seconds.
    train_dataset, eval_dataset = load_grpo_datasets(task, script_args, training_args)
    reward_funcs = get_reward_funcs(script_args.reward_funcs, training_args)
    trainer = build_grpo_trainer(script_args, training_args, model_args, reward_funcs, train_dataset, eval_dataset)
    write_run_record(trainer, training_args.output_dir, report.record)
    checkpoint = report.output.checkpoint if report.output is not None else None
    return train_save_evaluate(trainer, training_args, script_args, script_args.dataset_source, checkpoint)


def run_sft_recipe(argv: Sequence[str] | None = None) -> dict[str, float]:
    """The SFT recipe end to end: parse -> output_dir / resume and wandb checks -> traces and accuracy problems ->
    ValidatingSFTTrainer -> train (loss and, with `accuracy_backend`, accuracy at every evaluation) -> save."""
    import sys

    from trl_ext.recipes.data import load_sft_datasets

    argv = list(sys.argv[1:] if argv is None else argv)
    script_args, training_args, model_args = parse_recipe_args("sft", argv)
    plan, record = sft_entry_preflight(argv, (script_args, training_args, model_args))
    # The traces and the accuracy problems are checked before the model loads: a bad file or row fails in seconds.
    train_dataset, eval_dataset = load_sft_datasets(script_args)
    accuracy = validation_accuracy(script_args, training_args)
    trainer = build_sft_trainer(training_args, model_args, train_dataset, eval_dataset, accuracy)
    write_run_record(trainer, training_args.output_dir, record)
    return train_save_evaluate(trainer, training_args, script_args, script_args.dataset_source, plan.checkpoint)
