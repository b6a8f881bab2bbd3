"""`AblationGRPOConfig`: TRL's `GRPOConfig` plus the three objective axes and the courses' batch vocabulary.

The axes, each resolved through its registry in `trl_ext.objectives` (so the choices cannot drift from the code):
`advantage_type`, `pg_loss_type`, `length_normalization`, with `advantage_eps` and `normalize_constant`. The courses'
names (`pg_loss_type` `no_baseline` / `reinforce_with_baseline`, `use_std_normalization`) are presets onto them and
TRL's `loss_type` / `scale_rewards` are another spelling of the same choices. Every field read by the resolution
defaults to `None` (really unset); `trl_ext.grpo.axes` documents the rules: explicit fields win, two that disagree
are an error naming both, a field the combination ignores is an error, and with nothing set the config trains what
`trl.GRPOConfig()` trains (loss_type "dapo", scale_rewards "group", eps 1e-4, epsilon 0.2). After `__post_init__`
the axis fields hold the resolved names, and `loss_type` / `scale_rewards` TRL's names for them (None where TRL has
none).

The courses' batch vocabulary -> TRL (world size W: `$WORLD_SIZE`, set by `torchrun` / `accelerate launch`, else 1;
the trainer re-checks it against `accelerator.num_processes`):

    group_size                -> num_generations
    rollout_batch_size        -> generation_batch_size                  (completions per rollout)
    train_batch_size          =  per_device_train_batch_size * gradient_accumulation_steps * W
    epochs_per_rollout_batch  -> num_iterations
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

from trl_ext.grpo.axes import (
    PG_LOSS_CHOICES,
    TRL_LOSS_TYPES,
    check_off_policy,
    check_skip_zero_advantage,
    resolve_axes,
)
from trl_ext.grpo.packing import PACKABLE_ATTENTION
from trl_ext.grpo.rollouts.async_rollouts import check_async_rollouts_config
from trl_ext.grpo.rollouts.dynamic_sampling import check_dynamic_sampling_config
from trl_ext.grpo.rollouts.static_cache_generation import check_static_cache_config
from trl_ext.objectives import ADVANTAGE_TYPES, LENGTH_NORMALIZATIONS
from trl_ext.preflight.batch import batch_error, check_batches
from trl_ext.preflight.environment import world_size_from_env as _world_size
from trl_ext.preflight.trl_defaults import trl_default


@dataclass
class AblationGRPOConfig(GRPOConfig):
    r"""`trl.GRPOConfig` plus the objective axes and the courses' batch vocabulary (module docstring: the mapping).

    Parameters:
        advantage_type: advantage estimator, one of `trl_ext.objectives.ADVANTAGE_TYPES`.
        pg_loss_type: per-token loss, one of `trl_ext.objectives.PG_LOSS_TYPES` or a courses' preset.
        length_normalization: reduction, one of `trl_ext.objectives.LENGTH_NORMALIZATIONS`.
        use_std_normalization: the courses' switch: `group_mean_std` (True) or `group_mean` (False).
        advantage_eps: the eps of the estimators that divide by a std (TRL hard-codes 1e-4; the courses use 1e-6).
        normalize_constant: divisor of `masked_normalize` (default: `max_completion_length`).
        loss_type, scale_rewards, epsilon, importance_sampling_level: TRL's fields, redeclared with default None
            ("unset"); resolved as `trl.GRPOConfig` would when no axis field says otherwise.
        group_size, rollout_batch_size, train_batch_size, epochs_per_rollout_batch: the courses' batch vocabulary,
            optional, mapped onto TRL's fields.
        skip_zero_advantage_completions: leave completions with advantage exactly 0 out of the loss's forward and
            backward (same loss and gradient, less compute; see `AblationGRPOTrainer`).
        padding_free: pack each micro-batch's rows into one sequence without padding for the log-prob forwards
            (policy, old policy, reference); same loss and gradients (see `trl_ext.grpo.packing`).

    `train_batch_size` replaces HF's read-only `TrainingArguments.train_batch_size` property (per-device batch x
    n_gpu) on this class: here it is the courses' completions per optimizer step; `AblationGRPOTrainer` resets
    Trainer's per-device `_train_batch_size` accordingly.
    """

    advantage_type: str | None = field(
        default=None,
        metadata={
            "help": f"Advantage estimator. One of: {', '.join(ADVANTAGE_TYPES)}. Unset: from pg_loss_type's preset, "
            "use_std_normalization or scale_rewards (TRL's default 'group' = group_mean_std).",
            "choices": list(ADVANTAGE_TYPES),
        },
    )
    pg_loss_type: str | None = field(
        default=None,
        metadata={
            "help": f"Per-token policy-gradient loss. One of: {', '.join(PG_LOSS_CHOICES)}. The courses' no_baseline "
            "(raw rewards) and reinforce_with_baseline are presets of the 'reinforce' loss (-A logp). Unset: from "
            "loss_type (TRL's default 'dapo' = grpo_clip).",
            "choices": list(PG_LOSS_CHOICES),
        },
    )
    length_normalization: str | None = field(
        default=None,
        metadata={
            "help": f"Reduction of the per-token loss. One of: {', '.join(LENGTH_NORMALIZATIONS)}. masked_mean: "
            "mean over each completion's tokens, then over the batch (GRPO); masked_normalize: sum over tokens / "
            "normalize_constant, then batch mean (Dr. GRPO); token_mean: mean over every token of the optimizer step "
            "(DAPO). Unset: from loss_type (TRL's default 'dapo' = token_mean).",
            "choices": list(LENGTH_NORMALIZATIONS),
        },
    )
    use_std_normalization: bool | None = field(
        default=None,
        metadata={
            "help": "The courses' switch: divide the group mean-centred rewards by the group std + advantage_eps "
            "(advantage_type group_mean_std) or not (group_mean)."
        },
    )
    advantage_eps: float | None = field(
        default=None,
        metadata={
            "help": "Epsilon of the estimators that divide by a std: A = (r - mean) / (std + advantage_eps). "
            "Unset: TRL's 1e-4 (the courses use 1e-6)."
        },
    )
    normalize_constant: float | None = field(
        default=None,
        metadata={"help": "Divisor of the `masked_normalize` reduction. Default: max_completion_length."},
    )
    loss_type: str | None = field(
        default=None,
        metadata={
            "help": f"TRL's loss_type ({', '.join(TRL_LOSS_TYPES)}): a (pg_loss_type, length_normalization) pair. "
            "Unset: TRL's default 'dapo' unless the axis fields say otherwise; after resolution, TRL's name for "
            "the resolved axes (None when TRL has none)."
        },
    )
    scale_rewards: str | None = field(
        default=None,
        metadata={
            "help": "TRL's scale_rewards (group, batch, none; or true / false): advantage_type group_mean_std, "
            "batch_std, group_mean. Unset: TRL's default 'group' unless the axis fields say otherwise."
        },
    )
    epsilon: float | None = field(
        default=None,
        metadata={"help": "Lower clip range of the clipped losses (TRL's epsilon). Unset: 0.2 where a loss uses it."},
    )
    importance_sampling_level: str | None = field(
        default=None,
        metadata={
            "help": "TRL's importance_sampling_level ('token' or 'sequence', GSPO's ratio) for the ratio losses. "
            "Unset: 'token' (gspo and luspo are per sequence by definition)."
        },
    )
    group_size: int | None = field(
        default=None,
        metadata={"help": "The courses' name for completions per prompt; sets num_generations."},
    )
    rollout_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "The courses' name for completions per rollout (generation) batch; sets generation_batch_size."
        },
    )
    train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "The courses' name for completions per optimizer step; sets per_device_train_batch_size = "
            "train_batch_size / (gradient_accumulation_steps * world_size)."
        },
    )
    epochs_per_rollout_batch: int | None = field(
        default=None,
        metadata={"help": "The courses' name for passes over each rollout batch; sets num_iterations."},
    )
    skip_zero_advantage_completions: bool = field(
        default=False,
        metadata={
            "help": "Leave completions whose advantage is exactly 0 (every member of a group whose rewards are all "
            "equal, under a baseline) out of the loss's forward and backward. They add exactly 0 to the loss and "
            "its gradient, so both are unchanged and a step saves about that share of the training compute; "
            "`entropy` and `clip_ratio/*` are then logged over the trained completions only. Has no effect with a "
            "MoE router aux loss or multimodal inputs; an error with beta, an entropy bonus or top_entropy_quantile."
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

    async_rollouts: bool = field(
        default=False,
        metadata={
            "help": "Generate the next generation batch on the vLLM server while this process trains on the current "
            "one (vllm_mode 'server'): the weights are pushed between generations, each row keeps the policy version "
            "(optimizer step) that sampled it, and the loss corrects for the lag through TRL's vLLM importance-"
            "sampling correction (pi_trainer / pi_sampler from the server's log-probs). Every objective axis, "
            "padding_free and dynamic_sampling work unchanged. See docs/trainer.md 'Asynchronous rollouts'."
        },
    )
    max_staleness: int | None = field(
        default=None,
        metadata={
            "help": "With async_rollouts: how many optimizer steps older than the scoring policy the sampling policy "
            "may be. 0 is the synchronous path; m = optimizer steps per generation batch (steps_per_generation * "
            "num_iterations / gradient_accumulation_steps; 1 on-policy) is the most overlap and the default; values "
            "in between request the next batch after m - max_staleness steps of the current one. An error without "
            "async_rollouts."
        },
    )

    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Pack each micro-batch's prompt+completion rows without padding for the log-prob forwards "
            "(policy, old policy and reference): real tokens only, position_ids restarting at 0 for every row, no "
            "attention mask; one packed row with flash_attention_2/3/4 (varlen kernels), rows of at most the "
            "longest row's tokens (first-fit decreasing) with sdpa / eager / flex, whose dense block-diagonal mask "
            "would cost (all tokens)^2 on one row. The micro-batch keeps its rows, so the loss, its gradients, "
            "every reduction and the logged metrics are unchanged (to float rounding); the forward and backward "
            "run over about the batch's real tokens instead of rows x longest, so per_device_train_batch_size can "
            "grow (and GA shrink) within the same memory. Log-probs and entropies go through TRL's fused LM head "
            "in both layouts (tiles of 4096 tokens x 32768 vocabulary entries, never a (tokens, vocab) tensor). "
            "Needs attention eager, sdpa, flex_attention or flash_attention_2/3/4 (transformers separates the "
            "packed sequences by their position_ids) and a text-only model whose layers all attend, of a model type "
            "known to keep packed rows apart (trl_ext.preflight.packed_models.PACKED_MODEL_TYPES), without "
            "prompt-learning PEFT (prefix tuning); refused otherwise, and with pad_to_multiple_of (fixed shapes). "
            "With flash-attention the sequence boundaries go to every layer as the varlen arguments cu_seq_lens_q/k "
            "and max_length_q/k, computed once per forward. Generation is unchanged. TRL's SFTConfig / "
            "DPOConfig padding_free are the same idea for their trainers; GRPOConfig has none."
        },
    )

    static_cache_generation: bool = field(
        default=False,
        metadata={
            "help": "Sample the rollouts with trl_ext's loop over a preallocated KV cache (trl_ext.static_cache) "
            "instead of transformers' generate: each distinct prompt prefilled once for its group, one forward per "
            "new token, finished completions leaving the batch. The same sampling (temperature, top_k, top_p, "
            "min_p; EOS ends a completion), with much less overhead per token: for small decoders on a CPU, the "
            "CPU testbed's recipes turn it on. Llama-style decoders only (Qwen3, Qwen2, Llama), text prompts; an "
            "error with use_vllm, transformers' continuous batching, a repetition_penalty, generation_kwargs or a "
            "cache_implementation."
        },
    )

    def __post_init__(self):
        self._resolve_axes()
        self._map_seed_batch_fields()
        # GRPOConfig.__post_init__ derives generation_batch_size / steps_per_generation from the fields set above.
        super().__post_init__()
        check_off_policy(self)
        check_skip_zero_advantage(self)
        self._check_vespo_sampler_correction()
        check_dynamic_sampling_config(self)
        self._check_padding_free()
        check_async_rollouts_config(self)
        check_static_cache_config(self)

    def _check_padding_free(self):
        if self.padding_free and self.pad_to_multiple_of is not None:
            raise ValueError(
                f"padding_free=True packs the rows to whatever length their tokens take, which defeats "
                f"pad_to_multiple_of={self.pad_to_multiple_of} (fixed shapes, e.g. for Neuron's compiler, where "
                "'auto' resolves to 128); set pad_to_multiple_of=None or padding_free=False"
            )
        # The model's own attention is checked by the trainer; this catches a recipe that asks for another one.
        attention = (self.model_init_kwargs or {}).get("attn_implementation")
        if self.padding_free and attention is not None and attention not in PACKABLE_ATTENTION:
            raise ValueError(
                f"padding_free=True needs an attention implementation that separates packed sequences by "
                f"position_ids ({', '.join(PACKABLE_ATTENTION)}), but model_init_kwargs.attn_implementation="
                f"{attention!r}; choose one of those or set padding_free=False"
            )

    def _resolve_axes(self):
        resolved = resolve_axes(self)
        for message in resolved.warnings:
            warnings.warn(message, UserWarning, stacklevel=3)
        for name, value in vars(resolved).items():
            if name != "warnings":
                setattr(self, name, value)

    def _check_vespo_sampler_correction(self):
        # TRL raises this in GRPOTrainer.__init__ for loss_type="vespo"; ours also covers pg_loss_type="vespo".
        token_modes = ("token_truncate", "token_mask")
        if (
            self.pg_loss_type == "vespo"
            and self.use_vllm
            and self.vllm_importance_sampling_correction
            and self.vllm_importance_sampling_mode not in token_modes
        ):
            raise ValueError(
                f"pg_loss_type='vespo' folds the vLLM ratio into its per-sequence weight token by token, but "
                f"vllm_importance_sampling_mode={self.vllm_importance_sampling_mode!r}; choose one of {token_modes}"
            )

    def _set_trl(self, seed_name: str, trl_name: str, value: int):
        """Set TRL field `trl_name` from the courses' field `seed_name`, unless the user set it to something else."""
        current = getattr(self, trl_name)
        if current != trl_default(trl_name) and current != value:
            raise ValueError(
                f"{seed_name}={getattr(self, seed_name)} implies {trl_name}={value}, but {trl_name}={current} was "
                f"set explicitly; set only one of them"
            )
        setattr(self, trl_name, value)

    def _map_seed_batch_fields(self):
        seed = ("group_size", "rollout_batch_size", "train_batch_size", "epochs_per_rollout_batch")
        if all(getattr(self, name) is None for name in seed):
            return
        # The courses' sanity checks (CS336 A5 `train_loop`) and TRL's split, in the preflight's one arithmetic; a
        # per-device batch at TRL's default counts as unset, so train_batch_size derives it.
        trl = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "num_iterations")
        values = {name: getattr(self, name) for name in (*seed, *trl, "generation_batch_size", "steps_per_generation")}
        if self.per_device_train_batch_size == trl_default("per_device_train_batch_size"):
            values["per_device_train_batch_size"] = None
        layout, problems = check_batches(values, _world_size())
        if problems:
            raise batch_error(problems[0])
        if self.group_size is not None:
            self._set_trl("group_size", "num_generations", self.group_size)
        if self.epochs_per_rollout_batch is not None:
            self._set_trl("epochs_per_rollout_batch", "num_iterations", self.epochs_per_rollout_batch)
        if self.train_batch_size is not None:
            self._set_trl("train_batch_size", "per_device_train_batch_size", layout.per_device_train_batch_size)
        if self.rollout_batch_size is not None:
            # TRL refuses both set; generation_batch_size carries the same information.
            self.steps_per_generation = None
            self._set_trl("rollout_batch_size", "generation_batch_size", layout.rollout_batch_size)
