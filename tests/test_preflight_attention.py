"""FlashAttention-2 in the recipes that follow NYU Assignment 3's loading, and the fallback to sdpa where it cannot
run.

NYU Assignment 3 (section 4.1) loads its policy in bf16 with FlashAttention-2; its recipes
(countdown/qwen2.5_math_1.5b_instruct_*, sft/*, and math/*, the same model) ask for it through `model_init_kwargs`.
Without `flash_attn` (the suite installs none) or on the CPU, transformers itself refuses to load FlashAttention-2
(checked below), so the run loads sdpa instead, says so, and the preflight prints which attention runs.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest

from trl_ext.preflight.attention import choose_attention, requested_attention
from trl_ext.preflight.plan import RunContext, check_recipe
from trl_ext.recipes import parse_recipe_args
from trl_ext.recipes.training import model_init_kwargs

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
FLASH_INSTALLED = importlib.util.find_spec("flash_attn") is not None
needs_no_flash_attn = pytest.mark.skipif(FLASH_INSTALLED, reason="flash_attn is installed: no fallback to see")


@pytest.mark.parametrize(
    ("requested", "installed", "use_cpu", "used"),
    [
        ("flash_attention_2", False, False, "sdpa"),  # not installed
        ("flash_attention_2", True, True, "sdpa"),  # installed, but the CPU
        ("flash_attention_2", True, False, "flash_attention_2"),
        ("sdpa", False, True, "sdpa"),  # anything else is left as asked
        ("eager", True, False, "eager"),
        (None, False, False, None),  # the model's default
    ],
)
def test_the_choice(requested, installed, use_cpu, used):
    choice = choose_attention(requested, use_cpu=use_cpu, flash_attn=installed)
    assert choice.used == used and choice.fell_back == (used != requested)
    if choice.fell_back:
        reason = "flash_attn is not installed" if not installed else "needs a CUDA GPU"
        assert reason in choice.message() and choice.render().startswith(
            "attention: sdpa instead of flash_attention_2"
        )
    else:
        assert choice.message() == ""


def _parse(recipe: str, *extra: str):
    return parse_recipe_args(recipe.split("/")[0], ["--config", str(RECIPES / recipe), "--use_cpu", "true", *extra])


@pytest.mark.parametrize(
    ("recipe", "asked"),
    [
        ("countdown/qwen2.5_math_1.5b_instruct_grpo.yaml", "flash_attention_2"),
        ("countdown/qwen2.5_math_1.5b_instruct_lr_3e-5.yaml", "flash_attention_2"),  # through the base: chain
        ("math/r1_zero.yaml", "flash_attention_2"),
        ("math/no_std.yaml", "flash_attention_2"),
        ("gsm8k/r1_zero.yaml", None),  # NLPDL HW3 names no attention: unchanged
        ("countdown/qwen3_1.7b_grpo_l256_1gpu.yaml", None),
    ],
)
def test_which_recipes_ask_and_what_the_preflight_prints(recipe, asked):
    script, args, model = _parse(recipe)
    assert requested_attention(args, model) == asked
    report = check_recipe(
        recipe.split("/")[0], recipe, [], (script, args, model), RunContext(check_packages=False), {}
    )
    lines = [line for line in report.lines if line.startswith("attention:")]
    if asked is None:
        assert lines == ["attention: the model's default (transformers picks sdpa where the model supports it)"]
    elif FLASH_INSTALLED:  # the plan runs on the CPU (--use_cpu true)
        assert lines == [
            "attention: sdpa instead of flash_attention_2 (FlashAttention-2 needs a CUDA GPU and use_cpu is true)"
        ]
    else:
        assert lines == [
            "attention: sdpa instead of flash_attention_2 (flash_attn is not installed; pip install flash-attn)"
        ]


def test_a_recipe_without_it_loads_as_before():
    script, args, model = _parse("gsm8k/r1_zero.yaml")
    kwargs = model_init_kwargs(model, args)
    assert kwargs["attn_implementation"] is None and kwargs["dtype"] == "float32"


@needs_no_flash_attn
def test_transformers_refuses_flash_attention_2_here(tmp_path):
    """Why the fallback: asked for directly, the load fails on this machine."""
    from transformers import AutoModelForCausalLM

    from trl_ext.tiny import save_tiny_model

    path = save_tiny_model(tmp_path / "model", seed=0)
    with pytest.raises(ImportError, match="FlashAttention2"):
        AutoModelForCausalLM.from_pretrained(path, attn_implementation="flash_attention_2")


@needs_no_flash_attn
def test_the_sft_recipe_asks_for_flash_attention_2_and_trains_with_sdpa(tmp_path, caplog, capsys):
    """recipes/sft/base.yaml (NYU Assignment 3's loading) on a tiny model: its preflight prints the fallback, the
    trainer loads sdpa with a warning saying why, and one optimizer step runs."""
    from trl_ext.recipes.data import load_sft_datasets
    from trl_ext.recipes.entry import sft_entry_preflight
    from trl_ext.recipes.training import build_sft_trainer
    from trl_ext.tiny import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model", seed=0)
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "response": f"{i + 1}"}) + "\n" for i in range(4)))
    config = tmp_path / "sft.yaml"
    config.write_text("\n".join([
        f"base: {RECIPES / 'sft' / 'base.yaml'}", f"model_name_or_path: {model_dir}", f"dataset_source: {data}",
        "max_length: 32", "per_device_train_batch_size: 4", "gradient_accumulation_steps: 1", "max_steps: 1",
        "eval_strategy: 'no'", "bf16: false", "use_cpu: true", "gradient_checkpointing: false", "report_to: none",
        "save_strategy: 'no'", f"output_dir: {tmp_path / 'run'}",
    ]) + "\n")  # fmt: skip
    argv = ["--config", str(config)]
    script, training_args, model_args = parse_recipe_args("sft", argv)
    assert training_args.model_init_kwargs == {"attn_implementation": "flash_attention_2"}  # from sft/base.yaml
    sft_entry_preflight(argv, (script, training_args, model_args))
    printed = capsys.readouterr().err
    assert (
        "attention: sdpa instead of flash_attention_2 (flash_attn is not installed; pip install flash-attn)" in printed
    )
    train, _ = load_sft_datasets(script)
    with caplog.at_level(logging.WARNING, logger="trl_ext.recipes.training"):
        trainer = build_sft_trainer(training_args, model_args, train, None)
    assert (
        "attn_implementation flash_attention_2 asked for, sdpa runs instead: flash_attn is not installed"
        in caplog.text
    )
    assert trainer.model.config._attn_implementation == "sdpa"
    assert trainer.train().global_step == 1
