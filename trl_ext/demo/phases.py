"""The demo's training phases: GRPO with ours (SFT, for the warm start and the control, is the testbed's
`trl_ext.testbed.sft.run_sft`), and a clock that measures each phase's training CPU seconds without its held-out
evaluations."""

from __future__ import annotations

import resource
import time
from pathlib import Path

from trl_ext.testbed.heldout import evaluate, response_stats
from trl_ext.testbed.problems import grpo_dataset
from trl_ext.testbed.sft import common_training_args, progress_printer
from trl_ext.testbed.sft import run_sft as run_testbed_sft


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
            budget, fast = cfg.max_completion_length, cfg.static_cache
            r = evaluate(model, tokenizer, held_out, 0, budget, fast)
            stats = response_stats(model, tokenizer, held_out, budget, fast) if cfg.ei else {}
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

    return [progress_printer(phase), Clock()]


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
    """The testbed's SFT (`trl_ext.testbed.sft.run_sft`) with the demo's progress lines and held-out curve.

    Returns:
        (curve points, clock) where the clock holds `train_cpu_s`, `train_wall_s` and `steps`.
    """
    curve: list[dict] = []
    clock: dict = {}
    callbacks = _callbacks(cfg, phase, held_out, tokenizer, curve, clock, wandb_run)
    run_testbed_sft(cfg, phase, model, tokenizer, labelled, out, steps, learning_rate, report_to, callbacks)
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
        **common_training_args(cfg, out, report_to),
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
        static_cache_generation=cfg.static_cache,
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
