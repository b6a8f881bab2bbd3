"""Synchronous vs asynchronous GRPO in the CPU server layout, side by side in one run: time per step, each side's idle
share, and held-out accuracy and training reward after the same number of samples, across seeds.

The layout: a real `trl vllm-serve` (vLLM's CPU build, gloo weight transfer, `trl_ext.grpo.weight_sync`) pinned
to core 0, the trainer pinned to core 1, so the two sides are two devices. The task and model are the embedded
demo's (Countdown with 3 numbers, compact prompts, a character-level Qwen3 with 2 heads of 64 so the CPU engine
takes it), warm-started by the demo's SFT once (or `--init-model`), shared by every run. For each batch size of
`--batches` (a setting; the default 96 balances generation and training on the 2-core machine, 128 makes training
the slower side), three arms run GRPO from that checkpoint at the same batch and step count, once per seed of
`--seeds` (the GRPO seed: data order and sampling; the problems and held-out set are the demo's, fixed). The seed is
the pairing unit; seed by seed every arm runs, in an order rotated by one arm per seed against drift:

- `sync`: `async_rollouts: true, max_staleness: 0`, TRL's synchronous path request for request (the equivalence
  test, tests/vllm_async_checks.py, shows the same losses, gradients and weights as `async_rollouts: false`);
  it records where each step's time goes, from which the ideal overlap follows;
- `async`: `max_staleness: 1`, the next batch generated while this one trains, with TRL's vLLM importance-sampling
  correction as shipped (`vllm_importance_sampling_correction: true`, as in `sync`);
- `async_nocorr`: `max_staleness: 1` without the correction (the library refuses that combination; this script
  turns the field off after the config's validation to measure what the refusal protects). Without the correction
  TRL also skips the forward pass that scores the old log-probs, so this arm's step is cheaper as well.

Reported per setting (benchmarks/results/async.json: the first setting's at the top level, every setting under
`settings`):

- quality, across seeds (`quality`, the study statistics of `trl_ext.study.report`): per arm (`per_arm`) and per
  metric (`greedy_accuracy` and `sampled_accuracy` on the held-out problems, `--eval-samples` samples each at
  temperature 1; `reward_mean`, the training reward over the run's steps; `seconds_per_step`) the mean with its 95%
  Student-t interval over seeds (`n`, `mean`, `low`, `high`); `paired`: `async-sync` and `async_nocorr-sync`, the
  difference paired by seed with its t interval and the paired t-test's `p`; `speedup_by_seed`: sync s/step over
  the arm's, seed by seed. `per_seed`: each run's four figures, by arm and seed.
- speed, pooled over the seeds of each arm: `sync_seconds_per_step`, `async_seconds_per_step`,
  `async_nocorr_seconds_per_step` (mean wall per optimizer step after `--warmup` steps), `speedup` = sync / async,
  `speedup_nocorr`, `ideal_speedup` = (generation + training) / max(generation, training) per synchronous step
  (generation: the server answering the step's request; training: the rest of the step, weight push included), each
  side's idle share, and under `arms` each arm's breakdown with TRL's importance-sampling ratio and the dropped
  requests. Goal: speedup >= 0.9 x ideal_speedup; >= 1.5 when the sides are balanced.
- `secondary_per_problem_z`, a secondary figure only: the paired z over held-out problems of each async arm minus
  sync, the arm's seeds pooled per problem. It counts problems as the unit and leaves out the spread between
  training trajectories, so it is not the comparison; `quality` is.

`core_overlap` times a fixed torch load alone on each core and on both at once: two vCPUs that are one physical
core's SMT threads cannot overlap fully, whatever the trainer does.

Where the overlap stops short of the ideal: the weight push. The server takes the weights between two generations,
so neither side works during it, while the ideal counts it as training: the best a push between generations allows
is `push_bound_speedup` = sync step / (max(generation, training - push) + push), below the ideal when generation is
the slower side or even (on this toy model the push is about a sixth of a generation).

The machine's load during the whole run is recorded (`load`, benchmarks/_load.py); a loaded machine's figures are
written only with `--loaded`, and marked so.

    python benchmarks/bench_async.py                 # the measurement (15 runs; 4,129 s on 2 cores at load 5-10)
    python benchmarks/bench_async.py --batches 96,128 --seeds 0,1,2   # both settings, 3 seeds
    python benchmarks/bench_async.py --quick         # a dry run of every phase at toy size (writes WORK/async.json)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _load import MachineLoad, add_load_argument, refuse_if_loaded  # noqa: E402
from _runs import child_env, child_env_changes, run_logged  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "async.json"
SERVER_FLAGS = ["--max_model_len", "64", "--enforce_eager", "--kv-cache-memory-bytes", str(256 * 2**20)]
# arm: (max_staleness, TRL's vLLM importance-sampling correction). The library refuses a staleness > 0 without the
# correction (`check_async_rollouts_config`); `async_nocorr` measures what that refusal protects, so `run_arm` turns
# the correction off on the validated config (the trainer reads the field at its construction).
ARMS = {"sync": (0, True), "async": (1, True), "async_nocorr": (1, False)}
REFERENCE = "sync"
METRICS = ("greedy_accuracy", "sampled_accuracy", "reward_mean", "seconds_per_step")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="GRPO optimizer steps per run.")
    # 96 = 12 prompts x 8: generation and training even per synchronous step on the 2-core machine (measured 0.195 s
    # / 0.197 s at load ~3); 128: the trainer the slower side by about 1.5x (0.26 s / 0.38 s).
    p.add_argument("--batches", default="96", help="Completions per step, one setting each (comma-separated).")
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)  # internal: one setting's batch, in a child
    p.add_argument("--group", type=int, default=8, help="Completions per prompt.")
    p.add_argument("--completion-length", type=int, default=24, help="Longest completion in tokens.")
    p.add_argument("--learning-rate", type=float, default=2e-4)
    p.add_argument("--sft-steps", type=int, default=300, help="Warm-start SFT steps (the demo's).")
    p.add_argument("--eval-samples", type=int, default=4, help="Samples per held-out problem.")
    p.add_argument("--eval-problems", type=int, default=512, help="Held-out problems (the demo's fixed set).")
    p.add_argument("--warmup", type=int, default=3, help="First steps left out of the time per step.")
    p.add_argument("--seeds", default="0,1,2,3,4", help="GRPO seeds (sampling, data order), one run per arm each.")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # internal: one run's seed, in a child
    p.add_argument("--init-model", default="", help="Start from this checkpoint (skips SFT).")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench_async"), help="Run folder.")
    p.add_argument("--out", default="", help="Result file (default: benchmarks/results/async.json; WORK/async.json "
                   "with --quick).")  # fmt: skip
    p.add_argument("--port", type=int, default=18457)
    p.add_argument("--quick", action="store_true", help="Toy size: every phase, nothing worth quoting.")
    p.add_argument("--arm", choices=sorted(ARMS), help=argparse.SUPPRESS)  # internal: one arm, in a child
    p.add_argument("--run", default="", help=argparse.SUPPRESS)  # internal: the arm's record name
    add_load_argument(p)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batches, args.sft_steps, args.eval_problems, args.eval_samples = 6, "32", 20, 64, 2
        args.warmup, args.seeds = 1, "0,1"
    args.out = args.out or str(Path(args.work) / "async.json" if args.quick else RESULTS)
    seeds = args.seeds.split(",")
    if not all(s.strip().isdigit() for s in seeds) or len(set(seeds)) != len(seeds):
        p.error(f"--seeds={args.seeds!r}: distinct non-negative integers, comma-separated")
    return args


def demo_config(args):
    from trl_ext.demo import DemoConfig

    # The demo's model with 2 heads of 64 (the CPU engine refuses head_dim 32) and its problems.
    return DemoConfig(num_heads=2, num_kv_heads=1, num_eval_problems=args.eval_problems, seed=0)


# ---------------------------------------------------------------------------------------------------- one arm (child)


def run_arm(args) -> None:
    """GRPO from the warm start against the server, then held-out evaluation; writes WORK/<run>.json."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer
    from trl_ext.demo import grpo_dataset, make_splits, split_labelled
    from trl_ext.rewards import CountdownReward
    from trl_ext.testbed.heldout import evaluate

    torch.set_num_threads(1)
    work, cfg = Path(args.work), demo_config(args)
    train, held_out = make_splits(cfg)
    _, unlabelled = split_labelled(train, cfg.num_labelled)
    tokenizer = AutoTokenizer.from_pretrained(args.init_model)
    model = AutoModelForCausalLM.from_pretrained(args.init_model, dtype=torch.float32)
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            marks.append(time.perf_counter())

    config = AblationGRPOConfig(
        output_dir=str(work / args.run),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=args.seed,  # the problems and held-out set stay the demo's (cfg.seed); this seeds sampling and data order
        group_size=args.group,
        rollout_batch_size=args.batch,
        train_batch_size=args.batch,
        advantage_type="group_mean_std",
        advantage_eps=1e-6,
        pg_loss_type="grpo_clip",
        epsilon=0.2,
        length_normalization="masked_mean",
        beta=0.0,
        max_steps=args.steps,
        max_completion_length=args.completion_length,
        learning_rate=args.learning_rate,
        lr_scheduler_type="linear",
        adam_beta2=0.99,
        max_grad_norm=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        skip_zero_advantage_completions=True,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=f"http://127.0.0.1:{args.port}",
        vllm_group_port=args.port + 1,
        vllm_importance_sampling_correction=True,
        async_rollouts=True,
        max_staleness=ARMS[args.arm][0],
    )
    config.vllm_importance_sampling_correction = ARMS[args.arm][1]  # after validation: see ARMS
    trainer = AblationGRPOTrainer(
        model=model,
        reward_funcs=[CountdownReward(require_all=True)],
        args=config,
        train_dataset=grpo_dataset(unlabelled),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    trainer.vllm_generation.vllm_client.close_communicator()
    logs = [h for h in trainer.state.log_history if "async/wait_seconds" in h]
    walls = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    heldout = evaluate(model, tokenizer, held_out, args.eval_samples, args.completion_length)
    record = {
        "step_walls": walls,
        "metrics": {
            k: [h.get(k) for h in logs]
            for k in (
                "async/wait_seconds",
                "async/generate_seconds",
                "async/sync_seconds",
                "async/staleness",
                "async/prefetched",
                "reward",
                "sampling/importance_sampling_ratio/mean",
                "sampling/importance_sampling_ratio/min",
                "sampling/sampling_logp_difference/mean",
                "async/dropped",
            )
        },  # fmt: skip
        "heldout": {
            k: heldout[k] for k in ("greedy_accuracy", "sampled_accuracy", "greedy_correct", "sampled_correct")
        },
        "eval_samples": args.eval_samples,
        "seed": args.seed,
    }
    (work / f"{args.run}.json").write_text(json.dumps(record))


# ---------------------------------------------------------------------------------------------------- the comparison


def step_stats(records: list[dict], warmup: int) -> dict:
    """Mean wall per step after `warmup` (pooled over an arm's runs), and where it went: the server generating or
    taking weights, the trainer blocked on the server."""
    walls = [w for r in records for w in r["step_walls"][warmup:]]

    def total(key: str) -> float:
        return sum(v for r in records for v in r["metrics"][key][warmup:])

    wall, generate, push, wait = (
        sum(walls),
        total("async/generate_seconds"),
        total("async/sync_seconds"),
        total("async/wait_seconds"),
    )

    def mean_of(key: str) -> float | None:
        values = [v for r in records for v in r["metrics"].get(key, []) if v is not None]
        return sum(values) / len(values) if values else None

    return {
        "runs": len(records),
        "steps": len(walls),
        "seconds_per_step": wall / len(walls),
        "runs_seconds_per_step": [sum(r["step_walls"][warmup:]) / len(r["step_walls"][warmup:]) for r in records],
        "generate_seconds_per_step": generate / len(walls),
        "sync_seconds_per_step": push / len(walls),
        "trainer_idle_fraction": wait / wall,  # blocked on the server's answer (or its end before a push)
        # neither generating nor taking weights; the answer's time is clocked by the trainer's background thread,
        # a little high when the trainer's thread holds the GIL as it arrives (so this can read slightly below 0)
        "server_idle_fraction": 1 - (generate + push) / wall,
        "staleness_mean": total("async/staleness") / len(walls),
        "reward_mean": mean_of("reward"),
        # TRL's vLLM importance-sampling ratio pi_trainer / pi_sampler (logged with the correction on only)
        "importance_sampling_ratio_mean": mean_of("sampling/importance_sampling_ratio/mean"),
        "importance_sampling_ratio_min": mean_of("sampling/importance_sampling_ratio/min"),
        "sampling_logp_difference_mean": mean_of("sampling/sampling_logp_difference/mean"),
        "dropped_mean": mean_of("async/dropped"),
    }


def heldout_per_problem(records: list[dict]) -> list[float]:
    """Per held-out problem, the share of correct samples, averaged over an arm's runs."""
    k = records[0]["eval_samples"]
    counts = [r["heldout"]["sampled_correct"] for r in records]
    return [sum(c) / (k * len(c)) for c in zip(*counts, strict=True)]


def paired_z(a: list[float], b: list[float]) -> float:
    """z of the mean per-problem difference b - a (paired over problems); 0 when every difference is 0."""
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return 0.0 if var == 0 else mean / math.sqrt(var / n)


def seed_metrics(record: dict, warmup: int) -> dict:
    """One run's figures (`METRICS`): held-out greedy and sampled accuracy, the training reward averaged over its
    logged steps, wall per optimizer step after `warmup` steps."""
    rewards = [v for v in record["metrics"]["reward"] if v is not None]
    walls = record["step_walls"][warmup:]
    return {
        "greedy_accuracy": record["heldout"]["greedy_accuracy"],
        "sampled_accuracy": record["heldout"]["sampled_accuracy"],
        "reward_mean": sum(rewards) / len(rewards),
        "seconds_per_step": sum(walls) / len(walls),
    }


def across_seeds(per_seed: dict[str, dict[int, dict]], reference: str = REFERENCE) -> dict:
    """The study statistics over seeds (`trl_ext.study.report`): per arm and metric the mean with a 95% Student-t
    interval over its seeds (`mean_ci`); per other arm and metric the difference arm - reference paired by seed,
    with its t interval and the paired t-test's p (`paired`); and per other arm the speedup reference s/step over
    the arm's, seed by seed (`mean_ci` of the ratios).

    `per_seed`: arm -> seed -> `seed_metrics`."""
    from trl_ext.study.report import mean_ci, paired

    ref = per_seed[reference]
    per_arm = {
        arm: {m: mean_ci([runs[s][m] for s in sorted(runs)]) for m in METRICS} for arm, runs in per_seed.items()
    }
    differences, speedups = {}, {}
    for arm, runs in per_seed.items():
        if arm == reference:
            continue
        differences[f"{arm}-{reference}"] = {
            m: paired({s: r[m] for s, r in runs.items()}, {s: r[m] for s, r in ref.items()}) for m in METRICS
        }
        both = sorted(set(runs) & set(ref))
        speedups[arm] = mean_ci([ref[s]["seconds_per_step"] / runs[s]["seconds_per_step"] for s in both])
    return {"per_arm": per_arm, "paired": differences, "speedup_by_seed": speedups}


def compare(records: dict[str, dict[int, dict]], warmup: int) -> dict:
    """One setting's figures from its runs (`records`: arm -> seed -> run record): the speed (pooled over seeds per
    arm), the across-seed quality, and the secondary per-problem z."""
    stats = {arm: step_stats(list(runs.values()), warmup) for arm, runs in records.items()}
    s, a = stats[REFERENCE], stats["async"]
    generation, push = s["generate_seconds_per_step"], s["sync_seconds_per_step"]
    training = s["seconds_per_step"] - generation  # scoring, the update and the weight push
    ideal = s["seconds_per_step"] / max(generation, training)
    # With the push between generations neither side works during it: the best overlap is max(g, t - p) + p.
    push_bound = s["seconds_per_step"] / (max(generation, training - push) + push)
    speedup = s["seconds_per_step"] / a["seconds_per_step"]
    per_seed = {arm: {seed: seed_metrics(r, warmup) for seed, r in runs.items()} for arm, runs in records.items()}
    pooled = {arm: heldout_per_problem(list(runs.values())) for arm, runs in records.items()}
    return {
        "seeds": sorted(records[REFERENCE]),
        "sync_seconds_per_step": s["seconds_per_step"],
        "async_seconds_per_step": a["seconds_per_step"],
        "async_nocorr_seconds_per_step": stats["async_nocorr"]["seconds_per_step"],
        "speedup": speedup,
        "speedup_nocorr": s["seconds_per_step"] / stats["async_nocorr"]["seconds_per_step"],
        "ideal_speedup": ideal,
        "speedup_over_ideal": speedup / ideal,
        "push_bound_speedup": push_bound,
        "sync_generation_seconds_per_step": generation,
        "sync_training_seconds_per_step": training,
        "sync_trainer_idle_fraction": s["trainer_idle_fraction"],
        "sync_server_idle_fraction": s["server_idle_fraction"],
        "async_trainer_idle_fraction": a["trainer_idle_fraction"],
        "async_server_idle_fraction": a["server_idle_fraction"],
        "quality": across_seeds(per_seed),
        "per_seed": per_seed,
        "secondary_per_problem_z": {
            "note": "secondary: the held-out problems as the unit, each arm's seeds pooled; the spread between "
            "training trajectories is not in it (the across-seed figures are under quality)",
            "heldout_sampled": {arm: sum(acc) / len(acc) for arm, acc in pooled.items()},
            **{f"{arm}-{REFERENCE}": paired_z(pooled[REFERENCE], a) for arm, a in pooled.items() if arm != REFERENCE},
        },
        "arms": stats,
    }


# A fixed single-thread torch workload, timed alone on each core and on both at once: how independent the two cores
# are (a 2-vCPU VM may be one physical core's two SMT threads, which share its execution units).
BURN = (
    "import time, torch; torch.set_num_threads(1); a = torch.randn(256, 256); n = 0; t = time.perf_counter()\n"
    "while time.perf_counter() - t < 3: a = torch.tanh(a @ a); n += 1\n"
    "print(n / (time.perf_counter() - t))"
)


def core_overlap() -> dict:
    """Iterations per second of `BURN` on core 0 and core 1 alone, then on both at once (`parallel_efficiency`:
    the concurrent rate over the alone rate, 1.0 for two independent cores)."""

    def burn(cores: list[str]) -> list[float]:
        procs = [subprocess.Popen(["taskset", "-c", c, sys.executable, "-c", BURN], env=child_env(),
                                  stdout=subprocess.PIPE, text=True) for c in cores]  # fmt: skip
        return [float(p.communicate()[0]) for p in procs]

    alone = burn(["0"]) + burn(["1"])
    both = burn(["0", "1"])
    return {"alone": alone, "both": both, "parallel_efficiency": sum(both) / sum(alone)}


def start_server(model: str, port: int, log: Path):
    """The server `trl-ext launch` starts on a CPU machine (`trl vllm-serve` with the gloo weight transfer, float32),
    pinned to core 0; returns the running `ServerProcess` once `/health` answers."""
    from trl_ext.launch import Command, ServerProcess, server_command
    from trl_ext.launch.cpu_layout import cpu_server_args, pin

    flags, _ = cpu_server_args(SERVER_FLAGS, None, "float32")
    command = server_command(model, "127.0.0.1", port, 1, 1, [], flags)
    command = pin(Command(command.argv, child_env_changes()), [0])
    print("$", command.render(), f"> {log}", flush=True)
    server = ServerProcess(command, log, f"http://127.0.0.1:{port}/health", grace=10)
    server.start()
    try:
        server.wait_healthy(900)
    except BaseException:
        server.stop()
        raise
    return server


def child(argv: list[str], log: Path, cores: str) -> float:
    return run_logged(argv, log, " ".join(argv[:3]), prefix=("taskset", "-c", cores))


def run_order(seeds: list[int]) -> list[tuple[int, list[str]]]:
    """Seed by seed, every arm, in an order rotated by one arm per seed (each arm first, second, third in turn)
    against drift of the machine's speed."""
    arms = list(ARMS)
    return [(seed, arms[i % len(arms) :] + arms[: i % len(arms)]) for i, seed in enumerate(seeds)]


def _interval(stat: dict) -> str:
    if stat["low"] is None:
        return f"{stat['mean']:+.4f}"
    p = f", p {stat['p']:.3f}" if stat.get("p") is not None else ""
    return f"{stat['mean']:+.4f} [{stat['low']:+.4f}, {stat['high']:+.4f}{p}]"


def quality_lines(setting: dict) -> list[str]:
    """The across-seed table of one setting: per arm mean [95% t interval], then each paired difference."""
    quality, n = setting["quality"], len(setting["seeds"])
    lines = [f"batch {setting['batch']}, {n} seeds: mean [95% t interval over seeds]"]
    for name, by_metric in [*quality["per_arm"].items(), *quality["paired"].items()]:
        lines.append(f"  {name:20s} " + "  ".join(f"{m} {_interval(by_metric[m])}" for m in METRICS))
    for arm, stat in quality["speedup_by_seed"].items():
        lines.append(f"  speedup {REFERENCE}/{arm} by seed {_interval(stat)}")
    z = setting["secondary_per_problem_z"]
    lines.append("  secondary per-problem z (seeds pooled): " + ", ".join(
        f"{k} {v:+.2f}" for k, v in z.items() if k not in ("note", "heldout_sampled")))  # fmt: skip
    return lines


def main() -> None:
    args = parse_args()
    if args.arm:
        return run_arm(args)
    started = time.perf_counter()
    load = MachineLoad()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    walls = {}
    overlap = core_overlap()
    print(f"core overlap: {overlap}", flush=True)
    if not args.init_model:  # the demo's SFT warm start, on both cores (set-up, not compared)
        sft = work / "sft"
        flags = ["-m", "trl_ext.demo", "--output_dir", str(sft), "--grpo_steps", "0", "--num_heads", "2",
                 "--num_kv_heads", "1", "--sft_steps", str(args.sft_steps), "--num_eval_problems",
                 str(args.eval_problems), "--eval_samples", "0", "--curve_points", "0", "--no-control", "--no-wandb",
                 "--threads", "2"]  # fmt: skip
        walls["sft"] = child(flags, work / "sft.log", "0,1")
        args.init_model = str(sft / "sft_model")
    t = time.perf_counter()
    server = start_server(args.init_model, args.port, work / "server.log")
    walls["server_start"] = time.perf_counter() - t
    skip = ("arm", "run", "quick", "out", "batches", "batch", "seeds", "seed", "loaded")
    passed = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in skip]
    settings = []
    try:
        for batch in [int(b) for b in str(args.batches).split(",")]:
            records: dict[str, dict[int, dict]] = {arm: {} for arm in ARMS}
            for seed, order in run_order([int(s) for s in args.seeds.split(",")]):
                for arm in order:
                    run = f"b{batch}_{arm}_s{seed}"
                    argv = [__file__, f"--arm={arm}", f"--run={run}", f"--batch={batch}", f"--seed={seed}", *passed]
                    walls[run] = child(argv, work / f"{run}.log", "1")
                    records[arm][seed] = json.loads((work / f"{run}.json").read_text())
            settings.append({"batch": batch, **compare(records, args.warmup)})
    finally:
        server.stop()
    result = {**settings[0], "settings": settings}  # the first (balanced) setting's figures at the top level
    result["setting"] = {
        k: v for k, v in vars(args).items() if k not in ("arm", "run", "batch", "out", "work", "port", "loaded")
    }
    if Path(args.init_model).is_relative_to(ROOT):  # the run folder relative to the repository
        result["setting"]["init_model"] = str(Path(args.init_model).relative_to(ROOT))
    result["core_overlap"] = overlap
    result["walls"] = walls
    result["total_wall_seconds"] = time.perf_counter() - started
    result["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    result["load"] = load.stop()
    result["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                      text=True).stdout.strip()  # fmt: skip
    refuse_if_loaded(result["load"], args.loaded or args.quick, args.out)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    keys = ["sync_seconds_per_step", "async_seconds_per_step", "async_nocorr_seconds_per_step", "speedup",
            "speedup_nocorr", "ideal_speedup", "speedup_over_ideal", "push_bound_speedup",
            "sync_trainer_idle_fraction", "sync_server_idle_fraction", "async_trainer_idle_fraction",
            "async_server_idle_fraction"]  # fmt: skip
    print(f"{'batch':32s} " + " ".join(f"{setting['batch']:>8d}" for setting in settings))
    for key in keys:
        print(f"{key:32s} " + " ".join(f"{setting[key]:8.4f}" for setting in settings))
    for setting in settings:
        print("\n".join(quality_lines(setting)))
    print(f"core parallel efficiency {overlap['parallel_efficiency']:.3f}; wrote {args.out} "
          f"({result['total_wall_seconds']:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
