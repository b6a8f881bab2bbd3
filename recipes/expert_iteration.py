"""Expert iteration (CS336 A5) beside the GRPO recipes: `recipes/gsm8k/expert_iteration.yaml` (NLPDL HW3,
Qwen3-0.6B) and `recipes/math/expert_iteration.yaml` (CS336 A5, Qwen2.5-Math-1.5B).

    trl-ext launch --accelerate-config accelerate_configs/vllm_server_gpu0_train_gpu1.yaml \\
        recipes/expert_iteration.py --config recipes/math/expert_iteration.yaml [--flag value ...]

`--help` lists every recipe field. Steps (`trl_ext.recipes.run_expert_iteration_recipe`): parse the recipe (YAML
`base:` chain, then flags) -> preflight -> the task's questions (trl_ext.tasks) -> its reward (trl_ext.rewards) ->
ExpertIterationTrainer (sample G per question, keep the correct, SFT on them; validate as GRPO does) -> save ->
validation.
"""

from __future__ import annotations

from trl_ext.recipes.expert_iteration import run_expert_iteration_recipe


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_expert_iteration_recipe(argv)


if __name__ == "__main__":
    from trl_ext.recipes.vllm_import import skip_unused_vllm

    skip_unused_vllm()  # a run without vLLM does not pay its import (TRL's GRPO module imports it)
    main()
