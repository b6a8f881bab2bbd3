"""A real one-node Slurm for the study tests: munged, slurmctld and slurmd from a temporary folder with a
`slurm.conf` of its own (`SLURM_CONF`), no cgroups, no accounting; stopped by their pids at the end.

It installs nothing (`.ci/run` installs Debian's `slurm-wlm` and `munge` where it can); `skip_reason` says why a
cluster cannot start here (not installed, not root)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")


def skip_reason() -> str | None:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; .ci/run installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "the test's Slurm runs its daemons as root (SlurmUser=root), and this is not root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """Start with `start()`, stop with `stop()`; `env` is the environment a client needs (`SLURM_CONF`)."""

    def __init__(self, folder: Path, cpus: int = 2):
        self.folder = folder
        self.cpus = cpus
        self.host = socket.gethostname().split(".")[0]
        self.conf = folder / "slurm.conf"
        self.munge_socket = folder / "munge.socket"
        self.pids: list[int] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write(self) -> None:
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        f = self.folder
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=studytest",
                    f"SlurmctldHost={self.host}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SchedulerType=sched/backfill",
                    f"StateSaveLocation={f / 'state'}",
                    f"SlurmdSpoolDir={f / 'spool'}",
                    f"SlurmctldPidFile={f / 'slurmctld.pid'}",
                    f"SlurmdPidFile={f / 'slurmd.pid'}",
                    f"SlurmctldLogFile={f / 'slurmctld.log'}",
                    f"SlurmdLogFile={f / 'slurmd.log'}",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    f"NodeName={self.host} CPUs={self.cpus} RealMemory=8000 State=UNKNOWN",
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        key = f / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        self._write()
        f = self.folder
        subprocess.run(
            [
                "munged", "--force", f"--key-file={f / 'munge.key'}", f"--socket={self.munge_socket}",
                f"--pid-file={f / 'munged.pid'}", f"--log-file={f / 'munged.log'}", f"--seed-file={f / 'munge.seed'}",
            ],
            check=True, capture_output=True,
        )  # fmt: skip
        self._read_pid(f / "munged.pid")
        subprocess.run(["slurmctld", "-i"], env=self.env, check=True, capture_output=True)
        self._read_pid(f / "slurmctld.pid")
        subprocess.run(["slurmd"], env=self.env, check=True, capture_output=True)
        self._read_pid(f / "slurmd.pid")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True).stdout
            if out.strip() == "idle":
                return self
            time.sleep(0.5)
        raise RuntimeError(f"the test's Slurm node is not idle after {timeout:.0f} s: {self.logs()}")

    def _read_pid(self, path: Path, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.is_file() and path.read_text().strip():
                self.pids.append(int(path.read_text().split()[0]))
                return
            time.sleep(0.1)
        raise RuntimeError(f"no pid file {path}: {self.logs()}")

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = self.folder / name
            if path.is_file():
                parts.append(f"{name}:\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(parts)

    def stop(self) -> None:
        for pid in reversed(self.pids):  # slurmd, slurmctld, then munged
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
