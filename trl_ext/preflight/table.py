"""The preflight of every shipped accelerate config x every shipped GRPO recipe at the GPU counts each config is
meant for: what `trl-ext launch --dry-run` would plan, as rows (tests/test_preflight_table.py) or a Markdown table.

    python -m trl_ext.preflight.table [--gpu-memory-gb 80] [--json out.json]

Server-mode recipes need a GPU beyond the training ones, so a config's one-GPU count applies to colocated recipes
only (`trl-ext launch` refuses the other pairs with "no free GPU left for the vLLM server").
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

# accelerate config -> the GPU counts of a node it is written for (its comment says the same).
MEANT_FOR: dict[str, tuple[int, ...]] = {
    "cpu.yaml": (1,),  # training on the CPU; a server-mode recipe's server on GPU 0
    "single_gpu.yaml": (1, 2, 8),  # pinned to GPU 0; the server on the others
    "vllm_server_gpu0_train_gpu1.yaml": (2, 8),
    "multi_gpu.yaml": (5, 8),  # 4 training processes, the server on the rest
    "zero2.yaml": (5, 8),
    "zero3.yaml": (5, 8),
}
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class TableRow:
    """One planned pair: the numbers a reader checks, or the error."""

    config: str
    recipe: str
    num_gpus: int
    processes: int = 0
    train_gpus: str = ""
    server_gpus: str = ""
    per_device: int = 0
    ga: int = 0
    max_steps: int = 0
    peak_gib: float = 0.0
    peak_phase: str = ""
    error: str = ""


def grpo_recipes(root: Path = ROOT) -> list[str]:
    """Every GRPO recipe YAML under recipes/<task>/ for a task of `trl_ext.recipes.TASK_DEFAULTS` (SFT, the shared
    root defaults and the expert-iteration recipes, which name their `task:`, aside)."""
    from trl_ext.recipes import TASK_DEFAULTS, load_recipe_yaml

    recipes = root / "recipes"
    return sorted(
        p.relative_to(recipes).as_posix()
        for p in recipes.rglob("*.yaml")
        if p.parent.name in TASK_DEFAULTS and "task" not in load_recipe_yaml(p)
    )


def pairs(root: Path = ROOT) -> Iterator[tuple[str, str, int]]:
    """(accelerate config, recipe, GPU count) for every pair at every count its config is meant for."""
    from trl_ext.launch.configs import read_recipe_serving

    for config, counts in MEANT_FOR.items():
        for recipe in grpo_recipes(root):
            server = read_recipe_serving(root / "recipes" / recipe).server_mode
            for count in counts:
                if server and config == "single_gpu.yaml" and count == 1:
                    continue  # a server needs its own GPU
                yield config, recipe, count


def plan_row(config: str, recipe: str, num_gpus: int, gpu_memory_gb: float, workdir: Path, root: Path = ROOT):
    """Plan one pair through `trl_ext.launch.plan_launch` (packages not required: planning, not running)."""
    from trl_ext.launch import plan_launch
    from trl_ext.launch.configs import LaunchError

    task = recipe.split("/")[0]
    out = workdir / f"{Path(config).stem}_{recipe.replace('/', '_')}_{num_gpus}"
    try:
        plan = plan_launch(
            root / "accelerate_configs" / config,
            root / "recipes" / f"{task}.py",
            root / "recipes" / recipe,
            ["--output_dir", str(out)],
            num_gpus=num_gpus,
            gpu_memory_gb=gpu_memory_gb,
            check_packages=False,
            log_dir=workdir / "logs",
        )
    except LaunchError as exc:
        return TableRow(config, recipe, num_gpus, error=str(exc)), None
    report = plan.report
    layout, estimate = report.layout, report.estimate
    row = TableRow(
        config,
        recipe,
        num_gpus,
        processes=layout.world_size,
        train_gpus=",".join(plan.train_gpus) or "CPU",
        server_gpus=",".join(plan.server_gpus),
        per_device=layout.per_device_train_batch_size,
        ga=layout.gradient_accumulation_steps,
        max_steps=layout.max_steps,
        peak_gib=round(estimate.peak_gib, 2) if estimate else 0.0,
        peak_phase=estimate.peak_phase if estimate else "",
    )
    return row, plan


def table(gpu_memory_gb: float = 80.0, root: Path = ROOT) -> list[TableRow]:
    with tempfile.TemporaryDirectory() as tmp:
        return [plan_row(c, r, n, gpu_memory_gb, Path(tmp), root)[0] for c, r, n in pairs(root)]


def markdown(rows: list[TableRow]) -> str:
    lines = [
        "| accelerate config | recipe | GPUs | processes | train / server GPUs | per-device x GA | max_steps | "
        "peak GiB (phase) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.error:
            lines.append(f"| {r.config} | {r.recipe} | {r.num_gpus} | FAILED: {r.error.splitlines()[-1]} |||||")
            continue
        lines.append(
            f"| {r.config} | {r.recipe} | {r.num_gpus} | {r.processes} | {r.train_gpus} / {r.server_gpus or '-'} | "
            f"{r.per_device} x {r.ga} | {r.max_steps} | {r.peak_gib:.1f} ({r.peak_phase}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-memory-gb", type=float, default=80.0, help="Memory limit per training GPU (GiB).")
    parser.add_argument("--json", default=None, help="Also write the rows to this JSON file.")
    args = parser.parse_args(argv)
    rows = table(args.gpu_memory_gb)
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
