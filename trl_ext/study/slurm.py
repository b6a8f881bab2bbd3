"""`--slurm`: a study as sbatch scripts that Slurm itself runs, one array job per arm (one task per seed), each task
running `trl-ext launch` inside its allocation. Job states come from `squeue` and `scontrol show job` (a cluster
without accounting has no `sacct`); `scancel` cancels.

A task's ports come from its job id, so two tasks that share a node do not meet. An arm whose accelerate config
spans several machines (`num_machines` > 1) gets that many nodes: `srun` starts one `trl-ext launch
--machine-rank $SLURM_NODEID` per node; node 0 serves (the launcher starts the vLLM server on machine 0 only) and
holds training rank 0, and every node's accelerate gets node 0 as `main_process_ip`.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from trl_ext.study.planning import RunPlan
from trl_ext.study.spec import Study

JOBS_FILE = "slurm_jobs.json"


def _arms(plans: list[RunPlan]) -> dict[str, list[RunPlan]]:
    out: dict[str, list[RunPlan]] = {}
    for p in plans:
        out.setdefault(p.run.arm.name, []).append(p)
    return out


def render_script(study: Study, plans: list[RunPlan], cwd: str | Path | None = None, python: str | None = None) -> str:
    """The sbatch script of one arm's runs (`plans`, one per seed, as an array)."""
    first = plans[0]
    arm = first.run.arm
    slurm = study.slurm
    nodes = first.num_machines
    python = python or sys.executable
    folder = study.folder / arm.name
    head = [
        "#!/bin/bash",
        f"#SBATCH --job-name={study.name}.{arm.name}",
        f"#SBATCH --array=0-{len(plans) - 1}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={folder}/slurm-%A_%a.log",
    ]
    if first.gpu:
        head.append(f"#SBATCH --gpus-per-node={slurm.get('gpus_per_node', first.need)}")
    head.append(f"#SBATCH --cpus-per-task={slurm.get('cpus_per_task', study.cores_per_run if not first.gpu else 8)}")
    for key in ("partition", "account", "time", "mem", "qos"):
        if key in slurm:
            head.append(f"#SBATCH --{key}={slurm[key]}")
    for extra in slurm.get("extra", []) or []:
        head.append(f"#SBATCH {extra}")
    seeds = " ".join(str(p.run.seed) for p in plans)
    recipe = shlex.join([*arm.launch_args, str(arm.script), "--config", str(arm.recipe), *arm.args])
    body = [
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path(cwd or Path.cwd()).resolve()))}",
        f"SEEDS=({seeds})",
        "SEED=${SEEDS[$SLURM_ARRAY_TASK_ID]}",
        f"RUN_DIR={folder}/seed$SEED",
        "# ports from the job id: two tasks on one node never share one",
        "PORT=$((20000 + (SLURM_JOB_ID % 4000) * 10))",
    ]
    ports = '--vllm_server_port "$PORT" --vllm_group_port $((PORT + 1))' if first.serves else ""
    launch = f"{shlex.quote(python)} -m trl_ext.cli launch"
    tail = f'--output_dir "$RUN_DIR" --seed "$SEED" --resume true {ports}'.rstrip()
    config = str(arm.accelerate_config)
    if nodes > 1:
        body += [
            'MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"CONFIG={study.folder}/.accelerate/{arm.name}_$SLURM_JOB_ID.yaml",
            'mkdir -p "$(dirname "$CONFIG")"',
            f"{{ grep -v -E '^(main_process_ip|main_process_port):' {shlex.quote(config)}; "
            'echo "main_process_ip: $MASTER"; echo "main_process_port: $((PORT + 2))"; } > "$CONFIG"',
            "# one launch per node: node 0 serves and holds training rank 0",
            "export RUN_DIR SEED PORT CONFIG",
            f"srun --nodes={nodes} --ntasks-per-node=1 bash -c "
            f'\'exec {launch} --accelerate-config "$CONFIG" --machine-rank "$SLURM_NODEID" {recipe} {tail}\'',
        ]
    else:
        if first.multi_process:
            body += [
                f"CONFIG={study.folder}/.accelerate/{arm.name}_$SLURM_JOB_ID.yaml",
                'mkdir -p "$(dirname "$CONFIG")"',
                f"{{ grep -v -E '^main_process_port:' {shlex.quote(config)}; "
                'echo "main_process_port: $((PORT + 2))"; } > "$CONFIG"',
            ]
            config = '"$CONFIG"'
        else:
            config = shlex.quote(config)
        body.append(f"exec {launch} --accelerate-config {config} {recipe} {tail}")
    return "\n".join(head + [""] + body) + "\n"


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


def job_states(job_ids: list[str]) -> dict[str, str]:
    """`{"JOB_TASK": state}` for every array task of `job_ids`: `squeue` for queued and running ones, `scontrol show
    job` for the others (Slurm keeps an ended job for `MinJobAge`, 300 s by default); an unknown task is absent."""
    states: dict[str, str] = {}
    if not job_ids:
        return states
    queue = subprocess.run(
        ["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i %T"], capture_output=True, text=True
    )
    for line in queue.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    for job in job_ids:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True)
        for line in shown.stdout.splitlines():
            fields = dict(re.findall(r"(\w+)=(\S+)", line))
            task = fields.get("ArrayTaskId")
            key = f"{fields.get('ArrayJobId', job)}_{task}" if task and task.isdigit() else fields.get("JobId", job)
            if "JobState" in fields:
                states.setdefault(key, fields["JobState"])
    return states


def cancel(study: Study) -> list[str]:
    """`scancel` every job of the study; returns their ids."""
    ids = [j["job_id"] for j in read_jobs(study).values()]
    if ids:
        subprocess.run(["scancel", *ids], check=False)
    return ids
