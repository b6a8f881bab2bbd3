"""The report.md skeleton of a discovery run: setup, result, score history, and headings to complete by hand."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_report"]


def _cell(text: str, width: int = 110) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def write_report(
    path: Path, cfg, backend: str, attempts: list[dict], history: list[int], best: dict | None, seconds: float
) -> None:
    """Write `report.md`: what ran, the best result, every attempt's verdict and the best score per round."""
    from trl_ext.rewards.kissing import KISSING_BOUNDS

    bounds = KISSING_BOUNDS.get(cfg.dimension)
    known = f" Known bounds quoted by NLPDL HW3: {bounds[0]} <= tau_{cfg.dimension} <= {bounds[1]}." if bounds else ""
    strategy = f"Best@{cfg.samples}" + (f", {cfg.rounds} rounds of refinement" if cfg.rounds > 1 else "")
    if best is None:
        result = "No valid configuration was found (score 0); program.py was not written."
    else:
        result = (
            f"Best valid configuration: |C| = {best['score']} (round {best['round']}, sample {best['sample']}), "
            f"in program.py.{known}\n\nVerifier: {_cell(best['message'], 300)}"
        )
    lines = [
        f"# Kissing configurations in dimension {cfg.dimension}: discovery report",
        "",
        "## Setup",
        "",
        f"- Model: {backend}",
        f"- Strategy: {strategy} (the verifier's message of the round's best attempt is fed back)",
        f"- Sampling: temperature {cfg.temperature}, at most {cfg.max_tokens} tokens, seed {cfg.seed}",
        f"- Sandbox: {cfg.time_limit_s:g} s per program; verifier with exact integer arithmetic",
        f"- Wall time: {seconds:.0f} s for {len(attempts)} replies",
        "",
        "## Result",
        "",
        result,
        "",
        "## Score history",
        "",
        "Best |C| after each round: " + ", ".join(str(h) for h in history),
        "",
        "| round | sample | valid | abs(C) | seconds | verifier |",
        "|---|---|---|---|---|---|",
    ]
    for a in attempts:
        valid = "yes" if a["validity"] == 1.0 else "no"
        lines.append(
            f"| {a['round']} | {a['sample']} | {valid} | {a['score']} | {a['seconds']:.1f} | {_cell(a['message'])} |"
        )
    lines += [
        "",
        "## Approach",
        "",
        "_TODO: the idea behind the best program (construction, search, symmetry) and how the feedback changed it._",
        "",
        "## What did not work",
        "",
        "_TODO: the failure modes seen above (verifier messages, time limits) and what was tried against them._",
        "",
        "## Next steps",
        "",
        "_TODO._",
        "",
    ]
    path.write_text("\n".join(lines))
