"""Expert iteration (CS336 A5): sample G completions per question, keep those the reward marks correct, SFT the
policy on them, repeat; built on TRL's GRPO generation, rewards and validation (see `trainer`).

Modules: `config` (`ExpertIterationConfig`), `sft` (question sampling, the kept mask, SFT batches and loss),
`trainer` (`ExpertIterationTrainer`).
"""

from trl_ext.expert_iteration.config import ExpertIterationConfig
from trl_ext.expert_iteration.sft import QuestionSampler, completion_log_probs, kept_mask, sft_batches
from trl_ext.expert_iteration.trainer import ExpertIterationTrainer

__all__ = [
    "ExpertIterationConfig",
    "ExpertIterationTrainer",
    "QuestionSampler",
    "completion_log_probs",
    "kept_mask",
    "sft_batches",
]
