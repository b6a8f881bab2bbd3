"""A stand-in trainer for the study runner's tests, started by the real `trl-ext launch` (its `--train-cmd`):
`python study_fake_trainer.py CONFIG --output_dir DIR --seed K --resume true ...`.

CONFIG's name picks what it does: `fail*` prints a few lines and exits 3; `sleep*` starts a grandchild, writes both
pids to DIR/pids and sleeps; anything else writes a finished run folder whose numbers follow from the seed and the
name (`b*` arms: accuracy 0.1 (k + 1) + 0.05 (k + 1); others 0.1 (k + 1)), and the argv it got."""

import json
import subprocess
import sys
import time
from pathlib import Path

config, args = Path(sys.argv[1]), sys.argv[2:]
out = Path(args[args.index("--output_dir") + 1])
seed = int(args[args.index("--seed") + 1])
out.mkdir(parents=True, exist_ok=True)
if config.stem.startswith("fail"):
    print("fake trainer: step 1", flush=True)
    print("fake trainer: boom (exit 3)", flush=True)
    sys.exit(3)
if config.stem.startswith("sleep"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (out / "pids").write_text(f"{child.pid} {__import__('os').getpid()}")
    time.sleep(600)
accuracy = 0.1 * (seed + 1) + (0.05 * (seed + 1) if config.stem.startswith("b") else 0.0)
history = [
    {"step": s, "reward": 0.1 * s, "entropy": 1.0 - 0.1 * s, "step_time": 2.0, "completions/mean_length": 10.0}
    for s in (1, 2, 3, 4)
]
history.append({"step": 4, "eval_rewards/countdown_reward/answer_reward": accuracy, "eval_runtime": 1.0})
(out / "trainer_state.json").write_text(json.dumps({"global_step": 4, "max_steps": 4, "log_history": history}))
(out / "trl_ext_run.json").write_text(json.dumps({"config": {"final_eval": False}, "stated": []}))
rollouts = [
    {"step": 2, "completion": "x" * 10, "reward": 1.0},
    {"step": 2, "completion": "x" * 30, "reward": 0.1},
    {"step": 4, "completion": "x" * 20, "reward": 1.0},
    {"step": 4, "completion": "x" * 50, "reward": 0.0},
]
(out / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts))
(out / "argv.json").write_text(json.dumps(args))
(out / "train_results.json").write_text(json.dumps({"train_runtime": 8.0}))
