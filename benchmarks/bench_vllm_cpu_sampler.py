"""What the CPU sampler fix (`trl_ext.grpo.vllm.cpu_sampler`: vLLM's `use_fp64_gumbel`, eager sampling) costs in
tokens/s.

One in-process engine (vLLM's CPU build, float32, eager model, the evaluation backend's CPU settings) generates the
same sampled batch with the fix on and off in turn (the flag is read at every step), `--repeats` times each, and
prints the tokens/s of both and their ratio (fixed / compiled). The model: `--model PATH`, else SmolLM2-135M-Instruct
where `python -m trl_ext.assets fetch-smollm2` put it (49,152-token vocabulary), else the tests' tiny engine Qwen3.

Usage: python benchmarks/bench_vllm_cpu_sampler.py [--model PATH] [--prompts 16] [--n 8] [--tokens 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def default_model(scratch: Path) -> str:
    cache = Path(os.environ.get("TRL_EXT_CACHE", Path.home() / ".cache" / "trl_ext")) / "smollm2-135m-instruct"
    if (cache / "config.json").exists():
        return str(cache)
    sys.path.insert(0, str(ROOT / "tests"))
    from vllm_helpers import save_engine_model

    return save_engine_model(scratch / "model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its sampler is reachable
    from vllm import LLM, SamplingParams

    from trl_ext.evaluation.config import EvalConfig
    from trl_ext.evaluation.vllm_backend import vllm_engine_kwargs
    from trl_ext.grpo.vllm.cpu_sampler import fix_engine_sampler

    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or default_model(Path(scratch))
        llm = LLM(**vllm_engine_kwargs(EvalConfig(model=model), max_model_len=64 + args.tokens, cpu=True))
        requests = [{"prompt_token_ids": [10 + i, 20 + i, 30 + i, 40 + i]} for i in range(args.prompts)]
        params = SamplingParams(n=args.n, max_tokens=args.tokens, min_tokens=args.tokens, temperature=1.0, seed=None)
        rates: dict[str, list[float]] = {"fixed": [], "compiled": []}
        for on in (True, False):  # warm-up: the compiled sampler compiles on its first call
            fix_engine_sampler(llm, on)
            llm.generate(requests[:2], params, use_tqdm=False)
        for _ in range(args.repeats):
            for name, on in (("fixed", True), ("compiled", False)):
                fix_engine_sampler(llm, on)
                start = time.perf_counter()
                outputs = llm.generate(requests, params, use_tqdm=False)
                seconds = time.perf_counter() - start
                tokens = sum(len(c.token_ids) for out in outputs for c in out.outputs)
                rates[name].append(tokens / seconds)
    fixed, compiled = statistics.median(rates["fixed"]), statistics.median(rates["compiled"])
    print(f"model {model}: {args.prompts} prompts x n {args.n} x {args.tokens} tokens, {args.repeats} repeats")
    print(f"tokens/s  fixed (eager fp64 sampler) {fixed:.0f}  compiled sampler {compiled:.0f}")
    print(f"ratio fixed / compiled: {fixed / compiled:.3f}")


if __name__ == "__main__":
    main()
