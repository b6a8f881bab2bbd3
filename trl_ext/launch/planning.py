"""Launch planning, pure: GPU split between training and the vLLM server, both commands, the `LaunchPlan`.

`plan_launch` turns the two config files (and the recipe args) into the plan that
`trl_ext.launch.supervision.run_launch` carries out and `trl-ext launch --dry-run` prints, after the preflight of a
trl_ext GRPO recipe (`trl_ext.launch.checks`: batches for this many processes, memory, free ports, output_dir,
wandb, sources). Nothing here starts the server or the trainer; the outside calls are `nvidia-smi` (GPU list and
memory, only when `--num-gpus` / `CUDA_VISIBLE_DEVICES` / `--gpu-memory-gb` do not say) and port binds.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_ext.launch.checks import launch_preflight, recipe_script_task, rendezvous_args
from trl_ext.launch.configs import AccelerateSetup, LaunchError, read_accelerate_config, read_recipe_serving

# vLLM's own server (what `trl vllm-serve` runs in TRL 1.16) answers here; TRL's VLLMClient.check_server polls it.
HEALTH_PATH = "/health"
# `trl vllm-serve` sets VLLM_SERVER_DEV_MODE=1: its weight-update and cache endpoints answer anyone who reaches the
# port. On one machine only the trainer needs it, so the server listens on loopback only.
SERVER_BIND_HOST = "127.0.0.1"
# Trainer-side hosts that reach a server bound to 127.0.0.1 (Linux connects 0.0.0.0 to the local host).
_LOOPBACK_CLIENT_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", ""}


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (`make install` without CUDA); reads package metadata only."""
    import importlib.metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return name == "vllm-cpu" or "cpu" in version
    return False


def detect_gpus(num_gpus: int | None = None, environ: dict[str, str] | None = None) -> tuple[list[str], str]:
    """The GPU ids this machine offers, and where that answer came from.

    Order: `num_gpus` (the `--num-gpus` override, ids `0..num_gpus-1`), else `CUDA_VISIBLE_DEVICES` (its ids as
    written), else the `GPU i:` lines of `nvidia-smi -L`, else none.
    """
    environ = os.environ if environ is None else environ
    if num_gpus is not None:
        if num_gpus < 0:
            raise LaunchError(f"--num-gpus must be >= 0, got {num_gpus}")
        return [str(i) for i in range(num_gpus)], "--num-gpus"
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [part.strip() for part in visible.split(",") if part.strip()], "CUDA_VISIBLE_DEVICES"
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return [], "nvidia-smi (not available)"
    count = sum(line.startswith("GPU ") for line in listing.stdout.splitlines())
    return [str(i) for i in range(count)], "nvidia-smi -L"


def split_gpus(setup: AccelerateSetup, available: Sequence[str], source: str = "") -> tuple[list[str], list[str]]:
    """Splits the available GPUs into (training, free for the server); the accelerate config decides training.

    Training takes `gpu_ids` when listed, else (accelerate's `all`) the first `num_processes / num_machines`
    available GPUs, else none with `use_cpu`. The server gets every available GPU training does not take.

    Raises:
        LaunchError: `gpu_ids` names a GPU that is not available, lists fewer GPUs than processes, or the config
            needs more GPUs than there are.
    """
    available = list(available)
    where = f" (from {source})" if source else ""
    if setup.use_cpu:
        train: list[str] = []
    elif setup.gpu_ids is None:
        if setup.local_processes > len(available):
            raise LaunchError(
                f"accelerate config {setup.path} trains with {setup.local_processes} process(es) per machine but only "
                f"{len(available)} GPU(s) are available{where}: {available}"
            )
        train = available[: setup.local_processes]
    else:
        missing = [gpu for gpu in setup.gpu_ids if gpu not in available]
        if missing:
            raise LaunchError(
                f"accelerate config {setup.path}: `gpu_ids` {','.join(setup.gpu_ids)} names GPU(s) {missing} that are "
                f"not available{where}: {available} (use --num-gpus N to state the GPU count)"
            )
        if len(setup.gpu_ids) < setup.local_processes:
            raise LaunchError(
                f"accelerate config {setup.path}: `gpu_ids` lists {len(setup.gpu_ids)} GPU(s) for "
                f"{setup.local_processes} process(es) per machine; make `num_processes` and `gpu_ids` agree"
            )
        train = list(setup.gpu_ids)
    return train, [gpu for gpu in available if gpu not in train]


def server_parallelism(free: Sequence[str], tp: int | None, dp: int | None) -> tuple[list[str], int, int]:
    """The server's GPUs and its tensor / data parallel sizes.

    With neither size given: one tensor-parallel group over the largest power of two of free GPUs,
    `tp = 2 ** floor(log2(len(free)))`, `dp = 1` (attention head counts are powers of two times a small factor, so
    `tp = 3` or `7` fails to shard; vLLM refuses `dp > 1` for dense models). Otherwise the first `tp * dp` free GPUs.
    Free GPUs beyond that stay idle.

    Raises:
        LaunchError: no GPU is free, a size is < 1, or `tp * dp` exceeds the free GPUs.
    """
    if not free:
        raise LaunchError("no free GPU left for the vLLM server")
    if tp is None and dp is None:
        tp = 1 << (len(free).bit_length() - 1)
        return list(free[:tp]), tp, 1
    tp = 1 if tp is None else tp
    dp = 1 if dp is None else dp
    if tp < 1 or dp < 1:
        raise LaunchError(f"--vllm-tp and --vllm-dp must be >= 1, got {tp} and {dp}")
    if tp * dp > len(free):
        raise LaunchError(
            f"--vllm-tp {tp} x --vllm-dp {dp} = {tp * dp} GPUs, but only {len(free)} are free for the server: "
            f"{list(free)}"
        )
    return list(free[: tp * dp]), tp, dp


@dataclass(frozen=True)
class Command:
    """An argv plus the environment variables set on top of the launcher's own environment."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        """The shell line that runs this command, e.g. `CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model M ...`."""
        assignments = [f"{key}={shlex.quote(value)}" for key, value in self.env.items()]
        return " ".join([*assignments, shlex.join(self.argv)])

    def full_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}


@dataclass(frozen=True)
class LaunchPlan:
    """Everything `run_launch` will do, composed without starting anything (what `--dry-run` prints)."""

    trainer: Command
    server: Command | None = None
    host: str | None = None
    port: int | None = None
    health_url: str | None = None
    server_log: Path | None = None
    train_gpus: tuple[str, ...] = ()
    server_gpus: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    preflight: str = ""
    report: Any = field(default=None, compare=False, repr=False)  # the trl_ext.preflight.plan.Preflight, if any

    def render(self) -> str:
        lines = ([self.preflight] if self.preflight else []) + list(self.notes)
        if self.server is not None:
            lines.append(f"server:  {self.server.render()}")
            lines.append(f"         log {self.server_log}, health {self.health_url}")
        lines.append(f"trainer: {self.trainer.render()}")
        return "\n".join(lines)


def _tool(name: str) -> str:
    """The console script `name` beside this Python (an un-activated venv), else `name` from PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def server_command(
    model: str,
    host: str,
    port: int,
    tp: int,
    dp: int,
    gpus: Sequence[str],
    vllm_args: Sequence[str] = (),
    template: str | None = None,
) -> Command:
    """The vLLM server command TRL 1.16 uses for server mode, on `gpus` only.

    `template` replaces it (tests and custom servers): a shell-style string formatted with `{model}`, `{host}`,
    `{port}`, `{tp}`, `{dp}`, `{gpus}`, `{python}`.
    """
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}  # no GPUs: vLLM's CPU build
    if template is not None:
        fields = {"model": model, "host": host, "port": port, "tp": tp, "dp": dp, "gpus": ",".join(gpus)}
        fields["python"] = sys.executable
        return Command(tuple(shlex.split(template.format(**fields))) + tuple(vllm_args), env)
    argv = [_tool("trl"), "vllm-serve", "--model", model, "--tensor-parallel-size", str(tp)]
    argv += ["--data-parallel-size", str(dp), "--port", str(port), "--host", host, *vllm_args]
    return Command(tuple(argv), env)


def trainer_command(
    accelerate_config: str | Path,
    recipe: str | Path,
    config: str | Path | None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    template: str | None = None,
    launch_args: Sequence[str] = (),
) -> Command:
    """`accelerate launch --config_file FILE [launch_args] RECIPE [--config YAML] [extra_args]`.

    `template` replaces it (tests): formatted with `{accelerate_config}`, `{recipe}`, `{config}`, `{python}`;
    `extra_args` are appended either way, `launch_args` (accelerate's own flags) only to the real command.
    """
    if template is not None:
        fields = {"accelerate_config": accelerate_config, "recipe": recipe, "config": config or ""}
        argv = shlex.split(template.format(python=sys.executable, **fields))
    else:
        argv = [_tool("accelerate"), "launch", "--config_file", str(accelerate_config), *launch_args, str(recipe)]
        if config is not None:
            argv += ["--config", str(config)]
    return Command(tuple(argv) + tuple(extra_args), dict(env or {}))


def plan_launch(
    accelerate_config: str | Path,
    recipe: str | Path,
    config: str | Path | None = None,
    extra_args: Sequence[str] = (),
    *,
    num_gpus: int | None = None,
    vllm_tp: int | None = None,
    vllm_dp: int | None = None,
    vllm_args: Sequence[str] = (),
    server_cmd: str | None = None,
    train_cmd: str | None = None,
    log_dir: str | Path | None = None,
    environ: dict[str, str] | None = None,
    gpu_memory_gb: float | None = None,
    check_packages: bool = True,
) -> LaunchPlan:
    """Composes the server and trainer commands from the configs; checks everything that can fail before a start.

    Args:
        accelerate_config: accelerate config file; decides which GPUs train.
        recipe: the recipe script, e.g. `recipes/countdown.py`.
        config: the recipe YAML (`--config`), or None.
        extra_args: recipe args after the YAML; serving fields among them override the YAML.
        num_gpus: GPU count override (ids `0..n-1`); default `CUDA_VISIBLE_DEVICES`, then `nvidia-smi -L`.
        vllm_tp: server tensor-parallel size; vllm_dp: server data-parallel size (see `server_parallelism`).
        vllm_args: extra args for the server command, e.g. `("--max_model_len", "4096")`.
        server_cmd: a template replacing the server command (see `server_command`).
        train_cmd: a template replacing `accelerate launch ...` (see `trainer_command`).
        log_dir: folder of the server log; default the recipe's `output_dir`, else `runs/launch`.
        environ: environment to read `CUDA_VISIBLE_DEVICES` from (default `os.environ`).
        gpu_memory_gb: the preflight's memory limit per training GPU (default: its memory per nvidia-smi).
        check_packages: the preflight checks that vLLM / DeepSpeed / bitsandbytes are installed where needed.

    Raises:
        LaunchError: a missing file, a bad field, a GPU split that leaves the server nothing, a failed preflight.
    """
    setup = read_accelerate_config(accelerate_config)
    if not Path(recipe).is_file():
        raise LaunchError(f"recipe script {recipe} not found")
    serving = read_recipe_serving(config, extra_args)
    launch_args = rendezvous_args(setup)
    local = serving.server_mode and serving.local_server
    if not local:
        if not serving.server_mode:
            note = (
                f"recipe {config or '(no --config)'} does not use vLLM server mode "
                f"(use_vllm={serving.use_vllm}, vllm_mode={serving.vllm_mode}): running accelerate launch only"
            )
        else:
            note = (
                f"vllm_server_host {serving.host} is not this machine: start the server there "
                f"(trl vllm-serve --model {serving.model} --port {serving.port}); running accelerate launch only"
            )
        train: list[str] = []
        if recipe_script_task(recipe) and not setup.use_cpu:  # the preflight's memory check wants the training GPUs
            available, source = detect_gpus(num_gpus, environ)
            train = split_gpus(setup, available, source)[0] if available else []
        report = launch_preflight(
            setup, recipe, config, extra_args, train, gpu_memory_gb=gpu_memory_gb, check_packages=check_packages
        )
        extra = [*extra_args, *(report.trainer_flags() if report else [])]
        env = {"CUDA_VISIBLE_DEVICES": ",".join(train)} if train else None
        trainer = trainer_command(accelerate_config, recipe, config, extra, env, train_cmd, launch_args)
        return LaunchPlan(
            trainer=trainer,
            train_gpus=tuple(train),
            notes=(note,),
            preflight=report.render() if report else "",
            report=report,
        )
    if not serving.model:
        raise LaunchError(f"recipe config {config}: vLLM server mode needs `model_name_or_path` to serve")

    available, source = detect_gpus(num_gpus, environ)
    train, free = split_gpus(setup, available, source)
    on_cpu = not available and vllm_cpu_build()
    if on_cpu:
        if (vllm_tp or 1) * (vllm_dp or 1) > 1:
            raise LaunchError(f"vLLM's CPU build serves from one process: no --vllm-tp {vllm_tp} --vllm-dp {vllm_dp}")
        server_gpus, tp, dp = [], 1, 1
    elif not free:
        raise LaunchError(
            f"no free GPU left for the vLLM server: accelerate config {setup.path} trains on {train} and "
            f"{len(available)} GPU(s) are available (from {source}): {available}. Train on fewer GPUs "
            "(`gpu_ids`, `num_processes`), or use `vllm_mode: colocate`"
        )
    else:
        server_gpus, tp, dp = server_parallelism(free, vllm_tp, vllm_dp)
    report = launch_preflight(
        setup, recipe, config, extra_args, train, server_gpus, tp, gpu_memory_gb, check_packages=check_packages
    )
    port = (
        next((p.port for p in report.ports if p.field == "vllm_server_port"), serving.port) if report else serving.port
    )
    bind_host, extra_args, bind_note = _bind(setup, serving, list(extra_args), port)
    stated = {a.lstrip("-").split("=")[0].replace("-", "_") for a in vllm_args}
    if serving.gpu_memory_utilization is not None and "gpu_memory_utilization" not in stated:
        vllm_args = [*vllm_args, "--gpu_memory_utilization", str(serving.gpu_memory_utilization)]
    server = server_command(serving.model, bind_host, port, tp, dp, server_gpus, vllm_args, server_cmd)
    # The trainer sees only its own GPUs, so nothing in it can touch the server's.
    trainer_env = {"CUDA_VISIBLE_DEVICES": ",".join(train)}
    extra = [*extra_args, *(report.trainer_flags() if report else [])]
    trainer = trainer_command(accelerate_config, recipe, config, extra, trainer_env, train_cmd, launch_args)
    log_root = Path(log_dir) if log_dir is not None else Path(serving.output_dir or "runs/launch")
    connect_host = "127.0.0.1" if bind_host in ("", "0.0.0.0", "::") else bind_host
    idle = [gpu for gpu in free if gpu not in server_gpus]
    where = "the CPU (vLLM's CPU build, no GPU found)" if on_cpu else f"GPU(s) {','.join(server_gpus)}"
    note = (
        f"vLLM server mode: {serving.model} on {where} (tp {tp}, dp {dp}), training on "
        f"{','.join(train) or 'CPU'}; {len(available)} GPU(s) from {source}"
        + (f"; idle: {','.join(idle)}" if idle else "")
    )
    return LaunchPlan(
        trainer=trainer,
        server=server,
        host=bind_host,
        port=port,
        health_url=f"http://{_url_host(connect_host)}:{port}{HEALTH_PATH}",
        server_log=log_root / f"vllm_server_{port}.log",
        train_gpus=tuple(train),
        server_gpus=tuple(server_gpus),
        notes=(note, bind_note),
        preflight=report.render() if report else "",
        report=report,
    )


def _bind(setup: AccelerateSetup, serving, extra_args: list[str], port: int) -> tuple[str, list[str], str]:
    """The server's bind host, the trainer's recipe args, and the plan's note about who can reach the server.

    One machine: the server binds 127.0.0.1; a recipe host that would not reach it there (the machine's name,
    `::`) is replaced for the trainer by `--vllm_server_host 127.0.0.1` (or `--vllm_server_base_url`). Several
    machines (`num_machines > 1`): the server binds the recipe's host (TRL's default 0.0.0.0), reachable from the
    network, and the note says so.
    """
    if setup.num_machines > 1:
        host = serving.host or "0.0.0.0"
        return (
            host,
            extra_args,
            (
                f"the plan spans {setup.num_machines} machines: the server binds {host}, reachable from the network; "
                f"with VLLM_SERVER_DEV_MODE=1 (set by trl vllm-serve) anyone who reaches port {port} can replace the "
                "weights: firewall it to the training machines"
            ),
        )
    note = f"the server binds {SERVER_BIND_HOST} (one machine: only this machine can reach port {port})"
    if serving.host not in _LOOPBACK_CLIENT_HOSTS:
        if serving.base_url:
            flag = ["--vllm_server_base_url", f"http://{SERVER_BIND_HOST}:{port}"]
        else:
            flag = ["--vllm_server_host", SERVER_BIND_HOST]
        extra_args = [*extra_args, *flag]
        note += f"; the trainer gets {shlex.join(flag)} instead of {serving.host}"
    return SERVER_BIND_HOST, extra_args, note


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
