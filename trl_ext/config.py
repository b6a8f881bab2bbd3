"""`AblationGRPOConfig`: TRL's `GRPOConfig` plus the three ablation axes and the seeds' batch vocabulary.

The axes (choices are the keys of the `trl_ext.objectives` registries, so the docs cannot drift from the code):
advantage (`pg_loss_type == "no_baseline"` -> raw rewards; otherwise group mean-centred, divided by
`std + advantage_eps` when `use_std_normalization`), per-token loss (`pg_loss_type`) and reduction
(`length_normalization`, `normalize_constant`).

TRL's own `loss_type` / `scale_rewards` are derived from ours (`masked_mean` -> `"grpo"`, `masked_normalize` ->
`"dr_grpo"`; std on -> `"group"`, off -> `"none"`) so TRL-side code that reads them behaves; an explicit value that
contradicts ours is an error. A dataclass cannot tell an explicit value from its default, so "explicit" means
"different from TRL's default" here (for example `loss_type="dapo"`, TRL's default, is taken as unset).

Seed batch vocabulary -> TRL (world size W: `$WORLD_SIZE`, set by `torchrun` / `accelerate launch`, else 1;
the trainer re-checks it against `accelerator.num_processes`):

    group_size                -> num_generations
    rollout_batch_size        -> generation_batch_size                  (completions per rollout)
    train_batch_size          =  per_device_train_batch_size * gradient_accumulation_steps * W
    epochs_per_rollout_batch  -> num_iterations
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from trl import GRPOConfig

from trl_ext.objectives import LENGTH_NORMALIZATIONS, PG_LOSS_TYPES
from trl_ext.sampling import check_dynamic_sampling_config

# TRL loss_type whose own reduction equals ours; set on the config so TRL code keyed on loss_type stays coherent.
_TRL_LOSS_TYPE = {"masked_mean": "grpo", "masked_normalize": "dr_grpo"}
_SCALE_REWARDS_ALIASES = {True: "group", False: "none", "true": "group", "false": "none"}


def _trl_default(name: str):
    return next(f.default for f in fields(GRPOConfig) if f.name == name)


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass
class AblationGRPOConfig(GRPOConfig):
    r"""`trl.GRPOConfig` plus the seeds' ablation axes and batch vocabulary (module docstring: the mapping).

    Parameters:
        pg_loss_type: per-token loss, one of `trl_ext.objectives.PG_LOSS_TYPES`.
        use_std_normalization: divide group-centred rewards by the group std (+ `advantage_eps`).
        advantage_eps: the epsilon in `A = (r - mean_g) / (std_g + eps)` (TRL hard-codes 1e-4; seeds use 1e-6).
        length_normalization: reduction over tokens, one of `trl_ext.objectives.LENGTH_NORMALIZATIONS`.
        normalize_constant: divisor of `masked_normalize` (default: `max_completion_length`).
        group_size, rollout_batch_size, train_batch_size, epochs_per_rollout_batch: the seeds' batch vocabulary,
            optional, mapped onto TRL's fields.
        skip_zero_advantage_completions: leave completions with advantage exactly 0 out of the loss's forward and
            backward (same loss and gradient, less compute; see `AblationGRPOTrainer`).

    `train_batch_size` replaces HF's read-only `TrainingArguments.train_batch_size` property (per-device batch x
    n_gpu) on this class: here it is the seeds' completions per optimizer step; `AblationGRPOTrainer` resets
    Trainer's per-device `_train_batch_size` accordingly.
    """

    pg_loss_type: str = field(
        default="grpo_clip",
        metadata={
            "help": f"Per-token policy-gradient loss. One of: {', '.join(PG_LOSS_TYPES)}. `no_baseline` uses the raw "
            "rewards as advantages; the others use group-normalised advantages.",
            "choices": list(PG_LOSS_TYPES),
        },
    )
    use_std_normalization: bool = field(
        default=True,
        metadata={"help": "Divide the group mean-centred rewards by the group std (+ advantage_eps)."},
    )
    advantage_eps: float = field(
        default=1e-6,
        metadata={"help": "Epsilon added to the group std: A = (r - mean) / (std + advantage_eps). TRL uses 1e-4."},
    )
    length_normalization: str = field(
        default="masked_mean",
        metadata={
            "help": f"Reduction of the per-token loss. One of: {', '.join(LENGTH_NORMALIZATIONS)}. `masked_mean`: "
            "mean over each completion's tokens, then over the batch (GRPO); `masked_normalize`: sum over tokens / "
            "normalize_constant, then batch mean (Dr. GRPO).",
            "choices": list(LENGTH_NORMALIZATIONS),
        },
    )
    normalize_constant: float | None = field(
        default=None,
        metadata={"help": "Divisor of the `masked_normalize` reduction. Default: max_completion_length."},
    )
    group_size: int | None = field(
        default=None,
        metadata={"help": "Seed name for completions per prompt; sets num_generations."},
    )
    rollout_batch_size: int | None = field(
        default=None,
        metadata={"help": "Seed name for completions per rollout (generation) batch; sets generation_batch_size."},
    )
    train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Seed name for completions per optimizer step; sets per_device_train_batch_size = "
            "train_batch_size / (gradient_accumulation_steps * world_size)."
        },
    )
    epochs_per_rollout_batch: int | None = field(
        default=None,
        metadata={"help": "Seed name for passes over each rollout batch; sets num_iterations."},
    )
    skip_zero_advantage_completions: bool = field(
        default=False,
        metadata={
            "help": "Leave completions whose advantage is exactly 0 (every member of a group whose rewards are all "
            "equal, under a baseline) out of the loss's forward and backward. They add exactly 0 to the loss and "
            "its gradient, so both are unchanged and a step saves about that share of the training compute; "
            "`entropy` and `clip_ratio/*` are then logged over the trained completions only. Has no effect with a "
            "MoE router aux loss or multimodal inputs."
        },
    )

    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO dynamic sampling: drop the groups whose rewards are all equal and generate more prompts "
            "until the batch is full of groups with varied rewards or max_generation_batches batches were "
            "generated (then equal-reward groups fill the rest). See docs/dynamic_sampling.md."
        },
    )
    max_generation_batches: int | None = field(
        default=None,
        metadata={
            "help": "With dynamic_sampling: at most this many generation batches per rollout step (default 4). "
            "An error without dynamic_sampling."
        },
    )

    def __post_init__(self):
        self._check_axes()
        self._reject_unsupported()
        self._derive_trl_loss_fields()
        self._map_seed_batch_fields()
        # GRPOConfig.__post_init__ derives generation_batch_size / steps_per_generation from the fields set above.
        super().__post_init__()
        check_dynamic_sampling_config(self)

    def _check_axes(self):
        if self.pg_loss_type not in PG_LOSS_TYPES:
            raise ValueError(f"pg_loss_type={self.pg_loss_type!r} is unknown; choose one of {list(PG_LOSS_TYPES)}")
        if self.length_normalization not in LENGTH_NORMALIZATIONS:
            raise ValueError(
                f"length_normalization={self.length_normalization!r} is unknown; "
                f"choose one of {list(LENGTH_NORMALIZATIONS)}"
            )
        if not self.advantage_eps >= 0:
            raise ValueError(f"advantage_eps={self.advantage_eps} must be >= 0")
        if self.normalize_constant is None:
            self.normalize_constant = float(self.max_completion_length)
        if not self.normalize_constant > 0:
            raise ValueError(f"normalize_constant={self.normalize_constant} must be > 0")

    def _reject_unsupported(self):
        """TRL options that change the loss in ways the ablation axes do not model: refuse rather than ignore."""
        unsupported = {
            "beta": (self.beta != 0.0, "the KL penalty is not one of the ablation axes; set beta=0.0"),
            "delta": (self.delta is not None, "two-sided clipping is not supported; unset delta"),
            "importance_sampling_level": (
                self.importance_sampling_level != "token",
                "ratios are per token in the seeds' losses; set importance_sampling_level='token'",
            ),
            "top_entropy_quantile": (
                self.top_entropy_quantile != 1.0,
                "entropy masking is not supported; set top_entropy_quantile=1.0",
            ),
            "off_policy_mask_threshold": (
                self.off_policy_mask_threshold is not None,
                "off-policy sequence masking is not supported; unset off_policy_mask_threshold",
            ),
            "entropy_coef": (
                self.entropy_coef != 0.0 or self.use_adaptive_entropy,
                "the entropy bonus is not supported; set entropy_coef=0.0 and use_adaptive_entropy=False",
            ),
            "multi_objective_aggregation": (
                self.multi_objective_aggregation != "sum_then_normalize",
                "advantages are computed from the weighted sum of rewards; set "
                "multi_objective_aggregation='sum_then_normalize'",
            ),
        }
        for name, (bad, why) in unsupported.items():
            if bad:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported by AblationGRPOTrainer: {why}")

    def _derive_trl_loss_fields(self):
        loss_type = _TRL_LOSS_TYPE[self.length_normalization]
        if self.loss_type != _trl_default("loss_type") and self.loss_type != loss_type:
            raise ValueError(
                f"loss_type={self.loss_type!r} contradicts length_normalization={self.length_normalization!r} "
                f"(which implies loss_type={loss_type!r}); choose the reduction with length_normalization and "
                "leave loss_type unset"
            )
        self.loss_type = loss_type
        scale = "group" if self.use_std_normalization else "none"
        given = _SCALE_REWARDS_ALIASES.get(self.scale_rewards, self.scale_rewards)
        if given != _trl_default("scale_rewards") and given != scale:
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} contradicts use_std_normalization={self.use_std_normalization} "
                f"(which implies scale_rewards={scale!r}); choose with use_std_normalization and leave scale_rewards "
                "unset"
            )
        self.scale_rewards = scale

    def _set_trl(self, seed_name: str, trl_name: str, value: int):
        """Set TRL field `trl_name` from seed field `seed_name`, unless the user set it to something else."""
        current = getattr(self, trl_name)
        if current != _trl_default(trl_name) and current != value:
            raise ValueError(
                f"{seed_name}={getattr(self, seed_name)} implies {trl_name}={value}, but {trl_name}={current} was "
                f"set explicitly; set only one of them"
            )
        setattr(self, trl_name, value)

    def _map_seed_batch_fields(self):
        seed = {
            "group_size": self.group_size,
            "rollout_batch_size": self.rollout_batch_size,
            "train_batch_size": self.train_batch_size,
            "epochs_per_rollout_batch": self.epochs_per_rollout_batch,
        }
        for name, value in seed.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if all(value is None for value in seed.values()):
            return
        ga, world = self.gradient_accumulation_steps, _world_size()
        group = self.group_size or self.num_generations
        train = self.train_batch_size or self.per_device_train_batch_size * ga * world
        if self.rollout_batch_size is not None:
            rollout = self.rollout_batch_size
        elif self.generation_batch_size is not None:
            rollout = self.generation_batch_size
        elif self.steps_per_generation is not None:
            rollout = self.steps_per_generation * (train // ga)
        else:
            rollout = train

        # The seeds' sanity checks (CS336 A5 `train_loop`), in seed vocabulary.
        if self.train_batch_size is not None and train % ga != 0:
            raise ValueError(
                f"train_batch_size={train} must be divisible by gradient_accumulation_steps={ga}; change one of them"
            )
        if self.train_batch_size is not None and train % (ga * world) != 0:
            raise ValueError(
                f"train_batch_size={train} must be divisible by gradient_accumulation_steps * world_size = "
                f"{ga} * {world}; change train_batch_size or gradient_accumulation_steps"
            )
        if rollout % group != 0:
            raise ValueError(
                f"rollout_batch_size={rollout} must be divisible by group_size={group} (whole groups per rollout); "
                "change one of them"
            )
        if train < group:
            raise ValueError(
                f"train_batch_size={train} must be >= group_size={group}; raise train_batch_size or lower group_size"
            )
        if rollout % train != 0:
            raise ValueError(
                f"rollout_batch_size={rollout} must be a multiple of train_batch_size={train} (whole optimizer steps "
                "per rollout); change one of them"
            )

        if self.group_size is not None:
            self._set_trl("group_size", "num_generations", self.group_size)
        if self.epochs_per_rollout_batch is not None:
            self._set_trl("epochs_per_rollout_batch", "num_iterations", self.epochs_per_rollout_batch)
        if self.train_batch_size is not None:
            self._set_trl("train_batch_size", "per_device_train_batch_size", train // (ga * world))
        if self.rollout_batch_size is not None:
            if self.steps_per_generation is not None:
                implied = self.steps_per_generation * self.per_device_train_batch_size * world
                if implied != rollout:
                    raise ValueError(
                        f"rollout_batch_size={rollout} contradicts steps_per_generation={self.steps_per_generation} "
                        f"(which implies {implied} completions per rollout); set only one of them"
                    )
                # TRL refuses both set; generation_batch_size carries the same information.
                self.steps_per_generation = None
            self._set_trl("rollout_batch_size", "generation_batch_size", rollout)
