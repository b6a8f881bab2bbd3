"""Run the learning-outcome tests under each CPU kernel set and thread count, and tabulate pass/fail and margins.

    python tests/scripts/outcome_matrix.py                 # every setting this CPU supports, 1 and 2 threads
    python tests/scripts/outcome_matrix.py --capabilities avx2 --threads 2 -- tests/test_demo.py
    make outcome-matrix                                    # the same, from the repository root

A trajectory that is deterministic on one machine is another trajectory on the next: torch picks its CPU kernels by
the vector unit (`ATEN_CPU_CAPABILITY`: `default` = no explicit vectors, `avx2`, `avx512`), and a parallel
reduction's order follows the thread count, so the rounding differs and training drifts apart. The tests listed in
OUTCOME_TESTS claim learning outcomes; each writes its measured numbers with `tests/outcomes.py:record_margin`.
This script runs pytest once per setting (`ATEN_CPU_CAPABILITY`, `TRL_EXT_TEST_THREADS`, `OMP_NUM_THREADS`), reads
the JUnit XML for pass/fail and the JSON lines for the margins, and prints a markdown table (test x setting) and
writes it, with the raw rows, under --out. A capability torch does not grant on this CPU (it falls back silently)
is left out and said so. Exit status 1 when any test failed in any setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The tests that train and then compare numbers (docs/testing.md, "Learning outcomes on any CPU", says each margin).
OUTCOME_TESTS = [
    "tests/test_demo.py",
    "tests/test_objectives_mechanisms.py",
    "tests/test_trainer_learning.py",
    "tests/test_trainer_training.py",
    "tests/test_sampling.py",
    "tests/test_sft_validation.py::test_sft_recipe_measures_accuracy_at_every_evaluation",
    "tests/test_recipe_runs.py::test_sft_recipe_learns_and_logs_the_completion_only_loss",
    "tests/test_expert_iteration.py::test_short_ei_run_on_transformers_counts_sft_steps_validates_and_saves",
]
CAPABILITIES = ["default", "avx2", "avx512"]


def granted_capability(requested: str) -> str:
    """The kernel set torch really uses under `ATEN_CPU_CAPABILITY=requested` (torch falls back without a word)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": requested}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().lower()


def _junit_results(path: Path) -> dict[str, str]:
    """`{test id: "pass" | "FAIL" | "skip"}` from pytest's JUnit XML."""
    results = {}
    if not path.exists():
        return results
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            results[name] = "FAIL"
        elif case.find("skipped") is not None:
            results[name] = "skip"
        else:
            results[name] = "pass"
    return results


def run_setting(capability: str, threads: int, tests: list[str], out: Path, pytest_args: list[str]) -> dict:
    """One pytest run of `tests` under one setting; returns its pass/fail per test, margins and clocks."""
    tag = f"{capability}-t{threads}"
    log, junit = out / f"{tag}.jsonl", out / f"{tag}.xml"
    log.unlink(missing_ok=True)
    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": capability,
        "TRL_EXT_TEST_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "TRL_EXT_OUTCOME_LOG": str(log),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "offline",
        # Idle OpenMP threads sleep instead of spinning: the same numbers, and on a shared machine 2 threads that spin
        # cost several times the CPU time (measured 165 against 53 CPU s).
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *pytest_args]
    started = time.perf_counter()
    before = os.times()
    proc = subprocess.run([*cmd, *tests], cwd=REPO, env=env, capture_output=True, text=True)
    after = os.times()
    (out / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    margins = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        row = json.loads(line)
        margins[row["test"]] = row["values"]
    return {
        "setting": tag,
        "capability": capability,
        "threads": threads,
        "returncode": proc.returncode,
        "results": _junit_results(junit),
        "margins": margins,
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_s": round(after.children_user + after.children_system - before.children_user - before.children_system, 1),
        "summary": (proc.stdout.strip().splitlines() or [""])[-1],
    }


def _fmt(values: dict) -> str:
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items())


def table(runs: list[dict]) -> str:
    """Markdown: one row per test, one column per setting; a cell is pass/FAIL and the recorded margin, if any."""
    settings = [r["setting"] for r in runs]
    lines = ["| test | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    failed = sorted({t for r in runs for t, v in r["results"].items() if v != "pass"})
    margin_tests = sorted({t for r in runs for t in r["margins"]})
    for test in margin_tests:
        cells = [_fmt(r["margins"][test]) if test in r["margins"] else "-" for r in runs]
        lines.append(f"| {test} | " + " | ".join(cells) + " |")
    for test in failed:
        cells = [r["results"].get(test, "-") for r in runs]
        lines.append(f"| {test} | " + " | ".join(cells) + " |")
    counts = []
    for r in runs:
        values = list(r["results"].values())
        counts.append(f"{values.count('pass')} pass, {values.count('FAIL')} fail ({r['cpu_s']:.0f} CPU s)")
    lines.append("| **all tests** | " + " | ".join(counts) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capabilities", nargs="+", default=CAPABILITIES, help="ATEN_CPU_CAPABILITY values.")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="Torch threads per process.")
    parser.add_argument("--out", default="runs/outcome_matrix", help="Folder for logs, JUnit XML, JSON, table.")
    parser.add_argument("--pytest-args", default="", help="Extra pytest arguments, e.g. '-x'.")
    parser.add_argument("tests", nargs="*", help="Test paths / ids (default: OUTCOME_TESTS).")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tests = args.tests or OUTCOME_TESTS
    runs = []
    for capability in args.capabilities:
        granted = granted_capability(capability)
        if granted != capability:
            print(f"[matrix] ATEN_CPU_CAPABILITY={capability}: torch runs {granted} on this CPU; left out", flush=True)
            continue
        for threads in args.threads:
            print(f"[matrix] {capability}, {threads} thread(s): pytest {' '.join(tests)}", flush=True)
            run = run_setting(capability, threads, tests, out, args.pytest_args.split())
            print(f"[matrix]   {run['summary']} ({run['wall_s']:.0f} s wall, {run['cpu_s']:.0f} CPU s)", flush=True)
            runs.append(run)
    text = table(runs)
    (out / "matrix.md").write_text(text + "\n")
    (out / "matrix.json").write_text(json.dumps(runs, indent=1))
    print(text)
    print(f"[matrix] wrote {out / 'matrix.md'} and {out / 'matrix.json'}")
    return 0 if runs and all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
