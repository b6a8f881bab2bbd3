"""`trl-ext launch`: the Typer command that plans a launch, prints it, and runs it.

The planning and the supervision load only when the command runs: `trl-ext --help` and the other commands pay
none of their imports."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

SERVER_CMD_ENV = "TRL_EXT_SERVER_CMD"
TRAIN_CMD_ENV = "TRL_EXT_TRAIN_CMD"


def register(app: typer.Typer) -> None:
    """Adds `trl-ext launch` to the Typer app."""

    @app.command(
        "launch",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        help=(
            "Check the plan first (trl_ext.preflight: batch arithmetic for the number of training processes, peak GPU "
            "memory against --gpu-memory-gb, free ports, output_dir / resume, wandb, model and data sources), then "
            "start the vLLM server on the GPUs the accelerate config leaves free, wait for its health endpoint, "
            "run `accelerate launch --config_file FILE RECIPE --config YAML [ARGS]`, and stop the server afterwards "
            "(also on failure and Ctrl-C). Recipes without `use_vllm: true` + `vllm_mode: server` just run "
            "accelerate launch. Extra ARGS go to the recipe. Exit code: the trainer's."
        ),
    )
    def launch(
        ctx: typer.Context,
        recipe: Path = typer.Argument(..., help="Recipe script, e.g. recipes/countdown.py."),
        accelerate_config: Path = typer.Option(
            ..., "--accelerate-config", help="Accelerate config; its gpu_ids/num_processes decide the training GPUs."
        ),
        config: Path | None = typer.Option(None, "--config", help="Recipe YAML (passed on as --config)."),
        num_gpus: int | None = typer.Option(
            None, "--num-gpus", help="GPUs on this machine (default: CUDA_VISIBLE_DEVICES, else nvidia-smi)."
        ),
        num_processes: int | None = typer.Option(
            None,
            "--num-processes",
            help="Training processes instead of the accelerate config's num_processes (e.g. 2 on a 4-GPU node: "
            "training on 2 GPUs, the server on the other 2).",
        ),
        machine_rank: int | None = typer.Option(
            None, "--machine-rank", help="This machine's rank instead of the config's (multi-machine configs)."
        ),
        vllm_tp: int | None = typer.Option(
            None, "--vllm-tp", help="Server tensor-parallel size (default: the largest that shards the model's heads)."
        ),
        vllm_dp: int | None = typer.Option(
            None,
            "--vllm-dp",
            help="Server data-parallel size (default 1; above 1 only for mixture-of-experts models).",
        ),
        vllm_args: str = typer.Option(
            "", "--vllm-args", help="Extra server args, one string, e.g. '--max_model_len 4096'."
        ),
        health_timeout: float = typer.Option(900.0, "--health-timeout", help="Seconds to wait for /health."),
        grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL when stopping."),
        log_dir: Path | None = typer.Option(
            None,
            "--log-dir",
            help="Folder of the server log (default: the run's output_dir; runs/launch for other scripts).",
        ),
        server_cmd: str | None = typer.Option(
            None,
            "--server-cmd",
            envvar=SERVER_CMD_ENV,
            help="Replace the server command (template: {model} {host} {port} {tp} {dp} {gpus} {python}).",
        ),
        train_cmd: str | None = typer.Option(
            None,
            "--train-cmd",
            envvar=TRAIN_CMD_ENV,
            help="Replace `accelerate launch ...` (template: {accelerate_config} {recipe} {config} {python}).",
        ),
        poll_interval: float = typer.Option(1.0, "--poll-interval", help="Seconds between health checks."),
        gpu_memory_gb: float | None = typer.Option(
            None,
            "--gpu-memory-gb",
            help="Refuse a plan whose estimated peak memory per training GPU exceeds this many GiB (default: the "
            "training GPUs' free memory per nvidia-smi; no check when unknown).",
        ),
        dry_run: bool = typer.Option(
            False, "--dry-run", help="Run the preflight, print the plan and both commands (with their env), and exit."
        ),
        serve_only: bool = typer.Option(
            False,
            "--serve-only",
            help="Start only the recipe's vLLM server, on this machine's GPUs (or cores), for trainers on other "
            "machines whose vllm_server_host names this one; it runs until stopped (Ctrl-C, SIGTERM).",
        ),
        bind: str | None = typer.Option(
            None, "--bind", help="With --serve-only: the address to listen on (default: this machine's name's)."
        ),
    ) -> None:
        from trl_ext.launch.configs import LaunchError
        from trl_ext.launch.launcher import plan_launch
        from trl_ext.launch.supervision import run_launch

        try:
            plan = plan_launch(
                accelerate_config,
                recipe,
                config,
                list(ctx.args),
                num_gpus=num_gpus,
                num_processes=num_processes,
                machine_rank=machine_rank,
                vllm_tp=vllm_tp,
                vllm_dp=vllm_dp,
                vllm_args=shlex.split(vllm_args),
                server_cmd=server_cmd,
                train_cmd=train_cmd,
                log_dir=log_dir,
                gpu_memory_gb=gpu_memory_gb,
                serve_only=serve_only,
                bind=bind,
            )
        except LaunchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(plan.render())
        if dry_run:
            raise typer.Exit(0)
        try:
            code = run_launch(
                plan, health_timeout=health_timeout, grace=grace, poll_interval=poll_interval, echo=typer.echo
            )
        except LaunchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        raise typer.Exit(code)
