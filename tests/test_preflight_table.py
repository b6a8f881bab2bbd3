"""`trl-ext launch` planning with the preflight: every shipped accelerate config x every shipped GRPO recipe plans at
the GPU counts the config is meant for; layouts that cannot work (a batch that does not split, a GPU count the
config cannot use) are refused with fixes that then plan; ports are picked free."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from conftest import shared_path

from trl_ext.launch import plan_launch, tensor_parallel_sizes
from trl_ext.launch.configs import LaunchError
from trl_ext.launch.server_place import server_place_env
from trl_ext.launch.table import EVERY_RECIPE_LAYOUTS, MEANT_FOR, NOT_IN_TABLE, model_recipes, pairs, plan_row
from trl_ext.preflight import load_model_shape
from trl_ext.preflight.context import LAUNCH_SERVER_ENV
from trl_ext.preflight.memory import GIB
from trl_ext.recipes import cli_overrides, load_recipe_yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "accelerate_configs"
RECIPES = REPO / "recipes"
COUNTDOWN_L256 = RECIPES / "countdown" / "qwen3_1.7b_grpo_l512.yaml"
SCRIPT = RECIPES / "countdown.py"
H100_GIB = 80.0
# The every-recipe table: one layout per config, and the multi-GPU configs at 8 GPUs too; cpu_server.yaml is cpu.yaml's
# placement (its CPU server layout: tests/test_launch_cpu_layout.py).
LAYOUTS = {**EVERY_RECIPE_LAYOUTS, "multi_gpu.yaml": ((8, None),), "zero2.yaml": ((4, 2),), "zero3.yaml": ((8, None),)}
del LAYOUTS["cpu_server.yaml"]


def _plan(config: Path, recipe: Path, *extra: str, num_gpus: int = 8, gpu_memory_gb: float | None = H100_GIB, **kw):
    task = recipe.parent.name
    return plan_launch(
        config,
        RECIPES / f"{task}.py",
        recipe,
        list(extra),
        num_gpus=num_gpus,
        gpu_memory_gb=gpu_memory_gb,
        check_packages=False,
        environ={},
        **kw,
    )


def test_every_shipped_config_is_in_the_table():
    shipped = {p.name for p in CONFIGS.glob("*.yaml")}
    assert set(NOT_IN_TABLE) <= shipped
    assert sorted(MEANT_FOR) == sorted(shipped - set(NOT_IN_TABLE)) == sorted(EVERY_RECIPE_LAYOUTS)


@pytest.fixture
def nyu_a3_recipe_files(tmp_path, monkeypatch):
    """NYU Assignment 3's recipes read the course's files from data/countdown/ where they are launched: lay them
    out."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "countdown").mkdir(parents=True)
    shutil.copy(shared_path("countdown", "train_10k_head16.parquet"), tmp_path / "data/countdown/train_10k.parquet")
    shutil.copy(shared_path("countdown", "dev.parquet"), tmp_path / "data/countdown/dev.parquet")


@pytest.mark.slow
def test_every_config_x_recipe_plans(tmp_path, nyu_a3_recipe_files):
    """Bug caught: every GRPO recipe failed on multi_gpu / zero2 / zero3 (7 processes: 256 % (128 x 7)). Now every
    pair plans on 1, 2 and 4 training processes, keeps its completions per step, and fits an 80 GiB GPU."""
    rows = [plan_row(c, r, n, H100_GIB, tmp_path, num_processes=p)[0] for c, r, n, p in pairs(layouts=LAYOUTS)]
    assert len(rows) > 200
    failed = [f"{r.config} x {r.recipe} @ {r.num_gpus}: {r.error}" for r in rows if r.error]
    assert not failed, "\n".join(failed)
    for row in rows:
        train_batch = load_recipe_yaml(RECIPES / row.recipe)["train_batch_size"]  # 256, or the off-policy grid's
        assert row.per_device * row.ga * row.processes == train_batch, row
        assert 0 < row.peak_gib <= H100_GIB, row
    multi = {r.num_gpus: r for r in rows if r.config == "multi_gpu.yaml" and r.recipe == "countdown/base.yaml"}
    assert (multi[8].train_gpus, multi[8].server_gpus, multi[8].ga, multi[8].tp) == ("0,1,2,3", "4", 32, 1)
    single = [r for r in rows if r.config == "single_gpu.yaml" and not r.server_gpus]
    # the recipes that need no server GPU: Assignment 2's one-GPU runs (colocated vLLM), the GSM8K report's
    # (transformers generation) and its colocated 24 GB variant
    assert [r.recipe for r in single] == sorted(ONE_GPU) + [
        "gsm8k/qwen2.5_1.5b_instruct_grpo.yaml",
        "gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml",
    ]
    zero2 = [r for r in rows if r.config == "zero2.yaml" and r.recipe == "countdown/base.yaml"]
    assert [(r.num_gpus, r.processes, r.train_gpus, r.server_gpus, r.ga) for r in zero2] == [(4, 2, "0,1", "2", 64)]


# Tensor parallel sizes that shard each shipped model, by hand: TP must divide the attention heads and the MLP
# width, and the KV heads must divide TP (or TP them). Qwen3-1.7B / 0.6B: 16 heads, 8 KV heads, MLP 6144 / 3072 ->
# 1, 2, 4, 8, 16. Qwen2.5-Math-1.5B / 1.5B-Instruct: 12 heads, 2 KV heads, MLP 8960 -> 1, 2, 4 (3 fails the KV
# heads; 6 and 12 fail 8960).
SHARDING_TP = {
    "Qwen/Qwen3-1.7B": (1, 2, 4, 8, 16),
    "Qwen/Qwen3-0.6B": (1, 2, 4, 8, 16),
    "Qwen/Qwen2.5-Math-1.5B": (1, 2, 4),
    "Qwen/Qwen2.5-Math-1.5B-Instruct": (1, 2, 4),
    "Qwen/Qwen2.5-1.5B-Instruct": (1, 2, 4),
}


def test_every_shipped_model_has_a_shape_and_its_tensor_parallel_sizes():
    """Every model a shipped recipe trains has architecture numbers (for memory and TP) and the sizes above."""
    recipes = [load_recipe_yaml(p) for p in RECIPES.rglob("*.yaml") if p.parent != RECIPES]
    local = ("tiny_model", "demo_warm_start")  # models built locally
    models = {str(r.get("model_name_or_path")) for r in recipes if not any(r.get(k) for k in local)}
    assert models - {"None"} <= set(SHARDING_TP), models - set(SHARDING_TP)
    for model, sizes in SHARDING_TP.items():
        assert tuple(tensor_parallel_sizes(load_model_shape(model)[0], 16)) == sizes, model


@pytest.mark.slow
def test_model_table_tp_dp_at_4_to_12_gpus(tmp_path, nyu_a3_recipe_files):
    """Bug caught: 12 GPUs with vllm_server_gpu0_train_gpu1.yaml gave Qwen2.5-Math-1.5B (12 heads) a server at
    tensor parallel 8, which vLLM refuses. Every shipped model at every layout (1 to 12 GPUs, 4 with
    `--num-processes 2`) now gets a TP of `SHARDING_TP` that fits its free GPUs, data parallel 1: by the
    rule (the smallest with at most 4 B parameters per GPU) TP 1 for every shipped model (0.6-1.7 B)."""
    rows = [
        plan_row(c, r, n, H100_GIB, tmp_path, num_processes=p)[0]
        for c, r, n, p in pairs(recipes=model_recipes().values())
    ]
    failed = [f"{r.config} x {r.recipe} @ {r.num_gpus}: {r.error}" for r in rows if r.error]
    assert not failed, "\n".join(failed)
    assert {r.model for r in rows} == set(SHARDING_TP)
    for row in rows:
        if not row.server_gpus:  # the GSM8K report's model: transformers generation or colocated vLLM, no server
            assert (
                row.recipe in ("gsm8k/qwen2.5_1.5b_instruct_grpo.yaml", "gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml")
                and row.tp == 0
            ), row
            continue
        free = row.num_gpus - (0 if row.train_gpus == "CPU" else row.processes)
        assert free >= 1 and row.tp == 1 == min(SHARDING_TP[row.model]) and row.dp == 1, row
        assert len(row.server_gpus.split(",")) == row.tp and 0 < row.peak_gib <= H100_GIB, row
    by_key = {(r.config, r.model, r.num_gpus): r for r in rows}
    math12 = by_key["vllm_server_gpu0_train_gpu1.yaml", "Qwen/Qwen2.5-Math-1.5B", 12]
    assert (math12.train_gpus, math12.server_gpus, math12.tp) == ("1", "0", 1)  # was tp 8, then 4
    assert by_key["vllm_server_gpu0_train_gpu1.yaml", "Qwen/Qwen3-1.7B", 12].tp == 1  # was 8
    four = by_key["multi_gpu.yaml", "Qwen/Qwen3-1.7B", 4]  # a 4-GPU node, --num-processes 2
    assert (four.processes, four.train_gpus, four.server_gpus, four.tp, four.ga) == (2, "0,1", "2", 1, 64)


def test_four_gpu_node_is_refused_with_num_processes_fix_that_plans(tmp_path):
    """Bug caught: multi_gpu / zero2 / zero3 train 4 processes and left a 4-GPU node no server GPU, and the
    launcher could not pass --num_processes. The refusal now names `--num-processes 2`, which plans (accelerate
    gets --num_processes 2)."""
    out = ["--output_dir", str(tmp_path / "run")]
    # The server GPUs the fix names are those the tensor-parallel rule gives it on the rest: 2, not 2,3.
    with pytest.raises(LaunchError, match=r"--num-processes 2: training on 0,1, the server on 2\)"):
        _plan(CONFIGS / "zero3.yaml", COUNTDOWN_L256, *out, num_gpus=4)
    plan = _plan(CONFIGS / "zero3.yaml", COUNTDOWN_L256, *out, num_gpus=4, num_processes=2)
    assert plan.trainer.argv[4:6] == ("--num_processes", "2") and plan.report.layout.world_size == 2
    assert (plan.train_gpus, plan.server_gpus, plan.tp) == (("0", "1"), ("2",), 1)  # TP 1 by the rule: GPU 3 idle
    assert server_place_env(plan) == {LAUNCH_SERVER_ENV: "GPU(s) 2 (tp 1, dp 1), started by trl-ext launch"}


def test_seven_process_layout_is_refused_with_a_fix_that_plans(tmp_path):
    """A 7-process accelerate config (256 does not split over 7): refused before any server starts, naming the field;
    the printed fix then plans."""
    seven = tmp_path / "seven.yaml"
    seven.write_text("distributed_type: MULTI_GPU\nnum_processes: 7\ngpu_ids: 1,2,3,4,5,6,7\n")
    out = ["--output_dir", str(tmp_path / "run")]
    with pytest.raises(LaunchError) as err:
        _plan(seven, COUNTDOWN_L256, *out)
    message = str(err.value)
    assert "train_batch_size: 256 completions per optimizer step do not split" in message
    assert "fix: train on 1 / 2 / 4 / 8 / 16 process(es)" in message
    flags = ("--" + message.split("or --")[1].split(" (")[0]).split()
    assert cli_overrides(flags) == {"rollout_batch_size": "224", "train_batch_size": "224"}
    plan = _plan(seven, COUNTDOWN_L256, *out, *flags)
    layout = plan.report.layout
    assert (layout.world_size, layout.per_device_train_batch_size, layout.gradient_accumulation_steps) == (7, 2, 16)


def test_server_recipe_on_one_gpu_is_refused_with_the_fix():
    with pytest.raises(LaunchError, match=r"no free GPU left for the vLLM server.*use `vllm_mode: colocate`"):
        _plan(CONFIGS / "single_gpu.yaml", COUNTDOWN_L256, num_gpus=1)


# Assignment 2 on one GPU, as it runs (it names one A100, not its size: 80 GB assumed): each run with
# vLLM colocated at 0.45 of the GPU.
ONE_GPU = [
    f"countdown/qwen3_1.7b_{run}{precision}_1gpu.yaml"
    for run in ("grpo_l256", "grpo_l512", "drgrpo_l256", "drgrpo_l512")
    for precision in ("", "_pure_bf16")
]


@pytest.mark.parametrize("recipe", ONE_GPU)
def test_qwen3_countdown_one_gpu_recipes_fit_80_gib(tmp_path, recipe):
    """The one-GPU recipe of each Assignment 2 run plans on one 80 GiB GPU with single_gpu.yaml, vLLM colocated (no
    server), and its estimate fits: the optimizer step's 20P (fp32 master weights, torch AdamW foreach) or 10P (pure
    bf16) plus vLLM's 0.45 x 80 GiB and the 1.5 GiB runtime allowance = 69.5 / 53.5 GiB (P = 1,720,574,976)."""
    plan = _plan(CONFIGS / "single_gpu.yaml", RECIPES / recipe, "--output_dir", str(tmp_path / "run"), num_gpus=1)
    estimate = plan.report.estimate
    assert plan.server is None and plan.train_gpus == ("0",) and plan.report.layout.gradient_accumulation_steps == 128
    assert estimate.phases["train"]["colocated vLLM"] == 0.45 * 80 * GIB
    pure = "pure_bf16" in recipe
    assert estimate.peak_phase == "optimizer step"
    assert estimate.peak_bytes == (10 if pure else 20) * 1_720_574_976 + (0.45 * 80 + 1.5) * GIB
    assert round(estimate.peak_gib, 1) == (53.5 if pure else 69.5) <= H100_GIB
    assert f"\nbase: {Path(recipe).name.replace('_1gpu', '')}\n" in (RECIPES / recipe).read_text()  # the 2-GPU run


@pytest.mark.parametrize("recipe", ONE_GPU)
def test_qwen3_countdown_one_gpu_recipes_on_a_40_gib_a100(tmp_path, recipe):
    """The same recipes on a 40 GiB A100, as their headers state: vLLM's 0.45 is 18 GiB there, so pure bf16 fits
    (10P + 19.5 GiB = 35.5) and fp32 master weights do not (20P + 19.5 GiB = 51.5); the refusal's first fix (sleep
    mode) and the pure-bf16 recipe it names plan within 40 GiB."""
    out = ["--output_dir", str(tmp_path / "run")]
    one = {"num_gpus": 1, "gpu_memory_gb": 40}
    pure = "pure_bf16" in recipe
    want_gib = ((10 if pure else 20) * 1_720_574_976 + (0.45 * 40 + 1.5) * GIB) / GIB
    if pure:
        assert (
            round(_plan(CONFIGS / "single_gpu.yaml", RECIPES / recipe, *out, **one).report.estimate.peak_gib, 1)
            == 35.5
        )
        assert round(want_gib, 1) == 35.5
        return
    with pytest.raises(LaunchError) as err:
        _plan(CONFIGS / "single_gpu.yaml", RECIPES / recipe, *out, **one)
    message = str(err.value)
    assert f"estimated peak {want_gib:.1f} GiB per training GPU exceeds the 40 GiB limit" in message
    assert round(want_gib, 1) == 51.5
    assert (
        "fix: --vllm_enable_sleep_mode true -> 38.7 GiB" in message
        and "--dtype bfloat16 (pure bf16) -> 35.5 GiB" in message
    )
    fixed = _plan(CONFIGS / "single_gpu.yaml", RECIPES / recipe, *out, "--vllm_enable_sleep_mode", "true", **one)
    assert round(fixed.report.estimate.peak_gib, 1) == 38.7
    header = (RECIPES / recipe).read_text()
    assert "names one A100 and not its size" in header and "estimates 51.5 GiB" in header


def test_memory_refusal_lists_knobs_and_the_first_one_plans(tmp_path):
    """The GSM8K report with fp32 AdamW on a 24 GiB GPU does not fit; the first knob printed makes it fit."""
    recipe = RECIPES / "gsm8k" / "qwen2.5_1.5b_instruct_grpo_24gb.yaml"
    out = ["--output_dir", str(tmp_path / "run")]
    single = CONFIGS / "single_gpu.yaml"
    with pytest.raises(LaunchError) as err:
        _plan(single, recipe, *out, "--optim", "adamw_torch", num_gpus=1, gpu_memory_gb=24)
    message = str(err.value)
    assert "gpu memory: estimated peak" in message and "exceeds the 24 GiB limit" in message
    knob = message.split("fix: ")[1].split(" ->")[0]
    assert knob == "--optim adamw_bnb_8bit"
    plan = _plan(single, recipe, *out, "--optim", "adamw_torch", *knob.split(), num_gpus=1, gpu_memory_gb=24)
    assert plan.report.estimate.peak_gib <= 24
    assert plan.report.estimate.phases["generation"]["colocated vLLM"] == 0.3 * 24 * (1 << 30)  # 0.3 of the GPU


def test_busy_ports_are_replaced_by_free_ones(tmp_path):
    """Two runs on one node collide on TRL's NCCL group port 51216 (and the server port). Unset ports
    are picked free and passed on; a busy port the recipe names is an error naming a free one."""
    out = ["--output_dir", str(tmp_path / "run")]
    with socket.socket() as server_port, socket.socket() as group_port:
        for sock, port in ((server_port, 8000), (group_port, 51216)):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
                sock.listen()
            except OSError:
                pass  # already taken by something else: just as busy
        plan = _plan(CONFIGS / "vllm_server_gpu0_train_gpu1.yaml", COUNTDOWN_L256, *out, num_gpus=2)
        args = list(plan.trainer.argv)
        server_port, group = int(args[args.index("--vllm_server_port") + 1]), args[args.index("--vllm_group_port") + 1]
        assert server_port > 8000 and int(group) > 51216
        assert plan.server.argv[plan.server.argv.index("--port") + 1] == str(server_port)
        assert plan.health_url.endswith(f":{server_port}/health")
        two_gpus = CONFIGS / "vllm_server_gpu0_train_gpu1.yaml"
        with pytest.raises(
            LaunchError, match=r"(?s)vllm_group_port: port 51216 is in use .*fix: --vllm_group_port"
        ) as err:
            _plan(two_gpus, COUNTDOWN_L256, *out, "--vllm_group_port", "51216", num_gpus=2)
        free = str(err.value).split("fix: --vllm_group_port ")[1].split()[0]
        plan = _plan(two_gpus, COUNTDOWN_L256, *out, "--vllm_group_port", free, num_gpus=2)
        assert plan.trainer.argv.count("--vllm_group_port") == 1  # stated and free: passed through as given


def test_server_log_lands_in_the_run_folder(monkeypatch, tmp_path):
    """Bug caught: the README says the server log lands in the run folder, but without `output_dir` in the
    YAML it went to runs/launch/. It now follows the output_dir the recipe parses to (runs/<folder>/<name>)."""
    monkeypatch.chdir(tmp_path)
    plan = _plan(CONFIGS / "vllm_server_gpu0_train_gpu1.yaml", COUNTDOWN_L256, num_gpus=2)
    assert plan.output_dir == "runs/countdown/qwen3_1.7b_grpo_l512"
    assert plan.server_log == Path("runs/countdown/qwen3_1.7b_grpo_l512") / f"vllm_server_{plan.port}.log"
    (tmp_path / "script.py").write_text("")  # not a trl_ext recipe: runs/launch
    other = plan_launch(
        CONFIGS / "vllm_server_gpu0_train_gpu1.yaml", tmp_path / "script.py", COUNTDOWN_L256, num_gpus=2
    )
    assert other.server_log == Path("runs/launch") / f"vllm_server_{other.port}.log"
