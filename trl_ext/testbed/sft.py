"""SFT on the testbed's labelled problems with TRL's `SFTTrainer`: the warm start, and the demo's SFT-only control."""

from __future__ import annotations

from pathlib import Path

from trl_ext.testbed.config import model_positions
from trl_ext.testbed.problems import sft_dataset

# Passes over the labelled problems materialised for SFT, each drawing one of a problem's solutions afresh.
SFT_PASSES = 16


def progress_printer(phase: str):
    """A `TrainerCallback` printing `[phase] step N/M loss=... reward=...` at each log (in place of transformers'
    printer of every raw log dict)."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            keys = ["loss", "reward", "reward_std", "entropy", "completions/mean_length", "ei/kept", "learning_rate"]
            shown = " ".join(f"{k.split('/')[-1]}={logs[k]:.4g}" for k in keys if k in (logs or {}))
            print(f"[{phase}] step {state.global_step}/{state.max_steps} {shown}", flush=True)

    return Progress()


def common_training_args(cfg, out: Path, report_to: str) -> dict:
    """TrainingArguments shared by SFT and GRPO: float32 on the CPU, no checkpoints, no gradient checkpointing."""
    return dict(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=25,
        save_strategy="no",
        report_to=report_to,
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def run_sft(
    cfg,
    phase: str,
    model,
    tokenizer,
    labelled: list[dict],
    out: Path,
    steps: int,
    learning_rate: float,
    report_to: str,
    callbacks: list | None = None,
):
    """SFT with TRL's `SFTTrainer` on the labelled problems: completion-only cross-entropy, linear warmup then
    linear decay over `steps`, `model` trained in place. The warm start (`phase` "sft") and the demo's control
    (another `phase`, which draws its own solution order) both run this, each with its own schedule; `callbacks`
    (default: the progress lines of `progress_printer`) replace transformers' printer.

    Args:
        cfg: a `TestbedConfig` (seed, `sft_batch_size`, `sft_warmup_steps`, `sft_all_solutions`).

    Returns:
        The trainer, after training.
    """
    from transformers import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        **common_training_args(cfg, out, report_to),
        max_steps=steps,
        per_device_train_batch_size=cfg.sft_batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=min(cfg.sft_warmup_steps, steps),
        adam_beta2=0.98,
        completion_only_loss=True,
        packing=False,
        max_length=model_positions(cfg),
    )
    rows_seed = cfg.seed if phase == "sft" else cfg.seed + 7919  # the control draws its own solution order
    # SFTTrainer tokenizes every row up front (39 CPU s for 1,400 steps x 128 rows) and cycles the dataset for as
    # many epochs as `max_steps` needs, so SFT_PASSES draws of a solution per problem are enough rows.
    num_rows = min(steps * cfg.sft_batch_size, SFT_PASSES * len(labelled))
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=sft_dataset(
            labelled, num_rows, cfg.sft_all_solutions, rows_seed, cfg.working_dead_ends if cfg.working else None
        ),
        processing_class=tokenizer,
        callbacks=[progress_printer(phase)] if callbacks is None else callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # the progress lines instead of every raw log dict
    trainer.train()
    return trainer
