"""Generation throughput of the transformers evaluation backend on the CPU, SmolLM2-135M-Instruct.

Prompts: the first GSM8K test questions with the `r1_zero` prompt in SmolLM2's chat template (about 170 prompt
tokens each; a fixed question when the reference data is absent). Every configuration generates exactly
`--new-tokens` tokens per sequence (EOS suppressed, no stop string), so all do the same work: tokens/s counts
generated tokens, while the time also covers the prompts' prefill, as in a real evaluation.

Configurations, each timed `--repeats` times after one warm-up call, median kept:
    baseline      plain `model.generate` (sampling, temperature 1, no top-k) at batch `--batch`
    ours          `trl_ext.evaluation.generate_transformers` (raw log-prob recorder, left padding) at `--batch`
    ours_bigbatch the same at batch `--big-batch`
    ours_bf16     the same at batch `--big-batch` in bfloat16
Ratios are against the baseline. Both wall-clock tokens/s and tokens per CPU-second of this process (robust to
other jobs on a shared machine; with T threads an idle machine gives about T CPU-seconds per second) are recorded.
Writes benchmarks/results/eval.json.

    python benchmarks/bench_eval.py                       # a few minutes on 2 idle cores
    python benchmarks/bench_eval.py --batch 8 --big-batch 32 --new-tokens 32 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from _data import data_dir, describe
from _load import MachineLoad, add_load_argument, refuse_if_loaded

ROOT = Path(__file__).resolve().parents[1]
DATA = data_dir()
RESULTS = ROOT / "benchmarks" / "results" / "eval.json"
FALLBACK_QUESTION = "A farmer has 12 cows and buys 7 more. Each cow gives 3 liters of milk. How many liters in total?"


def prompts(tokenizer, count: int) -> list[str]:
    from trl_ext.tasks import format_prompt

    path = DATA / "gsm8k" / "test.jsonl"
    if path.exists():
        with open(path) as f:
            questions = [json.loads(line)["question"] for _, line in zip(range(count), f, strict=False)]
    else:
        questions = [FALLBACK_QUESTION] * count
    messages = [format_prompt("r1_zero", chat=True, question=q) for q in questions]
    return [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]


def timed(fn, repeats: int) -> dict:
    fn()  # warm-up: first-call allocations, oneDNN kernel selection
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "walls": walls, "cpus": cpus}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--big-batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="model dir (default: the cached SmolLM2, fetched if absent)")
    add_load_argument(parser)
    args = parser.parse_args()
    print(describe())
    load = MachineLoad()

    import torch

    from trl_ext.assets import fetch_smollm2
    from trl_ext.evaluation import generate_transformers, load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    model_dir = args.model or str(fetch_smollm2())
    model, tokenizer = load_model_and_tokenizer(model_dir, "float32", device="cpu")
    texts = prompts(tokenizer, args.big_batch)
    prompt_tokens = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    T = args.new_tokens

    def plain(batch: int, m=model):
        enc = tokenizer(texts[:batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = m.generate(
                **enc, max_new_tokens=T, min_new_tokens=T, do_sample=True, top_k=0, pad_token_id=tokenizer.pad_token_id
            )
        assert out.shape[1] - enc["input_ids"].shape[1] == T

    def ours(batch: int, m=model):
        samples = generate_transformers(
            m, tokenizer, texts[:batch], n=1, max_new_tokens=T, batch_size=batch, stop=(), progress=False,
            min_new_tokens=T,
        )  # fmt: skip
        assert all(len(s[0].token_ids) == T for s in samples)

    runs = {}
    configs = [
        ("baseline", lambda: plain(args.batch), args.batch, "float32"),
        ("ours", lambda: ours(args.batch), args.batch, "float32"),
        ("ours_bigbatch", lambda: ours(args.big_batch), args.big_batch, "float32"),
    ]
    for name, fn, batch, dtype in configs:
        r = timed(fn, args.repeats)
        runs[name] = {"batch": batch, "dtype": dtype, **r}
    bf16 = model.to(torch.bfloat16)
    r = timed(lambda: ours(args.big_batch, bf16), args.repeats)
    runs["ours_bf16"] = {"batch": args.big_batch, "dtype": "bfloat16", **r}

    base = runs["baseline"]
    for name, r in runs.items():
        tokens = r["batch"] * T
        r["tokens_per_s"] = tokens / r["wall_s"]
        r["tokens_per_cpu_s"] = tokens / r["cpu_s"]
        r["throughput_ratio_vs_baseline"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["cpu_throughput_ratio_vs_baseline"] = r["tokens_per_cpu_s"] / base["tokens_per_cpu_s"]
        print(
            f"{name:14s} batch={r['batch']:3d} {r['dtype']:8s} {r['tokens_per_s']:7.1f} tok/s wall "
            f"{r['tokens_per_cpu_s']:7.1f} tok/CPU-s  x{r['throughput_ratio_vs_baseline']:.2f} wall "
            f"x{r['cpu_throughput_ratio_vs_baseline']:.2f} CPU vs baseline"
        )
    result = {
        "benchmark": "transformers-backend generation throughput, SmolLM2-135M-Instruct (float32 unless noted)",
        "model": model_dir,
        "new_tokens_per_sequence": T,
        "mean_prompt_tokens": sum(prompt_tokens) / len(prompt_tokens),
        "threads": args.threads,
        "repeats": args.repeats,
        "runs": runs,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0],
            "torch": torch.__version__,
            "python": sys.version.split()[0],
        },
        "note": "tokens/s counts generated tokens; time includes the prompt prefill. load_average_1m > threads "
        "means other jobs shared the CPU during the run (compare tokens_per_cpu_s then).",
        "load": load.stop(),
    }
    refuse_if_loaded(result["load"], args.loaded, RESULTS)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
