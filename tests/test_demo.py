"""The embedded default (`trl_ext.demo`) in a reduced size: GRPO on unlabelled problems beats more SFT on the
labelled ones, and what the run writes is true."""

from __future__ import annotations

import json
import math
import random

import pytest
from outcomes import TEST_THREADS, record_margin

from trl_ext import demo
from trl_ext.demo.phases import curve_steps
from trl_ext.demo.report import comparison_table

# Reduced run (the full one is `make run`): an easier Countdown (3 numbers up to 9, targets up to 25), a 76k-parameter
# model, 128 labelled problems for SFT and the control, GRPO on the other 772 at lr 1e-3, 512 held-out problems; two
# seeds (SEEDS), the second from the first's warm start (SHARED_START). Float rounding differs with the CPU's vector
# unit and the thread count, so the trajectory differs from machine to machine: the claim must hold for any trajectory
# of this size, not for one. The sizes are chosen for a wide effect: with 64 labelled problems the start is ~3% greedy,
# GRPO's groups rarely hold a correct answer, and GRPO - control measured +2.7 to +5.5 points depending on the CPU
# (+2.5 sampled on one with AVX-512 and AMX); with 128 the start is ~6%, GRPO's lr 1e-3 (2e-4 gained half as much in
# 300 steps) doubles it, and the control memorises its 128 problems and falls back. Margins are paired z statistics
# over the held-out problems (see PAIRED_Z_MIN).
SMALL = [
    "--num_train_problems", "900", "--num_labelled", "128", "--max_number", "9", "--max_target", "25",
    "--num_eval_problems", "512", "--eval_samples", "16",
    "--hidden_size", "64", "--num_layers", "2", "--intermediate_size", "128",
    "--sft_steps", "300", "--sft_batch_size", "64", "--sft_learning_rate", "5e-3",
    "--grpo_steps", "300", "--grpo_batch_size", "128", "--num_generations", "8", "--max_completion_length", "16",
    "--learning_rate", "1e-3", "--control_steps", "300", "--control_learning_rate", "5e-3",
    "--curve_points", "3", "--seed", "0",
    # The arms run side by side with half the threads each: 1 thread each in `make test`; the outcome matrix's
    # TRL_EXT_TEST_THREADS=2 gives each arm 2 (and the warm start 4).
    "--threads", str(1 if TEST_THREADS == 1 else 2 * TEST_THREADS),
]  # fmt: skip
# The claim is tested on two seeds pooled: a seed, like another CPU's kernel set, is another trajectory, and one
# trajectory of this size is too noisy to carry it. Sampled GRPO vs control, z per run (one seed, one setting): 1.93
# (seed 0, AVX-512 kernels of an AMD EPYC, 1 or 2 threads), 3.90 (seed 0, AVX2 there), 3.25-4.43 (seed 0, the six
# settings of a 2-core VM with AVX-512 and AMX), 2.09 / 6.80 / 2.59 (seeds 1-3, the EPYC's AVX-512), 3.63 / 4.38 (seeds
# 1-2, its AVX2): mean 3.7, SD 1.2 across trajectories. Pooled over the 1,024 (problem, seed) pairs of seeds 0 and 1
# the four z are 2.84 / 5.88 / 2.11 / 4.02 (the EPYC's AVX-512) and 5.33 / 7.41 / 3.46 / 4.60 (its AVX2); about +1.4 SD
# above the single-run mean for the pair, so each bound sits >= 2.7 trajectory SDs below the pooled mean (5.2 for
# sampled vs control). Sampled accuracy (16 samples per problem) carries the claim with significance; greedy (one 0/1
# outcome per problem) only has to agree in direction vs the control. Per-run values: the claim test's docstring.
# Since the second seed starts from the first seed's warm start on its problems (SHARED_START, saving its SFT: 20-30
# CPU s), the test covers one SFT trajectory per setting, not two; the GRPO and control trajectories that carry the
# claim are still two (other sampling, problem order and solution draws). Measured on a 2-core AMD EPYC with AVX2 and
# no AVX-512, 1 thread, seed 1 from seed 0's start, z per run (same order as PAIRED_Z_MIN): 4.84 / 5.47 / 4.45 / 4.07
# (AVX2) and 2.94 / 4.17 / 2.15 / 2.40 (ATEN_CPU_CAPABILITY=default); seed 0 there 3.90 / 4.90 / 2.95 / 2.80 and
# 3.19 / 4.15 / 2.57 / 1.69; pooled 6.19 / 7.34 / 5.26 / 4.87 (AVX2) and 4.33 / 5.89 / 3.33 / 2.88 (default).
SEEDS = (0, 1)
PAIRED_Z_MIN = {"sampled_vs_control": 2.0, "sampled_vs_start": 3.0, "greedy_vs_control": 0.0, "greedy_vs_start": 1.0}


def _with_seed(argv: list[str], seed: int) -> list[str]:
    argv = list(argv)
    argv[argv.index("--seed") + 1] = str(seed)
    return argv


# The later seeds start from the first seed's warm start, on its problems (the labelled set its SFT saw, the rest
# unlabelled): their seed moves GRPO's sampling and problem order and the control's solution draws and order, not the
# start. No wandb run and no curve points there: the first seed's run checks those, and neither moves the arms.
SHARED_START = ["--problem_seed", str(SEEDS[0]), "--no-wandb", "--curve_points", "0"]


@pytest.fixture(scope="module")
def reduced_runs(tmp_path_factory):
    """The reduced run at each of SEEDS: `[(output_dir, metrics)]`, seed 0 first; the others from its SFT model."""
    runs = []
    for seed in SEEDS:
        out = tmp_path_factory.mktemp("demo") / f"run_seed{seed}"
        shared = [*SHARED_START, "--init_model", str(runs[0][0] / "sft_model")] if runs else []
        runs.append((out, demo.main([*_with_seed(SMALL, seed), *shared, "--output_dir", str(out)])))
    return runs


@pytest.fixture(scope="module")
def reduced_run(reduced_runs):
    return reduced_runs[0]


def _plain_greedy_correct(model_dir, problems, max_new_tokens: int = 16) -> list[int]:
    """Independent re-scoring: one prompt at a time, a plain argmax loop with no `generate` and no padding."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.rewards import countdown_reward_fn
    from trl_ext.tasks import compact_prompt

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    correct = []
    with torch.no_grad():
        for p in problems:
            ids = tok(compact_prompt(p["nums"], p["target"]), return_tensors="pt")["input_ids"]  # (1, T)
            prompt_len = ids.shape[1]
            for _ in range(max_new_tokens):
                nxt = model(input_ids=ids).logits[0, -1].argmax()
                if nxt.item() == tok.eos_token_id:
                    break
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            text = tok.decode(ids[0, prompt_len:], skip_special_tokens=True)
            reward = countdown_reward_fn(text, {"nums": p["nums"], "target": p["target"]}, require_all=True)
            correct.append(int(reward == 1.0))
    return correct


def test_held_out_is_fixed_and_disjoint_from_training():
    cfg0 = demo.parse_args(["--num_train_problems", "2000", "--num_eval_problems", "256", "--seed", "0"])
    cfg1 = demo.parse_args(["--num_train_problems", "2000", "--num_eval_problems", "256", "--seed", "1"])
    train0, held0 = demo.make_splits(cfg0)
    train1, held1 = demo.make_splits(cfg1)
    keys = {demo.problem_key(p) for p in held0}
    assert len(keys) == 256  # no duplicates inside the held-out set
    assert [demo.problem_key(p) for p in held0] == [demo.problem_key(p) for p in held1]  # same set for every seed
    assert not keys & {demo.problem_key(p) for p in train0 + train1}
    assert {demo.problem_key(p) for p in train0} != {demo.problem_key(p) for p in train1}  # the seed matters
    # --problem_seed draws another seed's training problems (a later seed's run from that seed's warm start)
    cfg10 = demo.parse_args(
        ["--num_train_problems", "2000", "--num_eval_problems", "256", "--seed", "1", "--problem_seed", "0"]
    )
    assert demo.make_splits(cfg10) == (train0, held0)


def test_unlabelled_problems_carry_no_solution_and_do_not_overlap_the_labelled():
    """Catches GRPO seeing solutions (a `solution` key left on its rows) or training on the labelled problems."""
    cfg = demo.parse_args(["--num_train_problems", "300", "--num_labelled", "40", "--num_eval_problems", "8"])
    train, _ = demo.make_splits(cfg)
    labelled, unlabelled = demo.split_labelled(train, 40)
    assert len(labelled) == 40 and len(unlabelled) == 260
    assert all("solution" in p for p in labelled)
    assert all(set(p) == {"nums", "target"} for p in unlabelled)
    assert not {demo.problem_key(p) for p in labelled} & {demo.problem_key(p) for p in unlabelled}
    rows = demo.grpo_dataset(unlabelled)
    assert rows.column_names == ["prompt", "nums", "target"]


def paired_z(new: list[int], old: list[int]) -> float:
    """Paired z statistic of per-problem outcomes: mean(d) / (sd(d) / sqrt(n)) with d_i = new_i - old_i (0/1 for
    greedy, 0..k correct samples for sampled); +inf when every problem moved the same way."""
    d = [a - b for a, b in zip(new, old, strict=True)]
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return mean / math.sqrt(var / n) if var else math.copysign(math.inf, mean)


def test_paired_z_by_hand():
    # d = (1, 1, 0, 0): mean 1/2, sample variance 1/3, SE sqrt(1/12), z = 0.5 * sqrt(12) = sqrt(3)
    assert math.isclose(paired_z([1, 1, 0, 1], [0, 0, 0, 1]), math.sqrt(3))
    assert paired_z([0, 0, 1], [1, 0, 1]) < 0  # GRPO worse: negative


def test_grpo_beats_the_sft_only_control_and_raises_the_held_out_reward(reduced_runs):
    """The demo's claim in miniature: GRPO on the unlabelled problems with the verifier beats more SFT on the
    labelled ones, on greedy and on sampled accuracy, and raises accuracy over its start. Each comparison is paired
    over the 512 held-out problems of both seeds (1,024 pairs) and must clear its PAIRED_Z_MIN; the second seed
    starts from the first seed's warm start (SHARED_START).

    Why two seeds: one run is one trajectory, and the trajectory moves with the seed and with the CPU's kernels
    alike. With seed 0 alone this test passes in a 2-core VM's six settings (AVX-512 and AMX; sampled vs control z
    3.25-4.43) and fails on an AMD EPYC's AVX-512 kernels (z 1.93 < 2): the cross-setting spread of one machine
    understates the spread between machines. Per run (sampled vs control / sampled vs start / greedy vs control /
    greedy vs start), measured on that EPYC with `ATEN_CPU_CAPABILITY` default (AVX-512) and avx2:
    seed 0: 1.93 / 4.05 / 1.82 / 2.54 (default, 1 and 2 threads alike)   3.90 / 4.90 / 2.95 / 2.80 (avx2, 1 and 2)
    seed 1: 2.09 / 4.27 / 1.18 / 3.14 (default)                          3.63 / 5.57 / 1.95 / 3.71 (avx2)
    pooled seeds 0 + 1: 2.84 / 5.88 / 2.11 / 4.02 (default)              5.33 / 7.41 / 3.46 / 4.60 (avx2)
    With seed 1 from seed 0's warm start (SHARED_START), on a 2-core EPYC with AVX2 and no AVX-512, 1 thread:
    seed 0: 3.19 / 4.15 / 2.57 / 1.69 (ATEN default)                     3.90 / 4.90 / 2.95 / 2.80 (avx2: unset here)
    seed 1: 2.94 / 4.17 / 2.15 / 2.40 (ATEN default)                     4.84 / 5.47 / 4.45 / 4.07 (avx2)
    pooled: 4.33 / 5.89 / 3.33 / 2.88 (ATEN default)                     6.19 / 7.34 / 5.26 / 4.87 (avx2)
    (sampled accuracy: start 5.5-7.2%, GRPO 10.0-13.8%, control 6.2-9.3%). Those runs sampled with `generate`; with
    the static cache (rollouts and scoring) and the control at 300 steps, on that AVX2 EPYC, 1 thread, pooled:
    3.86 / 4.66 / 3.20 / 2.84 (avx2)                                     4.42 / 5.14 / 3.37 / 1.75 (ATEN default)
    (sampled accuracy: start 5.5%, GRPO 7.5-10.7%, control 5.4-6.1%). Greedy is one 0/1 outcome per problem
    and is held to its direction vs the control; sampled accuracy (16 samples a problem) carries the significance.

    Fails if GRPO learns nothing from the verifier (advantages of the wrong sign make GRPO fall below its start, so
    every z turns negative; a reward that ignores the answer leaves it near the start), or if the arms are swapped in
    the report."""
    arms = {a: [m["arms"][a]["heldout"] for _, m in reduced_runs] for a in ("start", "grpo", "control")}

    def pooled(arm: str, key: str) -> list[int]:
        return [x for heldout in arms[arm] for x in heldout[key]]

    z = {
        "sampled_vs_control": paired_z(pooled("grpo", "sampled_correct"), pooled("control", "sampled_correct")),
        "sampled_vs_start": paired_z(pooled("grpo", "sampled_correct"), pooled("start", "sampled_correct")),
        "greedy_vs_control": paired_z(pooled("grpo", "greedy_correct"), pooled("control", "greedy_correct")),
        "greedy_vs_start": paired_z(pooled("grpo", "greedy_correct"), pooled("start", "greedy_correct")),
    }
    accuracy = {
        f"{kind}_{arm}_seed{seed}": heldout[f"{kind}_accuracy"]
        for arm in arms
        for seed, heldout in zip(SEEDS, arms[arm], strict=True)
        for kind in ("sampled", "greedy")
    }
    record_margin("demo_grpo_beats_control", **{f"z_{k}": v for k, v in z.items()}, **accuracy)
    for name, value in z.items():
        assert value >= PAIRED_Z_MIN[name], (name, z, accuracy)
    for _, m in reduced_runs:
        grpo, control = m["arms"]["grpo"]["heldout"], m["arms"]["control"]["heldout"]
        assert m["grpo_vs_control"]["greedy_points"] == round(
            100 * (grpo["greedy_accuracy"] - control["greedy_accuracy"]), 2
        )
        # GRPO's training reward on its unlabelled problems rose: each logged value is a mean over 25 steps x 128
        # completions of a reward in [0, 1] (SD <= 0.5: SE <= 0.025 even counting each group of 8 as one draw, so
        # the difference of two has SE <= 0.035); the rise measured 0.13 to 0.17 over the runs above, the 0.05
        # asked is 1.4 SEs.
        rewards = [h["reward"] for h in m["grpo_log"] if "reward" in h]
        record_margin("demo_grpo_training_reward_rises", first=rewards[0], last=rewards[-1])
        assert rewards[-1] - rewards[0] > 0.05, rewards
        # The control really trained (its SFT loss fell on the labelled set) and spent GRPO's CPU time within 2x.
        assert 0.5 < m["cpu_ratio_grpo_to_control"] < 2.0, m["cpu_ratio_grpo_to_control"]
    # The report's greedy sign test counts each problem where one arm is right and the other wrong.
    test = reduced_runs[0][1]["grpo_vs_control"]["greedy_test"]
    grpo0, control0 = arms["grpo"][0]["greedy_correct"], arms["control"][0]["greedy_correct"]
    assert test["gained"] == sum(g > c for g, c in zip(grpo0, control0, strict=True))
    assert test["lost"] == sum(g < c for g, c in zip(grpo0, control0, strict=True))


def _random_expression_accuracy(problems, seed=1) -> float:
    """Chance level: a random well-formed expression over the given numbers, e.g. `(a-b)*c`, scored by the reward."""
    from trl_ext.rewards import countdown_reward_fn

    rng, hits = random.Random(seed), 0
    for p in problems:
        a, b, c = rng.sample(p["nums"], 3)
        o1, o2 = rng.choice("+-*/"), rng.choice("+-*/")
        expr = f"({a}{o1}{b}){o2}{c}" if rng.random() < 0.5 else f"{a}{o1}({b}{o2}{c})"
        hits += countdown_reward_fn(f"<answer>{expr}</answer>", p, require_all=True) == 1.0
    return hits / len(problems)


def test_sft_on_the_labelled_set_learns_the_format(reduced_run):
    _, m = reduced_run
    assert m["random_init"]["greedy_accuracy"] == 0.0
    assert m["random_init"]["greedy_tagged"] == 0.0  # a random model never closes an answer tag
    tagged = m["arms"]["start"]["heldout"]["greedy_tagged"]
    record_margin("demo_sft_learns_the_format", greedy_tagged=tagged, bound=0.9)
    assert tagged > 0.9  # SFT on 128 problems taught the format
    assert m["held_out_overlap_with_train"] == 0


def test_written_metrics_match_the_saved_models(reduced_run):
    out, m = reduced_run
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["arms"]["grpo"]["heldout"]["greedy_accuracy"] == m["arms"]["grpo"]["heldout"]["greedy_accuracy"]
    _, held_out = demo.make_splits(demo.parse_args(SMALL))
    # The logged per-problem results are reproduced by an independent decoder on the saved checkpoints (a slice of
    # the held-out set, to keep the test fast).
    n = 48
    for arm, folder in (("start", "sft_model"), ("grpo", "final"), ("control", "control_model")):
        logged = m["arms"][arm]["heldout"]["greedy_correct"]
        assert sum(logged) / len(held_out) == m["arms"][arm]["heldout"]["greedy_accuracy"]
        assert _plain_greedy_correct(out / folder, held_out[:n]) == logged[:n], arm
    assert sum(m["arms"]["grpo"]["heldout"]["greedy_correct"][:n]) > 0  # the slice has something to agree on
    # Every logged point of the curve is where it should be, on a CPU clock that only moves forward.
    assert [(c["phase"], c["step"]) for c in m["curve"]] == [
        *[("sft", s) for s in (100, 200, 300)],
        *[("grpo", s) for s in (100, 200, 300)],
        *[("control", s) for s in (100, 200, 300)],
    ]
    for arm in ("grpo", "control"):
        points = [c for c in m["curve"] if c["phase"] == arm]
        cpu = [c["train_cpu_s"] for c in points]
        assert 0 < cpu[0] < cpu[1] < cpu[2] <= m["arms"][arm]["clock"]["train_cpu_s"] + 0.5, (arm, cpu)
        assert points[-1]["greedy_accuracy"] == m["arms"][arm]["heldout"]["greedy_accuracy"]
    rewards = [h["reward"] for h in m["grpo_log"] if "reward" in h]
    assert rewards and all(0.0 <= r <= 1.0 for r in rewards)
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))  # the wandb offline run


def test_sft_rows_cycle_the_problems_with_valid_solutions():
    from trl_ext.rewards import countdown_reward_fn
    from trl_ext.tasks import compact_prompt, countdown_solutions

    cfg = demo.parse_args(["--num_train_problems", "50", "--num_labelled", "10", "--num_eval_problems", "8"])
    train, _ = demo.make_splits(cfg)
    rows = demo.sft_dataset(train, 230, all_solutions=True, seed=0)
    assert len(rows) == 230  # 4 full passes over the 50 problems, then the first 30
    assert rows["prompt"][:50] == rows["prompt"][50:100] == [compact_prompt(p["nums"], p["target"]) for p in train]
    for i, row in enumerate(rows):
        problem = train[i % 50]
        assert countdown_reward_fn(row["completion"], problem, require_all=True) == 1.0, row
    # Problems with several solutions get different ones in different passes; the solver's single one otherwise.
    several = [i for i, p in enumerate(train) if len(countdown_solutions(p["nums"], p["target"])) >= 4]
    assert several and any(len({rows["completion"][i + 50 * k] for k in range(4)}) > 1 for i in several)
    single = demo.sft_dataset(train, 230, all_solutions=False, seed=0)
    assert single["completion"] == [f"<answer>{p['solution']}</answer>" for p in train]


def test_working_sft_rows_write_a_worked_search_before_a_correct_answer():
    """With --working each SFT completion is `step,step,...<answer>expression</answer>`: 0 to 2 dead ends drawn
    afresh per row (all three counts occur), then the 2 steps of a 3-number solution; the answer is correct."""
    from collections import Counter

    from trl_ext.rewards import countdown_reward_fn

    cfg = demo.parse_args(["--num_train_problems", "50", "--num_labelled", "10", "--num_eval_problems", "8"])
    train, _ = demo.make_splits(cfg)
    rows = demo.sft_dataset(train, 150, all_solutions=True, seed=0, working_dead_ends=2)
    dead_ends = Counter()
    for i, row in enumerate(rows):
        assert countdown_reward_fn(row["completion"], train[i % 50], require_all=True) == 1.0, row
        steps = row["completion"].split("<answer>")[0].split(",")
        assert all(step.count("=") == 1 for step in steps), row
        dead_ends[len(steps) - 2] += 1
    assert sorted(dead_ends) == [0, 1, 2]
    assert rows["completion"][:50] != rows["completion"][50:100]  # each pass draws its workings afresh


def test_paired_sign_test_by_hand():
    # lost 1, gained 3: p = 2 * (C(4,0) + C(4,1)) / 2**4 = 0.625
    r = demo.paired_sign_test([1, 0, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1])
    assert (r["lost"], r["gained"]) == (1, 3)
    assert math.isclose(r["p_value"], 0.625)
    assert demo.paired_sign_test([1, 0], [1, 0])["p_value"] == 1.0
    # Counts of correct samples: ties (2 vs 2) drop out; 3 higher, 0 lower -> p = 2 * 1/8 = 0.25.
    r = demo.paired_sign_test([0, 1, 2, 4], [3, 2, 2, 4 + 1])
    assert (r["lost"], r["gained"], r["p_value"]) == (0, 3, 0.25)


def test_sign_test_p_values_are_the_exact_binomial_tail():
    """scipy's binomtest against the exact tail by hand, 2 * sum_{k <= min} C(n, k) / 2^n (capped at 1), over every
    split of up to 512 untied problems (the held-out set's size); and the p-values docs/demo.md prints for its
    measured splits, to the printed digits."""
    for n in (1, 2, 7, 40, 137, 512):
        for gained in range(n + 1):
            lost = n - gained
            exact = min(1.0, 2 * sum(math.comb(n, k) for k in range(min(lost, gained) + 1)) / 2**n)
            p = demo.paired_sign_test([0] * gained + [1] * lost, [1] * gained + [0] * lost)["p_value"]
            assert p == pytest.approx(exact, rel=1e-12), (gained, lost)
    printed = {(80, 34): "2e-05", (89, 31): "1.1e-07", (104, 33): "9.3e-10", (82, 45): "0.0013"}
    for (gained, lost), text in printed.items():
        p = demo.paired_sign_test([0] * gained + [1] * lost, [1] * gained + [0] * lost)["p_value"]
        assert f"{p:.2g}" == text


def test_compare_and_table_put_each_arm_in_its_place():
    """Catches a swapped subtraction or a table row printing another arm's numbers."""
    control = {"greedy_accuracy": 0.25, "greedy_correct": [1, 0, 0, 0], "sampled_accuracy": 0.125}
    control |= {"sampled_correct": [1, 0, 0, 1], "pass@4": 0.5}
    grpo = {"greedy_accuracy": 0.75, "greedy_correct": [1, 1, 1, 0], "sampled_accuracy": 0.5}
    grpo |= {"sampled_correct": [4, 2, 2, 0], "pass@4": 0.75}
    c = demo.compare(control, grpo)
    assert (c["greedy_points"], c["sampled_points"], c["pass_points"]) == (50.0, 37.5, 25.0)
    assert (c["greedy_test"]["gained"], c["greedy_test"]["lost"]) == (2, 0)
    assert (c["sampled_test"]["gained"], c["sampled_test"]["lost"]) == (3, 1)
    clock = {"steps": 10, "train_cpu_s": 12.3}
    table = comparison_table([("control", control, clock), ("grpo", grpo, clock)], 4).split("\n")
    assert table[1].split() == ["control", "25.0%", "12.5%", "50.0%", "10", "12"]
    assert table[2].split() == ["grpo", "75.0%", "50.0%", "75.0%", "10", "12"]


def test_curve_steps_are_evenly_spaced_and_end_at_the_last_step():
    assert curve_steps(1000, 10) == set(range(100, 1001, 100))
    assert curve_steps(7, 3) == {2, 5, 7}
    assert curve_steps(2, 5) == {1, 2}
    assert curve_steps(100, 0) == set() and curve_steps(0, 5) == set()


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--grpo_batch_size", "30", "--num_generations", "8"], "--grpo_batch_size"),
        (["--num_generations", "1", "--grpo_batch_size", "8"], "--num_generations"),
        (["--num_eval_problems", "0"], "--num_eval_problems"),
        (["--sft_steps", "-1"], "--sft_steps"),
        (["--grpo_batch_size", "64", "--rollout_batch_size", "96"], "--rollout_batch_size"),
        (["--epochs_per_rollout", "0"], "--epochs_per_rollout"),
        (["--grpo_warmup_steps", "-5"], "--grpo_warmup_steps"),
        (["--control_steps", "-1"], "--control_steps"),
        (["--problem_seed", "-2"], "--problem_seed"),
        (["--num_labelled", "0"], "--num_labelled"),
        (["--num_train_problems", "500", "--num_labelled", "500"], "--num_labelled"),
        (["--ei_steps", "5"], "--ei_steps.*only with --ei"),  # an EI setting without the arm
        (["--ei", "--ei_questions", "20"], "--ei_questions"),  # 20 x 8 is not a multiple of 128
        (["--ei", "--ei_learning_rate", "0"], "--ei_learning_rate"),
        (["--working_dead_ends", "3"], "--working_dead_ends.*only with --working"),
        (["--working", "--working_dead_ends", "-1"], "--working_dead_ends must be >= 0"),
        (["--max_completion_length", "44"], "--max_completion_length 44 .* 64 positions; --working gives it 192"),
        (["--working", "--max_completion_length", "172"], "--max_completion_length 172 .* 192 positions"),
    ],
)
def test_bad_sizes_fail_before_any_model(argv, field):
    with pytest.raises(ValueError, match=field):
        demo.parse_args(argv)


def test_the_control_is_on_by_default_and_no_control_switches_it_off():
    assert demo.parse_args([]).control is True
    assert demo.parse_args(["--no-control"]).control is False


def test_the_default_runs_no_expert_iteration_arm():
    assert demo.parse_args([]).ei is False and demo.parse_args(["--ei"]).ei is True


# The EI arm in the reduced run's setting, from its warm start (no SFT, no GRPO, no control): 3 EI steps of 32
# problems x 8, on a 128-problem held-out slice with 2 samples each.
EI_SMALL = ["--grpo_steps", "0", "--no-control", "--ei", "--ei_steps", "3", "--ei_questions", "32",
            "--ei_learning_rate", "1e-3", "--num_eval_problems", "128", "--eval_samples", "2",
            "--no-parallel_arms", "--no-wandb"]  # fmt: skip


def test_the_expert_iteration_arm_runs_and_records_entropy_and_length(reduced_run, tmp_path):
    """`--ei` in the reduced run's configuration: EI trains from the start on the unlabelled problems (the saved
    model moved, some completions were kept), its logged held-out results are those of the saved model (an
    independent argmax decoder), its curve points sit at EI steps 1, 2, 3 on a forward-moving CPU clock, and every
    point of every arm carries the sampled responses' entropy (within [0, ln V]) and length (within [1, budget]),
    the last EI point being the final model's greedy accuracy. Catches an EI arm that does not train, reports
    another model, or measures at the wrong time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = reduced_run
    run = tmp_path / "ei"
    m = demo.main([*SMALL, *EI_SMALL, "--init_model", str(out / "sft_model"), "--output_dir", str(run)])
    assert set(m["arms"]) == {"start", "ei"}
    clock = m["arms"]["ei"]["clock"]
    assert clock["ei_steps"] == 3 and clock["steps"] >= 1
    assert sum(h["ei/kept"] for h in m["arms"]["ei"]["ei_log"]) > 0
    start = AutoModelForCausalLM.from_pretrained(out / "sft_model")
    trained = AutoModelForCausalLM.from_pretrained(run / "ei_model")
    assert any(not a.equal(b) for a, b in zip(start.parameters(), trained.parameters(), strict=True))

    _, held_out = demo.make_splits(demo.parse_args([*SMALL, *EI_SMALL]))
    logged = m["arms"]["ei"]["heldout"]["greedy_correct"]
    assert _plain_greedy_correct(run / "ei_model", held_out[:48]) == logged[:48]
    points = [c for c in m["curve"] if c["phase"] == "ei"]
    assert [c["ei_step"] for c in points] == [1, 2, 3]
    cpu = [c["train_cpu_s"] for c in points]
    assert 0 < cpu[0] < cpu[1] < cpu[2] <= clock["train_cpu_s"] + 0.5
    assert points[-1]["greedy_accuracy"] == m["arms"]["ei"]["heldout"]["greedy_accuracy"]
    vocab = len(AutoTokenizer.from_pretrained(run / "ei_model"))
    for stats in [m["arms"]["start"]["response"], *[{k[9:]: v for k, v in c.items()} for c in points]]:
        assert 0 < stats["entropy"] <= math.log(vocab) and 1 <= stats["mean_length"] <= 16, stats
        assert 0 <= stats["accuracy"] <= 1
    assert (run / "arms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_response_entropy_equals_a_plain_per_row_forward():
    """The batched entropy (left-padded prompts, right-padded responses, positions over real tokens) equals a
    forward of each row alone, unpadded; and measuring leaves torch's random state as it was (the arms' training
    draws the same samples with and without `--ei`'s measurements)."""
    import torch

    from trl_ext.testbed.heldout import response_entropy, response_stats
    from trl_ext.tiny import build_char_tokenizer, build_tiny_qwen3

    tokenizer = build_char_tokenizer(demo.DEMO_CHARS, model_max_length=64)
    model = build_tiny_qwen3(tokenizer, hidden_size=32, num_layers=2, intermediate_size=64, seed=3).eval()
    prompts = ["[1, 2, 3] -> 6 :", "[10, 4, 7] -> 21 :", "[9] -> 9 :"]
    responses = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in ("1+2+3", "(10+4)+7+", "9")]
    total, count = 0.0, 0
    with torch.no_grad():
        for prompt, response in zip(prompts, responses, strict=True):
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            logits = model(torch.tensor([ids + response])).logits[0].double()  # (P + T, V)
            for t in range(len(response)):
                logp = torch.log_softmax(logits[len(ids) - 1 + t], dim=-1)
                total, count = total - (logp.exp() * logp).sum().item(), count + 1
    assert response_entropy(model, tokenizer, prompts, responses) == pytest.approx(total / count, rel=1e-5)

    problems = [{"nums": [1, 2, 3], "target": 6}, {"nums": [10, 4, 7], "target": 21}]
    torch.manual_seed(11)
    state = torch.get_rng_state()
    stats = response_stats(model, tokenizer, problems, 8)
    assert torch.equal(torch.get_rng_state(), state)
    assert 1 <= stats["mean_length"] <= 8 and stats["entropy"] > 0
    # an untrained model answers nothing right: every response is an incorrect one
    assert stats["accuracy"] == 0 and stats["correct_length"] is None
    assert stats["incorrect_length"] == stats["mean_length"]


def test_static_cache_scoring_carries_the_sampled_responses_statistics():
    """With the static cache, `heldout.evaluate`'s `response` is the statistics of the very samples the sampled
    accuracy scores: their lengths through EOS, their correctness, and the entropy a separate forward over them
    gives (so a wrong row order, a length cut at the wrong token or an entropy of another distribution shows)."""
    import torch

    from trl_ext.evaluation.transformers_backend import generate_transformers
    from trl_ext.rewards import countdown_reward_components
    from trl_ext.tasks import compact_prompt
    from trl_ext.testbed.heldout import EVAL_SAMPLING_SEED, evaluate, response_entropy
    from trl_ext.tiny import build_char_tokenizer, build_tiny_qwen3

    tokenizer = build_char_tokenizer(demo.DEMO_CHARS, model_max_length=64)
    model = build_tiny_qwen3(tokenizer, hidden_size=32, num_layers=2, intermediate_size=64, seed=3).eval()
    with torch.no_grad():  # the EOS logit raised so that lengths vary
        model.get_input_embeddings().weight[tokenizer.eos_token_id] *= 4
    problems = [{"nums": [1, 2, 3], "target": 6}, {"nums": [10, 4, 7], "target": 21}, {"nums": [9, 1], "target": 8}]
    got = evaluate(model, tokenizer, problems, 3, 8, static_cache=True)
    prompts = [compact_prompt(p["nums"], p["target"]) for p in problems]
    samples = generate_transformers(
        model, tokenizer, prompts, n=3, max_new_tokens=8, temperature=1.0, seed=EVAL_SAMPLING_SEED, stop=(),
        static_cache=True,
    )  # fmt: skip
    responses = [s.token_ids for row in samples for s in row]  # problem-major, 3 per problem
    assert len({len(r) for r in responses}) >= 2, responses
    correct = [
        countdown_reward_components(tokenizer.decode(r, skip_special_tokens=True), p, require_all=True)[
            "answer_reward"
        ]
        == 1.0
        for p, r in zip([p for p in problems for _ in range(3)], responses, strict=True)
    ]
    stats = got["response"]
    assert stats["mean_length"] == pytest.approx(sum(map(len, responses)) / 9, rel=1e-12)
    assert stats["accuracy"] == sum(correct) / 9 == got["sampled_accuracy"]
    wrong = [len(r) for r, c in zip(responses, correct, strict=True) if not c]
    assert stats["incorrect_length"] == pytest.approx(sum(wrong) / len(wrong), rel=1e-12)
    expected = response_entropy(model, tokenizer, [p for p in prompts for _ in range(3)], responses)
    assert stats["entropy"] == pytest.approx(expected, rel=1e-5)
