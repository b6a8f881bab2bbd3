"""benchmarks/gpu_check.py in its CPU smoke mode: the GPU kit's code paths (recipe parse, random-init Qwen3 and
Qwen2.5 configs, ours vs stock TRL per precision mode, the seed-004 estimate) run end to end. Its numbers are not
GPU numbers; the GPU run itself needs the device (docs/gpu.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_smoke_mode_runs_every_part_and_writes_the_json(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    out = tmp_path / "gpu_check.json"
    report = gpu_check.main(["--smoke", "--output", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["smoke"] is True and report["steps"] == 2
    for mode in ("fp32_master", "pure_bf16"):
        runs = report["precision"][mode]
        for kind in ("ours", "stock"):
            assert runs[kind]["trainer"] == kind and len(runs[kind]["step_s"]) == 2  # both trainers, two steps
            assert runs[kind]["peak_gib"] is None  # no CUDA: no memory number pretends to be one
        ratio = runs["ours"]["median_step_s"] / runs["stock"]["median_step_s"]
        assert runs["step_time_ratio_ours_over_stock"] == pytest.approx(ratio)
        assert runs["ours"]["first_loss"] == pytest.approx(runs["stock"]["first_loss"], abs=1e-6)
    seed004 = report["seed004"]
    assert seed004["generator"] == "transformers"  # no vLLM in the kit
    expected_optim = "adamw_bnb_8bit" if importlib.util.find_spec("bitsandbytes") else "adamw_torch_fused"
    assert seed004["optim"] == expected_optim
    # the estimate is the full-size model's at the recipe's setup: the fused-AdamW fallback does not fit 24 GiB
    assert seed004["estimate_predicts_oom"] == (seed004["estimate_peak_gib"] > 24.0)
    assert seed004["estimate_phases_gib"].keys() == {"train", "optimizer step", "generation"}  # validation off
