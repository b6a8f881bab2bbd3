"""What a launch reads from its inputs: the accelerate config's placement fields and the recipe's serving fields."""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trl_ext.preflight.trl_defaults import trl_default
from trl_ext.recipes.entry import ParsedRecipe
from trl_ext.recipes.stated import cli_overrides
from trl_ext.recipes.yaml_chain import load_recipe_yaml as recipes_load_yaml

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
    "vllm_gpu_memory_utilization",
    "vllm_group_port",
    "output_dir",
    "dtype",
    "bf16",
    "fp16",
)


class LaunchError(RuntimeError):
    """A launch that cannot go on; the message names the file, field or process at fault."""


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
        zero_stage: DeepSpeed ZeRO stage (`deepspeed_config.zero_stage`; 0 without DeepSpeed).
        main_process_port: torch's rendezvous port when the file sets one.
        machine_rank: this machine's rank among `num_machines` (0 holds training rank 0).
    """

    path: Path
    distributed_type: str
    num_processes: int
    num_machines: int = 1
    gpu_ids: tuple[str, ...] | None = None
    use_cpu: bool = False
    zero_stage: int = 0
    main_process_port: int | None = None
    machine_rank: int = 0

    @property
    def local_processes(self) -> int:
        """Training processes on this machine: `num_processes // num_machines`."""
        return max(self.num_processes // self.num_machines, 1)


def read_accelerate_config(path: str | Path) -> AccelerateSetup:
    """Reads the placement fields of an accelerate config YAML through accelerate's own loader, with errors that
    name the file and field.

    Args:
        path: an accelerate config file (as written by `accelerate config` or in `accelerate_configs/`).

    Returns:
        The parsed `AccelerateSetup`.

    Raises:
        LaunchError: the file is missing, accelerate's loader refuses it, or it has a bad `num_processes`,
            `num_machines`, `gpu_ids`, `zero_stage`, `main_process_port` or `machine_rank`.
    """
    path = Path(path)
    cluster = _load_accelerate_config(path)
    where = f"accelerate config {path}"
    distributed_type = getattr(cluster.distributed_type, "value", str(cluster.distributed_type)).upper()
    if cluster.num_processes is not None and cluster.num_processes != -1:  # accelerate's -1: not in the file
        num_processes = _as_int(cluster.num_processes, f"{where}: `num_processes`", minimum=1)
    elif distributed_type == "NO":
        num_processes = 1
    else:
        raise LaunchError(f"{where}: `num_processes` is required with distributed_type {distributed_type}")
    num_machines = _as_int(cluster.num_machines or 1, f"{where}: `num_machines`", minimum=1)
    raw_ids = cluster.gpu_ids
    gpu_ids: tuple[str, ...] | None = None
    if raw_ids is not None and str(raw_ids).strip().lower() != "all":
        gpu_ids = tuple(part.strip() for part in str(raw_ids).split(","))
        if not all(gpu_ids):
            raise LaunchError(f"{where}: `gpu_ids` {raw_ids!r} is not 'all' or a list like '0,1'")
        if len(set(gpu_ids)) != len(gpu_ids):
            raise LaunchError(f"{where}: `gpu_ids` {raw_ids!r} repeats a GPU")
    zero_stage = 0
    if distributed_type == "DEEPSPEED":
        zero_stage = _as_int(
            (cluster.deepspeed_config or {}).get("zero_stage", 0), f"{where}: `zero_stage`", minimum=0
        )
    port = cluster.main_process_port
    main_port = None if port is None else _as_int(port, f"{where}: `main_process_port`", minimum=1)
    machine_rank = _as_int(cluster.machine_rank or 0, f"{where}: `machine_rank`", minimum=0)
    if machine_rank >= num_machines:
        raise LaunchError(f"{where}: `machine_rank` {machine_rank} is not below `num_machines` {num_machines}")
    use_cpu = bool(cluster.use_cpu)
    return AccelerateSetup(
        path, distributed_type, num_processes, num_machines, gpu_ids, use_cpu, zero_stage, main_port, machine_rank
    )


def load_recipe_yaml(path: str | Path) -> dict:
    """A recipe YAML as one flat dict, its `base:` chain resolved, read by `trl_ext.recipes.load_recipe_yaml` so the
    launcher and the recipe scripts see the same values."""
    try:
        return dict(recipes_load_yaml(path))
    except (OSError, ValueError) as exc:  # trl_ext.recipes.RecipeError is a ValueError naming the file
        raise LaunchError(f"recipe config: {exc}") from exc


def _load_accelerate_config(path: Path):
    """The file through accelerate's own loader (what `accelerate launch --config_file` reads, defaults filled in and
    unknown keys refused), with errors that name the file."""
    from accelerate.commands.config.config_args import ClusterConfig

    if not path.is_file():
        raise LaunchError(f"accelerate config {path} not found")
    try:
        return ClusterConfig.from_yaml_file(yaml_file=str(path))
    except Exception as exc:  # noqa: BLE001 - accelerate raises ValueError, TypeError, yaml's errors, ...
        raise LaunchError(f"accelerate config {path}: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class RecipeServing:
    """The recipe fields that decide whether and how a vLLM server is started (TRL 1.16 defaults)."""

    use_vllm: bool = False
    vllm_mode: str = "colocate"
    model: str | None = None
    host: str = field(default_factory=lambda: trl_default("vllm_server_host"))
    port: int = field(default_factory=lambda: trl_default("vllm_server_port"))
    output_dir: str | None = None
    base_url: str | None = None
    gpu_memory_utilization: float | None = None  # the recipe's vLLM share, passed to the server it starts
    port_stated: bool = False
    group_port: int | None = None
    # The dtype the trainer computes in when it runs without autocast (`dtype` with bf16 / fp16 off), else None.
    compute_dtype: str | None = None

    @property
    def server_mode(self) -> bool:
        """TRL only talks to a server with `use_vllm: true` and `vllm_mode: server`."""
        return self.use_vllm and self.vllm_mode == "server"

    @property
    def local_server(self) -> bool:
        return self.host in _LOCAL_HOSTS or self.host in {socket.gethostname(), socket.getfqdn()}


def serving_from_parsed(recipe: ParsedRecipe) -> RecipeServing:
    """The serving fields of a trl_ext recipe as the trainer's parser parsed it (`trl_ext.recipes.parse_recipe`).

    A field the recipe leaves unset keeps what `read_recipe_serving` gives it (no vLLM share passed to the server,
    no group port, no output_dir, autocast only when `bf16` / `fp16` is stated true): `recipe.stated` says which
    were set.

    Raises:
        LaunchError: `vllm_mode`, `vllm_gpu_memory_utilization` or `vllm_server_base_url` has a value the launcher
            cannot serve (named with its file).
    """
    _, args, model_args = recipe.parsed
    stated = recipe.stated
    source = f"recipe config {recipe.config}" if recipe.config is not None else "recipe args"
    vllm_mode = str(args.vllm_mode)
    if vllm_mode not in ("server", "colocate"):
        raise LaunchError(f"{source}: `vllm_mode` must be 'server' or 'colocate', got {vllm_mode!r}")
    base_url = args.vllm_server_base_url
    host, port = _server_address(str(args.vllm_server_host), int(args.vllm_server_port), base_url, source)
    share = args.vllm_gpu_memory_utilization if stated.get("vllm_gpu_memory_utilization") is not None else None
    if share is not None and (isinstance(share, bool) or not 0 < share <= 1):
        given = stated["vllm_gpu_memory_utilization"]
        raise LaunchError(f"{source}: `vllm_gpu_memory_utilization` must be a fraction in (0, 1], got {given!r}")
    autocast = any(key in stated and bool(getattr(args, key)) for key in ("bf16", "fp16"))
    dtype = model_args.dtype if "dtype" in stated else None
    model = model_args.model_name_or_path if "model_name_or_path" in stated else None
    return RecipeServing(
        use_vllm=bool(args.use_vllm),
        vllm_mode=vllm_mode,
        model=None if model is None else str(model),
        host=host,
        port=port,
        output_dir=str(args.output_dir) if stated.get("output_dir") is not None else None,
        base_url=str(base_url) if base_url else None,
        gpu_memory_utilization=None if share is None else float(share),
        port_stated=bool(base_url) or stated.get("vllm_server_port") is not None,
        group_port=int(args.vllm_group_port) if stated.get("vllm_group_port") is not None else None,
        compute_dtype=None if autocast or dtype in (None, "auto") else str(dtype),
    )


def read_recipe_serving(config: str | Path | None, extra_args: Sequence[str] = ()) -> RecipeServing:
    """Reads the serving fields from a recipe YAML (`base:` resolved) and the recipe args that override it.

    The reader for scripts that are not trl_ext recipes (their parser is not ours to run): a trl_ext recipe is read
    by the trainer's parser once (`serving_from_parsed`). Values are read as TrlParser reads TRL 1.16's fields.

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
    host = str(values["vllm_server_host"] if "vllm_server_host" in values else trl_default("vllm_server_host"))
    port = values["vllm_server_port"] if "vllm_server_port" in values else trl_default("vllm_server_port")
    port = _as_int(port, f"{source}: `vllm_server_port`", minimum=1)
    base_url = values.get("vllm_server_base_url")
    host, port = _server_address(host, port, base_url, source)
    model = values.get("model_name_or_path")
    output_dir = values.get("output_dir")
    stated = values.get("vllm_gpu_memory_utilization")
    unset = stated is None or str(stated).lower() == "null"  # `--vllm_gpu_memory_utilization null` unsets it
    share = None if unset else _as_share(stated, f"{source}: `vllm_gpu_memory_utilization`")
    group = values.get("vllm_group_port")
    autocast = any(_as_bool(values.get(key, False), f"{source}: `{key}`") for key in ("bf16", "fp16"))
    dtype = values.get("dtype")
    return RecipeServing(
        use_vllm=use_vllm,
        vllm_mode=vllm_mode,
        model=None if model is None else str(model),
        host=host,
        port=port,
        output_dir=None if output_dir is None else str(output_dir),
        base_url=str(base_url) if base_url else None,
        gpu_memory_utilization=share,
        port_stated=bool(base_url) or values.get("vllm_server_port") is not None,
        group_port=None if group is None else _as_int(group, f"{source}: `vllm_group_port`", minimum=1),
        compute_dtype=None if autocast or dtype in (None, "auto") else str(dtype),
    )


def _server_address(host: str, port: int, base_url, source: str) -> tuple[str, int]:
    """The server's host and port: TRL ignores host and port when a base URL is given; so do we."""
    if not base_url:
        return host, port
    parsed = urllib.parse.urlparse(str(base_url))
    if not parsed.hostname:
        raise LaunchError(f"{source}: `vllm_server_base_url` {base_url!r} has no host")
    return parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)


def _serving_overrides(args: Sequence[str]) -> dict[str, str]:
    return {key: value for key, value in cli_overrides(args).items() if key in _SERVING_KEYS}


def _as_bool(value, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "y"):
        return True
    if text in ("false", "0", "no", "n"):
        return False
    raise LaunchError(f"{what} must be true or false, got {value!r}")


def _as_share(value, what: str) -> float:
    try:
        share = float(str(value).strip())
    except ValueError:
        share = -1.0
    if isinstance(value, bool) or not 0 < share <= 1:
        raise LaunchError(f"{what} must be a fraction in (0, 1], got {value!r}")
    return share


def _as_int(value, what: str, minimum: int = 0) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise LaunchError(f"{what} must be an integer >= {minimum}, got {value!r}") from None
    if isinstance(value, bool) or number < minimum:
        raise LaunchError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return number
