"""`--slurm`: a study as sbatch scripts that Slurm itself runs, one array job per arm (one task per seed), each task
running `trl-ext launch` inside its allocation. Job states come from `squeue` and `scontrol show job` (a cluster
without accounting has no `sacct`); `scancel` cancels.

A task's ports come from its job id, so two tasks that share a node do not meet. An arm whose accelerate config
spans several machines (`num_machines` > 1) gets that many nodes: `srun` starts one `trl-ext launch --machine-rank
R` per node, machine rank 0 on the allocation's first node, which serves (the launcher starts the vLLM server on
machine 0 only) and holds training rank 0, and every node's accelerate gets that node as `main_process_ip`. The task
ends with the first launch that fails: a lost node's peers fail at once (their collective breaks), while Slurm takes
its `SlurmdTimeout` to see the node gone.

Preemption: every task asks for requeue (`--requeue`) and for Slurm's warning `warning_s` seconds before its time
limit (`--signal=B:USR1@S`, to the batch script). On the warning the script writes the run's stop request
(`trl_ext.run_status`): the trainer saves a checkpoint at the end of its step and ends; the script then requeues the
task (`scontrol requeue`), whose next start resumes from that checkpoint (`--resume true`, as every start). A task
preempted without warning (SIGTERM to every process) resumes from its last periodic checkpoint.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trl_ext.run_status import STOP_FILE
from trl_ext.study.planning import RunPlan
from trl_ext.study.spec import Study

JOBS_FILE = "slurm_jobs.json"
#: Seconds before the time limit that Slurm warns a task (`slurm.warning_s`): room to finish a step and save.
WARNING_S = 600
#: `--cpus-per-task` of a GPU task when the study states none (a CPU task asks for `cores_per_run`).
GPU_TASK_CPUS = 8


def _arms(plans: list[RunPlan]) -> dict[str, list[RunPlan]]:
    out: dict[str, list[RunPlan]] = {}
    for p in plans:
        out.setdefault(p.run.arm.name, []).append(p)
    return out


def task_resources(study: Study, plan: RunPlan) -> dict[str, int]:
    """What one task of `plan`'s arm asks for: nodes, GPUs per node (a GPU run: its need from the launcher's plan,
    unless the study states `slurm.gpus_per_node`), CPUs per task."""
    slurm = study.slurm
    out = {"nodes": plan.num_machines}
    if plan.gpu:
        out["gpus_per_node"] = int(slurm.get("gpus_per_node", plan.need))
    out["cpus_per_task"] = int(slurm.get("cpus_per_task", GPU_TASK_CPUS if plan.gpu else study.cores_per_run))
    return out


def render_defaults(study: Study, plans: list[RunPlan]) -> str:
    """What a dry run states about the tasks' resources: where each number comes from, the study's `slurm:` section
    or the runs' plans (never the submitting machine's GPUs)."""
    slurm = study.slurm
    lines = [f"# Slurm resources of {study.path} (each task: one run; set `slurm:` in the study file to change):"]
    for arm, arm_plans in _arms(plans).items():
        plan = arm_plans[0]
        res = task_resources(study, plan)
        what = [f"{res['nodes']} node(s)"]
        if plan.gpu:
            source = "slurm.gpus_per_node" if "gpus_per_node" in slurm else "the run's plan"
            what.append(f"{res['gpus_per_node']} GPU(s) per node ({source})")
        source = "slurm.cpus_per_task" if "cpus_per_task" in slurm else ("default" if plan.gpu else "cores_per_run")
        what.append(f"{res['cpus_per_task']} CPU(s) ({source})")
        lines.append(f"#   {arm}: {', '.join(what)}")
    unset = [key for key in ("partition", "account", "time", "mem", "qos") if key not in slurm]
    if unset:
        lines.append(f"#   no {', '.join(unset)}: the cluster's defaults")
    warning = slurm.get("warning_s", WARNING_S)
    lines.append(f"#   requeue; Slurm's warning {warning} s before the time limit checkpoints and requeues a run")
    return "\n".join(lines)


#: The end of every script: wait for the launches (the trap may cut a `sleep` short). A launch that fails, unless the
#: runs are stopping on the warning, ends the task at once, its peers stopped: waiting for them could outlast Slurm's
#: `SlurmdTimeout` when a node is lost (its `srun` waits for the lost node), and a task still running when Slurm
#: declares a node down is requeued and waits for that node. A run that stopped on the warning is requeued.
_SUPERVISE = [
    "# the task ends when every launch has ended, or at once with the first that fails (the others are stopped),",
    "# unless the runs are stopping on the warning; a run that stopped on it is requeued",
    "CODE=0",
    'while [ -n "$LAUNCHES" ]; do',
    "  sleep 1 & wait $!",
    '  LEFT=""',
    "  for P in $LAUNCHES; do",
    '    if kill -0 "$P" 2>/dev/null; then LEFT="$LEFT $P"; continue; fi',
    '    wait "$P"; C=$?',
    '    if [ "$C" != 0 ] && [ "$CODE" = 0 ]; then CODE=$C; fi',
    "  done",
    "  LAUNCHES=$LEFT",
    '  if [ "$CODE" != 0 ] && [ "$STOPPING" = 0 ]; then kill $LAUNCHES 2>/dev/null; break; fi',
    "done",
    'if [ "$STOPPING" = 1 ] && [ ! -f "$RUN_DIR/train_results.json" ]; then',
    '  scontrol requeue "$SLURM_JOB_ID" || echo "requeue refused: rerun the study to resume $RUN_DIR"',
    "fi",
    'exit "$CODE"',
]


def render_script(study: Study, plans: list[RunPlan], cwd: str | Path | None = None, python: str | None = None) -> str:
    """The sbatch script of one arm's runs (`plans`, one per seed, as an array)."""
    first = plans[0]
    arm = first.run.arm
    folder = study.folder / arm.name
    seeds = " ".join(str(p.run.seed) for p in plans)
    body = [
        "set -uo pipefail",
        f"cd {shlex.quote(str(Path(cwd or Path.cwd()).resolve()))}",
        f"SEEDS=({seeds})",
        "SEED=${SEEDS[$SLURM_ARRAY_TASK_ID]}",
        f"RUN_DIR={folder}/seed$SEED",
        "LOG=$RUN_DIR  # the launch's output: $LOG.log, or $LOG.node<machine rank>.log",
        "# ports from the job id: two tasks on one node never share one",
        "PORT=$((20000 + (SLURM_JOB_ID % 4000) * 10))",
        "# Slurm's warning (--signal above): the run saves a checkpoint at the end of its step and ends; this task",
        "# then requeues itself, and its next start resumes from that checkpoint (--resume true)",
        f"STOP=$RUN_DIR/{STOP_FILE}",
        "STOPPING=0",
        'rm -f "$STOP"',
        'trap \'STOPPING=1; mkdir -p "$RUN_DIR"; touch "$STOP"\' USR1',
    ]
    ports = '--vllm_server_port "$PORT" --vllm_group_port $((PORT + 1))' if first.serves else ""
    launch = f"{shlex.quote(python or sys.executable)} -m trl_ext.cli launch"
    recipe = shlex.join([*arm.launch_args, str(arm.script), "--config", str(arm.recipe), *arm.args])
    tail = f'--output_dir "$RUN_DIR" --seed "$SEED" --resume true {ports}'.rstrip()
    if first.num_machines > 1:
        body += _launch_nodes(study, first, f"{launch} {{config}} {recipe} {tail}")
    else:
        body += _launch_one(study, first, f"{launch} {{config}} {recipe} {tail}")
    return "\n".join(_head(study, plans) + [""] + body + _SUPERVISE) + "\n"


def _head(study: Study, plans: list[RunPlan]) -> list[str]:
    """The `#SBATCH` lines of an arm's array."""
    first, slurm = plans[0], study.slurm
    res = task_resources(study, first)
    head = [
        "#!/bin/bash",
        f"#SBATCH --job-name={study.name}.{first.run.arm.name}",
        f"#SBATCH --array=0-{len(plans) - 1}",
        f"#SBATCH --nodes={res['nodes']}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={study.folder / first.run.arm.name}/slurm-%A_%a.log",
        "#SBATCH --open-mode=append",
        "# requeue on preemption, and a warning before the time limit to this script (below)",
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:USR1@{slurm.get('warning_s', WARNING_S)}",
    ]
    if first.gpu:
        head.append(f"#SBATCH --gpus-per-node={res['gpus_per_node']}")
    head.append(f"#SBATCH --cpus-per-task={res['cpus_per_task']}")
    head += [f"#SBATCH --{key}={slurm[key]}" for key in ("partition", "account", "time", "mem", "qos") if key in slurm]
    return head + [f"#SBATCH {extra}" for extra in slurm.get("extra", []) or []]


def _launch_one(study: Study, plan: RunPlan, command: str) -> list[str]:
    """One node: the launch in the background (the trap must run while it does), its output in `$LOG.log`."""
    arm, config = plan.run.arm, str(plan.run.arm.accelerate_config)
    lines = []
    if plan.multi_process:  # its own rendezvous port, from the job id
        lines = [
            f"CONFIG={study.folder}/.accelerate/{arm.name}_$SLURM_JOB_ID.yaml",
            'mkdir -p "$(dirname "$CONFIG")"',
            f"{{ grep -v -E '^main_process_port:' {shlex.quote(config)}; "
            'echo "main_process_port: $((PORT + 2))"; } > "$CONFIG"',
        ]
        config = '"$CONFIG"'
    else:
        config = shlex.quote(config)
    command = command.replace("{config}", f"--accelerate-config {config}")
    return lines + [f'{command} >> "$LOG.log" 2>&1 &', "LAUNCHES=$!"]


def _launch_nodes(study: Study, plan: RunPlan, command: str) -> list[str]:
    """Several nodes: a copy of the accelerate config naming the first node as `main_process_ip`, and one launch
    per node through two `srun`s (machine rank 0 on the first node, the others on the rest), so that the failure
    of one is seen at once here (one `srun` over all nodes waits for a lost node until Slurm declares it down)."""
    arm, res = plan.run.arm, task_resources(study, plan)
    nodes = res["nodes"]
    gpus = f" --gpus-per-node={res['gpus_per_node']}" if plan.gpu else ""
    command = command.replace("{config}", '--accelerate-config "$CONFIG" --machine-rank "$1"')
    return [
        'MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"CONFIG={study.folder}/.accelerate/{arm.name}_$SLURM_JOB_ID.yaml",
        'mkdir -p "$(dirname "$CONFIG")"',
        f"{{ grep -v -E '^(main_process_ip|main_process_port):' {shlex.quote(str(arm.accelerate_config))}; "
        'echo "main_process_ip: $MASTER"; echo "main_process_port: $((PORT + 2))"; } > "$CONFIG"',
        "export RUN_DIR SEED PORT CONFIG LOG",
        "launch() {  # machine rank $1, its output in $LOG.node$1.log",
        '  echo "# machine rank $1 on $(hostname)" >> "$LOG.node$1.log"',
        f'  exec {command} >> "$LOG.node$1.log" 2>&1',
        "}",
        "export -f launch",
        "# machine rank 0 (training rank 0 and the vLLM server) on the first node, one launch on every other node",
        f'SRUN="srun --ntasks-per-node=1 --cpus-per-task=$SLURM_CPUS_PER_TASK{gpus} --kill-on-bad-exit=1"',
        "$SRUN --nodes=1 --ntasks=1 --relative=0 bash -c 'launch 0' &",
        "LAUNCHES=$!",
        f"$SRUN --nodes={nodes - 1} --ntasks={nodes - 1} --relative=1 bash -c 'launch $((SLURM_NODEID + 1))' &",
        'LAUNCHES="$LAUNCHES $!"',
    ]


def render_scripts(study: Study, plans: list[RunPlan], **kwargs) -> dict[str, str]:
    """`{arm: sbatch script}` for the runs in `plans` (finished runs left out by the caller)."""
    return {arm: render_script(study, arm_plans, **kwargs) for arm, arm_plans in _arms(plans).items()}


def submit(study: Study, plans: list[RunPlan], echo=print, **kwargs) -> dict[str, dict]:
    """Writes each arm's script under `runs/<study>/slurm/`, submits it with `sbatch --parsable`, and records the
    job ids in `runs/<study>/slurm_jobs.json` (what `status` and `cancel` read)."""
    jobs = read_jobs(study)
    folder = study.folder / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    for arm, script in render_scripts(study, plans, **kwargs).items():
        path = folder / f"{arm}.sbatch"
        path.write_text(script)
        (study.folder / arm).mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch {path} failed: {done.stderr.strip() or done.stdout.strip()}")
        job = done.stdout.strip().split(";")[0]
        seeds = [p.run.seed for p in plans if p.run.arm.name == arm]
        jobs[arm] = {"job_id": job, "seeds": seeds, "script": str(path)}
        echo(f"submitted {arm} (seeds {', '.join(map(str, seeds))}): job {job}")
    (study.folder / JOBS_FILE).write_text(json.dumps(jobs, indent=2))
    return jobs


def read_jobs(study: Study) -> dict[str, dict]:
    path = study.folder / JOBS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


@dataclass(frozen=True)
class TaskInfo:
    """One array task as Slurm shows it: its state, how often it was requeued, its exit code and the nodes."""

    state: str
    restarts: int = 0
    exit_code: str = ""
    nodes: str = ""

    def render(self) -> str:
        requeued = f" (requeued {self.restarts}x)" if self.restarts else ""
        code = f" exit {self.exit_code}" if self.exit_code not in ("", "0:0") and self.state != "RUNNING" else ""
        return f"{self.state}{requeued}{code}"


ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED", "RESIZING", "REQUEUE_FED"}


def job_info(job_ids: list[str]) -> dict[str, TaskInfo]:
    """`{"JOB_TASK": TaskInfo}` for every array task of `job_ids`: `squeue` for the state of queued and running ones,
    `scontrol show job` for the rest and for restarts and exit codes (Slurm keeps an ended job for `MinJobAge`, 300 s
    by default); an unknown task is absent."""
    if not job_ids:
        return {}
    states: dict[str, str] = {}
    queue = subprocess.run(
        ["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i %T"], capture_output=True, text=True
    )
    for line in queue.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    info: dict[str, TaskInfo] = {}
    for job in job_ids:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True)
        for line in shown.stdout.splitlines():
            fields = dict(re.findall(r"(\w+)=(\S+)", line))
            task = fields.get("ArrayTaskId")
            key = f"{fields.get('ArrayJobId', job)}_{task}" if task and task.isdigit() else fields.get("JobId", job)
            if "JobState" in fields:
                restarts = fields.get("Restarts", "0")
                info[key] = TaskInfo(
                    states.get(key, fields["JobState"]),
                    int(restarts) if restarts.isdigit() else 0,
                    fields.get("ExitCode", ""),
                    fields.get("NodeList", ""),
                )
    for key, state in states.items():
        info.setdefault(key, TaskInfo(state))
    return info


def job_states(job_ids: list[str]) -> dict[str, str]:
    """`{"JOB_TASK": state}` (`job_info`'s states)."""
    return {key: task.state for key, task in job_info(job_ids).items()}


def task_key(job: dict, seed: int) -> str | None:
    """The `JOB_TASK` key of `seed`'s task in a submitted arm (`read_jobs` entry), or None when not submitted."""
    return f"{job['job_id']}_{job['seeds'].index(seed)}" if seed in job["seeds"] else None


def run_logs(output_dir: Path) -> list[Path]:
    """A run's launch logs beside its folder: `seed<k>.log` (one node) or `seed<k>.node<rank>.log` (several)."""
    parent, name = output_dir.parent, output_dir.name
    single = parent / f"{name}.log"
    nodes = sorted(parent.glob(f"{name}.node*.log"), key=lambda p: int(p.name.rsplit(".node", 1)[1][:-4] or 0))
    return ([single] if single.is_file() else []) + nodes


def cancel(study: Study) -> list[str]:
    """`scancel` every job of the study; returns their ids."""
    ids = [j["job_id"] for j in read_jobs(study).values()]
    if ids:
        subprocess.run(["scancel", *ids], check=False)
    return ids
