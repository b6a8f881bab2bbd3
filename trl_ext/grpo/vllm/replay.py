"""The main process's side of asynchronous rollouts: one generation request to the vLLM server in flight in a
background thread, and the replay of its answer when TRL asks for exactly that request.

TRL 1.16's server mode asks for completions with one HTTP request from the main process
(`VLLMClient.generate` -> `_post(".../v1/completions", json=payload)`), between collectives that gather the prompts
and broadcast the answer (`trl/generation/vllm_generation.py`). `TrlExtVLLMClient._post` (`trl_ext.grpo.vllm.client`)
hands each completions request to its `Replay` when async rollouts gave it one: a training request whose payload
equals the one sent ahead is answered from the background request; every other request (evaluation, dynamic
sampling's extra batches, a request whose prefetch went stale) goes out through TRL's `_post` as before. So
everything TRL does with the answer, and everything the client does after it (vLLM's finish reasons), runs on the
main thread as in the synchronous path.

The payload sent ahead is the last training payload TRL sent with the next batch's prompts in place of its prompts
(`next_payload`): the sampling parameters are TRL's own, and a request that differs in anything is not replayed.
Nothing here touches torch.distributed: the caller gathers prompts and broadcasts versions on the main thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

# The endpoint TRL's `VLLMClient.generate` posts to; `TrlExtVLLMClient._post` replays and records vLLM's finish reasons
# for its requests only.
COMPLETIONS_ENDPOINT = "/v1/completions"


@dataclass
class Prefetch:
    """One generation request sent ahead.

    Attributes:
        url: the completions endpoint.
        payload: the request body, as `VLLMClient.generate` builds it.
        version: the policy version (optimizer step) the server held when the request was sent.
        future: the server's answer (the parsed JSON), or the request's exception.
        seconds: how long the server took to answer, set when it did.
    """

    url: str
    payload: dict
    version: int
    future: Future = field(default_factory=Future)
    seconds: float | None = None


def next_payload(template: dict, unique_prompt_ids: list[list[int]]) -> dict:
    """The completions request for the next batch: TRL's last training request with these prompts.

    Args:
        template: the body of the last training `/v1/completions` request TRL sent.
        unique_prompt_ids: every process's prompts of the next batch, gathered, one per group (TRL sends
            `all_prompts[::num_generations]` and asks for `n = num_generations` completions each).
    """
    return {**template, "prompt": [list(ids) for ids in unique_prompt_ids]}


def is_stale(version: int, global_step: int, max_staleness: int) -> bool:
    """Whether a sample drawn by policy `version` is more than `max_staleness` optimizer steps behind `global_step`."""
    return global_step - version > max_staleness


def background_post(client) -> Callable[[str, dict], dict]:
    """A POST with its own `requests.Session` and the client's retry policy (the background thread never shares
    the main thread's session), failing as `VLLMClient._post` does on a non-200 answer. Returns the parsed answer and
    the seconds until it arrived (parsing is this process's work, and may wait for the trainer's thread)."""
    import requests
    from requests.adapters import HTTPAdapter

    session = requests.Session()
    for prefix, adapter in client.session.adapters.items():
        session.mount(prefix, HTTPAdapter(max_retries=adapter.max_retries))

    def post(url: str, payload: dict) -> tuple[dict, float]:
        started = time.perf_counter()
        response = session.post(url, json=payload)
        seconds = time.perf_counter() - started  # the server's answer, before this process parses it
        if response.status_code != 200:
            raise RuntimeError(f"vLLM server request {url} failed: {response.status_code}, {response.text}")
        return response.json(), seconds

    return post


class RolloutWorker:
    """At most one generation request in flight, on a daemon thread (an abandoned request never blocks exit).

    Args:
        post: `post(url, payload) -> (answer, seconds the server took)`, called on the background thread.
    """

    def __init__(self, post: Callable[[str, dict], tuple[dict, float]]):
        self._post = post
        self.pending: Prefetch | None = None

    def submit(self, url: str, payload: dict, version: int) -> Prefetch:
        """Send a request ahead; the previous one must have been taken or dropped."""
        if self.pending is not None:
            raise RuntimeError("a generation request is already in flight; take or drop it first")
        prefetch = Prefetch(url, payload, version)

        def run():
            started = time.perf_counter()
            try:
                answer, prefetch.seconds = self._post(url, payload)
            except BaseException as error:  # handed to the main thread, which raises it
                prefetch.seconds = time.perf_counter() - started
                prefetch.future.set_exception(error)
            else:
                prefetch.future.set_result(answer)

        threading.Thread(target=run, name="trl-ext-rollout", daemon=True).start()
        self.pending = prefetch
        return prefetch

    def wait(self) -> float:
        """Block until the request in flight (if any) has its answer; returns the seconds waited. A failed request
        raises here, on the main thread."""
        if self.pending is None:
            return 0.0
        started = time.perf_counter()
        self.pending.future.exception()  # waits; the error (if any) is raised by `take`
        return time.perf_counter() - started

    def take(self, url: str, payload: dict) -> Prefetch | None:
        """The request in flight if it is exactly this one (waiting for its answer), else None (it stays)."""
        pending = self.pending
        if pending is None or pending.url != url or pending.payload != payload:
            return None
        self.pending = None
        pending.future.result()  # raises the background request's error
        return pending

    def drop(self) -> Prefetch | None:
        """Wait for the request in flight to end and forget it (the server is idle afterwards)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.future.exception()
        return pending


@dataclass
class Served:
    """How the last training completions request was answered (main process)."""

    version: int
    prefetched: bool
    generate_seconds: float
    wait_seconds: float


class Replay:
    """What answers a completions request of a `TrlExtVLLMClient` (module docstring). Main process only.

    Args:
        worker: the background request.
        is_training: whether the trainer is training (evaluation requests are never replayed or recorded).
        server_version: the policy version the server holds now.
        stale: `stale(version) -> bool`, whether a prefetch of that version may no longer be trained on.

    Attributes:
        template: the body of the last training completions request TRL sent (`next_payload` builds on it).
        served: how the last training completions request was answered.
        discarded: requests sent ahead and not used (stale, or not the request TRL made).
    """

    def __init__(self, worker: RolloutWorker, is_training, server_version, stale):
        self.worker = worker
        self.is_training, self.server_version, self.stale = is_training, server_version, stale
        self.template: dict | None = None
        self.served: Served | None = None
        self.discarded = 0

    def post(self, url: str, payload: dict, send: Callable[[], dict]) -> dict:
        """The answer to TRL's completions request `payload` to `url`: the background request's when it is exactly
        this one and not stale, else `send()` (TRL's `_post`)."""
        if not self.is_training():
            return send()
        self.template = payload
        started = time.perf_counter()
        prefetch = self.worker.take(url, payload)
        if prefetch is not None and self.stale(prefetch.version):
            self.discarded += 1
            logger.warning(
                "async rollouts: dropped a batch sampled by policy %d (max_staleness exceeded); generating it again",
                prefetch.version,
            )
            prefetch = None
        if prefetch is not None:
            answer = prefetch.future.result()
            waited = time.perf_counter() - started
            self.served = Served(prefetch.version, True, prefetch.seconds, waited)
            return answer
        answer = send()
        seconds = time.perf_counter() - started
        self.served = Served(self.server_version(), False, seconds, seconds)
        return answer


def replay_for(client, is_training, server_version, stale) -> Replay:
    """A `Replay` whose `RolloutWorker` posts on its own session with `client`'s retry policy."""
    return Replay(RolloutWorker(background_post(client)), is_training, server_version, stale)
