"""trl_ext.launch: command composition, the GPU split, and the server's life with real processes.

vLLM itself cannot run here (no GPU), so the server is a stand-in: a small Python HTTP server that answers
`GET /health` like vLLM's and, like vLLM's engine, starts a worker process in its own process group. The trainer is a
stand-in script too, except in one test that goes through the real `accelerate launch`. "No orphans" is checked by
PID: every process that was started (server, its worker, trainer, its worker) must be gone afterwards.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import free_port

from trl_ext.launch import (
    LaunchError,
    ServerProcess,
    check_port_free,
    detect_gpus,
    plan_launch,
    read_accelerate_config,
    read_recipe_serving,
    run_launch,
    server_parallelism,
    split_gpus,
)
from trl_ext.preflight import load_model_shape

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "accelerate_configs"
VENV_BIN = Path(sys.executable).parent
MODEL = "Qwen/Qwen3-1.7B"

# mode: healthy (200 on /health), unhealthy (503 forever), exit (dies with code 3), ignore-term (healthy, ignores
# SIGTERM so only SIGKILL stops it).
STAND_IN_SERVER = r"""
import argparse, http.server, json, os, signal, subprocess, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--record", required=True)
parser.add_argument("--mode", default="healthy")
args, rest = parser.parse_known_args()
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(args.record, "w") as f:
    json.dump({"pid": os.getpid(), "worker": worker.pid, "pgid": os.getpgid(0), "argv": sys.argv[1:],
               "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
print("stand-in server: loading weights", flush=True)
if args.mode == "exit":
    print("RuntimeError: CUDA out of memory (stand-in)", flush=True)
    sys.exit(3)
if args.mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
status = 503 if args.mode == "unhealthy" else 200

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(status if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", args.port), Health).serve_forever()
"""

# Records what it was started with and whether the server was healthy at that moment; starts a worker like
# accelerate's ranks; then sleeps and/or exits with the given code.
STAND_IN_TRAINER = r"""
import argparse, json, os, subprocess, sys, time, urllib.request
parser = argparse.ArgumentParser()
parser.add_argument("--record", required=True)
parser.add_argument("--health")
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--sleep", type=float, default=0.0)
args, rest = parser.parse_known_args()
health = None
if args.health:
    with urllib.request.urlopen(args.health, timeout=5) as r:
        health = r.status
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(args.record + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "worker": worker.pid, "argv": sys.argv[1:], "rest": rest, "health": health,
               "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
os.replace(args.record + ".tmp", args.record)
time.sleep(args.sleep)
worker.kill()
sys.exit(args.exit_code)
"""


def _alive(pid: int) -> bool:
    """True for a running process; False for gone or zombie (an unreaped corpse runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _wait_for(path: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return json.loads(path.read_text())


@pytest.fixture(autouse=True)
def _no_scheduler_gpus(monkeypatch):
    """The launcher reads CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER; these tests state the GPUs themselves."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


@pytest.fixture
def rig(tmp_path):
    """Stand-in scripts, a server-mode recipe on a free localhost port, and an empty recipe script."""
    (tmp_path / "server.py").write_text(STAND_IN_SERVER)
    (tmp_path / "trainer.py").write_text(STAND_IN_TRAINER)
    port = free_port()
    (tmp_path / "base.yaml").write_text(
        f"model_name_or_path: {MODEL}\nuse_vllm: true\nvllm_server_host: 127.0.0.1\nvllm_server_port: {port}\n"
    )
    (tmp_path / "recipe.yaml").write_text("base: base.yaml\nvllm_mode: server\nlearning_rate: 1.0e-5\n")
    (tmp_path / "recipe.py").write_text("")

    class Rig:
        dir = tmp_path
        recipe = tmp_path / "recipe.py"
        config = tmp_path / "recipe.yaml"
        server_record = tmp_path / "server.json"
        trainer_record = tmp_path / "trainer.json"
        health = f"http://127.0.0.1:{port}/health"

    Rig.port = port

    def server_cmd(mode="healthy"):
        return f"{{python}} {tmp_path / 'server.py'} --port {{port}} --record {Rig.server_record} --mode {mode}"

    def train_cmd(exit_code=0, sleep=0.0):
        return (
            f"{{python}} {tmp_path / 'trainer.py'} --record {Rig.trainer_record} --health {Rig.health} "
            f"--exit-code {exit_code} --sleep {sleep}"
        )

    def plan(server_mode="healthy", exit_code=0, sleep=0.0, accelerate_config="vllm_server_gpu0_train_gpu1.yaml"):
        return plan_launch(
            CONFIGS / accelerate_config,
            Rig.recipe,
            Rig.config,
            ["--seed", "3"],
            num_gpus=2,
            server_cmd=server_cmd(server_mode),
            train_cmd=train_cmd(exit_code, sleep),
            log_dir=tmp_path / "logs",
        )

    Rig.server_cmd, Rig.train_cmd, Rig.plan = staticmethod(server_cmd), staticmethod(train_cmd), staticmethod(plan)
    return Rig


def _assert_all_gone(*records: Path) -> None:
    for record in records:
        if record.exists():
            data = json.loads(record.read_text())
            for key in ("pid", "worker"):
                assert not _alive(data[key]), f"{record.stem} {key} {data[key]} is still running"


# Composition and the GPU split (pure: no process started).


def test_recipe_serving_resolves_base_and_recipe_args(rig):
    serving = read_recipe_serving(rig.config)
    assert (serving.use_vllm, serving.vllm_mode, serving.model) == (True, "server", MODEL)
    assert (serving.host, serving.port, serving.server_mode) == ("127.0.0.1", rig.port, True)
    # Recipe args override the YAML the way TrlParser does: `--k v`, `--k=v`, dashed names, bare boolean flags.
    assert read_recipe_serving(rig.config, ["--vllm_server_port=8123"]).port == 8123
    assert read_recipe_serving(rig.config, ["--vllm-server-port", "8124", "--seed", "1"]).port == 8124
    assert read_recipe_serving(rig.config, ["--use_vllm", "false"]).server_mode is False
    assert read_recipe_serving(None, ["--use_vllm", "--vllm_mode", "server"]).server_mode is True
    url = read_recipe_serving(rig.config, ["--vllm_server_base_url", "http://10.0.0.5:9000"])
    assert (url.host, url.port, url.local_server) == ("10.0.0.5", 9000, False)
    # TRL 1.16 defaults when the recipe says nothing.
    empty = read_recipe_serving(None)
    assert (empty.use_vllm, empty.vllm_mode, empty.host, empty.port) == (False, "colocate", "0.0.0.0", 8000)


def test_detect_gpus_sources():
    assert detect_gpus(3, {}) == (["0", "1", "2"], "--num-gpus")
    assert detect_gpus(None, {"CUDA_VISIBLE_DEVICES": "2, 5"}) == (["2", "5"], "CUDA_VISIBLE_DEVICES")
    assert detect_gpus(2, {"CUDA_VISIBLE_DEVICES": "2, 5"}) == (["2", "5"], "CUDA_VISIBLE_DEVICES")
    assert detect_gpus(None, {"CUDA_VISIBLE_DEVICES": ""}) == ([], "CUDA_VISIBLE_DEVICES")
    # --num-gpus must not step outside a scheduler's allocation (ids 0..2 are other GPUs).
    with pytest.raises(LaunchError, match=r"--num-gpus 3 but CUDA_VISIBLE_DEVICES=5 allows 1 GPU"):
        detect_gpus(3, {"CUDA_VISIBLE_DEVICES": "5"})


@pytest.mark.parametrize(
    ("config", "num_gpus", "train", "server"),
    [
        ("vllm_server_gpu0_train_gpu1.yaml", 2, ["1"], ["0"]),  # the design's 2-GPU placement
        ("single_gpu.yaml", 2, ["0"], ["1"]),  # pinned to GPU 0
        ("cpu.yaml", 2, [], ["0", "1"]),
        ("multi_gpu.yaml", 8, ["0", "1", "2", "3"], ["4", "5", "6", "7"]),  # gpu_ids all: the first four train
        ("zero3.yaml", 6, ["0", "1", "2", "3"], ["4", "5"]),
    ],
)
def test_split_gpus(config, num_gpus, train, server):
    assert split_gpus(read_accelerate_config(CONFIGS / config), [str(i) for i in range(num_gpus)]) == (train, server)


def test_eight_gpus_four_train_on_4_to_7_server_gets_0_to_3_with_tp_dp(rig):
    four = rig.dir / "four.yaml"
    four.write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 4\ngpu_ids: 4,5,6,7\ndeepspeed_config:\n  zero_stage: 3\n"
    )
    setup = read_accelerate_config(four)
    train, free = split_gpus(setup, [str(i) for i in range(8)])
    assert (train, free) == (["4", "5", "6", "7"], ["0", "1", "2", "3"])
    assert server_parallelism(free, None, None) == (["0", "1", "2", "3"], 4, 1)
    assert server_parallelism(free, 2, None) == (["0", "1"], 2, 1)
    assert server_parallelism(["0", "1", "2"], None, None) == (["0", "1"], 2, 1)  # tp 3 cannot shard heads
    moe = replace(load_model_shape(MODEL)[0], experts=8)  # data parallel only for a mixture of experts
    assert server_parallelism(free, 2, 2, moe) == (["0", "1", "2", "3"], 2, 2)
    with pytest.raises(LaunchError, match=r"--vllm-tp 4 x --vllm-dp 2 = 8 GPUs, but only 4 are free"):
        server_parallelism(free, 4, 2, moe)

    plan = plan_launch(four, rig.recipe, rig.config, num_gpus=8, vllm_tp=2, log_dir=rig.dir)
    assert plan.server.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert plan.trainer.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert plan.server.argv[plan.server.argv.index("--tensor-parallel-size") + 1] == "2"
    assert plan.server.argv[plan.server.argv.index("--data-parallel-size") + 1] == "1"
    assert "idle: 2,3" in plan.render()


@pytest.mark.parametrize(
    ("config", "num_gpus", "train", "server", "tp"),
    [
        # the server's TP by trl_ext.launch.tensor_parallel's rule: 1 for a 1.7 B model, the other free GPUs idle
        ("cpu.yaml", 8, "", "0", 1),
        ("single_gpu.yaml", 8, "0", "1", 1),
        ("vllm_server_gpu0_train_gpu1.yaml", 2, "1", "0", 1),
        ("vllm_server_gpu0_train_gpu1.yaml", 4, "1", "0", 1),
        ("multi_gpu.yaml", 8, "0,1,2,3", "4", 1),
        ("zero2.yaml", 8, "0,1,2,3", "4", 1),
        ("zero3.yaml", 5, "0,1,2,3", "4", 1),
    ],
)
def test_exact_commands_for_each_accelerate_config(rig, config, num_gpus, train, server, tp):
    plan = plan_launch(CONFIGS / config, rig.recipe, rig.config, ["--seed", "3"], num_gpus=num_gpus, log_dir=rig.dir)
    assert plan.server.argv == (
        str(VENV_BIN / "trl"),
        "vllm-serve",
        "--model",
        MODEL,
        "--tensor-parallel-size",
        str(tp),
        "--data-parallel-size",
        "1",
        "--port",
        str(rig.port),
        "--host",
        "127.0.0.1",
    )
    assert plan.server.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": server}
    # Several training processes on one machine: a free torch rendezvous port, so two runs on a node never share one.
    rendezvous = []
    if read_accelerate_config(CONFIGS / config).num_processes > 1:
        rendezvous = ["--main_process_port", plan.trainer.argv[5]]
        assert 29500 <= int(plan.trainer.argv[5]) < 29700
    assert plan.trainer.argv == (
        str(VENV_BIN / "accelerate"),
        "launch",
        "--config_file",
        str(CONFIGS / config),
        *rendezvous,
        str(rig.recipe),
        "--config",
        str(rig.config),
        "--seed",
        "3",
    )
    assert plan.trainer.env == ({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} if train else {}) | {"CUDA_VISIBLE_DEVICES": train}
    assert plan.health_url == f"http://127.0.0.1:{rig.port}/health"
    assert plan.server_log == rig.dir / f"vllm_server_{rig.port}.log"


def test_trl_accepts_the_server_flags():
    """The flag names the launcher passes are ones `trl vllm-serve` (TRL 1.16) parses."""
    from trl.scripts.vllm_serve import make_parser

    args = make_parser().parse_args_and_config(
        ["--model", MODEL, "--tensor-parallel-size", "2", "--data-parallel-size", "1", "--port", "8001", "--host", "h"]
    )[0]
    assert (args.model, args.tensor_parallel_size, args.data_parallel_size, args.port, args.host) == (
        MODEL,
        2,
        1,
        8001,
        "h",
    )


def test_no_server_mode_runs_accelerate_only(rig):
    colocate = rig.dir / "colocate.yaml"
    colocate.write_text(f"model_name_or_path: {MODEL}\nuse_vllm: true\nvllm_mode: colocate\n")
    plan = plan_launch(CONFIGS / "single_gpu.yaml", rig.recipe, colocate)
    assert plan.server is None
    assert plan.trainer.env == {}  # accelerate's own gpu_ids handling applies
    assert "does not use vLLM server mode" in plan.notes[0]
    assert plan.trainer.argv[-2:] == ("--config", str(colocate))
    # A server on another machine is not ours to start.
    remote = plan_launch(
        CONFIGS / "zero3.yaml", rig.recipe, rig.config, ["--vllm_server_host", "10.0.0.5"], num_gpus=8
    )
    assert remote.server is None and "not this machine" in remote.notes[0]


def test_bad_input_errors_name_the_file_and_field(rig):
    with pytest.raises(LaunchError, match=r"no free GPU left for the vLLM server.*trains on \['0', '1'\]"):
        two = rig.dir / "two.yaml"
        two.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
        plan_launch(two, rig.recipe, rig.config, num_gpus=2)
    with pytest.raises(LaunchError, match=r"`gpu_ids` 1 names GPU\(s\) \['1'\] that are not available"):
        plan_launch(CONFIGS / "vllm_server_gpu0_train_gpu1.yaml", rig.recipe, rig.config, num_gpus=1)
    # accelerate's own loader refuses it, named with the file
    with pytest.raises(LaunchError, match=r"bad_accel.yaml: .*`distributed_type` must be specified"):
        bad = rig.dir / "bad_accel.yaml"
        bad.write_text("num_processes: 2\n")
        plan_launch(bad, rig.recipe, rig.config, num_gpus=2)
    with pytest.raises(LaunchError, match=r"accelerate config .*nope.yaml not found"):
        plan_launch(rig.dir / "nope.yaml", rig.recipe, rig.config)
    with pytest.raises(LaunchError, match=r"recipe script .*missing.py not found"):
        plan_launch(CONFIGS / "cpu.yaml", rig.dir / "missing.py", rig.config)
    with pytest.raises(LaunchError, match=r"`vllm_server_port` must be an integer"):
        plan_launch(CONFIGS / "cpu.yaml", rig.recipe, rig.config, ["--vllm_server_port", "abc"], num_gpus=1)
    no_model = rig.dir / "no_model.yaml"
    no_model.write_text("use_vllm: true\nvllm_mode: server\n")
    with pytest.raises(LaunchError, match=r"no_model.yaml: vLLM server mode needs `model_name_or_path`"):
        plan_launch(CONFIGS / "cpu.yaml", rig.recipe, no_model, num_gpus=1)


def test_dry_run_prints_both_commands_with_env_and_starts_nothing(rig):
    from typer.testing import CliRunner

    from trl_ext.cli import app

    accel = CONFIGS / "vllm_server_gpu0_train_gpu1.yaml"
    argv = ["launch", "--accelerate-config", str(accel), str(rig.recipe), "--config", str(rig.config)]
    result = CliRunner().invoke(
        app, [*argv, "--num-gpus", "2", "--dry-run", "--log-dir", str(rig.dir / "logs"), "--seed", "3"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    server_line = (
        f"server:  CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 {VENV_BIN / 'trl'} vllm-serve --model {MODEL} "
        "--tensor-parallel-size 1 "
        f"--data-parallel-size 1 --port {rig.port} --host 127.0.0.1"
    )
    trainer_line = "trainer: CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 " + shlex.join(
        [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(accel), str(rig.recipe)]
        + ["--config", str(rig.config), "--seed", "3"]
    )
    assert server_line in lines
    assert trainer_line in lines
    assert not (rig.dir / "logs").exists()  # nothing was started, not even the log


# The server's life, with real processes.


def test_success_server_healthy_before_trainer_and_nothing_left(rig):
    plan = rig.plan()
    code = run_launch(plan, health_timeout=20, grace=3, poll_interval=0.05, echo=lambda _: None)
    assert code == 0
    server, trainer = json.loads(rig.server_record.read_text()), json.loads(rig.trainer_record.read_text())
    assert trainer["health"] == 200  # the trainer started only once the server answered /health
    assert (server["cuda"], trainer["cuda"]) == ("0", "1")
    assert server["pgid"] == server["pid"]  # its own process group
    assert server["argv"][:2] == ["--port", str(rig.port)]
    assert trainer["rest"] == ["--seed", "3"]  # recipe args reach the trainer
    assert "stand-in server: loading weights" in plan.server_log.read_text()
    _assert_all_gone(rig.server_record, rig.trainer_record)


def test_server_process_context_manager_owns_its_group(rig):
    plan = rig.plan()
    with ServerProcess(plan.server, plan.server_log, plan.health_url, grace=3) as server:
        assert server.wait_healthy(20, poll_interval=0.05) < 20
        record = _wait_for(rig.server_record, timeout=10)
        assert record["pid"] == server.pid and _alive(record["worker"])
    _assert_all_gone(rig.server_record)


def test_missing_trainer_executable_is_an_error_and_stops_the_server(rig):
    plan = plan_launch(
        CONFIGS / "vllm_server_gpu0_train_gpu1.yaml",
        rig.recipe,
        rig.config,
        num_gpus=2,
        server_cmd=rig.server_cmd(),
        train_cmd=str(rig.dir / "no-such-trainer"),
        log_dir=rig.dir / "logs",
    )
    with pytest.raises(LaunchError, match=r"could not start the trainer .*no-such-trainer"):
        run_launch(plan, health_timeout=20, grace=3, poll_interval=0.05, echo=lambda _: None)
    _assert_all_gone(rig.server_record)


def test_trainer_failure_returns_its_code_and_stops_the_server(rig):
    assert run_launch(rig.plan(exit_code=7), health_timeout=20, grace=3, poll_interval=0.05, echo=lambda _: None) == 7
    assert json.loads(rig.trainer_record.read_text())["health"] == 200
    _assert_all_gone(rig.server_record, rig.trainer_record)


def test_server_exiting_early_shows_its_last_log_lines(rig):
    with pytest.raises(LaunchError) as info:
        run_launch(rig.plan(server_mode="exit"), health_timeout=20, grace=3, poll_interval=0.05, echo=lambda _: None)
    message = str(info.value)
    assert "exited early with code 3" in message
    assert "stand-in server: loading weights\nRuntimeError: CUDA out of memory (stand-in)" in message
    assert not rig.trainer_record.exists()  # the trainer never started
    _assert_all_gone(rig.server_record)  # the worker the server left behind is stopped with its group


def test_health_timeout_stops_the_server(rig):
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"did not become healthy within 1 s") as info:
        run_launch(rig.plan(server_mode="unhealthy"), health_timeout=1, grace=3, poll_interval=0.05, echo=print)
    assert time.monotonic() - start < 10
    assert "stand-in server: loading weights" in str(info.value)
    assert not rig.trainer_record.exists()
    _assert_all_gone(rig.server_record)


def test_port_in_use_is_refused_before_starting_anything(rig):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", rig.port))
        taken.listen()
        with pytest.raises(LaunchError, match=rf"port {rig.port} on 127.0.0.1 is already in use"):
            run_launch(rig.plan(), health_timeout=5, grace=1, poll_interval=0.05, echo=lambda _: None)
    assert not rig.server_record.exists()
    check_port_free("127.0.0.1", rig.port)  # free again once released


def test_server_ignoring_sigterm_is_killed_after_the_grace_period(rig):
    start = time.monotonic()
    code = run_launch(
        rig.plan(server_mode="ignore-term"), health_timeout=20, grace=0.5, poll_interval=0.05, echo=print
    )
    assert code == 0
    assert time.monotonic() - start >= 0.5
    _assert_all_gone(rig.server_record, rig.trainer_record)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_the_launcher_stops_trainer_and_server(rig, signum, code):
    """Ctrl-C (or SIGTERM) to the real CLI (`python -m trl_ext.cli launch ...`) while the trainer runs: 128 + signal,
    no orphans."""
    accel = CONFIGS / "vllm_server_gpu0_train_gpu1.yaml"
    argv = [sys.executable, "-m", "trl_ext.cli", "launch", "--accelerate-config", str(accel), str(rig.recipe)]
    argv += ["--config", str(rig.config), "--num-gpus", "2", "--log-dir", str(rig.dir / "logs"), "--grace", "3"]
    argv += ["--server-cmd", rig.server_cmd(), "--train-cmd", rig.train_cmd(sleep=60), "--poll-interval", "0.05"]
    launcher = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        trainer = _wait_for(rig.trainer_record, timeout=30)
        assert _alive(trainer["pid"]) and _alive(json.loads(rig.server_record.read_text())["pid"])
        launcher.send_signal(signum)
        output, _ = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == code, output
    assert f"interrupted by {signal.Signals(signum).name}" in output
    _assert_all_gone(rig.server_record, rig.trainer_record)


def test_real_accelerate_launch_gets_the_training_gpu(rig):
    """The one run through the real `accelerate launch` (its simple launcher: no GPU is touched): the recipe script
    receives exactly `--config YAML` plus the extra args, and accelerate keeps CUDA_VISIBLE_DEVICES at gpu_ids "1"."""
    rig.recipe.write_text(
        "import json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),"
        f" 'cpu': os.environ.get('ACCELERATE_USE_CPU')}}, open({str(rig.trainer_record)!r}, 'w'))\n"
    )
    plan = plan_launch(
        CONFIGS / "vllm_server_gpu0_train_gpu1.yaml",
        rig.recipe,
        rig.config,
        ["--seed", "3"],
        num_gpus=2,
        server_cmd=rig.server_cmd(),
        log_dir=rig.dir / "logs",
    )
    assert plan.trainer.argv[:2] == (str(VENV_BIN / "accelerate"), "launch")
    assert run_launch(plan, health_timeout=20, grace=3, poll_interval=0.05, echo=lambda _: None) == 0
    seen = json.loads(rig.trainer_record.read_text())
    assert seen == {"argv": ["--config", str(rig.config), "--seed", "3"], "cuda": "1", "cpu": "False"}
    assert json.loads(rig.server_record.read_text())["cuda"] == "0"
    _assert_all_gone(rig.server_record)


# Who can reach the server (pure: no process started; the real server's bind is tested in test_vllm_launch.py).


def test_server_binds_loopback_on_one_machine_whatever_the_recipe_host(rig):
    """TRL's default `vllm_server_host` is 0.0.0.0, which as a bind address exposes the weight-update endpoints of
    a VLLM_SERVER_DEV_MODE=1 server to the network. On one machine the server binds 127.0.0.1; a recipe host the
    trainer could not reach it at (the machine's name, `::`) is replaced for the trainer, with a note."""
    accel = CONFIGS / "vllm_server_gpu0_train_gpu1.yaml"
    plan = plan_launch(accel, rig.recipe, rig.config, ["--vllm_server_host", "0.0.0.0"], num_gpus=2)
    assert plan.server.argv[plan.server.argv.index("--host") + 1] == "127.0.0.1" and plan.host == "127.0.0.1"
    assert plan.trainer.argv[-2:] == ("--vllm_server_host", "0.0.0.0")  # 0.0.0.0 connects to the local host
    assert "the server binds 127.0.0.1" in plan.render()
    named = plan_launch(accel, rig.recipe, rig.config, ["--vllm_server_host", socket.gethostname()], num_gpus=2)
    assert named.server.argv[named.server.argv.index("--host") + 1] == "127.0.0.1"
    assert named.trainer.argv[-2:] == ("--vllm_server_host", "127.0.0.1")
    assert f"instead of {socket.gethostname()}" in named.render()
    url = plan_launch(accel, rig.recipe, rig.config, ["--vllm_server_base_url", f"http://[::]:{rig.port}"], num_gpus=2)
    assert url.trainer.argv[-2:] == ("--vllm_server_base_url", f"http://127.0.0.1:{rig.port}")


def test_multi_machine_config_starts_one_server_on_machine_0(rig):
    """Bug caught: a multi-machine config made every node start a server. Only training rank 0 talks to the
    server (TRL's VLLMGeneration makes the client on the main process only), and it runs on machine 0: machine 0
    starts one on loopback, the other machines run the trainer only (`machine_rank` from the config or
    --machine-rank, which accelerate gets too)."""
    two_nodes = rig.dir / "two_nodes.yaml"
    two_nodes.write_text(
        "distributed_type: MULTI_GPU\nnum_processes: 2\nnum_machines: 2\nmachine_rank: 0\ngpu_ids: '1'\n"
    )
    first = plan_launch(two_nodes, rig.recipe, rig.config, num_gpus=2)
    assert first.server is not None and first.server.argv[first.server.argv.index("--host") + 1] == "127.0.0.1"
    second = plan_launch(two_nodes, rig.recipe, rig.config, num_gpus=2, machine_rank=1)
    assert second.server is None and "runs on machine 0 only" in second.render()
    assert second.trainer.argv[4:6] == ("--machine_rank", "1")
    (rig.dir / "rank1.yaml").write_text(two_nodes.read_text().replace("machine_rank: 0", "machine_rank: 1"))
    assert plan_launch(rig.dir / "rank1.yaml", rig.recipe, rig.config, num_gpus=2).server is None
    with pytest.raises(LaunchError, match=r"--machine-rank 2 is not in 0..1"):
        plan_launch(two_nodes, rig.recipe, rig.config, num_gpus=2, machine_rank=2)


def test_cpu_build_without_gpus_serves_on_the_cpu(rig, monkeypatch):
    """With vLLM's CPU build and no GPU the server runs on the CPU (one process, no CUDA_VISIBLE_DEVICES); without
    the CPU build the same machine still has no GPU for the server."""
    import trl_ext.launch.planning as planning

    monkeypatch.setattr(planning, "vllm_cpu_build", lambda: True)
    plan = plan_launch(CONFIGS / "cpu.yaml", rig.recipe, rig.config, num_gpus=0)
    assert plan.server.env == {} and plan.server_gpus == ()
    assert plan.server.argv[plan.server.argv.index("--tensor-parallel-size") + 1] == "1"
    assert "on the CPU (vLLM's CPU build, no GPU found)" in plan.render()
    with pytest.raises(LaunchError, match="CPU build serves from one process"):
        plan_launch(CONFIGS / "cpu.yaml", rig.recipe, rig.config, num_gpus=0, vllm_tp=2)
    monkeypatch.setattr(planning, "vllm_cpu_build", lambda: False)
    with pytest.raises(LaunchError, match="no free GPU left for the vLLM server"):
        plan_launch(CONFIGS / "cpu.yaml", rig.recipe, rig.config, num_gpus=0)


def test_data_parallel_is_refused_for_dense_models(rig):
    """Bug caught: `--vllm-dp 2` was passed on, and docs/launch.md suggested `--vllm-tp 2 --vllm-dp 2`; TRL
    1.16's `trl vllm-serve` says data parallel above 1 errors out for dense models (every shipped model)."""
    from trl.scripts.vllm_serve import ScriptArguments

    assert "will error out" in ScriptArguments.__doc__ and "dense" in ScriptArguments.__doc__  # TRL's own words
    four = CONFIGS / "zero3.yaml"
    with pytest.raises(LaunchError, match=r"--vllm-dp 2: Qwen/Qwen3-1.7B is a dense model"):
        plan_launch(four, rig.recipe, rig.config, num_gpus=8, vllm_tp=2, vllm_dp=2, log_dir=rig.dir)
    with pytest.raises(LaunchError, match=r"--vllm-tp 3 does not shard Qwen/Qwen3-1.7B .* 1, 2, 4"):
        plan_launch(four, rig.recipe, rig.config, num_gpus=8, vllm_tp=3, log_dir=rig.dir)


def test_serve_only_starts_the_recipes_server_alone_on_this_machines_address(rig):
    """`--serve-only` (the server on a node of its own): the same server command, listening on the given address
    (default: the address this machine's name resolves to) at the recipe's port (not picked: the trainers elsewhere
    state it), on every GPU here; no trainer. Run, it serves until SIGTERM and stops its server. A recipe that is not
    in server mode is refused."""
    from trl_ext.launch.remote_server import this_machine_address

    accel = CONFIGS / "vllm_server_gpu0_train_gpu1.yaml"
    plan = plan_launch(accel, rig.recipe, rig.config, num_gpus=2, serve_only=True, bind="127.0.0.1",
                       server_cmd=rig.server_cmd(), log_dir=rig.dir / "logs")  # fmt: skip
    assert plan.trainer is None and plan.server_gpus == ("0",) and plan.port == rig.port
    assert plan.host == "127.0.0.1" and "trainer:" not in plan.render()
    assert f"listening on 127.0.0.1:{rig.port} for the machines that train" in plan.render()
    default = plan_launch(accel, rig.recipe, rig.config, num_gpus=2, serve_only=True)
    assert default.server.argv[default.server.argv.index("--host") + 1] == this_machine_address()
    import threading

    said: list[str] = []

    def stop_once_serving():  # SIGTERM to this process, as to a launch: the launcher's handler takes it
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any("serving until stopped" in line for line in said):  # the launcher's handler is in place
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    threading.Thread(target=stop_once_serving, daemon=True).start()
    assert run_launch(plan, grace=3, poll_interval=0.05, echo=said.append) == 143
    assert said[-1] == "interrupted by SIGTERM: vLLM server stopped" and "serving until stopped" in said[-2], said
    _assert_all_gone(rig.server_record)
    (rig.dir / "plain.yaml").write_text("base: base.yaml\nvllm_mode: colocate\n")
    with pytest.raises(LaunchError, match="--serve-only: recipe .*plain.yaml does not use vLLM server mode"):
        plan_launch(accel, rig.recipe, rig.dir / "plain.yaml", num_gpus=2, serve_only=True)


def test_a_server_on_another_machine_is_named_and_waited_for_and_an_unreachable_one_refused(rig):
    """`vllm_server_host` naming another machine: the plan names its host, address and URL; a host that does not
    resolve is refused before anything starts; run, the launch waits for the server's /health before the trainer
    starts and, when nothing answers in `--health-timeout`, stops with the URL and how to start the server there
    (the trainer never started)."""
    accel = CONFIGS / "vllm_server_gpu0_train_gpu1.yaml"
    with pytest.raises(LaunchError, match=r"vllm_server_host 'no-such-node.invalid' does not resolve"):
        plan_launch(accel, rig.recipe, rig.config, ["--vllm_server_host", "no-such-node.invalid"], num_gpus=2)
    plan = plan_launch(accel, rig.recipe, rig.config, ["--vllm_server_host", "127.0.0.2"], num_gpus=2,
                       train_cmd=rig.train_cmd())  # fmt: skip
    url = f"http://127.0.0.2:{rig.port}/health"
    assert plan.server is None and plan.remote_health_url == url
    assert "the vLLM server runs on 127.0.0.2 (127.0.0.2), not here: the trainer reaches it at" in plan.render()
    with pytest.raises(LaunchError, match=rf"the vLLM server at {url} did not answer within 1 s: start it"):
        run_launch(plan, health_timeout=1, poll_interval=0.2, echo=lambda _: None)
    assert not rig.trainer_record.exists()


def test_cpu_training_processes_of_a_group_run_on_plain_cpu(rig):
    """Several CPU training processes (`cpu_two_nodes.yaml`, and a one-machine copy): accelerate starts them through
    torchrun, which drops the config's `use_cpu` (each Trainer would train alone) and names their device `cpu:0`
    (torch cannot load a resumed optimizer state to it): the trainer gets ACCELERATE_USE_CPU and
    ACCELERATE_TORCH_DEVICE=cpu. Not for one process, nor DeepSpeed (which the first would turn off)."""
    want = {"ACCELERATE_USE_CPU": "true", "ACCELERATE_TORCH_DEVICE": "cpu"}
    plain = rig.dir / "plain.yaml"
    plain.write_text("base: base.yaml\nvllm_mode: colocate\nuse_vllm: false\n")
    for rank in (0, 1):
        plan = plan_launch(CONFIGS / "cpu_two_nodes.yaml", rig.recipe, plain, num_gpus=0, machine_rank=rank)
        assert want.items() <= plan.trainer.env.items() and plan.trainer.argv[4:6] == ("--machine_rank", str(rank))
    for config in ("cpu.yaml", "cpu_zero3.yaml"):
        plan = plan_launch(CONFIGS / config, rig.recipe, plain, num_gpus=0)
        assert not set(want) & set(plan.trainer.env), config
