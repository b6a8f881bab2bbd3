"""Child runs of the toy benchmark scripts: an offline, one-thread environment and a logged, timed subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """This checkout first on the path, offline (hub, datasets, wandb), one torch thread, no vLLM usage stats."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline")
    env.update(OMP_NUM_THREADS="1", VLLM_NO_USAGE_STATS="1")
    return env


def child_env_changes() -> dict[str, str]:
    """The variables `child_env()` sets or changes on top of this process's environment."""
    return {key: value for key, value in child_env().items() if os.environ.get(key) != value}


def run_logged(args: list[str], log: Path, name: str, prefix: tuple[str, ...] = ()) -> float:
    """`python ARGS` in `child_env()` (after `prefix`, e.g. `taskset -c 1`), output to `log`; returns its wall
    seconds, or raises with the log's tail."""
    cmd = [*prefix, sys.executable, *args]
    print("$", " ".join(cmd), f"> {log}", flush=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, env=child_env(), stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{name} failed ({proc.returncode}); last lines of {log}:\n{tail}")
    return time.perf_counter() - started
