"""`ExpertIterationTrainer`: expert iteration (CS336 A5) on TRL's GRPO machinery.

    for ei_step in 1 .. n_ei_steps:
        questions  <- QuestionSampler (seeded permutation of the training set), questions_per_step of them
        rollouts   <- TRL's `_generate_and_score_completions`: G completions per question with TRL's generation
                      (vLLM server / colocate, or transformers) and weight sync, scored by the reward functions
        kept       <- reward >= keep_min_reward
        SFT        <- sft_epochs shuffled passes over the kept, token-mean NLL (expert_iteration.sft)
        validation <- TRL's `evaluate()` every eval_steps EI steps

Why a `GRPOTrainer` subclass: TRL has no EI trainer, and EI's two halves that are not SFT, sampling and validating,
are exactly GRPO's. Reusing them means the same prompts, tokenization, sampling parameters, stop strings, weight
sync and reward functions as a GRPO run of the same settings, and the same logged names (`reward`,
`rewards/<func>/...`, `completions/mean_length`, `eval_reward`, `eval_rewards/<func>/answer_reward`, `eval_entropy`,
...), so `trl-ext plot` overlays EI and GRPO runs. The SFT half is a plain loop, because its number of optimizer
steps depends on how many completions are kept (TRL's GRPO loop takes a fixed number per rollout batch).

Overrides exactly: `__init__` (one training process; TRL's `__init__` inside `vllm_generation_class()`, then
`install_generation`, as the GRPO trainer: the same vLLM generation, weight syncs and watchdog, `trl_ext.grpo.vllm`),
`_calculate_rewards` (keeps the gathered rewards), `_generate_and_score_completions` (adds `ei_keep`, the kept mask,
and shows it as the "advantage" of the completions table), `_compute_loss` (evaluation only: SFT loss of the kept
eval completions and TRL's `entropy` metric), `log` (tags every entry with `ei_step`) and `train` (the loop above).

Logged every `logging_steps` SFT optimizer steps (means over them): `loss` (token-mean NLL of a step's kept
completions), `grad_norm` (before clipping; the last step's), `learning_rate`, `entropy` (mean token entropy over a
step's completion tokens), `step_time` (the first step of an EI step also carries the EI step's generation time);
per EI step, with the next entry: TRL's rollout metrics and `ei/kept` (kept completions), `ei/kept_fraction`,
`ei/questions_with_kept`, `ei/sft_steps`.
"""

from __future__ import annotations

import time

import torch
from transformers.trainer_utils import TrainOutput
from trl import GRPOTrainer

from trl_ext.expert_iteration.config import ExpertIterationConfig, every_n_ei_steps
from trl_ext.expert_iteration.sft import QuestionSampler, kept_mask, sft_batches, sft_micro_step
from trl_ext.grpo.rows import ROW_ENTRIES, loss_mask, pad_and_concat, trim_padding
from trl_ext.grpo.vllm.generation import install_generation, vllm_generation_class

# The per-completion entries the SFT forward reads (TRL's batch layout).
SFT_ENTRIES = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask")


class ExpertIterationTrainer(GRPOTrainer):
    """Expert iteration: sample, keep the completions the reward marks correct, SFT on them (module docstring).

    Args: as `trl.GRPOTrainer`; `args` must be an `ExpertIterationConfig`.
    """

    _tag_names = ["trl", "expert-iteration", "trl_ext"]

    def __init__(self, model, reward_funcs=None, args: ExpertIterationConfig | None = None, **kwargs):
        if not isinstance(args, ExpertIterationConfig):
            raise TypeError(f"args must be an ExpertIterationConfig, got {type(args).__name__}")
        self._gathered_rewards: torch.Tensor | None = None
        self._ei_step = 0
        self._unlogged_losses: list[float] = []
        self._last_grad_norm = 0.0
        with vllm_generation_class():  # TRL builds its vLLM generation as GRPO's (trl_ext.grpo.vllm)
            super().__init__(model, reward_funcs, args=args, **kwargs)
        if self.accelerator.num_processes != 1:
            raise ValueError(
                f"expert iteration trains on one process; this run has {self.accelerator.num_processes} (launch one "
                "training process; the vLLM server may use other GPUs)"
            )
        install_generation(self)  # as GRPO's: the watchdog of a server's syncs and requests names this trainer's step

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gathered_rewards = rewards_per_func  # (N_global, n_funcs)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        keep = kept_mask(self._gathered_rewards, self.reward_weights, self.args.keep_min_reward)  # (N_global,)
        local = output["completion_ids"].size(0)
        start = self.accelerator.process_index * local
        # A completion without loss tokens (`mask_truncated_completions` masks truncated ones) has nothing to train on.
        keep[start : start + local] &= loss_mask(output).sum(dim=1).to(keep.device) > 0
        output["ei_keep"] = keep[start : start + local]
        # The completions table (log_completions, RolloutSamplesCallback) shows the SFT weight instead of TRL's
        # GRPO advantage: 1.0 trained on, 0.0 dropped.
        logged = self._logs["advantages"]
        for i, value in enumerate(reversed(keep.float().tolist())):
            if i < len(logged):
                logged[-1 - i] = value
        return output

    def _compute_loss(self, model, inputs):
        """Evaluation loss (TRL's `prediction_step` calls it): the SFT loss of the batch's kept completions, and TRL's
        `entropy` metric over every completion token, from TRL's own forward (temperature-scaled, as GRPO's)."""
        mask = loss_mask(inputs)
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, inputs["completion_ids"].size(1), compute_entropy=True
        )
        kept = mask * inputs["ei_keep"].unsqueeze(1).to(mask.dtype)
        loss = -(logps * kept).sum() / kept.sum().clamp(min=1)
        mode = "train" if self.model.training else "eval"
        totals = self.accelerator.reduce(torch.stack([(entropies * mask).sum(), mask.sum().float()]), reduction="sum")
        self._metrics[mode]["entropy"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        super().log({**logs, "ei_step": self._ei_step}, start_time)

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs) -> TrainOutput:
        """Run `n_ei_steps` EI steps (module docstring); returns `TrainOutput(global_step, mean SFT loss, metrics)`."""
        if resume_from_checkpoint:
            raise ValueError("expert iteration cannot resume from a checkpoint; start a fresh run")
        args, model = self.args, self.model
        start = time.perf_counter()
        eval_every = every_n_ei_steps(args.eval_steps, args.n_ei_steps, "eval_steps")
        save_every = every_n_ei_steps(args.save_steps, args.n_ei_steps, "save_steps")
        self._setup_training()
        sampler = QuestionSampler(len(self.train_dataset), args.seed)
        shuffle = torch.Generator().manual_seed(args.seed)
        losses: list[float] = []
        kept_total = 0
        self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start and args.eval_strategy != "no":
            self._evaluate_in_training()
        for ei_step in range(1, args.n_ei_steps + 1):
            self._ei_step = ei_step
            began = time.perf_counter()
            batch = self._rollouts(sampler.draw(args.questions_per_step))
            kept = batch["ei_keep"].nonzero().squeeze(1)
            kept_total += kept.numel()
            steps = sft_batches(kept.numel(), args.sft_batch_size, args.sft_epochs, shuffle)
            self._log_kept(batch, kept, len(steps))
            carried = time.perf_counter() - began  # generation and scoring, charged to the EI step's first SFT step
            for rows in steps:
                losses.append(self._sft_step({key: value[kept[rows]] for key, value in batch.items()}, carried))
                carried = 0.0
            if not steps:
                self._log_training()  # the rollout metrics of an EI step that kept nothing
            if args.eval_strategy != "no" and ei_step % eval_every == 0:
                self._evaluate_in_training()
            if args.save_strategy != "no" and ei_step % save_every == 0:
                self._save_checkpoint(model, trial=None)
        if self._unlogged_losses:
            self._log_training()
        self.callback_handler.on_train_end(args, self.state, self.control)
        runtime = time.perf_counter() - start
        metrics = {"train_runtime": runtime, "ei_steps": float(args.n_ei_steps), "ei_kept_total": float(kept_total)}
        return TrainOutput(self.state.global_step, sum(losses) / len(losses) if losses else 0.0, metrics)

    def _setup_training(self) -> None:
        """What `Trainer.train` would set up before its loop: train mode, gradient checkpointing, the optimizer and a
        constant schedule, and the state the callbacks read."""
        args, model = self.args, self.model
        model.train()
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
        # An upper bound of the SFT steps (every rollout kept), for progress bars; the schedules are constant.
        steps_per_ei = args.sft_epochs * -(-args.rollouts_per_step // args.sft_batch_size)
        self.state.max_steps = args.n_ei_steps * steps_per_ei
        self.state.logging_steps, self.state.eval_steps, self.state.save_steps = 1, steps_per_ei, steps_per_ei
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.state.is_world_process_zero = self.is_world_process_zero()
        self.create_optimizer()
        self.create_scheduler(num_training_steps=self.state.max_steps, optimizer=self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)

    def _rollouts(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """G completions for each question at `indices`, generated and scored by TRL in `generation_batch_size`
        chunks; one batch (`SFT_ENTRIES` and `ei_keep`) of all of them, in question order."""
        rows = [self.train_dataset[i] for i in indices for _ in range(self.num_generations)]
        chunk = self.args.generation_batch_size
        outputs = [self._generate_and_score_completions(rows[i : i + chunk]) for i in range(0, len(rows), chunk)]
        batch = {"ei_keep": torch.cat([o["ei_keep"] for o in outputs])}
        for key in SFT_ENTRIES:
            if outputs[0].get(key) is not None:
                left, pad = ROW_ENTRIES[key]
                batch[key] = pad_and_concat(
                    [o[key] for o in outputs], self._tokenizer.pad_token_id if pad is None else pad, left
                )
        return batch

    def _log_kept(self, batch: dict, kept: torch.Tensor, sft_steps: int) -> None:
        metrics, group = self._metrics["train"], self.num_generations
        total = batch["ei_keep"].numel()
        metrics["ei/kept"].append(float(kept.numel()))
        metrics["ei/kept_fraction"].append(kept.numel() / total)
        metrics["ei/questions_with_kept"].append(float(batch["ei_keep"].view(-1, group).any(dim=1).sum()))
        metrics["ei/sft_steps"].append(float(sft_steps))

    def _sft_step(self, step_batch: dict, carried_time: float) -> float:
        """One SFT optimizer step on kept completions `step_batch` (rows of `ROW_ENTRIES`), in micro-batches of
        `per_device_train_batch_size`; logs it and returns its loss."""
        began = time.perf_counter()
        args, model = self.args, self.model
        self.callback_handler.on_step_begin(args, self.state, self.control)
        size = args.per_device_train_batch_size
        count = step_batch["completion_ids"].size(0)
        micro = [
            trim_padding({k: v[i : i + size] for k, v in step_batch.items() if k in SFT_ENTRIES})
            for i in range(0, count, size)
        ]
        tokens = int(sum(int(loss_mask(m).sum()) for m in micro))
        loss, entropy_sum = 0.0, 0.0
        for m in micro:
            out = sft_micro_step(model, m, tokens, len(micro), self.accelerator.autocast)
            loss += out["loss"]
            entropy_sum += out["entropy_sum"]
        max_norm = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.global_step += 1
        self.callback_handler.on_step_end(args, self.state, self.control)
        metrics = self._metrics["train"]
        metrics["entropy"].append(entropy_sum / max(tokens, 1))
        metrics["step_time"].append(carried_time + time.perf_counter() - began)
        self._unlogged_losses.append(loss)
        self._last_grad_norm = float(grad_norm)
        if self.state.global_step % int(args.logging_steps) == 0:
            self._log_training()
        return loss

    def _log_training(self) -> None:
        """A training log entry: the mean loss of the SFT steps since the last entry, the last step's grad norm and
        learning rate, and (TRL's `log`) the means of the metrics collected since."""
        logs = {"learning_rate": self.lr_scheduler.get_last_lr()[0]}
        if self._unlogged_losses:
            logs.update(loss=sum(self._unlogged_losses) / len(self._unlogged_losses), grad_norm=self._last_grad_norm)
        self._unlogged_losses = []
        self.log(logs)

    def _evaluate_in_training(self) -> None:
        self.evaluate()
        self.model.train()
