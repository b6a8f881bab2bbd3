"""`trl-ext` starts light: the commands' help and registration import no torch, TRL, transformers, accelerate,
vLLM or the planning / evaluation / discovery machinery; each command imports what it runs inside its function, and
the packages `trl_ext.launch`, `trl_ext.recipes`, `trl_ext.evaluation` and `trl_ext.discover` hand their public
names on at first use."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "trl", "peft", "accelerate", "vllm", "datasets", "numpy", "matplotlib")
# What a command loads only when it runs: the launch planning and supervision, the recipe parser and preflight, the
# evaluation pipeline, the discovery backends.
MACHINERY = (
    "trl_ext.launch.launcher",
    "trl_ext.launch.supervision",
    "trl_ext.launch.configs",
    "trl_ext.recipes.entry",
    "trl_ext.recipes.parsing",
    "trl_ext.preflight",
    "trl_ext.evaluation.pipeline",
    "trl_ext.discover.backends",
    "trl_ext.discover.loop",
)
# Every command's --help in one process, then the modules it holds.
PROBE = """
import json, sys
from trl_ext.cli import app
codes = []
for argv in ([], ["launch"], ["eval"], ["study"], ["study", "run"], ["plot"], ["discover"], ["kissing-check"]):
    try:
        app([*argv, "--help"], prog_name="trl-ext")
    except SystemExit as exc:
        codes.append(exc.code)
json.dump({"codes": codes, "modules": sorted(sys.modules)}, sys.stderr)
"""


def test_every_command_help_imports_no_heavy_package_nor_the_machinery():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stderr.strip().splitlines()[-1])
    assert found["codes"] == [0] * 8
    assert "launch" in done.stdout and "--accelerate-config" in done.stdout and "--recipe" in done.stdout
    loaded = set(found["modules"])
    assert [name for name in HEAVY if name in loaded] == []
    assert [name for name in MACHINERY if name in loaded] == []


@pytest.mark.parametrize("package", ["trl_ext.launch", "trl_ext.recipes", "trl_ext.evaluation", "trl_ext.discover"])
def test_lazy_package_names_are_the_modules_own(package):
    """Each public name of a package resolves, on first use, to the very object its module defines."""
    module = importlib.import_module(package)
    assert sorted(module._LAZY) == sorted(module.__all__)
    for name, source in module._LAZY.items():
        assert getattr(module, name) is getattr(importlib.import_module(source), name), name
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018
