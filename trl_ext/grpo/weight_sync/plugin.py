"""What names the CPU weight transfer outside the trainer: the backend's name and the server flags that select it (the
launcher reads them), the environment variable naming the server's log, and the `vllm.general_plugins` entry point
that adds the backend to vLLM's registry in every vLLM process.

Light to import (vLLM loads it in each of its processes; the launcher reads it): nothing but the standard library
at import time.
"""

from __future__ import annotations

import json

BACKEND = "trl_ext_gloo"
# The server's log file, set by `trl-ext launch` for the trainer: named in the error when the server is gone.
SERVER_LOG_ENV = "TRL_EXT_VLLM_SERVER_LOG"
ENGINE_MODULE = "trl_ext.grpo.weight_sync.engine"
ENGINE_CLASS = "GlooWeightTransferEngine"


def server_args() -> list[str]:
    """The `vllm serve` / `trl vllm-serve` flags that select this transfer (TRL's `vllm-serve` passes nccl first; a
    later flag wins)."""
    return ["--weight-transfer-config", json.dumps({"backend": BACKEND})]


def register() -> None:
    """The `vllm.general_plugins` entry point: adds `BACKEND` to vLLM's weight-transfer registry (lazily: the engine
    module loads when a server selects it). vLLM runs plugins in each of its processes, possibly more than once."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, ENGINE_MODULE, ENGINE_CLASS)
