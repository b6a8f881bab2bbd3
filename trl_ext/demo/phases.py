"""The demo's training phases: SFT (warm start and control) with TRL's `SFTTrainer`, GRPO with ours, and a clock
that measures each phase's training CPU seconds without its held-out evaluations."""

from __future__ import annotations

import resource
import time
from pathlib import Path

from trl_ext.demo.data import grpo_dataset, sft_dataset
from trl_ext.demo.heldout import evaluate, response_stats

# Passes over the labelled problems materialised for SFT, each drawing one of a problem's solutions afresh.
SFT_PASSES = 16


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def curve_steps(max_steps: int, points: int) -> set[int]:
    """`points` evenly spaced steps in 1..max_steps, the last one included."""
    return {round(k * max_steps / points) for k in range(1, points + 1)} - {0} if points and max_steps else set()


def _callbacks(
    cfg, phase: str, held_out: list[dict], tokenizer, curve: list[dict], clock: dict, wandb_run, by_step: bool = True
):
    """A progress printer, and a clock that records the held-out greedy curve at `curve_steps` (or, `by_step=False`,
    wherever the trainer calls `measure`) against the training CPU seconds (`clock["train_cpu_s"]`: the training
    loop's CPU time minus the held-out evaluations' own). With `cfg.ei` each point also holds the responses' entropy,
    length and sampled accuracy (`heldout.response_stats`)."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            keys = ["loss", "reward", "reward_std", "entropy", "completions/mean_length", "ei/kept", "learning_rate"]
            shown = " ".join(f"{k.split('/')[-1]}={logs[k]:.4g}" for k in keys if k in (logs or {}))
            print(f"[{phase}] step {state.global_step}/{state.max_steps} {shown}", flush=True)

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.steps = curve_steps(state.max_steps, cfg.curve_points) if by_step else set()
            self.start = (cpu_seconds(), time.perf_counter())
            self.evals = [0.0, 0.0]  # CPU and wall seconds spent on the held-out curve

        def _train_time(self) -> tuple[float, float]:
            cpu = cpu_seconds() - self.start[0] - self.evals[0]
            return cpu, time.perf_counter() - self.start[1] - self.evals[1]

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step in self.steps:
                self.measure(model, state.global_step)

        def measure(self, model, step: int, **extra) -> None:
            """One curve point of `model` after training step `step` (`extra`: more fields of the point)."""
            train_cpu, train_wall = self._train_time()
            cpu0, wall0 = cpu_seconds(), time.perf_counter()
            r = evaluate(model, tokenizer, held_out, 0, cfg.max_completion_length)
            stats = response_stats(model, tokenizer, held_out, cfg.max_completion_length) if cfg.ei else {}
            self.evals[0] += cpu_seconds() - cpu0
            self.evals[1] += time.perf_counter() - wall0
            point = {"phase": phase, "step": step, **extra, "train_cpu_s": round(train_cpu, 2)}
            point.update(train_wall_s=round(train_wall, 2), greedy_accuracy=r["greedy_accuracy"])
            point.update({f"response_{k}": v for k, v in stats.items()})
            curve.append(point)
            shown = "".join(f", response {k} {v:.3g}" for k, v in stats.items() if v is not None)
            print(
                f"[{phase}] step {step} held-out greedy accuracy {r['greedy_accuracy']:.3f}{shown} "
                f"(training CPU {train_cpu:.0f} s)",
                flush=True,
            )
            if wandb_run is not None:
                logged = {f"{phase}/heldout_greedy_accuracy": r["greedy_accuracy"], f"{phase}/cpu_s": train_cpu}
                wandb_run.log({**logged, **{f"{phase}/response_{k}": v for k, v in stats.items() if v is not None}})

        def on_train_end(self, args, state, control, **kwargs):
            train_cpu, train_wall = self._train_time()
            clock.update(
                steps=state.global_step,
                train_cpu_s=round(train_cpu, 2),
                train_wall_s=round(train_wall, 2),
                curve_cpu_s=round(self.evals[0], 2),
            )

    return [Progress(), Clock()]


def _common_training_args(cfg, out: Path, report_to: str) -> dict:
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
    held_out: list[dict],
    out: Path,
    steps: int,
    learning_rate: float,
    report_to: str,
    wandb_run=None,
) -> tuple[list[dict], dict]:
    """SFT with TRL's `SFTTrainer` on the labelled problems: completion-only cross-entropy, linear warmup then
    linear decay over `steps`. The warm start and the control both run this, each with its own schedule.

    Returns:
        (curve points, clock) where the clock holds `train_cpu_s`, `train_wall_s` and `steps`.
    """
    from transformers import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    curve: list[dict] = []
    clock: dict = {}
    args = SFTConfig(
        **_common_training_args(cfg, out, report_to),
        max_steps=steps,
        per_device_train_batch_size=cfg.sft_batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=min(cfg.sft_warmup_steps, steps),
        adam_beta2=0.98,
        completion_only_loss=True,
        packing=False,
        max_length=64,
    )
    rows_seed = cfg.seed if phase == "sft" else cfg.seed + 7919  # the control draws its own solution order
    # SFTTrainer tokenizes every row up front (39 CPU s for 1,400 steps x 128 rows) and cycles the dataset for as
    # many epochs as `max_steps` needs, so SFT_PASSES draws of a solution per problem are enough rows.
    num_rows = min(steps * cfg.sft_batch_size, SFT_PASSES * len(labelled))
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=sft_dataset(labelled, num_rows, cfg.sft_all_solutions, rows_seed),
        processing_class=tokenizer,
        callbacks=_callbacks(cfg, phase, held_out, tokenizer, curve, clock, wandb_run),
    )
    trainer.remove_callback(PrinterCallback)  # our Progress lines instead of every raw log dict
    trainer.train()
    return curve, clock


def run_grpo(
    cfg, model, tokenizer, unlabelled: list[dict], held_out: list[dict], out: Path, report_to: str, wandb_run=None
):
    """GRPO with `AblationGRPOTrainer` on the unlabelled problems: on-policy, one optimizer step per rollout batch,
    no KL term, the verifier's reward only.

    Per step: `grpo_batch_size / num_generations` prompts, `num_generations` completions each; advantages
    A_i = (r_i - mean(r_group)) / (std(r_group) + eps); loss = mean over sequences of the masked token mean of
    -min(rho * A, clip(rho, 1 - epsilon, 1 + epsilon) * A).

    Returns:
        (trainer, curve points, clock).
    """
    from transformers import PrinterCallback

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer
    from trl_ext.rewards import CountdownReward

    curve: list[dict] = []
    clock: dict = {}
    args = AblationGRPOConfig(
        **_common_training_args(cfg, out, report_to),
        # The courses' vocabulary; by default on-policy: rollout batch = train batch = grpo_batch_size completions,
        # one epoch, so every step generates grpo_batch_size / group_size prompts x group_size completions.
        group_size=cfg.num_generations,
        rollout_batch_size=cfg.rollout_batch_size or cfg.grpo_batch_size,
        train_batch_size=cfg.grpo_batch_size,
        epochs_per_rollout_batch=cfg.epochs_per_rollout,
        # GRPO's three axis values, stated rather than left to defaults (AblationGRPOConfig's defaults are TRL's).
        advantage_type="group_mean_std",
        advantage_eps=1e-6,  # the courses' eps (TRL's is 1e-4)
        pg_loss_type="grpo_clip",
        length_normalization="masked_mean",
        max_steps=cfg.grpo_steps,
        max_completion_length=cfg.max_completion_length,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler_type,
        warmup_steps=cfg.grpo_warmup_steps,
        adam_beta2=0.99,
        beta=0.0,
        epsilon=cfg.epsilon,
        temperature=cfg.temperature,
        skip_zero_advantage_completions=cfg.skip_zero_advantage,
        dynamic_sampling=cfg.dynamic_sampling,
        top_p=1.0,
        top_k=0,
        log_completions=False,
    )
    trainer = AblationGRPOTrainer(
        model=model,
        reward_funcs=[CountdownReward(require_all=True)],
        args=args,
        train_dataset=grpo_dataset(unlabelled),
        processing_class=tokenizer,
        callbacks=_callbacks(cfg, "grpo", held_out, tokenizer, curve, clock, wandb_run),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trainer, curve, clock
