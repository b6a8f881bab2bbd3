"""The kissing task loader and GRPO recipe: parsing, data, and one real `accelerate launch` on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_ext.recipes import load_grpo_datasets, parse_recipe_args
from trl_ext.tasks import load_task
from trl_ext.tasks.kissing import kissing_prompt

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "kissing" / "grpo.yaml"


def test_recipe_parses_with_the_kissing_reward_and_prompt():
    script_args, args, model_args = parse_recipe_args("kissing", ["--config", str(RECIPE), "--use_cpu", "true"])
    assert model_args.model_name_or_path == "Qwen/Qwen3-1.7B"
    assert script_args.reward_funcs == ["kissing"] and script_args.prompt == "kissing" and script_args.chat_template
    assert args.chat_template_kwargs == {"enable_thinking": False} and args.max_completion_length == 2048
    # no `</answer>` stop string: it would cut nothing here, and a program may legitimately contain it
    assert args.generation_kwargs == {"min_tokens": 4}
    assert args.num_generations == 8 and args.generation_batch_size == 256 and args.max_steps == 200
    train, evaluation = load_grpo_datasets("kissing", script_args, args)
    assert len(train) == len(evaluation) == 1024 and set(train["dimension"]) == {11}
    assert train[0]["prompt"] == [{"role": "user", "content": kissing_prompt(11)}]


def test_prompt_is_the_seeds_for_any_dimension():
    """NLPDL HW3's baseline prompt names 11 dimensions; another dimension changes that number alone."""
    assert kissing_prompt(5) == kissing_prompt(11).replace("in 11 dimensions", "in 5 dimensions")
    assert kissing_prompt(5) != kissing_prompt(11) and kissing_prompt(11).count("11") == 1


def test_loader_reads_dimensions_from_a_file_and_names_a_bad_row(tmp_path):
    good = tmp_path / "dims.jsonl"
    good.write_text('{"dimension": 3}\n{"dimension": 11}\n')
    rows = load_task("kissing", source=str(good), chat=False)
    assert rows["dimension"] == [3, 11] and rows["prompt"] == [kissing_prompt(3), kissing_prompt(11)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"dimension": 3}\n{"dimension": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: row 1: 'dimension' must be a positive integer, got 'x'"):
        load_task("kissing", source=str(bad))
    # the shared row reader: a split's slice selects rows, and a line that is not JSON is named, not a raw traceback
    assert load_task("kissing", source=str(good), split="train[1:]")["dimension"] == [11]
    bad.write_text('{"dimension": 3}\n\n{"dimension": 3,\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: row 1 \(line 3\): invalid JSON"):
        load_task("kissing", source=str(bad))
    with pytest.raises(ValueError, match="prompt 'r1_zero' is not for the kissing task"):
        load_task("kissing", prompt="r1_zero")
    assert len(load_task("kissing", limit=5)) == 5


@pytest.mark.slow
def test_kissing_recipe_runs_one_grpo_step(tmp_path, char_tokenizer):
    """recipes/kissing.py on recipes/kissing/grpo.yaml, shrunk to a tiny model whose vocabulary holds a valid
    2-point program as one token, favoured through `generation_kwargs`: the sandboxed reward is logged."""
    from trl_ext.tiny import build_tiny_qwen3

    model_dir = tmp_path / "model"
    char_tokenizer.save_pretrained(model_dir)
    tokenizer = char_tokenizer.__class__.from_pretrained(model_dir)
    program = "```python\npoints = [[1] * 11, [-1] * 11]\n```"
    tokenizer.add_tokens([program])
    build_tiny_qwen3(tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    token_id = tokenizer.convert_tokens_to_ids(program)
    run_dir = tmp_path / "run"
    config = tmp_path / "tiny_kissing.yaml"
    lines = [
        f"base: {RECIPE}",
        f"model_name_or_path: {model_dir}",
        "dtype: float32",
        "chat_template: false  # the char-level tiny model has no chat template",
        "chat_template_kwargs: null",
        "limit: 4",
        "eval_limit: 4",
        "n_grpo_steps: 1",
        "rollout_batch_size: 8  # 2 prompts x group 4",
        "group_size: 4",
        "train_batch_size: 8  # per-device 4 x GA 2 (derived for 1 process)",
        "per_device_train_batch_size: 4",
        "max_completion_length: 4",
        f"generation_kwargs: {{sequence_bias: [[[{token_id}], 6.0]]}}",
        "use_vllm: false",
        "bf16: false",
        "use_cpu: true",
        "gradient_checkpointing: false",
        "report_to: none",
        "save_strategy: 'no'",
        "eval_strategy: 'no'",
        "per_device_eval_batch_size: 4",
        "rollout_log_steps: 0",
        f"output_dir: {run_dir}",
    ]
    config.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    env["PYTHONPATH"] = str(REPO)
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", "--config_file", str(REPO / "accelerate_configs" / "cpu.yaml")]
    cmd += [str(REPO / "recipes" / "kissing.py")]
    cmd += ["--config", str(config)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    state = json.loads((run_dir / "trainer_state.json").read_text())
    logged = state["log_history"][0]
    assert state["global_step"] == 1
    # the favoured token is a valid 2-point program: each one earns 0.1 + 2 / 595
    validity = logged["rewards/kissing_reward/validity"]
    assert 0 < validity <= 1 and logged["rewards/kissing_reward/best_num_points"] == 2.0
    assert logged["rewards/kissing_reward/num_points"] == pytest.approx(2 * validity)
    assert logged["rewards/kissing_reward/mean"] >= validity * (0.1 + 2 / 595) - 1e-6
