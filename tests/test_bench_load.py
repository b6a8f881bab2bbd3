"""benchmarks/_load.py (the load a speed benchmark saw, and the refusal to write a loaded machine's figures) and
benchmarks/bench_throughput.py's test of equal sampling distributions. Numbers by hand; no benchmark runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import _load
    import bench_throughput
finally:
    sys.path.pop(0)


@pytest.mark.parametrize(
    ("before", "others", "cpus", "loaded"),
    [
        (0.2, 0.1, 2, False),  # idle: 0.1 per core just before the start
        (1.0, 0.0, 2, False),  # exactly the limit, 0.5 per core, is not above it
        (1.2, 0.0, 2, True),  # busy at the start: 0.6 per core
        (0.1, 1.5, 2, True),  # other work during the measurement: 0.75 per core
        (3.0, 3.0, 8, False),  # the same load on 8 cores: 0.375 per core
    ],
)
def test_a_machine_is_loaded_above_half_a_core_of_other_work_per_core(before, others, cpus, loaded):
    assert _load.is_loaded(before, others, cpus) is loaded


def test_a_loaded_measurement_is_refused_unless_marked(tmp_path):
    load = {"loaded": True, "others_cores_before": 1.2, "others_cores": 1.7, "cpu_count": 2}
    with pytest.raises(SystemExit, match="--loaded"):
        _load.refuse_if_loaded(load, allow_loaded=False, out=tmp_path / "x.json")
    _load.refuse_if_loaded(load, allow_loaded=True, out=tmp_path / "x.json")
    _load.refuse_if_loaded({**load, "loaded": False}, allow_loaded=False, out=tmp_path / "x.json")


def test_the_record_counts_a_child_process_as_the_benchmarks_own():
    """A child that burns CPU is the benchmark's own work, not other load: own + others account for the same CPU
    (a child left out would show as other work and refuse an idle machine's figures)."""
    load = _load.MachineLoad(window_s=0.2)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1: pass\nprint(time.process_time())"
    used = float(subprocess.run([sys.executable, "-c", burn], capture_output=True, text=True, check=True).stdout)
    record = load.stop()
    assert record["own_cores"] * record["wall_s"] >= 0.9 * used
    assert set(record) >= {"cpu_count", "loadavg_before", "loadavg_after", "others_cores_before", "others_cores"}


def test_other_work_before_the_start_is_measured_not_read_off_the_load_average():
    """A process busy on one core during the start window counts as about one core of other work (a load average
    would still show a job that ended a minute ago, and not yet one that just began)."""
    burn = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 6: pass"])
    try:
        time.sleep(0.5)
        others, source = _load.other_cores_now(window_s=2.0)
    finally:
        burn.kill()
        burn.wait()
    if source != "/proc/stat":
        pytest.skip("no /proc/stat on this system: the start falls back to the load average")
    assert 0.8 <= others <= 2.5  # the busy process's core, plus whatever else the machine ran


def test_equal_draws_give_p_one_and_a_shifted_distribution_is_found():
    same = bench_throughput.homogeneity([[1] * 30 + [2] * 20, [2] * 20 + [1] * 30], "x")
    assert same["counts"] == [[30, 20], [30, 20]] and same["p"] == pytest.approx(1.0)
    # 2 x 2 table [[40, 10], [25, 25]]: expected [[32.5, 17.5], [32.5, 17.5]],
    # chi2 = 7.5^2 * (2 / 32.5 + 2 / 17.5) = 9.8901..., 1 degree of freedom
    shifted = bench_throughput.homogeneity([[1] * 40 + [2] * 10, [1] * 25 + [2] * 25], "x")
    assert shifted["chi2"] == pytest.approx(7.5**2 * (2 / 32.5 + 2 / 17.5)) and shifted["dof"] == 1
    assert shifted["p"] < 0.01


def test_rare_categories_are_merged_so_every_cell_has_enough_draws():
    labels, table = bench_throughput._merge_rare([{"a": 30, "b": 2, "c": 3}, {"a": 28, "b": 4, "c": 2}])
    assert labels == ["a", "other"] and table == [[30, 5], [28, 6]]  # b: 6 draws, c: 5, both under 10
