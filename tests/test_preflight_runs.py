"""output_dir and resume (trl_ext.preflight.rundir), and the real thing: a recipe run with `report_to: wandb`, no
wandb login and stdin at /dev/null goes on offline with one warning; rerunning it refuses a silent resume, refuses
another config, and resumes when asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_ext.preflight.rundir import make_record, plan_output_dir, write_record

REPO = Path(__file__).resolve().parents[1]


def _record(lr: float = 1e-5, **extra) -> dict:
    config = {"learning_rate": lr, "max_completion_length": 256, "output_dir": "x", "per_device_train_batch_size": 2}
    return make_record("recipes/countdown/lr.yaml", [], ["learning_rate", "output_dir"], {**config, **extra})


def test_missing_or_empty_output_dir_is_a_fresh_run(tmp_path):
    assert plan_output_dir(tmp_path / "new", _record(), resume=False)[0].action == "fresh"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "vllm_server_8000.log").write_text("")  # written by trl-ext launch just before the trainer
    assert plan_output_dir(tmp_path / "run", _record(), resume=False)[0].action == "fresh"


def test_same_config_needs_resume_and_continues_the_latest_checkpoint(tmp_path):
    """Bug caught: the silent resume (any non-empty folder continued), and a lexicographic 'latest' (3 > 10)."""
    write_record(tmp_path, _record())
    for step in (3, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    plan, problems = plan_output_dir(tmp_path, _record(), resume=False)
    assert plan is None and problems[0].field == "output_dir"
    assert (
        "a run of this same config" in problems[0].message and "last checkpoint checkpoint-10" in problems[0].message
    )
    assert problems[0].fix.startswith("--resume true")
    plan, problems = plan_output_dir(tmp_path, _record(), resume=True)
    assert not problems and plan.checkpoint == tmp_path / "checkpoint-10"
    # fields that only route or split the run may change on resume (a different number of GPUs changes the GA)
    assert not plan_output_dir(tmp_path, _record(per_device_train_batch_size=4, output_dir="y"), resume=True)[1]


def test_another_config_is_refused_naming_both_even_with_resume(tmp_path):
    """Bug caught: `--config lr_3e-5.yaml --learning_rate 1e-4` continued the old run."""
    write_record(tmp_path, _record(3e-5))
    (tmp_path / "checkpoint-5").mkdir()
    new = make_record(
        "recipes/countdown/lr.yaml", ["--learning_rate", "1e-4"], ["learning_rate"], {"learning_rate": 1e-4}
    )
    for resume in (False, True):
        plan, [problem] = plan_output_dir(tmp_path, new, resume=resume)
        assert plan is None
        assert (
            "holds a run of recipes/countdown/lr.yaml, and this is recipes/countdown/lr.yaml with " in problem.message
        )
        assert (
            "`--learning_rate 1e-4`" in problem.message and "learning_rate: 3e-05 there, 0.0001 now" in problem.message
        )


def test_files_without_a_record_need_resume(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    assert "no trl_ext run record" in plan_output_dir(tmp_path, _record(), resume=False)[1][0].message
    plan, problems = plan_output_dir(tmp_path, _record(), resume=True)
    assert not problems and plan.checkpoint == tmp_path / "checkpoint-2" and "cannot be compared" in plan.note


def _run(cwd: Path, config: Path, home: Path, *extra: str, launcher: bool = True) -> subprocess.CompletedProcess:
    """The recipe as a user's scheduler starts it: no wandb login (fresh HOME, no key), no TTY (stdin /dev/null).
    `launcher=False` runs the entry point without `accelerate launch` (one interpreter start instead of two), for
    the resumed run (the first one went through the launcher)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    cmd = [sys.executable]
    if launcher:
        cmd = [str(Path(sys.executable).with_name("accelerate")), "launch", "--config_file"]
        cmd.append(str(REPO / "accelerate_configs" / "cpu.yaml"))
    cmd += [str(REPO / "recipes" / "countdown.py"), "--config", str(config), *extra]
    return subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)


def _refused(monkeypatch, cwd: Path, config: Path, home: Path, *extra: str) -> str:
    """The recipe's entry point (what recipes/countdown.py runs with `--config`) in this process, in the environment
    of `_run`, for a run the preflight refuses before anything loads: the error it raises (a process would exit
    non-zero printing it). In this process it costs none of the 10 CPU s a new interpreter spends on imports."""
    from trl_ext.preflight import PreflightError
    from trl_ext.recipes import run_grpo_recipe

    for name in {"WANDB_MODE", *(k for k in os.environ if k.startswith("WANDB_"))}:
        monkeypatch.setenv(name, "")  # recorded: what the preflight sets (WANDB_MODE=offline) is undone afterwards
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    with pytest.raises(PreflightError) as refused:
        run_grpo_recipe("countdown", ["--config", str(config), *extra])
    return str(refused.value)


@pytest.mark.slow
def test_wandb_without_login_then_explicit_resume(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from trl_ext.tasks import make_countdown_problems
    from trl_ext.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "model", seed=0)
    data = tmp_path / "countdown.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in make_countdown_problems(12, seed=0)))
    run = tmp_path / "run"
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "\n".join(
            [
                f"base: {REPO / 'recipes' / 'countdown' / 'qwen3_1.7b_drgrpo_l256.yaml'}",
                f"model_name_or_path: {model}",
                "dtype: float32",
                f"dataset_source: {data}",
                "dataset_split: train[:8]",
                "eval_split: none",
                "prompt: compact",
                "chat_template: false",
                "chat_template_kwargs: null",
                "n_grpo_steps: 1",
                "rollout_batch_size: 8",
                "group_size: 4",
                "train_batch_size: 8",
                "per_device_train_batch_size: 4",
                "max_completion_length: 8",
                "use_vllm: false",
                "bf16: false",
                "use_cpu: true",
                "gradient_checkpointing: false",
                "report_to: wandb",
                "save_strategy: steps",
                "save_steps: 1",
                f"output_dir: {run}",
            ]
        )
        + "\n"
    )
    first = _run(tmp_path, config, tmp_path / "home")
    assert first.returncode == 0, first.stderr[-4000:]
    warnings = [line for line in first.stderr.splitlines() if "wandb: no login found" in line]
    assert len(warnings) == 1, first.stderr[-4000:]  # one clear warning, no prompt, no crash
    assert list((tmp_path / "wandb").glob("offline-run-*")), "wandb logged offline"
    record = json.loads((run / "trl_ext_run.json").read_text())
    assert record["config"]["max_completion_length"] == 8 and record["recipe"] == str(config)

    again = _refused(monkeypatch, tmp_path, config, tmp_path / "home")
    assert "is not empty" in again and "--resume true to continue it" in again
    assert "checkpoint-1" in again

    other = _refused(monkeypatch, tmp_path, config, tmp_path / "home", "--learning_rate", "1e-4", "--resume", "true")
    assert "learning_rate: 1e-05 there, 0.0001 now" in other

    resumed = _run(tmp_path, config, tmp_path / "home", "--resume", "true", launcher=False)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"output:  {run} (resume from {run / 'checkpoint-1'})" in resumed.stderr
    # the trainer got the checkpoint: its state starts from checkpoint-1's step, not from 0
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] >= 1
