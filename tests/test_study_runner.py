"""`trl-ext study run` on this machine with the real launcher and a stand-in trainer (`--train-cmd`,
tests/scripts/study_fake_trainer.py): finished runs skipped, `--seed` / `--resume true` on every run, a failed run
reported with its log tail while the others go on and a non-zero exit, the report from the folders; SIGTERM leaves
no process behind. Real training through a study (on two Slurm nodes): tests/test_study_two_nodes.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "scripts" / "study_fake_trainer.py"


def _study(tmp_path: Path, arms: list[str], seeds: list[int]) -> Path:
    for arm in arms:
        (tmp_path / f"{arm}.yaml").write_text(f"base: {ROOT / 'recipes/countdown/cpu_tiny.yaml'}\n")
    lines = ["name: s", "script: recipes/countdown.py", "accelerate_config: accelerate_configs/cpu.yaml"]
    lines += [f"seeds: {seeds}", "arms:"]
    for arm in arms:
        lines += [f"  {arm}:", f"    recipe: {tmp_path / (arm + '.yaml')}"]
        lines += [f"    args: --model_name_or_path {tmp_path / 'tiny'}"]
    path = tmp_path / "study.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "TRL_EXT_TRAIN_CMD": f"{{python}} {FAKE} {{config}}", "PYTHONPATH": str(ROOT)}


def _command(study: Path, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "trl_ext.cli", "study", "run", str(study), "--root", str(tmp_path / "runs")]


def _finished_run(folder: Path, seed: int) -> None:
    subprocess.run([sys.executable, FAKE, "done.yaml", "--output_dir", str(folder), "--seed", str(seed)], check=True)


@pytest.mark.slow
def test_skips_finished_runs_reports_a_failure_and_goes_on(tmp_path):
    study = _study(tmp_path, ["a", "b", "fail"], [0, 1])
    runs = tmp_path / "runs" / "s"
    for arm, seed in (("a", 0), ("a", 1), ("b", 0), ("fail", 1)):
        _finished_run(runs / arm / f"seed{seed}", seed)
    done = subprocess.run(
        [*_command(study, tmp_path), "--show-every", "1000"], cwd=ROOT, env=_env(), capture_output=True, text=True
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "skipping 4 finished run(s): a/seed0, b/seed0, a/seed1, fail/seed1" in out
    assert "FAILED: fail/seed0 (exit 3)" in out and "fake trainer: boom (exit 3)" in out
    assert "done: b/seed1" in out and "1 finished, 4 skipped (finished before), 1 failed, 0 stopped" in out
    argv = json.loads((runs / "b" / "seed1" / "argv.json").read_text())
    assert argv[argv.index("--seed") + 1] == "1" and argv[argv.index("--resume") + 1] == "true"
    assert argv[argv.index("--output_dir") + 1] == str(runs / "b" / "seed1")
    # the report: a at seeds 0, 1 = 0.1, 0.2 (the stand-in's accuracy 0.1 (k + 1)); b = 0.1 at seed 0 (written as
    # a finished run before) and 0.3 at seed 1 (0.2 + 0.05 x 2, its own run)
    summary = json.loads((runs / "report" / "report.json").read_text())
    metric = "eval_rewards/*/answer_reward"
    assert summary["arms"]["a"]["metrics"][metric]["mean"] == pytest.approx(0.15)
    assert summary["arms"]["b"]["metrics"][metric]["per_seed"] == {"0": pytest.approx(0.1), "1": pytest.approx(0.3)}
    assert summary["arms"]["b"]["vs_reference"][metric]["mean"] == pytest.approx(0.05)  # (0 + 0.1) / 2
    assert summary["arms"]["fail"]["seeds_finished"] == [1]
    for name in ("report.md", "curves.png", "lengths.png"):
        assert (runs / "report" / name).is_file()


@pytest.mark.slow
def test_sigterm_stops_every_run_and_leaves_no_process(tmp_path):
    study = _study(tmp_path, ["sleep"], [0, 1])
    runs = tmp_path / "runs" / "s" / "sleep"
    proc = subprocess.Popen(
        [*_command(study, tmp_path), "--grace", "10"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not all((runs / f"seed{k}" / "pids").is_file() for k in (0, 1)):
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        family = psutil.Process(proc.pid).children(recursive=True)
        pids = {p.pid for p in family}
        for k in (0, 1):  # the stand-in trainer and its child, two levels under each launch
            pids |= {int(p) for p in (runs / f"seed{k}" / "pids").read_text().split()}
        assert len(family) >= 6  # per run: the launch, the stand-in, its child (taskset execs in place)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    assert "SIGTERM: stopping 2 running run(s)" in out and "2 stopped" in out
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
