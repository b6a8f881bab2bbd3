"""The real recipes run end to end: `accelerate launch` subprocesses on a tiny model and local data (CPU, offline).

Each test writes a small YAML whose `base:` is a real recipe under recipes/ and overrides only the model, the data
and the sizes, so what runs is the shipped recipe chain (objective, optimizer, generation kwargs, evaluation). The
runs generate with transformers, so the recipe script leaves vLLM unimported (`trl_ext.recipes.vllm_import`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from outcomes import TEST_THREADS, record_margin

REPO = Path(__file__).resolve().parents[1]
ACCELERATE_CPU = REPO / "accelerate_configs" / "cpu.yaml"


def _launch(script: str, config: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file accelerate_configs/cpu.yaml recipes/<script> --config <config>`."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": str(TEST_THREADS),
    }
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [
        str(accelerate),
        "launch",
        "--config_file",
        str(ACCELERATE_CPU),
        str(REPO / "recipes" / script),
        "--config",
        str(config),
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    )
    return proc


def _write_yaml(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _state_dict(model) -> dict:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.mark.slow
def test_countdown_recipe_two_grpo_steps(tmp_path):
    """recipes/countdown.py on recipes/countdown/qwen3_1.7b_drgrpo_l256.yaml, shrunk: 2 GRPO steps on a tiny model."""
    from transformers import AutoModelForCausalLM

    from trl_ext.rewards import countdown_reward_fn
    from trl_ext.tasks import compact_prompt, make_countdown_problems
    from trl_ext.tiny import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model", seed=0)
    problems = make_countdown_problems(12, seed=0)
    data = tmp_path / "countdown.jsonl"
    data.write_text("".join(json.dumps({"nums": p["nums"], "target": p["target"]}) + "\n" for p in problems))
    run_dir = tmp_path / "run"
    config = _write_yaml(
        tmp_path / "tiny_drgrpo.yaml",
        [
            f"base: {REPO / 'recipes' / 'countdown' / 'qwen3_1.7b_drgrpo_l256.yaml'}",
            f"model_name_or_path: {model_dir}",
            "dtype: float32",
            f"dataset_source: {data}",
            "dataset_split: train[:8]",
            f"eval_source: {data}",
            "eval_split: train[8:]  # 4 held-out problems",
            "prompt: compact  # the char-level tiny model has no chat template and 512 positions",
            "chat_template: false",
            "chat_template_kwargs: null  # the base chain's enable_thinking applies to chat templates only",
            "n_grpo_steps: 2",
            "rollout_batch_size: 8  # 2 problems x group 4",
            "group_size: 4",
            "train_batch_size: 8  # per-device 4 x GA 2 (derived for 1 process)",
            "per_device_train_batch_size: 4",
            "max_completion_length: 12",
            "use_vllm: false",
            "bf16: false",
            "use_cpu: true",
            "gradient_checkpointing: false",
            "report_to: none",
            "save_strategy: 'no'",
            "per_device_eval_batch_size: 4",
            "rollout_log_steps: 1",
            f"output_dir: {run_dir}",
        ],
    )
    _launch("countdown.py", config, cwd=tmp_path)

    import torch

    args = torch.load(run_dir / "training_args.bin", weights_only=False)
    assert type(args).__name__ == "AblationGRPOConfig"
    assert (args.use_std_normalization, args.length_normalization, args.pg_loss_type) == (
        False,
        "masked_normalize",
        "grpo_clip",
    )  # Dr. GRPO from the real recipe chain
    assert args.normalize_constant == 12  # masked_normalize divides by max_completion_length (overridden here)
    # the recipe's vLLM generation_kwargs, adapted for the transformers backend
    assert args.generation_kwargs == {"min_new_tokens": 4}
    assert (args.learning_rate, args.adam_beta2, args.max_grad_norm) == (1e-5, 0.95, 1.0)  # grpo_defaults.yaml

    state = json.loads((run_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 2  # n_grpo_steps 2 x (1 epoch x 8 / 8) optimizer steps, not the recipe's 200
    train_logs = [entry for entry in state["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in train_logs] == [1, 2]
    for entry in train_logs:
        assert math.isfinite(entry["loss"])
        assert 0.0 <= entry["reward"] <= 1.0  # the countdown reward's range
        # the only reward function: Assignment 2's own verifier, from the recipe chain
        assert entry["rewards/countdown_reward_single_equation/mean"] == pytest.approx(entry["reward"])
        assert 4 <= entry["completions/min_length"] <= entry["completions/max_length"] <= 12  # min_new_tokens, cap
    # validation ran during training (eval_steps 0.05 of 2 steps -> every step) and after it (final_eval)
    eval_logs = [entry for entry in state["log_history"] if "eval_reward" in entry]
    assert len(eval_logs) >= 2
    final_eval = json.loads((run_dir / "eval_results.json").read_text())
    assert 0.0 <= final_eval["eval_reward"] <= 1.0

    # rollout logging is wired in by the recipe (rollout_log_steps 1): example rollouts of both steps, each with the
    # countdown reward (Assignment 2's rule) of its own completion and problem
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rollouts} == {1, 2}
    by_prompt = {compact_prompt(p["nums"], p["target"]): p for p in problems[:8]}  # the training split
    for r in rollouts:
        expected = countdown_reward_fn(r["completion"], by_prompt[r["prompt"]], single_equation=True)
        assert r["rewards"]["countdown_reward_single_equation"] == expected

    saved = AutoModelForCausalLM.from_pretrained(run_dir)
    init = AutoModelForCausalLM.from_pretrained(model_dir)
    saved_params, init_params = _state_dict(saved), _state_dict(init)
    assert saved_params.keys() == init_params.keys()
    # Dr. GRPO's advantage is r - group mean: non-zero exactly when a group's rewards differ (reward_std, the mean
    # of the group stds, > 0). Then the weights move; with every group equal, the advantages and gradients are 0
    # and Adam (no weight decay) leaves the weights exactly as they were. Both ways, saved weights must agree.
    moved = any(not saved_params[k].equal(init_params[k]) for k in init_params)
    assert moved == any(entry["reward_std"] > 0.0 for entry in train_logs), [e["reward_std"] for e in train_logs]


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def _sft_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = i + 2, 3 * i + 1
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": "add"},
                    {"role": "user", "content": f"{a}+{b}"},
                    {"role": "assistant", "content": f"{a}+{b}={a + b}. boxed {a + b}"},
                ],
                "ground_truth": str(a + b),
            }
        )
    return rows


def _completion_only_loss(model, tokenizer, rows: list[dict]) -> float:
    """Mean next-token NLL over the assistant tokens of `rows`: the independent reference for eval_loss."""
    import torch

    total, count = 0.0, 0
    for row in rows:
        prompt_text = tokenizer.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
        full_text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        assert full_text.startswith(prompt_text)
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        ids = tokenizer(full_text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        targets = torch.tensor(ids[1:])
        token_logp = logp.gather(1, targets[:, None])[:, 0]
        completion = token_logp[len(prompt_ids) - 1 :]  # position t predicts token t+1
        total += -completion.sum().item()
        count += completion.numel()
    return total / count


@pytest.mark.slow
def test_sft_recipe_learns_and_logs_the_completion_only_loss(tmp_path):
    """recipes/sft.py on recipes/sft/size_128.yaml, shrunk: loss falls, weights move, eval_loss = our recomputation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.tiny import build_char_tokenizer, save_tiny_model

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    model_dir = save_tiny_model(tmp_path / "model", tokenizer=tokenizer, seed=0)
    rows = _sft_rows(8)
    data = tmp_path / "traces.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_dir = tmp_path / "run"
    config = _write_yaml(
        tmp_path / "tiny_sft.yaml",
        [
            f"base: {REPO / 'recipes' / 'sft' / 'size_128.yaml'}",
            f"model_name_or_path: {model_dir}",
            "dtype: float32",
            f"dataset_source: {data}",
            "dataset_split: train",
            f"eval_source: {data}",
            "eval_split: train",
            "eval_limit: 8",
            "max_length: 128",
            "per_device_train_batch_size: 4",
            "gradient_accumulation_steps: 1",
            "per_device_eval_batch_size: 8  # one batch: eval_loss is the token mean over all 8 examples",
            "num_train_epochs: 5  # 8 examples / 4 per step x 5 = 10 optimizer steps",
            "learning_rate: 3.0e-3",
            "lr_scheduler_type: constant",
            "warmup_steps: 0",
            "eval_strategy: 'no'",
            "accuracy_backend: none  # the loss only (tests/test_sft_validation.py runs the accuracy)",
            "bf16: false",
            "use_cpu: true",
            "gradient_checkpointing: false",
            "report_to: none",
            f"output_dir: {run_dir}",
        ],
    )
    _launch("sft.py", config, cwd=tmp_path)

    state = json.loads((run_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 10
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses)
    record_margin("sft_recipe_loss_falls", ratio_last3_to_first3=sum(losses[-3:]) / sum(losses[:3]), bound=0.8)
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses

    saved = AutoModelForCausalLM.from_pretrained(run_dir).eval()
    init = AutoModelForCausalLM.from_pretrained(model_dir)
    assert any(not p.equal(q) for p, q in zip(saved.parameters(), init.parameters(), strict=True))

    eval_loss = json.loads((run_dir / "eval_results.json").read_text())["eval_loss"]
    reference = _completion_only_loss(saved, AutoTokenizer.from_pretrained(run_dir), rows)
    assert eval_loss == pytest.approx(reference, rel=1e-6)
