"""A real two-node Slurm cluster on one machine, for the study tests: node A and node B.

Each node is a network, UTS and mount namespace of its own (`unshare`, held by a `sleep` whose pid names it): its own
hostname (`nodea`, `nodeb`), a loopback, one end of a veth pair joining the two (10.251.0.1/24 and 10.251.0.2/24;
no route anywhere else, so nothing inside can reach an address outside them), and an /etc/hosts naming both nodes
(bind-mounted in the node's mount namespace only, as a cluster's DNS would resolve them). One `munged` (its socket a
file both nodes see), one `slurmctld` on node A, one `slurmd` per node, from Debian's `slurm-wlm` and `munge` with a
`slurm.conf` of the fixture's own (`SLURM_CONF`; no cgroups, no accounting, state and logs in the fixture's folder).
Node A is also where the tests submit from (a cluster's head node). The file system is the machine's, shared by both
nodes as a cluster's shared file system would be.

`stop()` stops every process it started by its pid, then any process a job left in a node (found by its network
namespace), then the namespace holders; the veth pair and the mounts go with the namespaces. It installs nothing
(`.ci/run` installs slurm-wlm, munge and iproute2 where it can); `skip_reason` says why a cluster cannot start here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun")
NAMESPACE_TOOLS = ("unshare", "nsenter", "ip")
NODES = ("nodea", "nodeb")
ADDRESSES = {"nodea": "10.251.0.1", "nodeb": "10.251.0.2"}
PREFIX = 24
# The node's end of the veth pair (interface names stay under 16 characters).
INTERFACES = {"nodea": "trlxa", "nodeb": "trlxb"}
# How long slurmctld waits for a silent slurmd before it declares the node DOWN (a job still running there is then
# requeued or ends; one that ended stops waiting for the node's cleanup), and how long a requeued job waits before it
# may start again (Slurm's defaults: 300 s and 120 s, `cred_expire`).
SLURMD_TIMEOUT = 30
CRED_EXPIRE = 10


def skip_reason() -> str | None:
    """Why a two-node cluster cannot start here, or None."""
    missing = [t for t in (*TOOLS, *NAMESPACE_TOOLS) if shutil.which(t) is None]
    if missing:
        return (
            f"the two-node Slurm cluster needs {', '.join(missing)} (.ci/run installs slurm-wlm, munge and iproute2; "
            "unshare and nsenter come with util-linux)"
        )
    if os.geteuid() != 0:
        return "the test's Slurm runs its daemons as root and makes network namespaces, and this is not root"
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "--propagation", "private", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"network namespaces cannot be made here (`unshare --net --uts --mount`: {probe.stderr.strip()})"
    return None


def _netns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


class TwoNodeCluster:
    """Start with `start()`, stop with `stop()`. `run(node, argv)` / `popen(node, argv)` run a command on a node
    (inside its namespaces, with `env`, which names the cluster's `SLURM_CONF`)."""

    def __init__(self, folder: Path, cpus: int = 2):
        self.folder = Path(folder)
        self.cpus = cpus
        self.conf = self.folder / "slurm.conf"
        self.munge_socket = self.folder / "munge.socket"
        self.holders: dict[str, subprocess.Popen] = {}
        self.daemons: dict[str, int] = {}  # name -> pid, in start order
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- running things on a node

    def command(self, node: str, argv: list[str], cwd: str | Path | None = None) -> list[str]:
        """`argv` run inside `node`'s network, UTS and mount namespaces, in `cwd` (default: this process's)."""
        pid = self.holders[node].pid
        wd = f"--wd={Path(cwd or os.getcwd()).resolve()}"
        return ["nsenter", "-t", str(pid), "--net", "--uts", "--mount", wd, "--", *map(str, argv)]

    def run(self, node: str, argv: list[str], cwd: str | Path | None = None, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("env", self.env)
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(node, argv, cwd), **kwargs)

    def popen(self, node: str, argv: list[str], cwd: str | Path | None = None, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("env", self.env)
        return subprocess.Popen(self.command(node, argv, cwd), **kwargs)

    def processes(self, node: str) -> list[int]:
        """The pids of every process in `node`'s network namespace but its holder."""
        holder = self.holders[node].pid
        ns = _netns(holder)
        return [
            pid
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit())
            if pid != holder and _netns(pid) == ns and not _is_zombie(pid)
        ]

    # -- start and stop

    def _write(self) -> None:
        f = self.folder
        for sub in ("state", "spool"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        (f / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{ADDRESSES[n]} {n}\n" for n in NODES))
        nodes = [
            f"NodeName={n} NodeAddr={ADDRESSES[n]} NodeHostname={n} CPUs={self.cpus} RealMemory=8000 State=UNKNOWN"
            for n in NODES
        ]
        lines = [
            "ClusterName=twonodes",
            f"SlurmctldHost={NODES[0]}({ADDRESSES[NODES[0]]})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            f"SlurmdTimeout={SLURMD_TIMEOUT}",
            "KillWait=10",
            "MinJobAge=3600",
            f"StateSaveLocation={f / 'state'}",
            f"SlurmdSpoolDir={f / 'spool' / '%n'}",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}",
            f"SlurmdPidFile={f / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={f / 'slurmctld.log'}",
            f"SlurmdLogFile={f / 'slurmd.%n.log'}",
            *nodes,
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
        self.conf.write_text("\n".join(lines))
        key = f / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)

    def _make_nodes(self) -> None:
        """The namespaces, their hostnames and hosts file, and the veth pair between them."""
        for node in NODES:
            self.holders[node] = subprocess.Popen(
                ["unshare", "--net", "--uts", "--mount", "--propagation", "private", "sleep", "infinity"],
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 10
        while any(_netns(h.pid) == _netns(os.getpid()) for h in self.holders.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("the namespace holders did not enter their namespaces")
            time.sleep(0.02)
        a, b = NODES
        steps = [
            (a, ["ip", "link", "add", INTERFACES[a], "type", "veth", "peer", "name", INTERFACES[b], "netns",
                 str(self.holders[b].pid)]),
        ]  # fmt: skip
        for node in NODES:
            steps += [
                (node, ["hostname", node]),
                (node, ["mount", "--bind", str(self.folder / "hosts"), "/etc/hosts"]),
                (node, ["ip", "link", "set", "lo", "up"]),
                (node, ["ip", "addr", "add", f"{ADDRESSES[node]}/{PREFIX}", "dev", INTERFACES[node]]),
                (node, ["ip", "link", "set", INTERFACES[node], "up"]),
            ]
        for node, argv in steps:
            done = self.run(node, argv)
            if done.returncode != 0:
                raise RuntimeError(f"{node}: `{' '.join(argv)}` failed: {done.stderr.strip()}")

    def start(self, timeout: float = 60.0) -> TwoNodeCluster:
        self._write()
        self._make_nodes()
        f = self.folder
        subprocess.run(
            [
                "munged", "--force", f"--key-file={f / 'munge.key'}", f"--socket={self.munge_socket}",
                f"--pid-file={f / 'munged.pid'}", f"--log-file={f / 'munged.log'}", f"--seed-file={f / 'munge.seed'}",
            ],
            check=True, capture_output=True,
        )  # fmt: skip
        self._read_pid("munged", f / "munged.pid")
        self._daemon(NODES[0], "slurmctld", ["slurmctld", "-i"], f / "slurmctld.pid")
        for node in NODES:
            self.start_slurmd(node)
        self.wait_idle(timeout)
        return self

    def start_slurmd(self, node: str) -> None:
        self._daemon(node, f"slurmd.{node}", ["slurmd"], self.folder / f"slurmd.{node}.pid")

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until both nodes are idle (a node returning after it was DOWN included)."""
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            out = self.run(NODES[0], ["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            if all(states.get(n) == "idle" for n in NODES):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the test's Slurm nodes are not idle after {timeout:.0f} s ({out.strip()}): {self.logs()}")

    def _daemon(self, node: str, name: str, argv: list[str], pid_file: Path) -> None:
        pid_file.unlink(missing_ok=True)
        done = self.run(node, argv)
        if done.returncode != 0:
            raise RuntimeError(f"{name} did not start: {done.stderr.strip()}\n{self.logs()}")
        self._read_pid(name, pid_file)

    def _read_pid(self, name: str, path: Path, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.is_file() and path.read_text().strip():
                self.daemons[name] = int(path.read_text().split()[0])
                return
            time.sleep(0.05)
        raise RuntimeError(f"no pid file {path}: {self.logs()}")

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL to every process of `node` (its slurmd, the jobs' step daemons and tasks): the node is lost.
        Returns the pids killed."""
        pids = self.processes(node)
        for pid in pids:
            _kill(pid, signal.SIGKILL)
        self.daemons.pop(f"slurmd.{node}", None)
        _wait_gone(pids, 10)
        return pids

    def logs(self, lines: int = 15) -> str:
        parts = []
        for name in ("slurmctld.log", *(f"slurmd.{n}.log" for n in NODES), "munged.log"):
            path = self.folder / name
            if path.is_file():
                parts.append(f"{name}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)

    def stop(self) -> list[str]:
        """Stops everything; returns what a job had left running in a node (commands), for the caller to report."""
        left = []
        for name in reversed(list(self.daemons)):  # the slurmds, slurmctld, then munged
            _terminate(self.daemons.pop(name))
        for node, holder in self.holders.items():
            if holder.poll() is not None:
                continue
            for pid in self.processes(node):
                left.append(f"{node}: {command_line(pid)}")
                _kill(pid, signal.SIGKILL)
            holder.kill()
            holder.wait()
        return left


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def command_line(pid: int) -> str:
    """`pid`'s command line as one string ("?" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_is_zombie(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _terminate(pid: int) -> None:
    _kill(pid, signal.SIGTERM)
    if not _wait_gone([pid], 15):
        _kill(pid, signal.SIGKILL)
        _wait_gone([pid], 5)
