"""`trl-ext launch` reads a trl_ext recipe once, through the parser the trainer uses (`parse_launch_recipe`): the
serving fields come from that parse (`serving_from_parsed`), and the preflight checks the same parse with the flags
the launcher adds to the trainer's command.

References: the plain YAML reader kept for scripts that are not trl_ext recipes (`read_recipe_serving`, written
independently), values read off the recipe files by hand, and a second parse of the trainer's full command line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import trl_ext.recipes.entry as entry
from trl_ext.launch import plan_launch
from trl_ext.launch.checks import _with_launcher_flags, parse_launch_recipe
from trl_ext.launch.configs import LaunchError, read_accelerate_config, read_recipe_serving, serving_from_parsed

REPO = Path(__file__).resolve().parents[1]
CPU_SERVER = REPO / "recipes" / "countdown" / "cpu_server.yaml"
SCRIPT = REPO / "recipes" / "countdown.py"


def _parsed(config: Path, extra=(), accelerate="cpu.yaml"):
    setup = read_accelerate_config(REPO / "accelerate_configs" / accelerate)
    return parse_launch_recipe(setup, REPO / "recipes" / f"{config.parent.name}.py", config, list(extra))


@pytest.mark.parametrize(
    "recipe",
    ["countdown/cpu_server.yaml", "countdown/qwen3_1.7b_drgrpo_l256_pure_bf16.yaml", "gsm8k/r1_zero.yaml"],
)
@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("--vllm_server_port", "8123", "--vllm_group_port", "51300"),
        ("--vllm_server_base_url", "https://10.0.0.5"),
        ("--vllm_gpu_memory_utilization", "0.5", "--bf16", "true"),
        ("--use_vllm", "false", "--output_dir", "elsewhere"),
    ],
)
def test_serving_from_the_parse_matches_the_plain_reader(recipe, extra):
    config = REPO / "recipes" / recipe
    assert serving_from_parsed(_parsed(config, extra)) == read_recipe_serving(config, extra)


def test_serving_fields_of_the_cpu_server_recipe():
    """By hand from recipes/countdown/cpu_server.yaml: server mode on TRL's default host and port (not stated), the
    tiny model, float32 without autocast (`dtype: float32`, `bf16: false`), its 0.85 vLLM share, no group port or
    output_dir stated."""
    serving = serving_from_parsed(_parsed(CPU_SERVER))
    assert (serving.server_mode, serving.model, serving.compute_dtype) == (
        True,
        "runs/tiny_models/countdown_cpu",
        "float32",
    )
    assert (serving.host, serving.port, serving.port_stated) == ("0.0.0.0", 8000, False)
    assert (serving.gpu_memory_utilization, serving.group_port, serving.output_dir) == (0.85, None, None)
    url = serving_from_parsed(_parsed(CPU_SERVER, ["--vllm_server_base_url", "https://10.0.0.5"]))
    assert (url.host, url.port, url.port_stated, url.local_server) == ("10.0.0.5", 443, True, False)
    with pytest.raises(LaunchError, match=r"cpu_server.yaml: `vllm_gpu_memory_utilization` must be a fraction"):
        serving_from_parsed(_parsed(CPU_SERVER, ["--vllm_gpu_memory_utilization", "1.5"]))


def test_launcher_flags_on_the_parse_equal_a_parse_of_the_trainer_command():
    flags = ["--vllm_server_host", "127.0.0.1", "--vllm_server_port", "8123", "--vllm_group_port", "51300"]
    given = ["--seed", "7"]
    once = _with_launcher_flags(_parsed(CPU_SERVER, given), given, flags)
    twice = _parsed(CPU_SERVER, [*given, *flags])
    assert once.argv == twice.argv and once.stated == twice.stated
    for mine, reference in zip(once.parsed, twice.parsed, strict=True):
        fields = {k: v for k, v in vars(mine).items() if k != "distributed_state"}  # an object without equality
        assert fields == {k: v for k, v in vars(reference).items() if k != "distributed_state"}
    assert (once.parsed[1].vllm_server_port, once.parsed[1].vllm_group_port) == (8123, 51300)


def test_plan_launch_parses_a_recipe_once(tmp_path, monkeypatch):
    """The CPU server layout (vLLM's CPU build assumed): one parse, and the preflight shows the ports the launcher
    picked and passes to the trainer."""
    import trl_ext.launch.planning as planning

    calls = []
    real = entry.parse_recipe_args
    monkeypatch.setattr(entry, "parse_recipe_args", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(planning, "vllm_cpu_build", lambda: True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(REPO / "tests" / "data")
    plan = plan_launch(
        REPO / "accelerate_configs" / "cpu_server.yaml",
        SCRIPT,
        CPU_SERVER,
        ["--output_dir", str(tmp_path / "run")],
        num_gpus=0,
        cpus=[0, 1],
        log_dir=tmp_path / "logs",
        environ={},
        check_packages=False,
    )
    assert len(calls) == 1
    trainer = list(plan.trainer.argv)
    group = trainer[trainer.index("--vllm_group_port") + 1]
    assert f"vllm_server_port {plan.port}, vllm_group_port {group}" in plan.render()


def test_other_scripts_and_recipes_without_config_are_not_parsed():
    setup = read_accelerate_config(REPO / "accelerate_configs" / "cpu.yaml")
    assert parse_launch_recipe(setup, REPO / "recipes" / "sft.py", CPU_SERVER, []) is None
    assert parse_launch_recipe(setup, SCRIPT, None, ["--use_vllm", "true"]) is None
    with pytest.raises(LaunchError, match=r"recipe config: .*cpu_server.yaml: .*not used .*--no_such_field"):
        parse_launch_recipe(setup, SCRIPT, CPU_SERVER, ["--no_such_field", "1"])
