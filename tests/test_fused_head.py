"""`compact_lm_head`: TRL's fused LM head scores only the completion tokens on the CPU, with TRL's results.

Ours (`AblationGRPOTrainer._get_per_token_logps_and_entropies`, padded and `padding_free`) against stock
`trl.GRPOTrainer`'s, which on the CPU runs every position (prompt, completion, padding) through the head: log-probs,
entropies and the gradients of a weighted sum of both, on ragged rows, with the char vocabulary (1 tile) and the
real Qwen3 vocabulary (151,669 rows: 5 tiles of 32,768). Run with `-s` for the differences.

Bugs caught: the compact path left off (the head sees `B * (L - 1)` rows:
`test_only_completion_tokens_reach_the_head`), a scatter back to `(B, T)` that misplaces tokens or leaves values at
padding (equality with stock TRL), the swap leaking out of the block or changing TRL's choice on other devices.
"""

from __future__ import annotations

import pytest
import torch
import trl.trainer.utils as trl_utils
from helpers import ragged_rows
from test_trainer_helpers import make_trainer, max_rel_diff, one_torch_thread  # noqa: F401 (autouse fixture)
from trl import GRPOTrainer

from trl_ext.grpo.fused_head import compact_lm_head

LOGP_ATOL, GRAD_RTOL = 1e-6, 1e-5


def _logps_entropies_grads(trainer, method, input_ids, mask, t):
    """`method(trainer, ...)` in chunks of 3 rows with entropies; then the gradient of a fixed weighted sum."""
    model = trainer.model
    model.zero_grad(set_to_none=True)
    logps, entropies, _ = method(trainer, model, input_ids, mask, t, batch_size=3, compute_entropy=True)
    weights = torch.linspace(-1.0, 1.0, logps.numel()).view_as(logps)
    ((logps * weights).sum() + (entropies * weights.flip(0)).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), entropies.detach(), grads


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding_free"])
@pytest.mark.parametrize("vocabulary", ["char", "qwen3"])
def test_compact_head_equals_stock_trl(char_tokenizer, qwen3_tokenizer, tmp_path, vocabulary, padding_free):
    tokenizer = qwen3_tokenizer if vocabulary == "qwen3" else char_tokenizer
    stock = make_trainer(tokenizer, tmp_path / "stock", stock=True)
    ours = make_trainer(tokenizer, tmp_path / "ours", padding_free=padding_free)
    input_ids, mask, t = ragged_rows(len(tokenizer), seed=1)
    trl_logps, trl_ent, trl_grads = _logps_entropies_grads(
        stock, GRPOTrainer._get_per_token_logps_and_entropies, input_ids, mask, t
    )
    logps, ent, grads = _logps_entropies_grads(ours, type(ours)._get_per_token_logps_and_entropies, input_ids, mask, t)
    completion = mask[:, -t:].bool()
    assert (logps[~completion] == 0).all() and (ent[~completion] == 0).all()
    diffs = (
        (logps - trl_logps).abs().max().item(),
        (ent - trl_ent).abs().max().item(),
        max_rel_diff(grads, trl_grads),
    )
    print(f"\n[compact head] {vocabulary}, padding_free={padding_free}: |dlogp| {diffs[0]:.1e}, "
          f"|dentropy| {diffs[1]:.1e}, grad rel {diffs[2]:.1e}")  # fmt: skip
    torch.testing.assert_close(logps, trl_logps, atol=LOGP_ATOL, rtol=0)
    torch.testing.assert_close(ent, trl_ent, atol=LOGP_ATOL, rtol=0)
    assert diffs[2] < GRAD_RTOL
    assert not trl_utils._use_triton(torch.device("cpu"))  # TRL's own choice again after the call


def _head_row_counts(trainer, method, input_ids, mask, t) -> set[int]:
    """Row counts of the `(n, hidden)` hidden-state matrices autograd saved (TRL's LM head saves its input)."""
    hidden = trainer.model.config.hidden_size
    rows: set[int] = set()

    def pack(tensor):
        if tensor.dim() == 2 and tensor.size(1) == hidden and tensor.is_floating_point():
            rows.add(tensor.size(0))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        method(trainer, trainer.model, input_ids, mask, t)
    return rows


def test_only_completion_tokens_reach_the_head(char_tokenizer, tmp_path):
    input_ids, mask, t = ragged_rows(len(char_tokenizer))
    scored = int(mask[:, -t:].sum())  # 23 completion tokens
    every_position = input_ids.size(0) * (input_ids.size(1) - 1)  # 70 = 5 rows x 14 next-token positions
    stock = make_trainer(char_tokenizer, tmp_path / "stock", stock=True)
    ours = make_trainer(char_tokenizer, tmp_path / "ours")
    stock_rows = _head_row_counts(stock, GRPOTrainer._get_per_token_logps_and_entropies, input_ids, mask, t)
    our_rows = _head_row_counts(ours, type(ours)._get_per_token_logps_and_entropies, input_ids, mask, t)
    assert every_position in stock_rows and scored not in stock_rows  # the observation sees TRL's CPU path
    assert scored in our_rows and every_position not in our_rows, our_rows


def test_swap_is_scoped_to_the_block_and_the_cpu():
    trl_choice = trl_utils._use_triton
    cpu, meta = torch.device("cpu"), torch.device("meta")  # meta: a device type without Triton other than the CPU
    assert not trl_choice(cpu)
    with compact_lm_head():
        assert trl_utils._use_triton(cpu)
        assert trl_utils._use_triton(meta) == trl_choice(meta)  # XLA / Neuron-like devices keep TRL's choice
    assert trl_utils._use_triton is trl_choice
    with pytest.raises(RuntimeError), compact_lm_head():
        raise RuntimeError("a failing forward")
    assert trl_utils._use_triton is trl_choice
