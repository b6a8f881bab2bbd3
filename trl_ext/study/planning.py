"""A study's plan, before anything starts: every run preflighted by the launcher (`trl_ext.launch.plan_launch`, the
checks `trl-ext launch` makes), the GPUs (or cores) each needs, where it goes on this node, and its command.

A run's need comes from the launcher's plan on the node's GPUs: the highest GPU position it trains or serves on,
plus one (the server takes the smallest tensor-parallel size that holds the model), so it runs on that many GPUs
given by `CUDA_VISIBLE_DEVICES`, which the launcher reads. Without a GPU a run gets `cores_per_run` cores through
`taskset -c` (a plain CPU run on one core; the CPU server layout splits the cores it is given).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trl_ext.launch import LaunchError, detect_gpus, plan_launch, read_accelerate_config
from trl_ext.study.placement import ports, waves
from trl_ext.study.spec import Run, Study, StudyError

CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"


@dataclass
class RunPlan:
    """One run: what it needs, where it goes (`units`: GPU ids or cores), and its `trl-ext launch` command."""

    run: Run
    index: int
    need: int
    gpu: bool
    serves: bool
    multi_process: bool
    num_machines: int = 1
    notes: list[str] = field(default_factory=list)
    units: list = field(default_factory=list)
    wave: int = 0

    def port_args(self) -> list[str]:
        if not self.serves:
            return []
        p = ports(self.index)
        return ["--vllm_server_port", str(p["vllm_server_port"]), "--vllm_group_port", str(p["vllm_group_port"])]

    def accelerate_config(self, study: Study) -> Path:
        """The arm's accelerate config, or a copy stating this run's torch rendezvous port (a multi-process run on
        one machine whose config leaves it to the launcher, which could hand two runs the same free port)."""
        config = self.run.arm.accelerate_config
        if not self.multi_process:
            return config
        return study.folder / ".accelerate" / f"{self.run.arm.name}_seed{self.run.seed}.yaml"

    def write_accelerate_config(self, study: Study) -> Path:
        path = self.accelerate_config(study)
        if path != self.run.arm.accelerate_config:
            data = yaml.safe_load(self.run.arm.accelerate_config.read_text())
            data["main_process_port"] = ports(self.index)["main_process_port"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def launch_argv(self, study: Study, python: str | None = None) -> list[str]:
        """`python -m trl_ext.cli launch ...` for this run (extra launcher options, then the recipe's args)."""
        return [
            python or sys.executable, "-m", "trl_ext.cli", "launch",
            "--accelerate-config", str(self.accelerate_config(study)), *self.run.arm.launch_args,
            str(self.run.arm.script), *self.run.recipe_args(), *self.port_args(),
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        # the node's ids are nvidia-smi's (PCI bus order), as the launcher numbers them
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", CUDA_VISIBLE: ",".join(self.units)} if self.gpu else {}

    def command(self, study: Study, python: str | None = None) -> list[str]:
        """The launch command with its placement: `taskset -c CORES` for a CPU run."""
        argv = self.launch_argv(study, python)
        if not self.gpu and self.units and shutil.which("taskset"):
            argv = ["taskset", "-c", ",".join(map(str, self.units)), *argv]
        return argv


def node_units(study: Study, gpus: int | None, environ: dict[str, str] | None = None) -> tuple[list, bool, str]:
    """The node's GPU ids (from `--gpus`, `CUDA_VISIBLE_DEVICES` or nvidia-smi, via the launcher), else its cores.

    Returns `(units, gpu, where)`."""
    environ = dict(os.environ if environ is None else environ)
    if gpus is not None:
        environ.pop(CUDA_VISIBLE, None)
        ids, source = detect_gpus(gpus, environ)
    else:
        ids, source = detect_gpus(None, environ)
    if ids:
        return list(ids), True, f"{len(ids)} GPU(s) from {source}"
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return cores, False, f"no GPU: {len(cores)} core(s), {study.cores_per_run} per run"


def plan_run(study: Study, run: Run, index: int, node: list, gpu: bool, check_packages: bool = True) -> RunPlan:
    """The launcher's plan of one run on this node (its preflight included), as a `RunPlan`.

    Raises:
        StudyError: the launcher refuses the run (the message names the run and says the launcher's reason and fix).
    """
    environ = {k: v for k, v in os.environ.items() if k != CUDA_VISIBLE}
    try:
        setup = read_accelerate_config(run.arm.accelerate_config)
        plan = plan_launch(
            run.arm.accelerate_config,
            run.arm.script,
            run.arm.recipe,
            [*run.recipe_args()[2:]],
            # the node's GPU ids as a scheduler would give them, so the plan's ids are the node's
            environ={**environ, CUDA_VISIBLE: ",".join(node) if gpu else ""},
            check_packages=check_packages,
            cpus=list(node[: study.cores_per_run]) if not gpu else None,
            **_launch_options(run.arm.launch_args),
        )
    except LaunchError as exc:
        raise StudyError(f"run {run.name} ({run.arm.recipe}): {exc}") from None
    used = [node.index(g) for g in (*plan.train_gpus, *plan.server_gpus)] if gpu else []
    need = (max(used) + 1 if used else 1) if gpu else study.cores_per_run
    multi = setup.num_processes > 1 and setup.num_machines == 1 and setup.main_process_port is None
    return RunPlan(run, index, need, gpu, plan.server is not None, multi, setup.num_machines, notes=list(plan.notes))


def _launch_options(launch_args) -> dict:
    """The launcher options among an arm's `launch_args` that change its GPU split (`--num-processes`, `--vllm-tp`,
    `--vllm-dp`), as `plan_launch` keywords."""
    out, args = {}, list(launch_args)
    names = {"--num-processes": "num_processes", "--vllm-tp": "vllm_tp", "--vllm-dp": "vllm_dp"}
    for i, arg in enumerate(args):
        key, _, value = arg.partition("=")
        if key in names:
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            out[names[key]] = int(value)
    return out


def plan_study(
    study: Study,
    gpus: int | None = None,
    runs: list[Run] | None = None,
    check_packages: bool = True,
    environ: dict[str, str] | None = None,
) -> tuple[list[RunPlan], str]:
    """Every run planned and placed (`waves`) on this node, or on a node of `gpus` GPUs for a dry run.

    Raises:
        StudyError: a run the launcher refuses, or one that needs more GPUs / cores than the node has.
    """
    node, gpu, where = node_units(study, gpus, environ)
    all_runs = study.runs()
    runs = all_runs if runs is None else runs
    on_gpus = [] if gpu else [r for r in runs if trains_on_gpus(r)]
    if on_gpus:
        run = on_gpus[0]
        raise StudyError(
            f"run {run.name}: accelerate config {run.arm.accelerate_config} trains on GPUs and this machine has none "
            f"({where}): `--dry-run --gpus N` shows the placement on a node of N GPUs, `--slurm` submits the study "
            "to a cluster (`--slurm --dry-run` prints its job scripts)"
        )
    plans = [plan_run(study, run, all_runs.index(run), node, gpu, check_packages) for run in runs]
    for p in plans:
        if p.need > len(node):
            unit = "GPU" if gpu else "core"
            raise StudyError(
                f"run {p.run.name}: needs {p.need} {unit}(s), the node has {len(node)} ({where}); "
                + ("submit it with --slurm (a multi-node accelerate config)" if gpu else "lower cores_per_run")
            )
    for p, (wave, units) in zip(plans, waves(node, [p.need for p in plans]), strict=True):
        p.wave, p.units = wave, units
    return plans, where


#: The node a GPU run is planned on for `--slurm` when the study states no `slurm.gpus_per_node`: the run's need
#: from that plan (its highest GPU position, plus one) is what its tasks ask for, whatever GPUs the submitting
#: machine (a login node, often without any) has. Also the node a `--dry-run` on a machine without GPUs shows.
PLANNING_GPUS = 8


def trains_on_gpus(run: Run) -> bool:
    """Whether `run`'s accelerate config trains on GPUs (it does not set `use_cpu`)."""
    try:
        return not read_accelerate_config(run.arm.accelerate_config).use_cpu
    except LaunchError as exc:
        raise StudyError(f"run {run.name}: {exc}") from None


def dry_run_gpus(study: Study, runs: list[Run], environ: dict[str, str] | None = None) -> int | None:
    """The GPU count a `--dry-run` without `--gpus` plans on: None (this machine's GPUs) unless this machine has no
    GPU and one of `runs` trains on GPUs (a cluster's login node): then `slurm.gpus_per_node`, else PLANNING_GPUS."""
    if node_units(study, None, environ)[1] or not any(trains_on_gpus(r) for r in runs):
        return None
    return int(study.slurm.get("gpus_per_node", PLANNING_GPUS))


def plan_slurm(study: Study, runs: list[Run] | None = None, check_packages: bool = True) -> list[RunPlan]:
    """Every run planned by the launcher for a Slurm task: a GPU run (an accelerate config without `use_cpu`) on a
    node of `slurm.gpus_per_node` GPUs (else `PLANNING_GPUS`), a CPU run on `cores_per_run` cores. Nothing of the
    submitting machine's GPUs enters the plan.

    Raises:
        StudyError: a run the launcher refuses, or one that needs more GPUs than `slurm.gpus_per_node`.
    """
    all_runs = study.runs()
    runs = all_runs if runs is None else runs
    stated = study.slurm.get("gpus_per_node")
    plans = []
    for run in runs:
        cpu = not trains_on_gpus(run)
        node = list(range(study.cores_per_run)) if cpu else [str(i) for i in range(stated or PLANNING_GPUS)]
        plan = plan_run(study, run, all_runs.index(run), node, not cpu, check_packages)
        if not cpu and plan.need > len(node):
            raise StudyError(
                f"run {run.name}: needs {plan.need} GPU(s) per node, slurm.gpus_per_node is {stated}; raise it"
            )
        plan.units = node[: plan.need]
        plans.append(plan)
    return plans


def render_placement(study: Study, plans: list[RunPlan], where: str) -> str:
    """What `--dry-run` prints: each run's GPUs or cores, its wave (with runs of equal length), its command."""
    unit = "GPUs" if plans and plans[0].gpu else "cores"
    lines = [f"study {study.name}: {len(plans)} run(s) on {where}", f"  {'run':<40} {'wave':>4}  {unit}"]
    for p in plans:
        lines.append(f"  {p.run.name:<40} {p.wave:>4}  {','.join(map(str, p.units))}")
    lines.append(f"  {max((p.wave for p in plans), default=-1) + 1} wave(s): runs of a wave run at once")
    for p in plans:
        env = " ".join(f"{k}={v}" for k, v in p.env().items())
        lines.append(f"{p.run.name}: {(env + ' ') if env else ''}{shlex.join(p.command(study))}")
    return "\n".join(lines)
