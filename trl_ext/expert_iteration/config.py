"""`ExpertIterationConfig`: TRL's `GRPOConfig` (generation, vLLM, validation, logging) plus the fields of expert
iteration.

CS336 A5's expert iteration (EI), the vocabulary of its fields:

    for ei_step in 1 .. n_ei_steps:
        D_b   = questions_per_step questions from the training set
        roll  = num_generations (G) completions per question, sampled from the current policy
        D_sft = the completions whose reward is >= keep_min_reward ("marked correct")
        SFT on D_sft for sft_epochs epochs, per_device_train_batch_size x gradient_accumulation_steps per step

Generation, rewards and validation are TRL's GRPO settings (`temperature`, `max_completion_length`,
`generation_kwargs`, `use_vllm` / `vllm_mode`, `eval_strategy`, `per_device_eval_batch_size`,
`num_generations_eval`, ...), so an EI run samples and validates exactly as a GRPO run of the same settings. The
GRPO loss fields do not apply: setting one to anything but TRL's default is an error, as is a field whose unit EI
redefines (`max_steps`, `num_iterations`) or cannot honour (a learning-rate schedule that needs the total number of
steps: EI's SFT steps depend on how many completions are kept).

Cadence, in EI steps: validation after every `eval_steps` EI steps (a float < 1 is a fraction of `n_ei_steps`,
as HF reads it of `max_steps`), checkpoints every `save_steps` EI steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from trl_ext.preflight.trl_defaults import trl_default

# GRPO loss settings EI does not use; each must keep TRL's default (which is what "not used" means for TRL too).
GRPO_ONLY_FIELDS = (
    "loss_type",
    "scale_rewards",
    "epsilon",
    "epsilon_high",
    "delta",
    "beta",
    "importance_sampling_level",
    "top_entropy_quantile",
    "entropy_coef",
    "use_adaptive_entropy",
    "off_policy_mask_threshold",
    "multi_objective_aggregation",
    "use_liger_kernel",
)
# EI's SFT takes a number of steps that depends on the kept completions, so only schedules that need no total work.
CONSTANT_SCHEDULES = ("constant", "constant_with_warmup")
STEP_STRATEGIES = ("no", "steps")


def _value(obj):
    return getattr(obj, "value", obj)


def every_n_ei_steps(value: float | int | None, n_ei_steps: int, name: str) -> int:
    """An `eval_steps` / `save_steps` value read in EI steps: an int as is, a float in (0, 1) as a fraction of
    `n_ei_steps` (rounded up, at least 1)."""
    if value is None:
        return 1
    if 0 < value < 1:
        return max(1, math.ceil(value * n_ei_steps))
    if value < 1 or value != int(value):
        raise ValueError(f"{name}={value}: give a whole number of EI steps or a fraction of n_ei_steps in (0, 1)")
    return int(value)


@dataclass
class ExpertIterationConfig(GRPOConfig):
    r"""`trl.GRPOConfig` plus the expert-iteration fields (module docstring: the algorithm and the field rules).

    Parameters:
        n_ei_steps: EI steps (sample, filter, SFT).
        questions_per_step: questions drawn per EI step (CS336's |D_b|), without replacement from a seeded
            permutation of the training set that is reshuffled when used up.
        sft_epochs: passes over the kept completions per EI step.
        keep_min_reward: a completion is kept when its reward (TRL's weighted sum over `reward_funcs`) is at least
            this; 1.0 is every trl_ext reward's value for a correct answer.
        vllm_importance_sampling_correction: TRL's field, redeclared with default False: EI has no importance
            ratio, and True would make TRL score every rollout with the policy for nothing.
        lr_scheduler_type: HF's field, redeclared with default "constant" (HF: "linear", which needs the total).
    """

    n_ei_steps: int = field(default=5, metadata={"help": "Expert-iteration steps (sample, keep the correct, SFT)."})
    questions_per_step: int = field(
        default=512, metadata={"help": "Questions sampled per EI step (CS336 A5's |D_b|: 512, 1024 or 2048)."}
    )
    sft_epochs: int = field(default=1, metadata={"help": "SFT epochs over the kept completions of each EI step."})
    keep_min_reward: float = field(
        default=1.0,
        metadata={
            "help": "Keep (train on) a completion when its reward, the weighted sum over reward_funcs, is >= this. "
            "1.0: the trl_ext rewards' value for a correct answer (a Countdown format-only 0.1 is not kept)."
        },
    )
    vllm_importance_sampling_correction: bool = field(
        default=False,
        metadata={"help": "TRL's GRPO field; expert iteration has no importance ratio, so it must stay false."},
    )
    lr_scheduler_type: str = field(
        default="constant",
        metadata={
            "help": f"HF's field, redeclared with default 'constant': one of {list(CONSTANT_SCHEDULES)} (EI's number "
            "of SFT steps is not known in advance)."
        },
    )

    def __post_init__(self):
        for name in ("n_ei_steps", "questions_per_step", "sft_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.vllm_importance_sampling_correction:
            raise ValueError(
                "vllm_importance_sampling_correction: expert iteration trains SFT on its samples, with no importance "
                "ratio; set it to false"
            )
        for name in GRPO_ONLY_FIELDS:
            if getattr(self, name) != trl_default(name):
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is a GRPO loss setting; expert iteration trains with SFT on the "
                    f"kept completions and does not use it (remove it, or leave TRL's default {trl_default(name)!r})"
                )
        if self.max_steps is not None and self.max_steps > 0:
            raise ValueError(
                f"max_steps={self.max_steps}: an expert-iteration run is n_ei_steps long (its SFT steps depend on how "
                "many completions are kept); set n_ei_steps instead"
            )
        if self.num_iterations != 1:
            raise ValueError(f"num_iterations={self.num_iterations}: expert iteration's epochs are sft_epochs")
        schedule = str(_value(self.lr_scheduler_type))
        if schedule not in CONSTANT_SCHEDULES:
            raise ValueError(
                f"lr_scheduler_type={schedule!r}: the number of SFT steps of an expert-iteration run is not known in "
                f"advance (it depends on the kept completions); use one of {list(CONSTANT_SCHEDULES)}"
            )
        if self.warmup_steps and (0 < self.warmup_steps < 1 or self.warmup_steps != int(self.warmup_steps)):
            raise ValueError(
                f"warmup_steps={self.warmup_steps}: a fraction of the total needs the total; give whole SFT steps"
            )
        rollouts = self.questions_per_step * self.num_generations
        if self.generation_batch_size is None and self.steps_per_generation is None:
            self.generation_batch_size = rollouts  # one generation call per EI step (vLLM schedules it)
        if self.generation_batch_size is not None and rollouts % self.generation_batch_size:
            raise ValueError(
                f"generation_batch_size={self.generation_batch_size} must divide questions_per_step x num_generations "
                f"= {rollouts} (the EI step's rollouts are generated in calls of that many completions)"
            )
        if self.generation_batch_size is not None and self.generation_batch_size % self.per_device_train_batch_size:
            raise ValueError(
                f"generation_batch_size={self.generation_batch_size} (default questions_per_step x num_generations) "
                f"must be a multiple of per_device_train_batch_size={self.per_device_train_batch_size}, as TRL "
                "requires"
            )
        if self.logging_steps < 1 or self.logging_steps != int(self.logging_steps):
            raise ValueError(f"logging_steps={self.logging_steps}: give a whole number of SFT steps")
        for name in ("eval_strategy", "save_strategy"):
            strategy = str(_value(getattr(self, name)))
            if strategy not in STEP_STRATEGIES:
                raise ValueError(f"{name}={strategy!r}: expert iteration counts in EI steps; use 'steps' or 'no'")
        super().__post_init__()
        if self.eval_strategy != "no":
            every_n_ei_steps(self.eval_steps, self.n_ei_steps, "eval_steps")
        if self.save_strategy != "no":
            every_n_ei_steps(self.save_steps, self.n_ei_steps, "save_steps")

    @property
    def sft_batch_size(self) -> int:
        """Completions per SFT optimizer step (one process): `per_device_train_batch_size x
        gradient_accumulation_steps`."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def rollouts_per_step(self) -> int:
        return self.questions_per_step * self.num_generations
