"""Countdown with GRPO / Dr. GRPO and the courses' ablations (`recipes/countdown/*.yaml`).

    accelerate launch --config_file accelerate_configs/vllm_server_gpu0_train_gpu1.yaml recipes/countdown.py \\
        --config recipes/countdown/qwen3_1.7b_grpo_l512.yaml [--flag value ...]

`--demo [demo flags]` runs the embedded CPU demo instead, `trl_ext.demo.main`: a tiny model that learns Countdown on
a CPU, offline, in minutes (`make run`). Without `--config` and without `--demo`, the script runs the demo only
where no GPU is visible (and says so); with a GPU visible it exits with the command of the GPU recipe, so a GPU
machine never trains the CPU toy by accident. `--help` lists every recipe field.

Steps: parse the recipe (YAML `base:` chain, then flags) -> Countdown problems (trl_ext.tasks) -> countdown reward
(trl_ext.rewards) -> AblationGRPOTrainer -> train -> save -> validation.
"""

from __future__ import annotations

import sys

from trl_ext.recipes import run_grpo_recipe

TASK = "countdown"
DEMO_FLAG = "--demo"


def _has_config(argv: list[str]) -> bool:
    return any(arg == "--config" or arg.startswith("--config=") for arg in argv)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None, cuda_available: bool | None = None) -> dict[str, float]:
    """Runs the recipe (`--config`), or the CPU demo (`--demo`, or no `--config` on a machine without a GPU).

    Args:
        argv: command-line arguments without the program name (default `sys.argv[1:]`).
        cuda_available: whether a GPU is visible; None asks `torch.cuda.is_available()`.

    Raises:
        SystemExit: no `--config` and no `--demo` while a GPU is visible (the message names the GPU recipe
            command), or `--demo` together with `--config`.
    """
    from trl_ext.demo import GPU_COMMAND
    from trl_ext.demo import main as demo_main

    argv = sys.argv[1:] if argv is None else list(argv)
    if DEMO_FLAG in argv:
        if _has_config(argv):
            raise SystemExit("recipes/countdown.py: give --demo (the CPU demo) or --config YAML (a recipe), not both")
        return demo_main([arg for arg in argv if arg != DEMO_FLAG])
    if _has_config(argv) or any(arg in ("-h", "--help") for arg in argv):
        return run_grpo_recipe(TASK, argv)
    if _cuda_available() if cuda_available is None else cuda_available:
        raise SystemExit(
            "recipes/countdown.py: no --config on a machine with a GPU. Run a recipe, e.g.\n"
            f"  {GPU_COMMAND}\n"
            "or add --demo to run the tiny CPU demo anyway."
        )
    print("recipes/countdown.py: no --config and no GPU visible: running the CPU demo (--demo selects it explicitly)")
    return demo_main(argv)


if __name__ == "__main__":
    from trl_ext.recipes.vllm_import import skip_unused_vllm

    skip_unused_vllm()  # a run without vLLM does not pay its import (TRL's GRPO module imports it)
    main()
