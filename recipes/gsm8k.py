"""GSM8K with GRPO and the R1-Zero prompt (NLPDL HW3; `recipes/gsm8k/*.yaml`).

    accelerate launch --config_file accelerate_configs/vllm_server_gpu0_train_gpu1.yaml recipes/gsm8k.py \\
        --config recipes/gsm8k/r1_zero.yaml [--flag value ...]

`--help` lists every recipe field. Steps: parse the recipe (YAML `base:` chain, then flags) -> GSM8K questions
(trl_ext.tasks) -> r1_zero reward (trl_ext.rewards) -> AblationGRPOTrainer -> train -> save -> validation.
"""

from __future__ import annotations

from trl_ext.recipes import run_grpo_recipe

TASK = "gsm8k"


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_grpo_recipe(TASK, argv)


if __name__ == "__main__":
    from trl_ext.recipes.vllm_import import skip_unused_vllm

    skip_unused_vllm()  # a run without vLLM does not pay its import (TRL's GRPO module imports it)
    main()
