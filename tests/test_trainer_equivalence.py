"""The drop-in rule: a `trl.GRPOConfig` keyword set trains the same loss and gradients under AblationGRPOTrainer as
under stock `trl.GRPOTrainer` (TRL 1.16's own code path, not a re-typed formula).

Each case builds both trainers from the same keywords (only GRPOConfig's, so TRL's defaults stand for every field
left out), generates once per trainer with the same seed (asserting identical completions and advantages), perturbs
both policies identically (the stored old log-probs now differ from the current ones: ratios leave 1 and the clip
binds on some tokens), then does one optimizer step's work: the 16-completion batch as gradient_accumulation_steps =
2 micro-batches, `_compute_loss` and backward on each. The summed loss, every parameter gradient and the metrics both
log are compared. Run with `-s` for the table of differences.
"""

from __future__ import annotations

import pytest
import torch
from test_trainer_helpers import (
    PROMPTS,
    generate,
    group_inputs,
    id_reward,
    make_trainer,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    perturb_,
    reference_logps,
    saved_tiny_model,
    tiny_model,
    tiny_moe_model,
    window_loss_and_grads,
)

LOSS_ATOL, GRAD_RTOL = 1e-6, 1e-5
STEP = dict(num_iterations=2, gradient_accumulation_steps=2)  # old log-probs stored; 2 micro-batches per step
METRICS = ("entropy", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
           "cispo_clip_ratio", "vespo/phi_seq_mean", "policy_loss", "entropy_coef")  # fmt: skip


def length_reward(completion_ids, **kwargs) -> list[float]:
    """A second reward function: the completion's share of the 8-token budget."""
    return [len(ids) / 8 for ids in completion_ids]


CASES = {
    "GRPOConfig() defaults": {},
    "loss_type=grpo": dict(loss_type="grpo"),
    "loss_type=bnpo": dict(loss_type="bnpo"),
    "loss_type=dr_grpo": dict(loss_type="dr_grpo"),
    "loss_type=dapo": dict(loss_type="dapo"),
    "loss_type=cispo": dict(loss_type="cispo", epsilon_high=1.05),
    "loss_type=sapo": dict(loss_type="sapo"),
    "loss_type=luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "loss_type=vespo": dict(loss_type="vespo"),
    "scale_rewards=group": dict(loss_type="grpo", scale_rewards="group"),
    "scale_rewards=batch": dict(loss_type="grpo", scale_rewards="batch"),
    "scale_rewards=none": dict(loss_type="grpo", scale_rewards="none"),
    "beta=0.04": dict(beta=0.04),
    "beta=0.04 no bias correction": dict(beta=0.04, use_bias_correction_kl=False, loss_type="grpo"),
    "delta=1.1": dict(loss_type="grpo", delta=1.1),
    "importance_sampling_level=sequence": dict(loss_type="grpo", importance_sampling_level="sequence"),
    "top_entropy_quantile=0.2": dict(top_entropy_quantile=0.2),
    "epsilon_high=0.28": dict(loss_type="grpo", epsilon_high=0.28),
    "entropy_coef=0.01": dict(entropy_coef=0.01),
    "use_adaptive_entropy": dict(use_adaptive_entropy=True, entropy_coef=0.01, entropy_target=100.0),
    "off_policy_mask_threshold=0.001": dict(off_policy_mask_threshold=0.001),
    "reward_weights=[1, 0.5]": dict(reward_weights=[1.0, 0.5], loss_type="grpo"),
    "normalize_then_sum": dict(reward_weights=[1.0, 0.5], multi_objective_aggregation="normalize_then_sum"),
    "vLLM IS ratio (token)": dict(loss_type="grpo"),
    "vLLM IS ratio (sequence)": dict(),
    "vespo + vLLM IS ratio": dict(loss_type="vespo"),
}
TWO_REWARDS = ("reward_weights=[1, 0.5]", "normalize_then_sum")
# A sequence's ratio is the geometric mean of its tokens': it needs a larger step away from the sampler to clip.
PERTURBATION = {"loss_type=luspo": 0.5, "importance_sampling_level=sequence": 0.5}


def _models(case, tokenizer, tmp_path):
    if not case.startswith("beta"):
        return tiny_model(tokenizer), tiny_model(tokenizer)
    ours = saved_tiny_model(tokenizer, tmp_path / "ref")  # TRL loads the reference model from this path
    stock = tiny_model(tokenizer)
    stock.config._name_or_path = ours.config._name_or_path
    return ours, stock


def _sampler_ratio(batch, case):
    """The vLLM correction as TRL computes it from sampler log-probs (here: the stored ones plus noise)."""
    gen = torch.Generator().manual_seed(7)
    mask = batch["completion_mask"]
    diff = 0.3 * torch.randn(batch["old_per_token_logps"].shape, generator=gen) * mask
    if "sequence" in case:
        return torch.exp(diff.sum(-1, keepdim=True)).clamp(max=3.0)  # sequence_truncate, (B, 1)
    return torch.exp(diff).clamp(max=3.0)  # token_truncate, (B, T)


def _run(tokenizer, tmp_path, case, **extra):
    kwargs = {**STEP, **CASES[case], **extra}
    reward = [id_reward, length_reward] if case in TWO_REWARDS else id_reward
    model_ours, model_stock = _models(case, tokenizer, tmp_path)
    ours = make_trainer(tokenizer, tmp_path / "ours", model=model_ours, reward=reward, **kwargs)
    stock = make_trainer(tokenizer, tmp_path / "stock", stock=True, model=model_stock, reward=reward, **kwargs)
    inputs = group_inputs(PROMPTS[:4], group_size=4)
    out_ours, out_stock = generate(ours, inputs), generate(stock, inputs)
    assert torch.equal(out_ours["completion_ids"], out_stock["completion_ids"])
    assert out_stock["advantages"].abs().max() > 0.1  # the reward has spread: a zero test would prove nothing
    torch.testing.assert_close(out_ours["advantages"], out_stock["advantages"], atol=1e-6, rtol=1e-6)
    assert "old_per_token_logps" in out_ours and "old_per_token_logps" in out_stock
    if "IS ratio" in case:
        out_ours["importance_sampling_ratio"] = out_stock["importance_sampling_ratio"] = _sampler_ratio(out_ours, case)
        stock.use_vllm = stock.vllm_importance_sampling_correction = True  # what TRL's loss checks for the ratio
    if case == "use_adaptive_entropy":
        ours._last_world_entropy = stock._last_world_entropy = 0.0  # past the first window: the bonus applies
    scale = PERTURBATION.get(case, 0.05)
    perturb_(ours.model, scale=scale), perturb_(stock.model, scale=scale)
    loss_ours, grads_ours = window_loss_and_grads(ours, out_ours)
    loss_stock, grads_stock = window_loss_and_grads(stock, out_stock)
    return ours, stock, out_ours, (loss_ours, grads_ours), (loss_stock, grads_stock)


@pytest.mark.parametrize("case", list(CASES))
def test_matches_stock_trl(char_tokenizer, tmp_path, case):
    ours, stock, batch, (loss_ours, grads_ours), (loss_stock, grads_stock) = _run(char_tokenizer, tmp_path, case)

    assert max(g.abs().max().item() for g in grads_stock.values()) > 1e-3  # a real gradient to compare
    loss_diff = abs(loss_ours.item() - loss_stock.item())
    grad_abs = max((grads_ours[n] - grads_stock[n]).abs().max().item() for n in grads_stock)
    grad_rel = max(
        ((grads_ours[n] - grads_stock[n]).abs().max() / grads_stock[n].abs().max().clamp(min=1e-12)).item()
        for n in grads_stock
    )
    assert grads_ours.keys() == grads_stock.keys()
    print(f"\n[equivalence] {case:36s} loss {loss_stock.item():+.6f} |dloss| {loss_diff:.1e} "
          f"max|dgrad| {grad_abs:.1e} max rel {grad_rel:.1e}")  # fmt: skip
    assert loss_diff <= LOSS_ATOL
    assert grad_rel <= GRAD_RTOL
    for name in METRICS:
        theirs, mine = stock._metrics["train"].get(name), ours._metrics["train"].get(name)
        assert bool(theirs) == bool(mine), name  # both log it, or neither
        if theirs:
            assert mine[-2:] == pytest.approx(theirs[-2:], rel=1e-5, abs=1e-7), name
    if "clip_ratio/region_mean" in stock._metrics["train"]:
        assert sum(stock._metrics["train"]["clip_ratio/region_mean"]) > 0  # the clip binds: both branches compared
    if case.startswith("delta"):
        with torch.no_grad():
            ratio = torch.exp(reference_logps(ours.model, batch) - batch["old_per_token_logps"])
        binds = (ratio > 1.1) & (batch["advantages"][:, None] < 0) & batch["completion_mask"].bool()
        assert binds.any()  # delta caps some token's unclipped ratio


def test_matches_stock_trl_with_the_qwen3_vocabulary(qwen3_tokenizer, tmp_path):
    # The real 151,669-token vocabulary (tests/data/qwen3_tokenizer): the same tiny network, a wide LM head.
    _, _, _, (loss_ours, grads_ours), (loss_stock, grads_stock) = _run(qwen3_tokenizer, tmp_path, "loss_type=grpo")
    assert abs(loss_ours.item() - loss_stock.item()) <= LOSS_ATOL
    for name, grad in grads_stock.items():
        torch.testing.assert_close(grads_ours[name], grad, rtol=GRAD_RTOL, atol=GRAD_RTOL * grad.abs().max().item())


def test_mask_truncated_completions_matches_stock(char_tokenizer, tmp_path):
    kwargs = dict(**STEP, mask_truncated_completions=True, loss_type="grpo")
    ours = make_trainer(char_tokenizer, tmp_path / "ours", **kwargs)
    stock = make_trainer(char_tokenizer, tmp_path / "stock", stock=True, **kwargs)
    inputs = group_inputs(PROMPTS[:4], group_size=4)
    for seed in range(1, 40):  # a batch where some completions ended (eos) and some were cut at 8 tokens
        out_stock = generate(stock, inputs, seed=seed)
        kept = out_stock["completion_mask"].any(dim=1)
        if 0 < kept.sum() < kept.numel() and out_stock["advantages"][kept].abs().max() > 0:
            break
    else:
        pytest.fail("no sampling seed gave both truncated and finished completions")
    out_ours = generate(ours, inputs, seed=seed)
    assert torch.equal(out_ours["completion_mask"], out_stock["completion_mask"])  # TRL masked the truncated ones
    perturb_(ours.model), perturb_(stock.model)
    loss_ours, grads_ours = window_loss_and_grads(ours, out_ours)
    loss_stock, grads_stock = window_loss_and_grads(stock, out_stock)
    assert abs(loss_ours.item() - loss_stock.item()) <= LOSS_ATOL and loss_stock.abs() > 0
    for name, grad in grads_stock.items():
        torch.testing.assert_close(grads_ours[name], grad, rtol=GRAD_RTOL, atol=GRAD_RTOL * grad.abs().max().item())


def test_moe_aux_loss_matches_stock(char_tokenizer, tmp_path):
    # TRL adds router_aux_loss_coef * aux_loss / GA for a MoE policy; dropping it would move the loss by ~1e-2.
    ours = make_trainer(char_tokenizer, tmp_path / "ours", model=tiny_moe_model(char_tokenizer), **STEP)
    stock = make_trainer(char_tokenizer, tmp_path / "stock", stock=True, model=tiny_moe_model(char_tokenizer), **STEP)
    assert ours.aux_loss_enabled and stock.aux_loss_enabled
    inputs = group_inputs(PROMPTS[:4], group_size=4)
    out_ours, out_stock = generate(ours, inputs), generate(stock, inputs)
    assert torch.equal(out_ours["completion_ids"], out_stock["completion_ids"])
    perturb_(ours.model), perturb_(stock.model)
    loss_ours, grads_ours = window_loss_and_grads(ours, out_ours)
    loss_stock, grads_stock = window_loss_and_grads(stock, out_stock)
    aux = ours._metrics["train"]["aux_loss"]
    assert len(aux) == 2 and min(aux) > 0.5  # the load-balancing loss of both micro-batches, logged
    assert aux == pytest.approx(stock._metrics["train"]["aux_loss"])
    assert abs(loss_ours.item() - loss_stock.item()) <= LOSS_ATOL
    for name, grad in grads_stock.items():
        torch.testing.assert_close(grads_ours[name], grad, rtol=GRAD_RTOL, atol=GRAD_RTOL * grad.abs().max().item())
