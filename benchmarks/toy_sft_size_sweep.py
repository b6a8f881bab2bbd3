"""NYU Assignment 3's SFT dataset-size sweep at toy scale, through the real SFT recipe: validation accuracy and
loss curves per dataset size on one figure.

Each size runs `recipes/sft.py --config <toy>.yaml` in its own child process, where the toy YAML's `base:` is the
size recipe it stands for (recipes/sft/size_128 ... size_1024.yaml) and overrides only what a CPU toy needs:

- the model of tests/test_sft_validation.py: `trl_ext.tiny` (Qwen3 architecture, hidden 64, 2 layers, random
  weights, seed 0) with the char tokenizer and a plain `role: content<eos>` chat template;
- traces "digits: a b c d" -> `\\boxed{a}` (the first digit), four distinct random digits per row (seed 0): the first
  N of 1024 training rows (`limit` 16 / 64 / 256 / 1024 in place of 128 / 256 / 512 / 1024), and 64 held-out rows
  that are both the eval-loss traces and the accuracy problems;
- 3 epochs (base.yaml), batch 4 (micro-batch 4 x GA 1), lr 3e-3 cosine with base.yaml's 3% warmup, max_length 64,
  fp32 on the CPU, no wandb;
- validation as base.yaml has it, every 10% of training plus step 0 (`eval_steps: 0.1`, `eval_on_start`), with the
  transformers backend instead of vLLM: the 64 problems, greedy, up to 12 tokens, graded on the last `\\boxed{}`
  (question_only), eval_loss on the same 64 traces.

Then `trl_ext.reporting.plot.plot_runs` draws validation accuracy, training loss and validation loss against the
optimizer step (one line per size), and the validation panels again against the validation step (the k-th validation is
at k x 10% of each size's training), and the per-validation numbers go to a JSON.

    python benchmarks/toy_sft_size_sweep.py   # runs/toy_sft_size_sweep/n*, benchmarks/results/toy_sft_size_sweep.*

Times at this scale say little (the JSON records the load average they were taken at).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
from pathlib import Path

from _runs import run_logged

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Toy size -> the size recipe it stands for (its `base:`): the same order, 1/8 to 1x of the real sizes.
SIZES = {16: "size_128", 64: "size_256", 256: "size_512", 1024: "size_1024"}
HELD_OUT = 64
BUDGET = 12  # "\boxed{d}" is 8 tokens + <eos>
# The chat template of tests/test_sft_validation.py: the char tokenizer has none.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
TOY = [
    "dtype: float32",
    "dataset_split: train",
    "eval_split: train",
    "accuracy_split: train  # a local file has one split",
    "max_length: 64",
    "per_device_train_batch_size: 4",
    "gradient_accumulation_steps: 1  # batch 4: 3 epochs x N / 4 optimizer steps",
    "learning_rate: 3.0e-3",
    "per_device_eval_batch_size: 64",
    "accuracy_backend: transformers  # vLLM in the shipped sweep",
    "accuracy_prompt: question_only  # the bare question as the user turn, as traced",
    "accuracy_chat: true  # the traces are chat messages",
    f"accuracy_max_tokens: {BUDGET}",
    "final_eval: false  # the trainer's last validation is at the last step already",
    "bf16: false",
    "use_cpu: true",
    "gradient_checkpointing: false",
    "report_to: none",
    "seed: 0",
]
KEY = "eval_rewards/question_only_reward"
PANELS = [
    ("validation answer reward", [f"{KEY}/answer_reward"]),
    ("train loss", ["loss"]),
    ("validation loss", ["eval_loss"]),
]


def write_data(out: Path) -> tuple[Path, Path, Path]:
    """1024 training traces, and 64 held-out ones (as traces and as problems); no digit string in both."""
    rng = random.Random(0)
    strings = [f"{i:04d}" for i in rng.sample(range(10_000), HELD_OUT + max(SIZES))]
    held_out, train = strings[:HELD_OUT], strings[HELD_OUT:]

    def trace(s: str) -> str:
        user = {"role": "user", "content": "digits: " + " ".join(s)}
        return json.dumps({"messages": [user, {"role": "assistant", "content": f"\\boxed{{{s[0]}}}"}]})

    paths = out / "train.jsonl", out / "held_out.jsonl", out / "problems.jsonl"
    paths[0].write_text("".join(trace(s) + "\n" for s in train))
    paths[1].write_text("".join(trace(s) + "\n" for s in held_out))
    rows = [{"problem": "digits: " + " ".join(s), "answer": s[0]} for s in held_out]
    paths[2].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def write_model(out: Path) -> str:
    from trl_ext.tiny import build_char_tokenizer, save_tiny_model

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return save_tiny_model(out / "model", tokenizer=tokenizer, seed=0)


def write_yaml(size: int, model: str, data: tuple[Path, Path, Path], run_dir: Path, path: Path) -> Path:
    train, held_out, problems = data
    lines = [
        f"base: {ROOT / 'recipes' / 'sft' / (SIZES[size] + '.yaml')}",
        f"limit: {size}  # in place of the size recipe's",
        f"model_name_or_path: {model}",
        f"dataset_source: {train}",
        f"eval_source: {held_out}",
        f"accuracy_source: {problems}",
        *TOY,
        f"output_dir: {run_dir}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_child(config: Path, log: Path) -> float:
    """`python recipes/sft.py --config CONFIG`, output to `log`; returns its wall seconds."""
    return run_logged([str(ROOT / "recipes" / "sft.py"), "--config", str(config)], log, config.name)


def summarize(size: int, run_dir: Path, process_wall_s: float) -> dict:
    """Per validation: step, accuracy, format rate, eval_loss; the run's optimizer steps and train_loss_drop."""
    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    train = json.loads((run_dir / "train_results.json").read_text())
    by_step: dict[int, dict] = {}
    for entry in history:  # the loss entry and the accuracy entry of one validation share its step
        row = by_step.setdefault(entry["step"], {"step": entry["step"]})
        if "eval_loss" in entry:
            row["eval_loss"] = round(entry["eval_loss"], 4)
        if f"{KEY}/answer_reward" in entry:
            row["accuracy"] = round(entry[f"{KEY}/answer_reward"], 4)
            row["format_rate"] = round(entry[f"{KEY}/format_reward"], 4)
    validations = [row for _, row in sorted(by_step.items()) if "accuracy" in row or "eval_loss" in row]
    losses = [e["loss"] for e in history if "loss" in e]
    return {
        "traces": size,
        "size_recipe": f"recipes/sft/{SIZES[size]}.yaml",
        "optimizer_steps": max(e["step"] for e in history),
        "train_loss_drop": round(train["train_loss_drop"], 4),
        "train_loss_first_last": [round(losses[0], 4), round(losses[-1], 4)],
        "validations": validations,
        "training_s": round(sum(e.get("step_time", 0.0) for e in history), 2),  # logging_steps 1: one step each
        "validation_s": round(sum(e.get("eval_runtime", 0.0) for e in history), 2),
        "process_wall_s": round(process_wall_s, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default="runs/toy_sft_size_sweep", help="Run folders go to OUTPUT_DIR/n<N>.")
    parser.add_argument("--results", default=str(RESULTS / "toy_sft_size_sweep.json"), help="JSON (PNG, CSV beside).")
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help=f"Comma-separated toy sizes, of {sorted(SIZES)}."
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if unknown := [s for s in sizes if s not in SIZES]:
        parser.error(f"--sizes {unknown}: choose from {sorted(SIZES)}")

    from trl_ext.reporting.plot import plot_runs

    out = Path(args.output_dir).resolve()
    for size in sizes:
        shutil.rmtree(out / f"n{size}", ignore_errors=True)  # the recipe refuses a non-empty output_dir
    out.mkdir(parents=True, exist_ok=True)
    model = write_model(out)
    data = write_data(out)
    walls = {}
    for size in sizes:
        config = write_yaml(size, model, data, out / f"n{size}", out / f"n{size}.yaml")
        walls[size] = run_child(config, out / f"n{size}.log")

    results = Path(args.results)
    png = results.with_suffix(".png")
    plot_runs(
        [out / f"n{s}" for s in sizes],
        png,
        labels=[f"{s} traces" for s in sizes],
        panels=PANELS,
        x_axes=["step", "validation_step"],
    )
    summary = {
        "command": " ".join(["python", "benchmarks/toy_sft_size_sweep.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg": os.getloadavg()},
        "runs": {str(size): summarize(size, out / f"n{size}", walls[size]) for size in sizes},
        "figure": str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png),
    }
    results.write_text(json.dumps(summary, indent=1) + "\n")
    for run in summary["runs"].values():
        print(
            f"{run['traces']} traces: {run['optimizer_steps']} steps, train_loss_drop {run['train_loss_drop']}, "
            f"process {run['process_wall_s']} s"
        )
        for row in run["validations"]:
            print(f"  {row}")
    print(f"wrote {results}, {png} and {png.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
