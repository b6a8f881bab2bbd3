"""The machinery of the GPU check kit (benchmarks/gpu_check.py): a registry of parts, each with its expected seconds
on one H100 (benchmarks/_gpu_plan.py), a runner that keeps the whole run inside a time budget and records each part's
result, failure or skip in the JSON as soon as the part ends, the wheels' install and the size of what is copied.

A few minutes on one GPU are enough (a GPU machine without internet: the repository and its wheels, under 64
MiB, are all it gets), so the default run gives its numbers in one command within `BUDGET_S` (480 s), set-up
included: before each part the
runner compares the part's expected seconds with what is left and skips it with a message (run it alone with
`--part NAME`) when it would not fit; within a part, `run_fits` does the same per trainer run, and a run still going
at the deadline stops after its current step (gpu_check's step timer). The JSON is written after every part.

Adding a part is a decorated function with its plan, or for another benchmark script one line:

    script_part("bench_trainer", "benchmarks/bench_trainer.py", "--repeats", "3",
                results="benchmarks/results/trainer.json", seconds=360)
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _gpu_plan import PartPlan

ROOT = Path(__file__).resolve().parents[1]
TRANSFER_LIMIT_BYTES = 64 * 2**20
# Wheels a GPU machine with the usual image lacks (one with torch, transformers 5.17, accelerate, peft, pyarrow,
# xxhash, pandas, sympy, typer, ...), pinned to what the CPU suite
# runs, with their sizes in bytes from `pip download` (Python 3.12, manylinux x86_64; 2026-11-25).
WHEELS = {
    "trl==1.16.0": 948_205,
    "datasets==5.2.0": 608_276,
    "math-verify==0.9.0": 29_967,
    "latex2sympy2_extended==1.11.0": 209_050,
    "antlr4-python3-runtime==4.13.2": 144_462,
    "dill==0.4.1": 120_019,
    "multiprocess==0.70.19": 150_281,
    "bitsandbytes==0.50.2": 43_139_553,  # the GSM8K report's 8-bit AdamW
}
DOWNLOAD = (
    "python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
    "--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 "
    "--platform manylinux2014_x86_64 -d .whl"
)


@dataclass(frozen=True)
class Part:
    """One unit of the kit: `run(args, workdir) -> dict`, and `expect(args) -> PartPlan`, its expected seconds on
    one H100 with their derivation."""

    name: str
    run: Callable
    expect: Callable
    default: bool = True


PARTS: dict[str, Part] = {}


def part(name: str, expect: Callable, default: bool = True):
    """Register the decorated `run(args, workdir) -> dict` as the part `name`, expected to take `expect(args)`."""

    def register(run: Callable) -> Callable:
        PARTS[name] = Part(name, run, expect, default)
        return run

    return register


def script_part(
    name: str, script: str, *script_args: str, results: str | None = None, seconds: float, default: bool = False
) -> Part:
    """Register a part that runs another benchmark script (its own process, killed at the budget's deadline): its
    exit code and output tail, and the JSON it writes (`results`, relative to the repository) inlined, since only
    the kit's JSON comes back."""

    def run(args, workdir: Path) -> dict:
        command = [sys.executable, str(ROOT / script), *script_args]
        timeout = max(args.deadline - time.monotonic(), 1.0) if getattr(args, "deadline", None) else None
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        out = {"command": command[1:], "returncode": proc.returncode, "output_tail": proc.stdout[-2000:]}
        if proc.returncode != 0:
            raise RuntimeError(f"{script} exited with {proc.returncode}: {proc.stderr[-1500:]}")
        if results is not None:
            out["results"] = json.loads((ROOT / results).read_text())
        return out

    def expect(args) -> PartPlan:
        return PartPlan(f"{' '.join([script, *script_args])}: a stated allowance", fixed_s=seconds)

    PARTS[name] = Part(name, run, expect, default)
    return PARTS[name]


def seconds_left(args) -> float | None:
    """Seconds left of the run's budget (`args.deadline`, a `time.monotonic()` instant), or None without one."""
    deadline = getattr(args, "deadline", None)
    return None if deadline is None else deadline - time.monotonic()


def run_fits(args, expected_s: float, what: str) -> str | None:
    """None when `expected_s` more seconds fit in the budget, else the message that `what` is skipped."""
    left = seconds_left(args)
    if left is None or expected_s <= left:
        return None
    return (
        f"skipped {what}: expected {expected_s:.0f} s on one H100, {max(left, 0):.0f} s left of the "
        f"{args.budget_s:.0f} s budget (run it alone: --part NAME, or raise --budget-s)"
    )


def write_json(path: Path, report: dict) -> None:
    """Write `report` atomically (a killed command leaves the previous JSON, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, path)


def run_parts(names: list[str], args, workdir: Path, output: Path, report: dict, cleanup: Callable) -> dict:
    """Run `names` in order; after each, record `{status, seconds, expected_s, ...}` (or the error with its
    traceback's tail) under `report["parts"][name]` and write the JSON. A failing part never stops the next one; a
    part whose expected seconds exceed what is left of the budget is recorded as skipped, with the reason."""
    parts = report.setdefault("parts", {})
    for name in names:
        expected = PARTS[name].expect(args).seconds
        reason = run_fits(args, expected, f"part {name}")
        start = time.perf_counter()
        if reason is not None:
            entry = {"status": "skipped", "reason": reason}
        else:
            try:
                entry = {"status": "ok", **PARTS[name].run(args, workdir)}
            except Exception as err:  # any failure is a result of this part: OOM, a crash, a script's exit
                entry = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:2000]}
                entry["traceback"] = traceback.format_exc()[-4000:]
            finally:
                cleanup()
        entry.update(seconds=time.perf_counter() - start, expected_s=expected)
        parts[name] = entry
        write_json(output, report)
        done = f"part {name}: {entry['status']} in {entry['seconds']:.0f} s (expected {expected:.0f})"
        print(reason or done, flush=True)
    return report


def install_wheels(folder: Path) -> dict:
    """Install every wheel in `folder` (no index, no dependencies: the GPU machine fetches nothing) into a fresh folder
    that goes first on `sys.path` and on the children's `PYTHONPATH`; the set-up's first step, timed."""
    start = time.perf_counter()
    wheels = sorted(str(w) for w in Path(folder).glob("*.whl"))
    if not wheels:
        raise SystemExit(f"--wheelhouse {folder}: no .whl files there (python benchmarks/gpu_check.py --wheels)")
    # Named site-packages: dill (datasets' fingerprints) pickles a module's objects by reference only when its file
    # is under sys.prefix or has "site-packages" in its path (dill._dill._is_builtin_module), by value otherwise; by
    # value it can reach pyarrow types it cannot pickle (seen with pyarrow itself outside such a path).
    site = str(Path(tempfile.mkdtemp(prefix="gpu_check_")) / "site-packages")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", site]
    subprocess.run([*pip, *wheels], check=True)
    sys.path.insert(0, site)
    os.environ["PYTHONPATH"] = os.pathsep.join([site, *filter(None, [os.environ.get("PYTHONPATH")])])
    importlib.invalidate_caches()
    return {"wheels": [Path(w).name for w in wheels], "site": site, "seconds": time.perf_counter() - start}


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
    """What is copied to the GPU machine: working tree + wheels, against 64 MiB."""
    total = tree + sum(wheels.values())
    return {
        "tree_bytes": tree,
        "wheel_bytes": sum(wheels.values()),
        "total_bytes": total,
        "limit_bytes": TRANSFER_LIMIT_BYTES,
        "fits": total <= TRANSFER_LIMIT_BYTES,
    }
