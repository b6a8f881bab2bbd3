"""The pieces of one expert-iteration step: which questions, which completions are kept, the SFT batches, and the
SFT loss of a micro-batch (pure tensor code, no trainer).

The SFT loss of one optimizer step is the token mean of the negative log-likelihood over every kept completion token
of the step, `-sum_{b,t} m_bt logp_bt / sum_{b,t} m_bt`, as TRL's `SFTTrainer` (and so the SFT recipes) computes
it; each micro-batch contributes its share through the courses' `sft_microbatch_train_step` with
`normalize_constant = tokens_in_step / (rows_in_micro_batch * micro_batches_in_step)`.
"""

from __future__ import annotations

import contextlib

import torch

from trl_ext.grpo.rows import loss_mask
from trl_ext.objectives import compute_entropy, sft_microbatch_train_step


def kept_mask(rewards_per_func: torch.Tensor, weights: torch.Tensor, min_reward: float) -> torch.Tensor:
    """Which completions expert iteration keeps: reward `sum_f w_f r_f >= min_reward`.

    Args:
        rewards_per_func: `(N, F)` rewards per function, NaN where a function returned None.
        weights: `(F,)` reward weights.
        min_reward: the keep threshold.

    Returns:
        `(N,)` bool. The sum skips NaN, as TRL's reward does; a completion no function scored is never kept.
    """
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    scored = ~torch.isnan(rewards_per_func).all(dim=1)
    return (rewards >= min_reward) & scored


class QuestionSampler:
    """Draws questions without replacement from seeded permutations of `range(num_rows)`, starting a new
    permutation (next seed) when one is used up; an EI step's batch may span two permutations.

    Args:
        num_rows: training questions.
        seed: seed of the first permutation.
    """

    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows < 1:
            raise ValueError("the training set has no questions to sample")
        self.num_rows, self.seed = num_rows, seed
        self._order: list[int] = []
        self._epoch = 0

    def draw(self, count: int) -> list[int]:
        """The next `count` question indices (the same sequence for the same seed)."""
        out: list[int] = []
        while len(out) < count:
            if not self._order:
                generator = torch.Generator().manual_seed(self.seed + self._epoch)
                self._order = torch.randperm(self.num_rows, generator=generator).tolist()
                self._epoch += 1
            take = min(count - len(out), len(self._order))
            out += self._order[:take]
            self._order = self._order[take:]
        return out


def sft_batches(num_kept: int, batch_size: int, epochs: int, generator: torch.Generator) -> list[list[int]]:
    """Optimizer-step batches over `num_kept` kept completions: `epochs` shuffled passes, each cut into batches of
    `batch_size` (the last one of a pass may be smaller).

    Returns:
        Lists of indices into the kept completions; empty when nothing was kept.
    """
    batches = []
    for _ in range(epochs if num_kept else 0):
        order = torch.randperm(num_kept, generator=generator).tolist()
        batches += [order[i : i + batch_size] for i in range(0, num_kept, batch_size)]
    return batches


def completion_log_probs(model, batch: dict, return_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completion tokens (and the entropy at each), from one forward over prompt + completion.

    `logp[b, t] = log softmax(z)[completion_ids[b, t]]` for the logits `z` that predict completion token t (no
    temperature: the raw model, the SFT target); entropy by `objectives.compute_entropy`.

    Args:
        model: the causal LM.
        batch: `prompt_ids` / `prompt_mask` `(B, P)` (left padded), `completion_ids` / `completion_mask` `(B, T)`
            (right padded), as TRL's `_generate_and_score_completions` lays them out.
        return_entropy: also compute the entropy.

    Returns:
        `(logp (B, T), entropy (B, T) or None)` in fp32.
    """
    completion_ids = batch["completion_ids"]
    input_ids = torch.cat([batch["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = completion_ids.size(1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width + 1).logits
    logits = logits[:, :-1, :].float()  # (B, T, V): position t predicts completion token t
    logp = logits.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return logp, (compute_entropy(logits) if return_entropy else None)


def sft_micro_step(model, micro_batch: dict, step_tokens: int, micro_batches: int, autocast=None) -> dict[str, float]:
    """Forward and backward of one SFT micro-batch: its share of the optimizer step's token-mean NLL.

    Args:
        model: the policy (gradients accumulate into it).
        micro_batch: as `completion_log_probs` takes it, rows of kept completions only.
        step_tokens: completion tokens of the whole optimizer step (all its micro-batches), > 0.
        micro_batches: micro-batches in the optimizer step.
        autocast: a context-manager factory for the forward (mixed precision, e.g. `accelerator.autocast`); the
            backward runs outside it.

    Returns:
        `loss` (this micro-batch's term: they sum to the step's token-mean NLL), `entropy_sum` (sum of the token
        entropies over its completion tokens) and `tokens`.
    """
    mask = loss_mask(micro_batch)
    with autocast() if autocast is not None else contextlib.nullcontext():
        logp, entropy = completion_log_probs(model, micro_batch)
    rows = mask.size(0)
    loss, _ = sft_microbatch_train_step(
        logp, mask, micro_batches, normalize_constant=step_tokens / (rows * micro_batches)
    )
    with torch.no_grad():
        entropy_sum = (entropy * mask).sum().item()
    return {"loss": loss.item(), "entropy_sum": entropy_sum, "tokens": int(mask.sum().item())}
