"""`report.md` of a discovery run, in the sections the assignment asks for (NLPDL HW3, problem 17).

Methodology (the strategy, model, system message, prompts, sampling, verification), Process (the first and the
final score, the best score per round, every attempt's verdict and two prompts exactly as they were sent: the task
prompt and the request that led to the best score), Final Result (|C| and the verifier's message), Reflection (what
the run's numbers show, and a place for the author's own conclusions). Everything but that last paragraph is filled
in from the run, and rewritten after every round.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

__all__ = ["SECTIONS", "example_prompts", "failure_kind", "write_report"]

SECTIONS = ("Methodology", "Process", "Final Result", "Reflection")


def _cell(text: str, width: int = 110) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def _fenced(text: str) -> str:
    """`text` in a fence longer than any run of backticks inside it (the prompts themselves ask for ```python)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def failure_kind(message: str) -> str:
    """A verifier or sandbox message without its particulars: the text before the first colon, numbers as N
    (`Minimum squared distance 2 < maximum squared norm 9: points 0 and 4 ...` -> `Minimum squared distance N <
    maximum squared norm N`)."""
    return re.sub(r"\d+", "N", message.split("\n")[0].split(":")[0]).strip()[:100]


def _window(cfg) -> str:
    if cfg.history_window is None:
        return "all of it"
    return "the last exchange" if cfg.history_window == 1 else f"the last {cfg.history_window} exchanges"


def _strategy(cfg) -> str:
    if cfg.rounds == 1:
        return f"Best@{cfg.samples} with the verifier as the selection mechanism (one round, no refinement)"
    loop = (
        "each round's best attempt and the verifier's verdict on it join the conversation, and every later request "
        f"carries the system message, the task prompt and the conversation so far ({_window(cfg)})"
    )
    if cfg.samples == 1:
        return f"Iterative refinement over {cfg.rounds} rounds, one program per round: {loop}"
    return f"Best@{cfg.samples} with the verifier as the selection mechanism in each of {cfg.rounds} rounds: {loop}"


def example_prompts(rounds: list[dict]) -> list[tuple[str, dict]]:
    """At most two requests worth showing, as sent: round 1's (the task prompt), and the one that led to the best
    score when a later round reached it (else the last refinement request, whose answers did not improve it).

    Returns:
        `[(why, round entry)]`, the entries of `conversation_log.json`'s `rounds`.
    """
    picked = [("the first request: the task prompt", rounds[0])]
    if len(rounds) > 1:
        final = rounds[-1]["best_score"]
        first_best = next(r for r in rounds if r["best_score"] == final)
        before = rounds[first_best["round"] - 2]["best_score"] if first_best["round"] > 1 else None
        if before is not None and final > before:
            why = f"the request that led to the best score (|C| {before} -> {final})"
            picked.append((why, first_best))
        else:
            why = "the last refinement request (no round after the first improved the score)"
            picked.append((why, rounds[-1]))
    return picked


def _methodology(cfg, backend: str) -> list[str]:
    from trl_ext.tasks.kissing import kissing_prompt

    system = f"`{_cell(cfg.system_prompt, 300)}`" if cfg.system_prompt else "none"
    task = (
        "the assignment's baseline prompt (section 7.4) for this dimension, then one sentence asking for the program "
        "in a ```python block"
        if cfg.task_prompt == kissing_prompt(cfg.dimension)
        else "a prompt of the user's (shown under Process)"
    )
    return [
        "## Methodology",
        "",
        f"- Approach: {_strategy(cfg)}.",
        f"- Model: {backend}",
        f"- System message: {system}",
        f"- Task prompt: {task}",
        "- Feedback: after a failed attempt, the assignment's failure prompt with the verifier's exact message; after "
        "a valid one, its success prompt with the score",
        f"- Conversation history sent with each refinement request: {_window(cfg)}",
        f"- Sampling: temperature {cfg.temperature}, at most {cfg.max_tokens} tokens, seed {cfg.seed}",
        f"- Verification: each program runs in the sandbox ({cfg.time_limit_s:g} s); the verifier checks its set with "
        "exact integer arithmetic",
        "",
    ]


def _process(rounds: list[dict], seconds: float) -> list[str]:
    attempts = [a for r in rounds for a in r["attempts"]]
    history = [r["best_score"] for r in rounds]
    lines = [
        "## Process",
        "",
        f"Initial score (best valid |C| after round 1): {history[0]}. "
        f"Final score (after round {len(history)}): {history[-1]}.",
        "",
        "Best |C| after each round: " + ", ".join(str(h) for h in history),
        "",
        f"Wall time: {seconds:.0f} s for {len(attempts)} replies.",
        "",
        "| round | sample | valid | abs(C) | seconds | verifier |",
        "|---|---|---|---|---|---|",
    ]
    for a in attempts:
        valid = "yes" if a["validity"] == 1.0 else "no"
        lines.append(
            f"| {a['round']} | {a['sample']} | {valid} | {a['score']} | {a['seconds']:.1f} | {_cell(a['message'])} |"
        )
    lines += ["", "### Example prompts", ""]
    for why, entry in example_prompts(rounds):
        roles = ", ".join(m["role"] for m in entry["messages"])
        lines += [
            f"Round {entry['round']}, {why}. The request carried {len(entry['messages'])} messages ({roles}); "
            "its last user message:",
            "",
            _fenced(entry["messages"][-1]["content"]),
            "",
            f"Best |C| after this round: {entry['best_score']}.",
            "",
        ]
    return lines


def _final_result(cfg, best: dict | None) -> list[str]:
    from trl_ext.rewards.kissing import KISSING_BOUNDS

    bounds = KISSING_BOUNDS.get(cfg.dimension)
    if best is None:
        return [
            "## Final Result",
            "",
            f"Final score: 0 for d = {cfg.dimension}. No valid configuration was found; program.py was not written.",
            "",
        ]
    d, score = cfg.dimension, best["score"]
    known = f" Known bounds quoted by NLPDL HW3: {bounds[0]} <= tau_{d} <= {bounds[1]}." if bounds else ""
    return [
        "## Final Result",
        "",
        f"Final score: |C| = {score} for d = {d}, so tau_{d} >= {score}.{known}",
        "",
        f"Best valid configuration: |C| = {best['score']} (round {best['round']}, sample {best['sample']}), in "
        "program.py.",
        "",
        f"Verifier: {_cell(best['message'], 300)}",
        "",
    ]


def _reflection(rounds: list[dict]) -> list[str]:
    attempts = [a for r in rounds for a in r["attempts"]]
    valid = sum(a["validity"] == 1.0 for a in attempts)
    per_round = ", ".join(f"{sum(a['validity'] == 1.0 for a in r['attempts'])}/{len(r['attempts'])}" for r in rounds)
    history = [r["best_score"] for r in rounds]
    gains = [
        f"round {r} ({history[r - 2]} -> {history[r - 1]})"
        for r in range(2, len(history) + 1)
        if history[r - 1] > history[r - 2]
    ]
    if len(history) == 1:
        moved = f"One round: the score is the best of {len(attempts)} samples."
    elif gains:
        moved = f"Round 1 reached {history[0]}; refinement raised it in {', '.join(gains)}."
    else:
        moved = f"Round 1 reached {history[0]}; no refinement round raised it."
    failures = Counter(failure_kind(a["message"]) for a in attempts if a["validity"] != 1.0)
    common = "; ".join(f"{kind} ({count})" for kind, count in failures.most_common(3)) or "none"
    return [
        "## Reflection",
        "",
        f"- Valid programs: {valid} of {len(attempts)} replies (per round: {per_round}).",
        f"- {moved}",
        f"- Most frequent failures: {common}.",
        "",
        "_Your reflection: what did you learn, and which part of the strategy was the most effective?_",
        "",
    ]


def write_report(path: Path, cfg, backend: str, rounds: list[dict], best: dict | None, seconds: float) -> None:
    """Write `report.md` from the run so far.

    Args:
        path: the file to write.
        cfg: the run's `DiscoveryConfig`.
        backend: the model's name as the backend gives it.
        rounds: `conversation_log.json`'s `rounds` (each with the messages sent, the attempts, the best score).
        best: the best valid attempt, or None.
        seconds: wall time so far.
    """
    lines = [f"# Kissing configurations in dimension {cfg.dimension}: discovery report", ""]
    lines += _methodology(cfg, backend)
    lines += _process(rounds, seconds)
    lines += _final_result(cfg, best)
    lines += _reflection(rounds)
    path.write_text("\n".join(lines))
