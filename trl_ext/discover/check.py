"""`trl-ext kissing-check program.py`: NLPDL HW3 section 7.3's evaluator, for a program that already exists.

Runs the program in the sandbox (`trl_ext.rewards.kissing.run_points_program`: a separate, contained process;
nothing of it runs here), takes its set of vectors C, checks `min_{x != y} |x - y| >= max_x |x|` with exact integer
arithmetic (`verify_kissing_configuration`) and prints the metrics NLPDL HW3 names: `num_points` (|C|), `dimension`
(11 by default) and `validity` (1.0 or 0.0), then the score (|C| when valid, else 0) and the verifier's message.
The exit status is 0 for a valid set, 1 for an invalid one or a program that fails.

The program gives C as its course's evaluator reads it, first found wins: `run_code()` (returning the points, or a
tuple whose first item is the points: the starter program returns `(points,)`), `get_centers()`, or a global
`points` (what `trl-ext discover` asks a model for). Unlike that evaluator, a list returned by `run_code()` is taken
as the points themselves, and coordinates must be integers (no rounding of floats).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

# Appended to the program (it runs inside the sandbox with it): C from run_code(), get_centers() or `points`.
_ENTRY_POINTS = """

def _trl_ext_kissing_points():
    found = globals()
    if callable(found.get("run_code")):
        out = found["run_code"]()
        return out[0] if isinstance(out, tuple) and len(out) > 0 else out
    if callable(found.get("get_centers")):
        return found["get_centers"]()
    if "points" in found:
        return found["points"]
    raise NameError("the program defines none of run_code(), get_centers() or a global `points`")


points = _trl_ext_kissing_points()
"""
METRICS = ("num_points", "dimension", "validity")


def check_program(source: str, dimension: int = 11, time_limit_s: float = 60.0) -> dict:
    """Run a kissing-configuration program in the sandbox and verify its set of vectors.

    Args:
        source: the program's Python source.
        dimension: the dimension the vectors must have.
        time_limit_s: the sandbox's wall-clock limit, interpreter start-up included.

    Returns:
        The verifier's dict (`validity`, `num_points`, `dimension`, `message`, the squared distance and norm), with
        `score` (|C| when valid, else 0) and the run's `seconds`. A program that fails, times out or gives no
        vectors is invalid with 0 points, its error as the message.
    """
    from trl_ext.rewards.kissing import kissing_score, run_points_program, verify_kissing_configuration

    run = run_points_program(source + _ENTRY_POINTS, time_limit_s=time_limit_s)
    if run["error"] is not None:
        result = {"validity": 0.0, "num_points": 0, "dimension": dimension, "message": run["error"]}
    else:
        result = verify_kissing_configuration(run["points"], dimension=dimension)
    return {**result, "score": kissing_score(result), "seconds": round(run["seconds"], 3)}


def format_result(result: dict) -> str:
    """The metrics one per line, `name: value`, as the course's evaluator reports them, then the score and message."""
    lines = [f"{name}: {result[name]}" for name in (*METRICS, "score")]
    return "\n".join([*lines, f"message: {result['message']}"])


def register(app: typer.Typer) -> None:
    """Add `trl-ext kissing-check` to the CLI."""

    @app.command("kissing-check")
    def kissing_check_command(
        program: Path = typer.Argument(..., help="The program to check (a program.py that gives the vectors)."),
        dimension: int = typer.Option(11, help="Dimension the vectors must have (the course's: 11)."),
        time_limit: float = typer.Option(60.0, help="Sandbox seconds for the program, start-up included."),
        as_json: bool = typer.Option(False, "--json", help="Print the whole result as one JSON object."),
    ) -> None:
        """Check a kissing-configuration program: number of points, dimension, validity (NLPDL HW3, section 7.3)."""
        if not program.is_file():
            raise typer.BadParameter(f"{program}: no such file", param_hint="PROGRAM")
        if dimension < 1:
            raise typer.BadParameter(f"--dimension must be >= 1, got {dimension}")
        if not time_limit > 0:
            raise typer.BadParameter(f"--time-limit must be > 0 seconds, got {time_limit}")
        result = check_program(program.read_text(encoding="utf-8"), dimension=dimension, time_limit_s=time_limit)
        typer.echo(json.dumps(result) if as_json else format_result(result))
        raise typer.Exit(0 if result["validity"] == 1.0 else 1)
