"""Helpers shared by test modules: a free local port, a script run as the ranks of a process group, CPU DeepSpeed, and
the check that no method was replaced on a trainer's TRL / vLLM / DeepSpeed objects."""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: Path, *args: str, nproc: int = 2, timeout: float = 300) -> None:
    """`python script args` as `nproc` ranks of one process group, with the environment `torch.distributed.run` gives
    its workers on one node (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT on a free port) but without its
    launcher process (a torch import less, 3 CPU s); one thread per process, offline. A rank that fails or outlives
    `timeout` stops the others; fails the test with each rank's output tail when any exits non-zero."""
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
    logs = [tempfile.TemporaryFile() for _ in range(nproc)]  # noqa: SIM115 (closed below)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for rank, log in enumerate(logs)
    ]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    tails = []
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        log.seek(0)
        tails.append(f"[rank {rank}: exit {p.returncode}]\n" + log.read().decode(errors="replace")[-3000:])
        log.close()
    assert all(p.returncode == 0 for p in procs), "\n".join(tails)


def no_shm_comm() -> None:
    """Keep DeepSpeed's CPU backend from JIT-compiling its shared-memory all-reduce (`deepspeed_shm_comm`, minutes of
    g++ on a busy 2-core machine) at `init_distributed`: only its inference all-reduce uses it; training's
    collectives go through gloo. Call before DeepSpeed initialises its process group."""
    import deepspeed.comm.torch  # noqa: F401 (deepspeed.comm's `torch` attribute is torch itself)

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None


def ragged_rows(vocab: int, seed: int = 0):
    """5 rows: prompts left-padded to 6 (lengths 6, 3, 1, 4, 2), completions right-padded to 9 (9, 2, 5, 0, 7).

    Returns `(input_ids (5, 15), attention_mask (5, 15), 9)`: TRL's layout with `logits_to_keep` last.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    prompt_lengths, completion_lengths, p, t = [6, 3, 1, 4, 2], [9, 2, 5, 0, 7], 6, 9
    mask = torch.zeros(5, p + t, dtype=torch.long)
    for row, (n_p, n_c) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        mask[row, p - n_p : p + n_c] = 1
    input_ids = torch.randint(7, vocab, (5, p + t), generator=gen).masked_fill(mask == 0, 0)
    return input_ids, mask, t


def muon_uncompiled() -> None:
    """Import DeepSpeed's Muon optimizer with its kernels left uncompiled: every `deepspeed.initialize` imports it to
    check the optimizer's type (`is_zero_supported_optimizer`), and its `torch.compile` decorators load inductor (1.4
    CPU s per process on a 2-core CPU). For scripts whose engines step another optimizer (the tests' torch AdamW)."""
    from deepspeed.runtime import compiler

    compile_ = compiler.compile
    compiler.compile = lambda: compiler.dummy_decorator
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    finally:
        compiler.compile = compile_


def library_objects(trainer) -> dict[str, object]:
    """The TRL / vLLM / DeepSpeed objects a trainer holds, by name: the trainer, its vLLM generation, the generation's
    client (server mode, main process) and engine with its `llm_engine` (colocate; the engine behind trl_ext's
    `RecordingEngine`), and DeepSpeed's communication backend when it runs."""
    found = {"trainer": trainer}
    generation = getattr(trainer, "vllm_generation", None)
    if generation is not None:
        found["vllm_generation"] = generation
        if getattr(generation, "vllm_client", None) is not None:
            found["vllm_client"] = generation.vllm_client
        llm = getattr(generation, "llm", None)
        if llm is not None:
            found["llm"] = llm.engine if type(llm).__name__ == "RecordingEngine" else llm
            found["llm_engine"] = found["llm"].llm_engine
    comm = sys.modules.get("deepspeed.comm.comm")
    if comm is not None and getattr(comm, "cdb", None) is not None:
        found["deepspeed_comm"] = comm.cdb
    return found


def shadowed_methods(trainer) -> dict[str, list[str]]:
    """Per object of `library_objects(trainer)`: the names of its instance attributes that shadow a method of its
    class (a function, bound method or other callable the class defines), which is how a method replaced on a live
    object shows. Empty lists when nothing was."""
    shadowed = {}
    for name, obj in library_objects(trainer).items():
        cls = type(obj)
        shadowed[name] = sorted(
            attr
            for attr in getattr(obj, "__dict__", {})
            if callable(inspect.getattr_static(cls, attr, None))
            or isinstance(inspect.getattr_static(cls, attr, None), staticmethod | classmethod)
        )
    return shadowed
