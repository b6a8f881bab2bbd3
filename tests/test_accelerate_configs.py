"""accelerate_configs/*.yaml: each loads with accelerate's own loader and its launch parser places training where
the launcher expects (the CUDA_VISIBLE_DEVICES accelerate exports equals the one `trl-ext launch` gives the trainer).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trl_ext.launch import LaunchError, plan_launch, read_accelerate_config, split_gpus

CONFIG_DIR = Path(__file__).resolve().parents[1] / "accelerate_configs"

# name -> (distributed_type, num_processes, gpu_ids, use_cpu, DeepSpeed zero_stage, mixed_precision)
EXPECTED = {
    "cpu.yaml": ("NO", 1, None, True, None, "no"),
    # the same placement: a CPU trainer beside a vLLM server on the CPU (trl-ext launch pins the two apart)
    "cpu_server.yaml": ("NO", 1, None, True, None, "no"),
    # pinned: on a multi-GPU box the trainer must see one device (GRPOTrainer refuses DataParallel)
    "single_gpu.yaml": ("NO", 1, "0", False, None, "bf16"),
    "vllm_server_gpu0_train_gpu1.yaml": ("NO", 1, "1", False, None, "bf16"),
    # four processes: the courses' 256 completions per step split as 2 x GA 32 x 4 (not over 7)
    "multi_gpu.yaml": ("MULTI_GPU", 4, "all", False, None, "bf16"),
    "zero2.yaml": ("DEEPSPEED", 4, "all", False, 2, "bf16"),
    "zero3.yaml": ("DEEPSPEED", 4, "all", False, 3, "bf16"),
    # the CPU counterparts of zero2 / zero3.yaml: two CPU processes over gloo (tests/test_zero_training.py)
    "cpu_zero2.yaml": ("DEEPSPEED", 2, None, True, 2, "no"),
    "cpu_zero3.yaml": ("DEEPSPEED", 2, None, True, 3, "no"),
    # two machines, one CPU process each (tests/test_study_two_nodes.py); torchrun starts MULTI_GPU across machines
    "cpu_two_nodes.yaml": ("MULTI_GPU", 2, None, True, None, "no"),
}


def test_the_shipped_configs_are_the_expected_ones():
    assert sorted(p.name for p in CONFIG_DIR.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_loads_with_accelerates_own_loader(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    config = load_config_from_file(str(CONFIG_DIR / name))
    distributed_type, num_processes, gpu_ids, use_cpu, zero_stage, mixed_precision = EXPECTED[name]
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type.value == distributed_type
    assert config.num_processes == num_processes
    assert config.gpu_ids == gpu_ids
    assert config.use_cpu is use_cpu
    assert config.deepspeed_config.get("zero_stage") == zero_stage
    assert config.mixed_precision == mixed_precision
    assert config.num_machines == (2 if name == "cpu_two_nodes.yaml" else 1)
    if zero_stage == 3:
        assert config.deepspeed_config["zero3_init_flag"] is True


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_launcher_reads_what_accelerate_reads(name):
    from accelerate.commands.config.config_args import load_config_from_file

    reference = load_config_from_file(str(CONFIG_DIR / name))
    ours = read_accelerate_config(CONFIG_DIR / name)
    assert ours.distributed_type == reference.distributed_type.value
    assert ours.num_processes == reference.num_processes
    assert ours.num_machines == reference.num_machines
    assert ours.use_cpu is reference.use_cpu
    expected_ids = None if reference.gpu_ids in (None, "all") else tuple(reference.gpu_ids.split(","))
    assert ours.gpu_ids == expected_ids


def _accelerate_launch_env(config_file: Path, monkeypatch, launch_args=()) -> dict[str, str]:
    """The environment `accelerate launch --config_file F [launch_args] script.py` gives its processes, without
    launching them."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import (
        prepare_deepspeed_cmd_env,
        prepare_multi_gpu_env,
        prepare_simple_launcher_cmd_env,
    )

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    argv = ["--config_file", str(config_file), *launch_args, "script.py", "--x", "1"]
    args = launch_command_parser().parse_args(argv)
    args, _, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ""  # set by accelerate's launch_command before this call
        return prepare_deepspeed_cmd_env(args)[1]
    if args.multi_gpu:
        return prepare_multi_gpu_env(args)
    return prepare_simple_launcher_cmd_env(args)[1]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_accelerate_launch_places_training_where_the_launcher_does(name, monkeypatch, tmp_path):
    distributed_type, num_processes, gpu_ids, use_cpu, zero_stage, _ = EXPECTED[name]
    env = _accelerate_launch_env(CONFIG_DIR / name, monkeypatch)

    # Only the single-process launcher exports ACCELERATE_USE_CPU; DeepSpeed's launcher does not (cpu_zero*.yaml run
    # on the CPU because DeepSpeed picks its CPU accelerator where there is no GPU); multi_gpu.yaml never runs on CPU.
    # Nor does the multi-GPU launcher (torchrun) for cpu_two_nodes.yaml: `trl-ext launch` sets it for those processes.
    assert env.get("ACCELERATE_USE_CPU", "False") == str(use_cpu and distributed_type == "NO")
    if zero_stage is not None:
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == str(zero_stage)
    # Explicit gpu_ids: accelerate exports them; "all"/none: it leaves CUDA_VISIBLE_DEVICES alone.
    assert env.get("CUDA_VISIBLE_DEVICES") == (gpu_ids if gpu_ids not in (None, "all") else None)

    # The launcher, on an 8-GPU node, hands the trainer the same GPUs and the server only the others.
    train, free = split_gpus(read_accelerate_config(CONFIG_DIR / name), [str(i) for i in range(8)])
    if gpu_ids not in (None, "all"):
        assert ",".join(train) == env["CUDA_VISIBLE_DEVICES"]
    assert not set(train) & set(free)
    assert len(train) == (0 if use_cpu else num_processes)

    recipe_yaml = tmp_path / "recipe.yaml"
    recipe_yaml.write_text("model_name_or_path: m\nuse_vllm: true\nvllm_mode: server\n")
    script = tmp_path / "script.py"
    script.write_text("")
    plan = plan_launch(CONFIG_DIR / name, script, recipe_yaml, num_gpus=8, log_dir=tmp_path)
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == ",".join(train)
    assert plan.server.env["CUDA_VISIBLE_DEVICES"] == ",".join(plan.server_gpus)
    assert set(plan.server_gpus) <= set(free)


def test_a_schedulers_allocation_is_honoured(monkeypatch, tmp_path):
    """Bug caught: with CUDA_VISIBLE_DEVICES=2,3 from a scheduler, `gpu_ids: '1'` was refused with advice
    (--num-gpus 2) that then trained on physical GPU 1, outside the allocation. `gpu_ids` now count positions in
    the allocation: the trainer runs on GPU 3 (accelerate, given --gpu_ids 3, exports exactly that), the server on
    GPU 2; --num-gpus cannot step outside it."""
    recipe_yaml = tmp_path / "recipe.yaml"
    recipe_yaml.write_text("model_name_or_path: m\nuse_vllm: true\nvllm_mode: server\n")
    script = tmp_path / "script.py"
    script.write_text("")
    config = CONFIG_DIR / "vllm_server_gpu0_train_gpu1.yaml"
    allocation = {"CUDA_VISIBLE_DEVICES": "2,3"}
    plan = plan_launch(config, script, recipe_yaml, log_dir=tmp_path, environ=allocation)
    assert (plan.train_gpus, plan.server_gpus) == (("3",), ("2",))
    assert plan.trainer.env["CUDA_VISIBLE_DEVICES"] == "3" and plan.server.env["CUDA_VISIBLE_DEVICES"] == "2"
    launch_args = plan.trainer.argv[4 : plan.trainer.argv.index(str(script))]
    assert launch_args == ("--gpu_ids", "3")
    assert _accelerate_launch_env(config, monkeypatch, launch_args)["CUDA_VISIBLE_DEVICES"] == "3"
    assert "positions in CUDA_VISIBLE_DEVICES=2,3: training on GPU(s) 3" in plan.render()
    single = plan_launch(CONFIG_DIR / "single_gpu.yaml", script, recipe_yaml, log_dir=tmp_path, environ=allocation)
    assert (single.train_gpus, single.server_gpus) == (("2",), ("3",))
    with pytest.raises(LaunchError, match=r"--num-gpus 4 but CUDA_VISIBLE_DEVICES=2,3 allows 2 GPU"):
        plan_launch(config, script, recipe_yaml, num_gpus=4, log_dir=tmp_path, environ=allocation)
    with pytest.raises(LaunchError, match=r"`gpu_ids` 1 names GPU\(s\) \['1'\] .*positions 0..0"):
        plan_launch(config, script, recipe_yaml, log_dir=tmp_path, environ={"CUDA_VISIBLE_DEVICES": "5"})
