"""A watchdog around every weight sync and generation request of a vLLM server, whatever carries the weights.

TRL 1.16 syncs a server over NCCL (`VLLMClient.update_named_params`: an HTTP call, then a broadcast into the
server's workers) and generates over HTTP without a timeout. A server or worker that stops answering mid-broadcast
or mid-request hangs the run without a word (a broadcast cannot be interrupted from Python, nor can a blocked socket
read). Our gloo transfer (`trl_ext.grpo.vllm.client`) bounds its own waits, but what it was doing when it gave
up is not in its error either.

In server mode the main process's `TrlExtVLLMGeneration` (`trl_ext.grpo.vllm.generation`) holds one `Watchdog`,
shared with its client, and times with it:

- `sync_weights`: a timer of `timeout_s` (the run's `vllm_server_timeout`) runs while it does; each tensor handed to
  the client is recorded (`_iter_named_params`, which feeds the client, NCCL or gloo alike);
- the client's `generate` / `chat` (`TrlExtVLLMClient`): the same timer per request.

When the timer fires the watchdog writes to stderr which step, which operation and which tensor (name, index of
how many) it was at, the last lines of the server's log (`TRL_EXT_VLLM_SERVER_LOG`, set by `trl-ext launch`), and
ends the process with exit code `STALL_EXIT_CODE` (`os._exit`: the stuck call cannot be unwound). `trl-ext launch` then
stops the server's process group too (`trl_ext.launch.supervision`). A sync or request that fails instead of
stalling raises `ServerSyncError` with the same facts, chained to the original error.

What only a GPU shows: the NCCL broadcast itself (here the watchdog is exercised on the gloo path and on HTTP
requests, by stopping the server process); on a GPU a stuck NCCL collective can also leave the CUDA context unusable,
which `os._exit` does not need to clean up.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

from trl_ext.grpo.weight_sync.plugin import SERVER_LOG_ENV
from trl_ext.host import log_tail

STALL_EXIT_CODE = 3
TAIL_LINES = 20


class ServerSyncError(RuntimeError):
    """A weight sync or generation request to the vLLM server failed (not stalled); the message names where."""


class Watchdog:
    """Times one operation at a time against the server; see the module docstring.

    Args:
        timeout_s: how long one sync or request may take.
        step: returns the trainer's current optimizer step (for the message).
        server_log: the server's log file (default: `TRL_EXT_VLLM_SERVER_LOG`).
        on_stall: called with the message when the timer fires (default: write it to stderr and `os._exit`).
    """

    def __init__(
        self,
        timeout_s: float,
        step: Callable[[], int],
        server_log: str | None = None,
        on_stall: Callable[[str], None] | None = None,
    ):
        self.timeout_s = float(timeout_s)
        self.step = step
        self.server_log = server_log if server_log is not None else os.environ.get(SERVER_LOG_ENV)
        self.on_stall = on_stall or _stop_process
        self.operation = ""
        self.tensor: tuple[str, int, int | None] | None = None  # (name, index, of how many)
        self._lock = threading.Lock()
        self._next = 0
        self._active: set[int] = set()  # watched operations not finished (a rollout thread may overlap a sync)

    def where(self) -> str:
        """`weight sync at step 3, tensor 'model.layers.0.mlp.up_proj.weight' (5 of 23)`."""
        text = f"{self.operation} at step {self.step()}"
        if self.tensor is not None:
            name, index, total = self.tensor
            text += f", tensor {name!r} ({index + 1}{f' of {total}' if total else ''})"
        return text

    def stall_message(self, started: float) -> str:
        tail = log_tail(self.server_log, TAIL_LINES)
        where = f"last {TAIL_LINES} lines of the server log {self.server_log}" if self.server_log else None
        return (
            f"vLLM server watchdog: {self.where()} did not finish in {time.monotonic() - started:.1f} s "
            f"(vllm_server_timeout {self.timeout_s:g} s): the server stopped answering; stopping the run.\n"
            + (f"{where}:\n{tail}\n" if where else "the server's log is not known (set TRL_EXT_VLLM_SERVER_LOG)\n")
        )

    @contextmanager
    def watch(self, operation: str):
        """Times the block; a failure inside it is re-raised as `ServerSyncError` naming where it was."""
        with self._lock:
            self._next += 1
            token = self._next
            self._active.add(token)
        self.operation, self.tensor = operation, None
        started = time.monotonic()
        timer = threading.Timer(self.timeout_s, self._expire, args=(token, started))
        timer.daemon = True
        timer.start()
        try:
            yield self
        except ServerSyncError:
            raise
        except Exception as exc:
            raise ServerSyncError(f"{self.where()} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            timer.cancel()
            with self._lock:
                self._active.discard(token)  # a timer that fires now does nothing

    def progress(self, name: str, index: int, total: int | None = None) -> None:
        self.tensor = (name, index, total)

    def _expire(self, token: int, started: float) -> None:
        with self._lock:
            if token not in self._active:
                return
            message = self.stall_message(started)
        self.on_stall(message)


def _stop_process(message: str) -> None:
    sys.stderr.write(message)
    sys.stderr.flush()
    os._exit(STALL_EXIT_CODE)


def watched(dog: Watchdog | None, operation: str):
    """`dog.watch(operation)`, or a block that does nothing without a watchdog (colocate mode, other processes)."""
    return nullcontext() if dog is None else dog.watch(operation)
