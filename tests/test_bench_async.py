"""benchmarks/bench_async.py's across-seed comparison: one run's figures, the study statistics over
seeds paired by seed, the rotated run order, the `--seeds` check. Numbers by hand; no run."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import bench_async
finally:
    sys.path.pop(0)

T_975_DF2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom (tables)


def _record(rewards, walls, greedy=0.25, sampled=0.125):
    return {
        "step_walls": walls,
        "metrics": {"reward": rewards},
        "heldout": {"greedy_accuracy": greedy, "sampled_accuracy": sampled},
    }


def test_seed_metrics_skips_warmup_steps_and_unlogged_rewards():
    got = bench_async.seed_metrics(_record([0.1, None, 0.3], [5.0, 1.0, 2.0, 3.0]), warmup=1)
    assert got == pytest.approx(
        {"greedy_accuracy": 0.25, "sampled_accuracy": 0.125, "reward_mean": 0.2, "seconds_per_step": 2.0}
    )


def _metrics(greedy, seconds):
    half = greedy / 2
    return {"greedy_accuracy": greedy, "sampled_accuracy": half, "reward_mean": greedy, "seconds_per_step": seconds}


def test_across_seeds_pairs_by_seed_with_t_intervals():
    per_seed = {
        "sync": {0: _metrics(0.10, 2.0), 1: _metrics(0.20, 3.0), 2: _metrics(0.30, 4.0)},
        "async": {0: _metrics(0.12, 1.0), 1: _metrics(0.18, 2.0), 2: _metrics(0.36, 2.0)},
        "async_nocorr": {2: _metrics(0.40, 2.0), 0: _metrics(0.10, 1.0)},  # a seed missing: paired over 0 and 2
    }
    got = bench_async.across_seeds(per_seed)

    # sync greedy: mean 0.2, sample sd 0.1, sem 0.1 / sqrt(3)
    sync = got["per_arm"]["sync"]["greedy_accuracy"]
    half = T_975_DF2 * 0.1 / math.sqrt(3)
    assert (sync["n"], sync["mean"]) == (3, pytest.approx(0.2))
    assert (sync["low"], sync["high"]) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))

    # async - sync by seed: +0.02, -0.02, +0.06 -> mean 0.02, sd 0.04; t = 0.02 / (0.04 / sqrt 3);
    # with 2 degrees of freedom the two-sided p is 1 - t / sqrt(2 + t^2)
    diff = got["paired"]["async-sync"]["greedy_accuracy"]
    sem = 0.04 / math.sqrt(3)
    t = 0.02 / sem
    assert diff["seeds"] == [0, 1, 2]
    assert diff["mean"] == pytest.approx(0.02)
    half = T_975_DF2 * sem
    assert (diff["low"], diff["high"]) == (pytest.approx(0.02 - half), pytest.approx(0.02 + half))
    assert diff["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t))

    # async_nocorr has seeds 0 and 2 only: differences 0.0 and +0.10
    nocorr = got["paired"]["async_nocorr-sync"]["greedy_accuracy"]
    assert nocorr["seeds"] == [0, 2]
    assert nocorr["mean"] == pytest.approx(0.05)
    assert got["per_arm"]["async_nocorr"]["greedy_accuracy"]["n"] == 2

    # the speedup seed by seed: 2/1, 3/2, 4/2
    assert got["speedup_by_seed"]["async"]["mean"] == pytest.approx((2 + 1.5 + 2) / 3)
    assert got["speedup_by_seed"]["async_nocorr"]["mean"] == pytest.approx((2 + 2) / 2)
    assert "sync-sync" not in got["paired"]


def test_run_order_rotates_the_arms_seed_by_seed():
    order = bench_async.run_order([3, 7, 8, 9])
    assert order == [
        (3, ["sync", "async", "async_nocorr"]),
        (7, ["async", "async_nocorr", "sync"]),
        (8, ["async_nocorr", "sync", "async"]),
        (9, ["sync", "async", "async_nocorr"]),
    ]


@pytest.mark.parametrize("seeds", ["0,0", "0,x", "-1"])
def test_seeds_must_be_distinct_non_negative_integers(seeds, capsys):
    with pytest.raises(SystemExit):
        bench_async.parse_args([f"--seeds={seeds}"])
    assert "--seeds" in capsys.readouterr().err


def test_arms_differ_only_in_staleness_and_correction():
    assert bench_async.ARMS == {"sync": (0, True), "async": (1, True), "async_nocorr": (1, False)}
