"""compute_entropy, get_response_log_probs and tokenize_prompt_and_output (char tokenizer, real Qwen3 tokenizer)."""

from __future__ import annotations

import math

import pytest
import torch

from trl_ext.objectives import compute_entropy, get_response_log_probs, tokenize_prompt_and_output


def loop_entropy(logits: torch.Tensor) -> torch.Tensor:
    """float64 reference, one distribution at a time: H = -sum p log p with p = exp(z - max) / sum exp(z - max)."""
    flat = logits.double().reshape(-1, logits.shape[-1]).tolist()
    out = []
    for row in flat:
        top = max(row)
        weights = [math.exp(z - top) for z in row]
        norm = sum(weights)
        out.append(-sum(w / norm * math.log(w / norm) for w in weights if w > 0))
    return torch.tensor(out, dtype=torch.float64).reshape(logits.shape[:-1])


def test_entropy_by_hand():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0], [math.log(3), 0.0, -math.inf, -math.inf]]])
    got = compute_entropy(logits)
    assert got.shape == (1, 3)
    # uniform over 4 -> log 4; one-hot (up to e^-100) -> 0; (3/4, 1/4) -> -(.75 log .75 + .25 log .25)
    want = torch.tensor([[math.log(4), 0.0, -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]])
    assert torch.allclose(got, want, atol=1e-6)
    # the -inf logits of banned tokens must not turn the gradient into NaN either
    logits.requires_grad_()
    compute_entropy(logits).sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_matches_loop_on_random_logits():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    assert torch.allclose(compute_entropy(logits), loop_entropy(logits), rtol=1e-12, atol=1e-12)


def test_entropy_large_fp32_logits():
    gen = torch.Generator().manual_seed(1)
    spread = torch.randn(2, 5, 50, generator=gen) * 1e4  # entropy ~ 0: one logit dominates by thousands
    close = 1e4 + torch.rand(2, 5, 50, generator=gen) * 3  # magnitude 1e4, entropy near log 50
    for logits in (spread, close, -close):
        got = compute_entropy(logits)
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert torch.allclose(got.double(), loop_entropy(logits), rtol=0, atol=1e-4)
    assert compute_entropy(close).min() > 3.0  # the near-uniform case is not trivially 0


def test_entropy_bf16_input():
    gen = torch.Generator().manual_seed(2)
    for scale in (1.0, 30.0, 1e4):
        logits = (torch.randn(3, 4, 64, generator=gen) * scale).bfloat16()
        got = compute_entropy(logits)
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        # reference on the same bf16 values: the only error left is the fp32 arithmetic
        assert torch.allclose(got.double(), loop_entropy(logits), rtol=0, atol=1e-5)


def test_entropy_gradcheck():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(compute_entropy, (logits,))


# char tokenizer ids: <pad> 0, <eos> 1, <answer> 2, </answer> 3, '0'..'9' 6..15, 'a' 16, 'b' 17, 'c' 18
def test_tokenize_char_tokenizer_by_hand(char_tokenizer):
    out = tokenize_prompt_and_output(["ab", "c"], ["1", "<answer>3</answer>"], char_tokenizer)
    # full ids: row 0 = a b 1 <pad>             (prompt 2 + output 1, right padded to 4)
    #           row 1 = c <answer> 3 </answer>   (prompt 1 + output 3: the longest, max_len = 4)
    assert out["input_ids"].tolist() == [[16, 17, 7], [18, 2, 9]]
    assert out["labels"].tolist() == [[17, 7, 0], [2, 9, 3]]
    assert out["response_mask"].tolist() == [[False, True, False], [True, True, True]]
    assert out["response_mask"].dtype == torch.bool and out["input_ids"].dtype == torch.long


def test_tokenize_pads_right_with_eos_when_no_pad_token():
    from trl_ext.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.pad_token = None
    out = tokenize_prompt_and_output(["abc", "a"], ["1", "2"], tok)
    # row 1 = a 2 <eos> <eos>: padded with eos (id 1) at the end
    assert out["input_ids"].tolist() == [[16, 17, 18], [16, 8, 1]]
    assert out["labels"].tolist() == [[17, 18, 7], [8, 1, 1]]
    assert out["response_mask"].tolist() == [[False, False, True], [True, False, False]]


def test_tokenize_adds_no_special_tokens():
    from tokenizers import processors

    from trl_ext.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    # a tokenizer that appends <eos> (id 1) whenever special tokens are on
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="$A <eos>", special_tokens=[("<eos>", 1)])
    assert tok("ab")["input_ids"] == [16, 17, 1]
    out = tokenize_prompt_and_output(["ab"], ["c"], tok)
    assert out["input_ids"].tolist() == [[16, 17]] and out["labels"].tolist() == [[17, 18]]


def test_tokenize_errors(char_tokenizer):
    with pytest.raises(ValueError, match="prompt_strs has 2 items but output_strs has 1"):
        tokenize_prompt_and_output(["a", "b"], ["c"], char_tokenizer)
    with pytest.raises(ValueError, match="empty"):
        tokenize_prompt_and_output([], [], char_tokenizer)


def test_tokenize_qwen3(qwen3_tokenizer):
    prompts = ["Hello", "2 + 3 ="]
    outputs = [" world", " <answer>5</answer>"]
    out = tokenize_prompt_and_output(prompts, outputs, qwen3_tokenizer)
    # "Hello" 9707, " world" 1879; the second row is 5 + 7 = 12 tokens, the longest, so max_len - 1 = 11
    assert out["input_ids"].shape == out["labels"].shape == out["response_mask"].shape == (2, 11)
    pad = qwen3_tokenizer.pad_token_id
    assert pad == 151643  # <|endoftext|>
    assert out["input_ids"][0].tolist() == [9707, 1879] + [pad] * 9
    assert out["labels"][0].tolist() == [1879] + [pad] * 10
    assert out["response_mask"][0].tolist() == [True] + [False] * 10
    # independent reference for the long row: encode each part on its own
    p = qwen3_tokenizer.encode(prompts[1], add_special_tokens=False)
    o = qwen3_tokenizer.encode(outputs[1], add_special_tokens=False)
    assert (len(p), len(o)) == (5, 7)
    assert out["input_ids"][1].tolist() == (p + o)[:-1] and out["labels"][1].tolist() == (p + o)[1:]
    assert out["response_mask"][1].tolist() == [False] * 4 + [True] * 7
    assert qwen3_tokenizer.decode(out["labels"][1][out["response_mask"][1]]) == outputs[1]


def test_get_response_log_probs_matches_manual_gather(tiny_model, char_tokenizer):
    batch = tokenize_prompt_and_output(["ab+c", "1"], ["<answer>12</answer>", "xy"], char_tokenizer)
    out = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], return_token_entropy=True)
    assert set(out) == {"log_probs", "token_entropy"}
    assert out["log_probs"].shape == out["token_entropy"].shape == batch["labels"].shape
    assert out["log_probs"].requires_grad  # training needs the graph
    with torch.no_grad():
        logits = tiny_model(batch["input_ids"]).logits.double()
    labels = batch["labels"]
    want = torch.tensor(
        [[torch.log_softmax(logits[b, t], -1)[labels[b, t]].item() for t in range(labels.shape[1])] for b in range(2)],
        dtype=torch.float64,
    )
    assert torch.allclose(out["log_probs"].detach().double(), want, rtol=0, atol=1e-5)
    assert torch.allclose(out["token_entropy"].detach().double(), loop_entropy(logits), rtol=0, atol=1e-5)
    # right padding cannot change the scores of earlier positions: row 1 alone gives the same numbers
    n = 3  # prompt "1" + output "xy": 3 tokens, so 2 label positions
    alone = tokenize_prompt_and_output(["1"], ["xy"], char_tokenizer)
    solo = get_response_log_probs(tiny_model, alone["input_ids"], alone["labels"])
    assert set(solo) == {"log_probs"}
    assert torch.allclose(solo["log_probs"][0], out["log_probs"][1, : n - 1], atol=1e-5)


def test_get_response_log_probs_shape_error(tiny_model):
    with pytest.raises(ValueError, match="differ in shape"):
        get_response_log_probs(tiny_model, torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))
