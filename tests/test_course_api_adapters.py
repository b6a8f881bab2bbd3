"""`trl_ext.objectives.course_api.adapters`: the courses' `run_*` test hooks the courses name, mapped onto trl_ext.

The courses' own suites are not copied here (docs/objectives.md gives the two commands that run them against these
hooks). What is checked: the hooks are exactly the ones NYU Assignment 3 names (typed from its text), each takes the
keywords of the course's interface and returns trl_ext's numbers, and the line docs/objectives.md tells a student to
append to the course's `tests/adapters.py` replaces those hooks and leaves the course's other stubs alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from trl_ext.objectives import course_api
from trl_ext.objectives.course_api import adapters

DOCS = Path(__file__).resolve().parents[1] / "docs" / "objectives.md"

# "To test your code, implement [adapters.run_...]": every hook NYU Assignment 3 names (sections 4.2 and 7.2).
COURSE_HOOKS = {
    "run_tokenize_prompt_and_output",
    "run_compute_entropy",
    "run_get_response_log_probs",
    "run_masked_normalize",
    "run_sft_microbatch_train_step",
    "run_compute_group_normalized_rewards",
    "run_compute_naive_policy_gradient_loss",
    "run_compute_grpo_clip_loss",
    "run_compute_policy_gradient_loss",
    "run_masked_mean",
    "run_grpo_microbatch_train_step",
}


def test_the_hooks_are_the_ones_the_courses_name():
    assert set(adapters.__all__) == COURSE_HOOKS
    assert all(callable(getattr(adapters, name)) for name in COURSE_HOOKS)


def _batch():
    torch.manual_seed(0)
    logp = torch.randn(3, 5).clamp(max=-0.01)
    old = logp + 0.3 * torch.randn(3, 5)
    mask = torch.rand(3, 5) > 0.4
    mask[:, 0] = True
    return logp, old, mask, torch.tensor([[0.5], [-1.0], [2.0]])


def test_loss_and_reduction_hooks_are_trl_ext_with_the_seeds_keywords():
    logp, old, mask, adv = _batch()
    got = adapters.run_compute_naive_policy_gradient_loss(raw_rewards_or_advantages=adv, policy_log_probs=logp)
    assert torch.equal(got, -adv * logp)
    got, meta = adapters.run_compute_grpo_clip_loss(
        advantages=adv, policy_log_probs=logp, old_log_probs=old, cliprange=0.2
    )
    ratio = torch.exp(logp - old)
    assert torch.allclose(got, -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv), rtol=0, atol=1e-7)
    assert "clipped" in meta
    for loss_type in ("no_baseline", "reinforce_with_baseline", "grpo_clip"):
        got, _ = adapters.run_compute_policy_gradient_loss(
            policy_log_probs=logp,
            loss_type=loss_type,
            raw_rewards=adv,
            advantages=adv,
            old_log_probs=old,
            cliprange=0.2,
        )
        want, _ = course_api.compute_policy_gradient_loss(logp, loss_type, adv, adv, old, 0.2)
        assert torch.equal(got, want)
    x = torch.randn(3, 5)
    assert torch.equal(adapters.run_masked_mean(tensor=x, mask=mask, dim=1), (x * mask).sum(1) / mask.sum(1))
    assert torch.allclose(adapters.run_masked_mean(tensor=x, mask=mask), (x * mask).sum() / mask.sum())
    got = adapters.run_masked_normalize(tensor=x, mask=mask, normalize_constant=4.0, dim=0)
    assert torch.allclose(got, (x * mask).sum(0) / 4.0)
    assert torch.allclose(adapters.run_compute_entropy(logits=x.unsqueeze(0)), course_api.compute_entropy(x[None]))


def test_group_normalized_rewards_hook():
    def reward_fn(response, ground_truth):
        r = float(response == ground_truth)
        return {"reward": r, "format_reward": 1.0, "answer_reward": r}

    adv, raw, _ = adapters.run_compute_group_normalized_rewards(
        reward_fn=reward_fn,
        rollout_responses=["4", "5", "4", "4"],
        repeated_ground_truths=["4"] * 4,
        group_size=2,
        advantage_eps=1e-6,
        normalize_by_std=False,
    )
    assert raw.tolist() == [1.0, 0.0, 1.0, 1.0] and adv.tolist() == [0.5, -0.5, 0.0, 0.0]


def test_train_step_hooks_backpropagate_as_trl_ext():
    logp, old, mask, adv = _batch()
    a = logp.clone().requires_grad_()
    loss, _ = adapters.run_grpo_microbatch_train_step(
        policy_log_probs=a, response_mask=mask, gradient_accumulation_steps=2, loss_type="grpo_clip",
        raw_rewards=None, advantages=adv, old_log_probs=old, cliprange=0.2,
    )  # fmt: skip
    b = logp.clone().requires_grad_()
    want, _ = course_api.grpo_microbatch_train_step(
        b, mask, 2, "grpo_clip", advantages=adv, old_log_probs=old, cliprange=0.2
    )
    assert torch.equal(loss, want) and torch.equal(a.grad, b.grad)
    a = logp.clone().requires_grad_()
    loss, _ = adapters.run_sft_microbatch_train_step(
        policy_log_probs=a, response_mask=mask, gradient_accumulation_steps=2, normalize_constant=3.0
    )
    # -mean_b(sum_t m logp / 3) / 2
    assert loss.item() == pytest.approx((-(logp * mask).sum(1) / 3.0).mean().item() / 2, abs=1e-6)


def test_log_prob_and_tokenize_hooks(tiny_model, char_tokenizer):
    model, tokenizer = tiny_model, char_tokenizer
    batch = adapters.run_tokenize_prompt_and_output(
        prompt_strs=["12", "a"], output_strs=["3", "bc"], tokenizer=tokenizer
    )
    want = course_api.tokenize_prompt_and_output(["12", "a"], ["3", "bc"], tokenizer)
    assert all(torch.equal(batch[k], want[k]) for k in ("input_ids", "labels", "response_mask"))
    out = adapters.run_get_response_log_probs(
        model=model, input_ids=batch["input_ids"], labels=batch["labels"], return_token_entropy=True
    )
    want = course_api.get_response_log_probs(model, batch["input_ids"], batch["labels"], return_token_entropy=True)
    assert torch.equal(out["log_probs"], want["log_probs"]) and torch.equal(
        out["token_entropy"], want["token_entropy"]
    )


COURSE_ADAPTERS = """
def run_masked_mean(tensor, mask, dim=None):
    raise NotImplementedError


def run_parse_gsm8k_response(model_output):
    raise NotImplementedError
"""


def test_the_documented_line_replaces_the_course_hooks_and_keeps_the_courses_other_stubs():
    commands = re.findall(
        r"^echo '(from trl_ext\.objectives\.course_api\.adapters import \*.*)' >> tests/adapters\.py$",
        DOCS.read_text(), flags=re.MULTILINE,
    )  # fmt: skip
    assert len(commands) == 1, "docs/objectives.md gives the line to append to the course's tests/adapters.py"
    namespace: dict = {}
    exec(compile(COURSE_ADAPTERS + commands[0] + "\n", "adapters.py", "exec"), namespace)  # a stand-in of the file
    assert namespace["run_masked_mean"] is adapters.run_masked_mean
    with pytest.raises(NotImplementedError):  # the optional part stays the course's stub
        namespace["run_parse_gsm8k_response"]("42")
    assert "python -m pytest tests" in DOCS.read_text()
