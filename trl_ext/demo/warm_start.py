"""The demo's warm start and problems for other entry points: the SFT model built once into a folder and reused, the
unlabelled training problems and the held-out problems, all at `DemoConfig`'s defaults (seed 0).

A recipe with `demo_warm_start: true` (recipes/countdown/cpu_demo.yaml) trains from this model on these problems,
so every arm of a study starts from the same weights and sees the same problem set; the run's own seed changes
only the order of the problems and the sampling.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
from pathlib import Path

from trl_ext.demo.config import DemoConfig
from trl_ext.demo.data import make_splits, split_labelled


def demo_problems(cfg: DemoConfig | None = None) -> tuple[list[dict], list[dict]]:
    """(unlabelled training problems, held-out problems) of the demo at `cfg` (default: `DemoConfig()`, seed 0;
    generated once per process, a few seconds, and shared: copy the lists before changing them)."""
    if cfg is None:
        return _default_problems()
    train, held_out = make_splits(cfg)
    _, unlabelled = split_labelled(train, cfg.num_labelled)
    return unlabelled, held_out


@functools.cache
def _default_problems() -> tuple[list[dict], list[dict]]:
    return demo_problems(DemoConfig())


def build_warm_start(path: str | os.PathLike, cfg: DemoConfig | None = None) -> None:
    """The demo's SFT warm start (`DemoConfig` defaults: 300 steps x 128 rows on the 512 labelled problems, seed 0),
    saved with its character tokenizer to `path`. No held-out curve points are measured on the way."""
    from dataclasses import replace

    import torch

    from trl_ext.demo.phases import run_sft
    from trl_ext.demo.run import _data, _model

    cfg = replace(cfg or DemoConfig(), curve_points=0, wandb=False)
    random.seed(cfg.seed)
    labelled, _, held_out, _ = _data(cfg)
    tokenizer, model, _ = _model(cfg)
    scratch = Path(path).parent / f".{Path(path).name}.sft"
    try:
        steps, lr = cfg.sft_steps, cfg.sft_learning_rate
        run_sft(cfg, "sft", model, tokenizer, labelled, held_out, scratch, steps, lr, "none")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    model.to(torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)


def ensure_warm_start(path: str | os.PathLike, cfg: DemoConfig | None = None) -> bool:
    """Build the demo's warm start into `path` unless a model is there (`config.json`).

    Processes that start at once (two runs of a study) take an exclusive file lock beside the folder, so only one
    builds and the others wait for it; the model is written to a sibling folder and renamed into place, so no
    reader ever sees a half-written one. SFT is seeded, so a rebuilt folder holds the same model on this machine.

    Returns:
        True when this call built it.
    """
    from trl_ext.tiny import build_model_folder

    def build(staging: str) -> None:
        print(f"building the demo's warm start (SFT, seed {(cfg or DemoConfig()).seed}) into {path}", flush=True)
        build_warm_start(Path(staging), cfg)

    return build_model_folder(path, build, lock=True)
