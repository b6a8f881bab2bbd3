"""GRPO in vLLM server mode on the CPU against a running server, with records for tests/test_vllm_server_sync.py.

Usage: vllm_server_sync.py OUT_DIR --port P --model DIR --runs NAME[,NAME...] [--no-sync] [--kill-marker FILE]
[--stall-marker FILE] [--group-port G]

Each run trains `AblationGRPOTrainer` (`use_vllm=True, vllm_mode="server"`, importance-sampling correction on,
float32) on the engine model in DIR against the server on 127.0.0.1:P, a new trainer per run (so each run joins
the server's weight transfer anew), and writes OUT_DIR/NAME.json (rank 0):

- `exact`, `padding_free`, `peft` (LoRA, merged for the sync by TRL), `resume_full` (below) and `ddp` (the same as
  `exact`, with 2 processes: under torchrun, or first in the ZeRO-3 launch's processes, `without_deepspeed`):
  after each optimizer step the weights are synced through TRL's own
  `VLLMGeneration.sync_weights`, then the server generates greedily from fixed prompts and the log-probs it returns
  for its tokens are recorded beside a plain forward of the trainer's model on the same tokens, and beside the
  forward of the initial weights (how far training moved them). `--no-sync` turns TRL's sync into a no-op.
- `learn`: a short run on the digit-share reward; TRL's logged rewards and `sampling/importance_sampling_ratio`.
- `kill`: after step 1, writes FILE and waits for the server to stop answering (the test kills it); the next step's
  sync must fail: records the error and its time, then exits 1.
- `resume_full` / `resume`: 4 steps sampled with a fixed per-request seed (`generation_kwargs`), a
  checkpoint at step 2; then a new trainer resumes from it for steps 3-4. Both record the completions of every
  generation and TRL's logged losses; `resume` also records `server_check` right after its first sync (before its
  first generation and the first post-resume step).
- `ei`: `ExpertIterationTrainer` in server mode (2 EI steps, every completion kept), the same gloo sync
  as GRPO; after training, TRL's sync and `server_check` (recorded as its one check); it validates after each EI
  step (see `sft`).
- `zero3_full` / `zero3_resume` (under `accelerate launch --config_file accelerate_configs/cpu_zero3.yaml`,
  2 processes): `resume_full` / `resume` under DeepSpeed ZeRO-3, `zero3_full` checked after every step as `exact`
  (the trainer's weights gathered from the shards for the forward); both record the engine and whether a model
  loaded after the trainer was built came out sharded over both processes.
- `sft`: `ValidatingSFTTrainer` validating with the server after each of 2 SFT steps; after each
  validation (no sync of the check's own) `server_check`, recorded under `validation_checks` (also for `ei`).
- `finish_reasons`, `async`, `async_ddp`: the checks of tests/scripts/vllm_server_finish_reasons.py and
  tests/scripts/vllm_async.py, run in this process (`run_other`).
- `stall_gen` / `stall_sync` (the watchdog): at step 1, just before the generation request (`stall_gen`)
  or after the third tensor handed to the weight sync (`stall_sync`), writes FILE (`--stall-marker`) and waits for
  FILE.ack (the test has stopped the server with SIGSTOP); the watchdog must end the process.
  With `--stall-dir D` each stall run is a forked child of this process instead (`run_forked`: this process's
  imports, not a new interpreter's), with `vllm_server_timeout` `--stall-timeout`, its output in D/NAME.log and its
  marker D/NAME.marker; this process reaps it, writes D/NAME.exit (exit code, the monotonic time of the exit, what
  was left running) and waits for D/NAME.go (the test has continued the server) before the next run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
import traceback
import urllib.request
from contextlib import contextmanager
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS.parent))
sys.path.insert(0, str(TESTS))

from vllm_helpers import forward_logps, id_reward  # noqa: E402

FIXED_PROMPTS = ["abc", "hello", "12+3", "xyz"]
TRAIN_PROMPTS = ["abc", "hello", "12+3", "xyz", "qq", "Zeta", "R1", "w"]
MAX_TOKENS = 8
# The `learn` run's batch and step size; the sync checks' (3 steps, weights visibly moved).
LEARN = dict(per_device_train_batch_size=16, learning_rate=3e-2)
CHECK = dict(per_device_train_batch_size=8, learning_rate=5e-2)
# The runs checked against the server after every optimizer step; the seeded 4-step runs with a checkpoint at step 2
# (`resume_full`, also the plain check, and its ZeRO-3 counterpart); the runs that resume from them.
CHECKED = {"exact", "padding_free", "peft", "ddp", "resume_full", "zero3_full", "zero3_peft"}
SEEDED = {"resume_full", "resume", "zero3_full", "zero3_resume"}
RESUMES = {"resume": "resume_full", "zero3_resume": "zero3_full"}


def digit_share(completions, **kwargs) -> list[float]:
    """Share of the completion's characters that are digits: the toy model learns it in a few dozen steps."""
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in completions]


def server_check(trainer, model, initial, prompts: list[list[int]]) -> dict:
    """The server's greedy completions of `prompts` with its log-probs, a forward of the trainer's weights (`model`,
    from `trainer_weights`) and of the initial weights on the same tokens: `gap` = max |server - trainer|, `moved` =
    max |trainer - initial|. Generates around the resume runs' recording wrapper (its requests are not the run's)."""
    client = trainer.vllm_generation.vllm_client
    generate = getattr(client, "unrecorded_generate", client.generate)
    out = generate(prompts, n=1, max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
    rows, gap, moved = [], 0.0, 0.0
    for prompt, completion, logprobs in zip(prompts, out["completion_ids"], out["logprobs"], strict=True):
        server = [position[0] for position in logprobs]
        mine, start = forward_logps(model, prompt, completion), forward_logps(initial, prompt, completion)
        gap = max(gap, *(abs(a - b) for a, b in zip(server, mine, strict=True)))
        moved = max(moved, *(abs(a - b) for a, b in zip(mine, start, strict=True)))
        rows.append({"completion": completion, "server": server, "trainer": mine, "initial": start})
    return {"step": trainer.state.global_step, "gap": gap, "moved": moved, "rows": rows}


def load_plain(path: str):
    """The model at `path` as this process's plain float32 module, also where a ZeRO-3 config is active (transformers
    would build it sharded: `zero.Init`)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations import deepspeed as hf_deepspeed

    active = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = active


def zero3_facts(trainer, path: str) -> dict:
    """Under ZeRO-3: the stage the trainer's accelerator runs, and whether a model loaded after the trainer was built
    came out sharded by `zero.Init` over both processes (DeepSpeed's batch assertion stops that load when its
    communication layer counts one process: `trl_ext.grpo.deepspeed_comm.join_deepspeed_comm`)."""
    import torch
    from deepspeed import comm
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    param = next(model.parameters())
    plugin = trainer.accelerator.state.deepspeed_plugin
    return {
        "shm_comm_op_built": getattr(comm.cdb, "shm_comm_op", None) is not None,
        "zero_stage": None if plugin is None else plugin.zero_stage,
        "loaded_sharded": hasattr(param, "ds_tensor"),
        "shard_numel": param.ds_tensor.numel() if hasattr(param, "ds_tensor") else None,
        "full_numel": param.ds_numel if hasattr(param, "ds_numel") else param.numel(),
    }


def trainer_weights(trainer, state: dict):
    """The trainer's current weights as a plain module: its unwrapped model, or under ZeRO-3 a plain copy loaded with
    every parameter gathered from the ranks' shards (`deepspeed.zero.GatheredParameters`; every rank calls this)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not trainer.is_deepspeed_enabled or trainer.accelerator.state.deepspeed_plugin.zero_stage != 3:
        return model
    import deepspeed

    gathered = {}
    for name, param in model.named_parameters():
        with deepspeed.zero.GatheredParameters([param]):
            gathered[name] = param.data.detach().clone()
    if "plain" not in state:
        state["plain"] = load_plain(state["model_path"])
        if hasattr(model, "peft_config"):  # the same adapters on the plain copy: the gathered names are PEFT's
            from peft import get_peft_model

            state["plain"] = get_peft_model(state["plain"], model.peft_config["default"]).eval()
    plain = state["plain"]
    missing, unexpected = plain.load_state_dict(gathered, strict=False)
    assert not unexpected and all(k.endswith("lm_head.weight") for k in missing), (missing, unexpected)  # tied
    return plain


def make_ei_trainer(args, out_dir: Path, callbacks):
    import torch
    from datasets import Dataset
    from helpers import free_port
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.expert_iteration import ExpertIterationConfig, ExpertIterationTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = ExpertIterationConfig(
        output_dir=str(out_dir / "ei"),
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        n_ei_steps=2,
        questions_per_step=2,
        keep_min_reward=0.0,
        max_completion_length=MAX_TOKENS,
        num_generations=4,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        lr_scheduler_type="constant",
        seed=0,
        bf16=False,
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=8,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_host="127.0.0.1",
        vllm_server_port=args.port,
        vllm_group_port=free_port(),
        vllm_server_timeout=args.timeout,
    )
    return ExpertIterationTrainer(
        model,
        id_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS * 8}),
        eval_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS[:2]}),
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def make_sft_trainer(args, out_dir: Path, callbacks):
    """`ValidatingSFTTrainer` measuring accuracy with the server (greedy, 4 Countdown problems) after each of 2 SFT
    steps: each measurement pushes the weights over the gloo transfer first."""
    import torch
    from conftest import shared_path
    from datasets import Dataset
    from helpers import free_port
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    from trl_ext.evaluation import EvalConfig, ground_truth_of, load_problems
    from trl_ext.expert_iteration.sft_validation import ValidatingSFTTrainer, ValidationAccuracy

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = EvalConfig(
        model="(the policy)", task="countdown", data_file=str(shared_path("countdown", "dev.parquet")),
        split="train[20:24]", prompt="compact", max_tokens=(MAX_TOKENS,), temperature=0.0, backend="vllm", ns=(1,),
    )  # fmt: skip
    prompts, rows = load_problems(config)
    accuracy = ValidationAccuracy(
        config=config, prompts=prompts, ground_truths=[ground_truth_of("countdown", row) for row in rows],
        reward="countdown", vllm_mode="server", vllm_server_host="127.0.0.1", vllm_server_port=args.port,
        vllm_group_port=free_port(),
    )  # fmt: skip
    sft_args = SFTConfig(
        output_dir=str(out_dir / "sft"), report_to="none", use_cpu=True, save_strategy="no", logging_steps=1,
        max_steps=2, eval_strategy="steps", eval_steps=1, per_device_train_batch_size=4, learning_rate=5e-2,
        lr_scheduler_type="constant", seed=0, bf16=False,
    )  # fmt: skip
    data = Dataset.from_dict({"prompt": TRAIN_PROMPTS, "completion": ["123", "4", "56", "7", "8", "9", "0", "11"]})
    return ValidatingSFTTrainer(
        model=model, args=sft_args, train_dataset=data, processing_class=tokenizer, accuracy=accuracy,
        callbacks=callbacks,
    )  # fmt: skip


def make_trainer(run: str, args, out_dir: Path, callbacks):
    if run == "ei":
        return make_ei_trainer(args, out_dir, callbacks)
    if run == "sft":
        return make_sft_trainer(args, out_dir, callbacks)
    import torch
    from datasets import Dataset
    from helpers import free_port
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    learn = run == "learn"
    resume = run in SEEDED
    extra = {}
    if resume:  # a checkpoint at step 2; the same samples in both runs (vLLM seeds child i of a request with seed + i)
        extra = dict(save_strategy="steps", save_steps=2, generation_kwargs={"seed": 11})
    config = AblationGRPOConfig(
        output_dir=str(out_dir / run),
        report_to="none",
        use_cpu=True,
        **({"save_strategy": "no"} if not resume else {}),
        logging_steps=1,
        max_steps=4 if resume else args.steps,
        max_completion_length=MAX_TOKENS,
        num_generations=4,
        **(LEARN if learn else CHECK),
        lr_scheduler_type="constant",
        seed=0,
        bf16=False,
        disable_dropout=True,
        padding_free=run == "padding_free",
        use_vllm=True,
        vllm_mode="server",
        vllm_server_host="127.0.0.1",
        vllm_server_port=args.port,
        vllm_group_port=free_port(),
        vllm_server_timeout=args.timeout,
        vllm_importance_sampling_correction=True,
        **({"ddp_backend": "gloo"} if run == "ddp" else {}),
        **extra,
    )
    peft_config = None
    if run in ("peft", "zero3_peft"):
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    return AblationGRPOTrainer(
        model,
        digit_share if learn else id_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS * 8}),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )


def wait_until_down(port: int, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                pass
        except OSError:
            return
        time.sleep(0.2)
    raise SystemExit(f"the server on port {port} still answers {limit:g} s after the kill marker")


def train(run: str, args, out_dir: Path) -> dict:
    from helpers import shadowed_methods
    from transformers import TrainerCallback

    record: dict = {"run": run, "checks": [], "validation_checks": []}
    state: dict = {"model_path": args.model}

    class Check(TrainerCallback):
        def on_evaluate(self, _args, train_state, control, **kwargs):
            # EI and SFT validation generate with the server, TRL's sync first: the server holds the weights now,
            # with no sync of this check's own.
            trainer = state["trainer"]
            if run in ("ei", "sft") and trainer.vllm_generation is not None:
                model = trainer_weights(trainer, state)
                record["validation_checks"].append(server_check(trainer, model, state["initial"], state["prompts"]))

        def on_step_end(self, _args, train_state, control, **kwargs):
            trainer = state["trainer"]
            if run == "kill":
                if train_state.global_step == 1:
                    Path(args.kill_marker).write_text(str(os.getpid()))
                    wait_until_down(args.port)
                    record["killed_at"] = time.time()
                return
            if run not in CHECKED:
                return
            trainer.vllm_generation.sync_weights()  # TRL's own sync (a no-op with --no-sync), on every rank
            trainer._last_loaded_step = train_state.global_step  # TRL would sync again before the next generation
            model = trainer_weights(trainer, state)  # on every rank (ZeRO-3 gathers)
            if trainer.accelerator.is_main_process:
                record["checks"].append(server_check(trainer, model, state["initial"], state["prompts"]))

    trainer = make_trainer(run, args, out_dir, [Check()])
    state["trainer"] = trainer
    # From disk: a deepcopy of the prepared model would keep accelerate's forward wrapper, bound to the original.
    state["initial"] = load_plain(args.model)
    if run.startswith("zero3"):
        record["engine"] = zero3_facts(trainer, args.model)
    tokenizer = trainer.processing_class
    state["prompts"] = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in FIXED_PROMPTS]
    instrumented = args.no_sync or run in SEEDED or run.startswith("stall")  # this script's own wrappers below
    if instrumented:
        record["shadowed"] = shadowed_methods(trainer)  # as built, before them
    if args.no_sync and trainer.vllm_generation is not None:
        trainer.vllm_generation.sync_weights = lambda: None
    if run in SEEDED or run.startswith("stall"):
        watch_generation(run, trainer, record, state, args)
    try:
        if run in RESUMES:
            trainer.train(resume_from_checkpoint=str(out_dir / RESUMES[run] / "checkpoint-2"))
        else:
            trainer.train()
        if run == "ei":  # the sync after the last SFT step, then the check
            trainer.vllm_generation.sync_weights()
            model = trainer_weights(trainer, state)
            record["checks"].append(server_check(trainer, model, state["initial"], state["prompts"]))
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["failed_at"] = time.time()
        traceback.print_exc()
    finally:
        client = getattr(trainer.vllm_generation, "vllm_client", None)
        if client is not None:
            client.close_communicator()
    if not instrumented:
        record["shadowed"] = shadowed_methods(trainer)  # after training (and validating)
    record["wrapped"] = type(trainer.model_wrapped).__name__
    record["log_history"] = trainer.state.log_history
    record["global_step"] = trainer.state.global_step
    return record


def wait_for_ack(marker: Path) -> None:
    marker.write_text(str(os.getpid()))
    ack = Path(str(marker) + ".ack")
    deadline = time.monotonic() + 120
    while not ack.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def watch_generation(run: str, trainer, record: dict, state: dict, args) -> None:
    """The seeded runs record every generation's completions (and a resumed run a server check at its first sync,
    before its first generation); the stall runs pause where the test stops the server."""
    generation = trainer.vllm_generation
    record["generations"] = []
    if run in RESUMES:
        sync = generation.sync_weights

        def checked_sync():
            sync()
            if "after_resume" not in record:
                model = trainer_weights(trainer, state)  # on every rank (ZeRO-3 gathers)
                if trainer.accelerator.is_main_process:
                    record["after_resume"] = server_check(trainer, model, state["initial"], state["prompts"])
                record.setdefault("after_resume", {})

        generation.sync_weights = checked_sync
    client = getattr(generation, "vllm_client", None)  # the main process's only
    if client is None:
        return
    generate = client.unrecorded_generate = client.generate

    def recording_generate(*a, **kw):
        step = trainer.state.global_step
        if run == "stall_gen" and step == 1 and "stalled" not in record:
            record["stalled"] = True
            wait_for_ack(Path(args.stall_marker))
        out = generate(*a, **kw)
        record["generations"].append({"step": step, "completion_ids": out["completion_ids"]})
        return out

    client.generate = recording_generate
    if run == "stall_sync":
        tensors = generation._iter_named_params

        def pausing_tensors(*a, **kw):
            for index, item in enumerate(tensors(*a, **kw)):
                yield item
                if index == 2 and trainer.state.global_step == 1:
                    wait_for_ack(Path(args.stall_marker))

        generation._iter_named_params = pausing_tensors


def run_other(run: str, args, out_dir: Path) -> bool:
    """The module's other checks against the same server, in this process (a process start less each):
    `finish_reasons` (tests/scripts/vllm_server_finish_reasons.py, OUT_DIR/finish_reasons.json) and `async` /
    `async_ddp` (tests/scripts/vllm_async.py, one process / the 2 of this launch, into OUT_DIR/async,
    OUT_DIR/async_ddp). A failure writes OUT_DIR/RUN.error (rank 0) and returns True."""
    from helpers import free_port

    try:
        if run == "finish_reasons":
            import vllm_server_finish_reasons

            target = str(out_dir / "finish_reasons.json")
            vllm_server_finish_reasons.main([target, "--port", str(args.port), "--model", args.model,
                                             "--group-port", str(free_port())])  # fmt: skip
        else:
            import vllm_async

            target = out_dir / run
            target.mkdir(exist_ok=True)
            group_port = args.group_port or free_port()  # the same on both ranks under a launch
            vllm_async.main(f"http://127.0.0.1:{args.port}", args.model, target, group_port, ddp=run == "async_ddp")
        return False
    except Exception:
        traceback.print_exc()
        if int(os.environ.get("RANK", "0")) == 0:
            (out_dir / f"{run}.error").write_text(traceback.format_exc()[-4000:])
        return True


@contextmanager
def without_deepspeed(run: str):
    """The DDP runs (`ddp`, `async_ddp`) in the processes of the ZeRO-3 launch (`accelerate launch --config_file
    accelerate_configs/cpu_zero3.yaml`, a process start less each): without the launch's `ACCELERATE_USE_DEEPSPEED`
    while they build their trainers, so transformers and accelerate set up DDP over the launch's gloo group (each
    `TrainingArguments` resets accelerate's state); restored for the ZeRO-3 runs after them."""
    saved = os.environ.pop("ACCELERATE_USE_DEEPSPEED", None) if run in ("ddp", "async_ddp") else None
    try:
        yield
    finally:
        if saved is not None:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = saved


def run_forked(run: str, args, out_dir: Path) -> None:
    """A stall run (`stall_gen` / `stall_sync`) in a forked child: see the module docstring (`--stall-dir`)."""
    stall_dir = Path(args.stall_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: its own output file, marker and timeout; never returns
        code = 1
        try:
            log = os.open(stall_dir / f"{run}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            args.stall_marker, args.timeout = str(stall_dir / f"{run}.marker"), args.stall_timeout
            record = train(run, args, out_dir)
            code = 1 if "error" in record else 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    (stall_dir / f"{run}.pid").write_text(str(pid))
    _, status = os.waitpid(pid, 0)
    exited = time.monotonic()  # CLOCK_MONOTONIC: the test's clock too
    # This process is the child's subreaper (`main`): anything the child left running is now a child of this one.
    left = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent_of(p) == os.getpid()]
    record = {"code": os.waitstatus_to_exitcode(status), "exited": exited, "left": left}
    (stall_dir / f"{run}.exit").write_text(json.dumps(record))
    go, deadline = stall_dir / f"{run}.go", time.monotonic() + 900
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _parent_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def preload() -> None:
    """The imports of a GRPO run in server mode, before the stall runs fork (each child then starts with them)."""
    import transformers  # noqa: F401
    from datasets import Dataset  # noqa: F401

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer  # noqa: F401
    from trl_ext.grpo.vllm.generation import TrlExtVLLMGeneration  # noqa: F401


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--runs", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--learn-steps", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--no-sync", action="store_true")
    parser.add_argument("--kill-marker")
    parser.add_argument("--stall-marker")
    parser.add_argument("--group-port", type=int, help="the weight-sync port of `async_ddp` (the same on every rank)")
    parser.add_argument("--stall-dir", help="run the stall runs as forked children (module docstring)")
    parser.add_argument("--stall-timeout", type=float, default=15.0)
    args = parser.parse_args()
    if args.stall_dir:
        preload()
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back here
    import torch

    torch.set_num_threads(1)
    out_dir = Path(args.out_dir)
    failed = False
    for run in args.runs.split(","):
        if args.stall_dir and run.startswith("stall"):
            run_forked(run, args, out_dir)
            continue
        if run in ("finish_reasons", "async", "async_ddp"):
            with without_deepspeed(run):
                run_other(run, args, out_dir)  # its failure fails only its own tests (the .error file)
            continue
        steps = args.steps
        args.steps = args.learn_steps if run == "learn" else steps
        with without_deepspeed(run):
            record = train(run, args, out_dir)
        args.steps = steps
        if int(os.environ.get("RANK", "0")) == 0:
            (out_dir / f"{run}.json").write_text(json.dumps(record))
        failed = failed or "error" in record
    sys.exit(1 if failed else 0)


if __name__ == "__main__":  # vLLM may spawn processes: they must not rerun this
    main()
