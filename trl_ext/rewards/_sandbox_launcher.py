"""Sandbox launcher: isolates a fresh process, drops privileges, sets limits, then runs the child bootstrap.

Run by `trl_ext.rewards.sandbox` as `python -I _sandbox_launcher.py CONFIG_JSON` in a new session, never imported.
Trusted code only; the model's program starts after the `execve` at the end. Steps, each best effort and reported:

1. New namespaces (`unshare`): network (no interfaces up, so no network), mount and PID; as a non-root user inside a
   new user namespace that maps only the caller's own ids.
2. In the mount namespace: the whole tree remounted read-only; private size-capped tmpfs over /tmp, /var/tmp and
   /dev/shm (with the interpreter's own paths under them, e.g. a virtual environment in /tmp, bound back
   read-only); the program's working directory is a fresh /tmp/work. As root, directories the sandbox user may not
   traverse on the way to the interpreter (a 0700 /root holding pyenv) are covered by a tmpfs with only the
   interpreter bound back, which also hides the rest of them.
3. As root: a per-run unused uid/gid (so RLIMIT_NPROC counts only this run's processes and file permissions apply);
   otherwise the caller's ids.
4. rlimits (CPU, address space, processes, file size, open files, no core files); death with the parent (the
   launcher with the process that started it, the child with the launcher).
5. With a PID namespace the launcher forks the child as PID 1 of it and waits: when PID 1 dies the kernel kills
   every process left in the namespace, including ones that left the process group.

Protocol: `control_fd` (closed before the program starts, so the program cannot write to it) gets JSON lines
`{"isolation": {...}}` and, with a PID namespace, `{"child_pid": N}` (the host pid of PID 1); `result_fd` becomes
file descriptor 3 of the child, which writes its result line there. A setup that cannot contain the program (root
that cannot switch to an unprivileged uid) writes `{"setup_error": ...}` and exits 70 without running it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import resource
import signal
import stat
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 4096, 8192, 16384, 1 << 18
MNT_DETACH, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 2, -100, 0x8000, 1
SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and aarch64
PR_SET_PDEATHSIG = 1
RESULT_FD = 3
CONTROL_FD = 4
WORKDIR = "/tmp/work"
SETUP_FAILED = 70  # exit status when the launcher refuses to run the program (EX_SOFTWARE)

libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _unshare(flags: int) -> bool:
    return libc.unshare(ctypes.c_int(flags)) == 0


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read_only_root() -> None:
    # struct mount_attr {u64 attr_set, attr_clr, propagation, userns_fd}
    attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY, 0, 0, 0)
    ret = libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), b"/", ctypes.c_uint(AT_RECURSIVE), attr,
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )  # fmt: skip
    _check(ret, "mount_setattr / read-only")


def _blocked_ancestors(paths: list[str]) -> dict[str, list[str]]:
    """Outermost directory that 'other' users cannot traverse on the way to each path -> the paths under it."""
    blocked: dict[str, list[str]] = {}
    for path in paths:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:i])
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                blocked.setdefault(ancestor, [])
                if path not in blocked[ancestor]:
                    blocked[ancestor].append(path)
                break
    return blocked


def _interpreter_paths() -> list[str]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths |= {p for p in sys.path if p and os.path.isdir(p)}
    return sorted(os.path.realpath(p) for p in paths)


def _outermost(paths: list[str]) -> list[str]:
    """`paths` without those inside another of them (binding the outer one brings them along)."""
    return [p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)]


def _hide_blocked(blocked: dict[str, list[str]], stage: str) -> None:
    """Cover each blocked directory with a tmpfs holding only the interpreter's paths (bound back from a stage)."""
    for ancestor, keep in blocked.items():
        keep = _outermost(keep)
        staged = []
        for path in keep:
            point = os.path.join(stage, str(len(os.listdir(stage))))
            os.mkdir(point, 0o700)
            _mount(path, point, None, MS_BIND | MS_REC)
            staged.append((point, path))
        _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
        for point, path in staged:
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(point, path, None, MS_BIND | MS_REC)
            _check(libc.umount2(point.encode(), MNT_DETACH), f"umount {point}")


def _private_tmpfs(directory: str, keep: list[str], data: str, stage: str) -> None:
    """Mount a fresh tmpfs over `directory`, with the interpreter's paths inside it (`keep`) bound back.

    A virtual environment under /tmp (a CI checkout, `python -m venv /tmp/x`) would otherwise vanish under the private
    /tmp. The tmpfs is filled at a staging point first and then moved over `directory`, since once mounted there the
    paths to bind back are gone. The bound paths stay read-only: bind mounts keep the read-only flag of the root.
    """
    fresh = os.path.join(stage, f"tmpfs{len(os.listdir(stage))}")
    os.mkdir(fresh, 0o700)
    _mount("tmpfs", fresh, "tmpfs", MS_NOSUID | MS_NODEV, data)
    for path in keep:
        inside = os.path.join(fresh, os.path.relpath(path, directory))
        os.makedirs(inside, 0o755, exist_ok=True)
        _mount(path, inside, None, MS_BIND | MS_REC)
    _mount(fresh, directory, None, MS_MOVE)


def _user_tasks(uid: int) -> int:
    """Tasks (threads count: RLIMIT_NPROC counts them) whose real uid is `uid`."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return total


def _set_limits(limits: dict, nproc: int) -> None:
    cpu = int(limits["cpu_s"])
    memory = int(limits["memory_mb"]) << 20
    files = int(limits["file_mb"]) << 20
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_FSIZE, (files, files)),
        (resource.RLIMIT_NOFILE, (int(limits["open_files"]),) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
    ):
        resource.setrlimit(res, value)


def _emit(record: dict) -> None:
    # One small write per line: atomic on a pipe, so lines from the launcher and the child never interleave.
    os.write(CONTROL_FD, (json.dumps(record) + "\n").encode())


def _isolate(config: dict, source: bytes) -> tuple[dict, str]:
    """Namespaces, mounts and the per-run ids; returns the isolation report and the working directory."""
    limits, rundir = config["limits"], config["rundir"]
    root = os.geteuid() == 0
    uid = config["uid"] if root else os.getuid()
    gid = config["uid"] if root else os.getgid()
    iso: dict = {"uid": uid, "gid": gid, "root": root, "namespaces": [], "read_only_root": False}
    iso["private_tmp"] = False
    if _unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | (0 if root else CLONE_NEWUSER)):
        iso["namespaces"] = ["mount", "pid", "net"] + ([] if root else ["user"])
        if not root:
            try:
                _write("/proc/self/setgroups", "deny")
                _write("/proc/self/uid_map", f"{uid} {uid} 1")
                _write("/proc/self/gid_map", f"{gid} {gid} 1")
            except OSError as err:
                iso["uid_map_error"] = str(err)
    elif _unshare(CLONE_NEWNET | (0 if root else CLONE_NEWUSER)):
        iso["namespaces"] = ["net"] + ([] if root else ["user"])

    workdir = rundir
    blocked = _blocked_ancestors(_interpreter_paths()) if root else {}
    if "mount" in iso["namespaces"]:
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            # Relative to the working directory (the run directory, under the real /tmp): the stage stays
            # reachable after a new tmpfs covers /tmp.
            os.chdir(rundir)
            stage = "stage"
            os.mkdir(stage, 0o700)
            if blocked:
                _hide_blocked(blocked, stage)
                iso["hidden"], blocked = sorted(blocked), {}
            try:
                _read_only_root()
                iso["read_only_root"] = True
            except OSError as err:
                iso["read_only_error"] = str(err)
            _mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "mode=700,size=1m")  # writable under a read-only /
            interpreter = _interpreter_paths()
            for tmp in ("/tmp", "/var/tmp", "/dev/shm"):
                if os.path.isdir(tmp) and not os.path.islink(tmp):
                    keep = _outermost([p for p in interpreter if p.startswith(os.path.realpath(tmp) + "/")])
                    _private_tmpfs(tmp, keep, f"size={int(limits['tmpfs_mb'])}m,mode=1777", stage)
                    iso.setdefault("bound_back", []).extend(keep)
            os.mkdir(WORKDIR, 0o700)
            with open(os.path.join(WORKDIR, "program.py"), "wb") as f:
                f.write(source)
            workdir, iso["private_tmp"] = WORKDIR, True
        except OSError as err:
            iso["mount_error"] = str(err)
    if blocked:
        raise OSError(
            errno.EACCES,
            "running as root, the sandbox switches to an unprivileged uid, which cannot reach the Python "
            f"interpreter through {sorted(blocked)} (not world-searchable), and no mount namespace is available "
            "to work around it; run as a non-root user or install Python under a world-readable path",
        )
    if root:
        os.chown(workdir, uid, gid)
        os.chown(os.path.join(workdir, "program.py"), uid, gid)
    # Without a user namespace or a private uid, RLIMIT_NPROC counts every task of the user: allow that many more.
    shared_uid = not root and "user" not in iso["namespaces"]
    iso["nproc_limit"] = int(limits["processes"]) + (_user_tasks(uid) if shared_uid else 0)
    return iso, workdir


def _exec_child(config: dict, iso: dict, workdir: str, bootstrap: str) -> None:
    """Drop privileges, set the limits, report the isolation, exec the bootstrap (never returns)."""
    try:
        if iso["root"]:
            os.setgroups([])
            os.setresgid(iso["gid"], iso["gid"], iso["gid"])
            os.setresuid(iso["uid"], iso["uid"], iso["uid"])
        _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl")  # after setuid, which clears it
        _set_limits(config["limits"], iso["nproc_limit"])
        os.chdir(workdir)
        _emit({"isolation": iso})
        os.close(CONTROL_FD)
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        env |= {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        os.execve(config["python"], [config["python"], "-I", "-c", bootstrap, *config["child_args"]], env)
    except BaseException as err:  # report any failure, then never fall back into the launcher
        try:
            _emit({"setup_error": f"{type(err).__name__}: {err}"})
        finally:
            os._exit(SETUP_FAILED)


def main() -> None:
    config = json.loads(sys.argv[1])
    # Die with the process that started us (a trainer killed mid-batch must not leave programs running).
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl")
    if os.getppid() != config["parent_pid"]:
        os._exit(SETUP_FAILED)
    # Move the two pipes to 3 and 4 through numbers >= 10, whatever numbers they arrived on.
    result, control = (fcntl.fcntl(config[key], fcntl.F_DUPFD, 10) for key in ("result_fd", "control_fd"))
    os.close(config["result_fd"])
    os.close(config["control_fd"])
    os.dup2(result, RESULT_FD)
    os.dup2(control, CONTROL_FD)
    os.close(result)
    os.close(control)
    with open(os.path.join(config["rundir"], "program.py"), "rb") as f:
        source = f.read()
    with open(config["bootstrap"]) as f:
        bootstrap = f.read()
    try:
        iso, workdir = _isolate(config, source)
    except OSError as err:
        _emit({"setup_error": str(err)})
        os._exit(SETUP_FAILED)
    if "pid" not in iso["namespaces"]:
        _exec_child(config, iso, workdir, bootstrap)
    child = os.fork()
    if child == 0:
        _exec_child(config, iso, workdir, bootstrap)
    # Stay as the parent of PID 1 of the namespace: report its host pid, then mirror its end.
    _emit({"child_pid": child})
    os.close(RESULT_FD)
    os.close(CONTROL_FD)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
