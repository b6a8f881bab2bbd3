"""`trl-ext study run | status | report | cancel STUDY.yaml`."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import typer

from trl_ext.study.spec import RUNS_ROOT, StudyError, load_study

_ROOT_HELP = "Folder the runs go to: <root>/<study>/<arm>/seed<k>/ (default runs)."


def register(app: typer.Typer) -> None:
    """Adds the `trl-ext study` command group to the Typer app."""
    study_app = typer.Typer(no_args_is_help=True, help="Studies: arms x seeds, one launch per run (docs/studies.md).")
    app.add_typer(study_app, name="study")

    def _load(path: Path, root: Path = RUNS_ROOT):
        try:
            return load_study(path, root)
        except StudyError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    @study_app.command(
        "run",
        help="Preflight every run, then run them on disjoint GPU sets (cores without a GPU) of this node, or submit "
        "them to Slurm (--slurm); finished runs are skipped, the others resume; the report at the end.",
    )
    def run_command(
        study_file: Path = typer.Argument(..., help="The study file, e.g. recipes/studies/cpu_tiny.yaml."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Preflight every run, print the placement, exit."),
        gpus: int | None = typer.Option(
            None,
            "--gpus",
            help="The node's GPU count, for a dry run of a node other than this one (e.g. 8; on a machine without "
            "GPUs a dry run takes slurm.gpus_per_node, else 8); not with --slurm (a task asks for its run's need, or "
            "slurm.gpus_per_node).",
        ),
        slurm: bool = typer.Option(False, "--slurm", help="Submit one sbatch array job per arm instead."),
        wait: bool = typer.Option(False, "--wait", help="With --slurm: wait for the jobs, then write the report."),
        poll: float = typer.Option(5.0, "--poll", help="Seconds between looks at the jobs (--slurm --wait)."),
        show_every: float = typer.Option(30.0, "--show-every", help="Seconds between progress displays."),
        grace: float = typer.Option(30.0, "--grace", help="Seconds between SIGTERM and SIGKILL when stopping."),
        root: Path = typer.Option(RUNS_ROOT, "--root", help=_ROOT_HELP),
    ) -> None:
        from trl_ext.study import planning, runner
        from trl_ext.study import slurm as slurm_mod
        from trl_ext.study.progress import is_finished

        study = _load(study_file, root)
        if slurm and gpus is not None:
            typer.echo(
                "error: --gpus plans this node; a Slurm task asks for its run's need (or slurm.gpus_per_node)",
                err=True,
            )
            raise typer.Exit(2)
        finished = [r.name for r in study.runs() if is_finished(r.output_dir)]
        if finished:  # never preflighted again: a finished run is skipped
            typer.echo(f"skipping {len(finished)} finished run(s): {', '.join(finished)}")
        todo = [r for r in study.runs() if r.name not in finished]
        try:
            if dry_run and not slurm and gpus is None and todo:  # a login node shows the placement on a GPU node
                gpus = planning.dry_run_gpus(study, todo)
                if gpus is not None:
                    typer.echo(
                        f"no GPU on this machine: the placement on a node of {gpus} GPUs (--gpus N for another)"
                    )
            if slurm:
                plans, where = (planning.plan_slurm(study, todo) if todo else []), ""
            else:
                plans, where = planning.plan_study(study, gpus=gpus, runs=todo) if todo else ([], "")
        except StudyError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        if slurm:
            if dry_run:
                if plans:
                    typer.echo(slurm_mod.render_defaults(study, plans))
                for arm, script in slurm_mod.render_scripts(study, plans).items():
                    typer.echo(f"# ---- {study.folder / 'slurm' / (arm + '.sbatch')}\n{script}")
                raise typer.Exit(0)
            if not plans:
                typer.echo("every run is finished")
            else:
                slurm_mod.submit(study, plans, echo=typer.echo)
            if not wait:
                raise typer.Exit(0)
            raise typer.Exit(_wait_slurm(study, poll))
        if plans:
            typer.echo(planning.render_placement(study, plans, where))
        if dry_run:
            raise typer.Exit(0)
        outcome = runner.run_study(study, plans, echo=runner.print_flush, show_every=show_every, grace=grace)
        outcome.skipped = finished
        typer.echo(
            f"study {study.name}: {len(outcome.finished)} finished, {len(outcome.skipped)} skipped (finished "
            f"before), {len(outcome.failed)} failed, {len(outcome.stopped)} stopped, {outcome.seconds:.0f} s"
        )
        for name, tail in outcome.failed.items():
            typer.echo(f"failed: {name}\n{tail}")
        if not outcome.stopped:
            _report(study)
        raise typer.Exit(outcome.code)

    @study_app.command("status", help="Each run's Slurm state (if submitted) and its progress from its folder.")
    def status_command(
        study_file: Path = typer.Argument(..., help="The study file."),
        root: Path = typer.Option(RUNS_ROOT, "--root", help=_ROOT_HELP),
    ) -> None:
        typer.echo(render_status(_load(study_file, root)))

    @study_app.command("report", help="Write runs/<study>/report/ (Markdown, JSON, PNG) from the run folders.")
    def report_command(
        study_file: Path = typer.Argument(..., help="The study file."),
        root: Path = typer.Option(RUNS_ROOT, "--root", help=_ROOT_HELP),
        out: Path = typer.Option(
            None,
            "--out",
            help="Also write the copies to ship: OUT.md, OUT.json, OUT.png (curves), OUT_lengths.png "
            "(e.g. benchmarks/results/ablations).",
        ),
    ) -> None:
        _report(_load(study_file, root), out)

    @study_app.command("cancel", help="scancel the study's Slurm jobs, or SIGTERM its local run.")
    def cancel_command(
        study_file: Path = typer.Argument(..., help="The study file."),
        root: Path = typer.Option(RUNS_ROOT, "--root", help=_ROOT_HELP),
    ) -> None:
        from trl_ext.study import slurm as slurm_mod
        from trl_ext.study.runner import PID_FILE

        study = _load(study_file, root)
        ids = slurm_mod.cancel(study)
        if ids:
            typer.echo(f"scancel {' '.join(ids)}")
        pid_file = study.folder / PID_FILE
        if pid_file.is_file():
            pid = int(pid_file.read_text())
            try:
                os.kill(pid, signal.SIGTERM)
                typer.echo(f"SIGTERM to the study process {pid}")
            except ProcessLookupError:
                pid_file.unlink()
        elif not ids:
            typer.echo("nothing to cancel")


def render_status(study) -> str:
    """Each run: its Slurm task's state (if submitted; with its requeues and exit code) and what its folder says."""
    from trl_ext.study import slurm as slurm_mod
    from trl_ext.study.progress import is_finished, read_progress

    jobs = slurm_mod.read_jobs(study)
    tasks = slurm_mod.job_info([j["job_id"] for j in jobs.values()]) if jobs else {}
    lines = [f"study {study.name}"]
    counts = {"done": 0, "running": 0, "queued": 0}
    for run in study.runs():
        job = jobs.get(run.arm.name)
        key = slurm_mod.task_key(job, run.seed) if job else None
        state = "" if key is None else (tasks[key].render() if key in tasks else "unknown")
        if is_finished(run.output_dir):
            what = "finished"
            counts["done"] += 1
        elif run.output_dir.is_dir():
            what = read_progress(run.output_dir).render()
            counts["running"] += 1
        else:
            what = "not started"
            counts["queued"] += 1
        lines.append(f"  {run.name:<40} {state:<24} {what}")
    lines.insert(1, f"  {counts['done']} done, {counts['running']} started, {counts['queued']} not started")
    return "\n".join(lines)


def _wait_slurm(study, poll: float) -> int:
    """Polls the study's tasks until none is queued or running; prints the status, each task that did not complete
    with its launch logs' tails (every node's), writes the report. 0 when every task completed."""
    from trl_ext.host import log_tail
    from trl_ext.study import slurm as slurm_mod

    jobs = slurm_mod.read_jobs(study)
    ids = [j["job_id"] for j in jobs.values()]
    while True:
        tasks = slurm_mod.job_info(ids)
        if not any(t.state in slurm_mod.ACTIVE for t in tasks.values()):  # none left in the queue (or forgotten)
            break
        time.sleep(poll)
    typer.echo(render_status(study))
    for run in study.runs():
        job = jobs.get(run.arm.name)
        key = slurm_mod.task_key(job, run.seed) if job else None
        task = tasks.get(key) if key else None
        if task is None or task.state == "COMPLETED":
            continue
        typer.echo(f"FAILED: {run.name} (Slurm: {task.render()} on {task.nodes or '?'})")
        for log in slurm_mod.run_logs(run.output_dir):
            typer.echo(f"  last lines of {log}:\n{log_tail(log, 20)}")
    _report(study)
    return 0 if tasks and all(t.state == "COMPLETED" for t in tasks.values()) else 1


def _report(study, out: Path | None = None) -> None:
    from trl_ext.study.report import write_report

    write_report(study, out)
    typer.echo(f"report: {study.report_dir / 'report.md'}")
    typer.echo((study.report_dir / "report.md").read_text())
