"""The verifier-guided discovery loop: Best@N sampling and iterative refinement with the verifier's message.

Round 1 sends the system message and the task prompt and samples N programs; each runs in the sandbox and goes
through the exact verifier (`trl_ext.rewards.kissing`). Each round then picks its best attempt (the largest valid
|C|, else an attempt whose program ran, else any) and adds one exchange to the conversation: that attempt's reply,
then a user turn in NLPDL HW3's words (section 7.4): its success prompt with the score when the attempt is
valid, else its failure prompt with the verifier's exact message (`Minimum squared distance 36 < maximum squared
norm 40: ...`). Every later round sends the system message, the task prompt and the conversation so far (all of it,
or its last `history_window` exchanges), and samples N again: the model sees what it tried and what the verifier
said each time, as the assignment's loop "using your conversation history" does. N > 1 with one round is Best@N;
N = 1 with several rounds is pure refinement.

Written to `output_dir` after every round: `program.py` (the best valid program), `conversation_log.json` (every
request as sent, every reply, program and verdict) and `report.md` (`trl_ext.discover.report`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trl_ext.discover.report import write_report
from trl_ext.tasks.kissing import ANSWER_FORMAT, kissing_prompt

__all__ = [
    "FAILURE_PROMPT",
    "SUCCESS_PROMPT",
    "SYSTEM_PROMPT",
    "DiscoveryConfig",
    "conversation",
    "feedback_prompt",
    "run_discovery",
]

# Ours: the assignment gives no system message. `--system-prompt` / `--system-prompt-file` replace it ("" sends none).
SYSTEM_PROMPT = "You are an expert in discrete geometry and a careful Python programmer."

# NLPDL HW3's refinement turns (section 7.4) in its own words: after a failed attempt, with the verifier's exact
# message; after a valid one, with its score. Each ends with `ANSWER_FORMAT`, as the task prompt does (the program is
# read from a fenced block). Pinned to the text typed from the assignment
# (tests/data/course_prompts/nlpdl_hw3_kissing_*.txt).
FAILURE_PROMPT = (
    "Your previous attempt failed with this error: `{message}`. This means the condition was violated. Please "
    "analyze your set of vectors and propose a new, corrected set that fixes this error."
)
SUCCESS_PROMPT = (
    "Your previous set of vectors was valid and achieved a score of {score}. This is great! Now, can you try to add "
    "more vectors to this set while still satisfying the condition? For example, can you find a new vector `z` such "
    "that its norm is no more than the current max norm, and its distance to all other vectors is at least that max "
    "norm?"
)


def feedback_prompt(attempt: dict) -> str:
    """The user turn after `attempt`: the course's success prompt for a valid one, else its failure prompt with the
    verifier's (or the extraction step's) message."""
    if attempt["validity"] == 1.0:
        text = SUCCESS_PROMPT.format(score=attempt["score"])
    else:
        text = FAILURE_PROMPT.format(message=attempt["message"])
    return f"{text}\n\n{ANSWER_FORMAT}"


@dataclass
class DiscoveryConfig:
    """Settings of one discovery run.

    Args:
        samples: programs sampled per round (N of Best@N).
        rounds: rounds; each round after the first feeds the verifier's message back.
        temperature, max_tokens, seed: sampling.
        time_limit_s: sandbox wall-clock limit per program.
        dimension: dimension of the vectors.
        output_dir: where program.py, conversation_log.json and report.md go.
        workers: programs checked at once.
        system_prompt: the system message (default `SYSTEM_PROMPT`; "" sends none).
        task_prompt: the first user message (default: `trl_ext.tasks.kissing.kissing_prompt`, the GRPO recipe's).
        history_window: how many of the latest exchanges (a round's chosen reply and the feedback on it) each
            refinement request carries after the task prompt; None: all of them (the whole conversation). 1 sends
            only the previous round's.
    """

    samples: int = 4
    rounds: int = 3
    temperature: float = 1.0
    max_tokens: int = 4096
    seed: int = 0
    time_limit_s: float = 10.0
    dimension: int = 11
    output_dir: str = "discover_out"
    workers: int = 4
    system_prompt: str = SYSTEM_PROMPT
    task_prompt: str | None = field(default=None)
    history_window: int | None = None

    def __post_init__(self) -> None:
        for name in ("samples", "rounds", "max_tokens", "dimension", "workers", "history_window"):
            value = getattr(self, name)
            if name == "history_window" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.system_prompt, str):
            raise ValueError(f"system_prompt must be a string, got {type(self.system_prompt).__name__}")
        if self.system_prompt and not self.system_prompt.strip():
            raise ValueError('system_prompt is blank (only whitespace); give a message, or "" to send none')
        if self.task_prompt is not None and (not isinstance(self.task_prompt, str) or not self.task_prompt.strip()):
            raise ValueError(f"task_prompt is empty: {self.task_prompt!r}; give the first user message")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be > 0, got {self.time_limit_s}")
        if self.task_prompt is None:
            self.task_prompt = kissing_prompt(self.dimension)


def _rank(attempt: dict) -> tuple:
    """Best attempt first: valid and largest, then a program that ran (its verdict is the most useful feedback)."""
    return (attempt["validity"], attempt["score"], attempt["program"] is not None, -attempt["sample"])


def _strip_thinking(reply: str) -> str:
    # Chat templates of reasoning models drop earlier turns' thinking anyway; sending it back only costs context.
    return reply.rsplit("</think>", 1)[1].strip() if "</think>" in reply else reply


def conversation(base: list[dict], exchanges: list[tuple[str, str]], window: int | None) -> list[dict]:
    """The messages of one request: `base` (system message, task prompt), then the last `window` exchanges (all when
    None), each an assistant reply followed by the user turn that answered it."""
    if window is not None and window < 1:
        raise ValueError(f"history_window must be None (all) or >= 1, got {window}")
    messages = list(base)
    for reply, feedback in exchanges if window is None else exchanges[-window:]:
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": feedback}]
    return messages


def _score_replies(replies: list[str], cfg: DiscoveryConfig, round_index: int) -> list[dict]:
    from trl_ext.rewards.kissing import kissing_score, score_kissing_completion
    from trl_ext.rewards.sandbox import SandboxLimits

    limits = SandboxLimits(time_limit_s=cfg.time_limit_s)

    def one(item: tuple[int, str]) -> dict:
        sample, reply = item
        start = time.monotonic()
        result = score_kissing_completion(reply, cfg.dimension, limits=limits)
        return {
            "round": round_index,
            "sample": sample,
            "reply": reply,
            "program": result["program"],
            "validity": result["validity"],
            "num_points": result["num_points"],
            "score": kissing_score(result),
            "message": result["message"],
            "seconds": round(time.monotonic() - start, 3),
        }

    with ThreadPoolExecutor(max_workers=cfg.workers) as pool:
        return list(pool.map(one, enumerate(replies, start=1)))


def run_discovery(backend, cfg: DiscoveryConfig, progress: Callable[[str], None] = print) -> dict:
    """Run the loop against `backend` (see `trl_ext.discover.backends`) and write the three files.

    Returns:
        `{"best": the best valid attempt or None, "best_score": int, "history": best score after each round,
        "attempts": every attempt, "output_dir": str}`.
    """
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = ([{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []) + [
        {"role": "user", "content": cfg.task_prompt}
    ]
    exchanges: list[tuple[str, str]] = []
    log: dict = {"config": asdict(cfg), "backend": backend.name, "rounds": []}
    attempts: list[dict] = []
    best: dict | None = None
    history: list[int] = []
    started = time.monotonic()
    for r in range(1, cfg.rounds + 1):
        messages = conversation(base, exchanges, cfg.history_window)
        progress(f"round {r}/{cfg.rounds}: sampling {cfg.samples} program(s) from {backend.name}")
        t0 = time.monotonic()
        replies = backend.chat(messages, cfg.samples, cfg.temperature, cfg.max_tokens, cfg.seed + 1000 * r)
        generated = time.monotonic() - t0
        scored = _score_replies(replies, cfg, r)
        for a in scored:
            attempts.append(a)
            verdict = f"valid, |C| = {a['num_points']}" if a["validity"] == 1.0 else a["message"].split("\n")[0][:100]
            if a["validity"] == 1.0 and (best is None or a["score"] > best["score"]):
                best = a
                (out / "program.py").write_text(a["program"])
            best_score = best["score"] if best else 0
            where = f"round {r} sample {a['sample']}/{cfg.samples}"
            progress(f"  {where}: {verdict} ({a['seconds']:.1f} s; best {best_score})")
        history.append(best["score"] if best else 0)
        chosen = max(scored, key=_rank)
        feedback = feedback_prompt(chosen)
        log["rounds"].append(
            {
                "round": r,
                "messages": messages,
                "generation_seconds": round(generated, 3),
                "attempts": scored,
                "chosen_sample": chosen["sample"],
                "feedback": feedback,
                "best_score": history[-1],
            }
        )
        exchanges.append((_strip_thinking(chosen["reply"]), feedback))
        log["best"] = None if best is None else {k: best[k] for k in ("round", "sample", "score", "message")}
        log["history"] = history
        (out / "conversation_log.json").write_text(json.dumps(log, indent=1))
        write_report(out / "report.md", cfg, backend.name, log["rounds"], best, time.monotonic() - started)
    progress(f"best |C| = {history[-1]}; wrote {out / 'conversation_log.json'} and {out / 'report.md'}")
    return {"best": best, "best_score": history[-1], "history": history, "attempts": attempts, "output_dir": str(out)}
