"""Expert iteration beside GRPO at toy scale on the real vLLM CPU engine, overlaid by validation step.

Both runs go through the recipe entry points (`run_expert_iteration_recipe`, and `run_grpo_recipe("countdown")` as
recipes/countdown.py runs it) on YAMLs written here, each in its own child process (vLLM pins the threads of the
process that hosts its engine and spawns workers):

- the engine test model of tests/vllm_helpers.py (Qwen3 architecture, hidden 128, 2 layers, random weights, char
  tokenizer), saved once and shared; the compact Countdown prompt on tests/data's dev problems (training rows 0-47,
  validation rows 48-63); the toy reward of
  tests/scripts/toy_rewards.py, `DigitReward(where="first")`: 1 when the completion starts with a digit; 8 new
  tokens; vLLM colocated on the CPU engine; the same 16 validation questions x 4 samples, validated at the start
  and after every step; seed 0;
- EI (recipes/gsm8k/expert_iteration.yaml with task countdown): 6 EI steps of 8 questions x 4 (32 rollouts), SFT
  batch 8 (micro-batch 8 x GA 1), lr 1e-2 constant;
- GRPO (recipes/countdown/base.yaml's objective: reinforce_with_baseline, std-normalised, masked_mean, beta 0):
  6 on-policy GRPO steps of 32 rollouts (8 questions x 4), one optimizer step each (micro-batch 8 x GA 4),
  lr 1e-2 constant.

Then `trl_ext.reporting.plot.plot_runs` draws both runs on one figure, against validation step and against rebuilt
wall-clock time (validation answer reward, validation entropy, validation response length), and the
per-validation numbers go to a JSON.

    python benchmarks/toy_ei_vs_grpo.py            # runs/toy_ei_vs_grpo/{ei,grpo}, benchmarks/results/toy_ei_vs_grpo.*

Times at this scale say little (the JSON records the load average they were taken at).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from pathlib import Path

from _runs import run_logged

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
RESULTS = ROOT / "benchmarks" / "results"
RUNS = ("ei", "grpo")
# The settings both runs share: model, data, prompt, reward, sampling, validation, CPU engine.
COMMON = [
    "prompt: compact  # the compact Countdown prompt fits the char model",
    "chat_template: false",
    "reward_funcs: ['toy_rewards:DigitReward(where=\"first\")']  # 1 when the completion starts with a digit",
    "dataset_split: train[:48]  # 6 steps x 8 questions",
    "eval_split: train[48:64]  # the same 16 validation questions for both runs",
    "max_completion_length: 8",
    "num_generations_eval: 4",
    "per_device_eval_batch_size: 64  # 16 questions x 4 samples in one generation call",
    "eval_strategy: steps",
    "eval_steps: 1",
    "eval_on_start: true",
    "final_eval: false  # the last step's validation is the last point",
    "learning_rate: 1.0e-2",
    "use_vllm: true",
    "vllm_mode: colocate",
    "vllm_max_model_length: 64",
    "bf16: false",
    "use_cpu: true",
    "gradient_checkpointing: false",
    "report_to: none",
    "log_completions: false",
    "rollout_log_steps: 0",
    "save_strategy: 'no'",
    "seed: 0",
]
SPECIFIC = {
    "ei": [
        f"base: {ROOT / 'recipes' / 'gsm8k' / 'expert_iteration.yaml'}",
        "task: countdown",
        "n_ei_steps: 6",
        "questions_per_step: 8",
        "num_generations: 4  # 32 rollouts per EI step",
        "per_device_train_batch_size: 8",
        "gradient_accumulation_steps: 1  # SFT batch 8",
    ],
    "grpo": [
        f"base: {ROOT / 'recipes' / 'countdown' / 'base.yaml'}",
        "rollout_batch_size: 32",
        "group_size: 4  # 8 questions x 4",
        "train_batch_size: 32  # one optimizer step per rollout batch: on-policy",
        "per_device_train_batch_size: 8  # x GA 4",
        "n_grpo_steps: 6",
    ],
}
VALIDATION_KEYS = {
    "answer_reward": "eval_rewards/digit_first/answer_reward",
    "entropy": "eval_entropy",
    "mean_length": "eval_completions/mean_length",
}
PANELS = [
    ("validation answer reward", ["eval_rewards/*/answer_reward"]),
    ("validation entropy", ["eval_entropy"]),
    ("validation response length (tokens)", ["eval_completions/mean_length"]),
]


def write_yaml(kind: str, model: str, data: Path, run_dir: Path, path: Path) -> Path:
    lines = [*SPECIFIC[kind], f"model_name_or_path: {model}", f"dataset_source: {data}", f"eval_source: {data}"]
    if kind == "grpo":
        lines.append("chat_template_kwargs: {}  # base.yaml's Qwen3 thinking switch; no chat template here")
    path.write_text("\n".join([*lines, *COMMON, f"output_dir: {run_dir}"]) + "\n")
    return path


def child(kind: str, config: Path) -> None:
    """One run in this process (started by `main` as a child): the recipe entry point on `config`."""
    sys.path[:0] = [str(TESTS), str(TESTS / "scripts")]  # toy_rewards; helpers.free_port
    import torch
    from helpers import free_port

    # One process plays rank 0 of 1; a free rendezvous port, other runs may be training beside this one.
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; TRL passes no KV size, 1 is the variable's least
    torch.set_num_threads(1)
    if kind == "ei":
        from trl_ext.recipes.expert_iteration import run_expert_iteration_recipe

        run_expert_iteration_recipe(["--config", str(config)])
    else:
        from trl_ext.recipes import run_grpo_recipe

        run_grpo_recipe("countdown", ["--config", str(config)])


def run_child(kind: str, config: Path, log: Path) -> float:
    """`child(kind, config)` in a subprocess, output to `log`; returns its wall seconds."""
    return run_logged([str(Path(__file__).resolve()), "--child", kind, "--config", str(config)], log, f"{kind} run")


def summarize(run_dir: Path, process_wall_s: float) -> dict:
    """Per validation (step 0 = at the start): answer reward, entropy, mean length; EI's kept counts; the rebuilt
    wall-clock split into validation and training (the times the trainer logged)."""
    from trl_ext.reporting.run_logs import load_run, validation_steps, wall_clock

    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    run = load_run(run_dir)
    clock = wall_clock(history)
    rows = []
    for entry, v, t in zip(history, validation_steps(history), clock, strict=True):
        if v is not None and "eval_entropy" in entry:
            row = {"validation_step": v, "step": entry.get("step"), "wall_clock_s": round(t, 2)}
            rows.append(row | {name: round(entry[key], 4) for name, key in VALIDATION_KEYS.items()})
    eval_s = sum(e.get("eval_runtime", 0.0) for e in history)
    out = {
        "name": run.name,
        "validations": rows,
        "rebuilt_wall_clock_s": round(clock[-1], 2) if clock else None,
        "validation_s": round(eval_s, 2),
        "training_s": round(clock[-1] - eval_s, 2) if clock else None,
        "first_validation_s": round(next((e["eval_runtime"] for e in history if "eval_runtime" in e), 0.0), 2),
        "process_wall_s": round(process_wall_s, 1),
        "optimizer_steps": max((e.get("step", 0) for e in history), default=0),
    }
    kept = [e["ei/kept"] for e in history if "ei/kept" in e]
    if kept:
        out["ei_kept"] = kept
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default="runs/toy_ei_vs_grpo", help="Run folders go to OUTPUT_DIR/{ei,grpo}.")
    parser.add_argument("--results", default=str(RESULTS / "toy_ei_vs_grpo.json"), help="JSON (PNG, CSV beside it).")
    parser.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, Path(args.config))
        return

    sys.path[:0] = [str(TESTS)]
    from conftest import shared_path
    from vllm_helpers import save_engine_model

    from trl_ext.reporting.plot import plot_runs

    out = Path(args.output_dir).resolve()
    for kind in RUNS:
        shutil.rmtree(out / kind, ignore_errors=True)  # the recipes refuse a non-empty output_dir
    out.mkdir(parents=True, exist_ok=True)
    model = save_engine_model(out / "model")
    data = shared_path("countdown", "dev.parquet")
    walls = {}
    for kind in RUNS:
        config = write_yaml(kind, model, data, out / kind, out / f"{kind}.yaml")
        walls[kind] = run_child(kind, config, out / f"{kind}.log")

    results = Path(args.results)
    png = results.with_suffix(".png")
    plot_runs(
        [out / k for k in RUNS], png, labels=["EI", "GRPO"], panels=PANELS, x_axes=["validation_step", "wall_clock"]
    )
    summary = {
        "command": " ".join(["python", "benchmarks/toy_ei_vs_grpo.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg": os.getloadavg()},
        "runs": {kind: summarize(out / kind, walls[kind]) for kind in RUNS},
        "figure": str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png),
    }
    results.write_text(json.dumps(summary, indent=1) + "\n")
    for kind in RUNS:
        run = summary["runs"][kind]
        print(f"{kind}: process {run['process_wall_s']} s, rebuilt wall-clock {run['rebuilt_wall_clock_s']} s")
        for row in run["validations"]:
            print(f"  {row}")
    print(f"wrote {results}, {png} and {png.with_suffix('.csv')}")


if __name__ == "__main__":  # vLLM spawns processes: they must not rerun this
    main()
