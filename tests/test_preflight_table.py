"""`trl-ext launch` planning with the preflight: every shipped accelerate config x every shipped GRPO recipe plans at
the GPU counts the config is meant for; the failures the issue found are refused with fixes that then plan; ports
are picked free."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from conftest import shared_path

from trl_ext.launch import plan_launch
from trl_ext.launch.configs import LaunchError
from trl_ext.preflight.plan import cli_overrides
from trl_ext.preflight.table import MEANT_FOR, pairs, plan_row
from trl_ext.recipes import load_recipe_yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "accelerate_configs"
RECIPES = REPO / "recipes"
SEED000 = RECIPES / "countdown" / "seed000_grpo_l512.yaml"
SCRIPT = RECIPES / "countdown.py"
H100_GIB = 80.0


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
        **kw,
    )


def test_every_shipped_config_is_in_the_table():
    assert sorted(MEANT_FOR) == sorted(p.name for p in CONFIGS.glob("*.yaml"))


@pytest.mark.slow
def test_every_config_x_recipe_plans_at_its_gpu_counts(tmp_path, monkeypatch):
    """Issue #11: every GRPO recipe failed on multi_gpu / zero2 / zero3 (7 processes: 256 % (128 x 7)). Now every
    pair plans, keeps 256 completions per step, and fits an 80 GiB GPU by the estimate."""
    # seed 001's recipes read the course's files from data/countdown/ where they are launched: lay them out
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "countdown").mkdir(parents=True)
    shutil.copy(shared_path("countdown", "train_10k_head16.parquet"), tmp_path / "data/countdown/train_10k.parquet")
    shutil.copy(shared_path("countdown", "dev.parquet"), tmp_path / "data/countdown/dev.parquet")
    rows = [plan_row(c, r, n, H100_GIB, tmp_path)[0] for c, r, n in pairs()]
    assert len(rows) > 250
    failed = [f"{r.config} x {r.recipe} @ {r.num_gpus}: {r.error}" for r in rows if r.error]
    assert not failed, "\n".join(failed)
    for row in rows:
        train_batch = load_recipe_yaml(RECIPES / row.recipe)["train_batch_size"]  # 256, or the off-policy grid's
        assert row.per_device * row.ga * row.processes == train_batch, row
        assert 0 < row.peak_gib <= H100_GIB, row
    multi = {r.num_gpus: r for r in rows if r.config == "multi_gpu.yaml" and r.recipe == "countdown/base.yaml"}
    assert (multi[8].train_gpus, multi[8].server_gpus, multi[8].ga) == ("0,1,2,3", "4,5,6,7", 32)
    assert (multi[5].train_gpus, multi[5].server_gpus) == ("0,1,2,3", "4")
    single = [r for r in rows if r.config == "single_gpu.yaml" and r.num_gpus == 1]
    # the recipes that need no server GPU: seed 004's (transformers generation) and its colocated 24 GB variant
    assert [r.recipe for r in single] == ["gsm8k/seed004.yaml", "gsm8k/seed004_24gb.yaml"]


def test_seven_process_layout_is_refused_with_a_fix_that_plans(tmp_path):
    """The old 7-process files: refused before any server starts, naming the field; the printed fix then plans."""
    seven = tmp_path / "seven.yaml"
    seven.write_text("distributed_type: MULTI_GPU\nnum_processes: 7\ngpu_ids: 1,2,3,4,5,6,7\n")
    out = ["--output_dir", str(tmp_path / "run")]
    with pytest.raises(LaunchError) as err:
        _plan(seven, SEED000, *out)
    message = str(err.value)
    assert "train_batch_size: 256 completions per optimizer step do not split" in message
    assert "fix: train on 1 / 2 / 4 / 8 / 16 process(es)" in message
    flags = ("--" + message.split("or --")[1].split(" (")[0]).split()
    assert cli_overrides(flags) == {"rollout_batch_size": "224", "train_batch_size": "224"}
    plan = _plan(seven, SEED000, *out, *flags)
    layout = plan.report.layout
    assert (layout.world_size, layout.per_device_train_batch_size, layout.gradient_accumulation_steps) == (7, 2, 16)


def test_server_recipe_on_one_gpu_is_refused_with_the_fix():
    with pytest.raises(LaunchError, match=r"no free GPU left for the vLLM server.*use `vllm_mode: colocate`"):
        _plan(CONFIGS / "single_gpu.yaml", SEED000, num_gpus=1)


def test_memory_refusal_lists_knobs_and_the_first_one_plans(tmp_path):
    """Seed 004 with fp32 AdamW on a 24 GiB GPU does not fit; the first knob printed makes it fit."""
    recipe = RECIPES / "gsm8k" / "seed004_24gb.yaml"
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
    assert "colocated vLLM 7.20" in plan.preflight  # 0.3 of the 24 GiB GPU


def test_busy_ports_are_replaced_by_free_ones(tmp_path):
    """Issue #11: two runs on one node collide on TRL's NCCL group port 51216 (and the server port). Unset ports
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
        plan = _plan(CONFIGS / "vllm_server_gpu0_train_gpu1.yaml", SEED000, *out, num_gpus=2)
        args = list(plan.trainer.argv)
        server_port, group = int(args[args.index("--vllm_server_port") + 1]), args[args.index("--vllm_group_port") + 1]
        assert server_port > 8000 and int(group) > 51216
        assert plan.server.argv[plan.server.argv.index("--port") + 1] == str(server_port)
        assert plan.health_url.endswith(f":{server_port}/health")
        two_gpus = CONFIGS / "vllm_server_gpu0_train_gpu1.yaml"
        with pytest.raises(
            LaunchError, match=r"(?s)vllm_group_port: port 51216 is in use .*fix: --vllm_group_port"
        ) as err:
            _plan(two_gpus, SEED000, *out, "--vllm_group_port", "51216", num_gpus=2)
        free = str(err.value).split("fix: --vllm_group_port ")[1].split()[0]
        plan = _plan(two_gpus, SEED000, *out, "--vllm_group_port", free, num_gpus=2)
        assert "--vllm_group_port" not in plan.report.trainer_flags()  # stated and free: passed through as given
