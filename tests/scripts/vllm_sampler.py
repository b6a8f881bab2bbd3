"""Draws from vLLM's CPU engine, with and without the sampler fix, for tests/test_vllm_sampler.py.

Usage: vllm_sampler.py OUT_DIR [DRAWS]. Starts one in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) on the
tiny engine Qwen3 with the evaluation backend's CPU engine settings (`trl_ext.evaluation.vllm_backend`, which apply
`trl_ext.grpo.vllm.cpu_sampler`'s fix), and for one prompt position:

- the engine's own next-token distribution: its full-vocabulary log-probs (`logprobs=-1`);
- a plain float32 forward's distribution of the same position (no vLLM code);
- DRAWS tokens sampled with the fix (`n=DRAWS`, `max_tokens=1`, temperature 1, no top-k / top-p), then DRAWS more
  with the fix turned off in the same engine (vLLM's compiled sampler).

Writes OUT_DIR/result.json: `{"probs_engine", "probs_forward", "counts": {"fixed", "compiled"}, "sampler": ...}`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_helpers import KV_CACHE_BYTES, build_engine_model  # noqa: E402

PROMPT_IDS = [5, 17, 33, 40, 21]


def main(out_dir: Path, draws: int) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its sampler is reachable
    import torch
    from vllm import LLM, SamplingParams

    from trl_ext.evaluation.config import EvalConfig
    from trl_ext.evaluation.vllm_backend import vllm_engine_kwargs
    from trl_ext.grpo.vllm.cpu_sampler import engine_sampler, fix_engine_sampler

    torch.set_num_threads(1)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer = build_engine_model()
    path = out_dir / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT_IDS])).logits[0, -1].double()
    probs_forward = torch.softmax(logits, dim=-1).tolist()

    kwargs = vllm_engine_kwargs(EvalConfig(model=str(path)), max_model_len=64, cpu=True)
    kwargs.update(kv_cache_memory_bytes=KV_CACHE_BYTES, max_logprobs=-1)
    llm = LLM(**kwargs)
    fixed = engine_sampler(llm).use_fp64_gumbel
    request = [{"prompt_token_ids": PROMPT_IDS}]
    full = llm.generate(request, SamplingParams(max_tokens=1, logprobs=-1, temperature=1.0), use_tqdm=False)
    position = full[0].outputs[0].logprobs[0]
    probs_engine = [0.0] * len(probs_forward)
    for token, logprob in position.items():
        probs_engine[token] = float(torch.tensor(logprob.logprob, dtype=torch.float64).exp())
    counts = {}
    for name, on in (("fixed", True), ("compiled", False)):
        fix_engine_sampler(llm, on)
        params = SamplingParams(n=draws, max_tokens=1, temperature=1.0, top_p=1.0, top_k=0)
        out = llm.generate(request, params, use_tqdm=False)[0]
        tally = [0] * len(probs_forward)
        for completion in out.outputs:
            tally[completion.token_ids[0]] += 1
        counts[name] = tally
    result = {
        "probs_engine": probs_engine,
        "probs_forward": probs_forward,
        "counts": counts,
        "built_with_fix": bool(fixed),
        "capability": os.environ.get("ATEN_CPU_CAPABILITY", ""),
    }
    (out_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4000)
