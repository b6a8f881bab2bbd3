"""The same GRPO batches under DDP, ZeRO-2 and ZeRO-3 on two CPU processes, for tests/test_zero_training.py.

Usage: zero_equivalence.py OUT_DIR MODEL_DIR ENGINE[,ENGINE ...]

Runs under `accelerate launch --config_file accelerate_configs/cpu_zero3.yaml`, every ENGINE in turn in the launch's
two processes (one process start for all three; `engine_environment`): `ddp` without the launch's
`ACCELERATE_USE_DEEPSPEED`, so TrainingArguments sets up DDP over the launch's gloo group; `zero2` with the
environment `accelerate_configs/cpu_zero2.yaml` gives a launch (stage 2, no ZeRO-3 fields); `zero3` with the
launch's own. Each `TrainingArguments` re-reads that environment and resets accelerate's state, so each trainer
builds its own engine as the GPU layouts do. For the default objective with beta 0.04 (a reference model: TRL loads
it from MODEL_DIR and, under ZeRO-3, shards it through `prepare_deepspeed`) and Dr.GRPO with beta 0, one trainer
each runs one optimizer step; the completions are fixed (a function of the prompt's tokens, the row and the rank)
so every engine scores the same batches. On the step's batch, before the step, `_compute_loss` and the engine's own
backward run with `padding_free` off and on, and each rank records its loss, the reference log-probs of the batch
and every full gradient (`deepspeed.utils.safe_get_full_grad` under ZeRO: the averaged gradient DeepSpeed reduced
into its partitions; each flag's own gradient, see ACCUMULATES), and what the trainer ran: the wrapper's class, the
ZeRO stage of its DeepSpeed engine, whether the policy's and the reference's parameters are ZeRO-3 partitions.
With beta > 0 the policy starts perturbed from the reference (MODEL_DIR/../policy: MODEL_DIR's weights perturbed),
so the KL term counts. Writes OUT_DIR/ENGINE_rank{rank}.json.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "scripts"))
# No generation here (the completions are fixed): hide vLLM, which TRL's GRPO module imports whenever it is installed
# (8 of a process's 20 CPU seconds of imports on a 2-core CPU; six processes per test run). `find_spec("vllm")` is
# then None, so TRL's `is_vllm_available()` is False and nothing of vLLM loads.
sys.modules["vllm"] = None

# run -> (TRL loss_type, None: the project's default objective; beta)
# (Dr.GRPO first: with `use_cpu=True` a process's first GRPOTrainer with beta > 0 under an accelerate DeepSpeed
# config failed in TRL's load of the reference model on DeepSpeed's batch assertion, until
# `trl_ext.grpo.deepspeed_comm.join_deepspeed_comm`; docs/gpu.md.)
RUNS = {"dr_grpo_b0": ("dr_grpo", 0.0), "default_b04": (None, 0.04)}

# Two backwards without an optimizer step in between (the flag off, then on): DDP's `.grad` and ZeRO-3's gradient
# partitions add the second to the first (the engine's zero_grad does not clear ZeRO-3's partitions before its
# step); ZeRO-2 at a gradient-accumulation boundary keeps only the last. Each flag's own gradient is recorded.
ACCUMULATES = {"ddp": True, "zero2": False, "zero3": True}


# The launch's (cpu_zero3.yaml) DeepSpeed variables that cpu_zero2.yaml's launch does not export.
ZERO3_ONLY = ("ACCELERATE_DEEPSPEED_ZERO3_INIT", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL")


@contextmanager
def engine_environment(engine: str):
    """The launch's environment as a launch of ENGINE's own config would have set it, while ENGINE's trainer is
    built and trains: `ddp` without `ACCELERATE_USE_DEEPSPEED`, `zero2` at stage 2 without the ZeRO-3 fields,
    `zero3` unchanged. Restored afterwards."""
    saved = dict(os.environ)
    if engine == "ddp":
        os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
    elif engine == "zero2":
        os.environ["ACCELERATE_DEEPSPEED_ZERO_STAGE"] = "2"
        for name in ZERO3_ONLY:
            os.environ.pop(name, None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def fixed_completions(prompt_ids: list[list[int]], rank: int, vocab: int, eos: int) -> list[list[int]]:
    """Deterministic completions of ragged lengths (1 to 8 tokens, some ending in eos) for a generation batch."""
    out = []
    for row, ids in enumerate(prompt_ids):
        n = 1 + (sum(ids) + 3 * row + rank) % 8
        toks = [7 + (sum(ids) * 31 + 17 * row + 5 * k + rank) % (vocab - 7) for k in range(n)]
        if (row + rank) % 3 == 0:
            toks[-1] = eos
        out.append(toks)
    return out


def main() -> None:
    out_dir, model_dir, engines = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    torch.set_num_threads(1)
    from helpers import muon_uncompiled, no_shm_comm

    no_shm_comm()
    muon_uncompiled()
    from test_trainer_helpers import make_trainer
    from transformers import AutoModelForCausalLM

    from trl_ext import AblationGRPOTrainer
    from trl_ext.tiny import build_char_tokenizer

    # Every `train()` ends in a full garbage collection (accelerate's `free_memory`), as does ZeRO-3's defragmentation:
    # 0.4 CPU s each over the imported modules' objects. Frozen, they are left out of every collection.
    gc.freeze()

    rank = int(os.environ["RANK"])
    tokenizer = build_char_tokenizer()

    class Recording(AblationGRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            return fixed_completions(prompt_ids, rank, len(tokenizer), tokenizer.eos_token_id), None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if not self.record:
                self.record.update(self._measure(model, inputs))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def _measure(self, model, inputs) -> dict:
            out = {"wrapped": type(model).__name__}
            ref = inputs.get("ref_per_token_logps")
            out["ref_logps"] = None if ref is None else (ref * inputs["completion_mask"]).tolist()
            out["advantages"] = inputs["advantages"].tolist()
            model.train()
            model.zero_grad()
            before = None
            for flag in (False, True):
                self.args.padding_free = flag
                self.current_gradient_accumulation_steps = 1
                loss = self._compute_loss(model, inputs)
                if self.engine == "ddp":
                    loss.backward()
                    grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters()}
                else:
                    from deepspeed.utils import safe_get_full_grad

                    model.backward(loss)  # the engine's own backward: reduces into its partitions, no step
                    grads = {n: safe_get_full_grad(p).detach().clone() for n, p in self.model.named_parameters()}
                own = (
                    grads
                    if before is None or not ACCUMULATES[self.engine]
                    else {n: g - before[n] for n, g in grads.items()}
                )
                before = grads
                kl = self._metrics["train"]["kl"][-1] if self.beta else None  # mean over both ranks
                out[f"padding_free={flag}"] = {
                    "loss": loss.item(),
                    "kl": kl,
                    "grads": {n: g.flatten().tolist() for n, g in own.items()},
                }
            model.zero_grad()
            self.args.padding_free = False
            return out

    def run(engine: str, name: str, loss_type: str | None, beta: float) -> dict:
        # With beta > 0 the policy starts from MODEL_DIR/../policy (MODEL_DIR's weights perturbed) and TRL loads the
        # reference from MODEL_DIR (the policy config's name), so the KL term and its gradient are not zero.
        model = AutoModelForCausalLM.from_pretrained(Path(model_dir).parent / "policy" if beta else model_dir)
        model.config._name_or_path = model_dir
        kwargs = dict(
            trainer_cls=Recording, model=model, max_steps=1, beta=beta,
            use_cpu=engine == "ddp", ddp_backend="gloo", learning_rate=1e-2,
        )  # fmt: skip
        if loss_type is not None:
            kwargs.update(loss_type=loss_type, scale_rewards="none")
        trainer = make_trainer(tokenizer, os.path.join(out_dir, f"{engine}_{name}"), **kwargs)
        trainer.engine, trainer.record = engine, {}
        trainer.train()
        wrapped = trainer.model_wrapped
        trainer.record["engine"] = type(wrapped).__name__
        trainer.record["processes"] = trainer.accelerator.num_processes
        stage = getattr(wrapped, "zero_optimization_stage", None)  # DeepSpeedEngine's: the stage it runs
        trainer.record["zero_stage"] = None if stage is None else stage()
        trainer.record["zero3"] = hasattr(next(trainer.model.parameters()), "ds_tensor")
        trainer.record["ref_engine"] = None if trainer.ref_model is None else type(trainer.ref_model).__name__
        trainer.record["ref_zero3"] = bool(trainer.ref_model is not None and hasattr(
            next(trainer.ref_model.parameters()), "ds_tensor"))  # fmt: skip
        return trainer.record

    for engine in engines:
        with engine_environment(engine):
            results = {name: run(engine, name, loss_type, beta) for name, (loss_type, beta) in RUNS.items()}
        with open(os.path.join(out_dir, f"{engine}_rank{rank}.json"), "w") as f:
            json.dump(results, f)
    # Both ranks leave together and close gloo's connections (a rank that exits while its peer still holds them can
    # abort in gloo's teardown).
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
