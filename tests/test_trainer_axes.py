"""Every combination of the three axes trains through AblationGRPOTrainer, each axis value reaches its registered
function, and the courses' presets (no_baseline, reinforce_with_baseline, grpo_no_clip) do what their formulas say.

The table test is cheap on purpose: one tiny model, one sampled batch (old log-probs from before a perturbation, so
ratios leave 1 and clipping binds), and per combination a fresh config swapped into the trainer, the advantages
recomputed from the gathered rewards, `_compute_loss`, backward and one SGD step.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from test_trainer_helpers import (
    PROMPTS,
    generate,
    group_inputs,
    id_reward,
    loss_and_grads,
    make_trainer,
    max_rel_diff,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    perturb_,
    reference_logps,
    tiny_model,
)

from trl_ext import AblationGRPOConfig
from trl_ext.objectives import ADVANTAGE_TYPES, LENGTH_NORMALIZATIONS, PG_LOSS_TYPES

COMBINATIONS = list(itertools.product(ADVANTAGE_TYPES, PG_LOSS_TYPES, LENGTH_NORMALIZATIONS))
LR = 0.1


@pytest.fixture(scope="module")
def sampled(char_tokenizer, tmp_path_factory):
    """A trainer and one 16-completion batch with stored old log-probs, the policy moved since sampling."""
    out_dir = tmp_path_factory.mktemp("axes")
    # Built before the trainer: a TrainingArguments resets accelerate's shared state, which the trainer then owns.
    configs = {combo: _config(out_dir, *combo) for combo in COMBINATIONS}
    trainer = make_trainer(char_tokenizer, out_dir, num_iterations=2, gradient_accumulation_steps=2)
    torch.set_num_threads(1)
    batch = generate(trainer, group_inputs(PROMPTS[:4], group_size=4))
    # The random policy rarely stops before the 8-token cap; cut the masks to 4-8 tokens so that lengths vary (OPO
    # and reinforce_pp weigh by length, the reductions differ by it).
    cut = torch.arange(8).unsqueeze(0) < (8 - torch.arange(16) % 5).unsqueeze(1)
    batch["completion_mask"] = batch["completion_mask"] * cut
    rewards = trainer._gathered_rewards.clone()
    perturb_(trainer.model)
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return trainer, batch, rewards, start, configs


def _config(out_dir, advantage, pg, reduction):
    extra = {"epsilon_high": 5.0} if pg == "cispo" else {}
    return AblationGRPOConfig(
        output_dir=str(out_dir), report_to="none", use_cpu=True, max_completion_length=8, num_generations=4,
        per_device_train_batch_size=8, gradient_accumulation_steps=2, advantage_type=advantage, pg_loss_type=pg,
        length_normalization=reduction, **extra,
    )  # fmt: skip


def test_every_combination_of_the_three_axes_trains(sampled):
    trainer, batch, rewards, start, configs = sampled
    model, lengths = trainer.model, batch["completion_mask"].sum(dim=1)
    losses = {}
    for advantage, pg, reduction in COMBINATIONS:
        trainer.args = configs[(advantage, pg, reduction)]
        step = dict(batch, advantages=trainer.compute_advantages(rewards, 4, lengths))
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(start[name])
        model.zero_grad(set_to_none=True)
        trainer.current_gradient_accumulation_steps = 2  # the whole batch is one step's work, as 1 of 2 halves
        loss = trainer._compute_loss(model, step)
        loss.backward()
        grad_norm = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters() if p.grad is not None))
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.sub_(LR * p.grad)
        moved = max((p.detach() - start[n]).abs().max().item() for n, p in model.named_parameters())
        combo = (advantage, pg, reduction)
        assert math.isfinite(loss.item()), combo
        assert grad_norm > 1e-6 and moved > 1e-8, combo
        losses[combo] = loss.item()
    print(f"\n[axis table] {len(ADVANTAGE_TYPES)} x {len(PG_LOSS_TYPES)} x {len(LENGTH_NORMALIZATIONS)} = "
          f"{len(losses)} combinations trained")  # fmt: skip
    assert len(losses) == 8 * 8 * 5

    # Each axis value reaches its own function: along any axis, with the other two fixed, the losses all differ.
    # (A trainer that ignored one field would give equal losses along it.)
    for axis in range(3):
        others = sorted({tuple(c for i, c in enumerate(combo) if i != axis) for combo in losses})
        for fixed in others:
            line = [v for combo, v in losses.items() if tuple(c for i, c in enumerate(combo) if i != axis) == fixed]
            spread = [abs(a - b) / max(abs(a), abs(b), 1e-12) for a, b in itertools.combinations(line, 2)]
            assert min(spread) > 1e-6, (axis, fixed, line)


def test_no_baseline_uses_raw_rewards_and_fixes_the_table(char_tokenizer, tmp_path):
    ours = make_trainer(char_tokenizer, tmp_path, pg_loss_type="no_baseline", length_normalization="masked_mean")
    out = generate(ours, group_inputs(prompts=["abc", "hello"]))
    completion_ids = [
        ids[m.bool()].tolist() for ids, m in zip(out["completion_ids"], out["completion_mask"], strict=True)
    ]
    raw = torch.tensor([float(sum(ids) % 5) / 4 for ids in completion_ids])  # the reward, recomputed by hand
    torch.testing.assert_close(out["advantages"], raw)
    assert raw.std() > 0  # differs from any group-centred advantage
    # The completions table shows what the loss used, not TRL's group-normalised values.
    assert list(ours._logs["advantages"])[-len(raw) :] == pytest.approx(raw.tolist())
    assert ours._metrics["train"]["advantages/mean"][-1] == pytest.approx(raw.mean().item(), rel=1e-6)

    # Gradient of the naive loss -r * logp with the masked_mean reduction, built from an independent forward.
    _, grads = loss_and_grads(ours, out)
    model = ours.model
    model.zero_grad(set_to_none=True)
    logps, mask = reference_logps(model, out), out["completion_mask"].float()
    reference = ((-raw[:, None] * logps * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    reference.backward()
    assert max_rel_diff(grads, {n: p.grad for n, p in model.named_parameters()}) <= 1e-4


@pytest.mark.parametrize("length_normalization", ["masked_mean", "masked_normalize"])
def test_reinforce_with_baseline_matches_naive_gradient(char_tokenizer, tmp_path, length_normalization):
    ours = make_trainer(
        char_tokenizer,
        tmp_path,
        pg_loss_type="reinforce_with_baseline",
        length_normalization=length_normalization,
        advantage_eps=1e-6,
    )
    out = generate(ours, group_inputs(prompts=["abc", "hello"]))
    perturb_(ours.model)  # the gradient at weights other than the sampler's: still -A dlogp
    _, grads = loss_and_grads(ours, out)

    model = ours.model
    model.zero_grad(set_to_none=True)
    # the courses' advantage, recomputed from the rewards by hand: (r - mean) / (std + 1e-6) per group of 4
    ids = [c[m.bool()].tolist() for c, m in zip(out["completion_ids"], out["completion_mask"], strict=True)]
    rewards = torch.tensor(id_reward(ids)).view(-1, 4)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).flatten()
    torch.testing.assert_close(out["advantages"], adv)
    logps, mask = reference_logps(model, out), out["completion_mask"].float()
    per_seq = (-adv[:, None] * logps * mask).sum(-1)
    per_seq = per_seq / (mask.sum(-1).clamp(min=1) if length_normalization == "masked_mean" else 8)
    per_seq.mean().backward()
    assert max_rel_diff(grads, {n: p.grad for n, p in model.named_parameters()}) <= 1e-4


def test_no_clip_differs_from_clip_exactly_where_ratios_leave_the_band(char_tokenizer, tmp_path):
    eps = 0.2
    model = tiny_model(char_tokenizer)
    shared = dict(num_iterations=2, length_normalization="masked_normalize", normalize_constant=1.0)
    clip = make_trainer(char_tokenizer, tmp_path / "clip", model=model, pg_loss_type="grpo_clip", epsilon=eps,
                        **shared)  # fmt: skip
    no_clip = make_trainer(char_tokenizer, tmp_path / "noclip", model=model, pg_loss_type="grpo_no_clip", **shared)
    out = generate(clip, group_inputs(prompts=["abc", "hello"]))
    perturb_(model)

    with torch.no_grad():
        ratio = torch.exp(reference_logps(model, out) - out["old_per_token_logps"])  # (B, T)
    adv, mask = out["advantages"][:, None], out["completion_mask"].bool()
    clipped = ((ratio > 1 + eps) & (adv > 0)) | ((ratio < 1 - eps) & (adv < 0))
    outside = (ratio > 1 + eps) | (ratio < 1 - eps)
    assert (clipped & mask).any() and (outside & ~clipped & mask).any()  # both kinds of tokens present

    # Probe one token at a time: tool_mask restricts the loss to it without changing the forward pass.
    # With masked_normalize by C = 1 the probe's loss is that token's loss / B.
    differs = torch.zeros_like(mask)
    for b, t in mask.nonzero().tolist():
        probe = dict(out, tool_mask=torch.zeros_like(out["completion_mask"]))
        probe["tool_mask"][b, t] = 1
        with torch.no_grad():
            clip.model.train(), no_clip.model.train()
            clip.current_gradient_accumulation_steps = no_clip.current_gradient_accumulation_steps = 1
            loss_clip, loss_no_clip = clip._compute_loss(model, probe), no_clip._compute_loss(model, probe)
        expected_no_clip = -(ratio[b, t] * adv[b, 0]) / mask.size(0)
        assert loss_no_clip.item() == pytest.approx(expected_no_clip.item(), rel=1e-4, abs=1e-7)
        differs[b, t] = not torch.isclose(loss_clip, loss_no_clip, rtol=1e-6, atol=1e-9)
    assert torch.equal(differs[mask], clipped[mask])


def test_eval_mode_groups_by_num_generations_eval(char_tokenizer, tmp_path):
    kwargs = dict(loss_type="grpo", num_generations_eval=2)
    ours = make_trainer(char_tokenizer, tmp_path / "ours", **kwargs)
    stock = make_trainer(char_tokenizer, tmp_path / "stock", stock=True, **kwargs)
    inputs = group_inputs(prompts=["abc", "hello", "xyz", "qq"], group_size=2)
    ours.model.eval(), stock.model.eval()
    torch.manual_seed(5)
    out_ours = ours._generate_and_score_completions(inputs)
    torch.manual_seed(5)
    out_stock = stock._generate_and_score_completions(inputs)
    assert torch.equal(out_ours["completion_ids"], out_stock["completion_ids"])
    torch.testing.assert_close(out_ours["advantages"], out_stock["advantages"], atol=1e-6, rtol=1e-6)
    assert "advantages/mean" in ours._metrics["eval"] and "advantages/mean" not in ours._metrics["train"]


def sometimes_unscorable_reward(completion_ids, **kwargs) -> list[float | None]:
    """`id_reward`, but None (unscorable) when the token-id sum is divisible by 3."""
    return [None if sum(ids) % 3 == 0 else float(sum(ids) % 5) / 4 for ids in completion_ids]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_unscorable_completions_match_trl(char_tokenizer, tmp_path, loss_type):
    ours = make_trainer(char_tokenizer, tmp_path / "ours", reward=sometimes_unscorable_reward, loss_type=loss_type)
    stock = make_trainer(char_tokenizer, tmp_path / "stock", stock=True, reward=sometimes_unscorable_reward,
                         loss_type=loss_type)  # fmt: skip
    inputs = group_inputs(prompts=["abc", "hello", "xyz", "qq"], group_size=4)
    for seed in range(1, 30):  # find a sampled batch with a group of 2-3 scored and 1-2 unscorable completions
        out_stock = generate(stock, inputs, seed=seed)
        ids = zip(out_stock["completion_ids"], out_stock["completion_mask"], strict=True)
        unscorable = torch.tensor([sum(c[m.bool()].tolist()) % 3 == 0 for c, m in ids])
        per_group = unscorable.view(-1, 4).sum(dim=1)
        if ((per_group >= 1) & (per_group <= 2)).any():
            break
    else:
        pytest.fail("no sampling seed produced a partly unscorable group")
    out_ours = generate(ours, inputs, seed=seed)
    assert torch.equal(out_ours["completion_ids"], out_stock["completion_ids"])
    assert (out_ours["advantages"][unscorable] == 0).all()
    assert out_ours["advantages"][~unscorable].abs().max() > 0.1
    torch.testing.assert_close(out_ours["advantages"], out_stock["advantages"], atol=1e-6, rtol=1e-6)
