"""GRPO in vLLM server mode on the CPU with the real engine: the trainer's weights reach a running server after every
optimizer step, under DDP and DeepSpeed ZeRO-3, and for expert iteration's and SFT's
validation.

One server for the module: `trl vllm-serve` on vLLM's CPU build with the gloo weight transfer, its command composed
as `trl-ext launch` composes it (`trl_ext.launch.planning.server_command`, `trl_ext.launch.cpu_layout.
cpu_server_args`), in vLLM's uniprocess executor (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: no worker process busy-polling
a queue after every request, see `_start_server`). Against it, in child processes (tests/scripts/vllm_server_sync.py;
TRL's own `VLLMGeneration.sync_weights` drives `trl_ext.grpo.vllm.client.TrlExtVLLMClient`):

1. two training processes under `accelerate launch --config_file accelerate_configs/cpu_zero3.yaml`: first DDP over
   gloo, 3 optimizer steps (and the async DDP runs), the launch's DeepSpeed set aside while these build their
   trainers (under torchrun instead where DeepSpeed is not installed and the ZeRO-3 tests skip);
2. then in the same processes DeepSpeed ZeRO-3 (TRL gathers each module's shards for the sync), 4 steps with a
   checkpoint at step 2, then a new trainer resumes from it; then 3 steps with PEFT LoRA;
3. one process, a new trainer per run, each joining the server's transfer anew: first the two stall runs, each in a
   child forked from it (the module stops the server with SIGSTOP mid-generation and mid-sync; the watchdog ends the
   child; the process reaps it and reports its exit and anything it left running); then 4 steps plain with a
   checkpoint at step 2 and the run resumed from it, 3 steps with `padding_free`, with PEFT LoRA (merged for the sync
   by TRL); a 12-step GRPO run on the digit-share reward; expert iteration and `ValidatingSFTTrainer` validating with
   the server; then a run whose server the module kills (SIGKILL) after its first step.

After each step of the runs in 1, 2 and 3 the weights are synced and the server generates greedily from 4 fixed
prompts; the log-probs it returns for its tokens equal a plain float32 forward of the trainer's model within 1e-4
(measured <= 6e-6), while training moved those log-probs by 2 to 8 from the initial weights'. With TRL's sync
turned off (`--no-sync`, not in the suite) the same check fails by 6.6, 7.3 and 10.4 at steps 1-3.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from helpers import free_port
from vllm_async_checks import (  # noqa: F401 -- the async rollouts' checks, collected here to share this module's server
    _async,
    read_async,
    test_async_importance_ratio_is_against_the_samplers_log_probs,
    test_async_mid_batch_request_with_dynamic_sampling_padding_free_and_dr_grpo,
    test_async_one_batch_ahead_keeps_the_prompts_and_tags_each_row_with_its_sampler,
    test_async_staleness_zero_is_the_synchronous_path,
    test_async_under_ddp_two_processes_and_across_an_epoch,
)
from vllm_helpers import (
    KV_CACHE_BYTES,
    REPO,
    SCRIPTS,
    child_env,
    marked_processes,
    require_vllm_cpu,
    run_checked,
    save_engine_model,
)

LOGP_TOL = 1e-4  # float32 server vs float32 forward; measured <= 6e-6
MOVED = 1.0  # training moved the checked log-probs at least this much (measured 2 to 7): a stale server fails
IS_TOL = 1e-3  # |mean importance-sampling ratio - 1|; measured <= 4e-6
LEARN_STEPS, WINDOW, RISE = 12, 2, 0.25
STALL_TIMEOUT = 15.0  # vllm_server_timeout of the stall runs: the watchdog's bound (a generation: 1-10 s under load)
TIMEOUT = 300.0  # vllm_server_timeout of the runs: the wait for the server, and the bound on every sync request
SERVER_ARGS = f"--dtype float32 --max_model_len 256 --enforce_eager --kv-cache-memory-bytes {KV_CACHE_BYTES}"

pytestmark = pytest.mark.slow


def _start_server(root: Path, model: str, marker: str):
    from trl_ext.launch import Command, ServerProcess, server_command
    from trl_ext.launch.cpu_layout import cpu_server_args

    port = free_port()
    args, _ = cpu_server_args(SERVER_ARGS.split(), None, "float32")
    command = server_command(model, "127.0.0.1", port, 1, 1, [], args)
    # The server samples correctly under any ATEN_CPU_CAPABILITY: `cpu_server_args` gives it the sampler fix
    # (`--use-fp64-gumbel`, trl_ext.grpo.vllm.cpu_sampler; tests/test_vllm_sampler.py).
    # The engine's worker in the engine's own process (vLLM's uniprocess executor): on the CPU build, vLLM's default
    # there (a worker process fed through a shared-memory queue) busy-polls that queue for 1 s after every request,
    # which cost more CPU than the rest of the server (93 s of 137 s in one measured run of this module).
    env = child_env(TRL_EXT_TEST_MARK=marker, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    command = Command(command.argv, env)
    server = ServerProcess(command, root / "server.log", f"http://127.0.0.1:{port}/health", grace=5)
    server.start()
    return server, port


def _script_args(out: Path, port: int, model: str, runs: str) -> list[str]:
    return [str(out), "--port", str(port), "--model", model, "--runs", runs, "--learn-steps", str(LEARN_STEPS),
            "--timeout", str(TIMEOUT)]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Starts the server, runs 1 (DDP) then 2 (which ends in the kill) against it; the records of every run, the
    kill's timings and what was left running before and after the server's process group was stopped."""
    require_vllm_cpu()
    root = tmp_path_factory.mktemp("server_sync")
    model = save_engine_model(root / "model")
    server_mark, trainer_mark = uuid.uuid4().hex, uuid.uuid4().hex
    server, port = _start_server(root, model, server_mark)
    result: dict = {"server_log": str(server.log_path)}
    try:
        out = root / "out"
        out.mkdir()
        if deepspeed_required():
            # ZeRO-3, 4 steps with a checkpoint at 2, then a new trainer resumes; first, in the same two
            # processes, the DDP runs (DeepSpeed set aside while they build their trainers) and the async ones.
            config = REPO / "accelerate_configs" / "cpu_zero3.yaml"
            launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                      "--main_process_port", str(free_port())]  # fmt: skip
            runs_ = "ddp,async_ddp,zero3_full,zero3_resume,zero3_peft"
        else:
            launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
                      f"--master_port={free_port()}"]  # fmt: skip
            runs_ = "ddp,async_ddp"
        argv = [*launch, str(SCRIPTS / "vllm_server_sync.py"), *_script_args(out, port, model, runs_),
                "--group-port", str(free_port())]  # fmt: skip
        run_checked(argv, 900, root / "two_processes.log", TRL_EXT_TEST_MARK=trainer_mark)
        marker = root / "kill.marker"
        runs_ = "stall_gen,stall_sync,resume_full,resume,padding_free,peft,learn,ei,sft,finish_reasons,async,kill"
        argv = [
            sys.executable,
            str(SCRIPTS / "vllm_server_sync.py"),
            # the finish reasons and the async runs in this process too; the stall runs first, each
            # forked from it (its imports paid once)
            *_script_args(out, port, model, runs_),
            "--kill-marker",
            str(marker),
            "--stall-dir",
            str(root),
            "--stall-timeout",
            str(STALL_TIMEOUT),
        ]
        env = child_env(TRL_EXT_TEST_MARK=trainer_mark, TRL_EXT_VLLM_SERVER_LOG=str(server.log_path))
        with open(root / "single.log", "w") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            # The watchdog: the server stopped (SIGSTOP) mid-generation and mid-sync, resumed afterwards (a
            # sync cut short leaves the server mid-reload: the test finishes it before the next run).
            result["stall"] = {run: _stall(root, port, run, server, proc) for run in ("stall_gen", "stall_sync")}
            deadline = time.monotonic() + 900
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if marker.exists():
                os.kill(server.pid, signal.SIGKILL)
                result["killed"] = time.monotonic()
            try:
                result["code"] = proc.wait(timeout=TIMEOUT + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                result["code"] = proc.wait()
            result["exited"] = time.monotonic()
        result["output"] = (root / "single.log").read_text(errors="replace")
        result["trainer_left"] = marked_processes(trainer_mark)
        result["runs"] = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
        result["async"] = read_async(out)
    finally:
        server.stop()
        result["server_left"] = marked_processes(server_mark)
        for pid in marked_processes(server_mark) + marked_processes(trainer_mark):
            os.kill(pid, signal.SIGKILL)  # nothing left for the next module, whatever the assertions say
    return result


def deepspeed_required() -> bool:
    """Whether the ZeRO-3 launch runs: DeepSpeed is installed, or `make test` requires it (the deepspeed extra is
    part of `make install` on a CPU machine); else the ZeRO-3 tests skip."""
    return importlib.util.find_spec("deepspeed") is not None or os.environ.get("TRL_EXT_REQUIRE_VLLM") == "1"


def _stall(root: Path, port: int, run: str, server, proc: subprocess.Popen) -> dict:
    """Waits for stall run `run` (forked by the script's process `proc`, `--stall-dir`; `vllm_server_timeout`
    STALL_TIMEOUT) to signal its pause, stops the server's process group (SIGSTOP), lets the run go on, and reads its
    exit (code, time, what it left running, as the script's process reaped it); then continues the server, finishes
    a weight update cut short, and lets the script go on."""
    marker, exit_file = root / f"{run}.marker", root / f"{run}.exit"
    record: dict = {}
    deadline = time.monotonic() + 600
    while not marker.exists() and not exit_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        if marker.exists():
            os.killpg(server.pid, signal.SIGSTOP)
            record["stopped"] = time.monotonic()
            Path(f"{marker}.ack").write_text("")
        deadline = time.monotonic() + STALL_TIMEOUT + 60
        while not exit_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not exit_file.exists():
            pid_file = root / f"{run}.pid"
            if pid_file.exists():
                os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the script reaps it and writes its exit
            deadline = time.monotonic() + 60
            while not exit_file.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        if exit_file.exists():
            record.update(json.loads(exit_file.read_text()))
    finally:
        os.killpg(server.pid, signal.SIGCONT)
    if run == "stall_sync":
        # The stopped trainer left the server mid-update (vLLM refuses the next `start_weight_update` until it is
        # finished); finishing it with nothing received puts the previous weights back (vLLM's layerwise reload).
        # Unless the update finished already: the trainer's remaining tensors can fit in the socket buffers and its
        # own `finish_weight_update` in the listen backlog of the stopped server, which serves both once continued
        # (seen under heavy load); vLLM then answers 500, its log naming the unmatched finish.
        request = urllib.request.Request(f"http://127.0.0.1:{port}/finish_weight_update", data=b"{}", method="POST")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                record["finished"] = response.status
        except urllib.error.HTTPError as error:
            unmatched = "finish_weight_update called without a matching start_weight_update"
            if error.code != 500 or unmatched not in server.log_path.read_text(errors="replace"):
                raise
            record["finished"] = "by the stopped trainer"
    server.wait_healthy(900)
    (root / f"{run}.go").write_text("")
    log = root / f"{run}.log"
    record["output"] = log.read_text(errors="replace") if log.exists() else ""
    return record


def _checks(runs: dict, name: str) -> list[dict]:
    record = runs["runs"].get(name)
    assert record is not None, runs["output"][-4000:]
    assert "error" not in record, record["error"]
    return record["checks"]


@pytest.mark.parametrize("name", ["resume_full", "padding_free", "peft", "ddp", "zero3_full", "zero3_peft"])
def test_server_log_probs_equal_the_trainers_forward_after_every_step(runs, name):
    """After each of 3 optimizer steps (4 for the runs with a checkpoint; learning rate 5e-2) and TRL's sync, the
    log-probs the server returns for the tokens it generated greedily from 4 fixed prompts equal a float32 forward of
    the trainer's weights on the same tokens, for a plain run, `padding_free`, PEFT LoRA (TRL merges the adapters for
    the sync and sends the base names), two DDP processes and two ZeRO-3 processes, plain and with LoRA (TRL gathers
    each module's shards for the sync; the forward is of the weights gathered the same way,
    `deepspeed.zero.GatheredParameters`, into a plain copy with the same adapters). Catches a
    sync that sends nothing or stale weights (the server keeps the initial weights: the check fails by 6.6 at step
    1), a missed tensor (a tied LM head left packed from the old weights: differences of 1 and more), misnamed tensors
    (vLLM refuses them), LoRA deltas sent unmerged and ZeRO-3 shards sent ungathered (vLLM refuses their shapes)."""
    skip_without_deepspeed(runs, name)
    checks = _checks(runs, name)
    if name == "ddp":  # also where it runs in the ZeRO-3 launch's processes: DDP, not DeepSpeed
        assert runs["runs"][name]["wrapped"] == "DistributedDataParallel", runs["runs"][name]["wrapped"]
    assert [c["step"] for c in checks] == ([1, 2, 3, 4] if name.endswith("_full") else [1, 2, 3])
    for check in checks:
        assert check["gap"] < LOGP_TOL, (name, check["step"], check["gap"])
        assert check["moved"] > MOVED, (name, check["step"], check["moved"])  # the weights visibly moved
        assert len(check["rows"]) == 4 and all(len(row["completion"]) > 0 for row in check["rows"])


def test_grpo_learns_in_server_mode_with_the_importance_ratio_at_one(runs):
    """A 12-step GRPO run in server mode on the digit-share reward (16 completions a step): the mean reward of the
    last 2 steps exceeds that of the first 2 by 0.25 or more. Measured over 10 runs (6 with the CPU's default kernels,
    4 with ATEN_CPU_CAPABILITY=avx2 in the trainer): rises 0.76 to 0.93 (first windows 0.05-0.24, last 0.89-1.0).
    Two windows of 32 completions of a reward in [0, 1] differ with SE <= 0.125 (SD 0.5 each), so the bound is
    4 worst-case SE below the smallest rise (about 19 SE with the measured SDs, ~0.15 at the start, ~0 at the end).
    And TRL's `sampling/importance_sampling_ratio/mean` (trainer / server probability of the sampled completions) is
    within 1e-3 of 1 at every step after the first: the server samples from the trainer's current weights. A server
    left on older weights puts the ratio far from 1 (0.60 and 0.036 at steps 2-3 without the sync) and learns from
    stale samples."""
    record = runs["runs"]["learn"]
    assert "error" not in record, record.get("error")
    logs = [entry for entry in record["log_history"] if "reward" in entry]
    assert len(logs) == LEARN_STEPS
    rewards = [entry["reward"] for entry in logs]
    before, after = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    assert after - before >= RISE, rewards
    ratios = [entry["sampling/importance_sampling_ratio/mean"] for entry in logs]
    assert all(abs(r - 1) < IS_TOL for r in ratios[1:]), ratios


def test_server_killed_mid_run_stops_the_trainer_naming_the_servers_log(runs):
    """SIGKILL to the server after the run's first step: the next step's sync fails at once (no retries, every
    request bounded by `vllm_server_timeout`), the trainer exits 1 with `VLLMServerError` naming the server and its
    log (with the log's last lines), and no process of the trainer is left; none of the server's either once its
    process group is stopped (as `trl-ext launch` stops it). Catches a trainer that hangs in a broadcast or retries
    for minutes, an error that does not say where to look, and a trainer process that outlives its failure."""
    assert "killed" in runs, runs["output"][-4000:]
    assert runs["code"] == 1, runs["output"][-4000:]
    assert runs["exited"] - runs["killed"] < TIMEOUT
    record = runs["runs"]["kill"]
    assert record["global_step"] == 1
    error = record["error"]
    # The watchdog's wrapper names the step first, then the client's error naming the server.
    assert error.startswith(
        "ServerSyncError: weight sync at step 1 failed: VLLMServerError: the vLLM server at http://"
    )
    assert f"Server log: {runs['server_log']}; last lines:" in error
    assert runs["trainer_left"] == [] and runs["server_left"] == []


def test_finished_follows_the_servers_own_finish_reason(runs):
    """In server mode (tests/scripts/vllm_server_finish_reasons.py): with `mask_truncated_completions`,
    n=4 seeded samples of 6 prompts per case, TRL's request through `VLLMClient`; the same body posted to the server
    is the reference. On every row the trainer generated the reference's ids and called a completion finished exactly
    when the server's `finish_reason` is "stop" (its loss mask whole, else empty). With the tags special to the
    trainer and `skip_special_tokens: false`, completions stopped at a tag are ones the token-tail rule (the old
    mixin's) calls truncated. Catches reasons dropped, misordered, or not broadcast to TRL's per-process slice."""
    record = runs["runs"].get("finish_reasons")
    assert record is not None, runs["output"][-4000:]
    for name in ("special_stop", "min_tokens"):
        rows = record[name]["rows"]
        assert len(rows) == 24
        for row in rows:
            n, stopped = len(row["ids"]), row["reason"] == "stop"
            assert row["trainer_ids"][:n] == row["ids"] and set(row["trainer_ids"][n:]) <= {record["pad"]}, row
            assert row["finished"] == stopped and row["mask_sum"] == (n if stopped else 0), row
        assert "length" in {row["reason"] for row in rows}
    special = record["special_stop"]["rows"]
    assert sum(row["reason"] == "stop" and not row["tail_rule"] for row in special) >= 4


@pytest.mark.parametrize(
    "run, where",
    [("stall_gen", "generation request (generate) at step 1 "), ("stall_sync", "weight sync at step 1, tensor '")],
)
def test_a_stopped_server_stops_the_trainer_within_the_timeout_saying_where(runs, run, where):
    """The server's process group stopped (SIGSTOP) just before a generation request (TRL's request has no
    timeout of its own: without the watchdog it waits forever) or in the middle of a weight sync (after the third
    tensor was handed over): the trainer ends within `vllm_server_timeout` (15 s) plus 5 s of the stop, its output
    names the step, the operation and for the sync the tensor, with the server log's last lines, and no process of
    it is left (the stall runs are forked children of the script's process, their subreaper: anything a run left
    running is reparented there and reported). The watchdog ends it with exit code 3; the gloo sync may instead fail
    on its own bounded wait (exit 1, `ServerSyncError` with the same facts)."""
    from trl_ext.grpo.vllm.watchdog import STALL_EXIT_CODE

    record = runs["stall"][run]
    assert "stopped" in record, record["output"][-4000:]
    assert record["code"] in (STALL_EXIT_CODE, 1), record["output"][-4000:]
    assert record["exited"] - record["stopped"] <= STALL_TIMEOUT + 5, record["output"][-4000:]
    if record["code"] == STALL_EXIT_CODE:
        assert f"vLLM server watchdog: {where}" in record["output"], record["output"][-4000:]
        assert f"last 20 lines of the server log {runs['server_log']}:" in record["output"]
    else:
        assert f"ServerSyncError: {where}" in record["output"], record["output"][-4000:]
    assert record["left"] == []


@pytest.mark.parametrize("full_name, resumed_name", [("resume_full", "resume"), ("zero3_full", "zero3_resume")])
def test_a_resumed_run_generates_from_the_resumed_weights_and_continues_as_the_uninterrupted_one(
    runs, full_name, resumed_name
):
    """In one process and in two ZeRO-3 processes (DeepSpeed's sharded checkpoint): 4 steps with a
    checkpoint at step 2, then a new trainer resumes from that checkpoint against the same server, which holds the
    step-4 weights by then. At the resumed run's first sync (before its first generation, before step 3) the server's
    greedy log-probs equal a forward of the trainer's resumed weights within 1e-4, and those weights are not the
    initial ones; steps 3-4 generate the same completions as the uninterrupted run (fixed per-request seed) and log
    the same losses within 1e-5, rewards and gradient norms."""
    skip_without_deepspeed(runs, full_name)
    full, resumed = _record(runs, full_name), _record(runs, resumed_name)
    check = resumed["after_resume"]
    assert check["step"] == 2 and check["gap"] < LOGP_TOL and check["moved"] > MOVED, check
    late = [g for g in full["generations"] if g["step"] >= 2]
    assert [g["step"] for g in resumed["generations"]] == [g["step"] for g in late] == [2, 3]
    assert [g["completion_ids"] for g in resumed["generations"]] == [g["completion_ids"] for g in late]
    # GRPO's loss on fresh samples is ~1e-6 (the advantages sum to zero per group): the gradient norms and the
    # rewards are compared too (measured: equal to the last digit; grad norms 2.2 and 3.7).
    logged = {e["step"]: e for e in full["log_history"] if "loss" in e}
    again = {e["step"]: e for e in resumed["log_history"] if "loss" in e and e["step"] > 2}
    assert sorted(again) == [3, 4] and sorted(logged) == [1, 2, 3, 4]
    for step, entry in again.items():
        assert abs(entry["loss"] - logged[step]["loss"]) < 1e-5, (step, entry, logged[step])
        assert abs(entry["grad_norm"] - logged[step]["grad_norm"]) < 1e-5 * logged[step]["grad_norm"], step
        assert entry["reward"] == logged[step]["reward"] and logged[step]["grad_norm"] > 0.1, step


def test_expert_iteration_syncs_the_server_over_gloo_exactly(runs):
    """`ExpertIterationTrainer` in server mode on the CPU builds the gloo client GRPO uses (TRL's own
    client needs NCCL): after 2 EI steps and TRL's sync the server's greedy log-probs equal the trainer's forward.
    And its validation after each EI step (2 SFT steps each: global steps 2 and 4) generated from the weights of that
    moment: right after it, with no sync of the check's own, the server's log-probs equal the trainer's forward."""
    record = _record(runs, "ei")
    (check,) = record["checks"]
    assert check["gap"] < LOGP_TOL and check["moved"] > 0.1, check
    validations = record["validation_checks"]
    assert [c["step"] for c in validations] == [2, 4], validations
    for check in validations:
        assert check["gap"] < LOGP_TOL and check["moved"] > MOVED, check
    assert [e["step"] for e in record["log_history"] if "eval_reward" in e] == [2, 4]


def test_sft_validation_pushes_the_weights_to_the_server_over_gloo_exactly(runs):
    """`ValidatingSFTTrainer` measuring accuracy with a server (`vllm_mode: server`, greedy, 4 Countdown
    problems) after each of 2 SFT steps (learning rate 5e-2) pushes its weights over the gloo transfer first: right
    after each measurement, with no sync of the check's own, the server's greedy log-probs on the fixed prompts equal
    a forward of the trainer's model within 1e-4, and training moved them by more than 1. Catches a validation that
    measures the server's stale weights or one that needs TRL's NCCL client."""
    record = _record(runs, "sft")
    checks = record["validation_checks"]
    assert [c["step"] for c in checks] == [1, 2], checks
    for check in checks:
        assert check["gap"] < LOGP_TOL and check["moved"] > MOVED, check
    logged = [e for e in record["log_history"] if "eval_reward" in e]
    assert [e["step"] for e in logged] == [1, 2] and all(e["eval_completions/mean_length"] > 0 for e in logged)


def test_zero3_runs_are_deepspeed_stage_3_with_both_processes_counted(runs):
    """The ZeRO-3 runs trained in a `DeepSpeedEngine` at stage 3, and a model loaded after the trainer was
    built (transformers' `zero.Init` under the active config) came out sharded over the 2 processes: DeepSpeed's
    communication layer counts both (`trl_ext.grpo.deepspeed_comm.join_deepspeed_comm`; before it, that load stopped on
    DeepSpeed's batch assertion, `train_batch_size 16 != 8 * 1 * 1`), and started without building DeepSpeed's
    shared-memory all-reduce, which training does not use (its JIT build took 1.5 to 3 minutes of this module)."""
    skip_without_deepspeed(runs, "zero3_full")
    for name in ("zero3_full", "zero3_resume", "zero3_peft"):
        record = _record(runs, name)
        assert record["wrapped"] == "DeepSpeedEngine", record["wrapped"]
        facts = record["engine"]
        assert facts["zero_stage"] == 3 and facts["loaded_sharded"], facts
        assert facts["shard_numel"] == -(-facts["full_numel"] // 2), facts  # half of the tensor, rounded up
        # DeepSpeed's communication layer started without compiling its shared-memory all-reduce (minutes of g++)
        assert facts["shm_comm_op_built"] is False, facts


def test_no_method_is_replaced_on_a_library_object_in_server_mode(runs):
    """Every run's trainer (GRPO on one and two processes, under ZeRO-3, with PEFT, padding-free, async rollouts on one
    and two processes with dynamic sampling, expert iteration, SFT validation), after training or, for the runs this
    module's script instruments itself, as built: no instance attribute of the trainer, its vLLM generation, its
    client or DeepSpeed's communication backend shadows a method of its class. Every behaviour of trl_ext there is an
    override in a subclass (`TrlExtVLLMGeneration`, `TrlExtVLLMClient`); catches a wrapper assigned onto a live
    object, as `client._post = ...` once was."""
    checked = {name: record["shadowed"] for name, record in runs["runs"].items() if "shadowed" in record}
    result = _async(runs)
    for name, record in result.items():
        if name != "ddp" and isinstance(record, dict) and "shadowed" in record:
            checked[f"async/{name}"] = record["shadowed"]
    for rank, ranks_runs in enumerate(result["ddp"]):
        checked.update({f"async_ddp/{name}/rank{rank}": record["shadowed"] for name, record in ranks_runs.items()})
    expected = {
        "ddp",
        "padding_free",
        "peft",
        "resume_full",
        "ei",
        "sft",
        "async/midbatch",
        "async_ddp/ddp_staleness1/rank1",
    }
    if deepspeed_required():
        expected |= {"zero3_full", "zero3_peft"}
    assert expected <= set(checked), sorted(checked)
    assert all("vllm_client" in checked[name] for name in ("padding_free", "ei", "sft", "async/midbatch")), checked
    if deepspeed_required():
        assert "deepspeed_comm" in checked["zero3_full"], checked["zero3_full"]
    assert {name: found for name, found in checked.items() if any(found.values())} == {}


def skip_without_deepspeed(runs: dict, name: str) -> None:
    if name.startswith("zero3") and not deepspeed_required():
        pytest.skip("DeepSpeed not installed (the deepspeed extra)")


def _record(runs: dict, name: str) -> dict:
    record = runs["runs"].get(name)
    assert record is not None, runs["output"][-4000:]
    assert "error" not in record, record["error"]
    return record
