"""The CPU ablation atlas reduced (recipes/studies/cpu_ablations_working.yaml; docs/ablations.md): two of its arms
(the reference and Dr.GRPO, on the working warm start's recipes) at two seeds, two steps, 16 held-out problems, run
through the recipes into a study's folders; then `trl-ext study report` with the study's own claims on those arms. The
numbers the report states are checked against the runs' logs and against the saved final model scored again; the
checks of a `demo_warm_start` recipe name the field they refuse."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from test_trainer_helpers import freeze_imports

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = 16
ARGS = (
    "--model_name_or_path runs/warm --n_grpo_steps 2 --rollout_batch_size 16 --train_batch_size 16 "
    f"--per_device_train_batch_size 16 --eval_steps 1 --eval_limit {HELDOUT} --num_generations_eval 2 --limit 64 "
    "--logging_steps 1 --eval_on_start true --max_completion_length 12"
)
ARMS = ("grpo", "drgrpo")
T_975_1 = 12.706204736  # Student t, 97.5% quantile, 1 degree of freedom (tables)


def reduced_study() -> str:
    """The shipped working atlas with `ARMS` only, seeds 0 and 1, `ARGS` for its sizes, its claims on them."""
    study = yaml.safe_load((ROOT / "recipes/studies/cpu_ablations_working.yaml").read_text())
    study["name"], study["seeds"] = "e2e", [0, 1]
    study.pop("args")  # the atlas's sizes: ARGS replaces them
    study["arms"] = {name: {**study["arms"][name], "args": ARGS} for name in ARMS}
    study["claims"] = [c for c in study["claims"] if c["arm"] in ARMS and c["baseline"] in ARMS]
    assert len(study["claims"]) == 2  # Dr.GRPO's length claim and its accuracy parity
    return yaml.safe_dump(study)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A run folder with the recipes, and a stand-in warm start in runs/warm: the working testbed's model and tokenizer
    at their seed-0 init (no SFT: the pipeline, not the learning, is under test)."""
    from trl_ext.testbed.config import TestbedConfig
    from trl_ext.testbed.warm_start import build_model

    freeze_imports()  # the runs' end-of-training collections then skip the imported modules
    for name in ("recipes", "accelerate_configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    tokenizer, model, _ = build_model(TestbedConfig(working=True))
    model.save_pretrained("runs/warm")
    tokenizer.save_pretrained("runs/warm")
    (tmp_path / "study.yaml").write_text(reduced_study())
    return tmp_path


def test_two_arms_two_seeds_through_the_recipes_and_the_report(folder, monkeypatch):
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
    logged: dict[str, dict[int, dict]] = {arm: {} for arm in ARMS}
    for run in study.runs():
        history = json.loads((run.output_dir / "trainer_state.json").read_text())["log_history"]
        points = [h for h in history if "heldout/greedy_accuracy" in h]
        assert [h["step"] for h in points] == [0, 1, 2]  # eval_on_start, every step, the last
        last = logged[run.arm.name][run.seed] = points[-1]
        # the report states the last validation's numbers, and the training loop's wall clock
        entry = summary["arms"][run.arm.name]
        for key in study.metrics:
            if key in last:
                assert entry["metrics"][key]["per_seed"][run.seed] == last[key]
        runtime = next(h["train_runtime"] for h in history if "train_runtime" in h)
        assert entry["wall_clock_s"]["per_seed"][run.seed] == runtime
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
    # each claim: the per-seed differences of the logged last values, their mean and the t interval (1 df)
    for claim in summary["claims"]:
        arm, base = logged[claim["arm"]], logged[claim["baseline"]]
        diffs = [arm[s][claim["metric"]] - base[s][claim["metric"]] for s in (0, 1)]
        assert [claim["per_seed"][s] for s in (0, 1)] == pytest.approx(diffs, abs=1e-12)
        half = T_975_1 * abs(diffs[0] - diffs[1]) / 2  # sd of two values |a - b| / sqrt(2), sem |a - b| / 2
        assert claim["mean"] == pytest.approx(sum(diffs) / 2, abs=1e-12)
        if half > 0:
            assert (claim["low"], claim["high"]) == pytest.approx((claim["mean"] - half, claim["mean"] + half))
        assert claim["verdict"] in ("shown", "refuted", "cannot tell")
    shipped = json.loads((folder / "shipped/ablations.json").read_text())
    assert shipped == json.loads((study.report_dir / "report.json").read_text())
    assert (folder / "shipped/ablations.png").stat().st_size > 0 and (folder / "shipped/ablations_arms.png").is_file()
    markdown = (folder / "shipped/ablations.md").read_text()
    assert "## Claims" in markdown and "## heldout/greedy_accuracy (last validation)" in markdown
    entropy = sum(logged["grpo"][s]["heldout/entropy"] for s in (0, 1)) / 2
    assert f"| grpo | 2 | {entropy:.4g} |" in markdown
    assert not math.isnan(entropy)


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


def test_a_working_recipe_checks_its_budget_and_its_warm_start_folder(tmp_path):
    """`demo_working` gives the model 192 positions: a budget beyond them is refused before anything is built, and a
    folder holding the compact warm start (64 positions) is refused with both named."""
    from trl_ext.recipes import RecipeError
    from trl_ext.recipes.demo_warm_start import check_demo_recipe, check_warm_start_folder
    from trl_ext.recipes.entry import parse_recipe

    def parsed(*args):
        return parse_recipe("countdown", ["--config", str(ROOT / "recipes/countdown/cpu_demo.yaml"), *args], 1)

    recipe = parsed("--max_completion_length", "44")
    with pytest.raises(RecipeError, match="max_completion_length 44 .* 64 positions .demo_working: true gives 192"):
        check_demo_recipe(recipe.stated, *recipe.parsed[:2])
    recipe = parsed("--demo_working", "true", "--max_completion_length", "144")
    check_demo_recipe(recipe.stated, *recipe.parsed[:2])
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    with pytest.raises(RecipeError, match="64 positions, not the working .* warm start's 192"):
        check_warm_start_folder(str(tmp_path), recipe.parsed[0])
    check_warm_start_folder(str(tmp_path), parsed().parsed[0])


def test_data_seed_reorders_the_same_problems():
    """The noise-floor arm of the ablation studies: `data_seed` shuffles the problems (the same set, another order,
    the same for the same data_seed); without it the demo's order."""
    from types import SimpleNamespace

    from trl_ext.recipes.demo_warm_start import load_demo_datasets

    args = SimpleNamespace(limit=200, eval_limit=8)
    plain, held_out = load_demo_datasets(args)
    shuffled, _ = load_demo_datasets(args, data_seed=1)
    keys = [list(zip(d["nums"], d["target"], strict=True)) for d in (plain, shuffled)]
    key = [(tuple(n), t) for n, t in keys[0]]
    assert sorted(key) == sorted((tuple(n), t) for n, t in keys[1]) and keys[0] != keys[1]
    assert load_demo_datasets(args, data_seed=1)[0]["prompt"] == shuffled["prompt"] and len(held_out) == 8


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
