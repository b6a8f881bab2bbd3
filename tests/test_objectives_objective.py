"""The composed per-token objective (masks, vLLM sampler ratio, KL penalty), the entropy bonus and the adaptive
entropy coefficient, by hand numbers."""

from __future__ import annotations

import math

import pytest
import torch

from trl_ext.objectives import adaptive_entropy_coef, entropy_bonus, k3_kl, policy_objective

CLIP = dict(epsilon=0.2, epsilon_high=0.2)


def test_k3_kl_by_hand():
    # d = ref - logp = log 2: e^d - d - 1 = 1 - log 2; zero where the models agree
    kl = k3_kl(torch.tensor([[0.0, -1.0]]), torch.tensor([[math.log(2.0), -1.0]]))
    assert kl[0].tolist() == pytest.approx([1 - math.log(2.0), 0.0])


def test_masks_and_sampler_ratio_multiply_the_policy_loss():
    logp, old = torch.zeros(2, 2), torch.zeros(2, 2)  # ratio 1: grpo_clip loss = -A per token
    adv, mask = torch.tensor([[1.0], [2.0]]), torch.ones(2, 2)
    loss, _ = policy_objective(
        "grpo_clip",
        logp,
        old,
        adv,
        mask,
        importance_sampling_ratio=torch.tensor([[0.5, 2.0], [1.0, 3.0]]),
        off_policy_mask=torch.tensor([[1.0], [0.0]]),
        entropy_mask=torch.tensor([[True, False], [True, True]]),
        **CLIP,
    )
    assert loss.tolist() == [[-0.5, -0.0], [-0.0, -0.0]]


def test_vespo_takes_the_sampler_ratio_into_its_weight_not_the_loss():
    logp, old, adv, mask = torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0]]), torch.ones(1, 2)
    vespo = dict(vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)
    plain, _ = policy_objective("vespo", logp - 1, old - 1, adv, mask, **vespo)
    ratio = torch.full((1, 2), math.exp(0.5))  # w = exp(0.5 + 0.5) = e
    corrected, metrics = policy_objective(
        "vespo", logp - 1, old - 1, adv, mask, importance_sampling_ratio=ratio, **vespo
    )
    phi = math.exp(3.0 + 2.0 * 1.0 - 3.0 * math.e)  # lam + k log w - lam w with log w = 1
    assert plain[0].tolist() == pytest.approx([1.0, 1.0])  # phi(1) = 1: -A logp = -1 * -1
    assert corrected[0].tolist() == pytest.approx([phi, phi])  # not multiplied by the ratio again
    assert metrics["vespo/phi_seq_mean"].item() == pytest.approx(phi)


@pytest.mark.parametrize("bias_correction", [False, True])
def test_kl_is_added_after_the_masks(bias_correction):
    logp = torch.tensor([[math.log(2.0), 0.0]])
    old, ref = torch.zeros(1, 2), torch.zeros(1, 2)
    adv, mask = torch.tensor([[0.0]]), torch.ones(1, 2)
    loss, metrics = policy_objective(
        "reinforce", logp, old, adv, mask, entropy_mask=torch.tensor([[False, False]]), ref_log_probs=ref, beta=0.5,
        use_bias_correction_kl=bias_correction,
    )  # fmt: skip
    kl = [0.5 + math.log(2.0) - 1, 0.0]  # e^-log2 + log 2 - 1
    if bias_correction:
        kl = [kl[0] * 2.0, 0.0]  # times the token ratio exp(logp - old) = 2
    assert loss[0].tolist() == pytest.approx([0.5 * kl[0], 0.0])  # the entropy mask dropped the policy term only
    assert metrics["kl"][0].tolist() == pytest.approx(kl)
    with pytest.raises(ValueError, match="beta=0.5 needs the reference model's log-probs"):
        policy_objective("reinforce", logp, old, adv, mask, beta=0.5)


def test_entropy_bonus_by_hand():
    entropies, mask = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]), torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert entropy_bonus(entropies, mask).item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert entropy_bonus(entropies, mask, accumulation_steps=4).item() == pytest.approx(0.5)
    assert entropy_bonus(entropies, torch.zeros(2, 3)).item() == 0.0


def test_adaptive_entropy_coef_steps_within_bounds():
    assert adaptive_entropy_coef(0.1, 0.1, 0.2, 0.05, 0.0, 0.12) == pytest.approx(0.12)  # low entropy: up, capped
    assert adaptive_entropy_coef(0.1, 0.3, 0.2, 0.05, 0.0, 1.0) == pytest.approx(0.05)  # high entropy: down
    assert adaptive_entropy_coef(0.02, 0.3, 0.2, 0.05, 0.0, 1.0) == 0.0  # floored
