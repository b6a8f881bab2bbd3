"""What the axes do to training, per axis value (so a trainer that ignored a field, or a loss with a flipped sign,
fails here rather than passing "for every axis alike").

1. Every per-token loss raises a reward a tiny model can learn in a few dozen CPU steps: the share of digits in the
   completion (about 10% of the character vocabulary, so a random model starts near 0.1). The control: the same run
   with the reward negated lowers the digit share, so the rise comes from the reward, not from drift.
2. Each advantage estimator's invariances, seen in the trainer's gradient: adding a constant to every reward leaves
   every baselined estimator's update unchanged (not `raw`'s); doubling every reward leaves the std-normalised
   ones unchanged (not `raw`, `group_mean`, `rloo`, `opo`).
"""

from __future__ import annotations

import pytest
from outcomes import record_margin
from test_trainer_helpers import (
    PROMPTS,
    digit_share_reward,
    generate,
    group_inputs,
    id_reward,
    loss_and_grads,
    make_trainer,
    max_rel_diff,
    one_torch_thread,  # noqa: F401 (autouse fixture)
)

from trl_ext.objectives import ADVANTAGE_TYPES, ADVANTAGES, PG_LOSS_TYPES

STEPS, WINDOW, MARGIN = 24, 2, 0.25  # 24 optimizer steps; compare the mean reward of the first 2 and last 2 logs
# Margins (tests/scripts/outcome_matrix.py, 3 kernel sets x 1 and 2 threads: docs/testing.md). A window is 2 logs of
# 16 completions (8 for reinforce). The rise measured 0.79 to 0.91 against the 0.25 asked; the digit share of one
# completion has SD about 0.1 at the start and near the end, so the window difference has SE about 0.025 (0.035 for
# reinforce): the bound is more than 10 SE below every run, and even the worst-case SD of 0.5 for a reward in [0, 1]
# leaves it about 4 SE below. The negated control fell from 0.075 to 0.008: the first window's SE is about 0.019,
# so the fall is about 3.5 SE, asserted only to be > 0.
SHIFT_INVARIANT = {name for name in ADVANTAGE_TYPES if name != "raw"}
SCALE_INVARIANT = {"group_mean_std", "batch_std", "reinforce_pp", "passk"}


def negated_digit_share(completions, **kwargs) -> list[float]:
    return [-r for r in digit_share_reward(completions)]


def _rewards_over_training(char_tokenizer, tmp_path, pg_loss_type, reward=digit_share_reward):
    ratio_loss = pg_loss_type != "reinforce"
    trainer = make_trainer(
        char_tokenizer,
        tmp_path,
        reward=reward,
        pg_loss_type=pg_loss_type,
        length_normalization="masked_mean",
        group_size=4,
        # Ratio losses: 2 optimizer steps per rollout, the second off-policy (clipping can act); -A logp on-policy.
        rollout_batch_size=16 if ratio_loss else 8,
        train_batch_size=8,
        max_steps=STEPS,
        learning_rate=3e-2,
        lr_scheduler_type="constant",
        **({"epsilon_high": 5.0} if pg_loss_type == "cispo" else {}),
    )
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]  # logged once per rollout
    return sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW


@pytest.mark.parametrize("pg_loss_type", PG_LOSS_TYPES)
def test_mean_reward_rises(char_tokenizer, tmp_path, pg_loss_type):
    before, after = _rewards_over_training(char_tokenizer, tmp_path, pg_loss_type)
    record_margin(f"reward_rises[{pg_loss_type}]", before=before, after=after, rise=after - before, bound=MARGIN)
    assert after - before >= MARGIN, (before, after)


def test_negated_reward_lowers_the_digit_share(char_tokenizer, tmp_path):
    before, after = _rewards_over_training(char_tokenizer, tmp_path, "grpo_clip", reward=negated_digit_share)
    record_margin("negated_reward_lowers", before=-before, after=-after, fall=after - before, bound=0.0)
    assert -after < -before  # the digit share fell: the rise above follows the reward's sign


def _shifted(fn, offset=0.0, scale=1.0):
    def reward(completion_ids, **kwargs):
        return [scale * r + offset for r in fn(completion_ids)]

    return reward


@pytest.mark.parametrize("advantage_type", ADVANTAGE_TYPES)
def test_advantage_invariances_show_in_the_update(char_tokenizer, tmp_path, advantage_type):
    eps = {"advantage_eps": 0.0} if "advantage_eps" in ADVANTAGES.parameters(advantage_type) else {}
    trainer = make_trainer(char_tokenizer, tmp_path, advantage_type=advantage_type, loss_type="grpo", **eps)
    inputs = group_inputs(PROMPTS[:4], group_size=4)
    grads = {}
    for name, reward in {"r": id_reward, "r + 3": _shifted(id_reward, 3.0), "2 r": _shifted(id_reward, 0, 2)}.items():
        trainer.reward_funcs = [reward]
        grads[name] = loss_and_grads(trainer, generate(trainer, inputs))[1]  # same seed, same weights: same samples
    shift, scale = max_rel_diff(grads["r + 3"], grads["r"]), max_rel_diff(grads["2 r"], grads["r"])
    record_margin(f"invariance[{advantage_type}]", shift=shift, scale=scale, bounds="<1e-5 or >1e-2")
    assert (shift < 1e-5) == (advantage_type in SHIFT_INVARIANT), shift
    assert (scale < 1e-5) == (advantage_type in SCALE_INVARIANT), scale
    assert max(shift, scale) < 1e-5 or max(shift, scale) > 1e-2  # a real difference where there is one
