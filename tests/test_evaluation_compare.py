"""`trl-ext eval MODEL --compare MODEL_B`: two models on the same problems, each problem's verdict for both, the four
outcomes, and the problems where they differ side by side.

Verdicts and counts by hand on fixed records; then the command end to end on two tiny models built to answer by the
prompt's last character (so which problems each gets right is known), and its errors before any model loads."""

from __future__ import annotations

import json
import re

import pytest


def _records(patterns: list[list[int]]) -> list[dict]:
    """Scored records, problem-major: `patterns[p][j]` is sample j's answer reward on problem p."""
    return [
        {
            "problem_index": p, "sample_index": j, "prompt": f"question {p}", "ground_truth": str(p),
            "response": f"answer {p}.{j}", "answer_reward": float(ok), "format_reward": 1.0,
            "finish_reason": "eos",
        }
        for p, samples in enumerate(patterns)
        for j, ok in enumerate(samples)
    ]  # fmt: skip


# n = 3: a model is right on a problem with 2 or 3 correct samples
A = [[1, 1, 1], [1, 0, 0], [0, 1, 1], [0, 0, 0], [1, 1, 1]]
B = [[0, 1, 1], [0, 1, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1]]


def test_verdicts_and_outcomes_by_hand():
    from trl_ext.evaluation import compare_records

    c = compare_records(_records(A), _records(B), n=3)
    # problem: A right?, B right? -> 0: yes yes, 1: no yes, 2: yes no, 3: no no, 4: yes yes
    assert [p["outcome"] for p in c["problems"]] == ["both_right", "only_b", "only_a", "both_wrong", "both_right"]
    assert c["counts"] == {"both_right": 2, "both_wrong": 1, "only_a": 1, "only_b": 1}
    assert (c["right_a"], c["right_b"], c["num_problems"]) == (3, 3, 5)
    assert c["accuracy_a"] == pytest.approx(9 / 15) and c["accuracy_b"] == pytest.approx(8 / 15)
    one = c["problems"][1]  # A wrong with 1 of 3: shows its first wrong sample; B right: its first correct one
    assert (one["a"]["correct"], one["a"]["sample_index"], one["a"]["response"]) == (1, 1, "answer 1.1")
    assert (one["b"]["correct"], one["b"]["sample_index"], one["b"]["response"]) == (2, 1, "answer 1.1")
    assert c["problems"][3]["b"]["correct"] == 1 and not c["problems"][3]["b"]["right"]  # 1 of 3 is not a majority


def test_records_of_different_problems_are_refused():
    from trl_ext.evaluation import compare_records

    other = _records(B)
    for r in other[6:9]:  # problem 2's three samples
        r["ground_truth"] = "20"
    with pytest.raises(ValueError, match=r"problem 2: not the same problem in A and B \(ground_truth '2' != '20'\)"):
        compare_records(_records(A), other, n=3)
    with pytest.raises(ValueError, match="not the same problems: A has 5, B has 4"):
        compare_records(_records(A), _records(B[:4]), n=3)


QUESTIONS = ["Which number? a", "Which number? b", "Which number? c", "Which number? d"]
TRUTHS = ["18", "3", "3", "18"]
# each model's first token by the prompt's last character; then EOS
ANSWERS_A = {"a": "18", "b": "3", "c": "18", "d": "3"}  # right on a, b
ANSWERS_B = {"a": "18", "b": "18", "c": "3", "d": "3"}  # right on a, c
EXPECTED = ["both_right", "only_a", "only_b", "both_wrong"]


def _answering_model(path, tokenizer, answers: dict[str, str]) -> str:
    """A one-layer model that answers `\\boxed{answers[c]}` (one added token) to a prompt ending in character c,
    then stops: attention and MLP outputs are zero, so the last position's hidden state is its token's embedding, a
    one-hot row the head maps to that answer (greedy: logit 8 against 0)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    ids = tokenizer.convert_tokens_to_ids
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        embed.zero_()
        head.zero_()
        for k, (char, answer) in enumerate(answers.items()):
            embed[ids(char), k] = 1.0
            head[ids(f"\\boxed{{{answer}}}"), k] = 1.0
        stop = len(answers)  # every answer token leads to EOS
        for answer in ("18", "3"):
            embed[ids(f"\\boxed{{{answer}}}"), stop] = 1.0
        head[tokenizer.eos_token_id, stop] = 1.0
    model.generation_config.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """`trl-ext eval A --compare B` on four problems, greedy, in this process (typer's runner)."""
    from typer.testing import CliRunner

    from trl_ext.cli import app
    from trl_ext.tiny import build_char_tokenizer

    root = tmp_path_factory.mktemp("compare")
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(["\\boxed{18}", "\\boxed{3}"])
    model_a = _answering_model(root / "base", tokenizer, ANSWERS_A)
    model_b = _answering_model(root / "tuned", tokenizer, ANSWERS_B)
    data = root / "problems.jsonl"
    rows = [{"question": q, "answer": f"So it is {t}.\n#### {t}"} for q, t in zip(QUESTIONS, TRUTHS, strict=True)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = root / "out"
    result = CliRunner().invoke(
        app,
        ["eval", model_a, "--compare", model_b, "--task", "gsm8k", "--data-file", str(data), "--prompt",
         "question_only", "--temperature", "0", "--max-tokens", "4", "--backend", "transformers", "--output-dir",
         str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return {"out": out, "output": result.output, "a": model_a, "b": model_b}


def test_compare_two_models_on_the_same_problems(compared):
    out = compared["out"]
    assert "L4: both right 1, both wrong 1, only A 1, only B 1 (4 problems)" in compared["output"]
    # each model's own evaluation, with the same settings but the model
    configs = [json.loads((out / side / "summary.json").read_text())["config"] for side in ("a", "b")]
    assert [c["model"] for c in configs] == [compared["a"], compared["b"]]
    assert {k: v for k, v in configs[0].items() if k not in ("model", "output_dir")} == {
        k: v for k, v in configs[1].items() if k not in ("model", "output_dir")
    }
    responses = [[json.loads(line)["response"] for line in open(out / s / "L4" / "generations.jsonl")] for s in "ab"]
    assert not (out / "a" / "L4" / "pass_at_n.png").exists()  # n = 1: a single point, no curve to draw
    assert responses == [[f"\\boxed{{{m[q[-1]]}}}" for q in QUESTIONS] for m in (ANSWERS_A, ANSWERS_B)]

    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["results"]["4"]["counts"] == {"both_right": 1, "both_wrong": 1, "only_a": 1, "only_b": 1}
    assert comparison["a"]["model"] == compared["a"] and comparison["settings"]["temperature"] == 0.0
    rows = [json.loads(line) for line in open(out / "comparison.jsonl")]
    assert [r["outcome"] for r in rows] == EXPECTED
    assert [(r["a"]["right"], r["b"]["right"], r["ground_truth"]) for r in rows] == [
        (True, True, "18"), (True, False, "3"), (False, True, "3"), (False, False, "18"),
    ]  # fmt: skip

    md = (out / "comparison.md").read_text()
    # only the two problems where they differ, each with both verdicts and responses side by side
    assert re.findall(r"^### (.+)$", md, flags=re.M) == ["Problem 1: only A right", "Problem 2: only B right"]
    assert "| verdict | right (1 of 1 samples correct) | wrong (0 of 1 samples correct) |" in md
    assert "| response | \\\\boxed{3} | \\\\boxed{18} |" in md  # problem 1: A says 3 (right), B says 18
    assert "```text\nWhich number? c\n```" in md
    assert "; prompt question_only; reward question_only" in md  # the reward as scored, though not given
    for outcome, count in (("both right", 1), ("both wrong", 1), ("only A right", 1), ("only B right", 1)):
        assert f"| {outcome} | {count} |" in md


def test_compare_runs_refuses_runs_with_other_settings(compared, tmp_path):
    from trl_ext.evaluation import compare_runs

    out = compared["out"]
    summary = json.loads((out / "b" / "summary.json").read_text())
    summary["config"]["seed"] = 1
    other = tmp_path / "b"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"^seed: A \(.*\) has 0, B \(.*\) has 1"):
        compare_runs(out / "a", other, tmp_path / "cmp")
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--compare", "/no/such/model"], "--compare /no/such/model: no such directory"),
        (["--compare", "{model}", "--max-tokens", "0"], "max_tokens: every budget must be >= 1"),
    ],
)
def test_compare_bad_input_fails_before_any_model_loads(args, error, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from trl_ext.cli import app

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()  # a folder with no model in it: loading it would fail differently
    args = [a.format(model="m") for a in args]
    result = CliRunner().invoke(app, ["eval", "m", *args, "--output-dir", "o"])
    assert result.exit_code != 0 and error in " ".join(result.output.split()), result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("name", "offline", "error"),
    [
        ("Qwen/Qwen3-0.6B", False, None),  # a hub id: left to the hub
        ("gpt2", False, None),
        ("Qwen/Qwen3-0.6B", True, "--compare Qwen/Qwen3-0.6B: no such directory (and the hub is offline)"),
        ("./runs/tuned", False, "--compare ./runs/tuned: no such directory"),  # a path, not a hub id
        ("runs/gsm8k/tuned", False, "--compare runs/gsm8k/tuned: no such directory"),
        ("{tmp}", True, None),  # a folder is fine offline
    ],
)
def test_model_names_that_cannot_load_are_refused(name, offline, error, tmp_path, monkeypatch):
    from trl_ext.evaluation import check_model_name

    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    name = name.format(tmp=tmp_path)
    if error is None:
        check_model_name(name, "--compare")
    else:
        with pytest.raises(ValueError, match=re.escape(error)):
            check_model_name(name, "--compare")
