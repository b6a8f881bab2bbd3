"""SFT on MATH reasoning traces with TRL's SFTTrainer (NYU Assignment 3's dataset-size sweep; `recipes/sft/*.yaml`).

    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/sft.py \\
        --config recipes/sft/size_512.yaml [--flag value ...]

`--help` lists every recipe field. Steps (`trl_ext.recipes.run_sft_recipe`): parse the recipe (YAML `base:` chain,
then flags) -> output_dir / resume and wandb checks -> `messages` traces as prompt -> completion conversations (loss
on the assistant turn only) -> SFTTrainer -> train -> save -> validation loss.
"""

from __future__ import annotations

from trl_ext.recipes import run_sft_recipe


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_sft_recipe(argv)


if __name__ == "__main__":
    from trl_ext.recipes.vllm_import import skip_unused_vllm

    skip_unused_vllm()  # a run without vLLM does not pay its import (TRL's GRPO module imports it)
    main()
