"""GPU check kit: our trainer against stock TRL on the seed-000 Dr.GRPO L256 recipe, and seed 004 under a 24 GB cap.

For a session that has a GPU (the device tool; /work/.library/device/README.md). Everything is built offline. Parts
(`--part NAME`, repeatable; default every default part; `--list` shows them with their expected minutes):

- `precision_fp32_master`, `precision_pure_bf16`: a random-init model from Qwen3-1.7B's config
  (`trl_ext.preflight.KNOWN_CONFIGS`: hidden 2048, 28 layers, 16 / 8 heads, head_dim 128, intermediate 6144, tied
  151,936 x 2048 embedding) with the Qwen3 tokenizer (tests/data/qwen3_tokenizer) trains a few GRPO steps of
  recipes/countdown/seed000_drgrpo_l256.yaml (parsed by the recipe parser; transformers generation, as no vLLM
  travels) in that precision mode (`fp32_master`: dtype float32 + bf16 autocast; `pure_bf16`: dtype bfloat16), with
  `AblationGRPOTrainer` and with stock `trl.GRPOTrainer` on the same config (loss_type dr_grpo, scale_rewards none),
  alternating which goes first. Per run: peak GPU memory (`torch.cuda.max_memory_allocated`), median step time after
  the first step, the first step's loss; the ratios ours / stock.
- `seed004`: recipes/gsm8k/seed004_24gb.yaml (Qwen2.5-1.5B-Instruct's config, random init) under
  `torch.cuda.set_per_process_memory_fraction(24 GiB / total)`, `--steps` GRPO steps at the recipe's batch sizes
  with transformers generation (no vLLM travels), against the preflight's estimate of that same setup. 8-bit AdamW
  needs bitsandbytes (its wheel is in the budget below); without it the part runs fused fp32 AdamW, whose estimate
  exceeds 24 GiB, and an out-of-memory error is then the expected result (the JSON says whether it was predicted).
- `padding_free` (not a default part): ours with `padding_free` against stock `trl.GRPOTrainer` on Qwen3-1.7B's
  config (random init, pure bf16, gradient checkpointing), per-device batch 8 and 16 of fixed completions of
  realistic lengths (bench_trainer's `FixedRollouts`: no generation), sdpa and flash-attention 2 if installed: step
  time and peak memory ratios, the first step's loss / grad norm of each.
- more parts: `_gpu_kit.part` / `_gpu_kit.script_part` (another benchmark script in its own process).

The JSON (default benchmarks/results/gpu_check.json) is written after every part, keeps the parts of earlier calls
(`--fresh` starts over), and records a failed part's error and traceback instead of stopping: one part per device
call keeps each call under its 600 s. `--smoke` runs the same code on the CPU with a tiny config and a couple of
steps (tests/test_gpu_check.py); its numbers are not GPU numbers.

On the device (nothing can be fetched there) the wheels of what its image lacks travel: `--wheels` prints the
download command and the transfer budget (working tree + wheels against 64 MiB; measured: 45.3 MB of wheels, 43.1
of them bitsandbytes, and a 7.5 MB tree). Then, per call (carry .whl):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --part precision_fp32_master --output $OUT/gpu_check.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

from _gpu_kit import DOWNLOAD, PARTS, WHEELS, part, run_parts, script_part, tree_bytes, wheel_budget

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "data" / "qwen3_tokenizer"
DATA = ROOT / "tests" / "data" / "countdown" / "dev.parquet"
GSM8K = ROOT / "tests" / "data" / "gsm8k" / "test.jsonl"
SEED000 = ROOT / "recipes" / "countdown" / "seed000_drgrpo_l256.yaml"
SEED004 = ROOT / "recipes" / "gsm8k" / "seed004_24gb.yaml"
MODES = {"fp32_master": "float32", "pure_bf16": "bfloat16"}
SMOKE_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "intermediate_size": 128}  # fmt: skip


def save_random_model(name: str, folder: Path, smoke: bool, dtype: str = "float32") -> str:
    """A random-init causal LM with `name`'s architecture (shrunk in smoke mode) and the Qwen3 tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trl_ext.preflight import KNOWN_CONFIGS

    fields = dict(KNOWN_CONFIGS[name])
    if smoke:
        fields.update(SMOKE_CONFIG)
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def recipe_args(recipe: Path, task: str, model: str, output_dir: str, args, extra: list[str]):
    """The recipe parsed by the recipe parser, shrunk to `args`' sizes, transformers generation, no logging, no
    validation; returns the parsed triple and the command line (for the preflight's view of the same run)."""
    from trl_ext.recipes import parse_recipe_args

    data = str(GSM8K if task == "gsm8k" else DATA)
    argv = ["--config", str(recipe), "--model_name_or_path", model, "--output_dir", output_dir]
    argv += ["--dataset_source", data, "--dataset_split", "train", "--eval_split", "none", "--eval_strategy", "no"]
    argv += ["--final_eval", "false", "--use_vllm", "false", "--report_to", "none", "--save_strategy", "no"]
    argv += ["--n_grpo_steps", str(args.steps), "--rollout_log_steps", "0", "--logging_steps", "1"]
    argv += ["--log_completions", "false", *extra]
    if args.smoke:
        argv += ["--use_cpu", "true", "--max_completion_length", "8"]
    return parse_recipe_args(task, argv), argv


def _step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step (generation included when the step starts a rollout batch)."""

        def __init__(self):
            self.times: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            _sync()
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync()
            self.times.append(time.perf_counter() - self._start)

    return StepTimer()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_trainer(kind: str, parsed, task: str) -> dict:
    """Train `parsed` with ours or stock TRL; the peak memory, step times and first loss."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from trl_ext.grpo.trainer import AblationGRPOTrainer
    from trl_ext.recipes import adapt_generation_kwargs, load_grpo_datasets, model_init_kwargs
    from trl_ext.rewards import get_reward_funcs

    script, args, model_args = parsed
    adapt_generation_kwargs(args)
    args.model_init_kwargs = model_init_kwargs(model_args, args)
    train, _ = load_grpo_datasets(task, script, args)
    rewards = get_reward_funcs(script.reward_funcs)
    if kind == "stock":  # the same TRL fields; ours set loss_type / scale_rewards to their TRL equivalents
        names = GRPOConfig.__dataclass_fields__
        fields = {k: getattr(args, k) for k in names if names[k].init and hasattr(args, k)}
        fields["steps_per_generation"] = None  # derived from generation_batch_size; TRL refuses both set
        args = GRPOConfig(**fields)
    trainer_cls = AblationGRPOTrainer if kind == "ours" else GRPOTrainer
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = trainer_cls(model=model_args.model_name_or_path, reward_funcs=rewards, args=args, train_dataset=train)
    timer = _step_timer()
    trainer.add_callback(timer)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    result = {
        "trainer": kind,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "step_s": timer.times,
        "median_step_s": statistics.median(timer.times[1:] or timer.times),
        "first_loss": losses[0] if losses else None,
    }
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def precision_run(mode: str, args, workdir: Path) -> dict:
    """One precision mode, ours and stock alternating (fp32_master runs ours first, pure_bf16 stock first)."""
    model = save_random_model("Qwen/Qwen3-1.7B", workdir / f"qwen3_{mode}", args.smoke)
    batch = str(args.rollout)
    extra = ["--dtype", MODES[mode], "--rollout_batch_size", batch, "--train_batch_size", batch]
    runs = {}
    for kind in ("ours", "stock") if mode == "fp32_master" else ("stock", "ours"):
        parsed, _ = recipe_args(SEED000, "countdown", model, str(workdir / f"{mode}_{kind}"), args, extra)
        runs[kind] = run_trainer(kind, parsed, "countdown")
    ours, stock = runs["ours"], runs["stock"]
    return {
        **runs,
        "step_time_ratio_ours_over_stock": ours["median_step_s"] / stock["median_step_s"],
        "peak_memory_ratio_ours_over_stock": (ours["peak_gib"] / stock["peak_gib"]) if stock["peak_gib"] else None,
    }


@part("precision_fp32_master", minutes=3.0)
def precision_fp32_master(args, workdir: Path) -> dict:
    return precision_run("fp32_master", args, workdir)


@part("precision_pure_bf16", minutes=3.0)
def precision_pure_bf16(args, workdir: Path) -> dict:
    return precision_run("pure_bf16", args, workdir)


@part("seed004", minutes=6.0)
def seed004_run(args, workdir: Path) -> dict:
    """Seed 004's recipe under a 24 GiB cap against the preflight's estimate of the same setup."""
    import importlib.util

    import torch

    from trl_ext.preflight import load_model_shape, plan_batches
    from trl_ext.preflight.memory import estimate_memory
    from trl_ext.preflight.plan import RunContext, training_setup
    from trl_ext.recipes import stated_values

    model = save_random_model("Qwen/Qwen2.5-1.5B-Instruct", workdir / "qwen25", args.smoke)
    extra = [] if importlib.util.find_spec("bitsandbytes") else ["--optim", "adamw_torch_fused"]
    if args.smoke:
        extra += ["--rollout_batch_size", "8", "--train_batch_size", "8", "--n_grpo_steps", "1"]
    parsed, argv = recipe_args(SEED004, "gsm8k", model, str(workdir / "seed004"), args, extra)
    cap = None
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        cap = min(1.0, args.cap_gib / total)
        torch.cuda.set_per_process_memory_fraction(cap)
    layout = plan_batches(stated_values(SEED004, argv), 1)
    context = RunContext(gpu_memory_gib=args.cap_gib, check_packages=False)
    setup = training_setup("gsm8k", *parsed, layout, context)
    shape, _ = load_model_shape("Qwen/Qwen2.5-1.5B-Instruct")
    estimate = estimate_memory(shape, setup)  # the full-size model: the smoke run's tiny one is not compared
    try:
        result = run_trainer("ours", parsed, "gsm8k")
    except torch.OutOfMemoryError as err:
        result = {"error": f"out of memory under the cap: {err}"[:400]}
    finally:
        if cap is not None:
            torch.cuda.set_per_process_memory_fraction(1.0)
    return {
        "cap_gib": args.cap_gib,
        "optim": str(getattr(parsed[1].optim, "value", parsed[1].optim)),
        "generator": setup.generator,
        "estimate_tensors_gib": estimate.tensors_bytes / 2**30,
        "estimate_peak_gib": estimate.peak_gib,
        "estimate_phases_gib": {k: estimate.phase_total(k) / 2**30 for k in estimate.phases},
        **result,
        "estimate_predicts_oom": estimate.peak_gib > args.cap_gib,
        "measured_over_estimate": (
            result["peak_gib"] / (estimate.tensors_bytes / 2**30)
            if result.get("peak_gib") and not args.smoke
            else None
        ),
    }


def padding_free_run(impl: str, model: str, batch: int, attention: str, args, output_dir: Path) -> dict:
    """One `--steps` run of stock `GRPOTrainer` or ours with `padding_free` on bench_trainer's fixed completions."""
    import torch
    from bench_trainer import PF_COMPLETION, FixedRollouts, id_reward
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model)
    dtype = "float32" if args.smoke else "bfloat16"
    common = dict(
        output_dir=str(output_dir), report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        log_level="error", max_steps=args.steps, learning_rate=1e-6, seed=0, use_cpu=args.smoke,
        bf16=not args.smoke, per_device_train_batch_size=batch, num_generations=min(8, batch),
        max_completion_length=PF_COMPLETION["high"], gradient_checkpointing=not args.smoke,
        model_init_kwargs={"dtype": dtype, "attn_implementation": attention},
    )  # fmt: skip
    if impl == "stock":
        config, trainer_cls = GRPOConfig(**common, loss_type="grpo", scale_rewards="group"), GRPOTrainer
    else:
        config = AblationGRPOConfig(
            **common, use_std_normalization=True, length_normalization="masked_mean", pg_loss_type="grpo_clip",
            padding_free=True,
        )  # fmt: skip
        trainer_cls = AblationGRPOTrainer
    prompts = [f"prompt {i}" for i in range(batch * (args.steps + 1))]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = trainer_cls(
        model, id_reward, args=config, train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer, rollout_func=FixedRollouts(len(tokenizer)),
    )  # fmt: skip
    timer = _step_timer()
    trainer.add_callback(timer)
    trainer.train()
    first = next(e for e in trainer.state.log_history if "loss" in e)
    result = {
        "trainer": impl,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "step_s": timer.times,
        "median_step_s": statistics.median(timer.times[1:] or timer.times),
        **{f"first_{key}": first.get(key) for key in ("loss", "grad_norm", "entropy")},
    }
    del trainer
    gc.collect()
    return result


@part("padding_free", minutes=5.0, default=False)
def padding_free_part(args, workdir: Path) -> dict:
    """Ours with `padding_free` vs stock `GRPOTrainer` (grpo pair), Qwen3-1.7B's config at random init, pure bf16,
    gradient checkpointing, per-device batch 8 and 16 of bench_trainer's fixed completions (prompts 100-150 tokens,
    completions log-normal median 250 clipped to [16, 1024]); sdpa, and flash-attention 2 when installed. Stock and
    ours alternate which goes first. On CUDA TRL's fused LM head already scores only the completion tokens, so the
    ratio is the packing's alone."""
    import importlib.util

    model = save_random_model(
        "Qwen/Qwen3-1.7B", workdir / "qwen3_pf", args.smoke, "float32" if args.smoke else "bfloat16"
    )
    attentions = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])
    out: dict = {"attentions": attentions, "cases": {}}
    for attention in attentions:
        for index, batch in enumerate((2,) if args.smoke else (8, 16)):
            order = ("stock", "ours_pf") if index % 2 == 0 else ("ours_pf", "stock")
            runs = {}
            for impl in order:
                try:
                    runs[impl] = padding_free_run(impl, model, batch, attention, args, workdir / f"pf_{impl}")
                except Exception as err:  # an out-of-memory stock run is a result too
                    runs[impl] = {"error": f"{type(err).__name__}: {err}"[:400]}
                finally:
                    _cleanup()
            ours, stock = runs["ours_pf"], runs["stock"]
            case = {**runs}
            if "median_step_s" in ours and "median_step_s" in stock:
                case["step_time_ratio_pf_over_stock"] = ours["median_step_s"] / stock["median_step_s"]
                case["first_grad_norm_abs_diff"] = abs(ours["first_grad_norm"] - stock["first_grad_norm"])
                if stock["peak_gib"]:
                    case["peak_memory_ratio_pf_over_stock"] = ours["peak_gib"] / stock["peak_gib"]
            out["cases"][f"{attention}, per-device batch {batch}"] = case
            ratios = {k: v for k, v in case.items() if "ratio" in k}
            print(f"padding_free {attention} batch {batch}: {json.dumps(ratios)}", flush=True)
    return out


# The CPU trainer benchmark as it stands, timed on the device's CPU cores (not in the default parts).
script_part("bench_trainer", "benchmarks/bench_trainer.py", results="benchmarks/results/trainer.json", minutes=8.0)


def _cleanup() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> dict:
    import platform

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=sorted(PARTS), help="Run this part (repeatable).")
    parser.add_argument("--list", action="store_true", help="List the parts and their expected minutes, and exit.")
    parser.add_argument("--wheels", action="store_true", help="Print the wheel download command and budget, exit.")
    parser.add_argument("--fresh", action="store_true", help="Start a new JSON instead of adding to the existing.")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny config, a couple of steps (no GPU numbers).")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per run (the first is not timed).")
    parser.add_argument("--rollout", type=int, default=64, help="Completions per rollout and per optimizer step.")
    parser.add_argument("--cap-gib", type=float, default=24.0, help="Memory cap of the seed-004 run.")
    parser.add_argument("--deadline-s", type=float, default=None, help="Seconds a script part may use (its timeout).")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    args = parser.parse_args(argv)
    if args.list:
        for name, p in PARTS.items():
            print(f"{name}: ~{p.minutes:g} min on one H100" + ("" if p.default else " (not a default part)"))
        return {}
    if args.wheels:
        budget = wheel_budget(tree_bytes())
        print(f"{DOWNLOAD} {' '.join(WHEELS)}")
        print(json.dumps(budget))
        return budget
    if args.smoke:
        args.steps, args.rollout = min(args.steps, 2), 8
    elif not torch.cuda.is_available():
        parser.error("no GPU visible: run with --smoke for the CPU check of this script")
    args.deadline = time.monotonic() + args.deadline_s if args.deadline_s else None
    names = args.part or [name for name, p in PARTS.items() if p.default]
    output = Path(args.output)
    report = {} if args.fresh or not output.is_file() else json.loads(output.read_text())
    report.update(
        benchmark="ours vs stock TRL on seed000_drgrpo_l256, per precision mode; seed004 under a memory cap",
        smoke=args.smoke,
        device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
        torch=torch.__version__,
        steps=args.steps,
        rollout=args.rollout,
    )
    with tempfile.TemporaryDirectory() as tmp:
        run_parts(names, args, Path(tmp), output, report, _cleanup)
    for mode in ("fp32_master", "pure_bf16"):
        runs = report["parts"].get(f"precision_{mode}", {})
        if runs.get("status") == "ok":
            print(
                f"{mode}: step time ours/stock {runs['step_time_ratio_ours_over_stock']:.3f}, peak memory ours/stock "
                f"{runs['peak_memory_ratio_ours_over_stock'] or float('nan'):.3f}"
            )
    print(f"wrote {output}")
    return report


if __name__ == "__main__":
    main()
