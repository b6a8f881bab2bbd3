"""`trl_ext.study`: the study file, placement and ports, every shipped study planned by the launcher (nothing
starts), the sbatch scripts, the report's statistics against hand-computed numbers, a run's progress from its log."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import shared_path

from trl_ext.run_status import RunStatus, write_status
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
    # the study's args go to every arm, before the arm's own (a later flag wins in the recipe CLI)
    study = load_study(_write(tmp_path, BASE + "args: --n_grpo_steps 7 --learning_rate 1e-4\n"), root=tmp_path)
    assert study.arm("a").args == ("--n_grpo_steps", "7", "--learning_rate", "1e-4")
    assert study.arm("b").args == ("--n_grpo_steps", "7", "--learning_rate", "1e-4", "--learning_rate", "3e-5")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("seeds: [0, 1]", "seeds: [0, 0]"), "repeat a seed"),
        (("seeds: [0, 1]", "seeds: []"), "seeds must be a non-empty list"),
        (("name: s", "name: s\nreference: c"), "reference 'c' is not an arm"),
        (("name: s", "name: s\nmetric: x"), "unknown field(s) metric"),
        (("cpu_tiny.yaml}\n  b", "nope.yaml}\n  b"), "arms.a.recipe: recipes/countdown/nope.yaml not found"),
        (("--learning_rate 3e-5", "--seed 3"), "arms.b.args: --seed is set by the study"),
        (("name: s", "name: s\nargs: --output_dir x"), "study.yaml: args: --output_dir is set by the study"),
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


CPU_STUDIES = [p for p in STUDIES if "cpu" in p.stem]
GPU_STUDIES = [p for p in STUDIES if "cpu" not in p.stem]


@pytest.mark.parametrize("path", CPU_STUDIES, ids=[p.stem for p in CPU_STUDIES])
def test_every_shipped_cpu_study_plans_on_this_machine(path, launch_folder):
    """Each arm's first seed through the launcher's plan and preflight on this machine's cores."""
    study = load_study(path)
    first = [r for r in study.runs() if r.seed == study.seeds[0]]
    plans, where = plan_study(study, runs=first, check_packages=False)
    assert [p.run.arm.name for p in plans] == [a.name for a in study.arms]
    assert where.startswith("no GPU") and all(p.need == 1 and not p.gpu for p in plans)


@pytest.mark.parametrize("path", GPU_STUDIES, ids=[p.stem for p in GPU_STUDIES])
def test_every_shipped_gpu_study_prints_its_job_scripts_on_a_machine_without_gpus(path, launch_folder, monkeypatch):
    """The documented `trl-ext study run <study> --slurm --dry-run` on a machine without GPUs (a cluster's login
    node; `CUDA_VISIBLE_DEVICES=""` makes any machine one): every run of every arm planned by the launcher for its
    task, the resources stated with where they come from (no study ships a `slurm:` section: the runs' plans), one
    array script per arm asking for the run's need (the server on one GPU and training on the next; SFT: one GPU,
    vLLM colocated), requeue and the warning. Before, the plan counted this machine's GPUs and stopped: "`gpu_ids` 1
    names GPU(s) ['1'] that are not available"."""
    from typer.testing import CliRunner

    from trl_ext.cli import app

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    study = load_study(path)
    done = CliRunner().invoke(app, ["study", "run", str(path), "--slurm", "--dry-run"])
    assert done.exit_code == 0, done.output
    need = 1 if path.stem.startswith("math_sft") else 2
    assert f"# Slurm resources of {path}" in done.output
    for arm in study.arms:
        assert f"#   {arm.name}: 1 node(s), {need} GPU(s) per node (the run's plan), 8 CPU(s) (default)" in done.output
    scripts = done.output.split("# ---- ")[1:]
    assert len(scripts) == len(study.arms)
    for script in scripts:
        assert f"#SBATCH --array=0-{len(study.seeds) - 1}\n" in script and f"--gpus-per-node={need}\n" in script
        assert "#SBATCH --requeue\n#SBATCH --signal=B:USR1@600\n" in script
    assert not Path("runs").exists()  # a dry run writes nothing


# One study per GPU accelerate config the shipped studies use (the others differ from these in recipes only, which
# the Slurm dry run above plans on the same 8-GPU node).
PLAIN_DRY_RUNS = ["gsm8k_qwen3_0.6b_ablations", "math_sft_sizes"]


@pytest.mark.parametrize("name", PLAIN_DRY_RUNS)
def test_a_dry_run_on_a_machine_without_gpus_shows_the_placement_on_an_8_gpu_node(name, launch_folder, monkeypatch):
    """The study files' other documented dry run, `trl-ext study run <study> --dry-run`, on a machine without GPUs:
    every run placed on a node of 8 GPUs (the study states no `slurm.gpus_per_node`), saying so first, exit 0."""
    from typer.testing import CliRunner

    from trl_ext.cli import app

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = ROOT / "recipes" / "studies" / f"{name}.yaml"
    study = load_study(path)
    plain = CliRunner().invoke(app, ["study", "run", str(path), "--dry-run"])
    assert plain.exit_code == 0, plain.output
    assert plain.output.startswith("no GPU on this machine: the placement on a node of 8 GPUs (--gpus N for another)")
    assert f"study {study.name}: {len(study.runs())} run(s) on 8 GPU(s)" in plain.output
    assert not Path("runs").exists()


def test_a_gpu_study_on_a_machine_without_gpus_is_refused_before_any_plan():
    """Run for real (not a dry run) where there is no GPU: the first GPU run named with its accelerate config and
    what to do instead, before the launcher plans anything."""
    study = load_study(ROOT / "recipes/studies/gsm8k_qwen3_0.6b_ablations.yaml")
    with pytest.raises(StudyError) as refused:
        plan_study(study, environ={"CUDA_VISIBLE_DEVICES": ""})
    cores = len(os.sched_getaffinity(0))
    assert str(refused.value) == (
        "run r1_zero/seed0: accelerate config accelerate_configs/vllm_server_gpu0_train_gpu1.yaml trains on GPUs and "
        f"this machine has none (no GPU: {cores} core(s), 1 per run): `--dry-run --gpus N` shows the placement on a "
        "node of N GPUs, `--slurm` submits the study to a cluster (`--slurm --dry-run` prints its job scripts)"
    )


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


def test_sbatch_script_one_array_per_arm_requeue_and_two_sruns_across_nodes(tmp_path):
    study = load_study(
        _write(tmp_path, BASE + "slurm: {partition: gpu, time: '04:00:00', warning_s: 300}\n"), tmp_path
    )
    arm = study.arm("b")
    script = render_script(study, _plan(study, arm, [0, 1], need=2, gpu=True, serves=True, multi_process=False))
    assert "#SBATCH --array=0-1\n" in script and "#SBATCH --gpus-per-node=2\n" in script
    assert "#SBATCH --partition=gpu\n" in script and "#SBATCH --time=04:00:00\n" in script
    assert "#SBATCH --requeue\n#SBATCH --signal=B:USR1@300\n" in script and "#SBATCH --open-mode=append\n" in script
    assert "SEEDS=(0 1)\nSEED=${SEEDS[$SLURM_ARRAY_TASK_ID]}" in script
    assert (
        "launch --accelerate-config accelerate_configs/cpu.yaml recipes/countdown.py --config "
        'recipes/countdown/cpu_tiny.yaml --learning_rate 3e-5 --output_dir "$RUN_DIR" --seed "$SEED" --resume true '
        '--vllm_server_port "$PORT" --vllm_group_port $((PORT + 1)) >> "$LOG.log" 2>&1 &\n'
    ) in script
    # the warning writes the stop request; the task requeues a run that stopped on it before its end
    assert 'trap \'STOPPING=1; mkdir -p "$RUN_DIR"; touch "$STOP"\' USR1' in script
    assert 'if [ "$STOPPING" = 1 ] && [ ! -f "$RUN_DIR/train_results.json" ]; then\n  scontrol requeue' in script
    multi = Arm("m", arm.recipe, arm.script, arm.accelerate_config)
    plans = _plan(study, multi, [0], need=8, gpu=True, serves=True, multi_process=False, num_machines=2)
    script = render_script(study, plans)
    assert "#SBATCH --nodes=2\n" in script and 'echo "main_process_ip: $MASTER"' in script
    assert '--accelerate-config "$CONFIG" --machine-rank "$1"' in script and "export -f launch\n" in script
    srun = (
        'SRUN="srun --ntasks-per-node=1 --cpus-per-task=$SLURM_CPUS_PER_TASK --gpus-per-node=8 --kill-on-bad-exit=1"'
    )
    assert srun in script
    assert "$SRUN --nodes=1 --ntasks=1 --relative=0 bash -c 'launch 0' &\n" in script
    assert "$SRUN --nodes=1 --ntasks=1 --relative=1 bash -c 'launch $((SLURM_NODEID + 1))' &\n" in script
    for text in (script, render_script(study, _plan(study, arm, [0], need=1, gpu=False, serves=False,
                                                     multi_process=True))):  # fmt: skip
        checked = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stderr  # valid bash


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
    shipped = ["ablations.json", "ablations.md", "ablations.png", "ablations_arms.png"]
    assert sorted(p.name for p in out.parent.iterdir()) == shipped
    for md in (study.report_dir / "report.md", out.with_suffix(".md")):
        assert "![curves]" in md.read_text() and "lengths" not in md.read_text().split("![curves]")[1]


CLAIMS = """
metrics: [heldout/greedy_accuracy, heldout/incorrect_length]
claims:
  - {claim: longer, metric: heldout/incorrect_length, arm: a, baseline: b, direction: greater}
  - {claim: same, metric: heldout/greedy_accuracy, arm: b, baseline: a, direction: equivalent, margin: 0.05}
  - {claim: faster, metric: heldout/greedy_accuracy, arm: a, baseline: b, direction: greater, value: mean}
"""


def test_report_judges_the_claims_from_the_logged_values(tmp_path):
    """Three seeds of two arms with hand-set validations: the claims table's differences, intervals and verdicts are
    those of the logged numbers (last validation, or the mean over the validations), and the per-arm figure ships."""
    study = load_study(_write(tmp_path, BASE.replace("[0, 1]", "[0, 1, 2]") + CLAIMS), tmp_path)
    greedy = {"a": [(0.10, 0.30), (0.20, 0.32), (0.30, 0.34)], "b": [(0.10, 0.31), (0.10, 0.33), (0.10, 0.32)]}
    incorrect = {"a": [12.0, 13.0, 14.0], "b": [10.0, 10.5, 11.5]}
    for arm in ("a", "b"):
        for seed in range(3):
            (first, last), wrong = greedy[arm][seed], incorrect[arm][seed]
            history = [
                {"step": 10, "reward": 0.2, "entropy": 0.3, "step_time": 1.0},
                {"step": 10, "heldout/greedy_accuracy": first, "heldout/incorrect_length": 9.0},
                {"step": 20, "reward": 0.3, "entropy": 0.2, "step_time": 1.0},
                {"step": 20, "heldout/greedy_accuracy": last, "heldout/incorrect_length": wrong},
            ]
            _fake_run(study.folder / arm / f"seed{seed}", history, [])
            (study.folder / arm / f"seed{seed}" / "eval_results.json").write_text("{}")
    out = tmp_path / "shipped" / "ablations"
    longer, same, faster = write_report(study, out=out)["claims"]
    # a - b incorrect length: 2.0, 2.5, 2.5 -> mean 7/3, sd 0.2887: [1.616, 3.050], above 0
    half = T_975_2 * math.sqrt(1 / 12) / math.sqrt(3)
    assert longer["per_seed"] == {0: 2.0, 1: 2.5, 2: 2.5} and longer["verdict"] == "shown"
    assert (longer["low"], longer["high"]) == pytest.approx((7 / 3 - half, 7 / 3 + half), rel=1e-6)
    # b - a last greedy: 0.01, 0.01, -0.02 -> mean 0, sd 0.01732: [-0.043, 0.043], inside +-0.05
    assert same["mean"] == pytest.approx(0.0, abs=1e-12) and same["verdict"] == "shown"
    # a - b curve means: (0.2 - 0.205), (0.26 - 0.215), (0.32 - 0.21) -> -0.005, 0.045, 0.11
    assert faster["per_seed"] == pytest.approx({0: -0.005, 1: 0.045, 2: 0.11})
    assert faster["verdict"] == "cannot tell" and faster["seeds_to_decide"] > 3
    markdown = out.with_suffix(".md").read_text()
    row = "| longer | `a` - `b`, heldout/incorrect_length (last) | > 0 | 2.333 [1.616, 3.05] (3) | **shown** | - |"
    assert row in markdown and f"**cannot tell** | {faster['seeds_to_decide']} |" in markdown
    assert "`b` - `a`, heldout/greedy_accuracy (last) | within +-0.05 |" in markdown  # the band, both signs
    assert "![per arm](ablations_arms.png)" in markdown
    assert (out.parent / "ablations_arms.png").stat().st_size > 0


def test_progress_from_the_status_file_and_finished_from_the_folder(tmp_path):
    """What the trainer wrote at its last step: step 6 of 8 in a run resumed at step 2, 40 s after it began: 10 s a
    step, 2 steps to go."""
    write_status(tmp_path, RunStatus(6, 8, reward=0.5, time=1040.0, started=1000.0, start_step=2))
    progress = read_progress(tmp_path)
    assert (progress.step, progress.max_steps, progress.reward) == (6, 8, 0.5)
    assert progress.eta_s == pytest.approx(20.0)
    assert progress.render() == "step 6/8, reward 0.5, ETA 0:00:20"
    assert not is_finished(tmp_path)
    (tmp_path / "train_results.json").write_text("{}")
    assert is_finished(tmp_path)  # no record: nothing says it validates at the end


def test_progress_without_a_status_comes_from_the_furthest_checkpoint(tmp_path):
    """A run that has not trained a step since it started (a resumed one loading its checkpoint) wrote no status
    yet: the checkpoint with the most steps says where it is."""
    for step, mtime in ((4, 2_000_000), (2, 3_000_000)):  # the older checkpoint written last
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 8}))
        os.utime(folder / "trainer_state.json", (mtime, mtime))
    progress = read_progress(tmp_path)
    assert (progress.step, progress.max_steps) == (4, 8)
    assert read_progress(tmp_path / "absent").step is None
