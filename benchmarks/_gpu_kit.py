"""The machinery of the GPU check kit (benchmarks/gpu_check.py): a registry of parts, a runner that records each
part's result or failure in the JSON as soon as the part ends, and the wheel budget of the device transfer.

The device (/work/.library/device/README.md) allows 600 s per command and carries 64 MiB (the working tree plus the
wheels of what its image lacks), and nothing can be fetched there. So the kit runs one part per call if needed
(`--part NAME`; results accumulate in the same JSON across calls), writes the JSON after every part, and records any
failure of a part (out of memory, a crash, a script's non-zero exit) in that part's entry instead of losing the run.

Adding a part is a decorated function, or for another benchmark script one line:

    script_part("bench_trainer", "benchmarks/bench_trainer.py", "--repeats", "3",
                results="benchmarks/results/trainer.json", minutes=6.0)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRANSFER_LIMIT_BYTES = 64 * 2**20
# Wheels the device image lacks (its package list: /work/.library/device/KINDS.md, 2026-11-17; it has torch,
# transformers 5.17, accelerate, peft, pyarrow, xxhash, pandas, sympy, typer, ...), pinned to what the CPU suite
# runs, with their sizes in bytes from `pip download` (Python 3.12, manylinux x86_64; 2026-11-25).
WHEELS = {
    "trl==1.16.0": 948_205,
    "datasets==5.2.0": 608_276,
    "math-verify==0.9.0": 29_967,
    "latex2sympy2_extended==1.11.0": 209_050,
    "antlr4-python3-runtime==4.13.2": 144_462,
    "dill==0.4.1": 120_019,
    "multiprocess==0.70.19": 150_281,
    "bitsandbytes==0.50.2": 43_139_553,  # seed 004's 8-bit AdamW
}
DOWNLOAD = (
    "python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
    "--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 "
    "--platform manylinux2014_x86_64 -d .whl"
)


@dataclass(frozen=True)
class Part:
    """One unit of the kit: `run(args, workdir) -> dict` and the minutes it is expected to take on one H100."""

    name: str
    run: Callable
    minutes: float
    default: bool = True


PARTS: dict[str, Part] = {}


def part(name: str, minutes: float, default: bool = True):
    """Register the decorated `run(args, workdir) -> dict` as the part `name`."""

    def register(run: Callable) -> Callable:
        PARTS[name] = Part(name, run, minutes, default)
        return run

    return register


def script_part(
    name: str, script: str, *script_args: str, results: str | None = None, minutes: float, default: bool = False
) -> Part:
    """Register a part that runs another benchmark script (its own process): its exit code and output tail, and
    the JSON it writes (`results`, relative to the repository) inlined, since only the kit's JSON comes back."""

    def run(args, workdir: Path) -> dict:
        command = [sys.executable, str(ROOT / script), *script_args]
        timeout = max(args.deadline - time.monotonic(), 1.0) if args.deadline else None
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        out = {"command": command[1:], "returncode": proc.returncode, "output_tail": proc.stdout[-2000:]}
        if proc.returncode != 0:
            raise RuntimeError(f"{script} exited with {proc.returncode}: {proc.stderr[-1500:]}")
        if results is not None:
            out["results"] = json.loads((ROOT / results).read_text())
        return out

    PARTS[name] = Part(name, run, minutes, default)
    return PARTS[name]


def write_json(path: Path, report: dict) -> None:
    """Write `report` atomically (a killed command leaves the previous JSON, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, path)


def run_parts(names: list[str], args, workdir: Path, output: Path, report: dict, cleanup: Callable) -> dict:
    """Run `names` in order; after each, record `{status, seconds, ...}` (or the error with its traceback's tail)
    under `report["parts"][name]` and write the JSON. A failing part never stops the next one."""
    parts = report.setdefault("parts", {})
    for name in names:
        start = time.perf_counter()
        try:
            entry = {"status": "ok", **PARTS[name].run(args, workdir)}
        except Exception as err:  # any failure is a result of this part: OOM, a crash, a script's exit
            entry = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:2000]}
            entry["traceback"] = traceback.format_exc()[-4000:]
        finally:
            cleanup()
        entry["seconds"] = time.perf_counter() - start
        parts[name] = entry
        write_json(output, report)
        print(f"part {name}: {entry['status']} in {entry['seconds']:.0f} s", flush=True)
    return report


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the files that travel: git's tracked and untracked-not-ignored files."""
    listing = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    )
    files = [root / name for name in listing.stdout.decode().split("\0") if name]
    return sum(f.stat().st_size for f in files if f.is_file())


def wheel_budget(tree: int, wheels: dict[str, int] = WHEELS) -> dict:
    """The transfer the device call would make: working tree + wheels, against its 64 MiB."""
    total = tree + sum(wheels.values())
    return {
        "tree_bytes": tree,
        "wheel_bytes": sum(wheels.values()),
        "total_bytes": total,
        "limit_bytes": TRANSFER_LIMIT_BYTES,
        "fits": total <= TRANSFER_LIMIT_BYTES,
    }
