"""`trl-ext study run` on one machine: every run preflighted first, then each its own `trl-ext launch` (a process
group of its own) on a disjoint GPU set or core set, as many at once as the node holds, in order.

- A finished run (`progress.is_finished`) is skipped; every other run gets `--resume true`, so an interrupted one
  continues from its last checkpoint (the recipe refuses a folder of another config).
- A failed run is reported with its log's tail; the others go on; the study returns 1 at the end.
- SIGINT / SIGTERM: every launch gets SIGTERM (it stops its server and trainer groups), then SIGKILL after a grace
  period, and any process a launch started that is still alive then (found before the stop) is killed too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from trl_ext.host import log_tail
from trl_ext.study.placement import take
from trl_ext.study.planning import RunPlan
from trl_ext.study.progress import is_finished, read_progress
from trl_ext.study.spec import Study

PID_FILE = "study.pid"
TAIL_LINES = 20


@dataclass
class Running:
    plan: RunPlan
    proc: subprocess.Popen
    log: Path
    started: float


@dataclass
class Outcome:
    finished: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # run -> its log tail
    stopped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def code(self) -> int:
        return 1 if self.failed or self.stopped else 0


def run_log(plan: RunPlan) -> Path:
    """The launch log of a run, beside its folder (`runs/<study>/<arm>/seed<k>.log`)."""
    return plan.run.output_dir.parent / f"{plan.run.output_dir.name}.log"


class _Stop(Exception):
    pass


def stop_runs(running: list[Running], grace: float) -> None:
    """Every launch's process group stopped by the launcher's own routine (`stop_process_groups`: SIGTERM and
    SIGCONT, SIGKILL after `grace` s, zombies not counted), then any process a launch had started that is still
    alive (its server and trainer lead groups of their own, which the launch stops on SIGTERM; found before the
    stop, so a launch killed before it could is covered)."""
    from trl_ext.launch import stop_process_groups

    family = [child for r in running for child in _descendants(r.proc.pid)]
    stop_process_groups([r.proc for r in running], grace)
    for child in family:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(family, timeout=5)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def run_study(
    study: Study,
    plans: list[RunPlan],
    echo: Callable[[str], None] = print,
    poll: float = 1.0,
    show_every: float = 30.0,
    grace: float = 30.0,
    python: str | None = None,
) -> Outcome:
    """Runs the planned runs (module docstring; the caller leaves finished runs out); returns what happened. The
    plans' `units` are the node's GPU ids or cores; a run starts when its `need` of them are free, in order."""
    outcome = Outcome()
    begin = time.monotonic()
    queue = [p for p in plans if not is_finished(p.run.output_dir)]
    units = sorted({u for p in plans for u in p.units}, key=lambda u: (str(type(u)), u))
    free = list(units)
    running: list[Running] = []
    study.folder.mkdir(parents=True, exist_ok=True)
    (study.folder / PID_FILE).write_text(str(os.getpid()))

    def interrupt(signum, _frame):
        raise _Stop(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    shown = 0.0
    try:
        while queue or running:
            while queue:
                got = take(free, queue[0].need)
                if got is None:
                    break
                plan = queue.pop(0)
                plan.units = got
                free = [u for u in free if u not in got]
                running.append(_start(study, plan, python, echo))
            for r in list(running):
                code = r.proc.poll()
                if code is None:
                    continue
                running.remove(r)
                free = [u for u in units if u in free or u in r.plan.units]
                name = r.plan.run.name
                if code == 0:
                    outcome.finished.append(name)
                    echo(f"done: {name} ({time.time() - r.started:.0f} s)")
                else:
                    tail = log_tail(r.log, TAIL_LINES)
                    outcome.failed[name] = tail
                    echo(f"FAILED: {name} (exit {code}), log {r.log}; its last lines:\n{tail}")
            now = time.monotonic()
            if now - shown >= show_every and (running or queue):
                echo(render_status(study, outcome, running, queue))
                shown = now
            time.sleep(poll)
    except _Stop as stop:
        echo(f"{stop}: stopping {len(running)} running run(s)")
        stop_runs(running, grace)
        outcome.stopped = [r.plan.run.name for r in running] + [p.run.name for p in queue]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        (study.folder / PID_FILE).unlink(missing_ok=True)
    outcome.seconds = time.monotonic() - begin
    return outcome


def _start(study: Study, plan: RunPlan, python: str | None, echo) -> Running:
    plan.write_accelerate_config(study)
    log = run_log(plan)
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = plan.command(study, python)
    env = {**os.environ, **plan.env()}
    where = ("GPU(s) " if plan.gpu else "core(s) ") + ",".join(map(str, plan.units))
    echo(f"start: {plan.run.name} on {where}, log {log}")
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n# {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Running(plan, proc, log, time.time())


def render_status(study: Study, outcome: Outcome, running: list[Running], queue: list[RunPlan]) -> str:
    """The progress display: runs done / running / queued, and each running run's step, reward and ETA."""
    done = len(outcome.finished) + len(outcome.skipped)
    lines = [
        f"study {study.name}: {done} done, {len(running)} running, {len(queue)} queued"
        + (f", {len(outcome.failed)} failed" if outcome.failed else "")
    ]
    for r in running:
        lines.append(f"  {r.plan.run.name}: {read_progress(r.plan.run.output_dir, r.started).render()}")
    return "\n".join(lines)


def print_flush(text: str) -> None:
    print(text, flush=True)
    sys.stdout.flush()
