"""`plan_launch`: read the two config files, plan the launch, check it; the one place that does all three.

read (`configs`: the accelerate config and the recipe's serving fields) -> plan (`planning`: GPU split, server
parallelism for the model's heads, ports, both commands) -> check (`checks`: the machine, the recipe's preflight)
-> a `LaunchPlan` that `supervision.run_launch` carries out and `--dry-run` prints.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from trl_ext.launch import planning
from trl_ext.launch.checks import check_machine, launch_preflight, recipe_script_task
from trl_ext.launch.configs import (
    AccelerateSetup,
    LaunchError,
    RecipeServing,
    read_accelerate_config,
    read_recipe_serving,
)
from trl_ext.launch.cpu_layout import CpuLayout, cpu_server_args, pin, split_cores, with_server_log
from trl_ext.launch.planning import (
    CUDA_VISIBLE,
    HEALTH_PATH,
    SERVER_BIND_HOST,
    LaunchPlan,
    accelerate_args,
    detect_gpus,
    gpu_env,
    loopback_flags,
    rendezvous_args,
    server_command,
    server_parallelism,
    serving_ports,
    split_gpus,
    trainer_command,
    url_host,
)
from trl_ext.launch.server_place import proposed_server_gpus
from trl_ext.launch.tensor_parallel import tensor_parallel_note
from trl_ext.preflight.models import load_model_shape

DEFAULT_LOG_DIR = "runs/launch"


def plan_launch(
    accelerate_config: str | Path,
    recipe: str | Path,
    config: str | Path | None = None,
    extra_args: Sequence[str] = (),
    *,
    num_gpus: int | None = None,
    num_processes: int | None = None,
    machine_rank: int | None = None,
    vllm_tp: int | None = None,
    vllm_dp: int | None = None,
    vllm_args: Sequence[str] = (),
    server_cmd: str | None = None,
    train_cmd: str | None = None,
    log_dir: str | Path | None = None,
    environ: dict[str, str] | None = None,
    gpu_memory_gb: float | None = None,
    check_packages: bool = True,
    cpus: list[int] | None = None,
) -> LaunchPlan:
    """Composes the server and trainer commands from the configs; checks everything that can fail before a start.

    Args:
        accelerate_config: accelerate config file; decides which GPUs train.
        recipe: the recipe script, e.g. `recipes/countdown.py`.
        config: the recipe YAML (`--config`), or None.
        extra_args: recipe args after the YAML; serving fields among them override the YAML.
        num_gpus: GPU count of this machine (ids `0..n-1`); default `CUDA_VISIBLE_DEVICES`, then `nvidia-smi -L`.
        num_processes: training processes instead of the config's `num_processes` (passed to accelerate).
        machine_rank: this machine's rank instead of the config's `machine_rank` (passed to accelerate).
        vllm_tp: server tensor-parallel size; vllm_dp: server data-parallel size (see `server_parallelism`).
        vllm_args: extra args for the server command, e.g. `("--max_model_len", "4096")`.
        server_cmd: a template replacing the server command (see `server_command`).
        train_cmd: a template replacing `accelerate launch ...` (see `trainer_command`).
        log_dir: folder of the server log; default the run's output_dir (as the recipe parses it), else
            `runs/launch` for scripts that are not trl_ext recipes.
        environ: environment to read `CUDA_VISIBLE_DEVICES` / `CUDA_DEVICE_ORDER` from (default `os.environ`).
        gpu_memory_gb: the preflight's memory limit per training GPU (default: its free memory per nvidia-smi).
        check_packages: the preflight checks that vLLM / DeepSpeed / bitsandbytes are installed where needed.
        cpus: the cores a server layout on the CPU splits between server and trainer (default: those this process
            may use; `trl_ext.launch.cpu_layout`).

    Raises:
        LaunchError: a missing file, a bad field, a GPU split that leaves the server nothing, a failed check.
    """
    environ = dict(os.environ if environ is None else environ)
    setup = _override(read_accelerate_config(accelerate_config), num_processes, machine_rank)
    if not Path(recipe).is_file():
        raise LaunchError(f"recipe script {recipe} not found")
    serving = read_recipe_serving(config, extra_args)
    launch_args = rendezvous_args(setup) + (["--machine_rank", str(machine_rank)] if machine_rank is not None else [])
    starts_server = serving.server_mode and serving.local_server and setup.machine_rank == 0
    if serving.server_mode and not serving.model and starts_server:
        raise LaunchError(f"recipe config {config}: vLLM server mode needs `model_name_or_path` to serve")

    available, source = ([], "") if setup.use_cpu and not starts_server else detect_gpus(num_gpus, environ)
    notes = []
    if starts_server:
        train, free = split_gpus(setup, available, source)
    else:
        train = split_gpus(setup, available, source)[0] if available else []
        free = []
        notes.append(_no_server_note(setup, serving, config))
    if train:
        launch_args = accelerate_args(setup, train, num_processes) + launch_args
        if setup.gpu_ids is not None and tuple(train) != setup.gpu_ids:
            notes.append(
                f"`gpu_ids` {','.join(setup.gpu_ids)} of {setup.path} are positions in {CUDA_VISIBLE}="
                f"{','.join(available)}: training on GPU(s) {','.join(train)} (accelerate gets --gpu_ids)"
            )
    elif num_processes is not None:
        launch_args = ["--num_processes", str(num_processes)] + launch_args

    extra = list(extra_args)
    server = None
    server_gpus: list[str] = []
    tp = dp = 0
    port = None
    cpu: CpuLayout | None = None  # the CPU server layout (no GPU, vLLM's CPU build)
    if starts_server:
        if not available and planning.vllm_cpu_build():
            if (vllm_tp or 1) * (vllm_dp or 1) > 1:
                raise LaunchError(
                    f"vLLM's CPU build serves from one process: no --vllm-tp {vllm_tp} --vllm-dp {vllm_dp}"
                )
            tp = dp = 1
            cpu = split_cores(cpus)
            vllm_args, kv_note = cpu_server_args(vllm_args, serving.gpu_memory_utilization, serving.compute_dtype)
        elif not free:
            raise LaunchError(_no_free_gpu(setup, train, available, source, (serving.model, vllm_tp, vllm_dp)))
        else:
            shape, _ = load_model_shape(serving.model)
            server_gpus, tp, dp = server_parallelism(free, vllm_tp, vllm_dp, shape)
            if vllm_tp is None:  # why this size (trl_ext.launch.tensor_parallel)
                notes.append(f"vLLM server {tensor_parallel_note(shape, tp, len(free))}")
            if shape is None:
                notes.append(f"{serving.model}: no config found, so tp {tp} is not checked against its heads")
        port, port_flags = serving_ports(serving, pick=recipe_script_task(recipe) is not None)
        host_flags, bind_note = loopback_flags(serving, port)
        extra += [*host_flags, *port_flags]
        stated = {arg.lstrip("-").split("=")[0].replace("-", "_") for arg in vllm_args}
        if cpu is None and serving.gpu_memory_utilization is not None and "gpu_memory_utilization" not in stated:
            vllm_args = [*vllm_args, "--gpu_memory_utilization", str(serving.gpu_memory_utilization)]
        server = server_command(serving.model, SERVER_BIND_HOST, port, tp, dp, server_gpus, vllm_args, server_cmd)
        idle = [gpu for gpu in free if gpu not in server_gpus]
        where = "the CPU (vLLM's CPU build, no GPU found)" if cpu else f"GPU(s) {','.join(server_gpus)}"
        notes.append(
            f"vLLM server mode: {serving.model} on {where} (tp {tp}, dp {dp}), training on "
            f"{','.join(train) or 'CPU'}; {len(available)} GPU(s) from {source}"
            + (f"; idle: {','.join(idle)}" if idle else "")
        )
        notes.append(bind_note)
        if cpu is not None:
            server = pin(server, cpu.server_cores)
            notes += [cpu.note, kv_note]

    check_machine(environ, bool(train or server_gpus))
    checked = launch_preflight(
        setup,
        recipe,
        config,
        extra,
        train,
        server_gpus,
        tp or 1,
        gpu_memory_gb,
        check_packages=check_packages,
        cpu_cores=None if cpu is None else (cpu.server_cores, cpu.train_cores),
    )
    output_dir = checked[0][1].output_dir if checked else serving.output_dir
    log_root = Path(log_dir) if log_dir is not None else Path(output_dir or DEFAULT_LOG_DIR)
    server_log = log_root / f"vllm_server_{port}.log"
    if train:
        trainer_env = gpu_env(train)
    else:  # a CPU trainer beside a GPU server sees no GPU; otherwise accelerate's own handling applies
        trainer_env = {CUDA_VISIBLE: ""} if starts_server else {}
    trainer = trainer_command(accelerate_config, recipe, config, extra, trainer_env, train_cmd, launch_args)
    if cpu is not None:
        trainer = with_server_log(pin(trainer, cpu.train_cores), server_log)
    report = checked[1] if checked else None
    common = dict(
        trainer=trainer,
        train_gpus=tuple(train),
        preflight=report.render() if report else "",
        report=report,
        output_dir=output_dir,
    )
    if server is None:
        return LaunchPlan(notes=tuple(notes), **common)
    return LaunchPlan(
        server=server,
        host=SERVER_BIND_HOST,
        port=port,
        health_url=f"http://{url_host(SERVER_BIND_HOST)}:{port}{HEALTH_PATH}",
        server_log=server_log,
        server_gpus=tuple(server_gpus),
        tp=tp,
        dp=dp,
        notes=tuple(notes),
        **common,
    )


def _override(setup: AccelerateSetup, num_processes: int | None, machine_rank: int | None) -> AccelerateSetup:
    """The accelerate setup with the launcher's `--num-processes` / `--machine-rank` (accelerate gets them too)."""
    if num_processes is not None:
        if num_processes < 1:
            raise LaunchError(f"--num-processes must be >= 1, got {num_processes}")
        setup = replace(setup, num_processes=num_processes)
    if machine_rank is not None:
        if not 0 <= machine_rank < setup.num_machines:
            raise LaunchError(f"--machine-rank {machine_rank} is not in 0..{setup.num_machines - 1} (num_machines)")
        setup = replace(setup, machine_rank=machine_rank)
    return setup


def _no_server_note(setup: AccelerateSetup, serving: RecipeServing, config) -> str:
    if not serving.server_mode:
        return (
            f"recipe {config or '(no --config)'} does not use vLLM server mode "
            f"(use_vllm={serving.use_vllm}, vllm_mode={serving.vllm_mode}): running accelerate launch only"
        )
    if not serving.local_server:
        return (
            f"vllm_server_host {serving.host} is not this machine: start the server there "
            f"(trl vllm-serve --model {serving.model} --port {serving.port}); running accelerate launch only"
        )
    return (
        f"machine_rank {setup.machine_rank} of {setup.num_machines}: the vLLM server runs on machine 0 only (only "
        "training rank 0, which runs there, talks to it); running accelerate launch only"
    )


def _no_free_gpu(
    setup: AccelerateSetup, train: list[str], available: list[str], source: str, serve=(None,) * 3
) -> str:
    message = (
        f"no free GPU left for the vLLM server: accelerate config {setup.path} trains on {train} and "
        f"{len(available)} GPU(s) are available (from {source}): {available}. Train on fewer GPUs"
    )
    half = 1 << max((len(available) // 2).bit_length() - 1, 0)
    if setup.gpu_ids is None and len(available) > 1:
        message += (
            f" (--num-processes {half}: training on {','.join(available[:half])}, the server on "
            f"{','.join(proposed_server_gpus(available[half:], *serve))})"
        )
    else:
        message += " (`gpu_ids`, `num_processes`)"
    return message + ", or use `vllm_mode: colocate`"
