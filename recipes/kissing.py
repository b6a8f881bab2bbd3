"""Kissing configurations with GRPO (NLPDL HW3, section 7; `recipes/kissing/*.yaml`): the reward runs the policy's
programs in the sandbox and scores them with the exact verifier.

    accelerate launch --config_file accelerate_configs/vllm_server_gpu0_train_gpu1.yaml recipes/kissing.py \\
        --config recipes/kissing/grpo.yaml [--flag value ...]

`--help` lists every recipe field. Steps: parse the recipe (YAML `base:` chain, then flags) -> the kissing prompt
rows (trl_ext.tasks.kissing) -> the `kissing` reward (trl_ext.rewards.kissing) -> AblationGRPOTrainer -> train ->
save -> validation.
"""

from __future__ import annotations

from trl_ext.recipes import run_grpo_recipe

TASK = "kissing"


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_grpo_recipe(TASK, argv)


if __name__ == "__main__":
    from trl_ext.recipes.vllm_import import skip_unused_vllm

    skip_unused_vllm()  # a run without vLLM does not pay its import (TRL's GRPO module imports it)
    main()
