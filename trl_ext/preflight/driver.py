"""The NVIDIA driver against the CUDA that torch was built for: refuse a driver too old, with the fix.

A CUDA build runs on a driver that supports its major version (CUDA minor version compatibility: any 13.x build
on a driver >= 580, any 12.x build on >= 525; https://docs.nvidia.com/deploy/cuda-compatibility/). The `CUDA
Version` in nvidia-smi's header is the newest CUDA the driver supports. On a driver too old, torch imports fine
and `torch.cuda.is_available()` is simply False: training would silently fall back to nothing useful.

`make install` runs this file by path before installing (stdlib only, no trl_ext import), with the CUDA of the torch
it is about to install: PyPI's torch 2.13.0 (which vLLM 0.31.0 pins) depends on `cuda-toolkit==13.0.3`, so 13.0.
`trl-ext launch` runs the same check against the installed torch's `torch.version.cuda`.

    python3 trl_ext/preflight/driver.py --torch-cuda 13.0     # exit 1 with the fix when the driver is too old
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

# Oldest Linux driver of each CUDA major version (minor version compatibility), from NVIDIA's compatibility table.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
_HEADER = re.compile(r"Driver Version:\s*([\d.]+).*?CUDA Version:\s*([\d.]+)")


def parse_nvidia_smi(output: str) -> tuple[str, tuple[int, int]] | None:
    """(driver version, (CUDA major, minor) it supports) from the header of plain `nvidia-smi`; None if absent."""
    match = _HEADER.search(output)
    if match is None:
        return None
    major, _, minor = match.group(2).partition(".")
    return match.group(1), (int(major), int(minor or 0))


def driver_problem(nvidia_smi_output: str, torch_cuda: str, what: str = "torch") -> str | None:
    """The message when the driver in `nvidia_smi_output` cannot run `what` built for CUDA `torch_cuda` ("13.0");
    None when it can, or when the output has no driver header (nothing to judge).

    Args:
        nvidia_smi_output: the text plain `nvidia-smi` prints.
        torch_cuda: the CUDA version torch was built for (`torch.version.cuda`).
        what: the build, for the message (e.g. "torch 2.13.0 from PyPI").
    """
    parsed = parse_nvidia_smi(nvidia_smi_output)
    if parsed is None:
        return None
    driver, (major, minor) = parsed
    need = int(torch_cuda.split(".")[0])
    if major >= need:
        return None
    oldest = MIN_DRIVER.get(need, f"one supporting CUDA {need}")
    return (
        f"NVIDIA driver {driver} supports CUDA up to {major}.{minor}, but {what} is built for CUDA {torch_cuda}, "
        f"which needs driver >= {oldest} (CUDA {need}.x minor version compatibility); torch would see no GPU.\n"
        f"fix: upgrade the NVIDIA driver to {oldest.split('.')[0]} or newer "
        "(https://docs.nvidia.com/deploy/cuda-compatibility/); on a driver you cannot upgrade, install torch and "
        f"vLLM builds for CUDA {major}.x yourself (not the PyPI builds this project's `make install` pulls)"
    )


def nvidia_smi(*args: str) -> str:
    """What `nvidia-smi ARGS` prints (plain: the header with the driver; `--query-gpu=...`: the GPUs, read by
    `trl_ext.preflight.context.nvidia_smi_gpus`), or "" without a working nvidia-smi: the one place that runs it."""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-cuda", required=True, help="CUDA version of the torch build, e.g. 13.0.")
    parser.add_argument("--what", default="the torch build about to be installed", help="The build, for messages.")
    args = parser.parse_args(argv)
    output = nvidia_smi()
    problem = driver_problem(output, args.torch_cuda, args.what)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    parsed = parse_nvidia_smi(output)
    found = f"driver {parsed[0]} (CUDA {parsed[1][0]}.{parsed[1][1]})" if parsed else "no nvidia-smi header"
    print(f"NVIDIA {found}: fine for CUDA {args.torch_cuda} builds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
