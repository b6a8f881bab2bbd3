"""Trainer runs of the GPU check kit (benchmarks/gpu_check.py): a random-init model built where it trains, one trainer
(ours or stock `trl.GRPOTrainer`) trained on fixed completions through TRL's `rollout_func`
(benchmarks/_fixed_rollouts.py: no generation, so a timed step is the training step), and what each step cost; a
recipe parsed for such a run, and the preflight's memory estimate of the same setup.

Per step the timer records the wall time (CUDA synchronised at both ends), the `rollout_func` calls it made (one per
step, on-policy) and the model's `generate` calls (none: the counter wraps the model's own `generate`). A run still
going at the budget's deadline stops after its current step (`stopped_at_budget`).
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from pathlib import Path

from _fixed_rollouts import PF_COMPLETION, PF_PROMPT_TOKENS, FixedRollouts, id_reward

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "qwen3_tokenizer"
DATA = ROOT / "tests" / "data" / "countdown" / "dev.parquet"
GSM8K = ROOT / "tests" / "data" / "gsm8k" / "test.jsonl"
SMOKE_PROMPT_TOKENS = (4, 8)
SMOKE_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "intermediate_size": 128}  # fmt: skip


@functools.cache
def load_tokenizer():
    """The Qwen3 tokenizer (tests/data/qwen3_tokenizer), loaded once: each load builds its 151,669-entry BPE."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER))


def build_model(name: str, dtype: str, smoke: bool, attention: str | None = None):
    """A random-init causal LM with `name`'s architecture (`trl_ext.preflight.KNOWN_CONFIGS`, shrunk in smoke mode)
    and the Qwen3 tokenizer's special tokens, built on the GPU when there is one (seeded: every run starts from the
    same weights, and no checkpoint is written or read). `model.generate_calls` counts its `generate` calls."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trl_ext.preflight import KNOWN_CONFIGS

    fields = dict(KNOWN_CONFIGS[name])
    if smoke:
        fields.update(SMOKE_CONFIG)
    tokenizer = load_tokenizer()
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), attn_implementation=attention)
    model.generate_calls = 0
    generate = model.generate

    def counted_generate(*args, **kwargs):
        model.generate_calls += 1
        return generate(*args, **kwargs)

    model.generate = counted_generate
    return model


def completions_within(limit: int, all_at_limit: bool = False) -> dict:
    """bench_trainer's completion lengths clipped to `limit` (or every completion at `limit`)."""
    if all_at_limit:
        return dict(median=limit, sigma=0.0, low=limit, high=limit)
    return dict(PF_COMPLETION, low=min(PF_COMPLETION["low"], limit), high=limit)


def recipe_args(recipe: Path, task: str, model: str, output_dir: str, args, steps: int, extra: list[str]):
    """The recipe parsed by the recipe parser, shrunk to `args`' sizes, no generation backend, logging or
    validation; returns the parsed triple and the command line (for the preflight's view of the same run)."""
    from trl_ext.recipes import parse_recipe_args

    data = str(GSM8K if task == "gsm8k" else DATA)
    argv = ["--config", str(recipe), "--model_name_or_path", model, "--output_dir", output_dir]
    argv += ["--dataset_source", data, "--dataset_split", "train", "--eval_split", "none", "--eval_strategy", "no"]
    argv += ["--final_eval", "false", "--use_vllm", "false", "--report_to", "none", "--save_strategy", "no"]
    argv += ["--n_grpo_steps", str(steps), "--rollout_log_steps", "0", "--logging_steps", "1"]
    argv += ["--log_completions", "false", "--disable_tqdm", "true", *extra]
    if args.smoke:
        argv += ["--use_cpu", "true", "--max_completion_length", "8"]
    return parse_recipe_args(task, argv), argv


def training_estimate(task: str, parsed, argv: list[str], recipe: Path, name: str, gpu_gib: float) -> dict:
    """The preflight's estimate of the same setup for the full-size model (the smoke run's tiny one is not
    compared): every phase, and the training phases' peak that a run on fixed completions can reach."""
    from trl_ext.preflight import RunContext, estimate_memory, load_model_shape, plan_batches, training_setup
    from trl_ext.recipes import stated_values

    layout = plan_batches(stated_values(recipe, argv), 1)
    setup = training_setup(task, *parsed, layout, RunContext(gpu_memory_gib=gpu_gib, check_packages=False))
    estimate = estimate_memory(load_model_shape(name)[0], setup)
    phases = {k: estimate.phase_total(k) / 2**30 for k in estimate.phases}
    training = max(phases["train"], phases["optimizer step"])
    return {
        "generator": setup.generator,
        "estimate_phases_gib": phases,
        "estimate_peak_gib": estimate.peak_gib,
        "estimate_training_gib": training,  # what torch.cuda.max_memory_allocated should come close to
        "estimate_training_peak_gib": training + estimate.overhead / 2**30,  # plus the runtime allowance
    }


def recipe_run(
    kind: str, recipe: Path, task: str, name: str, dtype: str, args, workdir: Path, steps: int, extra: list[str],
    prompt_tokens: tuple[int, int] = PF_PROMPT_TOKENS, all_at_limit: bool = False,
) -> dict:  # fmt: skip
    """One trainer (`ours` / `stock`) on `recipe` (`steps`, `extra` flags) with fixed completions: prompts of
    `prompt_tokens`, completions of bench_trainer's lengths within the recipe's limit (or all at it)."""
    from trl_ext.recipes import adapt_generation_kwargs, load_grpo_datasets

    parsed, _ = recipe_args(recipe, task, name, str(workdir / f"{task}_{kind}"), args, steps, extra)
    script, config, model_args = parsed
    adapt_generation_kwargs(config)
    train, _ = load_grpo_datasets(task, script, config)
    prompts = SMOKE_PROMPT_TOKENS if args.smoke else prompt_tokens
    completion = completions_within(config.max_completion_length, all_at_limit)
    rollouts = FixedRollouts(len(load_tokenizer()), prompt_tokens=prompts, completion=completion)
    model = functools.partial(build_model, name, dtype, args.smoke, model_args.attn_implementation)
    return train_timed(kind, config, model, train, rollouts, args.deadline)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _step_timer(model, rollouts, deadline: float | None):
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time, `rollout_func` calls and `generate` calls of each optimizer step; stops at `deadline`."""

        def __init__(self):
            self.times: list[float] = []
            self.rollout_calls: list[int] = []
            self.generate_calls: list[int] = []
            self.stopped = False
            self._start = self._rollouts = self._generates = 0

        def on_step_begin(self, args, state, control, **kwargs):
            _sync()
            self._rollouts, self._generates = rollouts.calls, model.generate_calls
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync()
            self.times.append(time.perf_counter() - self._start)
            self.rollout_calls.append(rollouts.calls - self._rollouts)
            self.generate_calls.append(model.generate_calls - self._generates)
            if deadline is not None and time.monotonic() + self.times[-1] > deadline:
                self.stopped = control.should_training_stop = True

    return StepTimer()


def stock_config(config):
    """`trl.GRPOConfig` with the TRL fields of an `AblationGRPOConfig` (the recipe's loss_type / scale_rewards are
    already their TRL equivalents)."""
    from trl import GRPOConfig

    names = GRPOConfig.__dataclass_fields__
    fields = {k: getattr(config, k) for k in names if names[k].init and hasattr(config, k)}
    fields["steps_per_generation"] = None  # derived from generation_batch_size; TRL refuses both set
    return GRPOConfig(**fields)


def train_timed(kind: str, config, make_model, dataset, rollouts, deadline: float | None) -> dict:
    """Train `make_model()` with ours (`kind` "ours...") or stock TRL (`kind` "stock") on `config` and the fixed
    completions `rollouts`; the peak GPU memory (model included), per-step times and the first step's logged
    loss / grad norm / entropy."""
    import torch
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from trl_ext import AblationGRPOTrainer

    if kind == "stock":
        config, trainer_cls = stock_config(config), GRPOTrainer
    else:
        trainer_cls = AblationGRPOTrainer
    config.model_init_kwargs = None  # the model is built here, not loaded
    free_memory()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    model = make_model()
    trainer = trainer_cls(
        model, id_reward, args=config, train_dataset=dataset, processing_class=load_tokenizer(), rollout_func=rollouts
    )
    timer = _step_timer(model, rollouts, deadline)
    trainer.add_callback(timer)
    trainer.remove_callback(PrinterCallback)  # every step's log dict would crowd the run's output
    trainer.train()
    first = next((e for e in trainer.state.log_history if "loss" in e), {})
    result = {
        "trainer": kind,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "step_s": timer.times,
        "median_step_s": statistics.median(timer.times[1:] or timer.times),
        "step_rollout_calls": timer.rollout_calls,
        "step_generate_calls": timer.generate_calls,
        "rollout_s": rollouts.seconds,
        "generate_calls": model.generate_calls,
        "stopped_at_budget": timer.stopped,
        **{f"first_{key}": first.get(key) for key in ("loss", "grad_norm", "entropy")},
    }
    del trainer, model, timer
    free_memory()
    return result


def free_memory() -> None:
    """Collect the last run's objects and return the allocator's cached blocks (a memory cap set stays)."""
    import torch

    if torch.cuda.is_available():  # on the CPU (smoke) the models are tiny and a full collection costs ~0.5 s
        gc.collect()
        torch.cuda.empty_cache()


def cleanup() -> None:
    """After a part: free its memory and lift any memory cap it set."""
    import torch

    free_memory()
    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(1.0)
