"""Batched sampling from a small decoder with a preallocated KV cache: the CPU testbed's generation loop.

transformers' `generate` pays, per new token, for its logits processors, stopping criteria, input preparation and
mask building, and it prefills every row, so a group of 8 completions of one prompt prefills that prompt 8 times.
For a model of a few hundred thousand parameters on a CPU those costs outweigh the model itself. This loop does per
step only what sampling needs:

1. prefill each distinct prompt once (prompts left-padded), its keys and values written into a cache preallocated
   for the whole completion budget, `(layers, B, kv_heads, P + T, head_dim)`, and repeated for the rows that share it;
2. per step, one forward of the last token through the model's own modules (embedding, RMSNorms, projections, MLPs,
   LM head) with rotary positions counted over real tokens, as `generate` counts them, and attention over the
   filled part of the cache;
3. the next token drawn as `generate` draws it: raw logits in float32 -> temperature -> top-k -> top-p ->
   softmax -> `torch.multinomial` on torch's global generator (argmax for greedy);
4. rows that emitted an EOS leave the batch (their cache rows too), so the last steps run on the long completions
   only.

The math is `generate`'s; floating point can differ in the last bits (other batch shapes), so sampled completions
follow the same distribution and greedy ones agree wherever the top two logits are not within rounding of each
other (benchmarks/bench_throughput.py checks both). Supported: the Llama-style decoders in `SUPPORTED_MODEL_TYPES`
(pre-norm blocks, rotary positions, grouped-query attention without a sliding window), plain text prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Model types whose decoder blocks this loop runs (module names and math of transformers' Llama family).
SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")
# Finished rows leave the batch (their cache rows copied out) once the live rows are at most this share of it.
COMPACT_AT = 0.65


@dataclass
class SampledCompletions:
    """Per prompt row: the completion's token ids (through the first EOS, EOS included; at most the budget), and,
    when asked for, the log-probability and the entropy (nats) of the raw next-token distribution at each of them."""

    token_ids: list[list[int]]
    logprobs: list[list[float]] | None = None
    entropies: list[list[float]] | None = None


def static_cache_problem(model) -> str | None:
    """Why `sample_static_cache` cannot run `model`, or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", False):
        return "the model uses sliding-window attention"
    if getattr(config, "mlp_bias", False):
        return "the model's MLP has biases"
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "layers") or not hasattr(base, "rotary_emb"):
        return f"{type(model).__name__} has no `.model.layers` / `.model.rotary_emb` (a decoder wrapped by PEFT?)"
    return None


def _rms_norm(norm, x):
    """`norm` (an RMSNorm module of the model: `weight`, `variance_epsilon`) as one fused op."""
    import torch.nn.functional as F

    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def _rotate_half(x):
    half = x.shape[-1] // 2
    import torch

    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Decoder:
    """The model's decoder blocks run on a preallocated cache; `forward` writes keys / values at `start` and returns
    the last position's logits. The query / key / value projections run as one matrix product, as do the MLP's gate
    and up projections (their weights concatenated once per call: the same dot products, fewer and larger
    products)."""

    def __init__(self, model, rows: int, length: int):
        import torch

        base, config = model.model, model.config
        self.model, self.base = model, base
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.qkv, self.gate_up = [], []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = (attn.q_proj, attn.k_proj, attn.v_proj)
            bias = None if attn.q_proj.bias is None else torch.cat([p.bias for p in projections])
            self.qkv.append((torch.cat([p.weight for p in projections]), bias))
            self.gate_up.append(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        param = next(model.parameters())
        # cos / sin of every position once (the same products as per step: each angle is one multiplication).
        every = torch.arange(int(config.max_position_embeddings), device=param.device)[None]  # (1, positions)
        cos, sin = base.rotary_emb(torch.zeros((), dtype=param.dtype, device=param.device), every)
        self.cos, self.sin = cos[0], sin[0]  # (positions, hd)
        shape = (rows, self.kv_heads, length, self.head_dim)  # per layer; rows first, so dropping rows copies blocks
        self.keys = [torch.zeros(shape, dtype=param.dtype, device=param.device) for _ in base.layers]
        self.values = [torch.zeros_like(k) for k in self.keys]

    def forward(self, input_ids, positions, start: int, mask):
        """Logits `(b, V)` of the last position.

        Args:
            input_ids, positions: `(b, S)` tokens and their rotary positions.
            start: cache column of the first of the S tokens.
            mask: `(b, 1, S, start + S)` bool, True where a query may attend to a key.
        """
        import torch
        import torch.nn.functional as F

        b, s = input_ids.shape
        end = start + s
        nh, nkv, hd = self.heads, self.kv_heads, self.head_dim
        h = self.base.embed_tokens(input_ids)  # (b, S, H)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # (b, 1, S, hd)
        groups = nh // nkv
        if s == 1:  # one query per row: the heads of a key/value group attend as that group's queries
            bias = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill_(~mask, float("-inf"))
        for i, layer in enumerate(self.base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            residual, h = h, _rms_norm(layer.input_layernorm, h)
            q, k, v = F.linear(h, *self.qkv[i]).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q, k, v = q.view(b, s, nh, hd), k.view(b, s, nkv, hd), v.view(b, s, nkv, hd)
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm per head before the rotation
                q, k = _rms_norm(attn.q_norm, q), _rms_norm(attn.k_norm, k)
            qk = torch.cat([q, k], dim=2).transpose(1, 2)  # (b, nh + nkv, S, hd): one rotation for both
            q, k = (qk * cos + _rotate_half(qk) * sin).split([nh, nkv], dim=1)
            v = v.transpose(1, 2)
            self.keys[i][:, :, start:end] = k
            self.values[i][:, :, start:end] = v
            keys, values = self.keys[i][:, :, :end], self.values[i][:, :, :end]  # (b, nkv, end, hd)
            if s == 1:
                q = q.reshape(b, nkv, groups, hd)  # head j -> group j // groups
                scores = torch.matmul(q, keys.transpose(-1, -2)) * attn.scaling + bias  # (b, nkv, g, end)
                out = torch.matmul(torch.softmax(scores, dim=-1), values).reshape(b, nh, 1, hd)
            else:
                if groups > 1:  # as transformers' sdpa path does when a mask is given
                    keys = keys.repeat_interleave(groups, dim=1)
                    values = values.repeat_interleave(groups, dim=1)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
            h = residual + attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))
            gate, up = F.linear(_rms_norm(layer.post_attention_layernorm, h), self.gate_up[i]).chunk(2, dim=-1)
            h = h + mlp.down_proj(mlp.act_fn(gate) * up)
        return self.model.lm_head(_rms_norm(self.base.norm, h[:, -1])).float()  # (b, V)

    def keep(self, rows):
        """Drop every cache row but `rows` (a `(b',)` index)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]


def _warp(logits, temperature: float, top_k: int, top_p: float, min_p: float | None):
    """transformers' warpers in `generate`'s order: temperature, top-k, top-p, min-p."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    if temperature != 1.0:
        logits = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k:
        logits = TopKLogitsWarper(top_k)(None, logits)
    if top_p < 1.0:
        logits = TopPLogitsWarper(top_p)(None, logits)
    if min_p is not None:
        logits = MinPLogitsWarper(min_p)(None, logits)
    return logits


def sample_static_cache(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float | None = None,
    with_logprobs: bool = False,
    with_entropies: bool = False,
) -> SampledCompletions:
    """Complete each prompt once (module docstring); identical prompts share their prefill.

    Args:
        model: a causal LM of `SUPPORTED_MODEL_TYPES` (run under `torch.no_grad()` here; its train / eval mode is
            left as it is, as `generate` leaves it).
        prompts: `(B,)` prompt token ids, unpadded; a prompt repeated for a group is prefilled once.
        max_new_tokens: the completion budget T.
        eos_token_ids: tokens that end a completion (kept as its last token).
        pad_token_id: the left padding of the prompts (masked out of attention).
        temperature: 0 for greedy (argmax), else the sampling temperature.
        top_k, top_p, min_p: `generate`'s warpers (0, 1.0 and None switch them off).
        with_logprobs, with_entropies: also return log p and the entropy of the raw distribution per token.
    """
    import torch

    problem = static_cache_problem(model)
    if problem is not None:
        raise ValueError(f"static-cache sampling cannot run this model: {problem}")
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if not prompts or not all(prompts):
        raise ValueError("every prompt needs at least one token")
    device = next(model.parameters()).device
    distinct: dict[tuple[int, ...], int] = {}
    row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]  # (B,) -> distinct prompt
    width = max(len(p) for p in distinct)
    ids = torch.full((len(distinct), width), pad_token_id, dtype=torch.long, device=device)
    valid = torch.zeros((len(distinct), width + max_new_tokens), dtype=torch.bool, device=device)
    for prompt, u in distinct.items():
        ids[u, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        valid[u, width - len(prompt) :] = True  # the prompt and every completion position
    positions = (valid[:, :width].long().cumsum(-1) - 1).clamp(min=0)  # (U, P)
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=device)

    with torch.no_grad():
        decoder = _Decoder(model, len(distinct), width + max_new_tokens)
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        # A padding query may attend to itself only: its output is never read, but must stay finite.
        prefill_mask = (valid[:, None, None, :width] & causal) | torch.eye(width, dtype=torch.bool, device=device)
        logits = decoder.forward(ids, positions, 0, prefill_mask)  # (U, V)
        index = torch.tensor(row_of, dtype=torch.long, device=device)
        decoder.keep(index)
        logits, valid, position = logits[index], valid[index], positions[index, -1:] + 1  # (B, V), (B, P+T), (B, 1)

        rows = torch.arange(len(prompts), device=device)  # the original row of each cache row
        live = torch.ones(len(prompts), dtype=torch.bool, device=device)  # cache rows still generating
        tokens = torch.full((len(prompts), max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        logps = torch.zeros(tokens.shape, device=device) if with_logprobs else None
        entropy = torch.zeros(tokens.shape, device=device) if with_entropies else None
        lengths = torch.full((len(prompts),), max_new_tokens, dtype=torch.long, device=device)
        for step in range(max_new_tokens):
            if temperature == 0:
                chosen = logits.argmax(dim=-1)
            else:
                probs = torch.softmax(_warp(logits, temperature, top_k, top_p, min_p), dim=-1)
                chosen = torch.multinomial(probs, num_samples=1).squeeze(1)  # (b,)
            tokens[rows[live], step] = chosen[live]
            if with_logprobs or with_entropies:
                log_p = torch.log_softmax(logits[live], dim=-1)
                if with_logprobs:
                    logps[rows[live], step] = log_p.gather(1, chosen[live, None]).squeeze(1)
                if with_entropies:
                    entropy[rows[live], step] = -(log_p.exp() * log_p).sum(dim=-1)
            ended = live & torch.isin(chosen, eos)
            lengths[rows[ended]] = step + 1
            live &= ~ended
            alive = int(live.sum())
            if step == max_new_tokens - 1 or not alive:
                break
            if alive <= COMPACT_AT * len(rows):  # copying the cache is dearer than a few rows' forward
                keep = live.nonzero().squeeze(1)
                rows, chosen, position, valid, live = rows[keep], chosen[keep], position[keep], valid[keep], live[keep]
                decoder.keep(keep)
            start = width + step
            logits = decoder.forward(chosen[:, None], position, start, valid[:, None, None, : start + 1])
            position = position + 1

    lengths = lengths.tolist()

    def cut(table) -> list[list]:
        return [row[:n] for row, n in zip(table.tolist(), lengths, strict=True)]

    return SampledCompletions(
        token_ids=cut(tokens),
        logprobs=cut(logps) if with_logprobs else None,
        entropies=cut(entropy) if with_entropies else None,
    )
