"""The testbed's problems: fixed held-out set, labelled / unlabelled training split, SFT and GRPO rows."""

from __future__ import annotations

import random

# The held-out problems are fixed up front, independent of the run's seed, so every run is scored on the same set.
EVAL_SEED = 12345
# Characters of the compact Countdown format; the tags are added tokens of `build_char_tokenizer`.
DEMO_CHARS = list("0123456789+-*/() [],>:=")


def problem_key(problem: dict) -> tuple[tuple[int, ...], int]:
    """The identity of a problem for train / held-out disjointness: (sorted numbers, target)."""
    from trl_ext.tasks import countdown_key

    return countdown_key(problem["nums"], problem["target"])


def make_splits(cfg) -> tuple[list[dict], list[dict]]:
    """(train, held_out) problem lists of a `TestbedConfig`; held-out is fixed by `EVAL_SEED`, train (drawn with
    `problem_seed`, else `seed`) excludes its keys."""
    from trl_ext.tasks import make_countdown_problems

    kwargs = dict(num_count=(3,), max_number=cfg.max_number, max_target=cfg.max_target)
    held_out = make_countdown_problems(cfg.num_eval_problems, EVAL_SEED, **kwargs)
    exclude = {problem_key(p) for p in held_out}
    seed = cfg.seed if cfg.problem_seed == -1 else cfg.problem_seed
    train = make_countdown_problems(cfg.num_train_problems, 1000 + seed, exclude=exclude, **kwargs)
    return train, held_out


def split_labelled(train: list[dict], num_labelled: int) -> tuple[list[dict], list[dict]]:
    """(labelled, unlabelled): the first `num_labelled` training problems keep their solutions, the rest lose them.

    The generator draws problems independently, so the first ones are a random sample; the unlabelled rows keep
    only `nums` and `target`, all the verifier needs.
    """
    labelled = train[:num_labelled]
    unlabelled = [{"nums": p["nums"], "target": p["target"]} for p in train[num_labelled:]]
    return labelled, unlabelled


def sft_dataset(
    problems: list[dict], num_rows: int, all_solutions: bool, seed: int, working_dead_ends: int | None = None
):
    """Prompt-completion rows for `SFTTrainer`; the completion is a solution in answer tags.

    With `all_solutions`: `num_rows` rows, cycling through `problems` in passes, each pass drawing every problem's
    solution afresh from all its integer-intermediate expressions that use every number (`countdown_solutions`).
    Otherwise one row per problem with the solver's solution (the trainer's epochs repeat them).
    With `working_dead_ends` (not None): `num_rows` rows in passes, each a worked search drawn afresh
    (`countdown_working` with 0 to `working_dead_ends` dead ends, uniformly) written before its answer.
    """
    from datasets import Dataset

    from trl_ext.tasks import compact_completion, compact_prompt, countdown_solutions, countdown_working

    def row(p: dict, solution: str, steps: list[str] | tuple = ()) -> dict:
        return {"prompt": compact_prompt(p["nums"], p["target"]), "completion": compact_completion(solution, steps)}

    def worked(p: dict, rng: random.Random) -> dict:
        steps, expression = countdown_working(p["nums"], p["target"], rng, rng.randint(0, working_dead_ends))
        return row(p, expression, steps)

    if working_dead_ends is None and not all_solutions:
        return Dataset.from_list([row(p, p["solution"]) for p in problems])
    rng = random.Random(seed)
    rows = []
    while len(rows) < num_rows:
        for p in problems[: num_rows - len(rows)]:
            if working_dead_ends is not None:
                rows.append(worked(p, rng))
            else:
                rows.append(row(p, rng.choice(countdown_solutions(p["nums"], p["target"]))))
    return Dataset.from_list(rows)


def grpo_dataset(problems: list[dict]):
    """Prompt rows plus the `nums` / `target` columns the Countdown reward reads (no solutions)."""
    from datasets import Dataset

    from trl_ext.tasks import compact_prompt

    return Dataset.from_list(
        [
            {"prompt": compact_prompt(p["nums"], p["target"]), "nums": list(p["nums"]), "target": p["target"]}
            for p in problems
        ]
    )
