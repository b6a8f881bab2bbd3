"""A recipe process that does not use vLLM does not import it (`trl_ext.recipes.vllm_import`): the quick reading of
a command line agrees with the recipe parser on every shipped recipe, and a hidden vLLM leaves TRL's GRPO trainer
importable without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trl_ext.recipes import load_recipe_yaml, parse_recipe_args
from trl_ext.recipes.expert_iteration import parse_ei_args
from trl_ext.recipes.vllm_import import uses_vllm

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
GRPO_TASKS = ("countdown", "gsm8k", "math", "kissing")  # each folder is named for its task


def _shipped() -> list[Path]:
    folders = [*GRPO_TASKS, "sft"]  # expert_iteration/ holds only the EI recipes' shared defaults
    return sorted(p for folder in folders for p in (RECIPES / folder).glob("*.yaml"))


def _parsed_uses_vllm(recipe: Path, extra: list[str]) -> bool:
    """What the recipe parser makes of the recipe: TRL's `use_vllm`, or SFT's `accuracy_backend`."""
    argv = ["--config", str(recipe), *extra, "--use_cpu", "true"]  # GPU recipes parse on a CPU machine
    folder = recipe.parent.name
    if folder == "sft":
        script, _, _ = parse_recipe_args("sft", argv)
        return script.accuracy_backend == "vllm"
    if "n_ei_steps" in load_recipe_yaml(recipe):  # an EI recipe (gsm8k/, math/)
        _, args, _ = parse_ei_args(argv)
        return bool(args.use_vllm)
    _, args, _ = parse_recipe_args(folder, argv)
    return bool(args.use_vllm)


def test_the_quick_reading_never_calls_a_vllm_recipe_unused():
    """Every shipped recipe: where the parser says vLLM runs, the quick reading says so too (hiding it there would
    fail the run), and it says unused only where the parser agrees. The shipped set has both kinds."""
    seen = set()
    for recipe in _shipped():
        expected = _parsed_uses_vllm(recipe, [])
        assert uses_vllm(["--config", str(recipe)]) == expected, recipe
        seen.add(expected)
    assert seen == {False, True}


@pytest.mark.parametrize("flag", ["--use_vllm true", "--use_vllm=True", "--use_vllm false", "--use_vllm"])
def test_a_flag_overrides_the_yaml(flag):
    """`use_vllm` on the command line, in each spelling TRL's parser takes, decides over the YAML's value."""
    for recipe in ("countdown/cpu_tiny.yaml", "countdown/qwen3_1.7b_grpo_l512.yaml"):
        extra = flag.split()
        expected = _parsed_uses_vllm(RECIPES / recipe, extra)
        assert expected == ("false" not in flag)
        assert uses_vllm(["--config", str(RECIPES / recipe), *extra]) == expected, (recipe, flag)


def test_the_demo_and_an_unreadable_recipe():
    assert not uses_vllm(["--demo", "--seed", "1"])  # the demo generates with its own loop
    assert uses_vllm(["--config", str(RECIPES / "countdown" / "no_such.yaml")])  # its checks report it, vLLM kept
    assert uses_vllm(["--config"])


def test_hidden_vllm_leaves_the_grpo_trainer_importable():
    """In a fresh interpreter: a CPU recipe hides vLLM, then TRL's GRPO trainer and ours import without it."""
    code = (
        "import sys\n"
        "from trl_ext.recipes.vllm_import import skip_unused_vllm\n"
        f"hidden = skip_unused_vllm(['--config', {str(RECIPES / 'countdown' / 'cpu_demo.yaml')!r}])\n"
        "from trl_ext import AblationGRPOTrainer\n"
        "import trl.trainer.grpo_trainer\n"
        "print(hidden, sys.modules['vllm'], [m for m in sys.modules if m.startswith('vllm.')])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "True None []"
