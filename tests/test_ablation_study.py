"""The CPU ablation study reduced (recipes/studies/cpu_ablations.yaml; docs/ablations.md): the demo recipes
(`demo_warm_start`) run for two arms, one seed, two steps, 16 held-out problems, into a study's folders; then
`trl-ext study report` on them. The numbers the report states are checked against the runs' logs and against the
saved final model scored again; the checks of a `demo_warm_start` recipe name the field they refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_trainer_helpers import freeze_imports

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = 16
ARGS = (
    "--model_name_or_path runs/warm --n_grpo_steps 2 --rollout_batch_size 16 --train_batch_size 16 "
    f"--per_device_train_batch_size 16 --eval_steps 1 --eval_limit {HELDOUT} --num_generations_eval 2 --limit 64 "
    "--logging_steps 1 --eval_on_start true --max_completion_length 12"
)
STUDY = f"""
name: e2e
accelerate_config: accelerate_configs/cpu.yaml
seeds: [0]
reference: grpo
metrics: [heldout/greedy_accuracy, heldout/sampled_accuracy, heldout/correct_length, heldout/incorrect_length,
          heldout/entropy, heldout/mean_length]
arms:
  grpo: {{recipe: recipes/countdown/cpu_demo.yaml, args: {ARGS}}}
  drgrpo: {{recipe: recipes/countdown/cpu_demo_drgrpo.yaml, args: {ARGS}}}
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A run folder with the recipes, and a stand-in warm start in runs/warm: the testbed's model and tokenizer at
    their seed-0 init (no SFT: the pipeline, not the learning, is under test)."""
    from trl_ext.testbed.config import TestbedConfig
    from trl_ext.testbed.warm_start import build_model

    freeze_imports()  # the runs' end-of-training collections then skip the imported modules
    for name in ("recipes", "accelerate_configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    tokenizer, model, _ = build_model(TestbedConfig())
    model.save_pretrained("runs/warm")
    tokenizer.save_pretrained("runs/warm")
    (tmp_path / "study.yaml").write_text(STUDY)
    return tmp_path


def test_two_arms_through_the_recipes_and_the_report(folder, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.recipes import run_grpo_recipe
    from trl_ext.study.progress import is_finished
    from trl_ext.study.report import write_report
    from trl_ext.study.spec import load_study
    from trl_ext.testbed.heldout import evaluate
    from trl_ext.testbed.warm_start import testbed_problems

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    study = load_study("study.yaml")
    for run in study.runs():
        run_grpo_recipe("countdown", run.recipe_args())
        assert is_finished(run.output_dir)
    summary = write_report(study, out="shipped/ablations")

    _, held_out = testbed_problems()
    logged = {}
    for run in study.runs():
        history = json.loads((run.output_dir / "trainer_state.json").read_text())["log_history"]
        points = [h for h in history if "heldout/greedy_accuracy" in h]
        assert [h["step"] for h in points] == [0, 1, 2]  # eval_on_start, every step, the last
        last = points[-1]
        logged[run.arm.name] = last
        # the report states the last validation's numbers, and the training loop's wall clock
        entry = summary["arms"][run.arm.name]
        for key in study.metrics:
            if key in last:
                assert entry["metrics"][key]["per_seed"] == {0: last[key]}
                assert entry["metrics"][key]["mean"] == last[key]
        runtime = next(h["train_runtime"] for h in history if "train_runtime" in h)
        assert entry["wall_clock_s"]["per_seed"] == {0: runtime}
        # mean length = the correct and the incorrect responses' lengths weighted by their counts; with the static
        # cache (cpu_demo.yaml) the responses are the sampled accuracy's 2 per problem
        assert last["heldout/sample_accuracy"] == last["heldout/sampled_accuracy"]
        responses = 2 * HELDOUT
        n_correct = round(last["heldout/sample_accuracy"] * responses)
        parts = last.get("heldout/correct_length", 0.0) * n_correct
        parts += last.get("heldout/incorrect_length", 0.0) * (responses - n_correct)
        assert last["heldout/mean_length"] * responses == pytest.approx(parts, rel=1e-9)
        assert 1 <= last["heldout/mean_length"] <= 12 and last["heldout/entropy"] > 0
        # the saved final model, loaded afresh and scored again, gives the logged last numbers
        model = AutoModelForCausalLM.from_pretrained(run.output_dir, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(run.output_dir)
        again = evaluate(model, tokenizer, held_out[:HELDOUT], 2, 12)
        assert again["greedy_accuracy"] == last["heldout/greedy_accuracy"]
        assert again["sampled_accuracy"] == last["heldout/sampled_accuracy"]
    diff = summary["arms"]["drgrpo"]["vs_reference"]["heldout/entropy"]
    assert diff["seeds"] == [0] and diff["mean"] == pytest.approx(
        logged["drgrpo"]["heldout/entropy"] - logged["grpo"]["heldout/entropy"], abs=1e-12
    )
    shipped = json.loads((folder / "shipped/ablations.json").read_text())
    assert shipped == json.loads((study.report_dir / "report.json").read_text())
    assert (folder / "shipped/ablations.png").stat().st_size > 0
    markdown = (folder / "shipped/ablations.md").read_text()
    assert "![curves](ablations.png)" in markdown and "## heldout/greedy_accuracy (last validation)" in markdown
    assert f"| grpo | 1 | {logged['grpo']['heldout/entropy']:.4g} |" in markdown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset_source", "data.parquet"], "dataset_source has no effect with demo_warm_start"),
        (["--eval_split", "test"], "eval_split has no effect with demo_warm_start"),
        (["--tiny_model", "true"], "tiny_model has no effect with demo_warm_start"),
        (["--prompt", "countdown"], "set prompt: compact"),
        (["--eval_limit", "600"], "eval_limit=600: .* give 1..512"),
        (["--eval_strategy", "epoch"], "eval_strategy='epoch'"),
        (["--per_device_eval_batch_size", "16"], "per_device_eval_batch_size has no effect"),
        (["--eval_strategy", "no", "--final_eval", "false"], "eval_limit has no effect"),
    ],
)
def test_a_demo_recipe_refuses_what_it_would_ignore(args, message):
    from trl_ext.recipes import RecipeError
    from trl_ext.recipes.demo_warm_start import check_demo_recipe
    from trl_ext.recipes.entry import parse_recipe

    recipe = parse_recipe("countdown", ["--config", str(ROOT / "recipes/countdown/cpu_demo.yaml"), *args], 1)
    with pytest.raises(RecipeError, match=message):
        check_demo_recipe(recipe.stated, *recipe.parsed[:2])


def test_validation_points():
    from trl_ext.recipes.demo_warm_start import validation_points

    assert validation_points(160, "steps", 40, True) == [40, 80, 120, 160]
    assert validation_points(10, "steps", 0.25, True, on_start=True) == [0, 3, 6, 9, 10]  # ceil(2.5) = 3
    assert validation_points(10, "no", None, True) == [10]
    assert validation_points(10, "no", None, False) == []


def test_a_warm_start_folder_without_a_model_is_an_error(tmp_path):
    from trl_ext.testbed.warm_start import ensure_warm_start

    (tmp_path / "sft").mkdir()
    with pytest.raises(FileExistsError, match="holds no model"):
        ensure_warm_start(tmp_path / "sft")
    (tmp_path / "sft" / "config.json").write_text("{}")
    assert ensure_warm_start(tmp_path / "sft") is False


def test_two_runs_starting_at_once_build_the_warm_start_once(tmp_path):
    """Two callers at once (threads here; processes take the same file lock): one builds, the other waits and finds
    the model; no staging folder is left behind. A small demo (a 2-step SFT) keeps it cheap."""
    from concurrent.futures import ThreadPoolExecutor

    from trl_ext.testbed.config import TestbedConfig
    from trl_ext.testbed.warm_start import ensure_warm_start

    cfg = TestbedConfig(num_train_problems=40, num_labelled=8, num_eval_problems=4, sft_steps=2, sft_batch_size=4)
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda _: ensure_warm_start(tmp_path / "sft", cfg), range(2)))
    assert sorted(built) == [False, True]
    assert (tmp_path / "sft" / "config.json").is_file() and (tmp_path / "sft" / "tokenizer_config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".sft.lock", "sft"]


def test_the_check_of_a_demo_recipe_builds_nothing_and_plans_the_warm_start(tmp_path):
    """A recipe's checks never train: without the warm start, the preflight passes on the config its build step will
    write (the model line names the step, the memory estimate is the testbed model's) and no folder appears; with
    a model there, the plan says it is reused."""
    from trl_ext.preflight.context import context_from_environment
    from trl_ext.recipes.entry import preflight_recipe
    from trl_ext.testbed.warm_start import build_model

    folder = tmp_path / "models" / "countdown_sft"
    argv = ["--config", str(ROOT / "recipes/countdown/cpu_demo.yaml"), "--model_name_or_path", str(folder)]
    argv += ["--output_dir", str(tmp_path / "run"), "--report_to", "none"]
    environ = {"WORLD_SIZE": "1"}
    _, report = preflight_recipe("countdown", argv, 1, lambda p: context_from_environment(p[0], p[1], environ))
    assert report.ok, report.render()
    assert not (tmp_path / "models").exists()
    assert f"model:   {folder}, built first by this run (SFT warm start" in report.render()
    assert report.shape is not None and report.shape.params == 595_072  # the testbed model (docs/demo.md: 595k)

    from trl_ext.testbed.config import TestbedConfig

    tokenizer, model, _ = build_model(TestbedConfig())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _, report = preflight_recipe("countdown", argv, 1, lambda p: context_from_environment(p[0], p[1], environ))
    assert report.ok and f"model:   {folder} (built by an earlier run: SFT warm start" in report.render()
