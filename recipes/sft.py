"""SFT on MATH reasoning traces with TRL's SFTTrainer (seed 001's dataset-size sweep; `recipes/sft/*.yaml`).

    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/sft.py \\
        --config recipes/sft/size_512.yaml [--flag value ...]

`--help` lists every recipe field. Steps: parse the recipe (YAML `base:` chain, then flags) -> `messages` traces
as prompt -> completion conversations (loss on the assistant turn only) -> SFTTrainer -> train -> save ->
validation loss.
"""

from __future__ import annotations

import os
import sys

# `python recipes/<x>.py` puts recipes/ first on sys.path, where recipes/math.py would shadow the standard `math`.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

from trl_ext.recipes import build_sft_trainer, load_sft_datasets, parse_recipe_args, train_save_evaluate


def main(argv: list[str] | None = None) -> dict[str, float]:
    script_args, training_args, model_args = parse_recipe_args("sft", argv)
    # The traces are checked before the model loads: a bad file or row fails in seconds.
    train_dataset, eval_dataset = load_sft_datasets(script_args)
    trainer = build_sft_trainer(training_args, model_args, train_dataset, eval_dataset)
    return train_save_evaluate(trainer, training_args, script_args, dataset_name=script_args.dataset_source)


if __name__ == "__main__":
    main()
