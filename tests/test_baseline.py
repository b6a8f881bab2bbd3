"""Assignment 2's zero-shot baseline: `trl-ext eval --recipe` evaluates exactly as the recipe validates in training,
and
`trl-ext plot --baseline` draws its accuracy at each run's budget on the validation accuracy panel."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import shared_path
from typer.testing import CliRunner

from trl_ext.cli import app
from trl_ext.evaluation.pipeline import load_problems, render_prompts
from trl_ext.recipes.evaluation import eval_config_from_recipe
from trl_ext.reporting.plot import plot_runs

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"


def _recipe(tmp_path: Path, base: str, *lines: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join([f"base: {RECIPES / base}", *lines]) + "\n")
    return path


def test_eval_config_is_the_recipes_validation():
    """Every setting training validates with, read from the shipped Assignment 2 recipe chain."""
    cfg = eval_config_from_recipe(RECIPES / "countdown" / "qwen3_1.7b_grpo_l512.yaml", max_tokens=(256, 512, 1024))
    assert cfg.model == "Qwen/Qwen3-1.7B" and cfg.task == "countdown"
    # the split training validates on, resolved when the problems load (the hub set's own held-out split, else
    # its last 1024 rows: tests/test_tasks_splits.py)
    assert (cfg.split, cfg.limit, cfg.data_file) == ("auto", 1024, None)
    assert (cfg.prompt, cfg.chat, cfg.chat_template_kwargs) == ("tinyzero", True, {"enable_thinking": True})
    assert (cfg.temperature, cfg.top_p, cfg.n, cfg.seed) == (1.0, 1.0, 1, 42)
    # Assignment 2's verifier
    assert (cfg.stop, cfg.min_tokens, cfg.reward) == (("</answer>",), 4, "countdown_single_equation")
    assert cfg.max_tokens == (256, 512, 1024)
    assert eval_config_from_recipe(RECIPES / "countdown" / "qwen3_1.7b_grpo_l256.yaml").max_tokens == (256,)
    no_stop = eval_config_from_recipe(RECIPES / "math" / "question_only.yaml")
    assert (no_stop.stop, no_stop.reward, no_stop.chat) == ((), "question_only", False)
    with pytest.raises(ValueError, match=r"\['temperature'\]: set by --recipe"):
        eval_config_from_recipe(RECIPES / "countdown" / "qwen3_1.7b_grpo_l512.yaml", temperature=0.0)


def test_same_problems_and_prompts_as_training_validation(tmp_path):
    """Independent path: the recipe's own validation loader (`trl_ext.recipes.load_grpo_datasets`) and TRL's way of
    rendering (`apply_chat_template(..., add_generation_prompt=True, **chat_template_kwargs)`). Bug caught: an eval
    that drops enable_thinking or reads another split than training validates on."""
    from transformers import AutoTokenizer

    from trl_ext.recipes import load_grpo_datasets, parse_recipe_args

    data = shared_path("countdown", "dev.parquet")
    recipe = _recipe(
        tmp_path,
        "countdown/qwen3_1.7b_grpo_l512.yaml",
        f"dataset_source: {data}",
        "dataset_split: train[:8]",
        "eval_limit: 6",
    )
    cfg = eval_config_from_recipe(recipe)
    prompts, rows = load_problems(cfg)
    script, args, _ = parse_recipe_args("countdown", ["--config", str(recipe), "--use_cpu", "true"])
    _, validation = load_grpo_datasets("countdown", script, args)
    expected = list(validation["prompt"])
    assert prompts == expected and [r["target"] for r in rows] == list(validation["target"])
    tokenizer = AutoTokenizer.from_pretrained(str(shared_path("qwen3_tokenizer")))
    rendered = render_prompts(prompts, tokenizer, cfg.chat_template_kwargs)
    trl = tokenizer.apply_chat_template(
        expected, add_generation_prompt=True, tokenize=False, **args.chat_template_kwargs
    )
    assert rendered == trl
    assert all(text.endswith("<|im_start|>assistant\n") for text in rendered)  # thinking on: no empty think block
    off = render_prompts(prompts, tokenizer, {"enable_thinking": False})
    assert all(text.endswith("<think>\n\n</think>\n\n") for text in off)


def test_eval_recipe_then_plot_baseline_lines(tmp_path):
    """The one-command baseline on a tiny model (CLI, transformers backend), then its accuracy as a reference line
    at the run's own budget, equal to the summary's number."""
    from trl_ext.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "model", seed=0)
    data = shared_path("countdown", "dev.parquet")
    recipe = _recipe(
        tmp_path,
        "countdown/qwen3_1.7b_grpo_l256.yaml",
        f"dataset_source: {data}",
        "eval_limit: 4",
        "prompt: compact",
        "chat_template: false",
        "chat_template_kwargs: null",
    )
    out = tmp_path / "zero_shot"
    runner = CliRunner()
    result = runner.invoke(
        app,
        ["eval", str(model), "--recipe", str(recipe), "--max-tokens", "4,8", "--backend", "transformers"]
        + ["--output-dir", str(out)],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["split"] == "train[-1024:]" and summary["config"]["min_tokens"] == 4
    accuracy = {int(b): r["accuracy"] for b, r in summary["results"].items()}
    assert sorted(accuracy) == [4, 8]
    clash = runner.invoke(app, ["eval", "--recipe", str(recipe), "--prompt", "r1_zero"])
    assert clash.exit_code != 0 and "set by --recipe" in clash.output

    run = tmp_path / "run"
    run.mkdir()
    log = [{"step": 1, "eval_rewards/countdown_reward/answer_reward": 0.5, "eval_runtime": 1.0}]
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 1, "log_history": log}))
    (run / "trl_ext_run.json").write_text(json.dumps({"config": {"max_completion_length": 8}}))
    fig = plot_runs([run], tmp_path / "curves.png", baseline=out)
    [ax] = [a for a in fig.axes if a.get_title() == "validation answer reward vs step"]
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_label() for line in dashed] == [f"zero-shot L8 ({accuracy[8]:.1%})"]
    assert list(dashed[0].get_ydata()) == [accuracy[8], accuracy[8]]
    rows = list(csv.DictReader(open(tmp_path / "curves.csv")))
    assert [float(r["value"]) for r in rows if r["key"] == "zero-shot accuracy"] == [accuracy[8]]
    (run / "trl_ext_run.json").write_text(json.dumps({"config": {"max_completion_length": 512}}))
    with pytest.raises(ValueError, match="not run run's max_completion_length 512"):
        plot_runs([run], tmp_path / "curves.png", baseline=out)
