"""Shared fixtures: the reference data in tests/data, tokenizers and tiny models built offline."""

from __future__ import annotations

import atexit
import gc
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
# `pytest -n 2` runs two workers on two cores: one torch thread each (default threads oversubscribe, ~6x slower).
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
# The real-data subset the tests read ships in tests/data (its README gives provenance and licenses).
TEST_DATA = Path(__file__).resolve().parent / "data"
# A fuller copy with the same layout may be named here; what it lacks comes from tests/data.
SHARED_DATA = Path(os.environ["TRL_EXT_DATA"]) if os.environ.get("TRL_EXT_DATA") else None


def shared_path(*parts: str) -> Path:
    """Path of a reference data file: under `$TRL_EXT_DATA` when set and present there, else under tests/data.

    Raises:
        FileNotFoundError: the file is in neither place (a test reading a file nobody shipped must fail, not skip).
    """
    roots = [root for root in (SHARED_DATA, TEST_DATA) if root is not None]
    for root in roots:
        path = root.joinpath(*parts)
        if path.exists():
            return path
    raise FileNotFoundError(
        f"reference data {'/'.join(parts)} is in none of {[str(r) for r in roots]}; add a compact subset under "
        "tests/data with a provenance and license line in tests/data/README.md"
    )


@pytest.fixture(scope="session")
def shared_data() -> Path:
    return TEST_DATA


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shared_path("qwen3_tokenizer")))


@pytest.fixture(scope="session")
def char_tokenizer():
    from trl_ext.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture
def tiny_model(char_tokenizer):
    from trl_ext.tiny import build_tiny_qwen3

    return build_tiny_qwen3(char_tokenizer, seed=0)


# The longest modules first (in a whole-suite run on a 2-core CPU). `make test` runs `-n 2 --dist loadscope
# --no-loadscope-reorder`: xdist then hands out modules in this order, so the two workers end together (longest
# processing time first). xdist's default reorder sorts modules by their number of tests, which put these few-test,
# minute-long modules last, with one worker idle while the other ran them.
LONGEST_FIRST = (
    "test_study_two_nodes.py",  # a two-node Slurm cluster: a study run started three times, a reference run beside
    "test_demo.py",  # the reduced demo at two seeds (GRPO and its SFT-only control side by side)
    "test_vllm_server_sync.py",  # a real server, trainers (2 ranks under ZeRO-3 and DDP, then one process) syncing
    "test_vllm_colocate.py",  # four colocated-engine runs in one child process (three other modules' checks)
    "test_vllm_launch.py",  # two real `trl vllm-serve` starts
    "test_preflight_runs.py",
    "test_study_runner.py",
    "test_zero_training.py",  # DDP, ZeRO-2 and ZeRO-3 one after the other in one 2-process launch
    "test_recipe_runs.py",
    "test_vllm_eval.py",
    "test_evaluation_smollm2.py",
    "test_trainer_learning.py",
    "test_preflight_table.py",
    "test_kissing_recipe.py",
    "test_vllm_sampler.py",
    "test_zero_memory.py",
    "test_trainer_distributed.py",
    "test_gpu_check.py",
)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Collecting imports torch, transformers, TRL and vLLM: about 750k objects, which the cyclic garbage collector
    walks again and again while they load (4 CPU s per pytest process on a 2-core CPU). It is off while the test
    modules are collected; then one collection and `gc.freeze()` move every object alive out of its reach, so the
    full collections transformers and accelerate run when a training run ends walk only what the tests created."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()
        atexit.register(gc.unfreeze)  # collectable again at exit, else nanobind reports them as leaked


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
