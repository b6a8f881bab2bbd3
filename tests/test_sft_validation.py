"""Validation accuracy during SFT (`trl_ext.expert_iteration.sft_validation`, `accuracy_*` recipe fields) through
the real SFT recipe path (`run_sft_recipe` on a YAML whose `base:` is recipes/sft/size_128.yaml), with the transformers
backend; the vLLM backend's generation is checked on the real engine in tests/test_vllm_expert_iteration.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from outcomes import TEST_THREADS, record_margin

from trl_ext.expert_iteration.sft_validation import loss_drop

REPO = Path(__file__).resolve().parents[1]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
# The traces always answer \boxed{7}; three of the four validation problems have the answer 7.
PROBLEMS = [("2+5", "7"), ("3+4", "7"), ("4+4", "8"), ("1+6", "7")]
KEY = "eval_rewards/question_only_reward"
BUDGET = 12


def _files(tmp_path: Path):
    from trl_ext.tiny import build_char_tokenizer, save_tiny_model

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    model = save_tiny_model(tmp_path / "model", tokenizer=tokenizer, seed=0)
    traces = tmp_path / "traces.jsonl"
    pairs = [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 3), (4, 5), (6, 7)]
    rows = [
        [{"role": "user", "content": f"{a}+{b}"}, {"role": "assistant", "content": "\\boxed{7}"}] for a, b in pairs
    ]
    traces.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows))
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"problem": q, "answer": a}) + "\n" for q, a in PROBLEMS))
    return model, traces, problems


def _yaml(tmp_path: Path, model: str, traces: Path, *lines: str) -> list[str]:
    path = tmp_path / "sft.yaml"
    head = [f"base: {REPO / 'recipes' / 'sft' / 'size_128.yaml'}", f"model_name_or_path: {model}", "dtype: float32",
            f"dataset_source: {traces}", "dataset_split: train", f"eval_source: {traces}", "eval_split: train",
            "max_length: 64", "bf16: false", "use_cpu: true", "gradient_checkpointing: false", "report_to: none",
            f"output_dir: {tmp_path / 'run'}"]  # fmt: skip
    path.write_text("\n".join([*head, *lines]) + "\n")
    return ["--config", str(path)]


def _greedy(model, tokenizer, question: str) -> tuple[str, int]:
    """Greedy completion of the chat prompt, token by token with argmax (no `generate`), stopped at <eos> (counted)
    or the budget; the text without special tokens and its token count."""
    ids = tokenizer(f"user: {question}<eos>assistant: ", add_special_tokens=False)["input_ids"]
    out: list[int] = []
    with torch.no_grad():
        while len(out) < BUDGET:
            token = int(model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(token)
            if token == tokenizer.eos_token_id:
                break
    return tokenizer.decode(out, skip_special_tokens=True), len(out)


def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    end = text.find("}", start)
    return text[start + 7 : end] if start >= 0 and end > start else None


def test_sft_recipe_measures_accuracy_at_every_evaluation(tmp_path):
    """30 SFT steps (8 traces, batch 4, 15 epochs, lr 1e-2), evaluation at steps 0, 10, 20, 30: each writes the loss
    entry and an accuracy entry with the GRPO recipes' names. The last one equals a recomputation on the saved model:
    greedy argmax decoding of the four chat prompts, the last `\\boxed{}` compared with the answer, tokens counted
    with <eos>. The untrained model writes no `\\boxed{7}` (accuracy 0), the trained one answers 7 (0.75: measured on
    this CPU; asserted >= 0.5, i.e. two of the three 7s). `step_time` is in every training entry and
    `train_loss_drop` in the train metrics. Catches accuracy measured on stale or training-mode weights, prompts
    rendered differently from the traces, or a budget / EOS rule that differs from `trl-ext eval`'s."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.recipes import run_sft_recipe

    model, traces, problems = _files(tmp_path)
    argv = _yaml(
        tmp_path, model, traces, "per_device_train_batch_size: 4", "gradient_accumulation_steps: 1",
        "num_train_epochs: 15", "learning_rate: 1.0e-2", "lr_scheduler_type: constant", "warmup_steps: 0",
        "eval_strategy: steps", "eval_steps: 10", "eval_on_start: true", "accuracy_backend: transformers",
        f"accuracy_source: {problems}", "accuracy_prompt: question_only", f"accuracy_max_tokens: {BUDGET}",
    )  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(TEST_THREADS)
    try:
        run_sft_recipe(argv)
    finally:
        torch.set_num_threads(threads)
    run = tmp_path / "run"
    history = json.loads((run / "trainer_state.json").read_text())["log_history"]
    measured = [e for e in history if f"{KEY}/answer_reward" in e]
    assert [e["step"] for e in measured] == [0, 10, 20, 30]
    assert [e["step"] for e in history if "eval_loss" in e] == [0, 10, 20, 30]  # the loss as before

    saved = AutoModelForCausalLM.from_pretrained(run).eval()
    tokenizer = AutoTokenizer.from_pretrained(run)
    completions = [_greedy(saved, tokenizer, q) for q, _ in PROBLEMS]
    correct = [float(_boxed(text) == answer) for (text, _), (_, answer) in zip(completions, PROBLEMS, strict=True)]
    last = measured[-1]
    assert last[f"{KEY}/answer_reward"] == pytest.approx(sum(correct) / 4)
    assert last["eval_reward"] == pytest.approx(sum(correct) / 4)  # question_only: reward = answer reward
    assert last[f"{KEY}/format_reward"] == pytest.approx(sum(_boxed(t) is not None for t, _ in completions) / 4)
    assert last["eval_completions/mean_length"] == pytest.approx(sum(n for _, n in completions) / 4)
    eval_losses = [e["eval_loss"] for e in history if "eval_loss" in e]
    record_margin(
        "sft_validation_accuracy", accuracy=last[f"{KEY}/answer_reward"], bound=0.5, eval_loss_first=eval_losses[0],
        eval_loss_last=eval_losses[-1],
    )  # fmt: skip
    assert measured[0][f"{KEY}/answer_reward"] == 0.0 and last[f"{KEY}/answer_reward"] >= 0.5

    train = [e for e in history if "loss" in e]
    assert len(train) == 30 and all(e["step_time"] > 0 for e in train)
    losses = [e["loss"] for e in train]
    metrics = json.loads((run / "train_results.json").read_text())
    assert metrics["train_loss_drop"] == pytest.approx(1 - sum(losses[-3:]) / sum(losses[:3]))


def test_loss_drop_compares_the_first_and_last_tenth():
    history = [{"loss": v} for v in (4.0, 2.0, 1.0, 1.0)] + [{"eval_loss": 9.0}]  # 10% of 4 entries: one each
    assert loss_drop(history) == pytest.approx(1 - 1.0 / 4.0)
    assert loss_drop([{"loss": 1.0}]) is None
    twenty = [{"loss": float(20 - i)} for i in range(20)]
    assert loss_drop(twenty) == pytest.approx(1 - (2 + 1) / (20 + 19))


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        (
            ["accuracy_backend: none", "accuracy_prompt: question_only"],
            "accuracy_prompt='question_only' has no effect",
        ),
        (["accuracy_backend: transformers", "accuracy_vllm_mode: server"], "accuracy_vllm_mode"),
        (["accuracy_backend: vllm", "accuracy_batch_size: 8"], "accuracy_batch_size"),
        (["accuracy_backend: transformers", "eval_split: none"], "give an eval_split"),
        (["accuracy_backend: transformers", "accuracy_source: /nope.jsonl"], "no such file /nope.jsonl"),
        (["accuracy_backend: transformers", "accuracy_temperature: -1"], "temperature must be >= 0"),
        (["accuracy_backend: transformers", "accuracy_task: chess"], "unknown task 'chess'"),
    ],
)
def test_bad_accuracy_settings_fail_before_the_model_loads(tmp_path, lines, error):
    """The model is a hub id that cannot load offline: every error must come from the settings, before the load."""
    from trl_ext.recipes import run_sft_recipe

    _, traces, _ = _files(tmp_path)
    with pytest.raises(ValueError, match=error):
        run_sft_recipe(_yaml(tmp_path, "nobody/no-such-model", traces, *lines))


def test_size_sweep_recipes_measure_accuracy_on_math500():
    """The shipped sweep measures accuracy as seed 001 evaluates (MATH validation problems, greedy, 2048 tokens, the
    traces' intellect prompt in the chat template) with vLLM colocated on the training GPU."""
    from trl_ext.recipes import parse_recipe_args

    for name in ("size_128", "size_256", "size_512", "size_1024", "full"):
        script, args, _ = parse_recipe_args(
            "sft", ["--config", str(REPO / "recipes" / "sft" / f"{name}.yaml"), "--use_cpu", "true"]
        )
        assert (script.accuracy_backend, script.accuracy_task, script.accuracy_split) == ("vllm", "math", "test")
        assert (script.accuracy_prompt, script.accuracy_chat) == ("intellect", True)
        assert (script.accuracy_temperature, script.accuracy_max_tokens) == (0.0, 2048)
        assert args.eval_strategy == "steps" and math.isclose(args.eval_steps, 0.1) and args.eval_on_start
