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
`__init__`, then `_install_behaviours`, which lists every behaviour of the generation side in the order it is
installed and where it is wired), then `_generate_and_score_completions` (one generation batch: dynamic sampling,
TRL's generation and scoring, the async version tags, the finished-completion mask, the advantages, in that order),
then `_compute_loss` (the loss side).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from trl_ext.grpo.config import AblationGRPOConfig
from trl_ext.grpo.fused_head import compact_lm_head
from trl_ext.grpo.packing import packed_logps_and_entropies, packing_problem
from trl_ext.grpo.rollouts.async_rollouts import AsyncRolloutsMixin, check_trainer_inputs
from trl_ext.grpo.rollouts.dynamic_sampling import DynamicSamplingMixin, check_train_dataset
from trl_ext.grpo.rollouts.finished import FinishedCompletionsMixin
from trl_ext.grpo.rollouts.static_cache_generation import StaticCacheGenerationMixin
from trl_ext.grpo.rows import FORWARD_KEYS, drop_zero_advantage_rows, loss_mask
from trl_ext.grpo.weight_sync.client import server_weight_sync
from trl_ext.grpo.weight_sync.colocate import install_colocate_weight_sync
from trl_ext.grpo.weight_sync.watchdog import install_trainer_watchdog
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


class AblationGRPOTrainer(
    DynamicSamplingMixin, FinishedCompletionsMixin, AsyncRolloutsMixin, StaticCacheGenerationMixin, GRPOTrainer
):
    """Drop-in `trl.GRPOTrainer` whose objective is chosen by name along three axes (see `AblationGRPOConfig`).

    The MRO: `AblationGRPOTrainer -> DynamicSamplingMixin -> FinishedCompletionsMixin -> AsyncRolloutsMixin ->
    StaticCacheGenerationMixin -> GRPOTrainer`. Each TRL method is changed in one class only
    (tests/test_trl_internals.py checks), so no wrapper order follows from the MRO: the order of the behaviours is
    written out in `_install_behaviours` and `_generate_and_score_completions`. The one exception,
    `_generate_single_turn`, is changed by two behaviours that never run together (async rollouts need the vLLM
    server, static-cache generation refuses vLLM): each hands the call to `super()` when it is off.

    - this class: `__init__`, `_generate_and_score_completions`, `_get_per_token_logps_and_entropies`,
      `_compute_loss`;
    - `trl_ext.grpo.rollouts.dynamic_sampling.DynamicSamplingMixin`: `_calculate_rewards` (keeps the gathered
      rewards);
    - `trl_ext.grpo.rollouts.finished.FinishedCompletionsMixin`: `_generate` (the clipped-ratio and terminated-length
      metrics by vLLM's finish reasons or the stop strings);
    - `trl_ext.grpo.rollouts.async_rollouts.AsyncRolloutsMixin`: `train`, `get_batch_samples`, `_prepare_inputs`,
      `_generate_single_turn` (the next generation batch requested ahead);
    - `trl_ext.grpo.rollouts.static_cache_generation.StaticCacheGenerationMixin`: `_generate_single_turn` (the
      rollouts sampled over a preallocated KV cache instead of `generate`, with `static_cache_generation`).

    This class's overrides:

    - `__init__`: `args` defaults to `AblationGRPOConfig` (a plain `GRPOConfig` is refused); the inputs dynamic
      sampling and async rollouts cannot use are refused before TRL loads the model; `_install_behaviours` after
      TRL's; `train_batch_size` is checked against `accelerator.num_processes` (the config could only read
      `$WORLD_SIZE`); HF's per-device `_train_batch_size` is reset, since the courses' field `train_batch_size` shadows
      HF's property of that name.
    - `_generate_and_score_completions`: one generation batch (TRL's, or with `dynamic_sampling` several of TRL's,
      the varied groups kept), each scored by `_score_generation_batch`; then replaces `output["advantages"]` with
      `objectives.compute_advantages` of the gathered rewards (and completion lengths), sliced for this process as
      TRL slices, and the advantages TRL just appended to the completions table; logs `advantages/mean|std`.
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

    Not logged (TRL logs them for its clipped losses): `clip_ratio/low_min` and `clip_ratio/high_max`.
    """

    _tag_names = ["trl", "grpo", "trl_ext"]

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
        with server_weight_sync(args):  # server mode without CUDA: a gloo weight sync where TRL's needs NCCL
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
        """The generation side's behaviours, installed on what TRL's `__init__` built, in this order.

        0. server-mode weight sync without CUDA (`weight_sync.client.server_weight_sync`, already done: it must act
           while TRL's `__init__` builds its client): TRL's `VLLMGeneration` built `GlooVLLMClient`, TRL's client
           with a gloo sender, instead of TRL's NCCL-only `VLLMClient`;
        1. colocated weight sync on vLLM's CPU backend (`weight_sync.colocate`): replaces this trainer's
           `vllm_generation.sync_weights` (TRL's per-parameter load fails there); a no-op elsewhere;
        2. async rollouts (`rollouts.async_rollouts`, `async_rollouts`): the replay layer under the server client's
           `_post` (main process). First on `_post`: a replayed answer then passes every later wrapper as a sent one;
        3. vLLM's finish reasons (`rollouts.finish_reasons`, with vLLM): records them by wrapping the server client's
           `_post` (above the replay), the colocated `llm.generate` and `vllm_generation.generate`, all on this
           trainer's instances; `_generate` reads them;
        4. dynamic sampling (`rollouts.dynamic_sampling`): nothing to install; `_generate_and_score_completions` runs
           it;
        5. the compact LM head (`fused_head.compact_lm_head`): nothing to install; it swaps TRL's `_use_triton` only
           for the length of each forward in `_get_per_token_logps_and_entropies`;
        6. the server watchdog (`watchdog`, server mode): outermost around `vllm_generation.sync_weights`, the tensors
           it hands to the client and the client's `generate` / `chat`, so a stalled sync or request stops the run
           past `vllm_server_timeout`, naming the step, the tensor and the server log's tail.

        `_post` is wrapped twice, by two behaviours: the replay answers a request without sending it, the finish
        reasons read every answer, replayed or sent; either runs without the other.
        """
        install_colocate_weight_sync(self)  # 1
        self._install_async_rollouts()  # 2
        self._install_finish_reasons()  # 3
        install_trainer_watchdog(self)  # 6

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

    def _generate_and_score_completions(self, inputs):
        """One generation batch for the loss: with `dynamic_sampling` (training), several of TRL's generation batches,
        each scored by `_score_generation_batch`, the varied groups kept (`_sample_dynamically`); otherwise one. Then
        the advantages, recomputed from the gathered rewards of the batch's groups."""
        self._gathered_rewards = None
        if self._samples_dynamically():
            output = self._sample_dynamically(inputs, self._score_generation_batch)
        else:
            output = self._score_generation_batch(inputs)
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        lengths = self.accelerator.gather(loss_mask(output).sum(dim=1))  # (N_global,), a collective on every rank
        advantages = self.compute_advantages(self._gathered_rewards, group_size, lengths)  # (N_global,)
        local = output["advantages"].size(0)
        start = self.accelerator.process_index * local
        output["advantages"] = advantages[start : start + local].to(output["advantages"].dtype)

        # TRL appended its own advantages for every process's completions to the completions table just now.
        logged, values = self._logs["advantages"], advantages.tolist()
        for i in range(1, min(len(values), len(logged)) + 1):
            logged[-i] = values[-i]
        self._metrics[mode]["advantages/mean"].append(advantages.mean().item())
        self._metrics[mode]["advantages/std"].append(advantages.std().item() if advantages.numel() > 1 else 0.0)
        return output

    def _score_generation_batch(self, inputs) -> dict:
        """TRL's generation and scoring of one generation batch (`GRPOTrainer._generate_and_score_completions`), then
        each row tagged with the policy version that sampled it (async rollouts), then, where TRL's rule would also
        mask the completions that stopped at a stop string, the truncated completions alone masked."""
        masks_itself = self._masks_truncated_itself()
        if masks_itself:
            self.mask_truncated_completions = False  # TRL's rule would also mask the completions that stopped
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            if masks_itself:
                self.mask_truncated_completions = True
        output = self._tag_policy_version(output)
        return self._mask_truncated(output) if masks_itself else output

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
