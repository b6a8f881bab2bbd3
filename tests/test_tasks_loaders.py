"""Task loaders on the real files: row counts, prompt contents, ground truth, both Countdown layouts, bad rows."""

from __future__ import annotations

import json
import re

import pytest
from conftest import shared_path

from trl_ext.tasks import PROMPTS, RowError, countdown_question, load_task


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def countdown_dev(shared_data):
    import pyarrow.parquet as pq

    path = shared_path("countdown", "dev.parquet")
    return path, pq.read_table(path).to_pylist()


def test_countdown_tinyzero_parquet_reproduces_tinyzero_prompts(countdown_dev):
    path, rows = countdown_dev
    dataset = load_task("countdown", str(path))
    assert dataset.column_names == ["prompt", "nums", "target"]
    assert len(dataset) == len(rows) == 1024
    assert dataset["nums"] == [row["nums"] for row in rows]
    assert dataset["target"] == [row["target"] for row in rows]
    # The `tinyzero` prompt rebuilt from (nums, target) is character for character TinyZero's stored prompt.
    assert dataset["prompt"] == [row["prompt"][0]["content"] for row in rows]


def test_countdown_chat_and_nyu_a3_prompts(countdown_dev):
    path, rows = countdown_dev
    chat = load_task("countdown", path, chat=True, limit=5)
    assert len(chat) == 5
    for example, row in zip(chat, rows, strict=False):
        (message,) = example["prompt"]
        assert message["role"] == "user"
        question = (
            f"Using the numbers {row['nums']}, create an equation that equals {row['target']}. You can use basic "
            "arithmetic operations (+, -, *, /) and each number can only be used once."
        )
        assert message["content"].startswith(question + " Show your work in <think> </think> tags.")
        assert "Assistant" not in message["content"]
    nyu_a3 = load_task("countdown", path, prompt="countdown", limit=3)
    r1_zero = load_task("countdown", path, prompt="r1_zero", limit=3)
    for plain, r1, row in zip(nyu_a3["prompt"], r1_zero["prompt"], rows, strict=False):
        question = countdown_question(row["nums"], row["target"])  # TinyZero's, for r1_zero
        assert question.startswith(f"Using the numbers {row['nums']}, create an equation that equals {row['target']}.")
        assert r1.endswith(f"User: {question}\nAssistant: <think>")
        # NYU Assignment 3's wording
        nyu_a3_question = countdown_question(row["nums"], row["target"], prompt="countdown")
        assert nyu_a3_question == (
            f"Using the numbers in the list {row['nums']}, create an equation that equals {row['target']}.\nYou can "
            "use basic arithmetic operations (+, -, *, /) and each number can only be used once."
        )
        assert plain == PROMPTS["countdown"].replace("{question}", nyu_a3_question)
    compact = load_task("countdown", path, prompt="compact", limit=1)
    assert compact["prompt"] == [f"{rows[0]['nums']} -> {rows[0]['target']} :"]


def test_countdown_plain_jsonl_layout(tmp_path):
    rows = [{"nums": [14, 1, 10], "target": 5}, {"nums": [3, 5, 7, 9], "target": 24}, {"nums": [2, 2], "target": 4}]
    path = write_jsonl(tmp_path / "plain.jsonl", rows)
    dataset = load_task("countdown", path)
    assert len(dataset) == 3
    assert dataset["nums"] == [r["nums"] for r in rows]
    assert dataset["target"] == [5, 24, 4]
    assert "Using the numbers [3, 5, 7, 9], create an equation that equals 24." in dataset["prompt"][1]


def test_countdown_hub_code_path_on_a_local_parquet(countdown_dev):
    # source="parquet" + data_files goes through datasets.load_dataset, the branch a Hub id takes.
    path, rows = countdown_dev
    dataset = load_task("countdown", "parquet", data_files=str(path), split="train", limit=7)
    assert len(dataset) == 7
    assert dataset["target"] == [row["target"] for row in rows[:7]]
    assert dataset["prompt"] == [row["prompt"][0]["content"] for row in rows[:7]]


def test_in_memory_dataset_and_json_builder_with_named_split(tmp_path):
    import datasets

    rows = [{"nums": [4, 6], "target": 24}, {"nums": [9, 3, 1], "target": 4}]
    from_memory = load_task("countdown", datasets.Dataset.from_list(rows), prompt="compact")
    assert from_memory["prompt"] == ["[4, 6] -> 24 :", "[9, 3, 1] -> 4 :"]
    gsm = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "2*3?", "answer": "2*3=6\n#### 6"}])
    # A Hub id goes to load_dataset(source, config, split=...); the json builder with named data_files takes that path.
    dataset = load_task("gsm8k", "json", split="test", data_files={"test": str(gsm)})
    assert dataset["ground_truth"] == ["6"] and dataset["question"] == ["2*3?"]


@pytest.mark.parametrize(
    "task, split, hub_id",
    [
        ("countdown", "train", "justinphan3110/Countdown-Tasks-3to4"),
        ("gsm8k", "test", "openai/gsm8k"),
        ("math", "train[:100]", "hiyouga/math12k"),
        ("math", "test", "HuggingFaceH4/MATH-500"),
    ],
)
def test_default_sources_are_the_hub_ids(task, split, hub_id):
    import datasets

    if not datasets.config.HF_HUB_OFFLINE:
        pytest.skip("needs HF_HUB_OFFLINE=1: with the Hub reachable this would download the dataset")
    with pytest.raises(ConnectionError, match=re.escape(hub_id)):
        load_task(task, split=split)


def test_local_file_split_slicing_keeps_file_row_numbers(countdown_dev, tmp_path):
    # Recipes hold out the last 1024 rows with datasets' slicing; a local file must honour it the same way.
    path, rows = countdown_dev
    head = load_task("countdown", path, split="train[:-24]")
    tail = load_task("countdown", path, split="train[-24:]")
    assert (len(head), len(tail)) == (1000, 24)
    assert tail["target"] == [row["target"] for row in rows[1000:]]
    percent = load_task("countdown", path, split="train[10%:20%]", limit=5)  # 10% of 1024 rows rounds to 102
    assert percent["target"] == [row["target"] for row in rows[102:107]]
    good, bad = {"nums": [1, 2], "target": 3}, {"nums": [1, 2]}
    jsonl = write_jsonl(tmp_path / "sliced.jsonl", [good] * 5 + [bad] + [good] * 4)
    assert len(load_task("countdown", jsonl, split="train[:5]")) == 5  # the bad row is not selected
    with pytest.raises(RowError, match=r"sliced\.jsonl: row 5: missing field 'target'"):
        load_task("countdown", jsonl, split="train[3:]")
    with pytest.raises(ValueError, match="bad split"):
        load_task("countdown", jsonl, split="train[::2]")


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ({"nums": [1, 2, 3]}, "missing field 'target'"),
        ({"target": 6}, "missing field 'nums'"),
        ({"nums": [1, 2.5, 3], "target": 6}, r"field 'nums' must be an integer, got 2\.5"),
        ({"nums": [1, "2", 3], "target": 6}, "field 'nums' must be an integer, got '2'"),
        ({"nums": [1, 2, 3], "target": "six"}, "field 'target' must be an integer"),
        ({"nums": [], "target": 6}, "field 'nums' is empty"),
        (
            {"nums": [1, 2, 3], "target": 6, "reward_model": {"ground_truth": {"numbers": [1, 2, 4], "target": 6}}},
            r"reward_model\.ground_truth .* disagrees with nums=\[1, 2, 3\], target=6",
        ),
    ],
)
def test_countdown_malformed_row_names_file_and_row(tmp_path, bad_row, message):
    good = {"nums": [1, 2, 3], "target": 6}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, good, bad_row, good])
    with pytest.raises(RowError, match=rf"bad\.jsonl: row 2: {message}"):
        load_task("countdown", path)


def test_invalid_json_line_and_missing_file(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"nums": [1, 2], "target": 3}\n\n{"nums": [1, 2], "target": \n', encoding="utf-8")
    with pytest.raises(RowError, match=r"broken\.jsonl: row 1 \(line 3\): invalid JSON"):
        load_task("countdown", path)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_task("countdown", tmp_path / "missing.jsonl")


def test_unknown_task_and_wrong_prompt_for_task(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"nums": [1, 2], "target": 3}])
    with pytest.raises(ValueError, match="unknown task 'mat'; valid tasks: countdown, gsm8k, math"):
        load_task("mat", path)
    with pytest.raises(ValueError, match="not for Countdown; valid prompts: tinyzero, countdown, r1_zero, compact"):
        load_task("countdown", path, prompt="intellect")
    with pytest.raises(ValueError, match="unknown prompt 'r1'; valid prompts: "):
        load_task("gsm8k", path, prompt="r1")


def test_gsm8k_test_split(shared_data):
    path = shared_path("gsm8k", "test.jsonl")
    raw = read_jsonl(path)
    dataset = load_task("gsm8k", path)
    assert len(dataset) == len(raw) == 1319
    assert dataset.column_names == ["prompt", "question", "ground_truth", "solution"]
    # Checked by hand against the solutions: 16-3-4=9 eggs * $2; 2 + 2/2 bolts; 200,000-130,000; 3*3*60; 60-15-25.
    assert dataset["ground_truth"][:5] == ["18", "3", "70000", "540", "20"]
    assert dataset["ground_truth"][146] == "2125"  # "#### 2,125": 500 + 1500 + 125, thousands comma dropped
    for example, row in zip(dataset.select(range(50)), raw, strict=False):
        assert example["prompt"] == PROMPTS["r1_zero"].replace("{question}", row["question"])
        assert example["prompt"].endswith(f"User: {row['question']}\nAssistant: <think>")
    only = load_task("gsm8k", path, prompt="question_only", chat=True, limit=2)
    assert only["prompt"] == [[{"role": "user", "content": row["question"]}] for row in raw[:2]]


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ({"question": "   ", "answer": "#### 3"}, "field 'question' must be a non-empty string"),
        ({"answer": "#### 3"}, "missing field 'question'"),
        ({"question": "How many?", "answer": "three"}, "GSM8K solution has no '#### <answer>' line: 'three'"),
        ({"question": "How many?", "answer": "so #### "}, "field 'answer' has an empty '####' final answer"),
    ],
)
def test_gsm8k_malformed_row_names_file_and_row(tmp_path, bad_row, message):
    good = {"question": "1+2?", "answer": "1+2=3\n#### 3"}
    path = write_jsonl(tmp_path / "gsm.jsonl", [good, bad_row])
    with pytest.raises(RowError, match=rf"gsm\.jsonl: row 1: {message}"):
        load_task("gsm8k", path)


def test_math500_ground_truth_is_the_answer_field(shared_data):
    path = shared_path("math", "math500_test.jsonl")
    raw = read_jsonl(path)
    dataset = load_task("math", path, split="test")
    assert len(dataset) == len(raw) == 500
    assert dataset["ground_truth"] == [row["answer"] for row in raw]
    assert dataset["question"] == [row["problem"] for row in raw]
    assert dataset["subject"] == [row["subject"] for row in raw]
    assert all(p.endswith("Assistant: <think>") for p in dataset["prompt"])
    assert all(row["problem"] in p for row, p in zip(raw, dataset["prompt"], strict=True))
    intellect = load_task("math", path, prompt="intellect", chat=True, limit=3)
    for example, row in zip(intellect, raw, strict=False):
        assert example["prompt"] == [
            {"role": "system", "content": PROMPTS["intellect"]},
            {"role": "user", "content": row["problem"]},
        ]


def test_math12k_train(shared_data):
    """The subset holds the first 16 train rows, then upstream rows 1165 and 8125 (empty answer) and 4012 and 10891
    (answer "None", a missing value written out): a loader keeping "None" would train on an ungradable answer."""
    path = shared_path("math", "math12k_train_subset.jsonl")
    raw = read_jsonl(path)
    # The four rows without an answer are dropped with a warning that names them (rows 16-19 here), the rest load.
    dropped = r"dropped 4 row\(s\) with an empty or missing-value 'answer'.*rows \[16, 17, 18, 19\]"
    with pytest.warns(UserWarning, match=dropped):
        dataset = load_task("math", path, prompt="question_only")
    kept = raw[:16]
    assert len(raw) == 20 and len(dataset) == len(kept) == 16
    assert [row["answer"] for row in raw[16:]] == ["", "", "None", "None"]
    assert dataset.column_names == ["prompt", "question", "ground_truth"]
    assert dataset["prompt"][:20] == [row["problem"] for row in kept[:20]]
    assert dataset["ground_truth"] == [row["answer"] for row in kept]


def test_math_reads_prime_intellects_traces_as_problems(tmp_path):
    """NYU Assignment 3's other SFT test set, Prime Intellect's traces (`messages`: system, user, assistant;
    `ground_truth`): the question is the user turn, the answer the `ground_truth`; the proof whose ground truth is
    empty (upstream test row 19, row 5 here) is dropped with a warning as MATH's empty answers are."""
    from trl_ext.tasks.prompts import format_prompt

    path = shared_path("intellect_math", "test_subset.jsonl")
    raw = read_jsonl(path)
    with pytest.warns(UserWarning, match=r"dropped 1 row\(s\) .*rows \[5\]"):
        dataset = load_task("math", path, prompt="intellect")
    kept = raw[:5]
    assert raw[5]["ground_truth"] == "" and len(dataset) == 5
    assert dataset["question"] == [row["messages"][1]["content"] for row in kept]
    assert [row["messages"][1]["role"] for row in kept] == ["user"] * 5
    assert dataset["ground_truth"] == [row["ground_truth"] for row in kept]
    assert dataset["prompt"] == [format_prompt("intellect", question=q) for q in dataset["question"]]
    path = write_jsonl(tmp_path / "two_users.jsonl", [{**kept[0], "messages": [*kept[0]["messages"][:2]] * 2}])
    with pytest.raises(RowError, match=r"two_users\.jsonl: row 0: .*one user turn"):
        load_task("math", path, prompt="intellect")


def test_math_malformed_row_names_file_and_row(tmp_path):
    rows = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}, {"problem": "", "answer": "0"}]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    with pytest.raises(RowError, match=r"m\.jsonl: row 2: field 'problem' must be a non-empty string"):
        load_task("math", path)
    path = write_jsonl(tmp_path / "m1.jsonl", rows[:2] + [{"problem": "3+3?", "answer": " "}])
    with pytest.warns(UserWarning, match=r"m1\.jsonl: dropped 1 row\(s\) .*rows \[2\]"):
        assert load_task("math", path)["ground_truth"] == ["2", "4"]
    path = write_jsonl(tmp_path / "m2.jsonl", [{"problem": "1+1?"}])
    with pytest.raises(RowError, match=r"m2\.jsonl: row 0: missing field 'answer'"):
        load_task("math", path)


def test_loader_columns_feed_the_trl_rewards(countdown_dev, shared_data):
    # The columns a loader returns are exactly what trl.GRPOTrainer hands the reward as keyword arguments.
    from trl_ext.rewards import countdown_reward, r1_zero_reward
    from trl_ext.tasks import solve_countdown

    path, _ = countdown_dev
    dataset = load_task("countdown", path, limit=64)
    columns = {name: dataset[name] for name in dataset.column_names if name != "prompt"}
    answers = [
        f"<answer>{solve_countdown(n, t)}</answer>" for n, t in zip(dataset["nums"], dataset["target"], strict=True)
    ]
    assert countdown_reward(answers, prompts=dataset["prompt"], **columns) == [1.0] * 64
    # Each answer paired with the next problem: tags present, answer wrong -> 0.1 everywhere.
    assert countdown_reward(answers[1:] + answers[:1], prompts=dataset["prompt"], **columns) == [0.1] * 64

    gsm8k = load_task("gsm8k", shared_path("gsm8k", "test.jsonl"), limit=50)
    columns = {name: gsm8k[name] for name in gsm8k.column_names if name != "prompt"}
    answers = [f" steps </think> <answer> {gt} </answer>" for gt in gsm8k["ground_truth"]]
    assert r1_zero_reward(answers, **columns) == [1.0] * 50
    assert r1_zero_reward(answers[1:] + answers[:1], **columns) == [0.0] * 50  # the first 50 answers all differ


def test_importing_tasks_stays_light():
    import subprocess
    import sys

    heavy = ("datasets", "pyarrow", "torch", "trl", "transformers")
    code = f"import sys, trl_ext.tasks; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
