"""MATH with GRPO (NYU Assignment 3, NLPDL HW3 and CS336 A5, and CS336 A5's r1_zero vs question_only prompt ablation;
`recipes/math/*.yaml`).

    accelerate launch --config_file accelerate_configs/vllm_server_gpu0_train_gpu1.yaml recipes/math_grpo.py \\
        --config recipes/math/r1_zero.yaml [--flag value ...]

`--help` lists every recipe field. Steps: parse the recipe (YAML `base:` chain, then flags) -> MATH problems
(trl_ext.tasks) -> r1_zero / question_only reward (trl_ext.rewards) -> AblationGRPOTrainer -> train -> save ->
validation.
"""

from __future__ import annotations

from trl_ext.recipes import run_grpo_recipe

TASK = "math"


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_grpo_recipe(TASK, argv)


if __name__ == "__main__":
    from trl_ext.recipes.vllm_import import skip_unused_vllm

    skip_unused_vllm()  # a run without vLLM does not pay its import (TRL's GRPO module imports it)
    main()
