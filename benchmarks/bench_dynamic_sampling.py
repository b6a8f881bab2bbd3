"""Dynamic sampling (DAPO) against plain GRPO on the embedded CPU demo: held-out accuracy and time, same seed.

Runs `python -m trl_ext.demo` in subprocesses, one at a time:

1. the SFT warm start once (`--grpo_steps 0`), saved as the shared GRPO start;
2. plain GRPO for `--grpo_steps N` from it (`--init_model`);
3. GRPO with `--dynamic_sampling` for the same N steps (cost per step);
4. GRPO with `--dynamic_sampling` for M steps, M = N x (plain GRPO CPU seconds / dynamic CPU seconds of step 3),
   so that it spends the plain run's CPU budget.

Every run uses the same seed, the same held-out problems and the demo's own evaluation (greedy accuracy, and the mean
accuracy of `eval_samples` samples per problem at temperature 1). Times are the demo's GRPO-phase wall and CPU seconds;
on a CPU shared with other jobs they are noisy (the JSON records the load average: quote it with them). Prints a table
and writes benchmarks/results/dynamic_sampling.json.

    python benchmarks/bench_dynamic_sampling.py                          # 400 plain steps, seeds 0 and 1
    python benchmarks/bench_dynamic_sampling.py --grpo_steps 100 --seeds 0 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "dynamic_sampling.json"


def _git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def run_demo(flags: list[str], out: Path, threads: int) -> dict:
    """One demo run in a subprocess; returns its metrics.json."""
    cmd = [sys.executable, "-m", "trl_ext.demo", "--output_dir", str(out), "--threads", str(threads), "--no-wandb"]
    cmd += ["--no-control"]  # the SFT-only control is the demo's question, not this benchmark's
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    print("$", " ".join(cmd + flags), flush=True)
    started = time.perf_counter()
    proc = subprocess.run(cmd + flags, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"demo run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["bench_wall_s"] = round(time.perf_counter() - started, 1)
    return metrics


def mean_of(log: list[dict], key: str) -> float | None:
    values = [entry[key] for entry in log if key in entry]
    return round(sum(values) / len(values), 3) if values else None


def summarize(metrics: dict) -> dict:
    """Accuracies after GRPO, GRPO-phase time, and the dynamic-sampling counts averaged over the logged steps."""
    grpo = metrics["arms"]["grpo"]
    log = [entry for entry in metrics.get("grpo_log", []) if "dynamic_sampling/generation_batches" in entry]

    return {
        "grpo_steps": grpo["clock"]["steps"],
        "greedy_accuracy": grpo["heldout"]["greedy_accuracy"],
        "sampled_accuracy": grpo["heldout"].get("sampled_accuracy"),
        # training time of the GRPO phase, its held-out curve evaluations excluded
        "grpo_wall_s": grpo["clock"]["train_wall_s"],
        "grpo_cpu_s": grpo["clock"]["train_cpu_s"],
        "generation_batches_per_step": mean_of(log, "dynamic_sampling/generation_batches"),
        "groups_kept_per_step": mean_of(log, "dynamic_sampling/groups_kept"),
        "groups_filled_per_step": mean_of(log, "dynamic_sampling/groups_filled"),
        # share of equal-reward groups among those generated (every generation batch, kept or not)
        "frac_reward_zero_std": mean_of(metrics.get("grpo_log", []), "frac_reward_zero_std"),
    }


def bench_seed(seed: int, args, out: Path) -> dict:
    common = ["--seed", str(seed)] + args.demo_flags
    sft = run_demo([*common, "--grpo_steps", "0"], out / "sft", args.threads)
    start = sft["arms"]["start"]["heldout"]  # the SFT model's held-out accuracy: where every GRPO run starts
    init = ["--init_model", str(out / "sft" / "sft_model"), "--sft_steps", "0"]
    n = args.grpo_steps
    plain = summarize(run_demo([*common, *init, "--grpo_steps", str(n)], out / "plain", args.threads))
    same_steps = summarize(
        run_demo(
            [*common, *init, "--grpo_steps", str(n), "--dynamic_sampling"], out / "dynamic_same_steps", args.threads
        )
    )
    m = max(1, round(n * plain["grpo_cpu_s"] / same_steps["grpo_cpu_s"]))
    same_budget = summarize(
        run_demo(
            [*common, *init, "--grpo_steps", str(m), "--dynamic_sampling"], out / "dynamic_same_cpu", args.threads
        )
    )
    return {
        "seed": seed,
        "sft_start": {k: start[k] for k in ("greedy_accuracy", "sampled_accuracy") if k in start},
        "plain": plain,
        "dynamic_same_steps": same_steps,
        "dynamic_same_cpu": same_budget,
        "cpu_per_step_ratio_dynamic_over_plain": round(
            (same_steps["grpo_cpu_s"] / same_steps["grpo_steps"]) / (plain["grpo_cpu_s"] / plain["grpo_steps"]), 3
        ),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grpo_steps", type=int, default=400, help="Plain GRPO steps (N).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads per run.")
    parser.add_argument("--out", default="runs/bench_dynamic_sampling", help="Run folders.")
    parser.add_argument("--demo_flags", nargs=argparse.REMAINDER, default=[], help="Passed on to every demo run.")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    results = [bench_seed(seed, args, Path(args.out) / f"seed{seed}") for seed in args.seeds]
    report = {
        "what": "embedded CPU demo (trl_ext.demo): GRPO from a shared SFT start, plain vs dynamic_sampling (cap 4)",
        "grpo_steps_plain": args.grpo_steps,
        "threads": args.threads,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "commit": _git("rev-parse", "--short", "HEAD")
        + (" (with local changes)" if _git("status", "--porcelain") else ""),
        "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        "seeds": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"{'seed':>4} {'run':<20} {'steps':>5} {'greedy':>7} {'sampled':>7} {'GRPO cpu s':>10} {'wall s':>7} "
        "gen/step filled"
    )
    for r in results:
        start = r["sft_start"]
        greedy, sampled = 100 * start["greedy_accuracy"], 100 * start.get("sampled_accuracy", 0)
        print(f"{r['seed']:>4} {'SFT start':<20} {0:>5} {greedy:>6.1f}% {sampled:>6.1f}%")
        for name in ("plain", "dynamic_same_steps", "dynamic_same_cpu"):
            s = r[name]
            print(
                f"{r['seed']:>4} {name:<20} {s['grpo_steps']:>5} {100 * s['greedy_accuracy']:>6.1f}% "
                f"{100 * (s['sampled_accuracy'] or 0):>6.1f}% {s['grpo_cpu_s']:>10.0f} {s['grpo_wall_s']:>7.0f} "
                f"{s['generation_batches_per_step'] or 1:>8} {s['groups_filled_per_step'] or 0:>6}"
            )
        print(f"     CPU per step, dynamic / plain: {r['cpu_per_step_ratio_dynamic_over_plain']}")
    print(f"wrote {RESULTS}")
    return report


if __name__ == "__main__":
    main()
