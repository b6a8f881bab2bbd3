"""Token-level quantities of a causal LM: entropies, log-probs of given labels, and the SFT/RL batch layout.

`tokenize_prompt_and_output` lays a batch out as `input_ids = ids[:, :-1]`, `labels = ids[:, 1:]` (next-token
targets) with a response mask that is 1 exactly where the label is an output token; `get_response_log_probs`
scores those labels. Both follow the CS336 A5 definitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    # bf16 has 8 bits of mantissa: log_softmax of logits around 1e2 would lose whole nats, so work in fp32.
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def compute_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at every position: `H = -sum_v p_v log p_v`, `p = softmax(logits)`.

    Computed from `log_softmax` (which subtracts the max, i.e. uses logsumexp), never from `log(softmax)`: with
    logits of magnitude 1e4 the shifted form stays exact while `logsumexp(z) - sum p z` would cancel two numbers
    of size 1e4 in fp32.

    Args:
        logits: `(B, T, V)` (any leading shape); -inf entries (banned tokens) are allowed. fp16 / bf16 input is
            computed in fp32.

    Returns:
        `(B, T)` entropies in nats; fp32 for fp16 / bf16 / fp32 input, fp64 for fp64 input.
    """
    log_p = torch.log_softmax(_upcast(logits), dim=-1)
    # A -inf logit (a banned token) has p = 0 and log p = -inf; clamping log p to the dtype's lowest finite value
    # makes its term 0 * finite = 0 instead of NaN, in the value and in the gradient.
    log_p = log_p.clamp(min=torch.finfo(log_p.dtype).min)
    return -(log_p.exp() * log_p).sum(dim=-1)


def get_response_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    return_token_entropy: bool = False,
) -> dict[str, torch.Tensor]:
    """Log-probs the model gives to `labels` (the next tokens of `input_ids`), optionally with per-token entropy.

    `log_probs[b, t] = log softmax(model(input_ids).logits[b, t])[labels[b, t]]`, computed as
    `logits[label] - logsumexp(logits)` in fp32 (no `(B, T, V)` log-softmax tensor is kept for the gather).

    Args:
        model: a causal LM returning `.logits` of shape `(B, T, V)`.
        input_ids: `(B, T)` token ids (right padded: padding at the end cannot influence earlier positions).
        labels: `(B, T)` target ids, usually `input_ids` shifted by one. Negative ids (an ignore index such as
            -100) are scored as id 0; mask them out with the response mask.
        return_token_entropy: also return `compute_entropy` of the logits.

    Returns:
        `{"log_probs": (B, T)}` plus `"token_entropy": (B, T)` if asked, fp32 (fp64 for an fp64 model).
    """
    if input_ids.shape != labels.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and labels {tuple(labels.shape)} differ in shape")
    logits = _upcast(model(input_ids).logits)  # (B, T, V)
    index = labels.clamp(min=0).unsqueeze(-1)  # (B, T, 1)
    log_probs = logits.gather(-1, index).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (B, T)
    out = {"log_probs": log_probs}
    if return_token_entropy:
        out["token_entropy"] = compute_entropy(logits)
    return out


def tokenize_prompt_and_output(
    prompt_strs: Sequence[str], output_strs: Sequence[str], tokenizer: Any
) -> dict[str, torch.Tensor]:
    """Tokenize prompt and output separately (no special tokens), concatenate, right pad, and shift by one.

    For each pair, `ids = tok(prompt) + tok(output)`, padded at the end with the pad token (eos if the tokenizer has
    no pad token) to the batch's longest `max_len`. Then `input_ids = ids[:, :-1]`, `labels = ids[:, 1:]`, and
    `response_mask[b, t] = 1` iff `labels[b, t]` is an output token (not prompt, not padding).

    Args:
        prompt_strs: B prompt strings.
        output_strs: B output strings.
        tokenizer: a Hugging Face tokenizer.

    Returns:
        `{"input_ids": (B, max_len - 1) long, "labels": (B, max_len - 1) long, "response_mask": (B, max_len - 1)
        bool}`.
    """
    if len(prompt_strs) != len(output_strs):
        raise ValueError(f"prompt_strs has {len(prompt_strs)} items but output_strs has {len(output_strs)}")
    if len(prompt_strs) == 0:
        raise ValueError("prompt_strs is empty")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("tokenizer has neither a pad_token_id nor an eos_token_id to pad with")
    prompt_ids = tokenizer(list(prompt_strs), add_special_tokens=False)["input_ids"]
    output_ids = tokenizer(list(output_strs), add_special_tokens=False)["input_ids"]
    max_len = max(len(p) + len(o) for p, o in zip(prompt_ids, output_ids, strict=True))
    if max_len < 2:
        raise ValueError("every prompt + output is shorter than 2 tokens; there is no next token to predict")
    ids = torch.full((len(prompt_ids), max_len), pad_id, dtype=torch.long)
    is_output = torch.zeros((len(prompt_ids), max_len), dtype=torch.bool)
    for row, (p, o) in enumerate(zip(prompt_ids, output_ids, strict=True)):
        ids[row, : len(p) + len(o)] = torch.tensor(p + o, dtype=torch.long)
        is_output[row, len(p) : len(p) + len(o)] = True
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "response_mask": is_output[:, 1:]}
