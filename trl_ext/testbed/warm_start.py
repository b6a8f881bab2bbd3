"""The testbed's model and its SFT warm start, built once into a folder and reused, and its problems for other entry
points, all at `TestbedConfig`'s defaults (seed 0).

A recipe with `demo_warm_start: true` (recipes/countdown/cpu_demo.yaml) trains from this model on these problems,
so every arm of a study starts from the same weights and sees the same problem set; the run's own seed changes only
the order of the problems and the sampling. The build is a named step of such a run (`ensure_warm_start`, after the
preflight, which shows it through `planned_warm_start`); the recipe's checks never build it.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
from pathlib import Path

from trl_ext.testbed.config import TestbedConfig, model_positions
from trl_ext.testbed.problems import DEMO_CHARS, make_splits, problem_key, split_labelled


def split_problems(cfg: TestbedConfig) -> tuple[list, list, list, set]:
    """(labelled, unlabelled, held-out problems, their overlap with training: empty, else an error)."""
    train, held_out = make_splits(cfg)
    overlap = {problem_key(p) for p in train} & {problem_key(p) for p in held_out}
    if overlap:  # the generator honours `exclude`; this guards the claim the numbers rest on
        raise RuntimeError(f"{len(overlap)} held-out problems also appear in training")
    labelled, unlabelled = split_labelled(train, cfg.num_labelled)
    return labelled, unlabelled, held_out, overlap


def testbed_problems(cfg: TestbedConfig | None = None) -> tuple[list[dict], list[dict]]:
    """(unlabelled training problems, held-out problems) at `cfg` (default: `TestbedConfig()`, seed 0; generated
    once per process, a few seconds, and shared: copy the lists before changing them)."""
    if cfg is None:
        return _default_problems()
    train, held_out = make_splits(cfg)
    _, unlabelled = split_labelled(train, cfg.num_labelled)
    return unlabelled, held_out


@functools.cache
def _default_problems() -> tuple[list[dict], list[dict]]:
    return testbed_problems(TestbedConfig())


def _tokenizer(cfg: TestbedConfig):
    from trl_ext.tiny import build_char_tokenizer

    return build_char_tokenizer(DEMO_CHARS, model_max_length=model_positions(cfg))


def _architecture(cfg: TestbedConfig) -> dict:
    return dict(
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=model_positions(cfg),
    )


def build_model(cfg: TestbedConfig):
    """The character tokenizer, the tiny Qwen3 built from `cfg` (seeded), and its parameter count."""
    from trl_ext.tiny import build_tiny_qwen3

    tokenizer = _tokenizer(cfg)
    model = build_tiny_qwen3(tokenizer, seed=cfg.seed, **_architecture(cfg))
    return tokenizer, model, sum(p.numel() for p in model.parameters())


def model_config(cfg: TestbedConfig | None = None) -> dict:
    """The `config.json` the warm start writes, without building a model (for the preflight's plan)."""
    from trl_ext.tiny import tiny_qwen3_config

    cfg = cfg or TestbedConfig()
    return tiny_qwen3_config(_tokenizer(cfg), **_architecture(cfg)).to_dict()


def build_warm_start(path: str | os.PathLike, cfg: TestbedConfig | None = None) -> None:
    """The SFT warm start (`TestbedConfig` defaults: 300 steps x 128 rows on the 512 labelled problems, seed 0),
    saved with its character tokenizer to `path`."""
    import torch

    from trl_ext.testbed.sft import run_sft

    cfg = cfg or TestbedConfig()
    random.seed(cfg.seed)
    labelled, _, _, _ = split_problems(cfg)
    tokenizer, model, _ = build_model(cfg)
    scratch = Path(path).parent / f".{Path(path).name}.sft"
    try:
        run_sft(cfg, "sft", model, tokenizer, labelled, scratch, cfg.sft_steps, cfg.sft_learning_rate, "none")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    model.to(torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)


def warm_start_step(cfg: TestbedConfig | None = None) -> str:
    """The warm-start build in a few words, for the plan."""
    cfg = cfg or TestbedConfig()
    worked = f", completions with a worked search (up to {cfg.working_dead_ends} dead ends)" if cfg.working else ""
    return (
        f"SFT warm start of the testbed's model, {cfg.sft_steps} steps x {cfg.sft_batch_size} rows on its "
        f"{cfg.num_labelled} labelled problems{worked}, seed {cfg.seed}; a few CPU minutes"
    )


def planned_warm_start(path: str | os.PathLike, cfg: TestbedConfig | None = None):
    """The warm start as the preflight plans it (`trl_ext.preflight.models.PlannedModel`): built already or not,
    with the config the build writes. Builds nothing."""
    from trl_ext.preflight.models import PlannedModel

    built = (Path(path) / "config.json").is_file()
    return PlannedModel(path=str(path), config=model_config(cfg), step=warm_start_step(cfg), built=built)


def ensure_warm_start(path: str | os.PathLike, cfg: TestbedConfig | None = None) -> bool:
    """Build the warm start into `path` unless a model is there (`config.json`).

    Processes that start at once (two runs of a study) take an exclusive file lock beside the folder, so only one
    builds and the others wait for it; the model is written to a sibling folder and renamed into place, so no
    reader ever sees a half-written one. SFT is seeded, so a rebuilt folder holds the same model on this machine.

    Returns:
        True when this call built it.
    """
    from trl_ext.tiny import build_model_folder

    def build(staging: str) -> None:
        print(f"warm start: building {path} ({warm_start_step(cfg)})", flush=True)
        build_warm_start(Path(staging), cfg)

    return build_model_folder(path, build, lock=True)
