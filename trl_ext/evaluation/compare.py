"""Two models on the same problems: each problem's verdict for A and for B, the four outcomes, the questions where
they differ side by side.

A model is right on a problem when more than half of its n samples are correct (answer reward 1; with n = 1, its one
sample). Each problem then has one outcome: `both_right`, `both_wrong`, `only_a` (A right, B wrong) or `only_b`.
`compare_runs` reads two finished `trl-ext eval` outputs, checks that they scored the same problems with the same
sampling settings, and writes per budget: `comparison.json` (settings and counts), `comparison.jsonl` (every problem:
both verdicts, the outcome, one response of each) and `comparison.md` (the counts, then every problem where A and B
differ, their verdicts and responses side by side). Pure file work: no model, no torch.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

__all__ = ["OUTCOMES", "SAME_SETTINGS", "compare_records", "compare_runs", "format_comparison", "problem_verdicts"]

OUTCOMES = ("both_right", "both_wrong", "only_a", "only_b")
_OUTCOME_TEXT = {
    "both_right": "both right",
    "both_wrong": "both wrong",
    "only_a": "only A right",
    "only_b": "only B right",
}
# `EvalConfig` fields two runs must share to have scored the same problems with the same sampling.
SAME_SETTINGS = (
    "task", "data_file", "split", "prompt", "chat", "chat_template_kwargs", "max_tokens", "temperature", "top_p", "n",
    "seed", "limit", "reward", "stop", "min_tokens",
)  # fmt: skip
RULE = "a model is right on a problem when more than half of its n samples are correct (n = 1: its one sample)"


def problem_verdicts(records: list[dict], n: int) -> list[dict]:
    """One verdict per problem from one budget's records (problem-major, `n` per problem, as `generations.jsonl`).

    Returns:
        Per problem: `problem_index`, `prompt`, `ground_truth`, `correct` (samples with answer reward 1), `n`, `right`
        (`2 * correct > n`) and `shown`, the record that shows the verdict: the first correct sample when right, else
        the first wrong one.
    """
    if not records or len(records) % n:
        raise ValueError(f"{len(records)} records is not a positive multiple of n={n}")
    verdicts = []
    for start in range(0, len(records), n):
        samples = records[start : start + n]
        index = samples[0]["problem_index"]
        if any(r["problem_index"] != index for r in samples):
            raise ValueError(f"records {start}..{start + n - 1}: not the {n} samples of one problem")
        correct = sum(r["answer_reward"] >= 1 for r in samples)
        right = 2 * correct > n
        shown = next(r for r in samples if (r["answer_reward"] >= 1) == right)
        verdicts.append(
            {
                "problem_index": index,
                "prompt": samples[0]["prompt"],
                "ground_truth": samples[0]["ground_truth"],
                "correct": correct,
                "n": n,
                "right": right,
                "shown": shown,
            }
        )
    return verdicts


def _outcome(a_right: bool, b_right: bool) -> str:
    if a_right == b_right:
        return "both_right" if a_right else "both_wrong"
    return "only_a" if a_right else "only_b"


def _side(verdict: dict) -> dict:
    shown = verdict["shown"]
    return {
        "right": verdict["right"],
        "correct": verdict["correct"],
        "n": verdict["n"],
        "prompt": verdict["prompt"],
        "sample_index": shown["sample_index"],
        "response": shown["response"],
        "format_reward": shown["format_reward"],
        "answer_reward": shown["answer_reward"],
        "finish_reason": shown["finish_reason"],
    }


def compare_records(records_a: list[dict], records_b: list[dict], n: int, same_prompts: bool = True) -> dict:
    """Compare two models' scored records of the same problems at one budget.

    Args:
        records_a, records_b: `generations.jsonl` rows of A and of B (problem-major, `n` per problem).
        n: samples per problem.
        same_prompts: the prompt strings must match too (False when each model's chat template rendered them).

    Returns:
        `{"num_problems", "n", "accuracy_a", "accuracy_b", "right_a", "right_b", "counts": {outcome: count},
        "problems": [{"problem_index", "ground_truth", "outcome", "a": {...}, "b": {...}}]}`; accuracy is the mean
        answer reward over all samples, as in `summary.json`.

    Raises:
        ValueError: the two sets of records are not the same problems (count, order, ground truth, prompt), naming
            the first problem that differs.
    """
    verdicts_a, verdicts_b = problem_verdicts(records_a, n), problem_verdicts(records_b, n)
    if len(verdicts_a) != len(verdicts_b):
        raise ValueError(f"not the same problems: A has {len(verdicts_a)}, B has {len(verdicts_b)}")
    counts = dict.fromkeys(OUTCOMES, 0)
    problems = []
    for a, b in zip(verdicts_a, verdicts_b, strict=True):
        for key in ("problem_index", "ground_truth") + (("prompt",) if same_prompts else ()):
            if a[key] != b[key]:
                raise ValueError(
                    f"problem {a['problem_index']}: not the same problem in A and B ({key} {a[key]!r} != {b[key]!r})"
                )
        outcome = _outcome(a["right"], b["right"])
        counts[outcome] += 1
        problems.append(
            {
                "problem_index": a["problem_index"],
                "ground_truth": a["ground_truth"],
                "outcome": outcome,
                "a": _side(a),
                "b": _side(b),
            }
        )
    return {
        "num_problems": len(problems),
        "n": n,
        "accuracy_a": sum(r["answer_reward"] for r in records_a) / len(records_a),
        "accuracy_b": sum(r["answer_reward"] for r in records_b) / len(records_b),
        "right_a": sum(v["right"] for v in verdicts_a),
        "right_b": sum(v["right"] for v in verdicts_b),
        "counts": counts,
        "problems": problems,
    }


def _read_run(run: Path, role: str) -> dict:
    path = Path(run) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"run {role} {run}: no summary.json (not a `trl-ext eval` output)")
    report = json.loads(path.read_text(encoding="utf-8"))
    if "config" not in report or "results" not in report:
        raise ValueError(f"run {role} {path}: no config / results (not a `trl-ext eval` summary)")
    return report


def compare_runs(run_a: str | Path, run_b: str | Path, output_dir: str | Path) -> dict:
    """Compare two finished `trl-ext eval` outputs and write `comparison.{json,jsonl,md}` to `output_dir`.

    Args:
        run_a, run_b: the output folders of the two evaluations (each with `summary.json` and `L<budget>/`).
        output_dir: where the comparison goes.

    Returns:
        The `comparison.json` content: `{"a": {"model", "run"}, "b": ..., "settings", "rule", "results": {budget:
        counts and accuracies}}`.

    Raises:
        ValueError: a setting of `SAME_SETTINGS` differs (named, with both values), or the problems differ.
    """
    report_a, report_b = _read_run(run_a, "A"), _read_run(run_b, "B")
    cfg_a, cfg_b = report_a["config"], report_b["config"]
    for name in SAME_SETTINGS:
        if cfg_a.get(name) != cfg_b.get(name):
            raise ValueError(
                f"{name}: A ({run_a}) has {cfg_a.get(name)!r}, B ({run_b}) has {cfg_b.get(name)!r}; compare runs "
                "that scored the same problems with the same sampling"
            )
    rewards = [{r.get("reward_function") for r in report["results"].values()} for report in (report_a, report_b)]
    if rewards[0] != rewards[1]:
        raise ValueError(f"reward: A ({run_a}) scored with {rewards[0]}, B ({run_b}) with {rewards[1]}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results, problems = {}, {}
    for budget in cfg_a["max_tokens"]:
        records = []
        for run in (run_a, run_b):
            with open(Path(run) / f"L{budget}" / "generations.jsonl", encoding="utf-8") as f:
                records.append([json.loads(line) for line in f if line.strip()])
        try:
            compared = compare_records(*records, n=cfg_a["n"], same_prompts=not cfg_a["chat"])
        except ValueError as err:
            raise ValueError(f"L{budget}: {err}") from None
        problems[str(budget)] = compared.pop("problems")
        results[str(budget)] = compared
    comparison = {
        "a": {"model": cfg_a["model"], "run": str(run_a)},
        "b": {"model": cfg_b["model"], "run": str(run_b)},
        # the reward as scored (the config's is None when the task and prompt chose it)
        "settings": {**{name: cfg_a.get(name) for name in SAME_SETTINGS}, "reward": ", ".join(sorted(rewards[0]))},
        "rule": RULE,
        "results": results,
    }
    (out / "comparison.json").write_text(json.dumps(comparison, indent=2, ensure_ascii=False))
    with open(out / "comparison.jsonl", "w", encoding="utf-8") as f:
        for budget, per_budget in problems.items():
            for row in per_budget:
                f.write(json.dumps({"max_tokens": int(budget), **row}, ensure_ascii=False) + "\n")
    (out / "comparison.md").write_text(format_comparison(comparison, problems))
    return comparison


def _cell(text: str) -> str:
    """Text in a Markdown table cell, shown as written: HTML and Markdown marks escaped, lines joined by <br>."""
    text = html.escape(str(text), quote=False).replace("|", "&#124;")
    text = re.sub(r"([\\`*_\[\]])", r"\\\1", text)
    return "<br>".join(text.splitlines()) or " "


def _fenced(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _verdict(side: dict) -> str:
    return f"{'right' if side['right'] else 'wrong'} ({side['correct']} of {side['n']} samples correct)"


def format_comparison(comparison: dict, problems: dict[str, list[dict]]) -> str:
    """`comparison.md`: the two models and their shared settings, the four outcomes per budget, then every problem
    where A and B differ, verdicts and responses side by side (the response shown is the first sample that agrees
    with the verdict)."""
    a, b, s = comparison["a"], comparison["b"], comparison["settings"]
    sampling = f"n={s['n']}, temperature {s['temperature']}, top-p {s['top_p']}, seed {s['seed']}"
    problems_text = f"{s['task']} split {s['split']!r}" + (f", first {s['limit']}" if s["limit"] else "")
    if s["data_file"]:
        problems_text += f" of {s['data_file']}"
    lines = [
        "# Model A against model B on the same problems",
        "",
        f"- A: `{a['model']}` (evaluation in `{a['run']}`)",
        f"- B: `{b['model']}` (evaluation in `{b['run']}`)",
        f"- Problems: {problems_text}; prompt {s['prompt'] or 'the task default'}"
        + (" in the chat template" if s["chat"] else "")
        + f"; reward {s['reward']}",
        f"- Sampling, the same for both: {sampling}",
        f"- Verdict: {comparison['rule']}.",
        "",
    ]
    for budget, result in comparison["results"].items():
        counts = result["counts"]
        lines += [
            f"## Budget {budget} tokens",
            "",
            "| outcome | problems |",
            "|---|---|",
            *(f"| {_OUTCOME_TEXT[o]} | {counts[o]} |" for o in OUTCOMES),
            f"| total | {result['num_problems']} |",
            "",
            f"Right: A {result['right_a']}, B {result['right_b']} of {result['num_problems']} problems. Accuracy "
            f"(mean answer reward over all samples): A {result['accuracy_a']:.4f}, B {result['accuracy_b']:.4f}.",
            "",
        ]
        differing = [p for p in problems[budget] if p["outcome"] in ("only_a", "only_b")]
        if not differing:
            lines += ["A and B agree on every problem.", ""]
        for p in differing:
            pa, pb = p["a"], p["b"]
            lines += [
                f"### Problem {p['problem_index']}: {_OUTCOME_TEXT[p['outcome']]}",
                "",
                f"Ground truth: `{p['ground_truth']}`",
                "",
                f"| | A: {_cell(Path(a['model']).name)} | B: {_cell(Path(b['model']).name)} |",
                "|---|---|---|",
                f"| verdict | {_verdict(pa)} | {_verdict(pb)} |",
                f"| response | {_cell(pa['response'])} | {_cell(pb['response'])} |",
                f"| sample, finish | {pa['sample_index']}, {pa['finish_reason']} | "
                f"{pb['sample_index']}, {pb['finish_reason']} |",
                "",
                "<details><summary>Prompt</summary>",
                "",
                _fenced(pa["prompt"])
                if pa["prompt"] == pb["prompt"]
                else f"A:\n\n{_fenced(pa['prompt'])}\n\nB:\n\n{_fenced(pb['prompt'])}",
                "",
                "</details>",
                "",
            ]
    return "\n".join(lines)
