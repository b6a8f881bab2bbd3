"""The bytes DeepSpeed's ZeRO engine holds per rank, for tests/test_zero_memory.py.

Usage (W ranks: tests/helpers.py `run_ranks`, or torch.distributed.run): zero_memory.py OUT_DIR MODEL_DIR

For ZeRO stages 2 and 3 in turn: `deepspeed.initialize` on the model in MODEL_DIR (bf16, torch's AdamW, as the GPU
layouts run it), one forward and backward, then per rank the numel and element size of what the engine keeps,
read from its own partitions (not the process's memory): the bf16 weights (ZeRO-3: each parameter's `ds_tensor`),
the fp32 master partition, AdamW's `exp_avg` / `exp_avg_sq` (after one step, when torch allocates them) and the
gradient partition. Writes OUT_DIR/zero{stage}_rank{rank}.json.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import torch


def nbytes(tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def measure(stage: int, model_dir: str) -> dict:
    import deepspeed
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    engine, zero_opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    ids = torch.arange(7, 15).unsqueeze(0)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    out = {"world_size": engine.world_size, "optimizer": type(zero_opt).__name__}
    if stage == 3:
        params = list(engine.module.parameters())
        out["weights"] = nbytes(p.ds_tensor for p in params)
        out["weights_full_numel"] = int(sum(p.ds_numel for p in params))
        out["grads"] = nbytes(g for group in zero_opt.averaged_gradients.values() for g in group)
        out["master"] = nbytes(zero_opt.fp32_partitioned_groups_flat)
    else:
        out["weights"] = nbytes(p for p in engine.module.parameters())
        out["weights_full_numel"] = int(sum(p.numel() for p in engine.module.parameters()))
        out["grads"] = nbytes(g for group in zero_opt.averaged_gradients.values() for g in group)
        out["master"] = nbytes(zero_opt.single_partition_of_fp32_groups)
    engine.step()
    out["states"] = nbytes(
        v
        for state in zero_opt.optimizer.state.values()
        for k, v in state.items()
        if torch.is_tensor(v) and k != "step"
    )
    return out


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers import muon_uncompiled, no_shm_comm

    no_shm_comm()
    muon_uncompiled()
    import deepspeed  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401

    gc.freeze()  # the imported modules' objects out of ZeRO-3's full garbage collection (its defragmentation)
    out_dir, model_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    for stage in (2, 3):
        result = measure(stage, model_dir)
        with open(os.path.join(out_dir, f"zero{stage}_rank{rank}.json"), "w") as f:
            json.dump(result, f)
    # Both ranks leave together and close gloo's connections: a rank that exits while its peer still holds them can
    # abort in gloo's teardown ("terminate called without an active exception", seen once under a full suite).
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
