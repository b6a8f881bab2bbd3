"""`trl-ext launch`: a vLLM server on the GPUs training leaves free, then the trainer, with no orphans.

The accelerate config is the single source of truth for which GPUs train (`gpu_ids`, `num_processes`); the vLLM
server gets the others, so the two never share a device (NCCL "duplicate GPU" errors, TRL issues #3706, #3762).

1. `plan_launch` (starts nothing) reads the accelerate config and the recipe YAML (`base:` resolved), splits the
   GPUs, sizes the server's tensor parallelism for the model's heads and composes both commands: `trl vllm-serve
   --model M --tensor-parallel-size N --data-parallel-size 1 --port P --host 127.0.0.1` (TRL 1.16's server mode,
   which wraps `vllm serve`) with `CUDA_VISIBLE_DEVICES` = the server GPUs, and `accelerate launch --config_file
   FILE RECIPE --config YAML ...` with `CUDA_VISIBLE_DEVICES` = the training GPUs (both numbered in PCI bus order,
   as nvidia-smi numbers them); then checks the machine and the recipe's preflight.
2. `run_launch` checks the port is free, starts the server in its own process group (`ServerProcess`, output to a
   log file), polls `GET /health` until it answers 200, runs the trainer and returns the trainer's exit code.
3. On success, failure, Ctrl-C (SIGINT) and SIGTERM both process groups (trainer, server) are stopped: SIGTERM,
   then SIGKILL after a grace period.

Recipes that do not use vLLM server mode (`use_vllm: true` and `vllm_mode: server`) get `accelerate launch` only.
Without a GPU (vLLM's CPU build) the server and the trainer split the cores, and the server gets the CPU weight
transfer (`cpu_layout`; docs/launch.md, "The server layout on a CPU machine").
Modules: `configs` (reading the two config files), `planning` (pure: GPU split, parallelism, ports, commands),
`cpu_layout` (the CPU server layout: cores, server flags), `remote_server` (a server on a machine of its own:
`--serve-only`, and a trainer's check of a server host elsewhere),
`checks` (the machine and the recipe's preflight over what was planned), `launcher` (`plan_launch`: read -> plan ->
check), `supervision` (processes, signals, health polling), `table` (every shipped config x recipe x GPU count),
`cli` (the Typer command). Top-level imports stay stdlib + typer so `trl-ext --help` is fast, and the public names
below load their modules on first use: the Typer command imports the planning only when it runs.
"""

from trl_ext.lazy import lazy_names

_LAZY = {
    **dict.fromkeys(("SERVER_CMD_ENV", "TRAIN_CMD_ENV"), "trl_ext.launch.cli"),
    **dict.fromkeys(
        (
            "AccelerateSetup",
            "LaunchError",
            "RecipeServing",
            "load_recipe_yaml",
            "read_accelerate_config",
            "read_recipe_serving",
        ),
        "trl_ext.launch.configs",
    ),
    "plan_launch": "trl_ext.launch.launcher",
    **dict.fromkeys(
        (
            "HEALTH_PATH",
            "Command",
            "LaunchPlan",
            "detect_gpus",
            "server_command",
            "server_parallelism",
            "split_gpus",
            "tensor_parallel_sizes",
            "trainer_command",
        ),
        "trl_ext.launch.planning",
    ),
    **dict.fromkeys(
        ("ServerProcess", "check_port_free", "run_launch", "stop_process_group", "stop_process_groups"),
        "trl_ext.launch.supervision",
    ),
}

__all__ = [
    "HEALTH_PATH",
    "SERVER_CMD_ENV",
    "TRAIN_CMD_ENV",
    "AccelerateSetup",
    "Command",
    "LaunchError",
    "LaunchPlan",
    "RecipeServing",
    "ServerProcess",
    "check_port_free",
    "detect_gpus",
    "load_recipe_yaml",
    "plan_launch",
    "read_accelerate_config",
    "read_recipe_serving",
    "run_launch",
    "server_command",
    "server_parallelism",
    "split_gpus",
    "stop_process_group",
    "stop_process_groups",
    "tensor_parallel_sizes",
    "trainer_command",
]


__getattr__ = lazy_names(__name__, _LAZY)
