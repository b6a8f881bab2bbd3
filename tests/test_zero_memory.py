"""The preflight's DeepSpeed terms (trl_ext/preflight/memory.py) against a real ZeRO engine on two CPU processes.

tests/scripts/zero_memory.py runs `deepspeed.initialize` at ZeRO-2 and ZeRO-3 (bf16, torch's AdamW, as the GPU
layouts run it) on a tiny Qwen3 and reads, per rank, the partitions DeepSpeed itself holds: the bf16 weights (ZeRO-3:
each parameter's `ds_tensor`), the gradient partition, the fp32 master partition and AdamW's two moments. The
preflight's `weights`, gradients and `optimizer states` for the same model, stage and W must equal them.

Tolerance: DeepSpeed pads each partition so that it splits evenly: ZeRO-3 each parameter to a multiple of W elements,
ZeRO-2 each flat group to a multiple of 2 W. The padding is at most W - 1 elements per tensor (ZeRO-3) or 2 W - 1
per group (ZeRO-2), which the formula does not count; the bound below allows exactly that much and no more.
Bugs caught: ZeRO-2's weights counted sharded, gradients counted in fp32 or unsharded, the master copy or the states
counted in bf16 or not divided by W.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import run_ranks

from trl_ext.preflight.memory import _model_states
from trl_ext.preflight.models import ModelShape
from trl_ext.preflight.setup import TrainingSetup

SCRIPT = Path(__file__).resolve().parent / "scripts" / "zero_memory.py"
WORLD = 2

if os.environ.get("TRL_EXT_REQUIRE_VLLM") != "1":  # `make test` on a CPU machine installs DeepSpeed: must run there
    pytest.importorskip("deepspeed", reason="DeepSpeed not installed (the deepspeed extra)")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from test_trainer_helpers import tiny_model

    from trl_ext.tiny import build_char_tokenizer

    root = tmp_path_factory.mktemp("zero_memory")
    model = tiny_model(build_char_tokenizer())
    model.save_pretrained(root / "model")
    n_tensors = len(list(model.parameters()))
    run_ranks(SCRIPT, str(root), str(root / "model"), nproc=WORLD, timeout=400)
    ranks = {
        stage: [json.loads((root / f"zero{stage}_rank{r}.json").read_text()) for r in range(WORLD)] for stage in (2, 3)
    }
    return ModelShape.from_config(json.loads((root / "model" / "config.json").read_text())), n_tensors, ranks


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_preflight_zero_terms_equal_deepspeeds_partitions(measured, stage):
    shape, n_tensors, ranks = measured
    resident, grads, temp = _model_states(shape, TrainingSetup(zero_stage=stage, world_size=WORLD))
    for rank in ranks[stage]:
        assert rank["world_size"] == WORLD
        assert rank["weights_full_numel"] == shape.params  # the preflight counts the model DeepSpeed holds
        # padding bound, in elements per rank (module docstring)
        pad = n_tensors * (WORLD - 1) if stage == 3 else 2 * WORLD - 1
        for name, ours, theirs, elem in (
            ("weights", resident["weights"], rank["weights"], 2),
            ("gradients", grads, rank["grads"], 2),
            ("optimizer states", resident["optimizer states"], rank["master"] + rank["states"], 12),
        ):
            print(f"\n[zero{stage}] W={WORLD} {name}: preflight {ours:.0f} B, DeepSpeed {theirs} B")
            sharded = stage == 3 or name != "weights"
            assert theirs >= ours and theirs - ours <= (pad * elem if sharded else 0), name
        assert temp == 0.0  # DeepSpeed steps its optimizer on its own partitions: no foreach copy of the states
