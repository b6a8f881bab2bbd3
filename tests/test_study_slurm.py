"""`trl-ext study run --slurm` against a real one-node Slurm (tests/slurm_cluster.py: munged, slurmctld, slurmd
started here, no cgroups, no accounting): a two-run CPU study (one arm, two seeds: one sbatch array of two tasks,
each a real `trl-ext launch` of the tiny model on one core, its trainer `accelerate launch` with vLLM hidden) runs
to COMPLETED and its report holds the numbers of the run folders; `status` reads the queue; `cancel` cancels. Skips,
saying why, where Slurm is not installed or this is not root (.ci/run installs it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, skip_reason

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _study(folder: Path, name: str, steps: int) -> Path:
    recipe = folder / f"{name}.yaml"
    recipe.write_text(
        f"base: {ROOT / 'recipes/countdown/cpu_tiny.yaml'}\n"
        f"model_name_or_path: {folder / 'tiny'}\n"
        f"n_grpo_steps: {steps}\neval_steps: {steps}\neval_limit: 4\nrollout_log_steps: 1\nsave_strategy: 'no'\n"
    )
    study = folder / f"{name}_study.yaml"
    study.write_text(
        f"name: {name}\nscript: recipes/countdown.py\naccelerate_config: accelerate_configs/cpu.yaml\n"
        f"seeds: [0, 1]\nmetrics: [eval_entropy, 'eval_rewards/*/answer_reward']\n"
        f"arms:\n  tiny: {{recipe: {recipe}}}\n"
    )
    return study


# The launcher's trainer command as it builds it for a one-process CPU config (`accelerate launch --config_file
# FILE RECIPE --config YAML`), with the recipe started through tests/scripts/without_vllm.py: the tiny recipe
# generates with transformers, and vLLM's imports would be 6-9 CPU s of each array task's trainer.
TRAIN_CMD = (
    f"{Path(sys.executable).with_name('accelerate')} launch --config_file {{accelerate_config}} "
    f"{ROOT / 'tests' / 'scripts' / 'without_vllm.py'} {{recipe}} --config {{config}}"
)


def _cli(slurm, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    """`trl-ext study ...`; sbatch passes this environment (`TRL_EXT_TRAIN_CMD` included) on to the array tasks."""
    env = {**slurm.env, "PYTHONPATH": str(ROOT), "TRL_EXT_TRAIN_CMD": TRAIN_CMD}
    command = [sys.executable, "-m", "trl_ext.cli", "study", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_cpu_study_through_sbatch_and_its_report(slurm, tmp_path):
    study = _study(tmp_path, "slurmtiny", steps=2)
    root = tmp_path / "runs"
    done = _cli(slurm, "run", str(study), "--slurm", "--wait", "--poll", "1", "--root", str(root))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out + slurm.logs()
    assert "submitted tiny (seeds 0, 1): job" in out
    script = (root / "slurmtiny" / "slurm" / "tiny.sbatch").read_text()
    assert "#SBATCH --array=0-1\n" in script and "#SBATCH --cpus-per-task=1\n" in script
    entropies = []
    for seed in (0, 1):
        folder = root / "slurmtiny" / "tiny" / f"seed{seed}"
        record = json.loads((folder / "trl_ext_run.json").read_text())
        assert record["config"]["seed"] == seed
        history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
        entropies.append([e["eval_entropy"] for e in history if "eval_entropy" in e][-1])
        assert list(folder.parent.glob(f"slurm-*_{seed}.log"))  # each array task's own Slurm log
    summary = json.loads((root / "slurmtiny" / "report" / "report.json").read_text())
    entry = summary["arms"]["tiny"]
    assert entry["seeds_finished"] == [0, 1]
    assert entry["metrics"]["eval_entropy"]["per_seed"] == {"0": entropies[0], "1": entropies[1]}
    assert entry["metrics"]["eval_entropy"]["mean"] == pytest.approx(sum(entropies) / 2)
    for name in ("report.md", "curves.png", "lengths.png"):
        assert (root / "slurmtiny" / "report" / name).stat().st_size > 0
    status = _cli(slurm, "status", str(study), "--root", str(root)).stdout
    assert "2 done" in status and status.count("COMPLETED") == 2, status


@pytest.mark.slow
def test_cancel_cancels_the_submitted_jobs(slurm, tmp_path, monkeypatch):
    """Submitted in this process (`slurm.submit` of hand-made plans: no launcher plan needed to cancel)."""
    from trl_ext.study.planning import RunPlan
    from trl_ext.study.slurm import submit
    from trl_ext.study.spec import load_study

    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.chdir(ROOT)
    study = load_study(_study(tmp_path, "slurmcancel", steps=50), tmp_path / "runs")
    runs = study.runs()
    plans = [RunPlan(r, i, need=1, gpu=False, serves=False, multi_process=False) for i, r in enumerate(runs)]
    job = submit(study, plans, echo=lambda _: None)["tiny"]["job_id"]
    cancel = _cli(slurm, "cancel", str(study.path), "--root", str(tmp_path / "runs"))
    assert f"scancel {job}" in cancel.stdout, cancel.stdout + cancel.stderr
    deadline, states = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        states = subprocess.run(
            ["scontrol", "-o", "show", "job", job], env=slurm.env, capture_output=True, text=True
        ).stdout
        lines = states.splitlines()
        if lines and all("JobState=CANCELLED" in line for line in lines):
            break
        time.sleep(0.5)
    # a pending array is one record (ArrayTaskId=0-1), a started one a record per task: every one CANCELLED
    lines = states.splitlines()
    assert lines and all("JobState=CANCELLED" in line for line in lines), states
