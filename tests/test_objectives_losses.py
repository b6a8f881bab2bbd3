"""Per-token loss axis: every registered loss against a plain-Python loop written from its paper's formula, hand
numbers at the kinks, VESPO's weights against TRL's own `get_gamma_weights`, gradcheck, and the declared inputs the
config and the trainer rely on. (The losses against TRL's whole `_compute_loss` path: test_trainer_equivalence.py.)
"""

from __future__ import annotations

import math

import pytest
import torch
from trl import GRPOTrainer

from trl_ext.objectives import PG_LOSS_TYPES, PG_LOSSES
from trl_ext.objectives.losses import vespo_gamma_weights

PARAMS = dict(
    epsilon=0.2,
    epsilon_high=0.28,
    delta=None,
    sapo_temperature_pos=1.0,
    sapo_temperature_neg=1.05,
    vespo_k_pos=2.0,
    vespo_lambda_pos=3.0,
    vespo_k_neg=3.0,
    vespo_lambda_neg=2.0,
)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def loop_loss(name, logp, old, adv, mask, level="token", **p):
    """Reference `(B, T)` per-token loss from Python floats (a per-sequence loss repeated over its tokens)."""
    p = {**PARAMS, **p}
    out = []
    for lp_row, old_row, a, m_row in zip(logp, old, adv, mask, strict=True):
        log_r = [lp - o for lp, o in zip(lp_row, old_row, strict=True)]
        n = sum(m_row)
        seq = sum(m * lr for m, lr in zip(m_row, log_r, strict=True)) / max(n, 1)
        row = []
        for lp, lr in zip(lp_row, log_r, strict=True):
            r = math.exp(seq if level == "sequence" or name in ("gspo", "luspo") else lr)
            if name == "reinforce":
                v = -a * lp
            elif name in ("grpo_clip", "gspo", "luspo"):
                capped = min(r, p["delta"]) if p["delta"] is not None else r
                clipped = min(max(r, 1 - p["epsilon"]), 1 + p["epsilon_high"])
                v = -min(capped * a, clipped * a) * (n if name == "luspo" else 1)
            elif name == "grpo_no_clip":
                v = -r * a
            elif name == "cispo":
                v = -min(r, p["epsilon_high"]) * a * lp
            elif name == "sapo":
                tau = p["sapo_temperature_pos"] if a > 0 else p["sapo_temperature_neg"]
                v = -sigmoid(tau * (r - 1)) * 4 / tau * a
            elif name == "vespo":
                log_w = sum(m * min(max(x, -20), 20) for m, x in zip(m_row, log_r, strict=True))
                log_w = min(max(log_w, math.log(1e-8)), 20)
                k, lam = (
                    (p["vespo_k_pos"], p["vespo_lambda_pos"]) if a >= 0 else (p["vespo_k_neg"], p["vespo_lambda_neg"])
                )
                v = -math.exp(lam + k * log_w - lam * math.exp(log_w)) * a * lp
            row.append(v)
        out.append(row)
    return out


def make_case(seed, b=5, t=7):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(b, 1, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).double()
    return logp, old, adv, mask


def run(name, logp, old, adv, mask, **overrides):
    loss, metrics = PG_LOSSES.call(
        name, log_probs=logp, old_log_probs=old, advantages=adv, mask=mask, **{**PARAMS, **overrides}
    )
    return loss.expand_as(logp), metrics


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("name", PG_LOSS_TYPES)
def test_loss_matches_loop(name, level):
    logp, old, adv, mask = make_case(len(name))
    got, _ = run(name, logp, old, adv, mask, importance_sampling_level=level)
    want = loop_loss(name, logp.tolist(), old.tolist(), adv.squeeze(1).tolist(), mask.tolist(), level)
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)


def test_delta_caps_the_unclipped_ratio_of_negative_advantages():
    # ratio 4 with A = -1: the clipped surrogate's max(4 * -1, 1.2 * -1) is the unbounded 4; delta = 1.5 caps it.
    logp, old = torch.tensor([[math.log(4.0)]]), torch.zeros(1, 1)
    adv, mask = torch.tensor([[-1.0]]), torch.ones(1, 1)
    assert run("grpo_clip", logp, old, adv, mask)[0].item() == pytest.approx(4.0)
    assert run("grpo_clip", logp, old, adv, mask, delta=1.5)[0].item() == pytest.approx(1.5)
    # with A = +1 the clip binds first: delta changes nothing
    assert run("grpo_clip", logp, old, -adv, mask, delta=1.5)[0].item() == pytest.approx(-1.28)


def test_gspo_ratio_is_the_geometric_mean_and_luspo_scales_by_length():
    # per-token log-ratios 0.1, 0.3 (and padding): s = exp(0.2); |y| = 2
    logp = torch.tensor([[0.1, 0.3, 9.0]], dtype=torch.float64)
    old, mask, adv = torch.zeros(1, 3, dtype=torch.float64), torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([[-1.0]])
    gspo, metrics = PG_LOSSES.call("gspo", log_probs=logp, old_log_probs=old, advantages=adv, mask=mask, **PARAMS)
    assert gspo.shape == (1, 1) and gspo.item() == pytest.approx(math.exp(0.2))
    assert metrics["clip_ratio/region_mean"].item() == 0.0  # 1.22 with A < 0 is not below 1 - eps
    luspo, _ = PG_LOSSES.call("luspo", log_probs=logp, old_log_probs=old, advantages=adv, mask=mask, **PARAMS)
    assert luspo.item() == pytest.approx(2 * math.exp(0.2))


def test_cispo_keeps_a_gradient_where_the_clip_binds():
    # ratio 2 > eps_high = 0.28 ... the weight is capped at 0.28 but, unlike grpo_clip, the token still learns.
    logp = torch.tensor([[math.log(2.0)]], dtype=torch.float64, requires_grad=True)
    old, mask, adv = (
        torch.zeros(1, 1, dtype=torch.float64),
        torch.ones(1, 1),
        torch.tensor([[1.0]], dtype=torch.float64),
    )
    loss, metrics = PG_LOSSES.call("cispo", log_probs=logp, old_log_probs=old, advantages=adv, mask=mask, **PARAMS)
    loss.sum().backward()
    assert logp.grad.item() == pytest.approx(-0.28)  # d(-sg(0.28) * A * logp) / dlogp
    assert metrics["cispo_clip_ratio"].item() == 1.0
    clip = logp.detach().clone().requires_grad_()
    PG_LOSSES.call("grpo_clip", log_probs=clip, old_log_probs=old, advantages=adv, mask=mask, **PARAMS)[
        0
    ].sum().backward()
    assert clip.grad.item() == 0.0


def test_sapo_at_ratio_one_is_the_plain_policy_gradient():
    # value -(4 / tau) sigmoid(0) A = -2 A / tau; gradient -(4 / tau) sigmoid'(0) tau A = -A, for both signs of A.
    logp = torch.zeros(2, 1, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[2.0], [-3.0]], dtype=torch.float64)
    loss, _ = PG_LOSSES.call("sapo", log_probs=logp, old_log_probs=torch.zeros(2, 1).double(), advantages=adv,
                             mask=torch.ones(2, 1), **PARAMS)  # fmt: skip
    assert loss.squeeze(1).tolist() == pytest.approx([-2 * 2.0 / 1.0, -2 * -3.0 / 1.05])
    loss.sum().backward()
    assert logp.grad.squeeze(1).tolist() == pytest.approx([-2.0, 3.0])


@pytest.mark.parametrize("with_is_ratio", [False, True])
def test_vespo_weights_match_trl_get_gamma_weights(with_is_ratio):
    logp, old, adv, mask = make_case(9)
    is_ratio = torch.exp(0.1 * torch.randn_like(logp)) if with_is_ratio else None
    ours = vespo_gamma_weights(adv, logp - old, mask, is_ratio, 2.0, 3.0, 3.0, 2.0)
    trl = GRPOTrainer.get_gamma_weights(adv, logp - old, mask, is_ratio, 2.0, 3.0, 3.0, 2.0)  # TRL's own code
    assert torch.equal(ours, trl)
    at_one = vespo_gamma_weights(adv, torch.zeros_like(logp), mask, None, 2.0, 3.0, 3.0, 2.0)
    assert torch.allclose(at_one, torch.ones_like(at_one))  # phi(1) = e^lam * 1 * e^-lam


@pytest.mark.parametrize("name", [name for name in PG_LOSS_TYPES if name not in ("cispo", "vespo")])
def test_gradcheck(name):
    logp, old, adv, mask = make_case(4, b=3, t=4)
    logp = logp.clone().requires_grad_()
    # keep every token and sequence ratio away from the clip kinks, where the loss is not differentiable
    ratios = torch.cat([(logp - old).exp().flatten(), ((logp - old) * mask).sum(-1).div(mask.sum(-1)).exp()])
    for kink in (0.8, 1.28, 0.28):
        assert ((ratios - kink).abs() > 1e-3).all()
    fn = lambda lp: PG_LOSSES.call(name, log_probs=lp, old_log_probs=old, advantages=adv, mask=mask, **PARAMS)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (logp,))


@pytest.mark.parametrize("name", ["cispo", "vespo"])
def test_stop_gradient_losses_differentiate_only_logp(name):
    # cispo and vespo weight `-A logp` by a detached function of the ratio: d loss / d logp = -weight * A.
    logp, old, adv, mask = make_case(6)
    logp = logp.clone().requires_grad_()
    loss, _ = run(name, logp, old, adv, mask)
    loss.sum().backward()
    weight = (loss / (-adv * logp)).detach()
    assert torch.allclose(logp.grad, -weight * adv, rtol=1e-10)


def test_declared_inputs():
    declared = {name: PG_LOSSES.parameters(name) for name in PG_LOSS_TYPES}
    # the config rejects an off-policy run for a loss that cannot see the sampling policy
    assert {name for name, params in declared.items() if "old_log_probs" not in params} == {"reinforce"}
    # the trainer multiplies every other loss by the vLLM ratio; vespo folds it into its weight
    assert {name for name, params in declared.items() if "importance_sampling_ratio" in params} == {"vespo"}
    assert {name for name, params in declared.items() if "epsilon" in params} == {"grpo_clip", "gspo", "luspo"}
    assert {name for name, params in declared.items() if "delta" in params} == {"grpo_clip", "gspo", "luspo"}
    assert {name for name, params in declared.items() if "importance_sampling_level" in params} == {
        "grpo_clip", "grpo_no_clip", "cispo", "sapo",
    }  # fmt: skip
    assert PG_LOSS_TYPES == ("reinforce", "grpo_clip", "grpo_no_clip", "gspo", "luspo", "cispo", "sapo", "vespo")
    with pytest.raises(ValueError, match="unknown pg_loss_type 'ppo'; valid names: reinforce, grpo_clip"):
        PG_LOSSES.lookup("ppo")
