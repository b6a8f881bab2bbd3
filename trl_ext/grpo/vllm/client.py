"""`TrlExtVLLMClient`: TRL's `VLLMClient` as trl_ext's trainers talk to a vLLM server.

`TrlExtVLLMGeneration` (`trl_ext.grpo.vllm.generation`) builds it in place of TRL's client. Its overrides, each
chaining to TRL's method:

- the weight sync (`init_communicator`, `update_named_params`, `_start_weight_update`, `_finish_weight_update`,
  `close_communicator`): TRL's NCCL on a CUDA device; on any other device a gloo sender (below);
- `generate` / `chat`: timed by the watchdog (`trl_ext.grpo.vllm.watchdog`, set by the generation in server mode);
  a failed request raises `VLLMServerError` naming the server and its log; then TRL's, which posts through `_post`;
- `_post`: a completions request goes to the replay of async rollouts (`replay`, `trl_ext.grpo.vllm.replay`: the
  answer of the request sent ahead, or TRL's `_post`), then vLLM's finish reasons of its answer are recorded
  (`last_finish_reasons`, `trl_ext.grpo.vllm.finish_reasons`); every other request is TRL's `_post` alone.

The CPU weight transfer. TRL 1.16 syncs a vLLM server with vLLM's NCCL weight-transfer engine
(`VLLMClient.init_communicator` / `update_named_params`), which needs a CUDA device. vLLM 0.31 selects the server's
engine by name (`--weight-transfer-config '{"backend": NAME}'`, looked up in `WeightTransferEngineFactory`), and our
`vllm.general_plugins` entry point (`trl_ext.grpo.weight_sync.plugin.register`) adds `BACKEND` there. The two sides,
over the wire of `trl_ext.grpo.weight_sync.wire`:

- server: `trl_ext.grpo.weight_sync.engine.GlooWeightTransferEngine`, in each vLLM worker: joins the group at
  `/init_weight_transfer_engine`, and per sync runs vLLM's layerwise reload (`/start_weight_update`), receives and
  loads the tensors (`/update_weights`), then finishes the reload and repacks the layers that kept their weight (a
  tied LM head: `trl_ext.grpo.weight_sync.colocate.repack_kept_weight_layers`) (`/finish_weight_update`);
- trainer: this client. TRL calls, as on a GPU, `init_communicator(accelerator.device)` once and, per sync,
  `update_named_params(metadata, VLLMGeneration._iter_named_params())` and `reset_prefix_cache()`, with TRL's own
  tensors (PEFT merged, names as TRL fixes them), so every tensor TRL's sync moves is moved. On a CUDA device every
  weight-sync method is TRL's own (NCCL).

Failure: every request of the sync goes without retries and is bounded by `timeout_s` (TRL's
`vllm_server_timeout`), as is every broadcast; a server that is gone (or whose requests fail) raises
`VLLMServerError` naming the server, its log when the launcher gave it (`TRL_EXT_VLLM_SERVER_LOG`) and the log's last
lines. Generation keeps TRL's retries (about 60 s for a refused connection), then fails the same way.
"""

from __future__ import annotations

import atexit
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import requests
import torch
from trl.generation.vllm_client import VLLMClient

from trl_ext.grpo.vllm.finish_reasons import Record, choice_reasons
from trl_ext.grpo.vllm.replay import COMPLETIONS_ENDPOINT, Replay
from trl_ext.grpo.vllm.watchdog import Watchdog, watched
from trl_ext.grpo.weight_sync.plugin import BACKEND, SERVER_LOG_ENV, server_args
from trl_ext.grpo.weight_sync.wire import CHUNK_BYTES, GlooLink, chunk_plan, local_address_towards, send_chunks
from trl_ext.host import log_tail

TAIL_LINES = 15


def server_log() -> str | None:
    """The server's log file when the launcher named it (`SERVER_LOG_ENV`)."""
    return os.environ.get(SERVER_LOG_ENV) or None


class VLLMServerError(RuntimeError):
    """The vLLM server did not answer a weight sync or a generation request; the message names it and its log."""


# What a request or a broadcast raises when the server is gone: requests' errors, gloo's (RuntimeError), timeouts.
_TRANSPORT_ERRORS = (requests.RequestException, RuntimeError, TimeoutError, FutureTimeout, OSError)


def _server_failures(*errors: type[BaseException]):
    """Turns an `errors` failure of the decorated method into a `VLLMServerError` naming the server and its log."""

    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except VLLMServerError:
                raise
            except errors as exc:
                raise self.server_error(f"{method.__name__} failed", exc) from exc

        return wrapper

    return decorate


class TrlExtVLLMClient(VLLMClient):
    """TRL's `VLLMClient` with the overrides of the module docstring.

    Args: those of `VLLMClient`; `connection_timeout` (TRL passes `vllm_server_timeout`) also bounds each step of a
    weight sync (`timeout_s`, at least 30 s).

    Attributes:
        watchdog: times each `generate` / `chat` (None: untimed); `TrlExtVLLMGeneration` sets it in server mode.
        replay: answers completions requests while async rollouts run (None: TRL's `_post`); set by
            `trl_ext.grpo.rollouts.async_rollouts` on the main process.
        last_finish_reasons: `(finish_reason, stop_reason)` of each choice of the last completions answer.
    """

    def __init__(
        self,
        base_url: str | None = None,
        host: str = "0.0.0.0",
        server_port: int = 8000,
        group_port: int = 51216,
        connection_timeout: float = 0.0,
    ):
        self.timeout_s = max(float(connection_timeout), 30.0)
        self.log_path = server_log()
        self.chunk_bytes = CHUNK_BYTES
        self._gloo = False
        self.watchdog: Watchdog | None = None
        self.replay: Replay | None = None
        self.last_finish_reasons: Record | None = None
        super().__init__(base_url, host, server_port, group_port, connection_timeout)

    def server_error(self, what: str, exc: BaseException | None = None) -> VLLMServerError:
        """A `VLLMServerError` for `what`, naming the server, the cause, the log and its last lines."""
        cause = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        message = f"the vLLM server at {self.base_url}: {what}{cause}"
        if self.log_path:
            message += f". Server log: {self.log_path}; last lines:\n{log_tail(self.log_path, TAIL_LINES)}"
        else:
            message += " (is it still running? its log would tell)"
        return VLLMServerError(message)

    def _sync_post(self, path: str, payload: dict) -> None:
        """A weight-sync request: no retries (a repeated update would desynchronize the stream), `timeout_s`."""
        response = requests.post(f"{self.base_url}{path}", json=payload, timeout=self.timeout_s)
        if response.status_code != 200:
            raise self.server_error(f"{path} answered {response.status_code}: {response.text[:2000]}")

    @_server_failures(*_TRANSPORT_ERRORS)
    def init_communicator(self, device: torch.device | str | int = 0):
        """TRL's NCCL communicator on a CUDA device; on any other device, joins the server's `trl_ext_gloo` engine.

        Raises:
            VLLMServerError: the server runs another weight-transfer backend (the message says how to start it), or
                the rendezvous failed / timed out.
        """
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if device.type == "cuda":
            return super().init_communicator(device)
        config = self.get_server_info()["weight_transfer_config"]
        backend = None if config is None else config.get("backend")
        if backend != BACKEND:
            raise self.server_error(
                f"its weight-transfer backend is {backend!r}, which cannot receive weights from a trainer on "
                f"{device}; start it with `{' '.join(server_args())}` (`trl-ext launch` does on a machine without "
                "CUDA)"
            )
        world_size = self.get_world_size() + 1  # the trainer is rank 0, the server's workers follow
        address = local_address_towards(self.host or "127.0.0.1")
        init_info = {
            "master_address": address,
            "master_port": self.group_port,
            "world_size": world_size,
            "rank_offset": 1,
            "chunk_bytes": self.chunk_bytes,
            "timeout_s": self.timeout_s,
        }
        # The server blocks in the rendezvous while it handles the request: both sides join at once.
        with ThreadPoolExecutor(max_workers=1) as executor:
            future = executor.submit(self._sync_post, "/init_weight_transfer_engine", {"init_info": init_info})
            try:
                self.communicator = GlooLink(address, self.group_port, 0, world_size, self.timeout_s, address)
            finally:
                future.result(timeout=self.timeout_s)
        self._gloo = True
        atexit.register(self.close_communicator)

    def _start_weight_update(self):
        if not self._gloo:
            return super()._start_weight_update()
        self._sync_post("/start_weight_update", {})

    def _finish_weight_update(self):
        if not self._gloo:
            return super()._finish_weight_update()
        self._sync_post("/finish_weight_update", {})

    @_server_failures(*_TRANSPORT_ERRORS)
    def update_named_params(self, metadata, named_params):
        """Streams the tensors of `named_params`, announced by `metadata` (`(name, dtype, shape)` each, vLLM dtype
        names), to the server: `/start_weight_update`, `/update_weights` while the chunks are broadcast,
        `/finish_weight_update` (start and finish once around `weight_update()`, as TRL's)."""
        if not self._gloo:
            return super().update_named_params(metadata, named_params)
        names, dtype_names, shapes = (list(field) for field in zip(*metadata, strict=True))
        plan = chunk_plan(dtype_names, shapes, self.chunk_bytes)
        if not self._updating_weights:
            self._start_weight_update()
        update_info = {"names": names, "dtype_names": dtype_names, "shapes": shapes}
        # The workers receive inside the request: the request runs beside the broadcast.
        with ThreadPoolExecutor(max_workers=1) as executor:
            future = executor.submit(self._sync_post, "/update_weights", {"update_info": update_info})
            try:
                send_chunks(self.communicator, named_params, names, plan)
            except BaseException:
                if future.done() and future.exception() is not None:
                    raise future.exception() from None  # the server's refusal says more than the broken pipe
                raise
            future.result(timeout=self.timeout_s)
        if not self._updating_weights:
            self._finish_weight_update()

    def generate(self, *args, **kwargs):
        with watched(self.watchdog, "generation request (generate)"):
            return self._request("generate", super().generate, *args, **kwargs)

    def chat(self, *args, **kwargs):
        with watched(self.watchdog, "generation request (chat)"):
            return self._request("chat", super().chat, *args, **kwargs)

    def reset_prefix_cache(self):
        return self._request("reset_prefix_cache", super().reset_prefix_cache)

    def _request(self, what: str, call: Callable, *args, **kwargs):
        """`call(*args, **kwargs)` (one of TRL's requests); its transport failure raised as `VLLMServerError`."""
        try:
            return call(*args, **kwargs)
        except requests.RequestException as exc:
            raise self.server_error(f"{what} failed", exc) from exc

    def _post(self, url: str, **kwargs):
        """TRL's POST; a completions request answered by the replay of async rollouts when it runs, and vLLM's
        finish reasons of a completions answer (replayed or sent) kept in `last_finish_reasons`."""
        if not url.endswith(COMPLETIONS_ENDPOINT):
            return super()._post(url, **kwargs)
        send = functools.partial(super()._post, url, **kwargs)
        answer = send() if self.replay is None else self.replay.post(url, kwargs.get("json"), send)
        self.last_finish_reasons = choice_reasons(answer["choices"])
        return answer

    def close_communicator(self):
        if not self._gloo:
            return super().close_communicator()
        link, self.communicator, self._gloo = self.communicator, None, False
        if link is not None:
            link.shutdown()
