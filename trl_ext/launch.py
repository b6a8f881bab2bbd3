"""`trl-ext launch`: a vLLM server on the GPUs training leaves free, then the trainer, with no orphans.

The accelerate config is the single source of truth for which GPUs train (`gpu_ids`, `num_processes`); the vLLM
server gets the others, so the two never share a device (NCCL "duplicate GPU" errors, TRL issues #3706, #3762).

1. `plan_launch` (pure, starts nothing) reads the accelerate config and the recipe YAML (`base:` resolved), splits
   the GPUs and composes both commands: `trl vllm-serve --model M --tensor-parallel-size N --data-parallel-size D
   --port P --host H` (TRL 1.16's server mode, which wraps `vllm serve`) with `CUDA_VISIBLE_DEVICES` = the server
   GPUs, and `accelerate launch --config_file FILE RECIPE --config YAML ...` with `CUDA_VISIBLE_DEVICES` = the
   training GPUs.
2. `run_launch` checks the port is free, starts the server in its own process group (`ServerProcess`, output to a
   log file), polls `GET /health` until it answers 200, runs the trainer and returns the trainer's exit code.
3. On success, failure, Ctrl-C (SIGINT) and SIGTERM both process groups (trainer, server) are stopped: SIGTERM,
   then SIGKILL after a grace period.

Recipes that do not use vLLM server mode (`use_vllm: true` and `vllm_mode: server`) get `accelerate launch` only.
Module top level stays stdlib + typer so `trl-ext --help` is fast.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import typer

# TRL 1.16 GRPOConfig defaults for the server the trainer connects to.
TRL_DEFAULT_HOST = "0.0.0.0"
TRL_DEFAULT_PORT = 8000
# vLLM's own server (what `trl vllm-serve` runs in TRL 1.16) answers here; TRL's VLLMClient.check_server polls it.
HEALTH_PATH = "/health"
SERVER_CMD_ENV = "TRL_EXT_SERVER_CMD"
TRAIN_CMD_ENV = "TRL_EXT_TRAIN_CMD"
# Addresses that mean "this machine": only then does the launcher start the server itself.
_LOCAL_HOSTS = {"", "0.0.0.0", "::", "localhost", "127.0.0.1", "::1"}
# Recipe fields the launcher reads; extra recipe args (`--vllm_server_port 8001`) override the YAML like TrlParser.
_SERVING_KEYS = (
    "model_name_or_path",
    "use_vllm",
    "vllm_mode",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_base_url",
    "output_dir",
)


class LaunchError(RuntimeError):
    """A launch that cannot go on; the message names the file, field or process at fault."""


class _Interrupted(BaseException):
    """Raised by the launcher's SIGINT/SIGTERM handler so every `finally` below runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class AccelerateSetup:
    """What the launcher needs from an accelerate config file.

    Attributes:
        path: the config file.
        distributed_type: accelerate's `distributed_type` (`NO`, `MULTI_GPU`, `DEEPSPEED`, ...).
        num_processes: processes over all machines (accelerate's meaning).
        num_machines: machines taking part.
        gpu_ids: the GPUs training uses on this machine, or None for accelerate's `all` (the first
            `num_processes / num_machines` visible GPUs).
        use_cpu: training runs on CPU and takes no GPU.
    """

    path: Path
    distributed_type: str
    num_processes: int
    num_machines: int = 1
    gpu_ids: tuple[str, ...] | None = None
    use_cpu: bool = False

    @property
    def local_processes(self) -> int:
        """Training processes on this machine: `num_processes // num_machines`."""
        return max(self.num_processes // self.num_machines, 1)


def read_accelerate_config(path: str | Path) -> AccelerateSetup:
    """Reads the placement fields of an accelerate config YAML, with errors that name the file and field.

    Args:
        path: an accelerate config file (as written by `accelerate config` or in `accelerate_configs/`).

    Returns:
        The parsed `AccelerateSetup`.

    Raises:
        LaunchError: the file is missing, is not YAML mapping, or has a bad `distributed_type`, `num_processes`,
            `num_machines` or `gpu_ids`.
    """
    path = Path(path)
    data = _read_yaml_mapping(path, "accelerate config")
    if "distributed_type" not in data:
        raise LaunchError(f"accelerate config {path}: missing `distributed_type` (e.g. 'NO', MULTI_GPU, DEEPSPEED)")
    distributed_type = data["distributed_type"]
    # Unquoted `NO` is YAML 1.1 for False; accelerate itself writes 'NO' quoted.
    distributed_type = "NO" if distributed_type is False else str(distributed_type).upper()
    if "num_processes" in data:
        num_processes = _as_int(data["num_processes"], f"accelerate config {path}: `num_processes`", minimum=1)
    elif distributed_type == "NO":
        num_processes = 1
    else:
        raise LaunchError(
            f"accelerate config {path}: `num_processes` is required with distributed_type {distributed_type}"
        )
    num_machines = _as_int(data.get("num_machines", 1), f"accelerate config {path}: `num_machines`", minimum=1)
    use_cpu = bool(data.get("use_cpu", False))
    raw_ids = data.get("gpu_ids")
    gpu_ids: tuple[str, ...] | None = None
    if raw_ids is not None and str(raw_ids).strip().lower() != "all":
        gpu_ids = tuple(part.strip() for part in str(raw_ids).split(","))
        if not all(gpu_ids):
            raise LaunchError(f"accelerate config {path}: `gpu_ids` {raw_ids!r} is not 'all' or a list like '0,1'")
        if len(set(gpu_ids)) != len(gpu_ids):
            raise LaunchError(f"accelerate config {path}: `gpu_ids` {raw_ids!r} repeats a GPU")
    return AccelerateSetup(path, distributed_type, num_processes, num_machines, gpu_ids, use_cpu)


def load_recipe_yaml(path: str | Path) -> dict:
    """A recipe YAML as one flat dict, its `base:` chain resolved, read by `trl_ext.recipes.load_recipe_yaml` so the
    launcher and the recipe scripts see the same values."""
    from trl_ext.recipes import load_recipe_yaml as recipes_load_yaml

    try:
        return dict(recipes_load_yaml(path))
    except (OSError, ValueError) as exc:  # trl_ext.recipes.RecipeError is a ValueError naming the file
        raise LaunchError(f"recipe config: {exc}") from exc


def _read_yaml_mapping(path: Path, what: str) -> dict:
    import yaml

    if not path.is_file():
        raise LaunchError(f"{what} {path} not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise LaunchError(f"{what} {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LaunchError(f"{what} {path} must be a YAML mapping of field: value, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class RecipeServing:
    """The recipe fields that decide whether and how a vLLM server is started (TRL 1.16 defaults)."""

    use_vllm: bool = False
    vllm_mode: str = "colocate"
    model: str | None = None
    host: str = TRL_DEFAULT_HOST
    port: int = TRL_DEFAULT_PORT
    output_dir: str | None = None

    @property
    def server_mode(self) -> bool:
        """TRL only talks to a server with `use_vllm: true` and `vllm_mode: server`."""
        return self.use_vllm and self.vllm_mode == "server"

    @property
    def local_server(self) -> bool:
        return self.host in _LOCAL_HOSTS or self.host in {socket.gethostname(), socket.getfqdn()}


def read_recipe_serving(config: str | Path | None, extra_args: Sequence[str] = ()) -> RecipeServing:
    """Reads the serving fields from a recipe YAML (`base:` resolved) and the recipe args that override it.

    Args:
        config: the recipe YAML given as `--config`, or None (TRL defaults: no vLLM).
        extra_args: the args after the recipe, e.g. `("--vllm_server_port", "8001")`; `--key value`,
            `--key=value` and dashed keys are read the way TrlParser reads them.

    Raises:
        LaunchError: a field has a value of the wrong type (named with its file).
    """
    source = "recipe args"
    values: dict = {}
    if config is not None:
        source = f"recipe config {config}"
        values = {k: v for k, v in load_recipe_yaml(config).items() if k in _SERVING_KEYS}
    values.update(_serving_overrides(extra_args))
    use_vllm = _as_bool(values.get("use_vllm", False), f"{source}: `use_vllm`")
    vllm_mode = str(values.get("vllm_mode", "colocate"))
    if vllm_mode not in ("server", "colocate"):
        raise LaunchError(f"{source}: `vllm_mode` must be 'server' or 'colocate', got {vllm_mode!r}")
    host = str(values.get("vllm_server_host", TRL_DEFAULT_HOST))
    port = _as_int(values.get("vllm_server_port", TRL_DEFAULT_PORT), f"{source}: `vllm_server_port`", minimum=1)
    base_url = values.get("vllm_server_base_url")
    if base_url:
        # TRL ignores host and port when a base URL is given; so do we.
        parsed = urllib.parse.urlparse(str(base_url))
        if not parsed.hostname:
            raise LaunchError(f"{source}: `vllm_server_base_url` {base_url!r} has no host")
        host = parsed.hostname
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    model = values.get("model_name_or_path")
    output_dir = values.get("output_dir")
    return RecipeServing(
        use_vllm=use_vllm,
        vllm_mode=vllm_mode,
        model=None if model is None else str(model),
        host=host,
        port=port,
        output_dir=None if output_dir is None else str(output_dir),
    )


def _serving_overrides(args: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            key, has_value, value = token[2:].partition("=")
            key = key.replace("-", "_")
            if key in _SERVING_KEYS:
                if has_value:
                    out[key] = value
                elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                    out[key] = args[i + 1]
                    i += 1
                else:  # a bare boolean flag, e.g. `--use_vllm`
                    out[key] = "true"
        i += 1
    return out


def _as_bool(value, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "y"):
        return True
    if text in ("false", "0", "no", "n"):
        return False
    raise LaunchError(f"{what} must be true or false, got {value!r}")


def _as_int(value, what: str, minimum: int = 0) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise LaunchError(f"{what} must be an integer >= {minimum}, got {value!r}") from None
    if isinstance(value, bool) or number < minimum:
        raise LaunchError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return number


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

    def render(self) -> str:
        lines = list(self.notes)
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
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}
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
) -> Command:
    """`accelerate launch --config_file FILE RECIPE [--config YAML] [extra_args]`.

    `template` replaces it (tests): formatted with `{accelerate_config}`, `{recipe}`, `{config}`, `{python}`;
    `extra_args` are appended either way.
    """
    if template is not None:
        fields = {"accelerate_config": accelerate_config, "recipe": recipe, "config": config or ""}
        argv = shlex.split(template.format(python=sys.executable, **fields))
    else:
        argv = [_tool("accelerate"), "launch", "--config_file", str(accelerate_config), str(recipe)]
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

    Raises:
        LaunchError: a missing file, a bad field, a GPU split that leaves the server nothing.
    """
    setup = read_accelerate_config(accelerate_config)
    if not Path(recipe).is_file():
        raise LaunchError(f"recipe script {recipe} not found")
    serving = read_recipe_serving(config, extra_args)
    if not serving.server_mode:
        note = (
            f"recipe {config or '(no --config)'} does not use vLLM server mode "
            f"(use_vllm={serving.use_vllm}, vllm_mode={serving.vllm_mode}): running accelerate launch only"
        )
        trainer = trainer_command(accelerate_config, recipe, config, extra_args, template=train_cmd)
        return LaunchPlan(trainer=trainer, notes=(note,))
    if not serving.local_server:
        note = (
            f"vllm_server_host {serving.host} is not this machine: start the server there "
            f"(trl vllm-serve --model {serving.model} --port {serving.port}); running accelerate launch only"
        )
        trainer = trainer_command(accelerate_config, recipe, config, extra_args, template=train_cmd)
        return LaunchPlan(trainer=trainer, notes=(note,))
    if not serving.model:
        raise LaunchError(f"recipe config {config}: vLLM server mode needs `model_name_or_path` to serve")

    available, source = detect_gpus(num_gpus, environ)
    train, free = split_gpus(setup, available, source)
    if not free:
        raise LaunchError(
            f"no free GPU left for the vLLM server: accelerate config {setup.path} trains on {train} and "
            f"{len(available)} GPU(s) are available (from {source}): {available}. Train on fewer GPUs "
            "(`gpu_ids`, `num_processes`), or use `vllm_mode: colocate`"
        )
    server_gpus, tp, dp = server_parallelism(free, vllm_tp, vllm_dp)
    server = server_command(serving.model, serving.host, serving.port, tp, dp, server_gpus, vllm_args, server_cmd)
    # The trainer sees only its own GPUs, so nothing in it can touch the server's.
    trainer_env = {"CUDA_VISIBLE_DEVICES": ",".join(train)}
    trainer = trainer_command(accelerate_config, recipe, config, extra_args, trainer_env, template=train_cmd)
    log_root = Path(log_dir) if log_dir is not None else Path(serving.output_dir or "runs/launch")
    connect_host = "127.0.0.1" if serving.host in ("", "0.0.0.0", "::") else serving.host
    idle = [gpu for gpu in free if gpu not in server_gpus]
    note = (
        f"vLLM server mode: {serving.model} on GPU(s) {','.join(server_gpus)} (tp {tp}, dp {dp}), training on "
        f"{','.join(train) or 'CPU'}; {len(available)} GPU(s) from {source}"
        + (f"; idle: {','.join(idle)}" if idle else "")
    )
    return LaunchPlan(
        trainer=trainer,
        server=server,
        host=serving.host,
        port=serving.port,
        health_url=f"http://{_url_host(connect_host)}:{serving.port}{HEALTH_PATH}",
        server_log=log_root / f"vllm_server_{serving.port}.log",
        train_gpus=tuple(train),
        server_gpus=tuple(server_gpus),
        notes=(note,),
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def check_port_free(host: str, port: int) -> None:
    """Raises LaunchError if something already listens on `host:port` (checked by binding it, as the server will)."""
    bind_host = "" if host in ("", "0.0.0.0") else host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR as uvicorn sets it: a port in TIME_WAIT is free for the server, a listening one is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((bind_host, port))
        except OSError as exc:
            raise LaunchError(
                f"port {port} on {host or '0.0.0.0'} is already in use ({exc.strerror}): another vLLM server? Stop it "
                f"or pick another port (`vllm_server_port` in the recipe, or `--vllm_server_port N` after it)"
            ) from None


def _group_alive(pgid: int) -> bool:
    """Whether any live (not zombie) process is in group `pgid`.

    `killpg(pgid, 0)` alone also counts zombies, which a container whose PID 1 does not reap keeps forever, so
    `/proc` is read where there is one.
    """
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the parenthesised command name: state, ppid, pgrp, ...
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        if int(pgrp) == pgid and state not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process_group(proc: subprocess.Popen, grace: float, first_signal: int = signal.SIGTERM) -> None:
    """Stops `proc` and every process in its group: `first_signal`, then SIGKILL if any is left after `grace` s.

    `proc` must lead its own group (started with `start_new_session=True` or `process_group=0`). Its children
    (vLLM workers, DDP ranks) are waited for too, not only the leader.
    """
    pgid = proc.pid
    _signal_group(pgid, first_signal)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        # poll() reaps the leader; a zombie leader would keep the group "alive".
        if proc.poll() is not None and not _group_alive(pgid):
            return
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5.0
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip()
    except OSError:
        return "(no log)"


class ServerProcess:
    """The vLLM server as a context manager that owns its process group.

    `with ServerProcess(cmd, log, url) as server: server.wait_healthy(600)`: the server starts in its own session
    (so Ctrl-C in the terminal reaches the launcher, which then stops the server in order), its stdout and stderr go
    to `log_path`, and on exit the whole group is stopped (SIGTERM, SIGKILL after `grace` s), whatever happened.
    """

    def __init__(self, command: Command, log_path: str | Path, health_url: str, grace: float = 10.0):
        self.command = command
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.grace = grace
        self.proc: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 -- closed in stop()
        try:
            self.proc = subprocess.Popen(
                self.command.argv,
                env=self.command.full_env(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise LaunchError(f"could not start the vLLM server `{self.command.render()}`: {exc}") from exc

    def tail(self, lines: int = 20) -> str:
        """The last `lines` lines of the server log."""
        if self._log is not None and not self._log.closed:
            self._log.flush()
        return _tail(self.log_path, lines)

    def wait_healthy(self, timeout: float, poll_interval: float = 1.0, tail_lines: int = 20) -> float:
        """Polls `GET health_url` until it answers 200; returns the seconds it took.

        Raises:
            LaunchError: the server exited first (its exit code and last log lines in the message), or `timeout` s
                passed without a 200 (the last log lines too).
        """
        assert self.proc is not None, "start() the server first"
        start = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise LaunchError(
                    f"the vLLM server exited early with code {code} before answering {self.health_url}. "
                    f"Last lines of {self.log_path}:\n{self.tail(tail_lines)}"
                )
            elapsed = time.monotonic() - start
            if elapsed >= timeout:
                raise LaunchError(
                    f"the vLLM server did not become healthy within {timeout:g} s ({self.health_url} never answered "
                    f"200; raise --health-timeout for large models). Last lines of {self.log_path}:\n"
                    f"{self.tail(tail_lines)}"
                )
            try:
                with urllib.request.urlopen(self.health_url, timeout=max(0.1, min(5.0, timeout - elapsed))) as resp:
                    if resp.status == 200:
                        return time.monotonic() - start
            except (urllib.error.URLError, OSError, ValueError):
                pass  # not listening yet, or 5xx while loading (HTTPError is a URLError)
            time.sleep(poll_interval)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, self.grace)
        if self._log is not None:
            self._log.close()


class _SignalGuard:
    """While installed, the first SIGINT / SIGTERM raises `_Interrupted` (main thread only) so cleanup runs in order.

    Once `armed` is False (cleanup has begun) signals are ignored: a second Ctrl-C must not abandon a half-stopped
    server.
    """

    def __init__(self) -> None:
        self.armed = True

    def _handler(self, signum, frame) -> None:
        if self.armed:
            self.armed = False
            raise _Interrupted(signum)

    @contextmanager
    def installed(self) -> Iterator[_SignalGuard]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def run_launch(
    plan: LaunchPlan,
    *,
    health_timeout: float = 900.0,
    grace: float = 10.0,
    poll_interval: float = 1.0,
    echo=print,
) -> int:
    """Runs a `LaunchPlan`: the server (if any) until healthy, then the trainer; always stops both.

    Returns:
        The trainer's exit code, or `128 + signal` when the launcher was interrupted (130 for Ctrl-C).

    Raises:
        LaunchError: port in use, server exited early, health timeout (the server is stopped first).
    """
    if plan.server is not None:
        check_port_free(plan.host or "", plan.port or TRL_DEFAULT_PORT)
    server = None
    if plan.server is not None:
        server = ServerProcess(plan.server, plan.server_log, plan.health_url, grace=grace)
    trainer: subprocess.Popen | None = None
    interrupted: int | None = None
    guard = _SignalGuard()
    with guard.installed():
        try:
            if server is not None:
                echo(f"starting the vLLM server (log {plan.server_log}), waiting for {plan.health_url}")
                server.start()
                took = server.wait_healthy(health_timeout, poll_interval)
                echo(f"vLLM server healthy after {took:.1f} s (pid {server.pid}); starting the trainer")
            # Its own process group, so a stop reaches accelerate's worker processes too; stdin closed so a
            # background group never blocks on the terminal.
            try:
                trainer = subprocess.Popen(
                    plan.trainer.argv, env=plan.trainer.full_env(), stdin=subprocess.DEVNULL, process_group=0
                )
            except OSError as exc:
                raise LaunchError(f"could not start the trainer `{plan.trainer.render()}`: {exc}") from exc
            code = trainer.wait()
        except _Interrupted as exc:
            interrupted = exc.signum
            code = 128 + exc.signum
        finally:
            guard.armed = False
            if trainer is not None:
                stop_process_group(trainer, grace)
            if server is not None:
                server.stop()
    if interrupted is not None:
        echo(f"interrupted by {signal.Signals(interrupted).name}: trainer and vLLM server stopped")
    elif server is not None:
        echo(f"trainer exited with code {code}; vLLM server stopped")
    return code


def register(app: typer.Typer) -> None:
    """Adds `trl-ext launch` to the Typer app."""

    @app.command(
        "launch",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        help=(
            "Start the vLLM server on the GPUs the accelerate config leaves free, wait for its health endpoint, "
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
            None, "--num-gpus", help="GPUs on this machine (default: CUDA_VISIBLE_DEVICES, else nvidia-smi -L)."
        ),
        vllm_tp: int | None = typer.Option(None, "--vllm-tp", help="Server tensor-parallel size (default: all free)."),
        vllm_dp: int | None = typer.Option(None, "--vllm-dp", help="Server data-parallel size (default 1)."),
        vllm_args: str = typer.Option(
            "", "--vllm-args", help="Extra server args, one string, e.g. '--max_model_len 4096'."
        ),
        health_timeout: float = typer.Option(900.0, "--health-timeout", help="Seconds to wait for /health."),
        grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL when stopping."),
        log_dir: Path | None = typer.Option(
            None, "--log-dir", help="Folder of the server log (default: the recipe's output_dir, else runs/launch)."
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
        dry_run: bool = typer.Option(False, "--dry-run", help="Print both commands (with their env) and exit."),
    ) -> None:
        try:
            plan = plan_launch(
                accelerate_config,
                recipe,
                config,
                list(ctx.args),
                num_gpus=num_gpus,
                vllm_tp=vllm_tp,
                vllm_dp=vllm_dp,
                vllm_args=shlex.split(vllm_args),
                server_cmd=server_cmd,
                train_cmd=train_cmd,
                log_dir=log_dir,
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
