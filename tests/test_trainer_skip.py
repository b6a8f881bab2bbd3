"""`skip_zero_advantage_completions`: completions with advantage 0 leave the loss's forward and backward, and the
loss and every gradient stay those of the full batch (the full-batch path is checked against TRL's own loss in
test_trainer_equivalence.py)."""

from __future__ import annotations

import pytest
import torch
from test_trainer_helpers import (
    PROMPTS,
    generate,
    group_inputs,
    loss_and_grads,
    make_trainer,
    max_rel_diff,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    perturb_,
)

from trl_ext import AblationGRPOTrainer
from trl_ext.grpo.trainer import drop_zero_advantage_rows
from trl_ext.objectives import LENGTH_NORMALIZATIONS, PG_LOSS_TYPES

LOSS_ATOL, GRAD_RTOL = 1e-6, 1e-5


class ShapeRecordingTrainer(AblationGRPOTrainer):
    """Records the `(rows, prompt + completion columns)` of every log-prob forward of the loss."""

    def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
        self.forward_shapes = getattr(self, "forward_shapes", []) + [tuple(input_ids.shape)]
        return super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)


def _sample(trainer):
    """16 sampled completions (4 prompts x 4)."""
    return generate(trainer, group_inputs(PROMPTS[:4]))


def _with_zero_rows(batch, zero_rows):
    """`batch` with the advantages of `zero_rows` set to 0 and the others made non-zero."""
    advantages = batch["advantages"].clone()
    advantages[advantages == 0] = 0.5
    advantages[list(zero_rows)] = 0.0
    batch["advantages"] = advantages
    return batch


def _loss_and_grads(trainer, batch, skip: bool, accumulation: int = 1):
    trainer.args.skip_zero_advantage_completions = skip
    trainer.forward_shapes = []
    loss, grads = loss_and_grads(trainer, batch, accumulation)
    return loss, grads, trainer.forward_shapes


@pytest.mark.parametrize("length_normalization", LENGTH_NORMALIZATIONS)
@pytest.mark.parametrize("pg_loss_type", ["no_baseline", *PG_LOSS_TYPES])
def test_same_loss_and_gradient_on_fewer_rows(char_tokenizer, tmp_path, pg_loss_type, length_normalization):
    # Two epochs per rollout (for the ratio losses): TRL stores old log-probs; after a perturbation the ratios
    # leave 1 and clipping acts. The -A logp losses train on-policy (the config refuses them off-policy).
    ratio_loss = pg_loss_type not in ("no_baseline", "reinforce")
    trainer = make_trainer(
        char_tokenizer,
        tmp_path,
        trainer_cls=ShapeRecordingTrainer,
        pg_loss_type=pg_loss_type,
        length_normalization=length_normalization,
        num_generations=4,
        per_device_train_batch_size=16,
        num_iterations=2 if ratio_loss else 1,
        **({"epsilon_high": 1.05} if pg_loss_type == "cispo" else {}),
    )
    sampled = _sample(trainer)
    lengths = sampled["completion_mask"].sum(dim=1)
    longest = int(lengths.argmax())
    # Zero out a whole group, one more row and every row as long as the longest one: the kept rows are shorter.
    zero_rows = sorted({0, 1, 2, 3, 9} | set((lengths == lengths.max()).nonzero().flatten().tolist()))
    assert longest in zero_rows and len(zero_rows) < 16
    batch = _with_zero_rows(sampled, zero_rows)
    assert ("old_per_token_logps" in batch) == ratio_loss
    perturb_(trainer.model, scale=0.2)

    full_loss, full_grads, full_shapes = _loss_and_grads(trainer, batch, skip=False, accumulation=2)
    loss, grads, shapes = _loss_and_grads(trainer, batch, skip=True, accumulation=2)

    kept = [i for i in range(16) if i not in zero_rows]
    width = int(batch["completion_mask"][kept].sum(dim=1).max())
    prompt_width, completion_width = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
    assert full_shapes == [(16, prompt_width + completion_width)]
    assert shapes == [(len(kept), prompt_width + width)] and width < completion_width
    assert full_loss.abs() > 1e-4
    torch.testing.assert_close(loss, full_loss, atol=LOSS_ATOL, rtol=0)
    assert max_rel_diff(grads, full_grads) < GRAD_RTOL
    if pg_loss_type == "grpo_clip":
        assert trainer._metrics["train"]["clip_ratio/region_mean"][-2] > 0  # the full batch did clip


def test_all_zero_advantages_give_zero_loss_and_gradient_from_one_row(char_tokenizer, tmp_path):
    trainer = make_trainer(
        char_tokenizer, tmp_path, trainer_cls=ShapeRecordingTrainer, num_generations=4, per_device_train_batch_size=16
    )
    batch = _with_zero_rows(_sample(trainer), range(16))
    loss, grads, shapes = _loss_and_grads(trainer, batch, skip=True)
    assert shapes[0][0] == 1
    assert loss.item() == 0.0
    assert grads and all(torch.count_nonzero(g) == 0 for g in grads.values())


def test_drop_zero_advantage_rows_by_hand():
    inputs = {
        "prompt_ids": torch.tensor([[0, 5], [6, 7], [0, 8]]),
        "prompt_mask": torch.tensor([[0, 1], [1, 1], [0, 1]]),
        "completion_ids": torch.tensor([[1, 2, 3, 4], [1, 9, 0, 0], [2, 0, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]),
        "old_per_token_logps": torch.arange(12.0).view(3, 4),
        "importance_sampling_ratio": torch.tensor([[0.5], [1.5], [2.5]]),  # sequence-level: (B, 1)
        "advantages": torch.tensor([0.0, -1.0, 2.0]),
        "num_items_in_batch": torch.tensor(7),
    }
    batch = drop_zero_advantage_rows(inputs)
    assert torch.equal(batch["prompt_ids"], torch.tensor([[6, 7], [0, 8]]))
    assert torch.equal(batch["prompt_mask"], torch.tensor([[1, 1], [0, 1]]))
    assert torch.equal(batch["completion_ids"], torch.tensor([[1, 9], [2, 0]]))  # cut after column 2
    assert torch.equal(batch["completion_mask"], torch.tensor([[1, 1], [1, 0]]))
    assert torch.equal(batch["old_per_token_logps"], torch.tensor([[4.0, 5.0], [8.0, 9.0]]))
    assert torch.equal(batch["importance_sampling_ratio"], torch.tensor([[1.5], [2.5]]))
    assert torch.equal(batch["advantages"], torch.tensor([-1.0, 2.0]))
    assert batch["num_items_in_batch"] is inputs["num_items_in_batch"]
    assert inputs["completion_ids"].shape == (3, 4)  # the caller's batch is untouched (epochs reuse it)

    # Nothing to drop, or multimodal entries (not row-sliceable here): the batch as it came.
    for unchanged in ({**inputs, "advantages": torch.tensor([1.0, -1.0, 2.0])}, {**inputs, "pixel_values": 1}):
        assert drop_zero_advantage_rows(unchanged) is unchanged


def even_prompts_tie_reward(prompts, completion_ids, **kwargs) -> list[float]:
    """0 for every completion of an even-length prompt (a zero-std group), `id_reward`'s spread otherwise."""
    pairs = zip(prompts, completion_ids, strict=True)
    return [0.0 if len(p) % 2 == 0 else float(sum(ids) % 5) / 4 for p, ids in pairs]


def test_training_with_skipping_ends_at_the_same_weights(char_tokenizer, tmp_path):
    finals, zero_std = [], []
    for skip in (False, True):
        trainer = make_trainer(
            char_tokenizer,
            tmp_path / str(skip),
            num_generations=4,
            per_device_train_batch_size=16,
            max_steps=3,
            reward=even_prompts_tie_reward,
            skip_zero_advantage_completions=skip,
        )
        trainer.train()
        finals.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        zero_std.append([log["frac_reward_zero_std"] for log in trainer.state.log_history if "loss" in log])
    assert zero_std[0] == zero_std[1] and 0 < sum(zero_std[0]) < 3  # both paths of the skip were taken
    assert max_rel_diff(finals[1], finals[0]) < 1e-4
