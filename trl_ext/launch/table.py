"""The planning table: shipped accelerate configs x GRPO recipes x the node sizes each config is written for, as
`trl-ext launch --dry-run` plans them (tests/test_preflight_table.py), printed as Markdown.

    python -m trl_ext.launch.table [--models] [--gpu-memory-gb 80] [--json out.json]

`--models` prints one recipe per shipped model at every layout, with the server's tensor and data parallel sizes
(the TP `trl_ext.launch.tensor_parallel` picks: the smallest that shards the model with at most 4 B parameters per
GPU, 1 for every shipped model; DP 1, as TRL 1.16's server needs for dense models). Server-mode
recipes need a GPU beyond the training ones, so a config's one-GPU layout applies to colocated recipes only.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from trl_ext.launch.configs import LaunchError, read_recipe_serving
from trl_ext.launch.launcher import plan_launch
from trl_ext.recipes import TASK_DEFAULTS, load_recipe_yaml, recipe_script

# accelerate config -> its layouts: (GPUs on the node, `--num-processes` or None for the config's own).
MEANT_FOR: dict[str, tuple[tuple[int, int | None], ...]] = {
    "cpu.yaml": ((1, None),),  # training on the CPU; a server-mode recipe's server on GPU 0
    "cpu_server.yaml": ((1, None),),  # the same on a GPU node (without one, the server too runs on the CPU)
    "single_gpu.yaml": ((1, None), (2, None), (4, None), (8, None), (12, None)),  # pinned to GPU 0
    "vllm_server_gpu0_train_gpu1.yaml": ((2, None), (4, None), (8, None), (12, None)),
    # 4 training processes, the server on the rest; a 4-GPU node trains on 2 (`--num-processes 2`)
    "multi_gpu.yaml": ((4, 2), (5, None), (8, None), (12, None)),
    "zero2.yaml": ((4, 2), (5, None), (8, None), (12, None)),
    "zero3.yaml": ((4, 2), (5, None), (8, None), (12, None)),
}
# One layout per config for the every-recipe table: together they cover 1, 2 and 4 training processes.
EVERY_RECIPE_LAYOUTS = {
    "cpu.yaml": (1, None),
    "cpu_server.yaml": (1, None),
    "single_gpu.yaml": (2, None),
    "vllm_server_gpu0_train_gpu1.yaml": (2, None),
    "multi_gpu.yaml": (8, None),
    "zero2.yaml": (4, 2),
    "zero3.yaml": (8, None),
}
# Shipped configs the table leaves out, with why: they plan no GPU layout.
NOT_IN_TABLE = {
    "cpu_zero2.yaml": "DeepSpeed ZeRO-2 on two CPU processes (tests/test_zero_training.py)",
    "cpu_zero3.yaml": "DeepSpeed ZeRO-3 on two CPU processes (tests/test_zero_training.py)",
    "cpu_two_nodes.yaml": "two machines, one CPU training process each (tests/test_study_two_nodes.py)",
}
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class TableRow:
    """One planned launch: the numbers a reader checks, or the error."""

    config: str
    recipe: str
    num_gpus: int
    num_processes_flag: int | None = None
    model: str = ""
    processes: int = 0
    train_gpus: str = ""
    server_gpus: str = ""
    tp: int = 0
    dp: int = 0
    per_device: int = 0
    ga: int = 0
    max_steps: int = 0
    peak_gib: float = 0.0
    peak_phase: str = ""
    error: str = ""


def grpo_recipes(root: Path = ROOT) -> list[str]:
    """Every GRPO recipe YAML under recipes/<task>/ for a task of `trl_ext.recipes.TASK_DEFAULTS` (SFT, the shared
    root defaults, the expert-iteration recipes, which name their `task:`, and the CPU recipes of `trl_ext.tiny`'s
    model, `tiny_model: true`, and of the CPU demo's, `demo_warm_start: true`, aside)."""
    recipes = root / "recipes"
    return sorted(
        p.relative_to(recipes).as_posix()
        for p in recipes.rglob("*.yaml")
        if p.parent.name in TASK_DEFAULTS and not {"task", "tiny_model", "demo_warm_start"} & set(load_recipe_yaml(p))
    )


def model_recipes(root: Path = ROOT) -> dict[str, str]:
    """One GRPO recipe per model the shipped GRPO recipes train (the first by name), model -> recipe."""
    chosen: dict[str, str] = {}
    for recipe in grpo_recipes(root):
        chosen.setdefault(str(load_recipe_yaml(root / "recipes" / recipe).get("model_name_or_path")), recipe)
    return chosen


def pairs(
    root: Path = ROOT, recipes: Iterable[str] | None = None, layouts: dict | None = None
) -> Iterator[tuple[str, str, int, int | None]]:
    """(accelerate config, recipe, GPUs, --num-processes) for every recipe at every layout of its config.

    Args:
        root: the checkout.
        recipes: the recipes (default every GRPO recipe).
        layouts: config -> layouts (default `MEANT_FOR`); a single `(GPUs, processes)` per config works too.
    """
    layouts = MEANT_FOR if layouts is None else layouts
    for config, counts in layouts.items():
        counts = (counts,) if isinstance(counts[0], int) else counts
        for recipe in grpo_recipes(root) if recipes is None else recipes:
            server = read_recipe_serving(root / "recipes" / recipe).server_mode
            for count, processes in counts:
                if server and config == "single_gpu.yaml" and count == 1:
                    continue  # a server needs its own GPU
                yield config, recipe, count, processes


def plan_row(
    config: str,
    recipe: str,
    num_gpus: int,
    gpu_memory_gb: float,
    workdir: Path,
    root: Path = ROOT,
    num_processes: int | None = None,
):
    """Plan one launch through `plan_launch` on a node of `num_gpus` GPUs (packages not required: planning, not
    running; the environment's CUDA_VISIBLE_DEVICES is not read)."""
    task = recipe.split("/")[0]
    out = workdir / f"{Path(config).stem}_{recipe.replace('/', '_')}_{num_gpus}"
    model = str(load_recipe_yaml(root / "recipes" / recipe).get("model_name_or_path", ""))
    head = TableRow(config, recipe, num_gpus, num_processes, model)
    try:
        plan = plan_launch(
            root / "accelerate_configs" / config,
            root / "recipes" / recipe_script(task),
            root / "recipes" / recipe,
            ["--output_dir", str(out)],
            num_gpus=num_gpus,
            num_processes=num_processes,
            gpu_memory_gb=gpu_memory_gb,
            check_packages=False,
            log_dir=workdir / "logs",
            environ={},
        )
    except LaunchError as exc:
        return TableRow(**{**asdict(head), "error": str(exc)}), None
    layout, estimate = plan.report.layout, plan.report.estimate
    row = TableRow(
        **{
            **asdict(head),
            "processes": layout.world_size,
            "train_gpus": ",".join(plan.train_gpus) or "CPU",
            "server_gpus": ",".join(plan.server_gpus),
            "tp": plan.tp,
            "dp": plan.dp,
            "per_device": layout.per_device_train_batch_size,
            "ga": layout.gradient_accumulation_steps,
            "max_steps": layout.max_steps,
            "peak_gib": round(estimate.peak_gib, 2) if estimate else 0.0,
            "peak_phase": estimate.peak_phase if estimate else "",
        }
    )
    return row, plan


def table(
    gpu_memory_gb: float = 80.0, root: Path = ROOT, recipes: Iterable[str] | None = None, layouts: dict | None = None
) -> list[TableRow]:
    recipes = None if recipes is None else list(recipes)
    with tempfile.TemporaryDirectory() as tmp:
        return [
            plan_row(c, r, n, gpu_memory_gb, Path(tmp), root, p)[0] for c, r, n, p in pairs(root, recipes, layouts)
        ]


def markdown(rows: list[TableRow]) -> str:
    lines = [
        "| model | accelerate config | recipe | GPUs | processes | train / server GPUs | TP | DP | per-device x GA | "
        "peak GiB (phase) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gpus = f"{r.num_gpus}" + (f" (--num-processes {r.num_processes_flag})" if r.num_processes_flag else "")
        if r.error:
            lines.append(f"| {r.model} | {r.config} | {r.recipe} | {gpus} | FAILED: {r.error.splitlines()[-1]} ||||||")
            continue
        lines.append(
            f"| {r.model} | {r.config} | {r.recipe} | {gpus} | {r.processes} | {r.train_gpus} / "
            f"{r.server_gpus or '-'} | {r.tp or '-'} | {r.dp or '-'} | {r.per_device} x {r.ga} | "
            f"{r.peak_gib:.1f} ({r.peak_phase}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", action="store_true", help="One recipe per model at every layout (TP, DP).")
    parser.add_argument("--gpu-memory-gb", type=float, default=80.0, help="Memory limit per training GPU (GiB).")
    parser.add_argument("--json", default=None, help="Also write the rows to this JSON file.")
    args = parser.parse_args(argv)
    if args.models:
        rows = table(args.gpu_memory_gb, recipes=model_recipes().values())
    else:
        rows = table(args.gpu_memory_gb, layouts=EVERY_RECIPE_LAYOUTS)
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
