"""The SFT-only control arm: more SFT on the labelled problems from GRPO's start, in this process or in a child
process that runs beside GRPO; the child processes of the arms (the control, and expert iteration with `--ei`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trl_ext.demo.config import DemoConfig
from trl_ext.demo.phases import run_sft
from trl_ext.testbed.config import model_positions
from trl_ext.testbed.heldout import evaluate
from trl_ext.testbed.problems import DEMO_CHARS, make_splits, split_labelled


def run_control(cfg: DemoConfig, start_dir: Path, out: Path, tokenizer, labelled, held_out) -> dict:
    """Load the start model, run `cfg.control_steps` SFT steps on `labelled`, score and save it.

    Returns:
        `{"clock", "heldout", "curve"}` as the GRPO arm has them; the model goes to `<out>/control_model`.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(start_dir, dtype=torch.float32)
    curve, clock = run_sft(
        cfg, "control", model, tokenizer, labelled, held_out, out / "control", cfg.control_steps,
        cfg.control_learning_rate, "none",
    )  # fmt: skip
    heldout = evaluate(model, tokenizer, held_out, cfg.eval_samples, cfg.max_completion_length, cfg.static_cache)
    model.save_pretrained(out / "control_model")
    tokenizer.save_pretrained(out / "control_model")
    return {"clock": clock, "heldout": heldout, "curve": curve}


def start_arm_process(arm: str, cfg: DemoConfig, start_dir: Path, out: Path, threads: int) -> subprocess.Popen:
    """Start arm `arm` (`control` or `ei`) in a child process (its own interpreter, `threads` torch threads); its
    lines print as they come, prefixed `[control]` / `[ei]`."""
    spec = out / arm / "spec.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(
        json.dumps({"arm": arm, "config": vars(cfg), "start_dir": str(start_dir), "out": str(out), "threads": threads})
    )
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    # the arms never generate with vLLM: the expert-iteration child then does not import it through TRL's GRPO module
    code = (
        "import sys; from trl_ext.lazy import hide_vllm; hide_vllm(); "
        "from trl_ext.demo.control import child_main; child_main(sys.argv[1])"
    )
    return subprocess.Popen([sys.executable, "-c", code, str(spec)], env=env)


def finish_arm_process(arm: str, proc: subprocess.Popen, out: Path) -> dict:
    """Wait for the child and read its result; a failed child raises with its exit status."""
    if proc.wait() != 0:
        raise RuntimeError(f"the {arm} process exited with status {proc.returncode}; its output is above")
    return json.loads((out / arm / "result.json").read_text())


def child_main(spec_path: str) -> None:
    """The child process's work: rebuild the problems from the config, run its arm and write
    `<out>/<arm>/result.json`."""
    import datasets
    import torch

    from trl_ext.tiny import build_char_tokenizer

    spec = json.loads(Path(spec_path).read_text())
    cfg, out, arm = DemoConfig(**spec["config"]), Path(spec["out"]), spec["arm"]
    datasets.disable_progress_bars()
    torch.set_num_threads(spec["threads"])
    train, held_out = make_splits(cfg)
    labelled, unlabelled = split_labelled(train, cfg.num_labelled)
    tokenizer = build_char_tokenizer(DEMO_CHARS, model_max_length=model_positions(cfg))
    if arm == "ei":
        from trl_ext.demo.ei import run_ei_arm

        result = run_ei_arm(cfg, Path(spec["start_dir"]), out, tokenizer, unlabelled, held_out)
    else:
        result = run_control(cfg, Path(spec["start_dir"]), out, tokenizer, labelled, held_out)
    (out / arm / "result.json").write_text(json.dumps(result))
