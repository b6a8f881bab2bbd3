"""`auto` splits (Countdown's default): the source's own held-out split when it has one, else the tail of `train`.

Bug caught: validation hard-wired to `train[-1024:]` (and training to `train[:-1024]`) even for a dataset that ships
a held-out split. Local folders stand in for hub datasets: `datasets` lists a folder's splits from its file names
(`train.parquet`, `test.parquet`) exactly as it lists a hub repository's, offline.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import shared_path

from trl_ext.evaluation.config import EvalConfig
from trl_ext.evaluation.pipeline import load_problems
from trl_ext.recipes import RecipeError, load_grpo_datasets, parse_recipe_args
from trl_ext.tasks import AUTO, choose_splits

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
DEV, TEST = shared_path("countdown", "dev.parquet"), shared_path("countdown", "test.parquet")


def _targets(path: Path, rows: slice = slice(None)) -> list[int]:
    return pq.read_table(path).column("target").to_pylist()[rows]


def _folder(root: Path, **files: Path) -> Path:
    root.mkdir()
    for split, source in files.items():
        shutil.copy(source, root / f"{split}.parquet")
    return root


def _recipe_splits(source: Path, caplog, *extra: str):
    argv = ["--config", str(RECIPES / "countdown" / "base.yaml"), "--use_cpu", "true", "--dataset_source"]
    script, args, _ = parse_recipe_args("countdown", [*argv, str(source), "--prompt", "tinyzero", *extra])
    assert (script.dataset_split, script.eval_split) == (AUTO, AUTO)  # decided when the data loads, not before
    with caplog.at_level(logging.WARNING, logger="trl_ext.recipes.data"):
        train, evaluation = load_grpo_datasets("countdown", script, args)
    return script, train, evaluation


def test_a_source_with_a_test_split_validates_on_it_and_trains_on_all_of_train(tmp_path, caplog):
    folder = _folder(tmp_path / "hub_like", train=DEV, test=TEST)
    script, train, evaluation = _recipe_splits(folder, caplog)
    assert (script.dataset_split, script.eval_split) == ("train", "test")
    assert list(train["target"]) == _targets(DEV) and list(evaluation["target"]) == _targets(TEST)
    assert "the dataset's own 'test' split" in caplog.text and "training on 'train'" in caplog.text


def test_a_source_with_only_train_gives_up_its_last_1024_rows(tmp_path, caplog):
    head_file = shared_path("countdown", "train_10k_head16.parquet")
    dev = pq.read_table(DEV).select(["target", "nums"])
    head = pq.read_table(head_file).select(["target", "nums"]).cast(dev.schema)
    only_train = tmp_path / "only_train"
    only_train.mkdir()
    pq.write_table(pa.concat_tables([head, dev]), only_train / "train.parquet")  # 16 + 1024 rows
    script, train, evaluation = _recipe_splits(only_train, caplog)
    assert (script.dataset_split, script.eval_split) == ("train[:-1024]", "train[-1024:]")
    assert list(train["target"]) == _targets(head_file)  # the first 16
    assert list(evaluation["target"]) == _targets(DEV)  # the last 1024
    assert "no held-out split (['train'])" in caplog.text


def test_trl_ext_eval_reads_and_records_the_same_split():
    cfg = EvalConfig(model="m", task="countdown", data_file=str(DEV), split=AUTO, prompt="tinyzero", limit=5)
    _, rows = load_problems(cfg)
    assert cfg.split == "train[-1024:]" and [r["target"] for r in rows] == _targets(DEV, slice(5))


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"train": DEV, "validation": TEST, "test": DEV}, ("train", "validation")),  # validation before test
        ({"train": DEV, "dev": TEST}, ("train", "validation")),  # `datasets` names a dev.parquet split so
    ],
)
def test_the_held_out_split_preference(tmp_path, files, expected):
    folder = _folder(tmp_path / "d", **files)
    choice = choose_splits("countdown", str(folder), AUTO, AUTO)
    assert (choice.train, choice.eval) == expected


def test_one_file_is_one_split_and_given_splits_are_left_alone(tmp_path):
    choice = choose_splits("countdown", str(DEV), AUTO, AUTO)
    assert (choice.train, choice.eval) == ("train[:-1024]", "train[-1024:]") and "no held-out split" in choice.reason
    # validation from another source: training keeps all of its own train split
    assert choose_splits("countdown", str(DEV), AUTO, AUTO, eval_source=str(TEST)).train == "train"
    # explicit splits: nothing is read (this hub id is unreachable offline)
    given = choose_splits("countdown", "no-such/dataset", "train[:10]", "test")
    assert (given.train, given.eval) == ("train[:10]", "test")
    with pytest.raises(ValueError, match="cannot list the splits of no-such/dataset"):
        choose_splits("countdown", "no-such/dataset", AUTO, AUTO)


def test_an_unlistable_source_is_a_recipe_error_before_any_model(tmp_path):
    script, args, _ = parse_recipe_args(
        "countdown", ["--config", str(RECIPES / "countdown" / "base.yaml"), "--use_cpu", "true"]
    )
    with pytest.raises(RecipeError, match="justinphan3110/Countdown-Tasks-3to4.*set eval_split"):
        load_grpo_datasets("countdown", script, args)  # offline: the default hub set cannot be listed
