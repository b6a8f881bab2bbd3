"""Countdown with GRPO / Dr. GRPO and the seeds' ablations (`recipes/countdown/*.yaml`).

    accelerate launch --config_file accelerate_configs/vllm_server_gpu0_train_gpu1.yaml recipes/countdown.py \\
        --config recipes/countdown/seed000_grpo_l512.yaml [--flag value ...]

Without `--config` (and without `--help`) this runs the embedded default instead, `trl_ext.demo.main`: a tiny model
that learns Countdown on a CPU, offline, in minutes (`make run`). `--help` lists every recipe field.

Steps: parse the recipe (YAML `base:` chain, then flags) -> Countdown problems (trl_ext.tasks) -> countdown reward
(trl_ext.rewards) -> AblationGRPOTrainer -> train -> save -> validation.
"""

from __future__ import annotations

import os
import sys

# `python recipes/<x>.py` puts recipes/ first on sys.path, where recipes/math.py would shadow the standard `math`.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

from trl_ext.recipes import run_grpo_recipe

TASK = "countdown"


def main(argv: list[str] | None = None) -> dict[str, float]:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(arg in ("-h", "--help", "--config") or arg.startswith("--config=") for arg in argv):
        from trl_ext.demo import main as demo_main

        return demo_main(argv)
    return run_grpo_recipe(TASK, argv)


if __name__ == "__main__":
    main()
