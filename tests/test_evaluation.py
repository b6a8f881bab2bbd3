"""Evaluation pipeline on the tiny offline model: log-probs against a teacher-forced forward pass, cutting at the
stop string / EOS / budget, summaries and categories by hand, the vLLM parameters, errors before model loading."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import shared_path

from trl_ext.evaluation import (
    EvalConfig,
    Sample,
    cut_sample,
    evaluate,
    generate_transformers,
    summarize,
    vllm_engine_kwargs,
    vllm_sampling_kwargs,
)

torch.set_num_threads(1)


def teacher_forced_logprobs(model, tokenizer, prompts, samples):
    """Log-probs of each sample's tokens from one forward pass over the left-padded prompt + completion."""
    out = []
    for prompt, per_prompt in zip(prompts, samples, strict=True):
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        for s in per_prompt:
            ids = torch.tensor([p_ids + s.token_ids])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(p_ids) - 1 : -1]
            lp = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(s.token_ids)[:, None]).squeeze(1)
            out.append(lp)
    return out


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_recorded_logprobs_are_raw_model_logprobs(char_tokenizer, tiny_model, temperature, top_p):
    # Prompts of different lengths force left padding in the batch; the reference runs each sample unpadded.
    prompts = ["[1, 2] -> 3 :", "[10, 20, 30] -> 60 :", "x"]
    n = 1 if temperature == 0 else 2
    samples = generate_transformers(
        tiny_model, char_tokenizer, prompts, n=n, max_new_tokens=12, temperature=temperature, top_p=top_p,
        seed=0, batch_size=4, stop=(), progress=False,
    )  # fmt: skip
    assert [len(s) for s in samples] == [n] * 3
    reference = teacher_forced_logprobs(tiny_model, char_tokenizer, prompts, samples)
    flat = [s for per in samples for s in per]
    for s, ref in zip(flat, reference, strict=True):
        assert len(s.token_ids) == len(s.logprobs) == 12  # random weights: no EOS within 12 tokens here
        torch.testing.assert_close(torch.tensor(s.logprobs), ref, atol=2e-4, rtol=1e-4)
    if temperature == 0:  # greedy picks the argmax: its log-prob is the row's maximum
        p_ids = char_tokenizer(prompts[0], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = tiny_model(input_ids=torch.tensor([p_ids])).logits[0, -1]
        assert flat[0].token_ids[0] == int(logits.argmax())


def test_same_seed_same_samples(char_tokenizer, tiny_model):
    kwargs = dict(n=2, max_new_tokens=6, seed=3, batch_size=4, progress=False)
    a = generate_transformers(tiny_model, char_tokenizer, ["ab", "c"], **kwargs)
    b = generate_transformers(tiny_model, char_tokenizer, ["ab", "c"], **kwargs)
    assert [[s.token_ids for s in p] for p in a] == [[s.token_ids for s in p] for p in b]


def test_cut_sample_stop_eos_and_budgets(char_tokenizer):
    tok = char_tokenizer
    ids = tok("ab</answer>.xy", add_special_tokens=False)["input_ids"]
    # a, b, </answer> (one added token), '.', x, y -> the stop string ends at token 2
    assert len(ids) == 6
    lps = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]
    cuts = cut_sample(Sample(ids, lps), tok, (2, 3, 6), eos_ids={tok.eos_token_id})
    assert cuts[2] == {"response": "ab", "num_tokens": 2, "mean_logprob": -1.5, "finish_reason": "length"}
    assert cuts[3] == {"response": "ab</answer>", "num_tokens": 3, "mean_logprob": -2.0, "finish_reason": "stop"}
    assert cuts[6] == cuts[3]
    # EOS first: kept in the token count and the mean, dropped from the text
    ids_eos = tok("ab", add_special_tokens=False)["input_ids"] + [tok.eos_token_id, tok.pad_token_id]
    cuts = cut_sample(Sample(ids_eos, [-1.0, -1.0, -4.0, 0.0]), tok, (8,), eos_ids={tok.eos_token_id})
    assert cuts[8] == {"response": "ab", "num_tokens": 3, "mean_logprob": -2.0, "finish_reason": "eos"}


def test_cut_sample_stop_string_spread_over_tokens(char_tokenizer):
    tok = char_tokenizer
    ids = tok("q</answer", add_special_tokens=False)["input_ids"] + tok(">zz", add_special_tokens=False)["input_ids"]
    # '</answer' is 8 single characters; the stop string completes with the '>' token at index 9
    cuts = cut_sample(Sample(ids, [-1.0] * len(ids)), tok, (64,), eos_ids=set())
    assert cuts[64]["response"] == "q</answer>"
    assert cuts[64]["num_tokens"] == 10 and cuts[64]["finish_reason"] == "stop"


def _record(p, j, fmt, ans, lp):
    return {
        "problem_index": p, "sample_index": j, "prompt": f"p{p}", "response": f"r{p}{j}", "ground_truth": "1",
        "reward": ans, "format_reward": fmt, "answer_reward": ans,
        "category": "format0" if fmt < 1 else ("format1_answer1" if ans else "format1_answer0"),
        "mean_logprob": lp, "num_tokens": 5, "finish_reason": "stop",
    }  # fmt: skip


def test_summarize_by_hand():
    # problem 0: samples (fmt, ans, logprob) = (1,1,-0.1) (1,0,-0.5) (0,0,-0.2) (1,0,-0.9)
    # problem 1: (0,0,-1.0) (0,0,-2.0) (1,0,-3.0) (1,0,-4.0)
    records = [
        _record(0, 0, 1, 1, -0.1), _record(0, 1, 1, 0, -0.5), _record(0, 2, 0, 0, -0.2), _record(0, 3, 1, 0, -0.9),
        _record(1, 0, 0, 0, -1.0), _record(1, 1, 0, 0, -2.0), _record(1, 2, 1, 0, -3.0), _record(1, 3, 1, 0, -4.0),
    ]  # fmt: skip
    s = summarize(records, n=4, ns=(1, 2, 4, 8), num_examples=2)
    assert s["num_problems"] == 2 and s["num_samples"] == 8
    assert s["accuracy"] == pytest.approx(1 / 8)
    assert s["format_rate"] == pytest.approx(5 / 8)
    counts = {c: v["count"] for c, v in s["categories"].items()}
    assert counts == {"format1_answer1": 1, "format1_answer0": 4, "format0": 3}
    assert len(s["categories"]["format1_answer0"]["examples"]) == 2  # capped at num_examples
    assert set(s["pass_at_n"]) == {"1", "2", "4"}  # 8 > n is skipped
    # pass@2 of problem 0 (c=1 of 4): 1 - C(3,2)/C(4,2) = 1/2; problem 1: 0
    assert s["pass_at_n"]["2"] == pytest.approx(0.25)
    assert s["pass_at_n"]["4"] == pytest.approx(0.5)
    # Best@4 takes the top log-prob sample: problem 0 -> sample 0 (correct), problem 1 -> sample 0 (wrong)
    assert s["best_at_n"]["4"] == pytest.approx(0.5)
    # Best@2, problem 0: sample 0 ranks first, so it wins every pair containing it: 3 of 6 pairs
    assert s["best_at_n"]["2"] == pytest.approx(0.25)
    assert s["best_at_n"]["1"] == pytest.approx(s["pass_at_n"]["1"])


def test_vllm_sampling_kwargs_are_the_seeds():
    cfg = EvalConfig(model="m", max_tokens="256,1024", n=8, temperature=1.0, top_p=1.0, seed=5)
    assert vllm_sampling_kwargs(cfg) == {
        "n": 8,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 1024,  # one sampling pass at the largest budget; smaller budgets are its prefixes
        "seed": 5,
        "stop": ["</answer>"],
        "include_stop_str_in_output": True,
        "logprobs": 0,
        "min_tokens": 0,  # a recipe's generation_kwargs min_tokens under `trl-ext eval --recipe`
    }
    assert vllm_engine_kwargs(cfg) == {"model": "m", "seed": 5, "dtype": "auto"}
    gpu = vllm_engine_kwargs(cfg, max_model_len=1100)
    assert gpu == {"model": "m", "seed": 5, "dtype": "auto", "max_model_len": 1100}


def test_vllm_engine_kwargs_on_the_cpu_build(monkeypatch):
    """On vLLM's CPU build the float32 default stays float32 (vLLM's `auto` would run a float32 checkpoint in
    bfloat16 and the backends would disagree), and the KV cache gets an explicit size unless vLLM's own
    VLLM_CPU_KVCACHE_SPACE sets it (else vLLM reserves 90% of the machine's RAM); the sampler runs with vLLM's
    `use_fp64_gumbel` (eager, not the compiled kernel that skips tokens on AVX2)."""
    from trl_ext.evaluation.vllm_backend import CPU_KV_CACHE_BYTES

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cfg = EvalConfig(model="m", seed=5)
    expected = {"model": "m", "seed": 5, "dtype": "float32", "enforce_eager": True, "max_model_len": 300}
    expected["use_fp64_gumbel"] = True  # the sampler fix (trl_ext.grpo.vllm.cpu_sampler; tests/test_vllm_sampler.py)
    assert vllm_engine_kwargs(cfg, 300, cpu=True) == {**expected, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert vllm_engine_kwargs(cfg, 300, cpu=True) == expected
    assert vllm_engine_kwargs(EvalConfig(model="m", dtype="bfloat16"), cpu=True)["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("requested", "version", "cuda", "backend"),
    [
        ("auto", "0.31.0+cpu", False, "vllm"),  # `make install` without CUDA: the CPU engine
        ("auto", "0.31.0", True, "vllm"),  # the GPU build on a GPU
        ("auto", "0.31.0", False, "transformers"),  # the GPU build cannot run without CUDA
        ("auto", "0.31.0+cpu", True, "transformers"),  # the CPU build cannot use the GPU transformers runs on
        ("auto", None, False, "transformers"),  # no vLLM
        ("auto", None, True, "transformers"),
        ("transformers", "0.31.0+cpu", False, "transformers"),  # asked for: as asked
        ("vllm", None, False, "vllm"),
    ],
)
def test_backend_choice_by_table(requested, version, cuda, backend):
    from trl_ext.evaluation.backend import pick_backend

    chosen, why = pick_backend(requested, version, cuda)
    assert chosen == backend
    assert (version in why) if requested == "auto" and version else why  # the reason names the build it saw


def test_auto_backend_on_this_machine_follows_the_installed_distribution():
    """`auto` against the real package metadata: where vLLM's CPU build is installed (tests/vllm_helpers.vllm_build
    reads the metadata independently) and there is no GPU, the CPU engine; without vLLM, transformers. Catches `auto`
    falling back to transformers on a CPU machine that has the engine (3.0x the tokens/s)."""
    from vllm_helpers import vllm_build

    from trl_ext.evaluation import resolve_backend
    from trl_ext.evaluation.backend import choose_backend, installed_vllm

    build = vllm_build()
    assert installed_vllm() == build
    cpu_engine = build is not None and "cpu" in build and not torch.cuda.is_available()
    gpu_engine = build is not None and "cpu" not in build and torch.cuda.is_available()
    expected = "vllm" if cpu_engine or gpu_engine else "transformers"
    backend, why = choose_backend("auto")
    assert resolve_backend("auto") == backend == expected, why
    if cpu_engine:
        assert why == f"auto: vLLM's CPU build ({build}) is installed and there is no GPU"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"task": "chess"}, "task: unknown task 'chess'"),
        ({"max_tokens": "256,abc"}, "max_tokens: expected comma-separated integers"),
        ({"max_tokens": (0,)}, "max_tokens: every budget must be >= 1"),
        ({"n": 0}, "n: samples per problem"),
        ({"top_p": 0.0}, "top_p must be in"),
        ({"backend": "tgi"}, "backend: unknown backend"),
        ({"reward": "bleu"}, "reward: unknown reward"),
        ({"n": 4, "temperature": 0.0}, "identical samples"),
    ],
)
def test_config_errors_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvalConfig(model="/nonexistent/model", **kwargs)


def test_missing_data_file_fails_before_model_load(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_file"):
        EvalConfig(model="/nonexistent/model", data_file=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "no answer field"}\n')
    # the model path does not exist: the row error must come first
    with pytest.raises(ValueError, match="answer"):
        evaluate(EvalConfig(model="/nonexistent/model", data_file=str(bad), output_dir=str(tmp_path / "o")))


def test_evaluate_tiny_model_writes_consistent_files(tmp_path, char_tokenizer, tiny_model):
    from trl_ext.evaluation import score_response

    data = shared_path("countdown", "dev.parquet")
    cfg = EvalConfig(
        model="tiny", task="countdown", data_file=str(data), prompt="compact", n=4, limit=3,
        max_tokens="6,12", output_dir=str(tmp_path / "out"), batch_size=16, seed=1,
    )  # fmt: skip
    report = evaluate(cfg, model=tiny_model, tokenizer=char_tokenizer, progress=False)
    assert set(report["results"]) == {"6", "12"}
    rows = {b: [json.loads(line) for line in open(tmp_path / "out" / f"L{b}" / "generations.jsonl")] for b in (6, 12)}
    for b in (6, 12):
        assert (tmp_path / "out" / f"L{b}" / "pass_at_n.png").stat().st_size > 0
        s = json.loads((tmp_path / "out" / f"L{b}" / "summary.json").read_text())
        assert len(rows[b]) == s["num_samples"] == 12
        assert sum(v["count"] for v in s["categories"].values()) == 12
        assert s["best_at_n"]["1"] == pytest.approx(s["pass_at_n"]["1"])
        for r in rows[b]:  # stored rewards are the reward function's on the stored text
            comps = score_response("countdown", r["response"], r["ground_truth"])
            assert (r["reward"], r["format_reward"], r["answer_reward"]) == (
                comps["reward"], comps["format_reward"], comps["answer_reward"],
            )  # fmt: skip
            assert r["num_tokens"] <= b
    # the budgets share samples: each L6 response is a prefix of the same sample's L12 response
    for short, long in zip(rows[6], rows[12], strict=True):
        assert (short["problem_index"], short["sample_index"]) == (long["problem_index"], long["sample_index"])
        assert long["response"].startswith(short["response"])
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["results"]["12"]["num_problems"] == 3


def test_cli_eval_and_help(tmp_path, char_tokenizer):
    from typer.testing import CliRunner

    from trl_ext.cli import app
    from trl_ext.tiny import save_tiny_model

    data = shared_path("gsm8k", "test.jsonl")
    model_dir = save_tiny_model(tmp_path / "m", tokenizer=char_tokenizer)
    runner = CliRunner()
    assert "eval" in runner.invoke(app, ["--help"]).output
    result = runner.invoke(
        app,
        ["eval", model_dir, "--task", "gsm8k", "--data-file", str(data), "--limit", "2", "--n", "2",
         "--max-tokens", "4,8", "--output-dir", str(tmp_path / "o"), "--backend", "transformers"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "L8: accuracy=0.0000" in result.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["results"]["4"]["reward_function"] == "r1_zero"
    assert summary["config"]["max_tokens"] == [4, 8]
    bad = runner.invoke(app, ["eval", model_dir, "--max-tokens", "a,b"])
    assert bad.exit_code != 0 and "--max-tokens" in bad.output


def test_evaluate_model_in_memory_scores_with_a_reward_function(char_tokenizer, tiny_model):
    """`evaluate_model` (the in-memory path, no files) passes each response with its own problem's ground truth to a
    reward function, and its responses are the sampled tokens decoded up to the cut. Catches records paired with
    the wrong problem, a reward function that is ignored, and responses that are not what was sampled."""
    from trl_ext.evaluation import evaluate_model

    prompts, truths = ["[1, 2] -> 3 :", "[10, 20, 30] -> 60 :"], [1.0, 0.0]
    calls = []

    def reward(response, truth):  # problem 0 always right, problem 1 always wrong
        calls.append((response, truth))
        return {"reward": truth, "format_reward": 1.0, "answer_reward": truth}

    kwargs = dict(n=3, max_new_tokens=8, seed=2, batch_size=16)
    summary, records = evaluate_model(tiny_model, char_tokenizer, prompts, truths, reward, ns=(1, 3), **kwargs)
    assert [(r["problem_index"], r["sample_index"], r["ground_truth"]) for r in records] == [
        (p, j, truths[p]) for p in range(2) for j in range(3)
    ]
    assert calls == [(r["response"], r["ground_truth"]) for r in records]
    assert summary["accuracy"] == pytest.approx(0.5) and summary["pass_at_n"] == {"1": 0.5, "3": 0.5}
    samples = [
        s for per in generate_transformers(tiny_model, char_tokenizer, prompts, progress=False, **kwargs) for s in per
    ]
    for sample, record in zip(samples, records, strict=True):
        assert record["num_tokens"] <= 8
        text = char_tokenizer.decode(sample.token_ids[: record["num_tokens"]], skip_special_tokens=True)
        assert record["response"] == text.split("</answer>")[0] + ("</answer>" if "</answer>" in text else "")
