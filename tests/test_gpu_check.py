"""benchmarks/gpu_check.py: the GPU kit gives its numbers in one short command.

The default run's plan (`--plan`) totals at most 480 s on one H100, set-up included, with each part's seconds derived
from model size, tokens and steps (checked here against a hand computation); a part that would not fit the budget is
skipped with a message and the rest is written; every timed step trains on fixed completions through TRL's
`rollout_func` (one rollout call and no `generate` call per step), and the default run writes the fp32-master vs
pure-bf16 and padding-free vs stock pairs. Plus what lets a few minutes on a GPU give numbers at all: the JSON written
after every part, a failing part recorded while the next one runs, another benchmark script as a part, a wheel budget
under the 64 MiB transfer. The smoke run's numbers are not GPU numbers.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import _fixed_rollouts
    import _gpu_kit
    import _gpu_plan
    import _gpu_runs
    import gpu_check
finally:
    sys.path.pop(0)

DEFAULT_PARTS = ["precision_fp32_master", "precision_pure_bf16", "padding_free", "gsm8k_24gb"]


def _fake_part(monkeypatch, name: str, seconds: float, value: int = 1) -> None:
    def run(args, workdir):
        return {"value": value}

    plan = _gpu_plan.PartPlan("a test part", fixed_s=seconds)
    monkeypatch.setitem(_gpu_kit.PARTS, name, _gpu_kit.Part(name, run, lambda args: plan, default=False))


def test_plan_lists_the_default_parts_within_480_seconds(capsys):
    """`--plan` lists the default run, set-up included, within 480 s (default parts that add up past the budget would
    be cut off), and one part's seconds match a hand computation of the stated assumptions:
    precision_pure_bf16 on Qwen3-1.7B (P = 1,720,574,976, the embedding 151,936 x 2048 = 311,164,928), 64 rows of
    150 + 256 tokens per step, 32 micro-batches of 2, 5 steps per run, ours and stock."""
    report = gpu_check.main(["--plan"])
    printed = capsys.readouterr().out
    assert [name for name, p in gpu_check.PARTS.items() if p.default] == DEFAULT_PARTS
    assert list(report["parts"]) == DEFAULT_PARTS
    total = report["setup_s"] + sum(report["parts"].values())
    assert total <= 480 and report["budget_s"] == 480
    assert "ESTIMATES" in printed and "150 TFLOP/s" in printed
    for name, seconds in report["parts"].items():
        assert f"{name:<24}{seconds:6.0f} s" in printed
    assert f"{'total':<24}{total:6.0f} s" in printed
    params, embedding, body = 1_720_574_976, 151_936 * 2048, 1_720_574_976 - 151_936 * 2048
    flops = 8 * body + 6 * embedding + 8 * 28 * 2048 * 406  # per token, rows of 406
    step = 64 * 406 * flops / 150e12 + params * (32 * 6 + 14) / 2.5e12  # compute + bf16 accumulation + AdamW
    assert report["parts"]["precision_pure_bf16"] == pytest.approx(2 * (15 + 5 * step), rel=1e-9)
    assert report["parts"]["precision_pure_bf16"] == pytest.approx(54.51, abs=0.01)


def test_expected_completion_length_is_the_mean_of_the_draws():
    """The plan's packed row length uses the clipped log-normal's mean; compare with 200,000 draws of the same
    sampler the runs use (its standard error is ~0.4 tokens)."""
    import torch

    rollouts = _fixed_rollouts.FixedRollouts(151_669)
    draws = rollouts.lengths(200_000, torch.Generator().manual_seed(0))
    assert sum(draws) / len(draws) == pytest.approx(_fixed_rollouts.mean_completion_tokens(), abs=2.0)
    at_limit = gpu_check.completions_within(256, all_at_limit=True)
    assert _fixed_rollouts.mean_completion_tokens(at_limit) == 256


def test_output_goes_to_the_benchmarks_results_by_default(tmp_path, monkeypatch):
    _fake_part(monkeypatch, "fake", 1.0)
    gpu_check.main(["--smoke", "--part", "fake", "--output", str(tmp_path / "kit.json")])
    written = json.loads((tmp_path / "kit.json").read_text())
    assert written["parts"]["fake"]["status"] == "ok" and written["parts"]["fake"]["value"] == 1
    assert gpu_check.parse_args([]).output == str(REPO / "benchmarks" / "results" / "gpu_check.json")


def test_a_part_that_would_pass_the_budget_is_skipped_and_the_rest_written(tmp_path, monkeypatch):
    """A part expected to take longer than what is left is recorded as skipped with the reason, the others run, and
    a run still training at the deadline stops after its step. Bug caught: every part run whatever the time, so a
    command stopped at a time limit loses the last part."""
    out = tmp_path / "kit.json"
    _fake_part(monkeypatch, "quick", 1.0, value=7)
    _fake_part(monkeypatch, "long", 1000.0)
    argv = ["--smoke", "--part", "quick", "--part", "long", "--budget-s", "100", "--output", str(out)]
    report = gpu_check.main(argv)
    on_disk = json.loads(out.read_text())["parts"]
    assert on_disk["quick"]["status"] == "ok" and on_disk["quick"]["value"] == 7
    assert on_disk["long"]["status"] == "skipped" and "value" not in on_disk["long"]
    assert "expected 1000 s" in on_disk["long"]["reason"] and "--part NAME" in on_disk["long"]["reason"]
    assert report["parts"]["long"]["expected_s"] == 1000.0

    from transformers import TrainerControl

    model, rollouts = SimpleNamespace(generate_calls=0), SimpleNamespace(calls=0)
    for deadline, stops in ((time.monotonic() + 3600, False), (time.monotonic() - 1, True)):
        timer, control = _gpu_runs._step_timer(model, rollouts, deadline), TrainerControl()
        timer.on_step_begin(None, None, control)
        rollouts.calls += 1
        timer.on_step_end(None, None, control)
        assert control.should_training_stop is stops and timer.stopped is stops
        assert timer.rollout_calls == [1] and timer.generate_calls == [0]


@pytest.mark.slow
def test_smoke_run_times_the_training_step_on_fixed_completions_and_writes_the_pairs(tmp_path):
    """The default run in CPU smoke mode: every run of every part trains on `FixedRollouts` (one `rollout_func` call
    per step, zero `generate` calls: a timed step that began with a `generate` on the random model would time
    generation, not training), ours and stock start from the same weights and compute the same first gradient, and
    the JSON holds the ours/stock, fp32-master/pure-bf16 and padding-free/stock ratios computed from the runs'
    medians."""
    out = tmp_path / "gpu_check.json"
    report = gpu_check.main(["--smoke", "--output", str(out)])
    parts = report["parts"]
    runs = [parts[f"precision_{m}"][k] for m in ("fp32_master", "pure_bf16") for k in ("ours", "stock")]
    assert [run["step_generate_calls"] for run in runs] == [[0, 0]] * 4  # no generation inside a timed step
    assert list(parts) == DEFAULT_PARTS and all(p["status"] == "ok" for p in parts.values()), parts
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["smoke"] is True and report["steps"] == 2 and report["setup"]["seconds"] > 0
    pf = parts["padding_free"]["cases"]["sdpa, per-device batch 2"]
    runs += [pf["ours_pf"], pf["stock"], parts["gsm8k_24gb"]]
    for run in runs:
        steps = 1 if run is parts["gsm8k_24gb"] else 2
        assert run["step_generate_calls"] == [0] * steps and run["generate_calls"] == 0, run
        assert run["step_rollout_calls"] == [1] * steps and len(run["step_s"]) == len(run["rollout_s"]) == steps
        assert all(r < s for r, s in zip(run["rollout_s"], run["step_s"], strict=True))
        assert run["peak_gib"] is None and not run["stopped_at_budget"]  # no CUDA: no memory number
    for mode in ("fp32_master", "pure_bf16"):
        ours, stock = parts[f"precision_{mode}"]["ours"], parts[f"precision_{mode}"]["stock"]
        assert ours["first_grad_norm"] == pytest.approx(stock["first_grad_norm"], rel=1e-5)
        assert report["pairs"][f"{mode}: ours / stock"]["step_time"] == pytest.approx(
            ours["median_step_s"] / stock["median_step_s"]
        )
    for kind in ("ours", "stock"):
        fp32, bf16 = parts["precision_fp32_master"][kind], parts["precision_pure_bf16"][kind]
        pair = report["pairs"][f"fp32_master / pure_bf16: {kind}"]
        assert pair["step_time"] == pytest.approx(fp32["median_step_s"] / bf16["median_step_s"])
    assert pf["ours_pf"]["first_grad_norm"] == pytest.approx(pf["stock"]["first_grad_norm"], rel=1e-5)
    assert report["pairs"]["padding_free / stock: sdpa, per-device batch 2"]["step_time"] == pytest.approx(
        pf["ours_pf"]["median_step_s"] / pf["stock"]["median_step_s"]
    )
    gsm8k_24gb = parts["gsm8k_24gb"]
    expected_optim = "adamw_bnb_8bit" if gpu_check._imports("bitsandbytes") else "adamw_torch_fused"
    assert gsm8k_24gb["optim"] == expected_optim
    # the estimate is the full-size model's at the recipe's setup: the fused-AdamW fallback does not fit 24 GiB
    assert gsm8k_24gb["estimate_predicts_oom"] == (gsm8k_24gb["estimate_training_peak_gib"] > 24.0)
    assert gsm8k_24gb["estimate_phases_gib"].keys() == {"train", "optimizer step", "generation"}  # validation off


def test_each_part_is_written_when_it_ends_and_a_failure_does_not_stop_the_next(tmp_path, monkeypatch):
    """Parts land in the JSON one by one, a failed part records its error and traceback, and a later call adds its
    parts to the same file. Bug caught: a JSON written only at the end, or only an out-of-memory error caught, loses
    every number to a crash or a time limit."""
    out = tmp_path / "kit.json"
    seen_on_disk = []

    def first(args, workdir):
        return {"value": 1}

    def broken(args, workdir):
        seen_on_disk.append(json.loads(out.read_text())["parts"])  # `first` is already on disk
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def last(args, workdir):
        return {"value": 3}

    plan = _gpu_plan.PartPlan("a test part", fixed_s=0.1)
    for name, run in (("first", first), ("broken", broken), ("last", last)):
        monkeypatch.setitem(_gpu_kit.PARTS, name, _gpu_kit.Part(name, run, lambda args: plan))
    report = _gpu_kit.run_parts(["first", "broken"], None, tmp_path, out, {}, cleanup=lambda: None)
    first_entry = {"status": "ok", "value": 1, "seconds": pytest.approx(0, abs=1), "expected_s": 0.1}
    assert seen_on_disk == [{"first": first_entry}]
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
    part = _gpu_kit.script_part("x", str(script)[1:], "--fast", results=str(result)[1:], seconds=60)
    args = type("Args", (), {"deadline": None})()
    out = part.run(args, tmp_path)
    assert out["results"] == {"ratio": 0.97, "argv": ["--fast"]} and out["returncode"] == 0
    assert part.expect(args).seconds == 60
    failing = _gpu_kit.script_part("y", str(script)[1:] + "-missing", seconds=60)
    with pytest.raises(RuntimeError, match="exited with 2"):
        failing.run(args, tmp_path)
    monkeypatch.delitem(_gpu_kit.PARTS, "y")


def test_wheel_budget_fits_bitsandbytes_under_the_transfer_limit():
    """Nothing a usual GPU image has travels (pyarrow alone is 55 MB), bitsandbytes (43 MB) does, and the working
    tree with the wheels fits the 64 MiB transfer with room to spare."""
    names = {spec.split("==")[0] for spec in _gpu_kit.WHEELS}
    assert "bitsandbytes" in names and not names & {"pyarrow", "xxhash", "torch", "transformers", "accelerate"}
    budget = _gpu_kit.wheel_budget(_gpu_kit.tree_bytes(REPO))
    assert budget["fits"] and budget["total_bytes"] < 60 * 2**20, budget
    old = {**_gpu_kit.WHEELS, "pyarrow==26.0.1": 55_043_763, "xxhash==4.1.0": 472_238}
    assert not _gpu_kit.wheel_budget(budget["tree_bytes"], old)["fits"]
