"""The CPU testbed's GRPO throughput, old and new side by side in one run: rollouts through transformers' `generate`
(`static_cache_generation: false`) against `trl_ext.static_cache` (`recipes/countdown/cpu_demo.yaml`'s setting), and
the recipe path's CPU per GRPO step against the demo's.

Everything starts from the testbed's SFT warm start (`--model`; built into `WORK/warm_start` when not given) on one
torch thread.

1. **Rollouts** (`rollouts`). One `AblationGRPOTrainer` built from recipes/countdown/cpu_demo.yaml as the recipe
   builds it; each round takes the next 16 training problems x 8 (one rollout batch, 128 completions) and samples it
   through the trainer's own `_generate_single_turn` twice, once per arm (`generate`: `static_cache_generation`
   off, TRL's transformers path; `static_cache`: on), in ABBA order. Reported per arm: completions, CPU seconds of
   the generation calls (this process, `time.process_time`), `completions_per_cpu_s`; and `speedup` = the static
   cache's completions per CPU-second over `generate`'s (goal >= 2).
2. **Greedy** (`greedy`). Every held-out problem (512) and every training prompt the rounds used, completed greedily
   by `generate` (`do_sample=False`, left padding, batches of 128 as the rollouts) and by the static cache
   (temperature 0): the number of completions that differ (goal 0).
3. **Sampled** (`sampled`). The two arms' rollouts of part 1 are independent draws (each arm seeded apart) from the
   same prompts, the same number of each; if the loops sample the same distribution, the pooled counts below are
   equal in distribution, which Pearson's chi-square test of homogeneity (`scipy.stats.chi2_contingency`) checks on
   the 2 x k table of each: the response length (tokens through EOS), the training reward (1 correct, 0.1 tagged
   but wrong, 0), and the token at each of the first `--positions` positions (among the completions that reach
   it). Categories with fewer than 10 draws over both arms are merged. The stratified design (equal draws per
   prompt in both arms) makes the test conservative; `identical_share` is the share of rows where both arms drew
   the same completion (near 1 would mean the draws are not independent). `min_p_bonferroni` = the smallest p
   times the number of tests (capped at 1): above 0.01 means no test found a difference (`same_distribution`).
4. **Recipe path against the demo's** (`paths`, `--steps` GRPO steps each). Two processes from the same warm start
   at the same settings: `recipes/countdown.py --config recipes/countdown/cpu_demo.yaml` (its validation as
   configured: every 40 steps and at the start, greedy plus 4 samples per held-out problem) and
   `recipes/countdown.py --demo --no-control` with cpu_demo.yaml's completion budget (32; its scoring of the start
   and of the result, and its 10-point greedy curve). Reported: each process's CPU seconds (user + system) and per
   GRPO step, the validation's share where the run logs it, and `ratio` = recipe / demo per step (goal <= 1.1).

The machine's load is recorded (`load`, benchmarks/_load.py); a loaded machine's figures are written only with
`--loaded` and marked so. Writes benchmarks/results/throughput.json (`--out`).

    python benchmarks/bench_throughput.py                   # all four parts (a few CPU minutes)
    python benchmarks/bench_throughput.py --skip-paths      # parts 1-3 only
    python benchmarks/bench_throughput.py --quick --loaded  # a dry run at toy size (writes WORK/throughput.json)
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _load import MachineLoad, add_load_argument, refuse_if_loaded  # noqa: E402
from _runs import child_env  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "throughput.json"
RECIPE = "recipes/countdown/cpu_demo.yaml"
ARMS = ("generate", "static_cache")
# Categories with fewer draws than this (both arms together) are merged, so every expected count is large enough for
# the chi-square approximation.
MIN_CATEGORY = 10
ALPHA = 0.01
SEEDS = {"generate": 1000, "static_cache": 500_000}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="", help="The warm start (default: built into WORK/warm_start if absent).")
    p.add_argument("--rounds", type=int, default=40, help="Rollout batches per arm (128 completions each).")
    p.add_argument("--positions", type=int, default=8, help="Token positions compared in the sampled test.")
    p.add_argument("--steps", type=int, default=160, help="GRPO steps of each path run (cpu_demo.yaml's 160).")
    p.add_argument("--skip-paths", action="store_true", help="Leave out part 4 (the two training runs).")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench_throughput"), help="Run folder.")
    p.add_argument("--out", default="", help="Result file (default benchmarks/results/throughput.json).")
    p.add_argument("--quick", action="store_true", help="Toy size: every part, nothing worth quoting.")
    add_load_argument(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 4, 4
    args.out = args.out or str(Path(args.work) / "throughput.json" if args.quick else RESULTS)
    if args.rounds < 2 or args.rounds % 2:
        p.error(f"--rounds={args.rounds}: an even number >= 2 (the arms alternate ABBA)")
    return args


def warm_start(args) -> str:
    from trl_ext.testbed.warm_start import ensure_warm_start

    if args.model:
        return args.model
    path = Path(args.work) / "warm_start"
    ensure_warm_start(path)
    return str(path)


def build_trainer(model_dir: str, work: Path):
    """An `AblationGRPOTrainer` as `run_grpo_recipe` builds it from cpu_demo.yaml, and the training problems."""
    from trl_ext.recipes.demo_warm_start import load_demo_datasets
    from trl_ext.recipes.parsing import adapt_generation_kwargs, parse_recipe_args
    from trl_ext.recipes.training import build_grpo_trainer
    from trl_ext.rewards import get_reward_funcs

    argv = ["--config", str(ROOT / RECIPE), "--model_name_or_path", model_dir, "--output_dir", str(work / "rollouts")]
    script_args, training_args, model_args = parse_recipe_args("countdown", argv)
    adapt_generation_kwargs(training_args)
    train_dataset, held_out = load_demo_datasets(script_args)
    training_args.eval_strategy, training_args.eval_on_start = "no", False
    rewards = get_reward_funcs(script_args.reward_funcs, training_args)
    trainer = build_grpo_trainer(script_args, training_args, model_args, rewards, train_dataset, None)
    return trainer, train_dataset, held_out


# ----------------------------------------------------------------------------------------------------- parts 1 and 3


def sample_rollouts(trainer, dataset, rounds: int) -> dict:
    """Part 1: `rounds` rollout batches per arm through the trainer's generation, ABBA; the completions and CPU."""
    import torch

    group = trainer.num_generations
    prompts_per_round = trainer.args.generation_batch_size // group
    out = {arm: {"completions": [], "prompts": [], "cpu_s": 0.0} for arm in ARMS}
    for r in range(rounds):
        rows = [dataset[(r * prompts_per_round + i) % len(dataset)] for i in range(prompts_per_round)]
        prompts = [row["prompt"] for row in rows for _ in range(group)]
        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
        order = ARMS if r % 4 in (0, 3) else ARMS[::-1]
        for arm in order:
            trainer.args.static_cache_generation = arm == "static_cache"
            # Other seeds per arm: the two loops may draw alike from one seed, and the test needs independent draws.
            torch.manual_seed(SEEDS[arm] + r)
            started = time.process_time()
            completion_ids, _ = trainer._generate_single_turn(prompt_ids, None, {}, group)
            out[arm]["cpu_s"] += time.process_time() - started
            out[arm]["completions"] += [list(c) for c in completion_ids]
            out[arm]["prompts"] += [row for row in rows for _ in range(group)]
    trainer.args.static_cache_generation = True
    return out


def _merge_rare(counts: list[dict]) -> tuple[list[str], list[list[int]]]:
    """The 2 x k table of two arms' category counts, categories under `MIN_CATEGORY` draws merged into one."""
    keys = sorted(set(counts[0]) | set(counts[1]), key=str)
    common = [k for k in keys if counts[0].get(k, 0) + counts[1].get(k, 0) >= MIN_CATEGORY]
    rare = [k for k in keys if k not in common]
    table = [[c.get(k, 0) for k in common] + ([sum(c.get(k, 0) for k in rare)] if rare else []) for c in counts]
    return [str(k) for k in common] + (["other"] if rare else []), table


def homogeneity(samples: list[list], name: str) -> dict:
    """Pearson's chi-square test that two arms' draws (`samples[arm]`, hashable categories) share one distribution."""
    from collections import Counter

    from scipy.stats import chi2_contingency

    counts = [Counter(s) for s in samples]
    labels, table = _merge_rare(counts)
    if len(labels) < 2:  # one category only: the distributions agree trivially
        return {"test": name, "categories": labels, "counts": table, "p": 1.0}
    chi2, p, dof, _ = chi2_contingency(table, correction=False)
    return {"test": name, "categories": labels, "counts": table, "chi2": float(chi2), "dof": int(dof), "p": float(p)}


def sampled_tests(rollouts: dict, tokenizer, positions: int) -> dict:
    """Part 3: the homogeneity tests on lengths, rewards and the first `positions` tokens."""
    from trl_ext.rewards import countdown_reward_components

    def reward(row: dict, ids: list[int]) -> float:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return countdown_reward_components(text, row, require_all=True)["reward"]

    arms = [rollouts[arm] for arm in ARMS]
    tests = [homogeneity([[len(c) for c in a["completions"]] for a in arms], "length")]
    rewards = [[reward(row, c) for row, c in zip(a["prompts"], a["completions"], strict=True)] for a in arms]
    tests.append(homogeneity(rewards, "reward"))
    for t in range(positions):
        tests.append(homogeneity([[c[t] for c in a["completions"] if len(c) > t] for a in arms], f"token_{t}"))
    smallest = min(test["p"] for test in tests)
    adjusted = min(1.0, smallest * len(tests))
    pairs = zip(arms[0]["completions"], arms[1]["completions"], strict=True)
    return {
        "draws_per_arm": len(arms[0]["completions"]),
        "identical_share": _mean([a == b for a, b in pairs]),
        "mean_length": {arm: _mean([len(c) for c in rollouts[arm]["completions"]]) for arm in ARMS},
        "mean_reward": {arm: _mean(r) for arm, r in zip(ARMS, rewards, strict=True)},
        "tests": tests,
        "min_p_bonferroni": adjusted,
        "alpha": ALPHA,
        "same_distribution": adjusted > ALPHA,
    }


def _mean(xs) -> float:
    return sum(xs) / len(xs)


# ------------------------------------------------------------------------------------------------------------ part 2


def greedy_agreement(model, tokenizer, prompts: list[str], budget: int, eos: list[int], batch: int = 128) -> dict:
    """Part 2: greedy completions of `prompts` by `generate` and by the static cache; the rows that differ."""
    import torch
    from transformers import GenerationConfig

    from trl_ext.static_cache import sample_static_cache

    config = GenerationConfig(
        max_new_tokens=budget, do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
    )
    differ = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False, padding_side="left")
        with torch.no_grad():
            out = model.generate(**enc, generation_config=config)[:, enc["input_ids"].shape[1] :].tolist()
        reference = [next((row[: i + 1] for i, t in enumerate(row) if t in eos), row) for row in out]
        ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in chunk]
        with torch.no_grad():
            got = sample_static_cache(model, ids, budget, eos, tokenizer.pad_token_id, temperature=0).token_ids
        differ += [
            {"prompt": p, "generate": tokenizer.decode(a), "static_cache": tokenizer.decode(b)}
            for p, a, b in zip(chunk, reference, got, strict=True)
            if a != b
        ]
    return {"completions": len(prompts), "differ": len(differ), "examples": differ[:5], "identical": not differ}


# ------------------------------------------------------------------------------------------------------------ part 4


def run_path(name: str, argv: list[str], work: Path, steps: int) -> dict:
    """One training process (`python recipes/countdown.py ARGV`): its CPU seconds, wall seconds and per step."""
    log = work / f"{name}.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "recipes" / "countdown.py"), *argv]
    print("$", " ".join(cmd), f"> {log}", flush=True)
    with open(log, "w") as out:
        proc = subprocess.run(cmd, env=child_env(), stdout=out, stderr=subprocess.STDOUT, cwd=work)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{name} failed ({proc.returncode}); last lines of {log}:\n{tail}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "steps": steps, "cpu_s_per_step": cpu / steps}


def compare_paths(model_dir: str, work: Path, steps: int) -> dict:
    """Part 4: the recipe's run and the demo's GRPO phase at the same settings; CPU per GRPO step of each."""
    from trl_ext.recipes.parsing import parse_recipe_args

    _, training_args, _ = parse_recipe_args("countdown", ["--config", str(ROOT / RECIPE), "--output_dir", "x"])
    budget = training_args.max_completion_length
    model = str(Path(model_dir).resolve())
    recipe_dir, demo_dir = work / "recipe_run", work / "demo_run"
    for folder in (recipe_dir, demo_dir):  # a fresh run each time (the recipe would resume from a checkpoint)
        shutil.rmtree(folder, ignore_errors=True)
    recipe = run_path(
        "recipe",
        ["--config", str(ROOT / RECIPE), "--model_name_or_path", model, "--output_dir", str(recipe_dir),
         "--n_grpo_steps", str(steps)],
        work, steps,
    )  # fmt: skip
    history = json.loads((recipe_dir / "trainer_state.json").read_text())["log_history"]
    validation = sum(h.get("heldout/cpu_seconds", 0.0) for h in history)
    recipe.update(validation_cpu_s=round(validation, 2), validations=sum("heldout/cpu_seconds" in h for h in history))
    demo = run_path(
        "demo",
        ["--demo", "--init_model", model, "--grpo_steps", str(steps), "--max_completion_length", str(budget),
         "--no-control", "--no-wandb", "--threads", "1", "--output_dir", str(demo_dir)],
        work, steps,
    )  # fmt: skip
    metrics = json.loads((demo_dir / "metrics.json").read_text())
    clock = metrics["arms"]["grpo"]["clock"]
    demo.update(train_cpu_s=clock["train_cpu_s"], curve_cpu_s=clock.get("curve_cpu_s"))
    return {
        "recipe": recipe,
        "demo": demo,
        "ratio": recipe["cpu_s_per_step"] / demo["cpu_s_per_step"],
        "goal_ratio_at_most": 1.1,
    }


# ---------------------------------------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    import torch

    args = parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    model_dir = warm_start(args)  # before the measurement: building it is not part of what is measured
    load = MachineLoad()
    trainer, dataset, held_out = build_trainer(model_dir, work)
    tokenizer, model = trainer.processing_class, trainer.model
    rollouts = sample_rollouts(trainer, dataset, args.rounds)
    speed = {
        arm: {
            "completions": len(r["completions"]),
            "cpu_s": round(r["cpu_s"], 3),
            "completions_per_cpu_s": len(r["completions"]) / r["cpu_s"],
        }
        for arm, r in rollouts.items()
    }
    speedup = speed["static_cache"]["completions_per_cpu_s"] / speed["generate"]["completions_per_cpu_s"]
    print(f"rollouts: {json.dumps(speed)}; speedup {speedup:.2f}", flush=True)
    sampled = sampled_tests(rollouts, tokenizer, args.positions)
    print(f"sampled: min p (Bonferroni) {sampled['min_p_bonferroni']:.3g}", flush=True)
    from trl_ext.tasks import compact_prompt

    used = {tuple(row["nums"]) + (row["target"],): row for row in rollouts["generate"]["prompts"]}
    prompts = [compact_prompt(p["nums"], p["target"]) for p in [*held_out, *used.values()]]
    budget = trainer.max_completion_length
    model.eval()
    greedy = greedy_agreement(model, tokenizer, prompts, budget, list(trainer.eos_token_ids))
    print(f"greedy: {greedy['differ']} of {greedy['completions']} differ", flush=True)
    del trainer, model
    paths = None if args.skip_paths else compare_paths(model_dir, work, args.steps)
    if paths:
        print(f"paths: recipe / demo CPU per step {paths['ratio']:.3f}", flush=True)
    load.stop()
    result = {
        "what": "CPU testbed rollouts: transformers' generate vs trl_ext.static_cache; recipe vs demo CPU per step",
        "recipe": RECIPE,
        "model": model_dir,
        "rounds": args.rounds,
        "completions_per_round": trainer_batch(rollouts, args.rounds),
        "completion_budget": budget,
        "rollouts": speed,
        "speedup": speedup,
        "goal_speedup_at_least": 2.0,
        "greedy": greedy,
        "sampled": sampled,
        "paths": paths,
        "quick": args.quick,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "torch": torch.__version__},
        "torch_threads": 1,
        "load": load.record(),
    }
    refuse_if_loaded(result["load"], args.loaded or args.quick, args.out)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} (load: {json.dumps(result['load'])})")
    return result


def trainer_batch(rollouts: dict, rounds: int) -> int:
    return len(rollouts["generate"]["completions"]) // rounds


if __name__ == "__main__":
    main()
