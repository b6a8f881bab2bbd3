"""Precision modes at the recipes' optimizer settings: how much of an AdamW update survives, and what each costs.

Modes (docs/gpu.md):

- `fp32_master`: fp32 weights and AdamW states, the forward multiplying with their bf16 cast (autocast); what the
  GPU recipes train with (`dtype: float32`, `bf16: true`), and what DeepSpeed's bf16 mode does with its fp32 master.
- `pure_bf16`: bf16 weights, gradients and AdamW states (`dtype: bfloat16` without DeepSpeed: the courses' setting
  and the `*_pure_bf16.yaml` recipes).

Weights, all starting from the same bf16-representable values (checkpoints ship in bf16): (a) a toy
2048 x 2048 matrix with std 0.02; (b) Qwen3-1.7B's decoder-layer tensors with their real shapes from its config
(hidden 2048, 16 heads, 8 KV heads, head_dim 128, intermediate 6144) at transformers' initialisation (linear weights
N(0, 0.02), RMSNorm weights 1.0); entries are iid at initialisation, so the first `--rows` output rows of each linear
layer stand for the whole matrix. Gradients: fresh N(0, 1) every step (seeded), clipped to the recipe's
`max_grad_norm` as the HF Trainer does. Optimizer: `torch.optim.AdamW` with the lr, betas, eps and weight decay of
recipes/grpo_defaults.yaml. Reference: the same trajectory in float64.

Reported after each of `--steps`, per mode and tensor group: the share of entries whose stored value changed, the
share whose bf16 view (what the forward sees) changed, and how much of the fp64 reference's displacement
`||w_k - w_0||` the mode realised (1.0: the update arrived whole) and its distance from the reference, relative to
that displacement. Memory: `trl_ext.preflight.estimate_memory` for Qwen3-1.7B, numbers from its config, on the
Assignment 2 Dr.GRPO L256 recipe (one training GPU, vLLM server mode). CPU only; writes
benchmarks/results/precision.json.

    python benchmarks/bench_precision.py                  # 2-13 minutes on 2 cores (fp64 reference, 100 steps)
    python benchmarks/bench_precision.py --steps 1,5,20,100 --rows 128
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "precision.json"
RECIPE = ROOT / "recipes" / "countdown" / "qwen3_1.7b_drgrpo_l256.yaml"
MODEL = "Qwen/Qwen3-1.7B"
MODES = ("fp32_master", "pure_bf16")


def optimizer_settings(recipe: Path) -> dict:
    """lr, betas, eps, weight decay and gradient clipping of a recipe (its `base:` chain resolved)."""
    from trl_ext.recipes import load_recipe_yaml

    values = load_recipe_yaml(recipe)
    return {
        "optim": values.get("optim", "adamw_torch"),
        "lr": float(values["learning_rate"]),
        "betas": (float(values["adam_beta1"]), float(values["adam_beta2"])),
        "eps": float(values.get("adam_epsilon", 1e-8)),
        "weight_decay": float(values.get("weight_decay", 0.0)),
        "max_grad_norm": float(values.get("max_grad_norm", 1.0)),
    }


def initial_tensors(rows: int, seed: int) -> dict[str, dict]:
    """`{group: {name: float64 tensor}}`, values rounded to bf16 (a bf16 checkpoint loaded in any dtype)."""
    import torch

    from trl_ext.preflight import load_model_shape

    shape, _ = load_model_shape(MODEL)
    gen = torch.Generator().manual_seed(seed)

    def normal(n_out: int, n_in: int) -> torch.Tensor:
        return (torch.randn(n_out, n_in, generator=gen, dtype=torch.float64) * 0.02).bfloat16().double()

    layer = {name: normal(min(rows, n_out), n_in) for name, (n_in, n_out) in shape.linear_shapes.items()}
    norms = {
        "input_layernorm": torch.ones(shape.hidden_size, dtype=torch.float64),
        "post_attention_layernorm": torch.ones(shape.hidden_size, dtype=torch.float64),
        "q_norm": torch.ones(shape.head_dim, dtype=torch.float64),
        "k_norm": torch.ones(shape.head_dim, dtype=torch.float64),
    }
    return {"toy 2048x2048 std 0.02": {"w": normal(2048, 2048)}, "Qwen3-1.7B linear": layer, "Qwen3-1.7B norms": norms}


def run_mode(mode: str, init: dict, settings: dict, steps: list[int], seed: int) -> dict:
    """Train every tensor group with AdamW for max(steps) steps; measure at each of `steps`."""
    import torch

    dtype = {"reference": torch.float64, "fp32_master": torch.float32, "pure_bf16": torch.bfloat16}[mode]
    params = {g: {n: t.to(dtype).clone().requires_grad_(True) for n, t in ts.items()} for g, ts in init.items()}
    flat = [p for ts in params.values() for p in ts.values()]
    opt = torch.optim.AdamW(
        flat,
        lr=settings["lr"],
        betas=settings["betas"],
        eps=settings["eps"],
        weight_decay=settings["weight_decay"],
        fused="fused" in settings["optim"],
    )
    gen = torch.Generator().manual_seed(seed + 1)
    snapshots = {}
    for step in range(1, max(steps) + 1):
        for p in flat:  # same gradients in every mode: drawn in float64, then cast
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype)
        torch.nn.utils.clip_grad_norm_(flat, settings["max_grad_norm"])
        opt.step()
        if step in steps:
            snapshots[step] = {g: {n: p.detach().double().clone() for n, p in ts.items()} for g, ts in params.items()}
    return snapshots


def measure(init: dict, trajectory: dict, reference: dict, steps: list[int]) -> dict:
    out = {}
    for step in steps:
        rows = {}
        for group, tensors in init.items():
            total = changed = changed_view = 0
            moved2 = ref2 = off2 = 0.0
            for name, w0 in tensors.items():
                w, ref = trajectory[step][group][name], reference[step][group][name]
                total += w0.numel()
                changed += int((w != w0).sum())
                changed_view += int((w.bfloat16() != w0.bfloat16()).sum())
                moved2 += float(((w - w0) ** 2).sum())
                ref2 += float(((ref - w0) ** 2).sum())
                off2 += float(((w - ref) ** 2).sum())
            rows[group] = {
                "entries": total,
                "changed": changed / total,
                "bf16_view_changed": changed_view / total,
                "displacement_vs_fp64": (moved2**0.5) / (ref2**0.5) if ref2 else None,
                "error_vs_fp64": (off2**0.5) / (ref2**0.5) if ref2 else None,
            }
        out[step] = rows
    return out


def memory_rows() -> list[dict]:
    """Peak-memory estimate of the Assignment 2 Dr.GRPO L256 recipe on one GPU for each precision / optimizer."""
    from trl_ext.preflight import TrainingSetup, estimate_memory, load_model_shape

    shape, source = load_model_shape(MODEL)
    base = TrainingSetup(
        micro_batch=2, prompt_tokens=266, completion_tokens=256, eval_batch=128, generator="server", world_size=1
    )
    cases = {
        "fp32_master, AdamW (foreach)": base,
        "fp32_master, AdamW fused": replace(base, optim="adamw_torch_fused"),
        "fp32_master, 8-bit AdamW": replace(base, optim="adamw_bnb_8bit"),
        "pure_bf16, AdamW (foreach)": replace(base, precision="pure_bf16"),
        "DeepSpeed ZeRO-2 bf16 + fp32 master, 4 GPUs": replace(base, zero_stage=2, world_size=4),
        "DeepSpeed ZeRO-3 bf16 + fp32 master, 4 GPUs": replace(base, zero_stage=3, world_size=4),
    }
    rows = []
    for name, setup in cases.items():
        estimate = estimate_memory(shape, setup)
        train = estimate.phases["train"]
        rows.append(
            {
                "mode": name,
                "params": shape.params,
                "config_source": source,
                "weights_gib": train["weights"] / 2**30,
                "gradients_gib": train["gradients"] / 2**30,
                "optimizer_states_gib": train["optimizer states"] / 2**30,
                "peak_gib": estimate.peak_gib,
                "peak_phase": estimate.peak_phase,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1,5,20,100", help="Comma-separated step counts to measure after.")
    parser.add_argument("--rows", type=int, default=256, help="Output rows kept of each Qwen3 linear layer.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = sorted({int(s) for s in args.steps.split(",")})
    settings = optimizer_settings(RECIPE)
    start = time.perf_counter()
    init = initial_tensors(args.rows, args.seed)
    reference = run_mode("reference", init, settings, steps, args.seed)
    results = {
        mode: measure(init, run_mode(mode, init, settings, steps, args.seed), reference, steps) for mode in MODES
    }
    report = {
        "benchmark": "share of weights an AdamW update changes, fp32 master vs pure bf16, and the memory of each",
        "optimizer": {**settings, "recipe": str(RECIPE.relative_to(ROOT))},
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": args.threads},
        "rows_per_linear": args.rows,
        "update": {mode: {str(k): v for k, v in r.items()} for mode, r in results.items()},
        "memory_qwen3_1_7b": memory_rows(),
        "seconds": time.perf_counter() - start,
    }
    print(
        f"AdamW lr {settings['lr']:g}, betas {settings['betas']}, eps {settings['eps']:g}, "
        f"clip {settings['max_grad_norm']}"
    )
    header = ("tensors", "step", "mode", "changed", "bf16 view", "moved/fp64", "err/fp64")
    print("{:26s} {:>5s} {:12s} {:>8s} {:>9s} {:>10s} {:>9s}".format(*header))
    for group in init:
        for step in steps:
            for mode in MODES:
                row = results[mode][step][group]
                print(
                    f"{group:26s} {step:5d} {mode:12s} {row['changed']:8.1%} {row['bf16_view_changed']:9.1%} "
                    f"{row['displacement_vs_fp64']:10.3f} {row['error_vs_fp64']:9.3f}"
                )
    print(
        f"\nmemory, {MODEL} on recipes/countdown/qwen3_1.7b_drgrpo_l256.yaml (one training GPU, vLLM server mode), GiB"
    )
    for row in report["memory_qwen3_1_7b"]:
        print(
            f"  {row['mode']:46s} weights {row['weights_gib']:5.2f}  gradients {row['gradients_gib']:5.2f}  "
            f"states {row['optimizer_states_gib']:5.2f}  peak {row['peak_gib']:5.1f} ({row['peak_phase']})"
        )
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out} ({report['seconds']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
