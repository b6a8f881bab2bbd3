"""Dynamic sampling (DAPO, https://arxiv.org/abs/2503.14476; verl `algorithm.filter_groups`): train only on groups
whose rewards differ, generating more groups until the batch is full.

A group whose completions all got the same reward has advantage 0 under any group baseline: it costs a forward and
backward and only dilutes the batch mean. With `dynamic_sampling` on, each rollout step

1. generates one generation batch with TRL's own code (vLLM or transformers) and scores it;
2. drops the groups whose rewards are all equal, judged on the rewards gathered from every process, so every rank
   decides alike; shaping rewards (a reward function with `shaping = True`, such as `soft_overlong`) are left out
   of that judgement, as DAPO filters on accuracy (verl `filter_groups.metric=acc`);
3. while fewer groups were kept than a generation batch holds and fewer than `max_generation_batches` batches were
   generated, draws a fresh batch of prompts from the training set (each repeated `num_generations` times and split
   across processes as TRL's `RepeatSampler` lays them out) and goes back to 1;
4. builds the batch from the first kept groups in generation order; when the cap stops it short, it fills the
   remaining places with the dropped groups in generation order (advantage 0 under a group baseline: without a KL
   term the loss is that of the kept groups times their share of the batch, as without dynamic sampling) and logs
   how many;
5. gathers each generation batch's tensors from all processes, pads prompts on the left and completions on the
   right to common widths, and hands each process its contiguous slice, so every rank trains on the same number of
   rows; `num_items_in_batch` (token-mean losses) is recounted over the built batch.

Logged per rollout step: `dynamic_sampling/generation_batches`, `groups_generated`, `groups_kept`, `groups_filled`.
TRL's own reward metrics (`reward`, `frac_reward_zero_std`, ...) cover every generated completion; the completions
table holds the trained ones.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence

import torch

from trl_ext.grpo.rows import ROW_ENTRIES, loss_mask, pad_and_concat, trim_padding
from trl_ext.objectives.advantages import _group_stats, _grouped
from trl_ext.objectives.aggregation import _weighted_sum

logger = logging.getLogger(__name__)

# verl's DAPO recipe generates at most 10 batches of 3x the training prompts; ours are 1x, so 4 bounds the extra
# generation cost at 3x a plain step.
DEFAULT_MAX_GENERATION_BATCHES = 4

_LOG_KEYS = ("prompt", "completion", "advantages", "images")


def check_dynamic_sampling_config(args) -> None:
    """Validate `dynamic_sampling` / `max_generation_batches` on a config and resolve the cap's default.

    Raises:
        ValueError: `max_generation_batches` set without `dynamic_sampling` (it would be ignored) or a cap below 1.
            (Groups of one completion, always uniform, are refused by TRL's own config.)
    """
    cap = args.max_generation_batches
    if not args.dynamic_sampling:
        if cap is not None:
            raise ValueError(
                f"max_generation_batches={cap} has no effect without dynamic_sampling; set dynamic_sampling=True or "
                "leave max_generation_batches unset"
            )
        return
    if cap is None:
        args.max_generation_batches = cap = DEFAULT_MAX_GENERATION_BATCHES
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"max_generation_batches={cap!r} must be an integer >= 1 (generation batches per step)")


def filter_signal(rewards_per_func: torch.Tensor, weights: torch.Tensor, shaping: Sequence[bool]) -> torch.Tensor:
    """The reward that decides whether a group is kept: the weighted sum of the non-shaping reward functions.

    Args:
        rewards_per_func: `(N, F)` rewards, NaN where a function returned None.
        weights: `(F,)` reward weights.
        shaping: per function, True for a shaping reward (left out; all are used when every function is one).

    Returns:
        `(N,)`: `sum_f w_f r_f` over the counted functions (NaN ignored); NaN where every counted function is NaN.
    """
    counted = torch.tensor([not s for s in shaping], dtype=torch.bool, device=rewards_per_func.device)
    if not counted.any():
        counted = ~counted
    return _weighted_sum(rewards_per_func[:, counted], weights.to(rewards_per_func.device)[counted])


def uniform_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups have all-equal rewards (zero variance).

    Args:
        rewards: `(N,)`, groups of `group_size` contiguous; NaN (unscored) entries are ignored.
        group_size: completions per group.

    Returns:
        `(N // group_size,)` bool: `max_g r == min_g r` over the scored members, or fewer than two scored members.
    """
    count, _, _, tied = _group_stats(*_grouped(rewards, group_size))  # (groups, 1) each
    return ((count < 2) | tied).squeeze(1)


def select_groups(uniform_per_batch: Sequence[torch.Tensor], target: int) -> tuple[list[int], int, int]:
    """The groups a training batch is built from, as indices into all generated groups (batches concatenated).

    Args:
        uniform_per_batch: per generation batch, `(groups,)` bool from `uniform_groups`.
        target: groups the training batch holds.

    Returns:
        `(chosen, kept, filled)`: the first `target` non-uniform groups in generation order, then, when there are
        fewer, uniform groups in generation order to fill the batch; `kept` / `filled` count the two kinds.
    """
    uniform = torch.cat([u.cpu() for u in uniform_per_batch])
    varied = (~uniform).nonzero().flatten().tolist()[:target]
    filler = uniform.nonzero().flatten().tolist()[: target - len(varied)]
    return varied + filler, len(varied), len(filler)


def draw_prompt_indices(num_rows: int, num_prompts: int, group_size: int, seed: str) -> list[int]:
    """Dataset indices of one global generation batch: `num_prompts` distinct prompts, each `group_size` times.

    Stateless (a function of `seed`, the same on every process and after a resume); the layout is TRL's
    `RepeatSampler`'s, so `[rank * n_local:(rank + 1) * n_local]` is a process's share.
    """
    rng = random.Random(seed)
    prompts = (
        rng.sample(range(num_rows), num_prompts)
        if num_rows >= num_prompts
        else rng.choices(range(num_rows), k=num_prompts)
    )
    return [index for index in prompts for _ in range(group_size)]


class DynamicSamplingMixin:
    """`AblationGRPOTrainer`'s dynamic sampling (module docstring): one generation batch built from several of TRL's.

    Part of `AblationGRPOTrainer` (`trl_ext/grpo/trainer.py`, whose `_install_behaviours` lists what it changes in
    order): it checks the training set with `check_train_dataset` before TRL loads the model, and its
    `_generate_and_score_completions` calls `_sample_dynamically` with its own scoring of one generation batch when
    `_samples_dynamically()`, then computes the advantages from the rewards of the built batch's groups, so
    batch-level statistics cover the trained groups. No TRL method is changed here.
    """

    _prompt_source = None  # the training set extra prompts are drawn from, TRL's unused columns removed

    def _samples_dynamically(self) -> bool:
        """Dynamic sampling builds this generation batch: `dynamic_sampling` on and the model training."""
        return bool(getattr(self.args, "dynamic_sampling", False)) and self.model.training

    def _sample_dynamically(
        self, inputs, score: Callable[[list], tuple[dict, torch.Tensor]]
    ) -> tuple[dict, torch.Tensor]:
        """One generation batch of varied groups: `score(inputs)` (one of TRL's generation batches, scored, and its
        gathered rewards `(N_global, n_funcs)`) repeated over fresh prompts until enough groups were kept or
        `max_generation_batches` were generated, then this process's slice of the batch made of the chosen groups
        (steps 1 to 5 of the module docstring) and the rewards of every process's rows of it."""
        args, group = self.args, self.num_generations
        target = args.generation_batch_size // group
        shaping = [bool(getattr(func, "shaping", False)) for func in self.reward_funcs]
        self._take_logs()  # the previous step's rows; TRL would overwrite them with this batch's anyway
        batches, uniform, kept = [], [], 0
        for index in range(args.max_generation_batches):
            if index > 0:
                inputs = self._draw_inputs(index)
            output, rewards = score(inputs)
            batches.append(self._gather_batch(output, rewards, self._take_logs()))
            uniform.append(uniform_groups(filter_signal(rewards, self.reward_weights, shaping), group))
            kept += int((~uniform[-1]).sum())
            if kept >= target:
                break
        chosen, kept, filled = select_groups(uniform, target)
        metrics = self._metrics["train"]
        metrics["dynamic_sampling/generation_batches"].append(float(len(batches)))
        metrics["dynamic_sampling/groups_generated"].append(float(sum(u.numel() for u in uniform)))
        metrics["dynamic_sampling/groups_kept"].append(float(kept))
        metrics["dynamic_sampling/groups_filled"].append(float(filled))
        if filled:
            logger.warning(
                "dynamic sampling: %d of %d groups in %d generation batches had varied rewards "
                "(max_generation_batches=%d); filled the batch with %d equal-reward groups",
                kept, target, len(batches), args.max_generation_batches, filled,
            )  # fmt: skip
        return self._build_batch(batches, chosen, group)

    def _draw_inputs(self, index: int) -> list:
        """This process's share of a fresh generation batch of training prompts (TRL's row layout)."""
        if self._prompt_source is None:
            dataset = self.train_dataset
            if hasattr(dataset, "column_names"):  # a datasets.Dataset: the columns TRL's dataloader would keep
                dataset = self._remove_unused_columns(dataset, description="training")
            self._prompt_source = dataset
        args, world = self.args, self.accelerator.num_processes
        local = args.generation_batch_size // world
        seed = f"{args.seed}:{self.state.global_step}:{index}"
        indices = draw_prompt_indices(
            len(self._prompt_source), args.generation_batch_size // self.num_generations, self.num_generations, seed
        )
        start = self.accelerator.process_index * local
        return self.data_collator([self._prompt_source[i] for i in indices[start : start + local]])

    def _gather_batch(self, output: dict, rewards: torch.Tensor, logs: dict) -> dict:
        """Every process's rows of one generation batch (the same on every rank), with its rewards and log rows."""
        unknown = sorted(
            k for k, v in output.items() if v is not None and k not in (*ROW_ENTRIES, "num_items_in_batch")
        )
        if unknown:
            raise ValueError(f"dynamic_sampling cannot rebuild a batch holding {unknown} (multimodal inputs)")
        tensors = {}
        for key, (left, value) in ROW_ENTRIES.items():
            tensor = output.get(key)
            if tensor is None:
                continue
            if self.accelerator.num_processes > 1:
                if tensor.dim() > 1:
                    value = self._tokenizer.pad_token_id if value is None else value
                    tensor = self.accelerator.pad_across_processes(tensor, dim=1, pad_index=value, pad_first=left)
                tensor = self.accelerator.gather(tensor)
            tensors[key] = tensor
        return {"tensors": tensors, "rewards": rewards, "logs": logs}

    def _build_batch(self, batches: list[dict], chosen: list[int], group: int) -> tuple[dict, torch.Tensor]:
        """This process's slice of the training batch made of the `chosen` groups (indices into all batches), and the
        gathered rewards `(N_global, n_funcs)` of every process's rows of it."""
        rows = [g * group + j for g in chosen for j in range(group)]
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        local = len(rows) // world
        mine = torch.tensor(rows[rank * local : (rank + 1) * local])
        everyone = torch.tensor(rows)
        output = {}
        for key in batches[0]["tensors"]:
            left, value = ROW_ENTRIES[key]
            value = self._tokenizer.pad_token_id if value is None else value
            blocks = [batch["tensors"][key] for batch in batches]
            output[key] = pad_and_concat(blocks, value, left)[mine.to(blocks[0].device)]
        output = trim_padding(output, self.pad_to_multiple_of)
        # Token-mean losses divide by the loss tokens of the whole generation batch (every process): recount them.
        masks = [loss_mask(b["tensors"]) for b in batches]
        counts = torch.cat([m.sum(dim=1) for m in masks])[everyone.to(masks[0].device)]
        output["num_items_in_batch"] = counts.sum()
        rewards = torch.cat([b["rewards"] for b in batches])[everyone.to(batches[0]["rewards"].device)]
        sizes = [b["tensors"]["completion_ids"].size(0) for b in batches]
        self._restore_logs([b["logs"] for b in batches], sizes, rows)
        return output, rewards

    def _restore_logs(self, logs: list[dict], sizes: list[int], rows: list[int]) -> None:
        """Refill TRL's completion-table buffers with the trained rows (prompt, completion, rewards, advantage)."""

        def pick(per_batch: list[list]) -> list:
            # A column a batch did not log (a reward's `log_extra` skipped) reads None there.
            flat = [
                v
                for values, n in zip(per_batch, sizes, strict=True)
                for v in (values if len(values) == n else [None] * n)
            ]
            return [flat[i] for i in rows]

        for key in _LOG_KEYS:
            if any(log[key] for log in logs):
                self._logs[key].extend(pick([log[key] for log in logs]))
        for key in ("rewards", "extra"):
            for name in sorted({name for log in logs for name in log[key]}):
                self._logs[key][name].extend(pick([log[key].get(name, []) for log in logs]))

    def _take_logs(self) -> dict:
        """Empty TRL's completion-table buffers (`self._logs`) and return what they held."""
        taken = {}
        for key in _LOG_KEYS:
            taken[key] = list(self._logs[key])
            self._logs[key].clear()
        for key in ("rewards", "extra"):
            taken[key] = {name: list(values) for name, values in self._logs[key].items()}
            self._logs[key].clear()
        return taken


def check_train_dataset(dataset) -> None:
    """Dynamic sampling draws extra prompts by index: refuse datasets without `len` and indexing, or with images."""
    if dataset is None:
        return
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise ValueError(
            f"dynamic_sampling draws extra prompts by index; the train_dataset ({type(dataset).__name__}) is iterable "
            "only. Use a map-style dataset (datasets.Dataset) or turn dynamic_sampling off"
        )
    columns = set(getattr(dataset, "column_names", None) or [])
    if columns & {"image", "images"}:
        raise ValueError("dynamic_sampling does not support multimodal datasets (image / images columns)")
