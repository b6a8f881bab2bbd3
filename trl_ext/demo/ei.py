"""The expert-iteration arm (`--ei`): `trl_ext.expert_iteration.ExpertIterationTrainer` from GRPO's start on the same
unlabelled problems, with the same sampling, reward and CPU clock as the GRPO arm.

Per EI step: `ei_questions` unlabelled problems, `num_generations` completions each, sampled by TRL's transformers
generation at temperature 1 (as GRPO's rollouts, in calls of `grpo_batch_size` completions); the completions the
Countdown verifier marks correct (reward 1 with `require_all=True`) are kept; `ei_sft_epochs` passes of SFT over
them (token-mean NLL, batches of `sft_batch_size`, constant lr `ei_learning_rate`). GRPO learns from the same
verifier through group-normalised advantages (wrong answers pushed down too); EI learns only from what it got right.
"""

from __future__ import annotations

from pathlib import Path

from trl_ext.demo.config import DemoConfig
from trl_ext.demo.phases import _callbacks, curve_steps
from trl_ext.expert_iteration import ExpertIterationConfig, ExpertIterationTrainer
from trl_ext.testbed.heldout import evaluate
from trl_ext.testbed.problems import grpo_dataset
from trl_ext.testbed.sft import common_training_args


class _CurveEITrainer(ExpertIterationTrainer):
    """`ExpertIterationTrainer` whose validation after an EI step is the demo's held-out curve point (the clock's
    `measure`) at `curve_steps` of the EI steps, in place of TRL's `evaluate()`."""

    def __init__(self, *args, clock=None, curve_at: set[int] = frozenset(), **kwargs):
        super().__init__(*args, **kwargs)
        self._clock, self._curve_at = clock, curve_at

    def _evaluate_in_training(self) -> None:
        if self._ei_step in self._curve_at:
            self._clock.measure(self.model, self.state.global_step, ei_step=self._ei_step)
        self.model.train()


def run_ei(cfg: DemoConfig, model, tokenizer, unlabelled: list[dict], held_out: list[dict], out: Path):
    """Expert iteration on `unlabelled` from `model` (trained in place).

    Returns:
        (trainer, curve points, clock) where the clock holds `steps` (SFT steps), `ei_steps`, `train_cpu_s`,
        `train_wall_s`.
    """
    from transformers import PrinterCallback

    from trl_ext.rewards import CountdownReward

    curve: list[dict] = []
    clock: dict = {}
    callbacks = _callbacks(cfg, "ei", held_out, tokenizer, curve, clock, None, by_step=False)
    args = ExpertIterationConfig(
        **common_training_args(cfg, out, "none"),
        n_ei_steps=cfg.ei_steps,
        questions_per_step=cfg.ei_questions,
        num_generations=cfg.num_generations,
        sft_epochs=cfg.ei_sft_epochs,
        keep_min_reward=1.0,  # CountdownReward: 1 correct, 0.1 tagged but wrong
        # Rollouts in GRPO's calls (grpo_batch_size completions: 16 prompts x 8), SFT batches of sft_batch_size
        # kept completions in one micro-batch.
        generation_batch_size=cfg.grpo_batch_size,
        per_device_train_batch_size=cfg.sft_batch_size,
        gradient_accumulation_steps=1,
        learning_rate=cfg.ei_learning_rate,
        lr_scheduler_type="constant",
        adam_beta2=0.98,  # the demo's SFT
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature,
        top_p=1.0,
        top_k=0,
        eval_strategy="steps",
        eval_steps=1,  # every EI step calls `_evaluate_in_training`, which measures at the curve's EI steps
        per_device_eval_batch_size=cfg.grpo_batch_size,
        log_completions=False,
    )
    trainer = _CurveEITrainer(
        model=model,
        reward_funcs=[CountdownReward(require_all=True)],
        args=args,
        train_dataset=grpo_dataset(unlabelled),
        eval_dataset=grpo_dataset(held_out),  # never read by TRL: the curve points score the held-out set
        processing_class=tokenizer,
        callbacks=callbacks,
        clock=callbacks[1],
        curve_at=curve_steps(cfg.ei_steps, cfg.curve_points),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    clock["ei_steps"] = cfg.ei_steps
    return trainer, curve, clock


def run_ei_arm(cfg: DemoConfig, start_dir: Path, out: Path, tokenizer, unlabelled, held_out) -> dict:
    """Load the start model, run expert iteration, score and save it (`<out>/ei_model`).

    Returns:
        `{"clock", "heldout", "curve", "ei_log"}` (`ei_log`: the trainer's log entries with rollout metrics).
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(start_dir, dtype=torch.float32)
    trainer, curve, clock = run_ei(cfg, model, tokenizer, unlabelled, held_out, out / "ei")
    model = trainer.model
    heldout = evaluate(model, tokenizer, held_out, cfg.eval_samples, cfg.max_completion_length, cfg.static_cache)
    model.save_pretrained(out / "ei_model")
    tokenizer.save_pretrained(out / "ei_model")
    log = [h for h in trainer.state.log_history if "reward" in h]
    return {"clock": clock, "heldout": heldout, "curve": curve, "ei_log": log}
