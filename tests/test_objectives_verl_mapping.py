"""The verl names in docs/objectives.md, each held against a port of verl's own code on random ragged batches.

The references below are re-implemented from reading verl's `verl/trainer/ppo/core_algos.py` at commit
b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29): `agg_loss`, `compute_policy_loss_vanilla` (PPO clip plus the
dual clip `clip_ratio_c`, applied to `A < 0` only) and `compute_policy_loss_cispo`; the micro-batch scaling
(`loss * 1 / gradient_accumulation`) is `verl/workers/actor/dp_actor.py`'s `update_policy` at the same commit.
They use plain torch ops written from verl's lines, never the functions under test.

What the tests hold (where the mapping is not one to one):
- verl `seq-mean-token-sum-norm` = B x our `masked_normalize` (verl never divides by the B sequences).
- verl's dual clip `clip_ratio_c` = our `delta` only when `delta >= 1 + epsilon_high`; verl's `vanilla` always
  applies it (`clip_ratio_c = 3` by default), so it equals our `grpo_clip` with `delta = 3`, not with `delta = None`.
- CISPO: our `epsilon_high` = verl's `1 + clip_ratio_high`, and verl also clips the weight from below at
  `1 - clip_ratio_low` (equal only with no ratio below it, e.g. verl's example's `clip_ratio_low = 10`).
- Where the conventions agree the reductions are equal: `masked_mean` = `seq-mean-token-mean` and
  `seq_mean_token_sum` = `seq-mean-token-sum` when no row is empty (verl leaves an all-masked row out of B),
  `microbatch_token_mean` = `token-mean` per micro-batch, `token_mean` = `token-mean` given the window's tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from trl_ext.objectives import PG_LOSSES, reduce_loss

F64 = torch.float64


# ---- verl references (ported, see the module docstring) ----


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, batch_num_tokens=None, loss_scale_factor=None):
    """verl `agg_loss` with `dp_size=1` and no `global_batch_size` (the dp_actor path's empty `global_batch_info`)."""
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        tokens = mask.sum() if batch_num_tokens is None else batch_num_tokens
        return (loss_mat * mask).sum() / tokens
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = (loss_mat * mask).sum(-1)
        seq_mask = (mask.sum(-1) > 0).to(loss_mat.dtype)
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    if loss_agg_mode == "seq-mean-token-mean":
        counts = mask.sum(-1)
        seq_losses = (loss_mat * mask).sum(-1) / (counts + 1e-8)
        seq_mask = (counts > 0).to(loss_mat.dtype)
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = (loss_mat * mask).sum(-1)
        scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return seq_losses.sum() / scale
    raise ValueError(loss_agg_mode)


def verl_vanilla_pg_losses(old_log_prob, log_prob, advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c=3.0):
    """verl `compute_policy_loss_vanilla`'s per-token `pg_losses` (before `agg_loss`)."""
    assert clip_ratio_c > 1.0  # verl asserts this too
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    return torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)


def verl_cispo_pg_losses(old_log_prob, log_prob, advantages, clip_ratio_low, clip_ratio_high):
    """verl `compute_policy_loss_cispo`'s per-token `pg_losses`: `-sg(clamp(r, 1 - low, 1 + high)) A logp`."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high).detach()
    return -clipped_ratio * advantages * log_prob


# ---- helpers ----


def ragged_batch(seed, b=6, t=9, spread=0.8, empty_rows=()):
    """Random `(B, T)` log-probs, old log-probs (ratios spread over ~[0.1, 10]), `(B, 1)` advantages of both signs,
    and a right-padded mask of random lengths 1..T (rows in `empty_rows` fully masked)."""
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=gen, dtype=F64) * 3
    old = logp + spread * torch.randn(b, t, generator=gen, dtype=F64)
    adv = torch.randn(b, 1, generator=gen, dtype=F64)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).to(F64)
    mask[list(empty_rows)] = 0.0
    return logp, old, adv, mask


def ours(name, logp, old, adv, mask, **params):
    loss, _ = PG_LOSSES.call(name, log_probs=logp, old_log_probs=old, advantages=adv, mask=mask, **params)
    return loss


def value_and_grad(loss_fn, logp, mask):
    """`sum(m * loss)` and its gradient in the log-probs (what a reduction would back-propagate)."""
    leaf = logp.detach().clone().requires_grad_()
    total = (loss_fn(leaf) * mask).sum()
    total.backward()
    return total.detach(), leaf.grad


# ---- reductions ----


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("loss_scale_factor", [None, 4.0])
def test_verl_seq_mean_token_sum_norm_is_b_times_masked_normalize(seed, loss_scale_factor):
    # verl: sum_bt m l / C; ours (Dr.GRPO, TRL dr_grpo): sum_bt m l / (B * C). C: verl's loss_scale_factor,
    # defaulting to the padded response length T; ours normalize_constant = max_completion_length.
    for b in (1, 3, 6):
        x, _, _, mask = ragged_batch(seed, b=b)
        c = loss_scale_factor if loss_scale_factor is not None else float(mask.shape[-1])
        verl = verl_agg_loss(x, mask, "seq-mean-token-sum-norm", loss_scale_factor=loss_scale_factor)
        got = reduce_loss(x, mask, "masked_normalize", c)
        assert verl.item() == pytest.approx(b * got.item(), rel=1e-12)
        if b > 1:
            assert verl.item() != pytest.approx(got.item(), rel=1e-6)


def test_verl_seq_mean_token_sum_norm_is_b_times_masked_normalize_over_an_accumulation_step():
    # dp_actor scales each micro-batch's loss by 1 / GA; ours divides by GA itself. 4 micro-batches of B = 3.
    x, _, _, mask = ragged_batch(5, b=12)
    ga, b, c = 4, 3, 9.0
    verl_step = sum(
        verl_agg_loss(x[i : i + b], mask[i : i + b], "seq-mean-token-sum-norm", loss_scale_factor=c) / ga
        for i in range(0, 12, b)
    )
    ours_step = sum(
        reduce_loss(x[i : i + b], mask[i : i + b], "masked_normalize", c, accumulation_steps=ga)
        for i in range(0, 12, b)
    )
    assert verl_step.item() == pytest.approx(b * ours_step.item(), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_sequence_reductions_equal_verl_when_no_row_is_empty(seed):
    x, _, _, mask = ragged_batch(seed)
    assert reduce_loss(x, mask, "masked_mean").item() == pytest.approx(
        verl_agg_loss(x, mask, "seq-mean-token-mean").item(), rel=1e-7
    )  # verl's + 1e-8 in the per-row count
    assert reduce_loss(x, mask, "seq_mean_token_sum").item() == pytest.approx(
        verl_agg_loss(x, mask, "seq-mean-token-sum").item(), rel=1e-12
    )


def test_verl_leaves_an_empty_row_out_of_the_sequence_count():
    # A fully masked row (e.g. a truncated completion under mask_truncated_completions): verl divides by the 5 rows
    # with tokens, ours (as TRL's grpo) by all 6 rows, so ours is 5/6 of verl's.
    x, _, _, mask = ragged_batch(3, b=6, empty_rows=(2,))
    for ours_name, verl_name in (("masked_mean", "seq-mean-token-mean"), ("seq_mean_token_sum", "seq-mean-token-sum")):
        got = reduce_loss(x, mask, ours_name).item()
        assert got == pytest.approx(5 / 6 * verl_agg_loss(x, mask, verl_name).item(), rel=1e-7)


def test_token_means_equal_verl_token_mean():
    x, _, _, mask = ragged_batch(4, b=8)
    # per micro-batch (verl's default batch_num_tokens = this micro-batch's tokens): TRL bnpo
    assert reduce_loss(x[:4], mask[:4], "microbatch_token_mean").item() == pytest.approx(
        verl_agg_loss(x[:4], mask[:4], "token-mean").item(), rel=1e-12
    )
    # given the window's tokens (verl's batch_num_tokens): DAPO's token mean over the step
    window = mask.sum()
    for rows in (slice(0, 4), slice(4, 8)):
        got = reduce_loss(x[rows], mask[rows], "token_mean", window_tokens=window)
        assert got.item() == pytest.approx(
            verl_agg_loss(x[rows], mask[rows], "token-mean", batch_num_tokens=window).item(), rel=1e-12
        )


# ---- dual clip: delta vs clip_ratio_c ----


@pytest.mark.parametrize("epsilon_high", [0.2, 0.28])
@pytest.mark.parametrize("delta_over", [0.0, 0.3, 1.72])  # delta = 1 + eps_high + delta_over (1.72: verl's 3.0)
@pytest.mark.parametrize("seed", [0, 1])
def test_delta_equals_verl_clip_ratio_c_when_delta_at_least_one_plus_epsilon_high(epsilon_high, delta_over, seed):
    delta = 1 + epsilon_high + delta_over
    logp, old, adv, mask = ragged_batch(seed, b=8, t=12, spread=1.0)
    ratio = torch.exp(logp - old)
    assert bool(((ratio > delta) & (adv < 0) & (mask > 0)).any())  # the cap binds somewhere in this batch
    mine = value_and_grad(
        lambda lp: ours("grpo_clip", lp, old, adv, mask, epsilon=0.2, epsilon_high=epsilon_high, delta=delta),
        logp,
        mask,
    )
    verl = value_and_grad(lambda lp: verl_vanilla_pg_losses(old, lp, adv, 0.2, epsilon_high, delta), logp, mask)
    assert mine[0].item() == pytest.approx(verl[0].item(), rel=1e-12)
    assert torch.allclose(mine[1], verl[1], rtol=1e-12, atol=1e-15)


def test_delta_below_one_plus_epsilon_high_differs_from_verl_clip_ratio_c():
    # delta = 1.1 < 1 + eps_high = 1.28 (TRL accepts it; verl only asks clip_ratio_c > 1). One token, ratio 1.2:
    #   A = -1: ours  max(min(1.2, 1.1), clip(1.2)) = max(1.1, 1.2) = 1.2 (the clip keeps the ratio, delta is moot);
    #           verl  min(1.1, max(1.2, 1.2)) = 1.1 (its cap wins over the band).
    #   A = +1: ours  -min(min(1.2, 1.1), 1.2) = -1.1 (our cap also applies to A > 0);
    #           verl  -min(1.2, 1.2) = -1.2 (no dual clip for A > 0).
    logp, old, mask = torch.tensor([[math.log(1.2)]], dtype=F64), torch.zeros(1, 1, dtype=F64), torch.ones(1, 1)
    params = dict(epsilon=0.2, epsilon_high=0.28, delta=1.1)
    for a, want_ours, want_verl in ((-1.0, 1.2, 1.1), (1.0, -1.1, -1.2)):
        adv = torch.tensor([[a]], dtype=F64)
        assert ours("grpo_clip", logp, old, adv, mask, **params).item() == pytest.approx(want_ours, rel=1e-12)
        assert verl_vanilla_pg_losses(old, logp, adv, 0.2, 0.28, 1.1).item() == pytest.approx(want_verl, rel=1e-12)


def test_verl_vanilla_is_grpo_clip_with_delta_three_not_without_delta():
    # verl's vanilla always applies the dual clip (clip_ratio_c = 3.0 by default) to A < 0.
    logp, old, adv, mask = ragged_batch(2, b=8, t=12, spread=1.0)
    assert bool(((torch.exp(logp - old) > 3.0) & (adv < 0) & (mask > 0)).any())
    verl = verl_vanilla_pg_losses(old, logp, adv, 0.2, 0.2) * mask
    with_delta = ours("grpo_clip", logp, old, adv, mask, epsilon=0.2, epsilon_high=0.2, delta=3.0) * mask
    without = ours("grpo_clip", logp, old, adv, mask, epsilon=0.2, epsilon_high=0.2, delta=None) * mask
    assert torch.allclose(with_delta, verl, rtol=1e-12, atol=1e-15)
    assert not torch.allclose(without, verl)


# ---- CISPO ----


@pytest.mark.parametrize("clip_ratio_high", [0.2, 4.0])  # 4.0: ScaleRL's eps_max = 5
@pytest.mark.parametrize("seed", [0, 1])
def test_cispo_epsilon_high_is_one_plus_verl_clip_ratio_high(clip_ratio_high, seed):
    # With verl's lower clip out of reach (its example sets clip_ratio_low = 10: 1 - 10 < 0 < every ratio), ours
    # with epsilon_high = 1 + clip_ratio_high is verl's cispo, value and gradient.
    logp, old, adv, mask = ragged_batch(seed, b=8, t=12, spread=1.5)
    assert bool(((torch.exp(logp - old) > 1 + clip_ratio_high) & (mask > 0)).any())
    mine = value_and_grad(lambda lp: ours("cispo", lp, old, adv, mask, epsilon_high=1 + clip_ratio_high), logp, mask)
    verl = value_and_grad(lambda lp: verl_cispo_pg_losses(old, lp, adv, 10.0, clip_ratio_high), logp, mask)
    assert mine[0].item() == pytest.approx(verl[0].item(), rel=1e-12)
    assert torch.allclose(mine[1], verl[1], rtol=1e-12, atol=1e-15)
    # epsilon_high = clip_ratio_high (reading them as the "same knob") caps the weight at 0.2 or 4 instead: not verl's
    naive = value_and_grad(lambda lp: ours("cispo", lp, old, adv, mask, epsilon_high=clip_ratio_high), logp, mask)
    assert not torch.allclose(naive[1], verl[1])


def test_verl_cispo_also_clips_the_ratio_from_below():
    # verl's default clip_ratio_low = clip_ratio = 0.2: the weight is at least 0.8. Ours has no lower clip.
    logp, old, adv, mask = ragged_batch(6, b=8, t=12, spread=1.5)
    ratio = torch.exp(logp - old)
    mine = ours("cispo", logp, old, adv, mask, epsilon_high=1.28)
    verl = verl_cispo_pg_losses(old, logp, adv, 0.2, 0.28)
    below = (ratio < 0.8) & (mask > 0)
    assert bool(below.any())
    inside = ~(ratio < 0.8) & (mask > 0)
    assert torch.allclose(mine[inside], verl[inside], rtol=1e-12, atol=1e-15)
    assert not torch.allclose(mine[below], verl[below])
    # hand numbers: one token, ratio 0.5, A = 1, logp = -1: ours -0.5 * 1 * -1 = 0.5; verl -0.8 * 1 * -1 = 0.8
    lp, o = torch.tensor([[-1.0]], dtype=F64), torch.tensor([[-1.0 - math.log(0.5)]], dtype=F64)
    a, m = torch.ones(1, 1, dtype=F64), torch.ones(1, 1, dtype=F64)
    assert ours("cispo", lp, o, a, m, epsilon_high=1.28).item() == pytest.approx(0.5, rel=1e-12)
    assert verl_cispo_pg_losses(o, lp, a, 0.2, 0.28).item() == pytest.approx(0.8, rel=1e-12)
