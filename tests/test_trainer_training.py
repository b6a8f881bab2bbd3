"""AblationGRPOTrainer inside `Trainer.train()`: gradient accumulation, reuse of a rollout (off-policy), resume."""

from __future__ import annotations

import statistics

import pytest
import torch
from test_trainer_helpers import make_trainer, one_torch_thread, reference_logps  # noqa: F401 (autouse fixture)

from trl_ext import AblationGRPOTrainer
from trl_ext.objectives import LENGTH_NORMALIZATIONS

# Plain SGD with a constant rate and no clipping: one step moves the weights by exactly -lr * grad.
SGD = dict(optim="sgd", lr_scheduler_type="constant", learning_rate=0.1, max_grad_norm=0.0, warmup_steps=0)


def _one_step_update(char_tokenizer, out_dir, ga, **kwargs):
    trainer = make_trainer(char_tokenizer, out_dir, group_size=4, rollout_batch_size=8, train_batch_size=8,
                           gradient_accumulation_steps=ga, max_steps=1, **SGD, **kwargs)  # fmt: skip
    assert trainer._train_batch_size == 8 // ga  # HF's per-device batch, not the course's train_batch_size
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    delta = {n: p.detach() - before[n] for n, p in trainer.model.named_parameters()}
    return list(trainer._logs["completion"]), delta, trainer.state.log_history[0]["grad_norm"]


# microbatch_token_mean (TRL bnpo) depends on the cut into micro-batches by design: test_objectives_reductions.py.
@pytest.mark.parametrize("length_normalization", [n for n in LENGTH_NORMALIZATIONS if n != "microbatch_token_mean"])
def test_gradient_accumulation_invariance(char_tokenizer, tmp_path, length_normalization):
    """The same 8 completions as 1 micro-batch of 8 (GA=1) or 2 of 4 (GA=2) give the same update.

    Bug caught: a reduction scaled by the micro-batch instead of the step (e.g. token_mean dividing by the
    micro-batch's tokens, or a missing 1 / GA) changes the GA=2 update."""
    runs = {ga: _one_step_update(char_tokenizer, tmp_path / f"ga{ga}", ga, length_normalization=length_normalization)
            for ga in (1, 2)}  # fmt: skip
    assert runs[1][0] == runs[2][0] and len(runs[1][0]) == 8  # the same sampled completions
    assert runs[1][2] > 1e-3
    assert runs[1][2] == pytest.approx(runs[2][2], rel=1e-5)
    for name, d1 in runs[1][1].items():
        torch.testing.assert_close(runs[2][1][name], d1, rtol=1e-4, atol=1e-7, msg=name)


class RecordingTrainer(AblationGRPOTrainer):
    """Records what each loss call sees: old log-probs, current log-probs (plain forward), completions."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generations, self.seen = 0, []

    def _generate_and_score_completions(self, inputs):
        self.generations += 1
        return super()._generate_and_score_completions(inputs)

    def _compute_loss(self, model, inputs):
        with torch.no_grad():
            current = reference_logps(model, inputs)
        old = inputs.get("old_per_token_logps")
        self.seen.append({"old": None if old is None else old.clone(), "current": current, **inputs})
        return super()._compute_loss(model, inputs)


def test_epochs_per_rollout_batch_reuses_old_logps(char_tokenizer, tmp_path):
    trainer = make_trainer(
        char_tokenizer,
        tmp_path,
        trainer_cls=RecordingTrainer,
        group_size=4,
        rollout_batch_size=8,
        train_batch_size=8,
        epochs_per_rollout_batch=2,
        max_steps=4,
        learning_rate=5e-2,
    )
    trainer.train()
    assert trainer.generations == 2  # 4 optimizer steps, 2 epochs per rollout batch
    steps = trainer.seen
    assert len(steps) == 4

    def max_ratio_gap(step):
        mask = step["completion_mask"].bool()
        return (torch.exp(step["current"] - step["old"])[mask] - 1).abs().max().item()

    for first, second in ((steps[0], steps[1]), (steps[2], steps[3])):
        # Old log-probs are computed once per rollout batch and handed to both epochs unchanged.
        assert torch.equal(first["completion_ids"], second["completion_ids"])
        assert torch.equal(first["old"], second["old"])
        assert max_ratio_gap(first) < 1e-4  # first epoch: the sampling policy is the current one
        assert max_ratio_gap(second) > 1e-2  # second epoch: one optimizer step later, ratios leave 1
    assert not torch.equal(steps[0]["completion_ids"], steps[2]["completion_ids"])  # a fresh rollout


def test_resume_from_checkpoint_continues_identically(char_tokenizer, tmp_path):
    common = dict(
        pg_loss_type="reinforce_with_baseline",  # a loss whose value is not identically ~0 on-policy
        group_size=4,
        rollout_batch_size=8,
        train_batch_size=8,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
    )

    def history(trainer):
        return [(h["step"], h["loss"], h["grad_norm"], h["reward"]) for h in trainer.state.log_history if "loss" in h]

    full = make_trainer(char_tokenizer, tmp_path / "full", **common)
    full.train()
    resumed = make_trainer(char_tokenizer, tmp_path / "resumed", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))

    # The resumed state carries the checkpoint's log history (steps 1-2); steps 3-4 are the ones it ran.
    expected, got = history(full)[2:], history(resumed)[2:]
    assert [h[0] for h in got] == [3, 4]
    assert all(abs(h[1]) > 1e-4 for h in expected)
    for (step, loss, grad_norm, reward), (_, loss_r, grad_norm_r, reward_r) in zip(expected, got, strict=True):
        assert loss_r == pytest.approx(loss, rel=1e-5, abs=1e-7), step
        assert grad_norm_r == pytest.approx(grad_norm, rel=1e-5), step
        assert reward_r == pytest.approx(reward), step
    for (name, p), p_r in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(p_r, p, msg=name)


def component_reward(completions, log_metric=None, **kwargs) -> list[float]:
    """Digit share, reporting two components through TRL's `log_metric` hook like trl_ext.rewards does."""
    digits = [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in completions]
    letters = [sum(ch.isalpha() for ch in text) / max(len(text), 1) for text in completions]
    if log_metric is not None:
        log_metric("rewards/component_reward/digit_share", sum(digits) / len(digits))
        log_metric("rewards/component_reward/letter_share", sum(letters) / len(letters))
    return digits


def _by_hand_group_mean_std(rewards: list[float], group_size: int, eps: float) -> list[float]:
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean, std = statistics.fmean(group), statistics.stdev(group)
        out += [0.0 if max(group) == min(group) else (r - mean) / (std + eps) for r in group]
    return out


def test_step_metrics(char_tokenizer, tmp_path):
    """Logged metrics against values recomputed from the logged completions, never from what the trainer wrote.

    Bugs caught: clip fractions logged from the wrong tensor (step 2 is off-policy, so a clip metric stuck at 0 or
    computed over padding fails), advantages logged but not used (the loss's batch is compared), rewards or
    advantages aggregated over the wrong rows."""
    trainer = make_trainer(
        char_tokenizer, tmp_path, trainer_cls=RecordingTrainer, reward=component_reward, loss_type="grpo",
        group_size=4, rollout_batch_size=16, train_batch_size=8, max_steps=2, learning_rate=0.3,
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    completions = list(trainer._logs["completion"])
    digits = [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in completions]
    letters = sum(sum(ch.isalpha() for ch in t) / max(len(t), 1) for t in completions) / len(completions)
    assert len(completions) == 16 and len(logs) == 2 and statistics.stdev(digits) > 0
    # Reward metrics (TRL's, kept), recomputed from the logged completions.
    assert logs[0]["reward"] == pytest.approx(statistics.fmean(digits), abs=1e-6)
    assert logs[0]["rewards/component_reward/mean"] == pytest.approx(statistics.fmean(digits), abs=1e-6)
    assert logs[0]["rewards/component_reward/letter_share"] == pytest.approx(letters, abs=1e-6)
    assert logs[0]["reward_std"] == pytest.approx(statistics.stdev(digits), abs=1e-6)
    # Ours: TRL's default advantage (group mean and std, eps 1e-4) recomputed by hand from the rewards ...
    advantages = _by_hand_group_mean_std(digits, 4, 1e-4)
    assert logs[0]["advantages/mean"] == pytest.approx(statistics.fmean(advantages), abs=1e-6)
    assert logs[0]["advantages/std"] == pytest.approx(statistics.stdev(advantages), abs=1e-6)
    # ... and the advantages the loss actually used: TRL shuffles the rollout, so compare as multisets.
    used = sorted(a for step in trainer.seen for a in step["advantages"].tolist())
    assert used == pytest.approx(sorted(advantages), abs=1e-5)
    groups = torch.tensor(digits).view(-1, 4)
    assert logs[0]["frac_reward_zero_std"] == pytest.approx((groups.std(dim=1) == 0).float().mean().item())

    # Clip fractions: step 1 is on-policy (exactly 0), step 2 trains on the same rollout after one update.
    assert logs[0]["clip_ratio/region_mean"] == 0.0
    second = trainer.seen[1]
    ratio = torch.exp(second["current"] - second["old"])
    adv, mask = second["advantages"][:, None], second["completion_mask"].bool()
    low, high = (ratio < 0.8) & (adv < 0) & mask, (ratio > 1.2) & (adv > 0) & mask
    assert logs[1]["clip_ratio/low_mean"] == pytest.approx((low.sum() / mask.sum()).item(), abs=1e-6)
    assert logs[1]["clip_ratio/high_mean"] == pytest.approx((high.sum() / mask.sum()).item(), abs=1e-6)
    assert logs[1]["clip_ratio/region_mean"] == pytest.approx(((low | high).sum() / mask.sum()).item(), abs=1e-6)
    assert logs[1]["clip_ratio/region_mean"] > 0
    assert logs[0]["entropy"] > 0 and logs[0]["grad_norm"] > 0 and logs[0]["completions/mean_length"] > 0
