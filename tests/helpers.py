"""Helpers shared by test modules: a free local port, a script run under torchrun on one node, DeepSpeed on CPU."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node=nproc script args` on a free port, one thread per process,
    offline; fails the test with the output's tail when it exits non-zero."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
        f"--master_port={free_port()}", str(script), *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


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
