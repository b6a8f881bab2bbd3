"""The machine a GPU run starts on, without a GPU here: the NVIDIA driver against torch's CUDA (`make install` and
`trl-ext launch`), GPU memory and numbering as nvidia-smi reports them, and the extras every shipped recipe needs.

nvidia-smi is a stand-in script on PATH printing what real nvidia-smi prints (its header and its CSV query
format), so the launcher's own subprocess calls and parsing run unchanged."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from trl_ext.launch import LaunchError, plan_launch
from trl_ext.preflight.context import GpuMemory, gpus_memory, parse_gpu_memory
from trl_ext.preflight.driver import driver_problem, parse_nvidia_smi
from trl_ext.preflight.environment import check_packages

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"

# The header of plain `nvidia-smi` on a driver 570 machine (CUDA 12.8) and on an H100 with driver 580 (CUDA 13.0).
SMI_570 = """Tue Nov 25 10:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.86.15              Driver Version: 570.86.15      CUDA Version: 12.8     |
|-----------------------------------------+------------------------+----------------------+
"""
SMI_580 = SMI_570.replace("570.86.15", "580.159.04").replace("12.8 ", "13.0 ")
# `nvidia-smi --query-gpu=index,uuid,memory.total,memory.free --format=csv,noheader,nounits` on a 4 x H100 node
# where another job holds 60 GiB of GPU 1.
SMI_QUERY = """0, GPU-aaaaaaaa-0000-0000-0000-000000000000, 81559, 81000
1, GPU-bbbbbbbb-0000-0000-0000-000000000000, 81559, 20119
2, GPU-cccccccc-0000-0000-0000-000000000000, 81559, 81000
3, GPU-dddddddd-0000-0000-0000-000000000000, 81559, 81000
"""


def test_driver_570_refused_for_torch_built_for_cuda_13_with_the_fix():
    """Bug caught: PyPI's torch 2.13.0 (cuda-toolkit 13.0.3) on a 535/550/570 driver sees no GPU, silently.
    Driver 570 supports CUDA 12.8: refused, naming 580; 580 (CUDA 13.0) passes; a CUDA 12.8 build passes on 570."""
    assert parse_nvidia_smi(SMI_570) == ("570.86.15", (12, 8))
    problem = driver_problem(SMI_570, "13.0", "torch 2.13.0")
    assert "driver 570.86.15 supports CUDA up to 12.8, but torch 2.13.0 is built for CUDA 13.0" in problem
    assert "needs driver >= 580.65.06" in problem and "fix: upgrade the NVIDIA driver to 580 or newer" in problem
    assert driver_problem(SMI_580, "13.0") is None
    assert driver_problem(SMI_570, "12.8") is None and driver_problem(SMI_570, "12.4") is None
    assert driver_problem("NVIDIA-SMI has failed", "13.0") is None  # no header: nothing to judge


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """A stand-in `nvidia-smi` first on PATH: plain, it prints `header`; with --query-gpu, the `query` CSV."""

    def install(header: str, query: str = SMI_QUERY) -> Path:
        (tmp_path / "header.txt").write_text(header)
        (tmp_path / "query.txt").write_text(query)
        script = tmp_path / "bin" / "nvidia-smi"
        script.parent.mkdir(exist_ok=True)
        script.write_text(
            "#!/bin/sh\n"
            f'case "$1" in --query-gpu*) cat {tmp_path / "query.txt"};; -L) echo "GPU 0: H100";; '
            f"*) cat {tmp_path / 'header.txt'};; esac\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
        return script.parent

    return install


def test_make_install_stops_at_an_old_driver_before_installing(fake_smi, tmp_path):
    """`make install` with CUDA runs the driver check first: on driver 570 it exits with the fix and creates no
    venv; the install it would run otherwise brings every extra the shipped recipes need."""
    fake_smi(SMI_570)
    venv = tmp_path / "venv"
    run = subprocess.run(
        ["make", "-C", str(REPO), "install", f"VENV={venv}"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0 and "needs driver >= 580.65.06" in run.stderr
    assert not venv.exists()
    make_n = ["make", "-n", "--no-print-directory", "-C", str(REPO), "install", f"VENV={venv}", "HAS_CUDA=1"]
    dry = subprocess.run(make_n, capture_output=True, text=True)
    commands = dry.stdout.splitlines()
    assert "trl_ext/preflight/driver.py --torch-cuda 13.0" in commands[0]
    [install] = [c for c in commands if "pip install -q -e" in c]
    assert re.search(r"-e '\.\[(.*)\]'", install).group(1).split(",") == ["dev", "vllm", "deepspeed", "bitsandbytes"]


def test_extras_cover_every_package_the_preflight_requires():
    """Bug caught: bitsandbytes (the GSM8K report's 8-bit AdamW) was in no extra. Each package the preflight can
    require is an extra of pyproject.toml, and the preflight's fix names it."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, reason in {"vllm": "use_vllm: x", "deepspeed": "zero: x", "bitsandbytes": "optim: x"}.items():
        assert any(dep.startswith(module) for dep in extras[module])
        if __import__("importlib.util").util.find_spec(module) is None:
            [problem] = check_packages({module: reason})
            assert problem.fix == f"pip install -e '.[{module}]'"


def test_free_memory_of_each_gpu_by_index_or_uuid():
    """Bug caught: the plan was checked against each GPU's total memory. The limit is the smallest FREE memory
    of the training GPUs; the total stays for the colocated vLLM's share."""
    gpus = parse_gpu_memory(SMI_QUERY + "garbage line\n")
    assert gpus[1] == GpuMemory("1", "GPU-bbbbbbbb-0000-0000-0000-000000000000", 81559 / 1024, 20119 / 1024)
    assert gpus_memory(["0", "2"], gpus) == (81559 / 1024, 81000 / 1024)
    assert gpus_memory(["0", "GPU-bbbbbbbb-0000-0000-0000-000000000000"], gpus) == (81559 / 1024, 20119 / 1024)
    assert gpus_memory(["7"], gpus) is None


def test_launch_checks_free_memory_and_refuses_another_device_order(fake_smi, tmp_path):
    """The launcher reads nvidia-smi for real (a stand-in on PATH): training on GPU 1, where another job holds 60
    GiB, is refused against its 19.6 GiB free; on GPU 0 the limit is its free 79.1 GiB. CUDA numbers GPUs fastest
    first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so another order is refused, and both commands get PCI_BUS_ID."""
    fake_smi(SMI_580)
    config = RECIPES / "countdown" / "qwen3_1.7b_grpo_l512.yaml"
    args = ["--output_dir", str(tmp_path / "run")]

    def plan(accelerate: str, **environ: str):
        return plan_launch(
            REPO / "accelerate_configs" / accelerate,
            RECIPES / "countdown.py",
            config,
            args,
            num_gpus=4,
            check_packages=False,
            log_dir=tmp_path,
            environ=environ,
        )

    with pytest.raises(LaunchError, match=r"exceeds the 19\.6 GiB limit \(free per nvidia-smi"):
        plan("vllm_server_gpu0_train_gpu1.yaml")
    fine = plan("single_gpu.yaml")  # training on GPU 0, the server on 1-3
    assert "limit 79.1 GiB per training GPU (free per nvidia-smi)" in fine.preflight
    assert fine.server.env["CUDA_DEVICE_ORDER"] == fine.trainer.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    with pytest.raises(LaunchError, match=r"CUDA_DEVICE_ORDER: is 'FASTEST_FIRST'"):
        plan("single_gpu.yaml", CUDA_DEVICE_ORDER="FASTEST_FIRST")
    assert plan("single_gpu.yaml", CUDA_DEVICE_ORDER="PCI_BUS_ID").train_gpus == ("0",)
