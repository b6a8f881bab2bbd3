"""AblationGRPOTrainer against TRL's own GRPOTrainer on the same weights and the same sampled completions.

GRPO:    (std on, masked_mean, grpo_clip, advantage_eps=1e-4) == stock loss_type="grpo", scale_rewards="group"
Dr.GRPO: (std off, masked_normalize by max_completion_length, grpo_clip)
         == stock loss_type="dr_grpo", scale_rewards="none"

Each case generates once per trainer with the same seed (asserting identical completions), compares the advantages,
then perturbs both models identically when `num_iterations=2` (so the ratios leave 1 and clipping is active) and
compares the loss and every parameter gradient.
"""

from __future__ import annotations

import pytest
import torch
from test_trainer_helpers import (
    generate,
    group_inputs,
    loss_and_grads,
    make_trainer,
    max_rel_diff,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    perturb_,
    reference_logps,
    tiny_model,
)

PAIRS = {
    "grpo": (
        dict(use_std_normalization=True, length_normalization="masked_mean", advantage_eps=1e-4),
        dict(loss_type="grpo", scale_rewards="group"),
    ),
    "dr_grpo": (
        dict(use_std_normalization=False, length_normalization="masked_normalize"),
        dict(loss_type="dr_grpo", scale_rewards="none"),
    ),
}
LOSS_ATOL, GRAD_RTOL = 1e-6, 1e-5


def _pair(char_tokenizer, tmp_path, name, **shared):
    ours_cfg, stock_cfg = PAIRS[name]
    ours = make_trainer(char_tokenizer, tmp_path / "ours", pg_loss_type="grpo_clip", **ours_cfg, **shared)
    stock = make_trainer(char_tokenizer, tmp_path / "stock", stock=True, **stock_cfg, **shared)
    return ours, stock


@pytest.mark.parametrize("num_iterations", [1, 2])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_matches_trl_builtin(char_tokenizer, tmp_path, name, num_iterations):
    _check_matches_trl_builtin(char_tokenizer, tmp_path, name, num_iterations)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_matches_trl_builtin_with_the_qwen3_vocabulary(qwen3_tokenizer, tmp_path, name):
    # The real 151,669-token vocabulary (tests/data/qwen3_tokenizer): the same tiny network, a wide LM head.
    _check_matches_trl_builtin(qwen3_tokenizer, tmp_path, name, num_iterations=2)


def _check_matches_trl_builtin(tokenizer, tmp_path, name, num_iterations):
    ours, stock = _pair(tokenizer, tmp_path, name, num_iterations=num_iterations)
    inputs = group_inputs(prompts=["abc", "hello"], group_size=4)
    out_ours, out_stock = generate(ours, inputs), generate(stock, inputs)

    assert torch.equal(out_ours["completion_ids"], out_stock["completion_ids"])
    assert out_stock["advantages"].abs().max() > 0.1  # the reward has spread: a zero test would prove nothing
    torch.testing.assert_close(out_ours["advantages"], out_stock["advantages"], atol=1e-6, rtol=1e-6)
    # TRL keeps old log-probs only when a rollout is reused; both trainers must agree on that too.
    assert ("old_per_token_logps" in out_ours) == ("old_per_token_logps" in out_stock) == (num_iterations == 2)

    if num_iterations == 2:  # the second pass over the rollout: the policy has moved since sampling
        perturb_(ours.model), perturb_(stock.model)
    loss_ours, grads_ours = loss_and_grads(ours, out_ours)
    loss_stock, grads_stock = loss_and_grads(stock, out_stock)

    assert max(g.abs().max().item() for g in grads_stock.values()) > 1e-3  # a real gradient to compare
    assert abs(loss_ours.item() - loss_stock.item()) <= LOSS_ATOL
    assert max_rel_diff(grads_ours, grads_stock) <= GRAD_RTOL
    clip_ours = ours._metrics["train"]["clip_ratio/region_mean"][-1]
    assert clip_ours == pytest.approx(stock._metrics["train"]["clip_ratio/region_mean"][-1], abs=1e-7)
    assert ours._metrics["train"]["entropy"][-1] == pytest.approx(stock._metrics["train"]["entropy"][-1], rel=1e-6)
    if num_iterations == 2:
        assert 0.0 < clip_ours < 1.0  # clipping active on some tokens, not all: both branches of the min compared
    else:
        assert clip_ours == 0.0
    loss_diff = abs(loss_ours.item() - loss_stock.item())
    print(
        f"\n[equivalence {name} vocab={len(tokenizer)} num_iterations={num_iterations}] loss {loss_ours.item():.6g}"
        f" |diff| {loss_diff:.2e}; max rel grad diff {max_rel_diff(grads_ours, grads_stock):.2e}; clip {clip_ours:.3f}"
    )


def test_eval_mode_groups_by_num_generations_eval(char_tokenizer, tmp_path):
    ours, stock = _pair(char_tokenizer, tmp_path, "grpo", num_generations_eval=2)
    inputs = group_inputs(prompts=["abc", "hello", "xyz", "qq"], group_size=2)
    ours.model.eval(), stock.model.eval()
    torch.manual_seed(5)
    out_ours = ours._generate_and_score_completions(inputs)
    torch.manual_seed(5)
    out_stock = stock._generate_and_score_completions(inputs)
    assert torch.equal(out_ours["completion_ids"], out_stock["completion_ids"])
    torch.testing.assert_close(out_ours["advantages"], out_stock["advantages"], atol=1e-6, rtol=1e-6)
    assert "advantages/mean" in ours._metrics["eval"] and "advantages/mean" not in ours._metrics["train"]


def test_no_baseline_uses_raw_rewards_and_fixes_the_table(char_tokenizer, tmp_path):
    ours = make_trainer(char_tokenizer, tmp_path, pg_loss_type="no_baseline")
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
        num_iterations=2,  # old log-probs present and the policy moved: the naive loss must ignore both
    )
    out = generate(ours, group_inputs(prompts=["abc", "hello"]))
    perturb_(ours.model)
    _, grads = loss_and_grads(ours, out)

    model = ours.model
    model.zero_grad(set_to_none=True)
    rewards = out["advantages"]  # checked against TRL's advantages in test_matches_trl_builtin
    logps, mask = reference_logps(model, out), out["completion_mask"].float()
    per_seq = (-rewards[:, None] * logps * mask).sum(-1)
    per_seq = per_seq / (mask.sum(-1).clamp(min=1) if length_normalization == "masked_mean" else 8)
    per_seq.mean().backward()
    assert max_rel_diff(grads, {n: p.grad for n, p in model.named_parameters()}) <= 1e-4


def test_no_clip_differs_from_clip_exactly_where_ratios_leave_the_band(char_tokenizer, tmp_path):
    eps = 0.2
    model = tiny_model(char_tokenizer)
    shared = dict(num_iterations=2, length_normalization="masked_normalize", normalize_constant=1.0, epsilon=eps)
    clip = make_trainer(char_tokenizer, tmp_path / "clip", model=model, pg_loss_type="grpo_clip", **shared)
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


def sometimes_unscorable_reward(completion_ids, **kwargs) -> list[float | None]:
    """`id_reward`, but None (unscorable) when the token-id sum is divisible by 3."""
    return [None if sum(ids) % 3 == 0 else float(sum(ids) % 5) / 4 for ids in completion_ids]


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_unscorable_completions_match_trl(char_tokenizer, tmp_path, name):
    ours, stock = _pair(char_tokenizer, tmp_path, name)
    ours.reward_funcs = stock.reward_funcs = [sometimes_unscorable_reward]
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
