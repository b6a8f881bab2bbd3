"""Sandbox child: runs ./program.py and sends one global back as data (one JSON line on file descriptor 3).

Passed by `_sandbox_launcher` to a fresh `python -I -c` as an unprivileged user inside the sandbox, never imported:
`sys.argv` is `["-c", NAME, MAX_BYTES]`. Before the program runs, an audit hook (PEP 578) refuses sockets, new
processes and writes outside the working directory with a clear `PermissionError`. The hook is a courtesy that
gives readable errors, not the boundary (code can bypass it through `ctypes`); the launcher's namespaces, uid and
rlimits are. Result lines: `{"value": ...}`, or `{"error": "...", "exception": "TypeName"}` when the program raised,
or `{"error": "..."}` when its global is missing or cannot be sent.
"""

import json
import os
import sys
import traceback

RESULT_FD = 3
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
PATH_EVENTS = {
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
    "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile",
}  # fmt: skip
PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen"}
HOME = os.getcwd()
_inside = False


def _outside(path) -> bool:
    if isinstance(path, int):
        return False  # an already open descriptor
    path = os.fsdecode(path)
    if path == os.devnull:
        return False
    real = os.path.realpath(path)
    return real != HOME and not real.startswith(HOME + os.sep)


def _guard(event: str, args: tuple) -> None:
    global _inside
    if _inside:  # realpath below raises its own events
        return
    _inside = True
    try:
        if event.startswith("socket."):
            raise PermissionError("network access is disabled in the sandbox")
        if event in PROCESS_EVENTS:
            raise PermissionError(f"starting processes ({event}) is disabled in the sandbox")
        writing = event == "open" and (
            (isinstance(args[1], str) and any(c in args[1] for c in "wax+")) or (args[2] or 0) & WRITE_FLAGS
        )
        if (writing or event in PATH_EVENTS) and args and _outside(args[0]):
            raise PermissionError(f"the sandbox allows changes only inside its working directory ({event} {args[0]})")
    finally:
        _inside = False


def _plain(value, where: str, depth: int = 0):
    """`value` as JSON data: numpy arrays and scalars to Python, tuples and sets to lists; TypeError otherwise."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return _plain(value.tolist(), where, depth)
    if isinstance(value, list | tuple | set | frozenset) and depth < 3:
        return [_plain(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    raise TypeError(f"`{where}` is a {type(value).__name__}; send plain lists of ints")


def _send(record: dict, max_bytes: int) -> None:
    try:
        line = json.dumps(record, allow_nan=False)
    except ValueError as err:  # NaN, or an int beyond Python's int-to-str digit limit
        line = json.dumps({"error": f"`{sys.argv[1]}` cannot be sent back: {err}"})
    if len(line) > max_bytes:
        line = json.dumps({"error": f"`{sys.argv[1]}` is {len(line)} bytes as JSON, over the limit of {max_bytes}"})
    data = (line + "\n").encode()
    while data:  # a signal can interrupt a long write part-way
        data = data[os.write(RESULT_FD, data) :]


def _error_text(err: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == "program.py"]
    lines = [f"  line {f.lineno}: {f.line}" for f in frames[-5:]]
    head = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return "\n".join([head[:2000], *lines])


def main() -> None:
    name, max_bytes = sys.argv[1], int(sys.argv[2])
    os.set_inheritable(RESULT_FD, False)
    sys.dont_write_bytecode = True
    with open("program.py", encoding="utf-8", errors="replace") as f:
        source = f.read()
    sys.addaudithook(_guard)
    namespace = {"__name__": "__main__", "__file__": "program.py", "__builtins__": __builtins__}
    try:
        exec(compile(source, "program.py", "exec"), namespace)
    except SystemExit as err:
        if err.code not in (0, None):
            _send({"error": f"program exited with status {err.code!r}"}, max_bytes)
            return
    except BaseException as err:
        _send({"error": _error_text(err), "exception": type(err).__name__}, max_bytes)
        return
    finally:
        sys.stdout.flush()
    if name not in namespace:
        _send({"error": f"the program did not define a global `{name}`"}, max_bytes)
        return
    value = namespace[name]
    if not (isinstance(value, list | tuple | set | frozenset) or type(value).__module__ == "numpy"):
        _send({"error": f"`{name}` must be a list of vectors, got {type(value).__name__}"}, max_bytes)
        return
    try:
        _send({"value": _plain(value, name)}, max_bytes)
    except (TypeError, RecursionError) as err:
        _send({"error": str(err)}, max_bytes)


main()
