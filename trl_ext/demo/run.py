"""`main` of the embedded default: warm start, GRPO and the SFT-only control, then the comparison and its files."""

from __future__ import annotations

import json
import os
import random
import resource
import time
import warnings
from dataclasses import asdict
from pathlib import Path

from trl_ext.demo.config import GPU_COMMAND, DemoConfig, parse_args
from trl_ext.demo.control import finish_arm_process, run_control, start_arm_process
from trl_ext.demo.phases import cpu_seconds, run_grpo, run_sft
from trl_ext.demo.report import compare, comparison_table, plot_arms, plot_curve
from trl_ext.testbed.heldout import evaluate, response_stats
from trl_ext.testbed.warm_start import build_model, split_problems


def _start_wandb(cfg: DemoConfig, out: Path):
    """An offline wandb run in the run folder, or None (with a warning) when wandb cannot start."""
    if not cfg.wandb:
        return None
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb

        return wandb.init(project="trl_ext-demo", name=out.name, dir=str(out), config=asdict(cfg))
    except Exception as exc:  # noqa: BLE001 - any wandb failure must not cost the user the run
        warnings.warn(
            f"wandb run could not start ({type(exc).__name__}: {exc}); continuing without wandb", stacklevel=2
        )
        return None


def _load(path: Path | str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _score(cfg: DemoConfig, model, tokenizer, held_out: list[dict]) -> dict:
    """Greedy and sampled held-out accuracy (`trl_ext.testbed.heldout.evaluate`) at the run's settings."""
    return evaluate(model, tokenizer, held_out, cfg.eval_samples, cfg.max_completion_length, cfg.static_cache)


def _fmt(r: dict) -> str:
    parts = [f"greedy {100 * r['greedy_accuracy']:.1f}%"]
    parts += [f"sampled (T=1) {100 * r['sampled_accuracy']:.1f}%"] if "sampled_accuracy" in r else []
    parts += [f"{k} {100 * v:.1f}%" for k, v in r.items() if k.startswith("pass@")]
    return ", ".join(parts)


def _summary_lines(metrics: dict) -> list[str]:
    """The comparison: the table, then GRPO minus control with the paired sign tests."""
    arms = metrics["arms"]
    rows = [(f"SFT start ({metrics['num_labelled']} labelled)", arms["start"]["heldout"], None)]
    names = {"grpo": "GRPO (unlabelled, verifier only)", "control": "SFT-only control (labelled)"}
    names["ei"] = "expert iteration (unlabelled)"
    rows += [(names[a], arms[a]["heldout"], arms[a]["clock"]) for a in ("grpo", "control", "ei") if a in arms]
    lines = comparison_table(rows, metrics["num_eval_problems"]).split("\n")
    labels = [("GRPO - SFT start", "grpo_vs_start"), ("GRPO - control", "grpo_vs_control")]
    labels += [("EI - SFT start", "ei_vs_start"), ("EI - GRPO", "ei_vs_grpo"), ("EI - control", "ei_vs_control")]
    for label, key in labels:
        c = metrics.get(key)
        if not c:
            continue
        text = f"{label}: greedy {c['greedy_points']:+.1f} points (sign test p = {c['greedy_test']['p_value']:.2g}, "
        text += f"{c['greedy_test']['gained']} gained / {c['greedy_test']['lost']} lost)"
        if "sampled_points" in c:
            text += f", sampled {c['sampled_points']:+.1f} points (p = {c['sampled_test']['p_value']:.2g}), "
            text += f"pass@k {c['pass_points']:+.1f} points"
        lines.append(text)
    return lines


def _run_arms(
    cfg: DemoConfig, model, tokenizer, labelled, unlabelled, held_out, start_dir: Path, out: Path, wandb_run
):
    """GRPO here and the other arms (the control; expert iteration with `--ei`) beside it in child processes (or
    after GRPO, `--no-parallel_arms`), all from the model in `start_dir`, the threads split between the arms that run
    at once.

    Returns:
        (arms `{"grpo" / "control" / "ei": {"clock", "heldout", ...}}`, their curve points, TRL's GRPO log).
    """
    import torch

    report_to = "wandb" if wandb_run is not None else "none"
    others = [arm for arm, on in (("control", bool(cfg.control and cfg.control_steps)), ("ei", cfg.ei)) if on]
    parallel = bool(others) and cfg.parallel_arms
    arm_threads = max(1, torch.get_num_threads() // (1 + len(others))) if parallel else torch.get_num_threads()
    procs = {arm: start_arm_process(arm, cfg, start_dir, out, arm_threads) for arm in others} if parallel else {}
    torch.set_num_threads(arm_threads)
    arms: dict[str, dict] = {}
    curve: list[dict] = []
    grpo_log: list[dict] = []
    try:
        if cfg.grpo_steps:
            trainer, curve, clock = run_grpo(
                cfg, model, tokenizer, unlabelled, held_out, out / "grpo", report_to, wandb_run
            )
            grpo_log = [h for h in trainer.state.log_history if "reward" in h or "train_runtime" in h]
            model = trainer.model
            heldout = _score(cfg, model, tokenizer, held_out)
            arms["grpo"] = {"clock": clock, "heldout": heldout}
            model.save_pretrained(out / "final")
            tokenizer.save_pretrained(out / "final")
            print(f"[demo] after GRPO ({clock['steps']} steps): {_fmt(heldout)}", flush=True)
        for arm in others:
            if arm in procs:
                arms[arm] = finish_arm_process(arm, procs[arm], out)
            elif arm == "control":
                arms[arm] = run_control(cfg, start_dir, out, tokenizer, labelled, held_out)
            else:
                from trl_ext.demo.ei import run_ei_arm  # imports TRL's GRPO trainer: only when the arm runs

                arms[arm] = run_ei_arm(cfg, start_dir, out, tokenizer, unlabelled, held_out)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    for arm in others:
        points = arms[arm].pop("curve")
        curve += points
        for c in points if wandb_run is not None else []:
            wandb_run.log({f"{arm}/heldout_greedy_accuracy": c["greedy_accuracy"], f"{arm}/cpu_s": c["train_cpu_s"]})
        clock = arms[arm]["clock"]
        if arm == "control":
            print(f"[demo] after the control ({clock['steps']} SFT steps): {_fmt(arms[arm]['heldout'])}", flush=True)
        else:
            steps = f"{clock['ei_steps']} EI steps, {clock['steps']} SFT steps"
            print(f"[demo] after expert iteration ({steps}): {_fmt(arms[arm]['heldout'])}", flush=True)
    return arms, curve, grpo_log


def main(argv: list[str] | None = None) -> dict:
    """Run the embedded default; returns the metrics written to `<output_dir>/metrics.json`."""
    started, cpu_started = time.perf_counter(), cpu_seconds()
    cfg = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # OpenMP's default (spinning workers) is fastest on an otherwise idle machine: 40 GRPO steps took 32 s wall
    # against 42 s with OMP_WAIT_POLICY=PASSIVE on 2 idle cores. On a machine shared with other jobs, export
    # OMP_WAIT_POLICY=PASSIVE yourself: there spinning made a step 3x slower (wall) and 4x costlier (CPU time).
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    phases: dict[str, dict] = {}

    def mark(name: str, since: tuple[float, float]) -> tuple[float, float]:
        now = (time.perf_counter(), cpu_seconds())
        phases[name] = {"wall_s": round(now[0] - since[0], 2), "cpu_s": round(now[1] - since[1], 2)}
        return now

    t = (started, cpu_started)
    import datasets
    import torch

    datasets.disable_progress_bars()
    torch.set_num_threads(cfg.threads or min(os.cpu_count() or 1, 4))
    random.seed(cfg.seed)
    t = mark("imports", t)
    print(f"[demo] Countdown: GRPO vs SFT-only control on CPU, seed {cfg.seed}, {torch.get_num_threads()} threads "
          f"-> {out}", flush=True)  # fmt: skip

    labelled, unlabelled, held_out, overlap = split_problems(cfg)
    tokenizer, model, num_params = build_model(cfg)
    print(
        f"[demo] {num_params:,} parameters; {len(labelled)} labelled and {len(unlabelled)} unlabelled training "
        f"problems, {len(held_out)} held-out",
        flush=True,
    )
    t = mark("build", t)

    wandb_run = _start_wandb(cfg, out)
    t = mark("wandb_start", t)

    initial = evaluate(model, tokenizer, held_out, 0, cfg.max_completion_length, cfg.static_cache)
    model, start_dir, curve, warm_start = _warm_start(cfg, model, tokenizer, labelled, held_out, out, wandb_run)
    t = mark("sft", t)

    start = {"heldout": _score(cfg, model, tokenizer, held_out)}
    print(f"[demo] start of GRPO and control: {_fmt(start['heldout'])}", flush=True)
    if cfg.ei:  # the curves' common first point of entropy and length
        start["response"] = response_stats(model, tokenizer, held_out, cfg.max_completion_length, cfg.static_cache)
    t = mark("eval_start", t)

    arms, arm_curve, grpo_log = _run_arms(
        cfg, model, tokenizer, labelled, unlabelled, held_out, start_dir, out, wandb_run
    )
    arms = {"start": start, **arms}
    curve += arm_curve
    t = mark("arms", t)

    metrics = {
        "config": asdict(cfg),
        "num_parameters": num_params,
        "num_labelled": len(labelled),
        "num_unlabelled": len(unlabelled),
        "num_eval_problems": len(held_out),
        "held_out_overlap_with_train": len(overlap),
        "random_init": {k: v for k, v in initial.items() if k != "greedy_correct"},
        "warm_start": warm_start,
        "arms": arms,
        "curve": curve,
        "grpo_log": grpo_log,
        "phases": phases,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    metrics.update(_comparisons(arms))
    plot_curve(metrics, out / "curve.png")
    if "ei" in arms:
        plot_arms(metrics, out / "arms.png")
    if wandb_run is not None:
        _finish_wandb(wandb_run, arms, metrics)
    metrics["total"] = _total(started, cpu_started)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))

    for line in _summary_lines(metrics):
        print(f"[demo] {line}", flush=True)
    print(
        f"[demo] wall {metrics['total']['process_wall_s']:.0f} s, CPU {metrics['total']['process_cpu_s']:.0f} s "
        f"+ {metrics['total']['children_cpu_s']:.0f} s in child processes (since the process started); wrote "
        f"{out / 'metrics.json'}, {out / 'curve.png'}",
        flush=True,
    )
    print(f"[demo] the real experiment (2 GPUs, vLLM on GPU 0, training on GPU 1):\n  {GPU_COMMAND}", flush=True)
    return metrics


def _warm_start(cfg, model, tokenizer, labelled, held_out, out: Path, wandb_run):
    """The start of both arms: the model of `--init_model`, else SFT on the labelled problems (saved to
    `out/sft_model`), else the random init. Returns (model, its folder, curve points, the SFT clock)."""
    start_dir = out / "sft_model"
    if cfg.init_model:
        print(f"[demo] loaded {cfg.init_model}; no SFT", flush=True)
        return _load(cfg.init_model), Path(cfg.init_model), [], {}
    if not cfg.sft_steps:
        return model, start_dir, [], {}
    report_to = "wandb" if wandb_run is not None else "none"
    points, clock = run_sft(
        cfg, "sft", model, tokenizer, labelled, held_out, out / "sft", cfg.sft_steps, cfg.sft_learning_rate,
        report_to, wandb_run,
    )  # fmt: skip
    model.save_pretrained(start_dir)
    tokenizer.save_pretrained(start_dir)
    return model, start_dir, points, {"clock": clock}


def _comparisons(arms: dict) -> dict:
    """Each arm against the start and against the arms it competes with (held-out accuracy, CPU time ratio)."""
    out = {}
    if "grpo" in arms:
        out["grpo_vs_start"] = compare(arms["start"]["heldout"], arms["grpo"]["heldout"])
    if "grpo" in arms and "control" in arms:
        out["grpo_vs_control"] = compare(arms["control"]["heldout"], arms["grpo"]["heldout"])
        out["cpu_ratio_grpo_to_control"] = round(
            arms["grpo"]["clock"]["train_cpu_s"] / max(arms["control"]["clock"]["train_cpu_s"], 1e-9), 3
        )
    if "ei" in arms:
        out["ei_vs_start"] = compare(arms["start"]["heldout"], arms["ei"]["heldout"])
        for other in ("grpo", "control"):
            if other in arms:
                out[f"ei_vs_{other}"] = compare(arms[other]["heldout"], arms["ei"]["heldout"])
                out[f"cpu_ratio_ei_to_{other}"] = round(
                    arms["ei"]["clock"]["train_cpu_s"] / max(arms[other]["clock"]["train_cpu_s"], 1e-9), 3
                )
    return out


def _finish_wandb(wandb_run, arms: dict, metrics: dict) -> None:
    for arm, entry in arms.items():
        floats = {f"{arm}/{k}": v for k, v in entry.get("heldout", {}).items() if isinstance(v, float)}
        wandb_run.summary.update(floats)
    metrics["wandb_dir"] = str(Path(wandb_run.dir).parent)
    wandb_run.finish()


def _total(started: float, cpu_started: float) -> dict:
    """Wall and CPU seconds of `main`, of the whole process, and of its finished child processes."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the control process (and wandb's), once finished
    return {
        "wall_s": round(time.perf_counter() - started, 2),
        "cpu_s": round(cpu_seconds() - cpu_started, 2),
        # From process start: the interpreter and the imports before `main` count toward the time goal too.
        "process_wall_s": round(time.time() - _process_start_time(), 2),
        "process_cpu_s": round(cpu_seconds(), 2),
        "children_cpu_s": round(children.ru_utime + children.ru_stime, 2),
    }


def _process_start_time() -> float:
    import psutil

    return psutil.Process().create_time()
