"""GPU check kit: our trainer against stock TRL on one H100, its key numbers in one command of at most 8 minutes.

For a few minutes on one GPU (one H100). Everything is built offline and no vLLM is needed. Every timed step
trains on fixed completions (benchmarks/_fixed_rollouts.py through TRL's `rollout_func`: no generation; each step's
record shows one rollout call and no `generate` call), so the ours / stock ratios compare the training step. Models are
random-init from the configs in `trl_ext.preflight.KNOWN_CONFIGS`, built on the GPU. The default run (`--plan` prints
it with the expected seconds of each part and how they were derived, benchmarks/_gpu_plan.py; `--list` lists every
part):

- `precision_fp32_master`, `precision_pure_bf16`: Qwen3-1.7B's config trains `--steps` GRPO steps of
  recipes/countdown/qwen3_1.7b_drgrpo_l256.yaml (parsed by the recipe parser, `--rollout` completions per step) in that
  precision mode (`fp32_master`: dtype float32 + bf16 autocast; `pure_bf16`: dtype bfloat16), with
  `AblationGRPOTrainer` and with stock `trl.GRPOTrainer` on the same config (loss_type dr_grpo, scale_rewards none),
  alternating which goes first. Per run: peak GPU memory (`torch.cuda.max_memory_allocated`), median step time after
  the first step, the first step's loss; the ratios ours / stock; the preflight's estimate of the training phases.
  The two parts together are the fp32-master vs pure-bf16 pair (`pairs` in the JSON).
- `padding_free`: ours with `padding_free` against stock `trl.GRPOTrainer` (the grpo pair) on Qwen3-1.7B's config,
  pure bf16, gradient checkpointing, per-device batch 8 and 16 of bench_trainer's completion lengths (prompts
  100-150 tokens, completions log-normal median 250 clipped to [16, 1024]); sdpa, and flash-attention 2 when
  installed: step time and peak memory ratios, the first step's loss and grad norm of each.
- `gsm8k_24gb`: recipes/gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml (Qwen2.5-1.5B-Instruct's config) under
  `torch.cuda.set_per_process_memory_fraction(24 GiB / total)`, one optimizer step at the recipe's batch sizes with
  every row at the longest prompt and `max_completion_length` (the rows the estimate assumes), measured peak against
  the preflight's estimate of the training phases (generation is not run, so its phase is not compared). 8-bit
  AdamW needs bitsandbytes (its wheel travels); without it fused fp32 AdamW, whose estimate exceeds 24 GiB: the
  out-of-memory error is then the expected result (the JSON says whether it was predicted).
- `bench_trainer` (not a default part): the CPU trainer benchmark in its own process.

The run keeps to `--budget-s` (480 s, from this script's start, the wheels' install included): a part or trainer run
whose expected seconds no longer fit is skipped with a message, a run still going at the deadline stops after its step,
and the JSON is written after every part. It goes to `--output` (default benchmarks/results/gpu_check.json); an
existing file keeps the parts of earlier calls (`--fresh` starts over). `--smoke` runs the same code on the CPU with a
tiny config (tests/test_gpu_check.py); its numbers are not GPU numbers. The one command (docs/gpu.md, "GPU check kit"):

    python3 benchmarks/gpu_check.py --wheelhouse .whl      # .whl: the wheels `--wheels` says to download
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _fixed_rollouts import PF_COMPLETION, PF_PROMPT_TOKENS, FixedRollouts, mean_completion_tokens
from _gpu_kit import (
    DOWNLOAD,
    PARTS,
    WHEELS,
    install_wheels,
    part,
    run_fits,
    run_parts,
    script_part,
    tree_bytes,
    wheel_budget,
    write_json,
)
from _gpu_plan import (
    BUDGET_S,
    SETUP_S,
    PartPlan,
    plan_lines,
    recipe_value,
    shape_of,
    task_prompt_tokens,
    training_run,
)
from _gpu_runs import (
    SMOKE_PROMPT_TOKENS,
    build_model,
    cleanup,
    completions_within,
    load_tokenizer,
    recipe_args,
    recipe_run,
    train_timed,
    training_estimate,
)

ROOT = Path(__file__).resolve().parents[1]
COUNTDOWN_L256 = ROOT / "recipes" / "countdown" / "qwen3_1.7b_drgrpo_l256.yaml"
GSM8K_24GB = ROOT / "recipes" / "gsm8k" / "qwen2.5_1.5b_instruct_grpo_24gb.yaml"
QWEN3, QWEN25 = "Qwen/Qwen3-1.7B", "Qwen/Qwen2.5-1.5B-Instruct"
MODES = {"fp32_master": "float32", "pure_bf16": "bfloat16"}
ADAMW = {"fp32_master": "adamw_fp32", "pure_bf16": "adamw_bf16"}
PF_BATCHES = (8, 16)


def _run_or_record(what: str, expected_s: float, args, run) -> dict:
    """`run()`'s result, or why it did not run (the budget) or what it raised: one trainer run's out-of-memory error
    or crash is a result, and the part's other runs go on."""
    skipped = run_fits(args, expected_s, what)
    if skipped:
        print(skipped, flush=True)
        return {"skipped": skipped}
    try:
        return run()
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[:400]}
    finally:
        cleanup()


def _order(mode: str) -> tuple[str, str]:
    return ("ours", "stock") if mode == "fp32_master" else ("stock", "ours")


def precision_plan(mode: str, args) -> PartPlan:
    shape, limit = shape_of(QWEN3), recipe_value(COUNTDOWN_L256, "max_completion_length")
    micro = recipe_value(COUNTDOWN_L256, "per_device_train_batch_size")
    runs = tuple(
        training_run(kind, shape, args.rollout, PF_PROMPT_TOKENS[1] + limit, micro, args.steps, mode, ADAMW[mode])
        for kind in _order(mode)
    )
    note = (
        f"ours, stock: qwen3_1.7b_drgrpo_l256, {args.rollout} completions/step padded to {PF_PROMPT_TOKENS[1]} + "
        f"{limit} tokens, micro-batch {micro}, Qwen3-1.7B ({shape.params / 1e9:.2f}B), {mode}"
    )
    return PartPlan(note, runs)


def precision_run(mode: str, args, workdir: Path) -> dict:
    """One precision mode, ours and stock alternating (fp32_master runs ours first, pure_bf16 stock first)."""
    batch = str(args.rollout)
    extra = ["--dtype", MODES[mode], "--rollout_batch_size", batch, "--train_batch_size", batch]
    runs: dict = {}
    for kind, plan in zip(_order(mode), precision_plan(mode, args).runs, strict=True):
        run = functools.partial(
            recipe_run,
            kind,
            COUNTDOWN_L256,
            "countdown",
            QWEN3,
            MODES[mode],
            args,
            workdir,
            steps=args.steps,
            extra=extra,
        )
        runs[kind] = _run_or_record(f"{mode} {kind}", plan.seconds, args, run)
    parsed, argv = recipe_args(COUNTDOWN_L256, "countdown", QWEN3, str(workdir), args, args.steps, extra)
    out = {**runs, **training_estimate("countdown", parsed, argv, COUNTDOWN_L256, QWEN3, _gpu_gib())}
    ours, stock = runs["ours"], runs["stock"]
    if "median_step_s" in ours and "median_step_s" in stock:
        out["step_time_ratio_ours_over_stock"] = ours["median_step_s"] / stock["median_step_s"]
        out["peak_memory_ratio_ours_over_stock"] = ours["peak_gib"] / stock["peak_gib"] if stock["peak_gib"] else None
        out["measured_over_estimate"] = ours["peak_gib"] / out["estimate_training_gib"] if ours["peak_gib"] else None
    return out


@part("precision_fp32_master", expect=lambda args: precision_plan("fp32_master", args))
def precision_fp32_master(args, workdir: Path) -> dict:
    return precision_run("fp32_master", args, workdir)


@part("precision_pure_bf16", expect=lambda args: precision_plan("pure_bf16", args))
def precision_pure_bf16(args, workdir: Path) -> dict:
    return precision_run("pure_bf16", args, workdir)


def padding_free_plan(args) -> PartPlan:
    shape, high = shape_of(QWEN3), PF_COMPLETION["high"]
    packed = sum(PF_PROMPT_TOKENS) / 2 + mean_completion_tokens()
    runs = []
    for batch in PF_BATCHES:
        runs.append(training_run(f"stock, batch {batch}", shape, batch, PF_PROMPT_TOKENS[1] + high, batch,
                                 args.steps, "pure_bf16", "adamw_bf16"))  # fmt: skip
        runs.append(training_run(f"ours padding_free, batch {batch}", shape, batch, round(packed), batch,
                                 args.steps, "pure_bf16", "adamw_bf16"))  # fmt: skip
    note = (
        f"stock padded to {PF_PROMPT_TOKENS[1]} + {high} tokens (an upper bound), ours packed to the expected "
        f"{packed:.0f} real tokens per row; Qwen3-1.7B, pure bf16, sdpa"
    )
    return PartPlan(note, tuple(runs))


def padding_free_run(impl: str, batch: int, attention: str, args, output_dir: Path) -> dict:
    """One `--steps` run of stock `GRPOTrainer` (grpo pair) or ours with `padding_free` on fixed completions."""
    from datasets import Dataset

    from trl_ext import AblationGRPOConfig

    common = dict(
        output_dir=str(output_dir), report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        log_level="error", max_steps=args.steps, learning_rate=1e-6, seed=0, use_cpu=args.smoke,
        bf16=not args.smoke, per_device_train_batch_size=batch, num_generations=min(8, batch),
        max_completion_length=8 if args.smoke else PF_COMPLETION["high"], gradient_checkpointing=not args.smoke,
        use_std_normalization=True, length_normalization="masked_mean", pg_loss_type="grpo_clip",
    )  # fmt: skip
    config = AblationGRPOConfig(**common, padding_free=impl != "stock")  # stock: TRL's fields of it (grpo, group)
    prompts = SMOKE_PROMPT_TOKENS if args.smoke else PF_PROMPT_TOKENS
    rollouts = FixedRollouts(
        len(load_tokenizer()), prompt_tokens=prompts, completion=completions_within(config.max_completion_length)
    )
    dataset = Dataset.from_dict({"prompt": [f"prompt {i}" for i in range(batch * (args.steps + 1))]})
    dtype = "float32" if args.smoke else "bfloat16"
    model = functools.partial(build_model, QWEN3, dtype, args.smoke, attention)
    return train_timed("stock" if impl == "stock" else "ours_pf", config, model, dataset, rollouts, args.deadline)


@part("padding_free", expect=padding_free_plan)
def padding_free_part(args, workdir: Path) -> dict:
    """Ours with `padding_free` vs stock `GRPOTrainer`, alternating which goes first. On CUDA TRL's fused LM head
    already scores only the completion tokens, so the ratio is the packing's alone."""
    attentions = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])
    out: dict = {"attentions": attentions, "cases": {}}
    plans = iter(padding_free_plan(args).runs * len(attentions))
    for attention in attentions:
        for index, batch in enumerate((2,) if args.smoke else PF_BATCHES):
            runs = {}
            expected = {"stock": next(plans).seconds, "ours_pf": next(plans).seconds}
            for impl in ("stock", "ours_pf") if index % 2 == 0 else ("ours_pf", "stock"):
                run = functools.partial(padding_free_run, impl, batch, attention, args, workdir / f"pf_{impl}")
                what = f"padding_free {attention} batch {batch} {impl}"
                runs[impl] = _run_or_record(what, expected[impl], args, run)
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


def gsm8k_24gb_plan(args) -> PartPlan:
    shape, limit = shape_of(QWEN25), recipe_value(GSM8K_24GB, "max_completion_length")
    rows, micro = (
        recipe_value(GSM8K_24GB, "rollout_batch_size"),
        recipe_value(GSM8K_24GB, "per_device_train_batch_size"),
    )
    width = task_prompt_tokens("gsm8k") + limit
    run = training_run("ours", shape, rows, width, micro, 1, "fp32_master", "adamw_8bit")
    note = f"ours, one step of {rows} rows x {width} tokens, micro-batch {micro}, fp32 master, 8-bit AdamW"
    return PartPlan(note, (run,))


@part("gsm8k_24gb", expect=gsm8k_24gb_plan)
def gsm8k_24gb_run(args, workdir: Path) -> dict:
    """The GSM8K report's recipe under a 24 GiB cap against the preflight's estimate of the same setup."""
    import torch

    extra = [] if _imports("bitsandbytes") else ["--optim", "adamw_torch_fused"]
    if args.smoke:
        extra += ["--rollout_batch_size", "8", "--train_batch_size", "8"]
    parsed, argv = recipe_args(GSM8K_24GB, "gsm8k", QWEN25, str(workdir / "gsm8k_24gb"), args, 1, extra)
    estimate = training_estimate("gsm8k", parsed, argv, GSM8K_24GB, QWEN25, args.cap_gib)
    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib / _gpu_gib()))
    prompt = (task_prompt_tokens("gsm8k"),) * 2
    try:
        result = recipe_run(
            "ours", GSM8K_24GB, "gsm8k", QWEN25, "float32", args, workdir, steps=1, extra=extra, all_at_limit=True,
            prompt_tokens=prompt,
        )  # fmt: skip
    except torch.OutOfMemoryError as err:
        result = {"error": f"out of memory under the cap: {err}"[:400]}
    training = estimate["estimate_training_gib"]
    return {
        "cap_gib": args.cap_gib,
        "optim": str(getattr(parsed[1].optim, "value", parsed[1].optim)),
        **estimate,
        **result,
        "estimate_predicts_oom": estimate["estimate_training_peak_gib"] > args.cap_gib,
        "measured_over_estimate": result["peak_gib"] / training if result.get("peak_gib") else None,
    }


# The CPU trainer benchmark as it stands, timed on the GPU machine's CPU cores (not in the default parts).
script_part("bench_trainer", "benchmarks/bench_trainer.py", results="benchmarks/results/trainer.json", seconds=480)


def _imports(module: str) -> bool:
    """Whether `module` imports here (a wheel that travelled but lacks this CUDA's binary counts as absent)."""
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def _gpu_gib() -> float:
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 80.0


def pairs(parts: dict) -> dict:
    """The key ratios: ours / stock per precision mode, fp32 master / pure bf16 per trainer, padding-free / stock."""
    out: dict = {}
    runs = {m: parts.get(f"precision_{m}", {}) for m in MODES}
    for mode, entry in runs.items():
        if "step_time_ratio_ours_over_stock" in entry:
            out[f"{mode}: ours / stock"] = {
                "step_time": entry["step_time_ratio_ours_over_stock"],
                "peak_memory": entry["peak_memory_ratio_ours_over_stock"],
            }
    for kind in ("ours", "stock"):
        fp32, bf16 = runs["fp32_master"].get(kind, {}), runs["pure_bf16"].get(kind, {})
        if "median_step_s" in fp32 and "median_step_s" in bf16:
            out[f"fp32_master / pure_bf16: {kind}"] = {
                "step_time": fp32["median_step_s"] / bf16["median_step_s"],
                "peak_memory": fp32["peak_gib"] / bf16["peak_gib"] if bf16["peak_gib"] else None,
            }
    for case, entry in parts.get("padding_free", {}).get("cases", {}).items():
        if "step_time_ratio_pf_over_stock" in entry:
            out[f"padding_free / stock: {case}"] = {
                "step_time": entry["step_time_ratio_pf_over_stock"],
                "peak_memory": entry.get("peak_memory_ratio_pf_over_stock"),
            }
    return out


DEFAULT_OUTPUT = str(ROOT / "benchmarks" / "results" / "gpu_check.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=sorted(PARTS), help="Run this part (repeatable).")
    parser.add_argument("--plan", action="store_true", help="Print the run's parts and expected seconds, and exit.")
    parser.add_argument("--list", action="store_true", help="List every part's expected seconds, and exit.")
    parser.add_argument("--wheels", action="store_true", help="Print the wheel download command and budget, exit.")
    parser.add_argument("--wheelhouse", help="Install the wheels in this folder first (no index, no dependencies).")
    parser.add_argument("--fresh", action="store_true", help="Start a new JSON instead of adding to the existing.")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny config, a couple of steps (no GPU numbers).")
    parser.add_argument("--steps", type=int, default=5, help="GRPO steps per run (the first is not timed).")
    parser.add_argument("--rollout", type=int, default=64, help="Completions per rollout and per optimizer step.")
    parser.add_argument("--cap-gib", type=float, default=24.0, help="Memory cap of the the GSM8K report run.")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="Seconds the whole run may take.")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="The JSON (default: %(default)s).")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.rollout = min(args.steps, 2), 8
    return args


def main(argv: list[str] | None = None) -> dict:
    started = time.monotonic()
    args = parse_args(argv)
    args.deadline = started + args.budget_s
    if args.wheels:
        budget = wheel_budget(tree_bytes())
        print(f"{DOWNLOAD} {' '.join(WHEELS)}")
        print(json.dumps(budget))
        return budget
    if importlib.util.find_spec("trl_ext") is None:  # a copy of the repository, not installed
        sys.path.insert(0, str(ROOT))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    names = args.part or [name for name, p in PARTS.items() if p.default]
    plans = {name: PARTS[name].expect(args) for name in (sorted(PARTS) if args.list else names)}
    if args.plan or args.list:
        print("\n".join(plan_lines(plans, None if args.list else args.budget_s)))
        return {"setup_s": SETUP_S, "parts": {k: p.seconds for k, p in plans.items()}, "budget_s": args.budget_s}
    setup = {"wheels": install_wheels(Path(args.wheelhouse))} if args.wheelhouse else {}
    for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TRL_EXPERIMENTAL_SILENCE", "1")):
        os.environ.setdefault(key, value)
    import platform

    import torch

    import trl_ext.grpo.trainer  # noqa: F401  (the imports are set-up: timed here, not in the first part)

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
    elif not args.smoke:
        raise SystemExit("no GPU visible: run with --smoke for the CPU check of this script")
    setup.update(seconds=time.monotonic() - started, expected_s=SETUP_S)
    output = Path(args.output)
    report = {} if args.fresh or not output.is_file() else json.loads(output.read_text())
    report.update(
        benchmark="ours vs stock TRL on fixed completions: precision modes, padding-free, gsm8k_24gb under a cap",
        smoke=args.smoke,
        device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
        torch=torch.__version__,
        steps=args.steps,
        rollout=args.rollout,
        budget_s=args.budget_s,
        setup=setup,
    )
    print(f"set-up {setup['seconds']:.0f} s (expected {SETUP_S:.0f}); parts {names}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        run_parts(names, args, Path(tmp), output, report, cleanup)
    report.update(pairs=pairs(report["parts"]), total_s=time.monotonic() - started)
    write_json(output, report)
    for name, ratios in report["pairs"].items():
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items() if v is not None))
    print(f"total {report['total_s']:.0f} s of {args.budget_s:.0f}; wrote {output}")
    return report


if __name__ == "__main__":
    main()
