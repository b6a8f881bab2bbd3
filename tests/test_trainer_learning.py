"""Every per-token loss with both reductions learns a reward a tiny model can learn in a few dozen CPU steps.

The reward is the share of digits in the completion: about 10% of the character vocabulary, so a random model
starts near 0.1 and the policy only has to move probability mass onto ten tokens. Two optimizer steps per rollout
(`rollout_batch_size = 2 * train_batch_size`) make the second step off-policy, so clipping can act.
"""

from __future__ import annotations

import pytest
from test_trainer_helpers import digit_share_reward, make_trainer, one_torch_thread  # noqa: F401 (autouse fixture)

from trl_ext.objectives import LENGTH_NORMALIZATIONS, PG_LOSS_TYPES

STEPS, WINDOW, MARGIN = 24, 2, 0.25  # 24 optimizer steps = 12 rollouts; compare the first 2 with the last 2


@pytest.mark.parametrize("length_normalization", LENGTH_NORMALIZATIONS)
@pytest.mark.parametrize("pg_loss_type", PG_LOSS_TYPES)
def test_mean_reward_rises(char_tokenizer, tmp_path, pg_loss_type, length_normalization):
    trainer = make_trainer(
        char_tokenizer,
        tmp_path,
        reward=digit_share_reward,
        pg_loss_type=pg_loss_type,
        length_normalization=length_normalization,
        group_size=4,
        rollout_batch_size=16,
        train_batch_size=8,
        max_steps=STEPS,
        learning_rate=3e-2,
        lr_scheduler_type="constant",
    )
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]  # logged once per rollout
    assert len(rewards) == STEPS // 2
    before, after = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"[learning {pg_loss_type} {length_normalization}] mean reward {before:.3f} -> {after:.3f}")
    assert after - before >= MARGIN, (before, after)
