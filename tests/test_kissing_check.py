"""`trl-ext kissing-check program.py` (NLPDL HW3 section 7.3's evaluator): the metrics it prints for an existing
program, the ways a program may give its vectors, and its exit status. Each program runs in the real sandbox."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trl_ext.cli import app
from trl_ext.discover.check import check_program

# +-2 e_i in 11 dimensions: 22 vectors of squared norm 4, closest pairs at squared distance 8 (2e_i, 2e_j): valid.
AXES = "[[2 * (j == i) * s for j in range(11)] for i in range(11) for s in (1, -1)]"
RUN_CODE = f"import numpy as np\n\ndef run_code():\n    return (np.array({AXES}),)\n"  # as the starter's run_code
GET_CENTERS = f"def get_centers():\n    return {AXES}\n"
POINTS = f"points = {AXES}\n"
# (1, 1, 0, ...) beside them: squared norm 2, squared distance 2 to (2, 0, ...), under the maximum norm 4.
TOO_CLOSE = f"points = {AXES} + [[1, 1] + [0] * 9]\n"


@pytest.mark.parametrize("source", [RUN_CODE, GET_CENTERS, POINTS], ids=["run_code", "get_centers", "points"])
def test_each_way_of_giving_the_vectors(source):
    result = check_program(source)
    assert (result["num_points"], result["dimension"], result["validity"], result["score"]) == (22, 11, 1.0, 22)
    assert (result["min_squared_distance"], result["max_squared_norm"]) == (8, 4)


def test_run_code_comes_first_as_in_the_course_evaluator():
    result = check_program(POINTS.replace("points", "unused") + "points = [[1] * 11]\n" + RUN_CODE)
    assert result["num_points"] == 22


def test_the_command_prints_the_seeds_metrics_and_exits_by_validity(tmp_path):
    runner = CliRunner()
    good, bad, broken = tmp_path / "program.py", tmp_path / "bad.py", tmp_path / "broken.py"
    good.write_text(RUN_CODE)
    bad.write_text(TOO_CLOSE)
    broken.write_text("points = [[1] * 11\n")
    out = runner.invoke(app, ["kissing-check", str(good)])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[:4] == ["num_points: 22", "dimension: 11", "validity: 1.0", "score: 22"]
    out = runner.invoke(app, ["kissing-check", str(bad), "--json"])
    result = json.loads(out.output)
    assert out.exit_code == 1 and (result["num_points"], result["validity"], result["score"]) == (23, 0.0, 0)
    assert result["message"].startswith("Minimum squared distance 2 < maximum squared norm 4")
    out = runner.invoke(app, ["kissing-check", str(broken)])
    assert out.exit_code == 1 and "validity: 0.0" in out.output and "SyntaxError" in out.output
    out = runner.invoke(app, ["kissing-check", str(tmp_path / "missing.py")])
    assert out.exit_code == 2 and "Invalid value for PROGRAM" in out.output
    out = runner.invoke(app, ["kissing-check", str(good), "--dimension", "12"])
    assert out.exit_code == 1 and "expected 12" in out.output
