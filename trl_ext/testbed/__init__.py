"""The CPU testbed: the Countdown problems, the ~0.6M-parameter Qwen3, its SFT warm start and its held-out scoring.

Shared by the embedded default (`make run`, `trl_ext.demo`) and the recipes that train the demo's GRPO phase
(`demo_warm_start: true`, `trl_ext.recipes.demo_warm_start`); it imports neither. Modules: `config`
(`TestbedConfig`; with `working`, SFT completions write a worked search before the answer, so response length is
free apart from correctness), `problems` (the fixed held-out set, the labelled / unlabelled split, SFT and GRPO rows),
`sft` (SFT with TRL's `SFTTrainer`), `warm_start` (the model, the warm start built once into a folder, the problems
for other entry points), `heldout` (greedy and sampled accuracy, pass@k, response entropy and lengths).
"""

from trl_ext.testbed.config import TestbedConfig
from trl_ext.testbed.problems import DEMO_CHARS, EVAL_SEED, grpo_dataset, make_splits, problem_key, split_labelled

__all__ = [
    "DEMO_CHARS",
    "EVAL_SEED",
    "TestbedConfig",
    "grpo_dataset",
    "make_splits",
    "problem_key",
    "split_labelled",
]
