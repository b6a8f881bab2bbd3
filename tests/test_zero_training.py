"""GRPO under DeepSpeed ZeRO-2 and ZeRO-3 on two CPU processes (gloo): the same batches give the same losses and
gradients as under DDP.

tests/scripts/zero_equivalence.py runs the three engines one after the other in the two processes of one
`accelerate launch --config_file accelerate_configs/cpu_zero3.yaml` (one process start for all three): DDP without
the launch's `ACCELERATE_USE_DEEPSPEED`, ZeRO-2 with the environment a launch of accelerate_configs/cpu_zero2.yaml
sets, ZeRO-3 with the launch's own (the CPU counterparts of the GPU layouts' zero2 / zero3.yaml). Each engine trains
the default objective with beta 0.04 (TRL's reference model; under ZeRO-3 sharded by
`trl.models.utils.prepare_deepspeed`) and Dr.GRPO with beta 0, on fixed completions, and records on the first
optimizer step's batch each rank's loss and every full gradient, `padding_free` off and on, and what it ran (the
wrapper, DeepSpeed's ZeRO stage, the partitioned parameters). With beta > 0 the policy starts from perturbed
weights, so the KL term and its gradient count.

The reference is DDP, itself checked against single-process training elsewhere (tests/test_trainer_distributed.py).
Tolerances: losses and reference log-probs to 1e-6 (the same fp32 forward), gradients to 1e-5 of each tensor's
largest entry (DDP all-reduces in buckets, DeepSpeed reduce-scatters partitions: fp32 sums in another order).
Bugs caught: ZeRO-3's gathered forward or the sharded reference model scoring differently, gradients not averaged
over ranks (a factor of 2), `padding_free`'s packed forward under ZeRO-3's parameter hooks, Dr.GRPO's constant
normaliser counted per rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "zero_equivalence.py"
ENGINES = ("ddp", "zero2", "zero3")
RUNS = ("default_b04", "dr_grpo_b0")
FLAGS = ("padding_free=False", "padding_free=True")

if os.environ.get("TRL_EXT_REQUIRE_VLLM") != "1":  # `make test` on a CPU machine installs DeepSpeed: must run there
    pytest.importorskip("deepspeed", reason="DeepSpeed not installed (the deepspeed extra)")


def launch(out: Path, model_dir: Path) -> subprocess.CompletedProcess:
    """Every engine in turn in one ZeRO-3 launch's two processes (the script sets each engine's environment)."""
    config = ROOT / "accelerate_configs" / "cpu_zero3.yaml"
    head = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    head += ["--main_process_port", str(free_port())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(out / "launch.log", "w") as log:
        cmd = [*head, str(SCRIPT), str(out), str(model_dir), ",".join(ENGINES)]
        return subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=600)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """{engine: [rank 0 record, rank 1 record]}, from one launch."""
    from test_trainer_helpers import tiny_model

    from trl_ext.tiny import build_char_tokenizer

    out = tmp_path_factory.mktemp("zero_training")
    model = tiny_model(build_char_tokenizer())
    model.save_pretrained(out / "model")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the policy of the beta > 0 runs: away from the reference, so the KL term counts
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out / "policy")
    proc = launch(out, out / "model")
    assert proc.returncode == 0, (out / "launch.log").read_text()[-3000:]
    return {e: [json.loads((out / f"{e}_rank{r}.json").read_text()) for r in (0, 1)] for e in ENGINES}


def max_rel(a: dict, b: dict) -> float:
    return max(
        ((torch.tensor(b[n]) - torch.tensor(g)).abs().max() / torch.tensor(g).abs().max().clamp(min=1e-12)).item()
        for n, g in a.items()
    )


@pytest.mark.slow
def test_the_engines_are_what_they_claim(records):
    """All three ran in the same two processes: each trainer's wrapper, DeepSpeed's own stage and whether the policy
    is ZeRO-3 partitioned show that each built the engine it is named after."""
    for rank in (0, 1):
        for run in RUNS:
            assert all(records[engine][rank][run]["processes"] == 2 for engine in ENGINES)
            assert records["ddp"][rank][run]["engine"] == "DistributedDataParallel"
            assert records["ddp"][rank][run]["zero_stage"] is None and records["ddp"][rank][run]["zero3"] is False
            for engine, stage in (("zero2", 2), ("zero3", 3)):
                assert records[engine][rank][run]["engine"] == "DeepSpeedEngine"
                assert records[engine][rank][run]["zero_stage"] == stage
                assert records[engine][rank][run]["zero3"] is (stage == 3)  # ZeRO-3's parameters are partitions
            with_ref = run.endswith("b04")
            # TRL prepares the reference as a DeepSpeed engine under ZeRO, with ZeRO-3's sharded parameters at stage 3
            assert (records["zero3"][rank][run]["ref_engine"] == "DeepSpeedEngine") is with_ref
            assert records["zero3"][rank][run]["ref_zero3"] is with_ref
            assert records["zero2"][rank][run]["ref_zero3"] is False


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero2", "zero3"])
@pytest.mark.parametrize("run", RUNS)
def test_same_losses_and_gradients_as_ddp(records, engine, run):
    for rank in (0, 1):
        ddp, zero = records["ddp"][rank][run], records[engine][rank][run]
        assert zero["advantages"] == ddp["advantages"]  # the same batches
        if run.endswith("b04"):
            torch.testing.assert_close(
                torch.tensor(zero["ref_logps"]), torch.tensor(ddp["ref_logps"]), rtol=0, atol=1e-6
            )
        else:
            assert ddp["ref_logps"] is None and zero["ref_logps"] is None
        for flag in FLAGS:
            assert zero[flag]["loss"] == pytest.approx(ddp[flag]["loss"], abs=1e-6), flag
            rel = max_rel(ddp[flag]["grads"], zero[flag]["grads"])
            print(
                f"\n[{engine} {run} rank {rank} {flag}] loss {zero[flag]['loss']:+.6f} max rel grad vs DDP {rel:.1e}"
            )
            assert rel <= 1e-5, flag


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_each_engine_agrees_with_itself_and_the_checks_can_fail(records, run):
    """Per engine: the ranks scored their own batches, `padding_free`'s packed loss and gradient equal the padded
    ones, the gradients are not 0, and with beta > 0 the KL term is not 0 (the policy starts away from the
    reference) and the same under every engine."""
    if run.endswith("b04"):
        kl = records["ddp"][0][run]["padding_free=False"]["kl"]
        assert kl > 1e-4
        for engine in ENGINES:
            for rank in records[engine]:
                for flag in FLAGS:
                    assert rank[run][flag]["kl"] == pytest.approx(kl, abs=1e-6), (engine, flag)
    for engine in ENGINES:
        r0, r1 = records[engine]
        assert r0[run]["padding_free=False"]["loss"] != r1[run]["padding_free=False"]["loss"]  # ranks' own batches
        for rank in (r0, r1):
            padded, packed = rank[run]["padding_free=False"], rank[run]["padding_free=True"]
            assert packed["loss"] == pytest.approx(padded["loss"], abs=1e-6)
            assert max_rel(padded["grads"], packed["grads"]) <= 1e-5
            assert max(max(abs(v) for v in g) for g in padded["grads"].values()) > 1e-3
