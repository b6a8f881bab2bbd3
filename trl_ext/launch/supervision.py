"""Launch supervision: the vLLM server and trainer processes, their process groups, signals and health polling.

`run_launch` carries out a `LaunchPlan`: port check, server start (own process group, output to a log), `GET /health`
polling, the trainer, and on success, failure, Ctrl-C or SIGTERM the stop of both groups (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from trl_ext.host import log_tail
from trl_ext.launch.configs import LaunchError
from trl_ext.launch.planning import Command, LaunchPlan
from trl_ext.launch.server_place import server_place_env
from trl_ext.preflight.environment import port_is_free
from trl_ext.preflight.trl_defaults import trl_default


class _Interrupted(BaseException):
    """Raised by the launcher's SIGINT/SIGTERM handler so every `finally` below runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def health_answers(url: str, timeout: float) -> bool:
    """Whether `GET url` answers 200 within `timeout` s (not listening yet, 5xx while loading: False)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):  # HTTPError is a URLError
        return False


def wait_for_remote_server(url: str, timeout: float, poll_interval: float = 1.0) -> float:
    """Polls the health URL of a server on another machine (`trl_ext.launch.remote_server`) until it answers 200;
    returns the seconds it took.

    Raises:
        LaunchError: no 200 within `timeout` s (the message names the URL and how to start the server there).
    """
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if health_answers(url, max(0.1, min(5.0, timeout - elapsed))):
            return time.monotonic() - start
        if time.monotonic() - start >= timeout:
            raise LaunchError(
                f"the vLLM server at {url} did not answer within {timeout:g} s: start it on that machine first "
                "(`trl-ext launch --serve-only` with this recipe), or point vllm_server_host at one that runs "
                "(--health-timeout to wait longer)"
            )
        time.sleep(poll_interval)


def check_port_free(host: str, port: int) -> None:
    """Raises LaunchError if something already listens on `host:port` (checked by binding it, as the server will)."""
    if not port_is_free(port, host):
        raise LaunchError(
            f"port {port} on {host or '0.0.0.0'} is already in use: another vLLM server? Stop it "
            f"or pick another port (`vllm_server_port` in the recipe, or `--vllm_server_port N` after it)"
        )


def _group_alive(pgid: int) -> bool:
    """Whether any live (not zombie) process is in group `pgid`.

    `killpg(pgid, 0)` alone also counts zombies, which a container whose PID 1 does not reap keeps forever, so
    `/proc` is read where there is one.
    """
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the parenthesised command name: state, ppid, pgrp, ...
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        if int(pgrp) == pgid and state not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process_group(proc: subprocess.Popen, grace: float, first_signal: int = signal.SIGTERM) -> None:
    """Stops `proc` and every process in its group: `first_signal`, then SIGKILL if any is left after `grace` s.

    `proc` must lead its own group (started with `start_new_session=True` or `process_group=0`). Its children
    (vLLM workers, DDP ranks) are waited for too, not only the leader.
    """
    stop_process_groups([proc], grace, first_signal)


def stop_process_groups(procs: Sequence[subprocess.Popen], grace: float, first_signal: int = signal.SIGTERM) -> None:
    """`stop_process_group` for several groups at once (one grace period for all): the launcher's server and
    trainer, a study's launches. Each group gets `first_signal` and SIGCONT (a stopped process, SIGSTOP or a
    debugger, handles the signal only once resumed); groups with a live process after `grace` s get SIGKILL. A
    group counts as gone when its leader is reaped and no live (not zombie) process is left in it."""
    for proc in procs:
        _signal_group(proc.pid, first_signal)
        _signal_group(proc.pid, signal.SIGCONT)

    def alive(proc: subprocess.Popen) -> bool:
        # poll() reaps the leader; a zombie leader would keep the group "alive".
        return proc.poll() is None or _group_alive(proc.pid)

    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not any(alive(p) for p in procs):
            return
        time.sleep(0.1)
    for proc in procs:
        if alive(proc):
            _signal_group(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()
    deadline = time.monotonic() + 5.0
    while any(_group_alive(p.pid) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)


class ServerProcess:
    """The vLLM server as a context manager that owns its process group.

    `with ServerProcess(cmd, log, url) as server: server.wait_healthy(600)`: the server starts in its own session
    (so Ctrl-C in the terminal reaches the launcher, which then stops the server in order), its stdout and stderr go
    to `log_path`, and on exit the whole group is stopped (SIGTERM, SIGKILL after `grace` s), whatever happened.
    """

    def __init__(self, command: Command, log_path: str | Path, health_url: str, grace: float = 10.0):
        self.command = command
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.grace = grace
        self.proc: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 -- closed in stop()
        try:
            self.proc = subprocess.Popen(
                self.command.argv,
                env=self.command.full_env(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise LaunchError(f"could not start the vLLM server `{self.command.render()}`: {exc}") from exc

    def tail(self, lines: int = 20) -> str:
        """The last `lines` lines of the server log."""
        if self._log is not None and not self._log.closed:
            self._log.flush()
        return log_tail(self.log_path, lines)

    def wait_healthy(self, timeout: float, poll_interval: float = 1.0, tail_lines: int = 20) -> float:
        """Polls `GET health_url` until it answers 200; returns the seconds it took.

        Raises:
            LaunchError: the server exited first (its exit code and last log lines in the message), or `timeout` s
                passed without a 200 (the last log lines too).
        """
        assert self.proc is not None, "start() the server first"
        start = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise LaunchError(
                    f"the vLLM server exited early with code {code} before answering {self.health_url}. "
                    f"Last lines of {self.log_path}:\n{self.tail(tail_lines)}"
                )
            elapsed = time.monotonic() - start
            if elapsed >= timeout:
                raise LaunchError(
                    f"the vLLM server did not become healthy within {timeout:g} s ({self.health_url} never answered "
                    f"200; raise --health-timeout for large models). Last lines of {self.log_path}:\n"
                    f"{self.tail(tail_lines)}"
                )
            if health_answers(self.health_url, max(0.1, min(5.0, timeout - elapsed))):
                return time.monotonic() - start
            time.sleep(poll_interval)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, self.grace)
        if self._log is not None:
            self._log.close()


class _SignalGuard:
    """While installed, the first SIGINT / SIGTERM raises `_Interrupted` (main thread only) so cleanup runs in order.

    Once `armed` is False (cleanup has begun) signals are ignored: a second Ctrl-C must not abandon a half-stopped
    server.
    """

    def __init__(self) -> None:
        self.armed = True

    def _handler(self, signum, frame) -> None:
        if self.armed:
            self.armed = False
            raise _Interrupted(signum)

    @contextmanager
    def installed(self) -> Iterator[_SignalGuard]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def _wait_trainer(trainer: subprocess.Popen, server: ServerProcess | None, poll: float, wait: float) -> int:
    """The trainer's exit code; raises LaunchError if the server exits first (see `run_launch`)."""
    while True:
        try:
            return trainer.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            pass
        server_code = None if server is None or server.proc is None else server.proc.poll()
        if server_code is None:
            continue
        try:
            after = f"the trainer then exited with code {trainer.wait(timeout=wait)}"
        except subprocess.TimeoutExpired:
            after = f"the trainer was still running {wait:g} s later and was stopped"
        raise LaunchError(
            f"the vLLM server exited with code {server_code} while the trainer was running; {after}. "
            f"Last lines of {server.log_path}:\n{server.tail()}"
        )


def _serve(server: ServerProcess, poll: float) -> int:
    """`--serve-only`: waits until the launch is stopped (0) or the server exits on its own (LaunchError)."""
    while True:
        code = server.proc.poll()
        if code is not None:
            raise LaunchError(
                f"the vLLM server exited with code {code} while serving. Last lines of {server.log_path}:\n"
                f"{server.tail()}"
            )
        time.sleep(poll)


def run_launch(
    plan: LaunchPlan,
    *,
    health_timeout: float = 900.0,
    grace: float = 10.0,
    poll_interval: float = 1.0,
    server_exit_wait: float = 90.0,
    echo=print,
) -> int:
    """Runs a `LaunchPlan`: the server (if any) until healthy, then the trainer; always stops both.

    If the server exits while the trainer runs, the trainer gets `server_exit_wait` s to fail on its own (TRL's
    client retries a lost connection for about 60 s before it raises), then both are stopped.

    Returns:
        The trainer's exit code, or `128 + signal` when the launcher was interrupted (130 for Ctrl-C).

    Raises:
        LaunchError: port in use, server exited early, health timeout, server exited while the trainer ran (its exit
            code and last log lines in the message; everything is stopped first).
    """
    if plan.server is not None:
        check_port_free(plan.host or "", plan.port or trl_default("vllm_server_port"))
    server = None
    if plan.server is not None:
        server = ServerProcess(plan.server, plan.server_log, plan.health_url, grace=grace)
    trainer: subprocess.Popen | None = None
    interrupted: int | None = None
    guard = _SignalGuard()
    with guard.installed():
        try:
            if server is not None:
                echo(f"starting the vLLM server (log {plan.server_log}), waiting for {plan.health_url}")
                server.start()
                took = server.wait_healthy(health_timeout, poll_interval)
                if plan.trainer is None:
                    echo(f"vLLM server healthy after {took:.1f} s (pid {server.pid}); serving until stopped")
                    return _serve(server, poll_interval)
                echo(f"vLLM server healthy after {took:.1f} s (pid {server.pid}); starting the trainer")
            elif plan.remote_health_url is not None:
                echo(f"waiting for the vLLM server at {plan.remote_health_url}")
                took = wait_for_remote_server(plan.remote_health_url, health_timeout, poll_interval)
                echo(f"the vLLM server answered after {took:.1f} s; starting the trainer")
            # Its own process group, so a stop reaches accelerate's worker processes too; stdin closed so a
            # background group never blocks on the terminal.
            try:
                trainer = subprocess.Popen(
                    plan.trainer.argv,
                    env={**plan.trainer.full_env(), **server_place_env(plan)},  # the trainer's preflight names it
                    stdin=subprocess.DEVNULL,
                    process_group=0,
                )
            except OSError as exc:
                raise LaunchError(f"could not start the trainer `{plan.trainer.render()}`: {exc}") from exc
            code = _wait_trainer(trainer, server, poll_interval, server_exit_wait)
        except _Interrupted as exc:
            interrupted = exc.signum
            code = 128 + exc.signum
        finally:
            guard.armed = False
            if trainer is not None:
                stop_process_group(trainer, grace)
            if server is not None:
                server.stop()
    if interrupted is not None:
        what = "vLLM server" if plan.trainer is None else "trainer and vLLM server"
        echo(f"interrupted by {signal.Signals(interrupted).name}: {what} stopped")
    elif server is not None:
        echo(f"trainer exited with code {code}; vLLM server stopped")
    return code
