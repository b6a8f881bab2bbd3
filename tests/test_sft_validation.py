"""Validation accuracy during SFT (`trl_ext.expert_iteration.sft_validation`, `accuracy_*` recipe fields) through
the real SFT recipe path (`run_sft_recipe` on a YAML whose `base:` is recipes/sft/size_128.yaml), with the transformers
backend; the vLLM backend's generation is checked on the real engine in tests/vllm_expert_iteration_checks.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import shared_path
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
        "accuracy_chat: true  # the traces are chat messages",
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
        (
            ["accuracy_backend: vllm", "accuracy_vllm_server_port: 8123"],
            "^accuracy_vllm_server_port=8123 has no effect with accuracy_backend='vllm' and "
            "accuracy_vllm_mode='colocate'",
        ),
        (["accuracy_backend: transformers", "accuracy_vllm_group_port: 51300"], "accuracy_vllm_group_port=51300"),
        (["accuracy_backend: none", "accuracy_vllm_server_host: 127.0.0.1"], "accuracy_vllm_server_host='127.0.0.1'"),
        (
            ["accuracy_backend: vllm", "accuracy_vllm_mode: server", "accuracy_vllm_gpu_memory_utilization: 0.5"],
            "^accuracy_vllm_gpu_memory_utilization=0.5 has no effect with accuracy_backend='vllm' and "
            "accuracy_vllm_mode='server'",
        ),
        (["accuracy_backend: transformers", "eval_strategy: 'no'"], "give an eval_strategy"),
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


def test_the_sft_recipes_validate_on_math_train_held_out_from_math500():
    """NYU Assignment 3's "MATH validation set" is not its test set: the shipped sweep measures accuracy on the last
    500 problems of MATH train (hiyouga/math12k `train[-500:]`, shipped whole as
    tests/data/math/math12k_train_last500.jsonl), none of them a MATH-500 problem; greedy, 2048 tokens, the intellect
    prompt (plain text for the course's prompt / response examples, the chat template for the hub traces), vLLM
    colocated, at step 0 and every 10%. The course recipes train on its sft.jsonl with no validation-loss set;
    hub_full on the hub's traces with one."""
    from trl_ext.evaluation import EvalConfig, load_problems
    from trl_ext.recipes import parse_recipe_args

    for name in ("base", "size_128", "size_256", "size_512", "size_1024", "full", "hub_full"):
        script, args, _ = parse_recipe_args(
            "sft", ["--config", str(REPO / "recipes" / "sft" / f"{name}.yaml"), "--use_cpu", "true"]
        )
        assert (script.accuracy_backend, script.accuracy_task, script.accuracy_source) == ("vllm", "math", None)
        assert (script.accuracy_split, script.accuracy_prompt) == ("train[-500:]", "intellect")
        assert (script.accuracy_temperature, script.accuracy_max_tokens) == (0.0, 2048)
        assert args.eval_strategy == "steps" and math.isclose(args.eval_steps, 0.1) and args.eval_on_start
        hub = name == "hub_full"
        assert script.accuracy_chat is hub
        assert script.dataset_source == ("PrimeIntellect/INTELLECT-MATH-SFT-Data" if hub else "data/MATH/sft.jsonl")
        splits = ("train[:-1024]", "train[-1024:]") if hub else ("train", "none")
        assert (script.dataset_split, script.eval_split) == splits

    def problems(path: Path, split: str = "train") -> list[str]:
        config = EvalConfig(model="-", task="math", data_file=str(path), split=split, prompt="intellect")
        return [" ".join(row["question"].split()) for row in load_problems(config)[1]]

    validation = problems(shared_path("math", "math12k_train_last500.jsonl"))
    test = set(problems(shared_path("math", "math500_test.jsonl")))
    assert len(validation) == 500 and len(test) == 500
    assert [q for q in validation if q in test] == []
    assert problems(shared_path("math", "math12k_train_last500.jsonl"), "train[-500:]") == validation


# NYU Assignment 3's sft.jsonl rows, each a pair whose boundary BPE merges when the two strings are joined ("Hello" +
# "world", "? " + "The", ":" + "\n\n"): tokenized apart, as the course does, they differ from joined.
COURSE_ROWS = [
    ("Problem: 2+5. Say Hello", "world, the answer is \\boxed{7}"),
    ("What is 3+4? ", "The sum is \\boxed{7}."),
    ("Compute 1+6:", "\n\nTherefore \\boxed{7}"),
]


def test_course_examples_train_as_tokenize_prompt_and_output_tokenizes_them(tmp_path, qwen3_tokenizer):
    """NYU Assignment 3's `{"prompt", "response"}` examples through the SFT recipe path (recipes/sft/base.yaml:
    parse -> `load_sft_datasets` -> `build_sft_trainer`, TRL's dataset preparation) are exactly the tokens of the
    course's `tokenize_prompt_and_output` (`trl_ext.objectives`, the course's definition): prompt and response
    tokenized apart, concatenated, no EOS, no chat template, labels -100 on every prompt token and the token itself on
    every response token. The first optimizer step's loss is the token-mean NLL of the response tokens under the
    initial weights (a plain forward per row), and with no validation-loss set the evaluations log accuracy alone
    (steps 0 and 1). Catches TRL's own prompt-completion path (joint tokenization, an appended EOS), a chat template,
    or a loss on the prompt."""
    from transformers import AutoModelForCausalLM

    from trl_ext.objectives import tokenize_prompt_and_output
    from trl_ext.recipes import parse_recipe_args
    from trl_ext.recipes.data import load_sft_datasets
    from trl_ext.recipes.training import build_sft_trainer, validation_accuracy
    from trl_ext.tiny import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model", tokenizer=qwen3_tokenizer, hidden_size=32, intermediate_size=64)
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in COURSE_ROWS))
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"problem": q, "answer": a}) + "\n" for q, a in PROBLEMS[:2]))
    config = tmp_path / "sft.yaml"
    config.write_text("\n".join([
        f"base: {REPO / 'recipes' / 'sft' / 'base.yaml'}", f"model_name_or_path: {model_dir}", "dtype: float32",
        f"dataset_source: {data}", "max_length: 128", "per_device_train_batch_size: 3  # all rows in one step",
        "gradient_accumulation_steps: 1", "max_steps: 1", "learning_rate: 1.0e-3", "lr_scheduler_type: constant",
        "warmup_steps: 0", "eval_steps: 1", "accuracy_backend: transformers", f"accuracy_source: {problems}",
        "accuracy_max_tokens: 4", "bf16: false", "use_cpu: true", "gradient_checkpointing: false",
        "report_to: none", f"output_dir: {tmp_path / 'run'}",
    ]) + "\n")  # fmt: skip
    script, training_args, model_args = parse_recipe_args("sft", ["--config", str(config)])
    train, evaluation = load_sft_datasets(script)
    assert evaluation is None and train.column_names == ["prompt", "response"]
    trainer = build_sft_trainer(training_args, model_args, train, None, validation_accuracy(script, training_args))

    joined_differs = 0
    for (prompt, response), row in zip(COURSE_ROWS, trainer.train_dataset, strict=True):
        ref = tokenize_prompt_and_output([prompt], [response], qwen3_tokenizer)
        ids = ref["input_ids"][0].tolist() + ref["labels"][0, -1:].tolist()  # unshift: (T,) tokens of the pair
        assert row["input_ids"] == ids
        assert row["labels"][0] == -100
        assert [label != -100 for label in row["labels"][1:]] == ref["response_mask"][0].tolist()
        response_ids = ref["labels"][0][ref["response_mask"][0]].tolist()
        assert [label for label in row["labels"] if label != -100] == response_ids
        joined_differs += qwen3_tokenizer(prompt + response, add_special_tokens=False)["input_ids"] != ids
    assert joined_differs == 3  # each row tells tokenizing apart from joined

    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in trainer.train_dataset:
            logp = torch.log_softmax(initial(torch.tensor([row["input_ids"]])).logits[0, :-1].double(), dim=-1)
            for t, label in enumerate(row["labels"][1:]):  # position t predicts token t + 1
                if label != -100:
                    total, count = total - logp[t, label].item(), count + 1
    trainer.train()
    history = trainer.state.log_history
    [first] = [e for e in history if "loss" in e]
    assert first["loss"] == pytest.approx(total / count, abs=1e-4)
    assert [e["step"] for e in history if f"{KEY}/answer_reward" in e] == [0, 1]
    assert not [e for e in history if "eval_loss" in e]


def test_validation_accuracy_takes_a_servers_address_only_in_server_mode():
    """The server's address and weight-sync port reach TRL's `VLLMGeneration` in server mode (TRL's defaults unless
    set: tests/test_vllm_server_sync.py runs one on a free port); set with `vllm_mode: colocate` they are refused,
    naming the field, not ignored."""
    from trl_ext.evaluation import EvalConfig
    from trl_ext.expert_iteration.sft_validation import SERVER_DEFAULTS, ValidationAccuracy

    config = EvalConfig(model="m", task="countdown", max_tokens=(8,), backend="vllm", ns=(1,))
    accuracy = ValidationAccuracy(config=config, prompts=[], ground_truths=[], reward="countdown")
    assert {name: getattr(accuracy, name) for name in SERVER_DEFAULTS} == {
        "vllm_server_host": "0.0.0.0",
        "vllm_server_port": 8000,
        "vllm_group_port": 51216,
    }
    server = ValidationAccuracy(config=config, prompts=[], ground_truths=[], reward="countdown", vllm_mode="server",
                                vllm_server_port=8123, vllm_group_port=51300)  # fmt: skip
    assert (server.vllm_server_port, server.vllm_group_port) == (8123, 51300)
    with pytest.raises(ValueError, match="^vllm_server_port: 8123 is a server-mode setting; vllm_mode is 'colocate'"):
        ValidationAccuracy(config=config, prompts=[], ground_truths=[], reward="countdown", vllm_server_port=8123)


def test_the_sft_recipe_gives_validation_its_server_fields(tmp_path):
    """`accuracy_vllm_server_host` / `_port` / `accuracy_vllm_group_port` of an SFT recipe validating with a server
    reach the trainer's `ValidationAccuracy` (which hands them to TRL's `VLLMGeneration`:
    test_validation_accuracy_takes_a_servers_address_only_in_server_mode); unset, they are TRL's own defaults. The
    trainer is built from the recipe on a tiny model; nothing connects to a server before the first measurement."""
    import inspect

    from trl.generation.vllm_generation import VLLMGeneration

    from trl_ext.expert_iteration.sft_validation import SERVER_DEFAULTS
    from trl_ext.recipes import parse_recipe_args
    from trl_ext.recipes.data import load_sft_datasets
    from trl_ext.recipes.training import build_sft_trainer, validation_accuracy

    trl_defaults = inspect.signature(VLLMGeneration).parameters
    assert {name: trl_defaults[name.removeprefix("vllm_")].default for name in SERVER_DEFAULTS} == SERVER_DEFAULTS
    model, traces, problems = _files(tmp_path)
    common = ["accuracy_backend: vllm", f"accuracy_source: {problems}", "eval_strategy: steps", "eval_steps: 1"]
    server = ["accuracy_vllm_mode: server", "accuracy_vllm_server_host: 127.0.0.1", "accuracy_vllm_server_port: 8123",
              "accuracy_vllm_group_port: 51300"]  # fmt: skip
    for lines, expected in (
        (server, {"vllm_server_host": "127.0.0.1", "vllm_server_port": 8123, "vllm_group_port": 51300}),
        (["accuracy_vllm_mode: server"], SERVER_DEFAULTS),
    ):
        script, args, model_args = parse_recipe_args("sft", _yaml(tmp_path, model, traces, *common, *lines))
        accuracy = validation_accuracy(script, args)
        assert accuracy.vllm_mode == "server"
        train, evaluation = load_sft_datasets(script)
        trainer = build_sft_trainer(args, model_args, train, evaluation, accuracy)
        assert trainer.vllm_generation is None  # built at the first measurement
        assert {name: getattr(trainer.accuracy, name) for name in SERVER_DEFAULTS} == expected
