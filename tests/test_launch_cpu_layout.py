"""trl_ext.launch.cpu_layout: `trl-ext launch` in the server layout on a machine without a GPU.

The launch itself, with the real engine, runs in tests/test_vllm_server_sync.py (the server command composed here)
and in docs/launch.md's command; these are the plans, built without starting anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trl_ext.grpo.weight_sync.plugin import BACKEND, SERVER_LOG_ENV
from trl_ext.launch import plan_launch
from trl_ext.launch.cpu_layout import CPU_KV_CACHE_BYTES, cpu_server_args, pin, split_cores
from trl_ext.launch.planning import Command
from trl_ext.launch.server_place import server_place_env
from trl_ext.preflight.context import LAUNCH_SERVER_ENV

REPO = Path(__file__).resolve().parents[1]
TRANSFER = ["--weight-transfer-config", json.dumps({"backend": BACKEND})]
KV = ["--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
SAMPLER = ["--use-fp64-gumbel"]  # vLLM's compiled CPU sampler skips tokens on AVX2 (trl_ext.grpo.vllm.cpu_sampler)


@pytest.mark.parametrize(
    "cores, server, train",
    [
        ([0, 1], (0,), (1,)),  # the 2-core machine: one core each
        ([3, 2, 1, 0], (0, 1), (2, 3)),  # the server's half first, sorted
        ([4, 5, 6], (4,), (5, 6)),
        ([7], (), ()),  # one core: nothing to split
    ],
)
def test_split_cores_gives_the_server_the_first_half(cores, server, train):
    layout = split_cores(cores, taskset="/usr/bin/taskset")
    assert (layout.server_cores, layout.train_cores) == (server, train)
    assert ("not pinned" in layout.note) == (not server)


def test_without_taskset_nothing_is_pinned_and_the_plan_says_why():
    layout = split_cores([0, 1], taskset=None)
    assert (layout.server_cores, layout.train_cores) == ((), ())
    assert "no `taskset` on PATH" in layout.note
    command = Command(("accelerate", "launch"), {"A": "1"})
    assert pin(command, ()) == command
    assert pin(command, (1, 2)).argv == ("taskset", "-c", "1,2", "accelerate", "launch")


@pytest.mark.parametrize(
    "vllm_args, share, dtype, expected",
    [
        ([], 0.85, None, TRANSFER + SAMPLER + KV),  # the recipes' GPU share is not a RAM share: a small cache
        ([], None, "float32", TRANSFER + SAMPLER + ["--dtype", "float32"] + KV),  # no autocast: the trainer's dtype
        (["--dtype=bfloat16"], None, "float32", ["--dtype=bfloat16"] + TRANSFER + SAMPLER + KV),  # stated wins
        (["--kv_cache_memory_bytes", "1"], None, None, ["--kv_cache_memory_bytes", "1"] + TRANSFER + SAMPLER),
        (["--gpu-memory-utilization", "0.1"], None, None, ["--gpu-memory-utilization", "0.1"] + TRANSFER + SAMPLER),
        (TRANSFER[:1] + ['{"backend": "x"}'], None, None, TRANSFER[:1] + ['{"backend": "x"}'] + SAMPLER + KV),
        (["--no-use-fp64-gumbel"], None, None, ["--no-use-fp64-gumbel"] + TRANSFER + KV),  # a stated sampler wins
    ],
)
def test_cpu_server_args_add_only_what_is_not_stated(vllm_args, share, dtype, expected):
    args, note = cpu_server_args(vllm_args, share, dtype)
    assert args == expected
    assert ("is not used" in note) == (share is not None and KV[0] in args)


@pytest.mark.parametrize("flag", ["--speculative-config", "--speculative_config={}", "--num-speculative-tokens"])
def test_speculative_decoding_on_the_cpu_server_is_refused_naming_the_flag(flag):
    """vLLM 0.31's CPU server answers TRL's `logprobs=0` requests with HTTP 400 when it decodes speculatively
    (tests/scripts/record_vllm_completions.py): refused before the server starts, with the fix."""
    from trl_ext.launch.configs import LaunchError

    name = flag.split("=")[0].lstrip("-").replace("_", "-")
    with pytest.raises(LaunchError, match=rf"--vllm-args --{name}: .*HTTP 400.*remove --{name} from --vllm-args"):
        cpu_server_args([flag, '{"method": "ngram"}'], None)


@pytest.fixture
def cpu_machine(tmp_path, monkeypatch):
    """A 2-core machine with vLLM's CPU build and no GPU; the recipe's relative paths resolve under `tmp_path`."""
    import trl_ext.launch.planning as planning

    monkeypatch.setattr(planning, "vllm_cpu_build", lambda: True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(REPO / "tests" / "data")
    return tmp_path


def _plan(tmp_path, *extra, config="cpu_server.yaml", cpus=(0, 1), **kwargs):
    return plan_launch(
        REPO / "accelerate_configs" / config,
        REPO / "recipes" / "countdown.py",
        REPO / "recipes" / "countdown" / "cpu_server.yaml",
        ["--output_dir", str(tmp_path / "run"), *extra],
        num_gpus=0,
        cpus=list(cpus),
        log_dir=tmp_path / "logs",
        environ={},
        check_packages=False,
        **kwargs,
    )


def test_the_cpu_server_recipe_plans_pinned_server_and_trainer(cpu_machine):
    """recipes/countdown/cpu_server.yaml on accelerate_configs/cpu_server.yaml, 2 cores: the server (TRL's `vllm-serve`
    with our weight-transfer backend, float32 as the trainer, a 256 MiB KV cache instead of the recipes' 0.85 share of
    RAM) under `taskset -c 0`, the trainer under `taskset -c 1` told where the server logs; the preflight's plan and
    the launch notes say so; the recipe's tiny model is built before anything reads it."""
    plan = _plan(cpu_machine)
    server, trainer = plan.server.argv, plan.trainer.argv
    assert server[:3] == ("taskset", "-c", "0") and server[3].endswith("trl") and server[4] == "vllm-serve"
    assert server[server.index("--model") + 1] == "runs/tiny_models/countdown_cpu"
    tail = list(server[server.index("--host") + 2 :])
    assert tail == TRANSFER + SAMPLER + ["--dtype", "float32"] + KV  # no --gpu_memory_utilization
    assert trainer[:3] == ("taskset", "-c", "1") and trainer[4] == "launch"
    assert plan.trainer.env == {"CUDA_VISIBLE_DEVICES": "", SERVER_LOG_ENV: str(plan.server_log)}
    place = "CPU core(s) 0 (vLLM's CPU build; weights synced over gloo), started by trl-ext launch"
    assert server_place_env(plan) == {LAUNCH_SERVER_ENV: place}  # what the launcher adds when it starts the trainer
    text = plan.render()
    assert "gpus:    training on CPU core(s) 1 (1 process(es)); vLLM server on CPU core(s) 0" in text
    assert "vLLM server pinned to core(s) 0, trainer to core(s) 1 (taskset -c)" in text
    assert "vllm_gpu_memory_utilization 0.85, a GPU share, is not used" in text
    assert (cpu_machine / "runs" / "tiny_models" / "countdown_cpu" / "config.json").is_file()


def test_the_trainers_own_preflight_names_the_server_the_launcher_started(cpu_machine):
    """The trainer parses its recipe again and prints its own plan line: with the environment `trl-ext launch` gives
    it, the line names the server the launcher started; without it (a server the user starts), it says so."""
    from trl_ext.preflight.context import context_from_environment
    from trl_ext.recipes import preflight_recipe

    plan = _plan(cpu_machine)
    argv = ["--config", str(REPO / "recipes" / "countdown" / "cpu_server.yaml"), "--output_dir", "run"]

    def line(environ):
        _, report = preflight_recipe("countdown", argv, 1, lambda p: context_from_environment(p[0], p[1], environ))
        return next(text for text in report.render().splitlines() if text.strip().startswith("gpus:"))

    launched = "vLLM server on CPU core(s) 0 (vLLM's CPU build; weights synced over gloo), started by trl-ext launch"
    assert line({**plan.trainer.env, **server_place_env(plan)}).endswith(launched)
    assert line({}).endswith("vLLM server on a server you start (vllm_server_host)")


def test_one_core_plans_an_unpinned_layout_and_vllm_args_win(cpu_machine):
    plan = _plan(cpu_machine, cpus=(0,), vllm_args=["--kv-cache-memory-bytes", "1000000", "--dtype", "bfloat16"])
    assert plan.server.argv[0] != "taskset" and plan.trainer.argv[0] != "taskset"
    assert "server and trainer share the CPU (1 core, not pinned)" in plan.render()
    tail = list(plan.server.argv[plan.server.argv.index("--host") + 2 :])
    assert tail == ["--kv-cache-memory-bytes", "1000000", "--dtype", "bfloat16", *TRANSFER, *SAMPLER]


def test_autocast_recipes_leave_the_server_dtype_to_vllm(cpu_machine):
    plan = _plan(cpu_machine, "--bf16", "true")
    assert "--dtype" not in plan.server.argv
