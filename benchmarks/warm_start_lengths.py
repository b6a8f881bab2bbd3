"""The response lengths of the CPU testbed's two SFT warm starts (compact answers, and a worked search before the
answer), as GRPO starts from them: 4 samples per held-out problem at temperature 1 (the rollouts' sampling, through
`trl_ext.static_cache`) under each recipe's completion budget, and the greedy accuracy.

Lengths are tokens through EOS (characters: the testbed's tokenizer is a character one), for all responses and split
by correctness (the training reward's answer part); the share that hit the budget without an EOS is reported too.
The warm starts are built into `runs/demo_models/` first when absent (a few CPU minutes each).

    python benchmarks/warm_start_lengths.py [--only working]   # benchmarks/results/warm_start_lengths.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: (name, folder, working, the budget of its recipe: recipes/countdown/cpu_demo.yaml, cpu_demo_working.yaml)
WARM_STARTS = (
    ("compact", "runs/demo_models/countdown_sft", False, 32),
    ("working", "runs/demo_models/countdown_sft_working", True, 144),
)
SAMPLES = 4
SEED = 1234


def distribution(lengths: list[int]) -> dict:
    """Mean, quantiles and maximum of token lengths (None when empty)."""
    if not lengths:
        return {"n": 0}
    a = np.asarray(lengths, dtype=float)
    q = np.percentile(a, [10, 50, 90, 99])
    return {"n": len(lengths), "mean": float(a.mean()), "p10": q[0], "median": q[1], "p90": q[2], "p99": q[3],
            "max": int(a.max())}  # fmt: skip


def measure(folder: Path, working: bool, budget: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.evaluation.transformers_backend import eos_token_ids
    from trl_ext.rewards import countdown_reward_components
    from trl_ext.static_cache import sample_static_cache
    from trl_ext.tasks import compact_prompt
    from trl_ext.testbed.config import TestbedConfig
    from trl_ext.testbed.heldout import evaluate
    from trl_ext.testbed.warm_start import ensure_warm_start, testbed_problems

    ensure_warm_start(folder, TestbedConfig(working=working))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    _, held_out = testbed_problems()
    greedy = evaluate(model, tokenizer, held_out, 0, budget, static_cache=True)["greedy_accuracy"]
    eos = eos_token_ids(model, tokenizer)
    ids = [tokenizer(compact_prompt(p["nums"], p["target"]), add_special_tokens=False)["input_ids"] for p in held_out]
    torch.manual_seed(SEED)
    out = sample_static_cache(model, [i for i in ids for _ in range(SAMPLES)], budget, eos, tokenizer.pad_token_id)
    lengths, correct = [], []
    for k, response in enumerate(out.token_ids):
        problem = held_out[k // SAMPLES]
        text = tokenizer.decode(response, skip_special_tokens=True)
        reward = countdown_reward_components(text, {"nums": problem["nums"], "target": problem["target"]}, True)
        lengths.append(len(response))
        correct.append(reward["answer_reward"] == 1.0)
    at_budget = sum(len(r) == budget and r[-1] not in eos for r in out.token_ids)
    return {
        "budget": budget,
        "greedy_accuracy": greedy,
        "sampled_accuracy": float(np.mean(correct)),
        "all": distribution(lengths),
        "correct": distribution([n for n, c in zip(lengths, correct, strict=True) if c]),
        "incorrect": distribution([n for n, c in zip(lengths, correct, strict=True) if not c]),
        "share_at_budget": at_budget / len(lengths),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/warm_start_lengths.json"))
    parser.add_argument("--only", choices=[w[0] for w in WARM_STARTS], help="Measure one warm start only.")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    result = {"samples_per_problem": SAMPLES, "problems": 512, "seed": SEED}
    for name, folder, working, budget in WARM_STARTS:
        if args.only and name != args.only:
            continue
        started = time.process_time()
        result[name] = measure(ROOT / folder, working, budget)
        result[name]["cpu_seconds"] = time.process_time() - started
        print(name, json.dumps(result[name]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
