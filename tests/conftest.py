"""Shared fixtures: the reference data beside the checkout, tokenizers and tiny models built offline."""

from __future__ import annotations

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
# The reference data lives beside a developer's checkout (../shared/data); a user's clone lacks it.
SHARED_DATA = Path(os.environ.get("TRL_EXT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def shared_path(*parts: str) -> Path:
    """Path under the shared reference data; skips the calling test (with the reason) when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference data not found: {path} (set TRL_EXT_SHARED_DATA to the shared/data folder)")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    return shared_path()


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
