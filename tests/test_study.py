"""`trl_ext.study`: the study file, placement and ports, every shipped study planned by the launcher (nothing
starts), the sbatch scripts, the report's statistics against hand-computed numbers, a run's progress from its log."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from conftest import shared_path

from trl_ext.study.placement import ports, waves
from trl_ext.study.planning import RunPlan, plan_study
from trl_ext.study.progress import is_finished, read_progress
from trl_ext.study.report import mean_ci, paired, write_report
from trl_ext.study.slurm import render_script
from trl_ext.study.spec import Arm, Run, StudyError, load_study

ROOT = Path(__file__).resolve().parents[1]
STUDIES = sorted((ROOT / "recipes" / "studies").glob("*.yaml"))
T_975_1 = 12.706204736  # Student t, 97.5% quantile, 1 degree of freedom (tables)
T_975_2 = 4.302652730  # ... 2 degrees of freedom


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # study paths are relative to the folder the command runs in


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


BASE = """
name: s
accelerate_config: accelerate_configs/cpu.yaml
seeds: [0, 1]
arms:
  a: {recipe: recipes/countdown/cpu_tiny.yaml}
  b: {recipe: recipes/countdown/cpu_tiny.yaml, args: --learning_rate 3e-5}
"""


def test_study_file_runs_and_their_arguments(tmp_path):
    study = load_study(_write(tmp_path, BASE), root=tmp_path / "runs")
    assert study.reference == "a" and study.metrics == ("eval_rewards/*/answer_reward",)
    assert study.arm("b").script == Path("recipes/countdown.py")  # beside the YAML folder
    assert [r.name for r in study.runs()] == ["a/seed0", "b/seed0", "a/seed1", "b/seed1"]
    run = study.runs()[3]
    assert run.output_dir == tmp_path / "runs" / "s" / "b" / "seed1"
    assert run.recipe_args() == [
        "--config", "recipes/countdown/cpu_tiny.yaml", "--learning_rate", "3e-5",
        "--output_dir", str(run.output_dir), "--seed", "1", "--resume", "true",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("seeds: [0, 1]", "seeds: [0, 0]"), "repeat a seed"),
        (("seeds: [0, 1]", "seeds: []"), "seeds must be a non-empty list"),
        (("name: s", "name: s\nreference: c"), "reference 'c' is not an arm"),
        (("name: s", "name: s\nmetric: x"), "unknown field(s) metric"),
        (("cpu_tiny.yaml}\n  b", "nope.yaml}\n  b"), "arms.a.recipe: recipes/countdown/nope.yaml not found"),
        (("--learning_rate 3e-5", "--seed 3"), "arms.b.args: --seed is set by the study"),
        (("{recipe: recipes/countdown/cpu_tiny.yaml}", "{recipe: recipes/countdown/cpu_tiny.yaml, gpus: 2}"),
         "arms.a: unknown field(s) gpus"),
        (("accelerate_config: accelerate_configs/cpu.yaml\n", ""), "arms.a: no accelerate_config"),
    ],
)  # fmt: skip
def test_a_bad_study_file_names_its_field(tmp_path, change, message):
    with pytest.raises(StudyError, match=None) as err:
        load_study(_write(tmp_path, BASE.replace(*change)))
    assert message in str(err.value) and "study.yaml" in str(err.value)


def test_waves_pack_runs_first_fit_and_ports_never_meet():
    gpus = [str(i) for i in range(8)]
    # 2 + 2 + 2 on 8 GPUs, then a 4 that does not fit the 2 left: it waits for the next wave
    assert waves(gpus, [2, 2, 2, 4, 2]) == [
        (0, ["0", "1"]), (0, ["2", "3"]), (0, ["4", "5"]), (1, ["0", "1", "2", "3"]), (1, ["4", "5"]),
    ]  # fmt: skip
    assert waves([0, 1], [1, 1, 1]) == [(0, [0]), (0, [1]), (1, [0])]
    with pytest.raises(ValueError, match="needs 3"):
        waves([0, 1], [3])
    used = [p for i in range(40) for p in ports(i).values()]
    assert len(used) == len(set(used))  # 40 runs: no port twice, and none in another run's range
    assert ports(3) == {"vllm_server_port": 8030, "vllm_group_port": 51246, "main_process_port": 29530}


@pytest.fixture
def launch_folder(tmp_path, monkeypatch):
    """A folder to launch from: the repository's recipes and configs, and NYU Assignment 3's course files in
    data/countdown/ (the shipped subset in their place)."""
    for name in ("recipes", "accelerate_configs", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "data" / "countdown").mkdir(parents=True)
    shutil.copy(shared_path("countdown", "train_10k_head16.parquet"), tmp_path / "data/countdown/train_10k.parquet")
    shutil.copy(shared_path("countdown", "dev.parquet"), tmp_path / "data/countdown/dev.parquet")
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_shipped_study_parses_and_every_arm_plans(path, launch_folder):
    """Each arm's first seed through the launcher's plan and preflight, on an 8-GPU node for the GPU studies."""
    study = load_study(path)
    cpu = "cpu" in path.stem
    if any(a.recipe.name.startswith("cpu_demo") for a in study.arms):  # a stand-in for the demo's SFT warm start
        from trl_ext.tiny import ensure_tiny_model

        ensure_tiny_model("runs/demo_models/countdown_sft")
    first = [r for r in study.runs() if r.seed == study.seeds[0]]
    plans, where = plan_study(study, gpus=None if cpu else 8, runs=first, check_packages=False)
    assert [p.run.arm.name for p in plans] == [a.name for a in study.arms]
    if cpu:
        assert where.startswith("no GPU") and all(p.need == 1 and not p.gpu for p in plans)
    else:
        assert where == "8 GPU(s) from --num-gpus"
        sft = path.stem.startswith("math_sft")
        # the server on one GPU and training on the next (SFT: one GPU, vLLM colocated)
        assert {p.need for p in plans} == ({1} if sft else {2})
        assert all(p.serves != sft for p in plans)
        assert all(len(set(p.units)) == p.need for p in plans)


def test_gsm8k_ablations_on_an_8_gpu_node_in_waves_of_four(capsys):
    study = load_study(ROOT / "recipes/studies/gsm8k_qwen3_0.6b_ablations.yaml")
    plans, _ = plan_study(study, gpus=8, check_packages=False)
    assert len(plans) == 18 and [p.wave for p in plans] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 2
    assert [p.units for p in plans[:4]] == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert plans[5].port_args() == ["--vllm_server_port", "8050", "--vllm_group_port", "51266"]
    assert plans[5].env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}


def test_a_run_the_launcher_refuses_stops_the_study_before_any_start(tmp_path):
    study = load_study(_write(tmp_path, BASE.replace("--learning_rate 3e-5", "--no_such_field 1")), tmp_path)
    with pytest.raises(StudyError, match=r"run b/seed0 \(recipes/countdown/cpu_tiny.yaml\): .*no_such_field"):
        plan_study(study, check_packages=False)
    assert not (tmp_path / "s").exists()


def _plan(study, arm, seeds, **kw):
    return [RunPlan(Run(arm, s, study.folder / arm.name / f"seed{s}"), i, **kw) for i, s in enumerate(seeds)]


def test_sbatch_script_one_array_per_arm_and_srun_across_nodes(tmp_path):
    study = load_study(_write(tmp_path, BASE + "slurm: {partition: gpu, time: '04:00:00'}\n"), tmp_path)
    arm = study.arm("b")
    script = render_script(study, _plan(study, arm, [0, 1], need=2, gpu=True, serves=True, multi_process=False))
    assert "#SBATCH --array=0-1\n" in script and "#SBATCH --gpus-per-node=2\n" in script
    assert "#SBATCH --partition=gpu\n" in script and "#SBATCH --time=04:00:00\n" in script
    assert "SEEDS=(0 1)\nSEED=${SEEDS[$SLURM_ARRAY_TASK_ID]}" in script
    assert (
        "launch --accelerate-config accelerate_configs/cpu.yaml recipes/countdown.py --config "
        'recipes/countdown/cpu_tiny.yaml --learning_rate 3e-5 --output_dir "$RUN_DIR" --seed "$SEED" --resume true '
        '--vllm_server_port "$PORT" --vllm_group_port $((PORT + 1))\n'
    ) in script
    multi = Arm("m", arm.recipe, arm.script, arm.accelerate_config)
    plans = _plan(study, multi, [0], need=8, gpu=True, serves=True, multi_process=True, num_machines=2)
    script = render_script(study, plans)
    assert "#SBATCH --nodes=2\n" in script and "srun --nodes=2 --ntasks-per-node=1 bash -c" in script
    assert '--machine-rank "$SLURM_NODEID"' in script and 'echo "main_process_ip: $MASTER"' in script


def test_mean_ci_and_paired_comparison_against_hand_computed_numbers():
    out = mean_ci([1.0, 2.0, 3.0])  # mean 2, sd 1, sem 1/sqrt(3)
    half = T_975_2 / math.sqrt(3)
    assert out["mean"] == pytest.approx(2.0) and out["n"] == 3
    assert (out["low"], out["high"]) == pytest.approx((2 - half, 2 + half), rel=1e-6)
    assert mean_ci([0.5])["low"] is None
    # seeds 0..2 of an arm minus the reference: differences 0.1, 0.2, 0.6 -> mean 0.3, sd sqrt(0.07)
    cmp = paired({0: 0.6, 1: 0.7, 2: 1.2, 3: 9.0}, {0: 0.5, 1: 0.5, 2: 0.6})
    assert cmp["seeds"] == [0, 1, 2] and cmp["mean"] == pytest.approx(0.3)
    half = T_975_2 * math.sqrt(0.07) / math.sqrt(3)
    assert (cmp["low"], cmp["high"]) == pytest.approx((0.3 - half, 0.3 + half), rel=1e-6)
    t = 0.3 / (math.sqrt(0.07) / math.sqrt(3))  # paired t statistic, 2 degrees of freedom
    assert t == pytest.approx(1.9640, abs=1e-3)
    # two-sided p for t = 1.964 with 2 df: 1 - |t| / sqrt(2 + t^2) (the closed form for 2 df)
    assert cmp["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-6)


def _fake_run(folder: Path, history: list[dict], rollouts: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": history}))
    (folder / "trl_ext_run.json").write_text(json.dumps({"config": {"final_eval": True}}))
    (folder / "train_results.json").write_text("{}")
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts))


def test_report_reads_the_run_folders(tmp_path):
    study = load_study(_write(tmp_path, BASE), tmp_path)
    key = "eval_rewards/countdown_reward/answer_reward"
    values = {("a", 0): 0.2, ("a", 1): 0.4, ("b", 0): 0.3, ("b", 1): 0.6}
    for (arm, seed), value in values.items():
        folder = study.folder / arm / f"seed{seed}"
        history = [
            {"step": 1, "reward": 0.1, "entropy": 2.0, "step_time": 1.0},
            {"step": 2, key: value / 2, "eval_runtime": 1.0},
            {"step": 2, "reward": 0.2, "entropy": 1.5 + seed, "step_time": 1.0},
            {"step": 2, key: value, "eval_runtime": 1.0},
        ]
        rollouts = [
            {"step": 1, "completion": "x" * 4, "reward": 1.0},
            {"step": 1, "completion": "x" * 10, "reward": 0.1},
            {"step": 2, "completion": [{"role": "assistant", "content": "x" * 8}], "reward": 1.0},
        ]
        _fake_run(folder, history, rollouts)
        (folder / "eval_results.json").write_text("{}")
    (study.folder / "b" / "seed1" / "eval_results.json").unlink()  # its final validation never ran: not finished
    summary = write_report(study)
    for name in ("report.md", "report.json", "curves.png", "lengths.png"):
        assert (study.report_dir / name).stat().st_size > 0
    a, b = summary["arms"]["a"], summary["arms"]["b"]
    assert a["seeds_finished"] == [0, 1] and b["seeds_finished"] == [0]
    half = T_975_1 * 0.1 / math.sqrt(2) * math.sqrt(2)  # sd of (0.2, 0.4) = 0.1 sqrt(2); sem = 0.1
    assert a["metrics"]["eval_rewards/*/answer_reward"]["mean"] == pytest.approx(0.3)
    assert a["metrics"]["eval_rewards/*/answer_reward"]["high"] == pytest.approx(0.3 + half)
    vs = b["vs_reference"]["eval_rewards/*/answer_reward"]
    assert vs["seeds"] == [0] and vs["mean"] == pytest.approx(0.1) and vs["low"] is None
    assert a["mean_length_chars"] == {"correct": pytest.approx(6.0), "incorrect": pytest.approx(10.0)}
    assert a["final_entropy"]["mean"] == pytest.approx(2.0)  # 1.5 and 2.5
    assert json.loads((study.report_dir / "report.json").read_text())["arms"]["a"]["seeds_finished"] == [0, 1]
    assert "| b | 1 | 0.3 | - | 0.1, -, p - (1 pairs) |" in (study.report_dir / "report.md").read_text()


def test_report_without_example_rollouts_draws_no_empty_length_figure(tmp_path):
    """Runs that log no example rollouts (`rollout_log_steps: 0`) leave the length figure out, in the report folder,
    its Markdown and the shipped copies, rather than drawing empty axes; a figure from an earlier report goes."""
    study = load_study(_write(tmp_path, BASE), tmp_path)
    key = "eval_rewards/countdown_reward/answer_reward"
    for arm in ("a", "b"):
        for seed in (0, 1):
            folder = study.folder / arm / f"seed{seed}"
            _fake_run(folder, [{"step": 2, "reward": 0.2, "entropy": 1.0}, {"step": 2, key: 0.5}], [])
            (folder / "eval_results.json").write_text("{}")
    study.report_dir.mkdir(parents=True)
    (study.report_dir / "lengths.png").write_bytes(b"stale")
    out = tmp_path / "shipped" / "ablations"
    summary = write_report(study, out=out)
    assert summary["arms"]["a"]["mean_length_chars"] == {"correct": None, "incorrect": None}
    assert not (study.report_dir / "lengths.png").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["ablations.json", "ablations.md", "ablations.png"]
    for md in (study.report_dir / "report.md", out.with_suffix(".md")):
        assert "![curves]" in md.read_text() and "lengths" not in md.read_text().split("![curves]")[1]


def test_progress_from_the_log_and_finished_from_the_folder(tmp_path):
    log = tmp_path / "seed0.log"
    log.write_text(
        "  steps:   8 GRPO steps -> max_steps 8\n"
        "Map: 100%|####| 46/46 [00:00<00:00, 1234.56 examples/s]\n"  # labelled bars are not training
        " 25%|##  | 2/8 [00:02<00:07,  1.2s/it] {'loss': '0', 'reward': '0.25', 'entropy': '4.6'}\n"
        "100%|####| 12/12 [00:00<00:00, 20.1it/s]\n"  # an evaluation's own bar, a larger total
        " 50%|####| 4/8 [00:04<00:04,  1.2s/it] {'loss': '0', 'reward': '0.5', 'entropy': '4.6'}\n"
    )
    import time

    progress = read_progress(tmp_path, log, started=time.time() - 40)
    assert (progress.step, progress.max_steps, progress.reward) == (4, 8, 0.5)
    assert progress.eta_s == pytest.approx(40, abs=2)  # 40 s for 4 steps, 4 to go
    assert not is_finished(tmp_path)
    (tmp_path / "train_results.json").write_text("{}")
    assert is_finished(tmp_path)  # no record: nothing says it validates at the end


def test_progress_without_a_log_comes_from_the_furthest_checkpoint(tmp_path):
    """A resumed run's log may not show a step yet: the checkpoint with the most steps says where it is."""
    for step, mtime in ((4, 2_000_000), (2, 3_000_000)):  # the older checkpoint written last
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 8}))
        os.utime(folder / "trainer_state.json", (mtime, mtime))
    progress = read_progress(tmp_path, None)
    assert (progress.step, progress.max_steps) == (4, 8)
    assert read_progress(tmp_path / "absent", None).step is None
