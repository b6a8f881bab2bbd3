"""`AblationGRPOTrainer`: TRL's `GRPOTrainer` whose advantage, per-token loss and reduction come from
`trl_ext.objectives`, chosen by `AblationGRPOConfig` (the three axes of the CS336 A5 ablations).

How it departs from `trl.GRPOTrainer` (everything else, generation, reward calls, vLLM, logging, checkpoints, is
TRL's own code):

1. advantages: recomputed from the rewards TRL gathers across processes, with a configurable epsilon
   (`advantage_eps`; TRL hard-codes 1e-4) or no baseline at all (`pg_loss_type="no_baseline"`: `A = r`);
2. per-token loss: `-A * logp`, clipped or unclipped `ratio * A` (`pg_loss_type`);
3. reduction: per-sequence masked mean or masked sum / constant (`length_normalization`, `normalize_constant`).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from trl_ext.config import AblationGRPOConfig
from trl_ext.objectives import compute_policy_gradient_loss, group_normalize, reduce_loss
from trl_ext.sampling import DynamicSamplingMixin

# Optional multimodal batch entries that TRL's `_compute_loss` passes on to `_get_per_token_logps_and_entropies`.
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
# Per-completion-token `(B, T)` entries of TRL's batch (`(B, 1)` for sequence-level ratios).
_TOKEN_KEYS = (
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "old_per_token_logps",
    "importance_sampling_ratio",
    "sampling_per_token_logps",
    "ref_per_token_logps",
)


def drop_zero_advantage_rows(inputs: dict) -> tuple[dict, float]:
    """The completions of a TRL batch whose advantage is not 0, and the kept share of the batch.

    A completion with `A = 0` adds exactly 0 to every policy-gradient loss here (`-A * logp`,
    `-min(rho * A, clip(rho) * A)`, times any importance ratio) and to its gradient, and every reduction is a mean
    over completions; so `kept_share * mean over kept completions` is the full batch's loss, with its gradient.

    Args:
        inputs: a batch as `_generate_and_score_completions` returns it; `advantages` `(B,)` or `(B, 1)`.

    Returns:
        `(batch, kept_share)`: the rows with `A != 0` of every per-completion entry, completion columns cut after
        the kept rows' last completion token (prompt columns kept: left padding sets the positions); `kept_share =
        kept / B`. `(inputs, 1.0)` when every row counts or the batch holds multimodal entries. When no row
        counts, row 0 stays (its loss is 0), so the forward, the backward and distributed collectives still run.
    """
    advantages = inputs["advantages"]
    n = advantages.size(0)
    keep = advantages.reshape(n, -1).ne(0).any(dim=1)  # (B,)
    if keep.all() or any(inputs.get(key) is not None for key in _FORWARD_KEYS):
        return inputs, 1.0
    if not keep.any():
        keep[0] = True
    rows = keep.nonzero().squeeze(1)
    columns = inputs["completion_mask"][rows].any(dim=0).nonzero()
    width = int(columns[-1]) + 1 if columns.numel() else 1
    batch = dict(inputs)
    batch["advantages"] = advantages[rows]
    batch["prompt_ids"], batch["prompt_mask"] = inputs["prompt_ids"][rows], inputs["prompt_mask"][rows]
    for key in _TOKEN_KEYS:
        if inputs.get(key) is not None:
            batch[key] = inputs[key][rows, :width]
    return batch, rows.numel() / n


class AblationGRPOTrainer(DynamicSamplingMixin, GRPOTrainer):
    """Drop-in `trl.GRPOTrainer` with the seeds' advantage / loss / reduction axes (see `AblationGRPOConfig`).

    Overrides exactly:

    - `__init__`: `args` defaults to `AblationGRPOConfig` (a plain `GRPOConfig` is refused); `train_batch_size`
      is checked against `accelerator.num_processes` (the config could only read `$WORLD_SIZE`); HF's per-device
      `_train_batch_size` is reset, since the seed field `train_batch_size` shadows HF's property of that name.
    - `_calculate_rewards`: calls TRL's and keeps its gathered `(N_global, n_reward_funcs)` rewards.
    - `_generate_and_score_completions`: calls TRL's, then replaces `output["advantages"]` with ours (this
      process's slice of the global advantages, sliced as TRL does) and the advantages TRL just appended to the
      completions table; logs `advantages/mean` and `advantages/std`.
    - `_compute_loss`: with `skip_zero_advantage_completions`, first drops the completions whose advantage is 0
      (`drop_zero_advantage_rows`: same loss and gradient); then TRL's log-prob / entropy forward
      (`_get_per_token_logps_and_entropies`), old log-probs from the batch when TRL computed them (off-policy) else
      the detached current ones, then
      `objectives.compute_policy_gradient_loss` and `objectives.reduce_loss`, divided by the gradient accumulation
      steps in training (TRL turns HF's automatic scaling off). Logs `entropy` and, for `grpo_clip`, TRL's
      `clip_ratio/{low,high,region}_mean` (region = fraction of completion tokens whose clipped term was active).

    With `dynamic_sampling`, `trl_ext.sampling.DynamicSamplingMixin` (between this class and TRL's) builds each
    generation batch from several of TRL's, keeping the groups whose rewards differ; the overrides above see it as
    one generation batch.

    Kept from TRL as is: reward metrics (`reward`, `reward_std`, `rewards/<func>/mean|std`,
    `frac_reward_zero_std` = fraction of zero-std groups), completion lengths, loss and grad norm, tool masks,
    vLLM importance-sampling correction (multiplied into the per-token loss as TRL does) and the MoE aux loss.
    Options the axes do not model (KL `beta`, entropy masks / bonus, sequence-level ratios, ...) are refused by
    the config.
    """

    _tag_names = ["trl", "grpo", "trl_ext"]

    def __init__(self, model, reward_funcs=None, args: AblationGRPOConfig | None = None, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = AblationGRPOConfig(f"{model_name.split('/')[-1]}-GRPO")
        if not isinstance(args, AblationGRPOConfig):
            raise TypeError(
                f"args must be an AblationGRPOConfig, got {type(args).__name__}; build the config with "
                "trl_ext.AblationGRPOConfig (it adds pg_loss_type, length_normalization, ...)"
            )
        self._gathered_rewards: torch.Tensor | None = None
        super().__init__(model, reward_funcs, args=args, **kwargs)
        # The seeds' `train_batch_size` field shadows HF's `TrainingArguments.train_batch_size` property
        # (per-device batch * n_gpu), which Trainer copied into `_train_batch_size` to size the dataloader.
        self._train_batch_size = args.per_device_train_batch_size * max(1, args.n_gpu)
        world = self.accelerator.num_processes
        if args.train_batch_size is not None:
            actual = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
            if actual != args.train_batch_size:
                raise ValueError(
                    f"train_batch_size={args.train_batch_size} but per_device_train_batch_size * "
                    f"gradient_accumulation_steps * num_processes = {args.per_device_train_batch_size} * "
                    f"{args.gradient_accumulation_steps} * {world} = {actual}: the config was built with "
                    "WORLD_SIZE unset or different; build it inside the launched processes"
                )

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gathered_rewards = rewards_per_func  # (N_global, n_reward_funcs), every process's completions
        return rewards_per_func

    def compute_advantages(self, rewards_per_func: torch.Tensor, group_size: int) -> torch.Tensor:
        """Advantages of every process's completions from the gathered rewards.

        Args:
            rewards_per_func: `(N, n_funcs)` rewards (NaN where a function returned None), groups contiguous.
            group_size: completions per prompt.

        Returns:
            `(N,)`: `r` for `no_baseline`, else `objectives.group_normalize(r, ...)`, with `r` the weighted sum over
            reward functions (as TRL); completions no function could score (all None) get advantage 0 and are
            left out of their group's mean and std, as in TRL.
        """
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # (N,)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        if self.args.pg_loss_type == "no_baseline":
            return rewards.masked_fill(unscorable, 0.0)
        # One completion per group (eval with num_generations_eval=1) has no std; its centred reward is 0 anyway.
        by_std = self.args.use_std_normalization and group_size > 1
        advantages = group_normalize(rewards, group_size, self.args.advantage_eps, by_std)
        # As TRL: a completion no reward function could score stays out of its group's mean and std (a group of
        # its scored members only) and gets advantage 0. Rare, hence the loop over the affected groups only.
        for group in unscorable.view(-1, group_size).any(dim=1).nonzero().flatten().tolist():
            members = torch.arange(group * group_size, (group + 1) * group_size, device=rewards.device)
            scored = members[~unscorable[members]]
            if scored.numel() > 1:
                args = self.args
                advantages[scored] = group_normalize(
                    rewards[scored], scored.numel(), args.advantage_eps, args.use_std_normalization
                )
            else:
                advantages[scored] = 0.0
        return advantages.masked_fill(unscorable, 0.0)

    def _generate_and_score_completions(self, inputs):
        self._gathered_rewards = None
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        advantages = self.compute_advantages(self._gathered_rewards, group_size)  # (N_global,)
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

    def _global_masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        """Token-weighted mean over all processes: `sum(x * m) / sum(m)`; `x`, `mask`: `(B, T)`."""
        mask = mask.to(x.dtype)
        totals = self.accelerator.reduce(torch.stack([(x * mask).sum(), mask.sum()]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def _compute_loss(self, model, inputs):
        """Loss of one micro-batch: `reduce(pg_loss(logp, old_logp, A), mask) / gradient_accumulation_steps`.

        `logp`, `old_logp`, `mask`: `(B, T)` over completion tokens; `A`: `(B, 1)` from `inputs["advantages"]`.
        """
        args = self.args
        kept_share = 1.0
        if args.skip_zero_advantage_completions and not self.aux_loss_enabled:
            inputs, kept_share = drop_zero_advantage_rows(inputs)
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + T)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]  # (B, T)

        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _FORWARD_KEYS},
        )  # (B, T)
        # TRL stores old log-probs only when the batch is reused or sampled by an older policy; otherwise the
        # sampling policy is the current one and the ratio is exp(0) = 1 with the gradient of logp.
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1)

        per_token_loss, loss_metadata = compute_policy_gradient_loss(
            per_token_logps,
            args.pg_loss_type,
            raw_rewards=advantages,  # equal to the raw rewards when pg_loss_type == "no_baseline"
            advantages=advantages,
            old_log_probs=old_per_token_logps,
            cliprange=(self.epsilon_low, self.epsilon_high),
        )
        if "importance_sampling_ratio" in inputs:  # vLLM sampler vs trainer mismatch, corrected as TRL does
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        loss = reduce_loss(per_token_loss, mask, args.length_normalization, args.normalize_constant) * kept_share

        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = loss / accumulation
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        self._metrics[mode]["entropy"].append(self._global_masked_mean(entropies.detach(), mask))
        if "clipped" in loss_metadata:
            for name, key in (("low", "clipped_low"), ("high", "clipped_high"), ("region", "clipped")):
                value = self._global_masked_mean(loss_metadata[key].float(), mask)
                self._metrics[mode][f"clip_ratio/{name}_mean"].append(value)
        return loss
