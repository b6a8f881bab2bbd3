"""`plan_launch`: read the two config files, plan the launch, check it; the one place that does all three.

read (`configs`: the accelerate config; a trl_ext recipe once, by the trainer's parser, `checks.parse_launch_recipe`,
and its serving fields from that) -> plan (`planning`: GPU split, server parallelism for the model's heads, ports,
both commands) -> check (`checks`: the machine, the recipe's preflight on what was parsed) -> a `LaunchPlan` that
`supervision.run_launch` carries out and `--dry-run` prints.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from trl_ext.grpo.vllm.cpu_sampler import stated_flags
from trl_ext.launch import planning
from trl_ext.launch.checks import check_machine, launch_preflight, parse_launch_recipe, recipe_script_task
from trl_ext.launch.configs import (
    AccelerateSetup,
    LaunchError,
    RecipeServing,
    read_accelerate_config,
    read_recipe_serving,
    serving_from_parsed,
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
from trl_ext.launch.remote_server import remote_server, serve_note, this_machine_address
from trl_ext.launch.server_place import proposed_server_gpus
from trl_ext.launch.tensor_parallel import tensor_parallel_note
from trl_ext.preflight.models import load_model_shape
from trl_ext.recipes.entry import ParsedRecipe

DEFAULT_LOG_DIR = "runs/launch"
# Several CPU training processes (not DeepSpeed): accelerate starts them through torchrun, which does not pass the
# config's `use_cpu` on, so each Trainer would find no GPU and train alone instead of joining the others over gloo;
# and accelerate names their device `cpu:0`, which transformers hands to `torch.load` as `map_location` when the run
# resumes, and torch cannot restore to (the optimizer state fails to load). Plain `cpu` for both.
CPU_PROCESS_GROUP_ENV = {"ACCELERATE_USE_CPU": "true", "ACCELERATE_TORCH_DEVICE": "cpu"}


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
    serve_only: bool = False,
    bind: str | None = None,
) -> LaunchPlan:
    """Composes the server and trainer commands from the configs; checks everything that can fail before a start.

    Args:
        accelerate_config: accelerate config file; decides which GPUs train.
        recipe: the recipe script, e.g. `recipes/countdown.py`.
        config: the recipe YAML (`--config`), or None.
        extra_args: recipe args after the YAML; serving fields among them override the YAML.
        num_gpus: GPU count of this machine (ids `0..n-1`); default `CUDA_VISIBLE_DEVICES`, then `nvidia-smi`.
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
        serve_only: the recipe's vLLM server alone, on this machine's GPUs (or cores), listening on `bind` (default:
            the address this machine's name resolves to) for trainers on other machines
            (`trl_ext.launch.remote_server`).

    Raises:
        LaunchError: a missing file, a bad field, a GPU split that leaves the server nothing, a failed check.
    """
    request = LaunchRequest(
        accelerate_config, recipe, config, tuple(extra_args), num_gpus, num_processes, machine_rank, vllm_tp,
        vllm_dp, tuple(vllm_args), server_cmd, train_cmd, log_dir, dict(os.environ if environ is None else environ),
        gpu_memory_gb, check_packages, cpus, serve_only, bind,
    )  # fmt: skip
    setup = _override(read_accelerate_config(accelerate_config), num_processes, machine_rank)
    if not Path(recipe).is_file():
        raise LaunchError(f"recipe script {recipe} not found")
    parsed = parse_launch_recipe(setup, recipe, config, extra_args)  # a trl_ext recipe, read once
    serving = read_recipe_serving(config, extra_args) if parsed is None else serving_from_parsed(parsed)
    placement = _place_training(request, setup, serving)
    server = None
    if placement.starts_server:
        layout = _cpu_server if not placement.available and planning.vllm_cpu_build() else _gpu_server
        server = _server(request, serving, placement, layout(request, setup, serving, placement))
    return _plan(request, setup, serving, placement, server, parsed)


@dataclass(frozen=True)
class LaunchRequest:
    """`plan_launch`'s arguments, as one value the planning steps share (see `plan_launch` for each)."""

    accelerate_config: str | Path
    recipe: str | Path
    config: str | Path | None
    extra_args: tuple[str, ...]
    num_gpus: int | None
    num_processes: int | None
    machine_rank: int | None
    vllm_tp: int | None
    vllm_dp: int | None
    vllm_args: tuple[str, ...]
    server_cmd: str | None
    train_cmd: str | None
    log_dir: str | Path | None
    environ: dict[str, str]
    gpu_memory_gb: float | None
    check_packages: bool
    cpus: list[int] | None
    serve_only: bool = False
    bind: str | None = None


@dataclass
class _Placement:
    """Where training runs: the GPUs found (and where from), those training takes, those left for a server."""

    starts_server: bool
    available: list[str]
    source: str
    train: list[str]
    free: list[str]
    launch_args: list[str]
    notes: list[str] = field(default_factory=list)
    remote_health_url: str | None = None  # a server on another machine that training rank 0, here, talks to


@dataclass
class _ServerLayout:
    """Where the vLLM server runs: its GPUs and parallelism, or the CPU cores (`cpu`) of vLLM's CPU build."""

    gpus: list[str]
    tp: int
    dp: int
    vllm_args: list[str]
    cpu: CpuLayout | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class _Server:
    command: planning.Command
    layout: _ServerLayout
    port: int
    extra_args: list[str]
    notes: list[str]
    bind: str = SERVER_BIND_HOST


def _place_training(request: LaunchRequest, setup: AccelerateSetup, serving: RecipeServing) -> _Placement:
    """The training GPUs (the accelerate config's, on the GPUs this machine offers) and accelerate's placement flags;
    whether this machine starts the server (server mode, a local host, machine rank 0)."""
    machine_rank, num_processes = request.machine_rank, request.num_processes
    if request.serve_only:
        return _place_server_only(request, serving)
    launch_args = rendezvous_args(setup) + (["--machine_rank", str(machine_rank)] if machine_rank is not None else [])
    starts_server = serving.server_mode and serving.local_server and setup.machine_rank == 0
    if serving.server_mode and not serving.model and starts_server:
        raise LaunchError(f"recipe config {request.config}: vLLM server mode needs `model_name_or_path` to serve")
    if setup.use_cpu and not starts_server:
        available, source = [], ""
    else:
        available, source = detect_gpus(request.num_gpus, request.environ)
    notes = []
    if starts_server:
        train, free = split_gpus(setup, available, source)
    else:
        train = split_gpus(setup, available, source)[0] if available else []
        free = []
        notes.append(_no_server_note(setup, serving, request.config))
    remote = None
    if serving.server_mode and not serving.local_server and setup.machine_rank == 0:  # training rank 0 is here
        remote, note = remote_server(serving.host, serving.port, serving.base_url)
        notes.append(note)
    if train:
        launch_args = accelerate_args(setup, train, num_processes) + launch_args
        if setup.gpu_ids is not None and tuple(train) != setup.gpu_ids:
            notes.append(
                f"`gpu_ids` {','.join(setup.gpu_ids)} of {setup.path} are positions in {CUDA_VISIBLE}="
                f"{','.join(available)}: training on GPU(s) {','.join(train)} (accelerate gets --gpu_ids)"
            )
    elif num_processes is not None:
        launch_args = ["--num_processes", str(num_processes)] + launch_args
    return _Placement(starts_server, available, source, train, free, launch_args, notes, remote)


def _place_server_only(request: LaunchRequest, serving: RecipeServing) -> _Placement:
    """`--serve-only`: every GPU this machine offers is the server's (none trains here)."""
    if not serving.server_mode:
        raise LaunchError(
            f"--serve-only: recipe {request.config} does not use vLLM server mode (use_vllm={serving.use_vllm}, "
            f"vllm_mode={serving.vllm_mode})"
        )
    if not serving.model:
        raise LaunchError(f"recipe config {request.config}: vLLM server mode needs `model_name_or_path` to serve")
    available, source = detect_gpus(request.num_gpus, request.environ)
    return _Placement(True, available, source, [], list(available), [])


def _cpu_server(
    request: LaunchRequest, setup: AccelerateSetup, serving: RecipeServing, placement: _Placement
) -> _ServerLayout:
    """vLLM's CPU build on a machine without a GPU: one server process on some cores, the trainer on the rest."""
    vllm_tp, vllm_dp = request.vllm_tp, request.vllm_dp
    if (vllm_tp or 1) * (vllm_dp or 1) > 1:
        raise LaunchError(f"vLLM's CPU build serves from one process: no --vllm-tp {vllm_tp} --vllm-dp {vllm_dp}")
    if request.serve_only:
        cpu = CpuLayout(note="--serve-only: the vLLM server on every core")
    else:
        cpu = split_cores(request.cpus)
    vllm_args, kv_note = cpu_server_args(request.vllm_args, serving.gpu_memory_utilization, serving.compute_dtype)
    return _ServerLayout([], 1, 1, list(vllm_args), cpu, [cpu.note, kv_note])


def _gpu_server(
    request: LaunchRequest, setup: AccelerateSetup, serving: RecipeServing, placement: _Placement
) -> _ServerLayout:
    """The server on the GPUs training leaves free, sized for the model's heads (`server_parallelism`)."""
    if not placement.free:
        raise LaunchError(
            _no_free_gpu(
                setup,
                placement.train,
                placement.available,
                placement.source,
                (serving.model, request.vllm_tp, request.vllm_dp),
            )
        )
    shape, _ = load_model_shape(serving.model)
    gpus, tp, dp = server_parallelism(placement.free, request.vllm_tp, request.vllm_dp, shape)
    if request.vllm_tp is None:  # why this size (trl_ext.launch.tensor_parallel)
        placement.notes.append(f"vLLM server {tensor_parallel_note(shape, tp, len(placement.free))}")
    if shape is None:
        placement.notes.append(f"{serving.model}: no config found, so tp {tp} is not checked against its heads")
    vllm_args = list(request.vllm_args)
    if serving.gpu_memory_utilization is not None and "gpu-memory-utilization" not in stated_flags(vllm_args):
        vllm_args += ["--gpu_memory_utilization", str(serving.gpu_memory_utilization)]
    return _ServerLayout(gpus, tp, dp, vllm_args)


def _server(request: LaunchRequest, serving: RecipeServing, placement: _Placement, layout: _ServerLayout) -> _Server:
    """The server command on `layout`, its ports, and the recipe flags that point the trainer at it."""
    if request.serve_only:  # the trainers elsewhere state the port: it is not picked
        port, port_flags = serving.port, []
        bind = request.bind or this_machine_address()
        host_flags, bind_note = [], serve_note(bind, port)
    else:
        port, port_flags = serving_ports(serving, pick=recipe_script_task(request.recipe) is not None)
        bind = SERVER_BIND_HOST
        host_flags, bind_note = loopback_flags(serving, port)
    command = server_command(
        serving.model, bind, port, layout.tp, layout.dp, layout.gpus, layout.vllm_args, request.server_cmd
    )
    idle = [gpu for gpu in placement.free if gpu not in layout.gpus]
    where = "the CPU (vLLM's CPU build, no GPU found)" if layout.cpu else f"GPU(s) {','.join(layout.gpus)}"
    notes = [
        f"vLLM server mode: {serving.model} on {where} (tp {layout.tp}, dp {layout.dp}), training on "
        f"{','.join(placement.train) or 'CPU'}; {len(placement.available)} GPU(s) from {placement.source}"
        + (f"; idle: {','.join(idle)}" if idle else ""),
        bind_note,
    ]
    if layout.cpu is not None:
        command = pin(command, layout.cpu.server_cores)
    notes += layout.notes
    return _Server(command, layout, port, [*request.extra_args, *host_flags, *port_flags], notes, bind)


def _plan(
    request: LaunchRequest,
    setup: AccelerateSetup,
    serving: RecipeServing,
    placement: _Placement,
    server: _Server | None,
    parsed: ParsedRecipe | None,
) -> LaunchPlan:
    """The checks (the machine, the recipe's preflight on this placement), then the trainer command and the plan."""
    train, layout = placement.train, None if server is None else server.layout
    cpu = None if layout is None else layout.cpu
    server_gpus = [] if layout is None else layout.gpus
    extra = list(request.extra_args) if server is None else server.extra_args
    check_machine(request.environ, bool(train or server_gpus))
    if request.serve_only:  # nothing trains here: the machines that train check their own plan
        return _serve_only_plan(request, serving, server, parsed)
    checked = launch_preflight(
        setup,
        parsed,
        request.extra_args,
        extra[len(request.extra_args) :],
        train,
        server_gpus,
        (layout.tp if layout else 0) or 1,
        request.gpu_memory_gb,
        check_packages=request.check_packages,
        cpu_cores=None if cpu is None else (cpu.server_cores, cpu.train_cores),
    )
    output_dir = checked[0][1].output_dir if checked else serving.output_dir
    log_root = Path(request.log_dir) if request.log_dir is not None else Path(output_dir or DEFAULT_LOG_DIR)
    server_log = log_root / f"vllm_server_{None if server is None else server.port}.log"
    if train:
        trainer_env = gpu_env(train)
    else:  # a CPU trainer beside a GPU server sees no GPU; otherwise accelerate's own handling applies
        trainer_env = {CUDA_VISIBLE: ""} if placement.starts_server else {}
    if setup.use_cpu and setup.num_processes > 1 and setup.distributed_type != "DEEPSPEED":
        trainer_env.update(CPU_PROCESS_GROUP_ENV)
    trainer = trainer_command(
        request.accelerate_config,
        request.recipe,
        request.config,
        extra,
        trainer_env,
        request.train_cmd,
        placement.launch_args,
    )
    if cpu is not None:
        trainer = with_server_log(pin(trainer, cpu.train_cores), server_log)
    report = checked[1] if checked else None
    notes = tuple(placement.notes + ([] if server is None else server.notes))
    common = dict(
        trainer=trainer,
        train_gpus=tuple(train),
        preflight=report.render() if report else "",
        report=report,
        output_dir=output_dir,
        notes=notes,
    )
    if server is None:
        return LaunchPlan(**common, remote_health_url=placement.remote_health_url)
    return LaunchPlan(
        server=server.command,
        host=SERVER_BIND_HOST,
        port=server.port,
        health_url=f"http://{url_host(SERVER_BIND_HOST)}:{server.port}{HEALTH_PATH}",
        server_log=server_log,
        server_gpus=tuple(layout.gpus),
        server_cores=() if cpu is None else tuple(cpu.server_cores),
        tp=layout.tp,
        dp=layout.dp,
        **common,
    )


def _serve_only_plan(
    request: LaunchRequest, serving: RecipeServing, server: _Server, parsed: ParsedRecipe | None
) -> LaunchPlan:
    """`--serve-only`: the server's plan, no trainer; its log in the run's folder as the recipe parses it."""
    output_dir = parsed.parsed[1].output_dir if parsed is not None else serving.output_dir
    log_root = Path(request.log_dir) if request.log_dir is not None else Path(output_dir or DEFAULT_LOG_DIR)
    cpu = server.layout.cpu
    return LaunchPlan(
        trainer=None,
        server=server.command,
        host=server.bind,
        port=server.port,
        health_url=f"http://{url_host(server.bind)}:{server.port}{HEALTH_PATH}",
        server_log=log_root / f"vllm_server_{server.port}.log",
        server_gpus=tuple(server.layout.gpus),
        server_cores=() if cpu is None else tuple(cpu.server_cores),
        tp=server.layout.tp,
        dp=server.layout.dp,
        output_dir=output_dir,
        notes=tuple(server.notes),
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
