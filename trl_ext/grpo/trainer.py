"""`AblationGRPOTrainer`: TRL's `GRPOTrainer` whose advantage, per-token loss and reduction are looked up by name in
the `trl_ext.objectives` registries, as `AblationGRPOConfig` resolved them.

How it departs from `trl.GRPOTrainer` (generation, reward calls, vLLM, reference model, logging and checkpoints are
TRL's own code):

1. advantages: recomputed from the rewards TRL gathers across processes by `objectives.compute_advantages`
   (`advantage_type`, `advantage_eps`, `multi_objective_aggregation`), instead of TRL's fixed formulas;
2. loss: `objectives.policy_objective` (the `pg_loss_type` loss with TRL's masks, sampler correction and KL), then
   the `length_normalization` reduction; TRL's entropy bonus and MoE aux loss on top, as TRL adds them.

With the TRL-named combinations (every `loss_type` x `scale_rewards`) this is TRL's loss to float rounding; the
equivalence tests compare loss and gradients with stock `GRPOTrainer` on the same batch.

The way through, top to bottom: `AblationGRPOTrainer.__init__` (the checks made before TRL loads the model, TRL's
`__init__` with its vLLM generation built as `trl_ext.grpo.vllm.TrlExtVLLMGeneration`, then `_install_behaviours`,
which lists in order what this trainer changes and where), then `_generate_and_score_completions` (one generation
batch: dynamic sampling, TRL's generation and scoring, the values TRL logged that this trainer decides, the async
version tags, the finished-completion mask, then the advantages from the gathered rewards, in that order), then
`_compute_loss` (the loss side).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from trl_ext.grpo.config import AblationGRPOConfig
from trl_ext.grpo.deepspeed_comm import join_deepspeed_comm
from trl_ext.grpo.fused_head import compact_lm_head
from trl_ext.grpo.packing import packed_logps_and_entropies, packing_problem
from trl_ext.grpo.rollouts.async_rollouts import AsyncRolloutsMixin, check_trainer_inputs
from trl_ext.grpo.rollouts.dynamic_sampling import DynamicSamplingMixin, check_train_dataset
from trl_ext.grpo.rollouts.finished import FinishedCompletionsMixin
from trl_ext.grpo.rollouts.static_cache_generation import StaticCacheGenerationMixin
from trl_ext.grpo.rows import FORWARD_KEYS, drop_zero_advantage_rows, loss_mask
from trl_ext.grpo.vllm.generation import install_generation, vllm_generation_class
from trl_ext.objectives import (
    REDUCTIONS,
    adaptive_entropy_coef,
    compute_advantages,
    entropy_bonus,
    policy_objective,
)
from trl_ext.preflight.batch import batch_error, world_size_problem

# The loss parameters a registered loss may declare, read from the config of the same name.
_LOSS_FIELDS = (
    "epsilon",
    "epsilon_high",
    "delta",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)


# The values TRL logs for a generation batch that this trainer decides instead, and where its value comes from.
# `AblationGRPOTrainer._log_over_trl` is the one place that writes them, over TRL's entry of the same generation call.
TRL_LOGGED_VALUES = {
    "completions/clipped_ratio": "completions not finished (vLLM's finish reason, else EOS / pad / a stop string)",
    "completions/mean_terminated_length": "mean length of the finished completions (same rule)",
    "completions/min_terminated_length": "shortest finished completion (same rule)",
    "completions/max_terminated_length": "longest finished completion (same rule)",
    "advantages": "the completions table's advantage: objectives.compute_advantages of the gathered rewards",
}


class AblationGRPOTrainer(
    DynamicSamplingMixin, FinishedCompletionsMixin, AsyncRolloutsMixin, StaticCacheGenerationMixin, GRPOTrainer
):
    """Drop-in `trl.GRPOTrainer` whose objective is chosen by name along three axes (see `AblationGRPOConfig`).

    The MRO: `AblationGRPOTrainer -> DynamicSamplingMixin -> FinishedCompletionsMixin -> AsyncRolloutsMixin ->
    StaticCacheGenerationMixin -> GRPOTrainer`. Each TRL method is changed in one class only
    (tests/test_trl_internals.py checks), so no order follows from the MRO: what the trainer changes, in order, is
    written out in `_install_behaviours` (and, per generation batch, `_generate_and_score_completions`). The one
    exception, `_generate_single_turn`, is changed by two behaviours that never run together (async rollouts need
    the vLLM server, static-cache generation refuses vLLM): each hands the call to `super()` when it is off. TRL's
    vLLM generation and client are ours by subclassing (`trl_ext.grpo.vllm`: `TrlExtVLLMGeneration`,
    `TrlExtVLLMClient`; their docstrings list their overrides).

    - this class: `__init__`, `_calculate_rewards`, `_generate_and_score_completions`,
      `_get_per_token_logps_and_entropies`, `_compute_loss`;
    - `trl_ext.grpo.rollouts.dynamic_sampling.DynamicSamplingMixin`: none (the batch built from several of TRL's);
    - `trl_ext.grpo.rollouts.finished.FinishedCompletionsMixin`: `_generate` (which completions finished, by vLLM's
      finish reasons or the stop strings);
    - `trl_ext.grpo.rollouts.async_rollouts.AsyncRolloutsMixin`: `train`, `get_batch_samples`, `_prepare_inputs`,
      `_generate_single_turn` (the next generation batch requested ahead);
    - `trl_ext.grpo.rollouts.static_cache_generation.StaticCacheGenerationMixin`: `_generate_single_turn` (the
      rollouts sampled over a preallocated KV cache instead of `generate`, with `static_cache_generation`).

    This class's overrides:

    - `__init__`: `args` defaults to `AblationGRPOConfig` (a plain `GRPOConfig` is refused); the inputs dynamic
      sampling and async rollouts cannot use are refused before TRL loads the model; DeepSpeed's communication layer
      joined (`trl_ext.grpo.deepspeed_comm`); TRL's `__init__` inside `vllm_generation_class()`;
      `_install_behaviours` after it; `train_batch_size` is checked against `accelerator.num_processes` (the config
      could only read `$WORLD_SIZE`); HF's per-device `_train_batch_size` is reset, since the courses'
      field `train_batch_size` shadows HF's property of that name.
    - `_calculate_rewards`: TRL's; keeps the gathered rewards of the generation batch for `_score_generation_batch`
      (TRL computes its own advantages from them inline; this trainer's replace them).
    - `_generate_and_score_completions`: one generation batch (TRL's, or with `dynamic_sampling` several of TRL's,
      the varied groups kept), each scored by `_score_generation_batch`; then `output["advantages"]` is
      `compute_advantages` of the batch's gathered rewards (and completion lengths), sliced for this process as TRL
      slices, in place of TRL's formula; logs `advantages/mean|std`.
    - `_compute_loss`: TRL's log-prob / entropy forward (`_get_per_token_logps_and_entropies`), TRL's entropy mask
      (`get_high_entropy_mask`) and off-policy mask (`get_off_policy_mask`), then `objectives.policy_objective`
      and the registered reduction; TRL's entropy bonus (with its adaptive coefficient) and MoE aux loss. With
      `skip_zero_advantage_completions`, the completions whose advantage is 0 are dropped first (same loss and
      gradient: the reduction gets the full micro-batch's counts). Logs TRL's `entropy`, `kl`, `clip_ratio/*`,
      `cispo_clip_ratio`, `vespo/phi_seq_mean`, `policy_loss`, `entropy_coef`, `aux_loss` where they apply.
    - `_get_per_token_logps_and_entropies`: always inside `trl_ext.grpo.fused_head.compact_lm_head` (TRL's fused LM
      head scores only the completion tokens on the CPU too, as it does on CUDA); TRL's own unless `padding_free`; then
      each forward's rows are packed without padding (`trl_ext.grpo.packing.pack_rows`: real tokens only, position_ids
      restarting per row, no attention mask; one row for flash-attention, rows of at most the longest row's tokens for
      sdpa / eager) for TRL's fused LM head, and the log-probs / entropies are scattered back to TRL's `(B, T)` layout.
      TRL calls it for the policy, the old policy and the reference model, so all three are packed. `__init__` refuses
      `padding_free` for a processor (multimodal) or a model whose packed rows could attend to each other (a model
      type off the allow-list, prompt-learning PEFT, another attention: `trl_ext.grpo.packing.packing_problem`).

    The values TRL logs that this trainer decides (`TRL_LOGGED_VALUES`) are written by `_log_over_trl` only. Not
    logged (TRL logs them for its clipped losses): `clip_ratio/low_min` and `clip_ratio/high_max`.
    """

    _tag_names = ["trl", "grpo", "trl_ext"]
    _scored_rewards: torch.Tensor | None = None  # (N_global, n_funcs): TRL's last `_calculate_rewards`
    _gathered_rewards: torch.Tensor | None = None  # (N_global, n_funcs): the last batch's, its advantages' source
    _truncation_masked_here = False  # mask_truncated_completions applied here, not by TRL (decided in __init__)

    def __init__(self, model, reward_funcs=None, args: AblationGRPOConfig | None = None, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = AblationGRPOConfig(f"{model_name.split('/')[-1]}-GRPO")
        if not isinstance(args, AblationGRPOConfig):
            raise TypeError(
                f"args must be an AblationGRPOConfig, got {type(args).__name__}; build the config with "
                "trl_ext.AblationGRPOConfig (it accepts every trl.GRPOConfig field)"
            )
        # Before TRL loads the model: the inputs a behaviour cannot use.
        if args.dynamic_sampling:
            check_train_dataset(kwargs.get("train_dataset"))  # extra prompts are drawn by index
        if args.async_rollouts:
            check_trainer_inputs(kwargs)  # the request sent ahead is a replayed single-turn request
        join_deepspeed_comm()  # before TRL's `__init__` loads a model under ZeRO-3 (`zero.Init` reads its world size)
        with vllm_generation_class():  # TRL builds its vLLM generation as TrlExtVLLMGeneration
            super().__init__(model, reward_funcs, args=args, **kwargs)
        self._install_behaviours()
        self._check_static_cache_model()
        if args.padding_free:
            problem = packing_problem(self.model, is_multimodal=self._is_vlm)
            if problem is not None:
                raise ValueError(f"padding_free=True cannot be used here: {problem}; set padding_free=False")
        # TRL still computes (and we then replace) its own advantages; it needs one of its scale_rewards names,
        # and "none" keeps its `frac_reward_zero_std` metric per group for the estimators TRL has no name for.
        self.scale_rewards = args.scale_rewards or "none"
        # The courses' `train_batch_size` field shadows HF's `TrainingArguments.train_batch_size` property
        # (per-device batch * n_gpu), which Trainer copied into `_train_batch_size` to size the dataloader.
        self._train_batch_size = args.per_device_train_batch_size * max(1, args.n_gpu)
        world, ga = self.accelerator.num_processes, args.gradient_accumulation_steps
        problem = world_size_problem(args.train_batch_size, args.per_device_train_batch_size, ga, world)
        if problem is not None:
            raise batch_error(problem)

    def _install_behaviours(self) -> None:
        """What this trainer changes on the objects TRL's `__init__` built, in this order.

        0. (while TRL's `__init__` ran) TRL built its vLLM generation as `trl_ext.grpo.vllm.TrlExtVLLMGeneration`
           (`vllm_generation_class`, the one module global trl_ext swaps), whose overrides change, each chaining to
           TRL's: the engine's start (server: `TrlExtVLLMClient`, the gloo weight sync off CUDA; colocate on vLLM's
           CPU platform: the eager sampler), the weight sync (the watchdog; on a colocated CPU engine vLLM's
           layerwise reload) and `generate` (vLLM's finish reasons kept); its client's `_post` replays (async
           rollouts, 2) then records the finish reasons, and its `generate` / `chat` are timed by the watchdog;
        1. the generation follows this trainer's global step (`install_generation`, which the expert-iteration
           trainer and SFT validation call too): the watchdog's messages name it;
        2. async rollouts (`rollouts.async_rollouts`, `async_rollouts`): the per-run state and, on the main process,
           the client's `replay` (the answer of the request sent ahead);
        3. `mask_truncated_completions` where TRL's rule would also mask the completions that stopped (vLLM, stop
           strings): TRL's masking off for the run, `rollouts.finished` masks the truncated completions after TRL's
           scoring of each generation batch (decided here, once);
        4. the compact LM head (`fused_head.compact_lm_head`, TRL's `_use_triton` swapped for each forward of
           `_get_per_token_logps_and_entropies`, a scoped exception of docs/architecture.md) and dynamic sampling
           (`rollouts.dynamic_sampling`, in `_generate_and_score_completions`): nothing to install;
        5. static-cache generation (`rollouts.static_cache_generation`, `static_cache_generation`): nothing to
           install; its `_generate_single_turn` samples without vLLM, and `__init__` checks the model it runs.
        """
        install_generation(self)  # 1
        self._install_async_rollouts()  # 2
        self._truncation_masked_here = self._truncation_mask_is_ours()  # 3
        if self._truncation_masked_here:
            self.mask_truncated_completions = False

    def compute_advantages(
        self, rewards_per_func: torch.Tensor, group_size: int, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Advantages `(N,)` of every process's completions: `objectives.compute_advantages` with this config.

        Args:
            rewards_per_func: `(N, n_funcs)` rewards (NaN where a function returned None), groups contiguous.
            group_size: completions per prompt.
            lengths: `(N,)` completion lengths in loss tokens (for the estimators that weigh by length).
        """
        args = self.args
        return compute_advantages(
            rewards_per_func,
            self.reward_weights.to(rewards_per_func.device),
            group_size,
            args.advantage_type,
            multi_objective_aggregation=args.multi_objective_aggregation,
            advantage_eps=args.advantage_eps,
            lengths=lengths,
        )

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._scored_rewards = rewards_per_func  # (N_global, n_funcs), every process's completions
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        """One generation batch for the loss: with `dynamic_sampling` (training), several of TRL's generation batches,
        each scored by `_score_generation_batch`, the varied groups kept (`_sample_dynamically`); otherwise one. Then
        the advantages, from the gathered rewards of the batch's groups: the one place they are computed."""
        if self._samples_dynamically():
            output, rewards = self._sample_dynamically(inputs, self._score_generation_batch)
        else:
            output, rewards = self._score_generation_batch(inputs)
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        lengths = self.accelerator.gather(loss_mask(output).sum(dim=1))  # (N_global,), a collective on every rank
        advantages = self.compute_advantages(rewards, group_size, lengths)  # (N_global,)
        self._gathered_rewards = rewards
        local = output["advantages"].size(0)
        start = self.accelerator.process_index * local
        output["advantages"] = advantages[start : start + local].to(output["advantages"].dtype)
        self._log_over_trl(mode, advantages=advantages.tolist())
        self._metrics[mode]["advantages/mean"].append(advantages.mean().item())
        self._metrics[mode]["advantages/std"].append(advantages.std().item() if advantages.numel() > 1 else 0.0)
        return output

    def _score_generation_batch(self, inputs) -> tuple[dict, torch.Tensor]:
        """TRL's generation and scoring of one generation batch (`GRPOTrainer._generate_and_score_completions`), the
        finished-completion metrics written over TRL's, each row tagged with the policy version that sampled it
        (async rollouts), then, where this trainer masks truncated completions itself, the truncated ones masked.

        Returns:
            The scored batch and its gathered rewards `(N_global, n_funcs)`.
        """
        self._scored_rewards = None
        output = super()._generate_and_score_completions(inputs)
        rewards, self._scored_rewards = self._scored_rewards, None
        self._log_over_trl("train" if self.model.training else "eval", metrics=self._finished_metrics())
        output = self._tag_policy_version(output)
        if self._truncation_masked_here:
            output = self._mask_truncated(output)
        return output, rewards

    def _log_over_trl(self, mode: str, metrics: dict[str, float] | None = None, advantages: list[float] | None = None):
        """The one place that writes a value TRL logged and this trainer decides (`TRL_LOGGED_VALUES`), over TRL's
        entry of the same generation call: `metrics` over the last entry of each (TRL's `_generate` appended one per
        call), `advantages` (every process's completions of the batch) over the last entries of TRL's completions
        table (TRL appended one per completion; dynamic sampling put back the trained rows)."""
        for name, value in (metrics or {}).items():
            self._metrics[mode][name][-1] = value
        if advantages is not None:
            logged = self._logs["advantages"]
            for i in range(1, min(len(advantages), len(logged)) + 1):
                logged[-i] = advantages[-i]

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **forward_kwargs,
    ):
        """TRL's log-probs `(B, T)`, entropies `(B, T)` or None, and MoE aux loss, the LM head applied at the
        completion tokens only (`compact_lm_head`); with `padding_free`, each chunk of `batch_size` rows runs packed
        without padding (`trl_ext.grpo.packing`) through TRL's fused LM head.

        Args:
            input_ids, attention_mask: `(B, P + T)`, prompts left-padded and completions right-padded.
            logits_to_keep: `T`.
            batch_size: rows per forward (TRL passes the per-device batch for the old / reference log-probs).
            forward_kwargs: TRL's multimodal entries (must all be None with `padding_free`).
        """
        with compact_lm_head():  # only the completion tokens go through the LM head, on the CPU too
            if not self.args.padding_free:
                return super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size=batch_size,
                    compute_entropy=compute_entropy,
                    compute_aux_loss=compute_aux_loss,
                    **forward_kwargs,
                )
            # Checked per call: the reference model is another model, and generation may switch the attention.
            return packed_logps_and_entropies(
                model,
                self.accelerator.unwrap_model(model),
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                autocast=self.accelerator.autocast,
                **forward_kwargs,
            )

    def _global_masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        """Mean over all processes' loss tokens of `x` `(B, T)`, or over sequences for a `(B, 1)` `x` (as TRL)."""
        if x.size(1) == 1:
            local = torch.stack([x.sum(), torch.tensor(float(x.size(0)), device=x.device)])
        else:
            mask = mask.to(x.dtype)
            local = torch.stack([(x * mask).sum(), mask.sum()])
        totals = self.accelerator.reduce(local, reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def _loss_scale(self, inputs: dict, mode: str) -> dict:
        """The denominators of the reductions, from the full micro-batch (before any row is skipped)."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        mask = loss_mask(inputs)
        scale = {"accumulation_steps": accumulation, "num_sequences": mask.size(0), "num_tokens": mask.sum()}
        if inputs.get("num_items_in_batch") is not None:
            # TRL's `num_items_in_batch` counts the loss tokens of the whole generation batch on every process;
            # one accumulation window on one process holds GA / steps_per_generation of it / num_processes.
            window = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                window = window * accumulation / self.args.steps_per_generation
            scale["window_tokens"] = window
        return scale

    def _compute_loss(self, model, inputs):
        """Loss of one micro-batch: `reduce(policy_objective(logp, old_logp, A, mask))`, minus TRL's entropy bonus,
        plus TRL's aux loss; scaled so the micro-batches of one optimizer step sum to the step's loss.

        `logp`, `old_logp`, `mask`: `(B, T)` over completion tokens; `A`: `(B, 1)` from `inputs["advantages"]`.
        """
        args = self.args
        mode = "train" if self.model.training else "eval"
        scale = self._loss_scale(inputs, mode)
        if args.skip_zero_advantage_completions and not self.aux_loss_enabled:
            inputs = drop_zero_advantage_rows(inputs)
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + T)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = loss_mask(inputs)  # (B, T)

        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in FORWARD_KEYS},
        )  # (B, T)
        entropy_mask = None
        if args.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - args.top_entropy_quantile)
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1)
        # TRL stores old log-probs only when the batch is reused or sampled by an older policy; otherwise the
        # sampling policy is the current one and the ratio is exp(0) = 1 with the gradient of logp.
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        off_policy_mask = None
        if args.off_policy_mask_threshold is not None:
            sampling = inputs.get("sampling_per_token_logps", old_per_token_logps)
            off_policy_mask = self.get_off_policy_mask(
                advantages, per_token_logps, sampling, mask, args.off_policy_mask_threshold
            )

        per_token_loss, metrics = policy_objective(
            args.pg_loss_type,
            per_token_logps,
            old_per_token_logps,
            advantages,
            mask,
            importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
            off_policy_mask=off_policy_mask,
            entropy_mask=entropy_mask,
            ref_log_probs=inputs.get("ref_per_token_logps"),
            beta=args.beta,
            use_bias_correction_kl=args.use_bias_correction_kl,
            importance_sampling_level=args.importance_sampling_level,
            **{name: getattr(args, name) for name in _LOSS_FIELDS},
        )
        loss = REDUCTIONS.call(
            args.length_normalization,
            per_token_loss=per_token_loss,
            mask=mask,
            normalize_constant=args.normalize_constant,
            **scale,
        )
        if self._entropy_bonus_enabled:
            # TRL logs the policy part before its accumulation scaling (a token_mean loss has none).
            scaled = "accumulation_steps" in REDUCTIONS.parameters(args.length_normalization)
            policy_loss = loss.detach() * (scale["accumulation_steps"] if scaled else 1)
            self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())
            loss = self._add_entropy_bonus(loss, entropies, mask, entropy_mask, mode, scale["accumulation_steps"])
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / scale["accumulation_steps"]
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        self._metrics[mode]["entropy"].append(self._global_masked_mean(entropies.detach(), mask))
        for name, value in metrics.items():
            self._metrics[mode][name].append(self._global_masked_mean(value, mask))
        return loss

    def _add_entropy_bonus(self, loss, entropies, mask, entropy_mask, mode: str, accumulation: int):
        """`loss - coef * objectives.entropy_bonus(...)` over the tokens the policy loss acts on, with TRL's adaptive
        coefficient (applied from the previous optimizer step, updated from this window's entropy)."""
        args = self.args
        effective_mask = mask if entropy_mask is None else mask * entropy_mask
        coef = self.entropy_coef
        if self.use_adaptive_entropy and self._last_world_entropy > args.entropy_target:
            coef = 0.0
        loss = loss - coef * entropy_bonus(entropies, effective_mask, accumulation)
        if self.use_adaptive_entropy and mode == "train":
            stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
            window = self._entropy_window_stats
            self._entropy_window_stats = stats if window is None else window + stats
            if self.accelerator.sync_gradients:
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                self.entropy_coef = adaptive_entropy_coef(
                    self.entropy_coef,
                    entropy,
                    args.entropy_target,
                    args.entropy_coef_delta,
                    args.entropy_coef_min,
                    args.entropy_coef_max,
                )
                self._last_world_entropy = entropy
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return loss
