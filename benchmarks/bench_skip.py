"""`skip_zero_advantage_completions` on vs off: CPU time of the loss's forward + backward on identical batches.

One process, one `AblationGRPOTrainer` (GRPO: std on, masked_mean, grpo_clip) on a tiny Qwen3-architecture network
with the real 151,669-token Qwen3 vocabulary from `qwen3_tokenizer` in the data folder (`benchmarks/_data.py`; the
repository's tests/data has it), else the character tokenizer. Per iteration: generate one batch
(8 prompts x 4 completions, fixed seed), set the advantages of whole groups to 0 so that a share `z` of the
completions has A = 0 (Countdown's `frac_reward_zero_std` runs at 0.6-0.7 in the embedded default), then time
`_compute_loss` + backward with the skip off and on, alternately (order flipped every iteration). Prints the median
paired CPU-time ratio (on / off; ideal about 1 - z) and the largest loss / gradient difference between the two,
and writes benchmarks/results/skip.json.

    python benchmarks/bench_skip.py                       # a few minutes with the Qwen3 vocabulary (1 thread)
    python benchmarks/bench_skip.py --iterations 10 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from _data import data_dir, describe

ROOT = Path(__file__).resolve().parents[1]
DATA = data_dir()
RESULTS = ROOT / "benchmarks" / "results" / "skip.json"
PROMPTS = [
    "Using the numbers 3, 5 and 7, make 22.",
    "What is 17 times 23?",
    "Solve for x: 2x + 3 = 11.",
    "How many primes are below 30?",
    "Using the numbers 14, 1 and 10, make 5.",
    "What is 2 to the power 10?",
    "Name a prime above 90.",
    "Round 3.14159 to two decimals.",
]
GROUP = 4


def id_reward(completion_ids, **kwargs) -> list[float]:
    return [float(sum(ids) % 5) / 4 for ids in completion_ids]


def build(args, output_dir: str):
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer
    from trl_ext.tiny import build_char_tokenizer, build_tiny_qwen3

    torch.set_num_threads(args.threads)
    tok_dir = DATA / "qwen3_tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir)) if tok_dir.exists() else build_char_tokenizer()
    model = build_tiny_qwen3(tokenizer, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
    config = AblationGRPOConfig(
        output_dir=output_dir,
        report_to="none",
        use_cpu=True,
        bf16=False,
        max_completion_length=args.completion_length,
        num_generations=GROUP,
        per_device_train_batch_size=len(PROMPTS) * GROUP,
        pg_loss_type="grpo_clip",
        use_std_normalization=True,
        length_normalization="masked_mean",
        log_level="error",
    )
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    return AblationGRPOTrainer(model, id_reward, args=config, train_dataset=dataset, processing_class=tokenizer)


def measure(trainer, zero_groups: int, iterations: int) -> dict:
    import torch

    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = [{"prompt": p} for p in PROMPTS for _ in range(GROUP)]
    times = {False: [], True: []}
    max_loss_diff = max_grad_diff = 0.0
    for it in range(iterations + 1):
        torch.manual_seed(it)
        batch = trainer._generate_and_score_completions([dict(x) for x in inputs])
        advantages = batch["advantages"].clone()
        advantages[advantages == 0] = 0.5  # only the chosen groups have A = 0
        advantages[: zero_groups * GROUP] = 0.0
        batch["advantages"] = advantages
        results = {}
        for skip in (False, True) if it % 2 == 0 else (True, False):
            trainer.args.skip_zero_advantage_completions = skip
            model.zero_grad(set_to_none=True)
            start = time.process_time()
            loss = trainer._compute_loss(model, batch)
            loss.backward()
            elapsed = time.process_time() - start
            results[skip] = (loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
            if it > 0:  # iteration 0 is warm-up
                times[skip].append(elapsed)
        max_loss_diff = max(max_loss_diff, abs(results[True][0] - results[False][0]))
        for on, off in zip(results[True][1], results[False][1], strict=True):
            max_grad_diff = max(max_grad_diff, ((on - off).abs().max() / (off.abs().max() + 1e-12)).item())
    return {
        "zero_share": zero_groups / len(PROMPTS),
        "median_cpu_s_off": statistics.median(times[False]),
        "median_cpu_s_on": statistics.median(times[True]),
        "median_paired_ratio": statistics.median(on / off for on, off in zip(times[True], times[False], strict=True)),
        "max_abs_loss_diff": max_loss_diff,
        "max_rel_grad_diff": max_grad_diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=5, help="timed iterations per share (plus 1 warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--completion-length", type=int, default=16)
    parser.add_argument("--zero-groups", default="0,4,6", help="groups (of 8) whose advantages are set to 0")
    args = parser.parse_args()
    print(describe())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build(args, tmp)
        rows = []
        for zero_groups in (int(g) for g in args.zero_groups.split(",")):
            rows.append(measure(trainer, zero_groups, args.iterations))
            r = rows[-1]
            off_ms, on_ms = r["median_cpu_s_off"] * 1e3, r["median_cpu_s_on"] * 1e3
            print(f"A = 0 for {r['zero_share']:.0%} of completions: loss+backward {off_ms:.1f} ms "
                  f"-> {on_ms:.1f} ms CPU, paired ratio on/off {r['median_paired_ratio']:.3f} "
                  f"(ideal {1 - r['zero_share']:.3f}); max |loss diff| {r['max_abs_loss_diff']:.1e}, "
                  f"max relative grad diff {r['max_rel_grad_diff']:.1e}", flush=True)  # fmt: skip
    result = {
        "benchmark": "skip_zero_advantage_completions on / off, _compute_loss + backward on identical batches",
        "basis": "one process, alternating order, median of per-iteration CPU-time ratios after 1 warm-up",
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": args.threads},
        "vocab_size": len(trainer.processing_class),
        "completions_per_batch": len(PROMPTS) * GROUP,
        "completion_length": args.completion_length,
        "rows": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
