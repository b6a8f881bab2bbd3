"""benchmarks/gpu_check.py: the GPU kit's parts in CPU smoke mode (recipe parse, random-init Qwen3 and Qwen2.5
configs, ours vs stock TRL per precision mode, the seed-004 estimate), and what lets it run on the device at all
(issue #23 item 16): the JSON written after every part, a failing part recorded while the next one runs, one part
per call with results accumulating, another benchmark script as a part, and a wheel budget under the device's 64 MiB
transfer that includes bitsandbytes. Its numbers are not GPU numbers; the GPU run needs the device (docs/gpu.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import _gpu_kit
    import gpu_check
finally:
    sys.path.pop(0)


@pytest.mark.slow
def test_smoke_mode_runs_the_parts_and_writes_the_json(tmp_path):
    """fp32 master weights and seed 004 in CPU smoke mode. `precision_pure_bf16` is the same function with the
    bfloat16 dtype (checked below without running it: on the CPU each of its four trainer runs costs ~15 s through
    TRL's fused 151,936-row LM head, and the suite's time is budgeted)."""
    out = tmp_path / "gpu_check.json"
    report = gpu_check.main(["--smoke", "--part", "precision_fp32_master", "--part", "seed004", "--output", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["smoke"] is True and report["steps"] == 2
    parts = report["parts"]
    assert sorted(parts) == ["precision_fp32_master", "seed004"]
    assert all(p["status"] == "ok" and p["seconds"] > 0 for p in parts.values()), parts
    assert [name for name, p in gpu_check.PARTS.items() if p.default] == [
        "precision_fp32_master",
        "precision_pure_bf16",
        "seed004",
    ]
    assert gpu_check.MODES == {"fp32_master": "float32", "pure_bf16": "bfloat16"}
    seen = []
    with pytest.MonkeyPatch.context() as mp:  # the part not run above calls the same function in its own mode
        mp.setattr(gpu_check, "precision_run", lambda mode, args, workdir: seen.append(mode) or {})
        gpu_check.PARTS["precision_pure_bf16"].run(None, tmp_path)
    assert seen == ["pure_bf16"]
    for mode in ("fp32_master",):
        runs = parts[f"precision_{mode}"]
        for kind in ("ours", "stock"):
            assert runs[kind]["trainer"] == kind and len(runs[kind]["step_s"]) == 2  # both trainers, two steps
            assert runs[kind]["peak_gib"] is None  # no CUDA: no memory number pretends to be one
        ratio = runs["ours"]["median_step_s"] / runs["stock"]["median_step_s"]
        assert runs["step_time_ratio_ours_over_stock"] == pytest.approx(ratio)
        assert runs["ours"]["first_loss"] == pytest.approx(runs["stock"]["first_loss"], abs=1e-6)
    seed004 = parts["seed004"]
    assert seed004["generator"] == "transformers"  # no vLLM in the kit
    expected_optim = "adamw_bnb_8bit" if importlib.util.find_spec("bitsandbytes") else "adamw_torch_fused"
    assert seed004["optim"] == expected_optim
    # the estimate is the full-size model's at the recipe's setup: the fused-AdamW fallback does not fit 24 GiB
    assert seed004["estimate_predicts_oom"] == (seed004["estimate_peak_gib"] > 24.0)
    assert seed004["estimate_phases_gib"].keys() == {"train", "optimizer step", "generation"}  # validation off


def test_each_part_is_written_when_it_ends_and_a_failure_does_not_stop_the_next(tmp_path, monkeypatch):
    """The old kit wrote its JSON only at the end and caught only torch.OutOfMemoryError: a crash (or the device's
    600 s limit) lost every number. Parts now land in the JSON one by one, a failed part records its error and
    traceback, and a later call adds its parts to the same file."""
    out = tmp_path / "kit.json"
    seen_on_disk = []

    def first(args, workdir):
        return {"value": 1}

    def broken(args, workdir):
        seen_on_disk.append(json.loads(out.read_text())["parts"])  # `first` is already on disk
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def last(args, workdir):
        return {"value": 3}

    for name, run in (("first", first), ("broken", broken), ("last", last)):
        monkeypatch.setitem(_gpu_kit.PARTS, name, _gpu_kit.Part(name, run, 0.1))
    report = _gpu_kit.run_parts(["first", "broken"], None, tmp_path, out, {}, cleanup=lambda: None)
    assert seen_on_disk == [{"first": {"status": "ok", "value": 1, "seconds": pytest.approx(0, abs=1)}}]
    broken_entry = json.loads(out.read_text())["parts"]["broken"]
    assert broken_entry["status"] == "failed" and "illegal memory access" in broken_entry["error"]
    assert "RuntimeError" in broken_entry["traceback"]
    _gpu_kit.run_parts(["last"], None, tmp_path, out, json.loads(out.read_text()), cleanup=lambda: None)
    assert sorted(json.loads(out.read_text())["parts"]) == ["broken", "first", "last"]
    assert report["parts"]["first"]["value"] == 1


def test_a_benchmark_script_is_one_line_of_part(tmp_path, monkeypatch):
    script = tmp_path / "bench_x.py"
    result = tmp_path / "x.json"
    script.write_text(
        f"import json, sys; json.dump({{'ratio': 0.97, 'argv': sys.argv[1:]}}, open({str(result)!r}, 'w'))"
    )
    monkeypatch.setattr(_gpu_kit, "ROOT", Path("/"))  # the script and its results by absolute path here
    monkeypatch.setitem(_gpu_kit.PARTS, "x", None)
    part = _gpu_kit.script_part("x", str(script)[1:], "--fast", results=str(result)[1:], minutes=1)
    args = type("Args", (), {"deadline": None})()
    out = part.run(args, tmp_path)
    assert out["results"] == {"ratio": 0.97, "argv": ["--fast"]} and out["returncode"] == 0
    failing = _gpu_kit.script_part("y", str(script)[1:] + "-missing", minutes=1)
    with pytest.raises(RuntimeError, match="exited with 2"):
        failing.run(args, tmp_path)
    monkeypatch.delitem(_gpu_kit.PARTS, "y")


def test_wheel_budget_fits_bitsandbytes_under_the_transfer_limit():
    """The old list carried pyarrow (55 MB) and xxhash, which the device image has, and left no room for
    bitsandbytes (43 MB): tree + wheels went over 64 MiB. Now nothing the image has travels, bitsandbytes does, and
    the whole transfer fits with room to spare."""
    names = {spec.split("==")[0] for spec in _gpu_kit.WHEELS}
    assert "bitsandbytes" in names and not names & {"pyarrow", "xxhash", "torch", "transformers", "accelerate"}
    budget = _gpu_kit.wheel_budget(_gpu_kit.tree_bytes(REPO))
    assert budget["fits"] and budget["total_bytes"] < 60 * 2**20, budget
    old = {**_gpu_kit.WHEELS, "pyarrow==26.0.1": 55_043_763, "xxhash==4.1.0": 472_238}
    assert not _gpu_kit.wheel_budget(budget["tree_bytes"], old)["fits"]
