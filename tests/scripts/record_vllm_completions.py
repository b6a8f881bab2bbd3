"""Record real `/v1/completions` exchanges of `trl vllm-serve` on vLLM's CPU build, as TRL's `VLLMClient` sends them.

Usage: record_vllm_completions.py OUT_FILE [PORT]. Saves the tiny engine Qwen3 (tests/vllm_helpers.py) with the tags
marked special, starts `trl vllm-serve` on it, and posts the body `VLLMClient.generate` builds for a GRPO generation
in server mode (`VLLMGeneration.generate`: 6 of tests/scripts/vllm_finish_reasons.py's PROMPTS as token ids, n=4,
TRL's sampling fields, `logprobs=0`) with these `generation_kwargs` (sampled, seeded: the server refuses greedy with
n > 1; at most 4 stop strings, its limit):

- `special_stop`: stop at the special tags with `skip_special_tokens: false`;
- `min_tokens`: stop at the 4 doubled characters the unstopped samples hold most often, `min_tokens: 6`.

Writes OUT_FILE: `{"server": argv, "exchanges": [{"case", "request", "response"}]}`, each response as the server
sent it. tests/test_finished.py replays them to TRL's client. No speculative decoding here: with TRL's `logprobs=0`
the CPU server then answers 400 ("Out of range float values are not JSON compliant");
tests/vllm_finish_reasons_checks.py covers it in colocate mode.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

N = 4
MIN_TOKENS = 6
SERVER_FLAGS = ["--dtype", "float32", "--max_model_len", "256", "--enforce_eager"]
SAMPLING = {"temperature": 1.0, "seed": 0, "include_stop_str_in_output": True}


def request_body(model_id: str, prompt_ids: list[list[int]], kwargs: dict, max_tokens: int) -> dict:
    """The JSON body `VLLMClient.generate` posts for `VLLMGeneration.generate` in server mode (trl 1.16) with
    `generation_kwargs=kwargs` and TRL's defaults otherwise."""
    sampling = {"n": N, "repetition_penalty": 1.0, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "max_tokens": max_tokens, "logprobs": 0}  # fmt: skip
    sampling.update(kwargs)
    return {"model": model_id, "prompt": prompt_ids, "return_token_ids": True, "return_tokens_as_token_ids": True,
            **sampling}  # fmt: skip


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{url}: {err.code} {err.read().decode(errors='replace')}") from None


def main(out_file: Path, port: int) -> None:
    from vllm_finish_reasons import MAX_TOKENS, PROMPTS
    from vllm_helpers import KV_CACHE_BYTES, build_engine_model, child_env

    from trl_ext.tiny import TAG_TOKENS

    model, tokenizer = build_engine_model()
    tokenizer.add_special_tokens({"additional_special_tokens": TAG_TOKENS})
    model_dir = Path(tempfile.mkdtemp()) / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    argv = [str(Path(sys.executable).with_name("trl")), "vllm-serve", "--model", str(model_dir), "--port", str(port),
            "--host", "127.0.0.1", *SERVER_FLAGS, "--kv-cache-memory-bytes", str(KV_CACHE_BYTES)]  # fmt: skip
    server = subprocess.Popen(argv, env=child_env(), start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not come up") from None
                time.sleep(1)
        with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as response:
            model_id = json.loads(response.read())["data"][0]["id"]
        prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:6]]
        free = _post(f"{base}/v1/completions", request_body(model_id, prompts, SAMPLING, MAX_TOKENS))
        doubles = Counter(a for c in free["choices"] for a, b in pairwise(c["text"]) if a == b != " ")
        cases = {
            "special_stop": {**SAMPLING, "stop": TAG_TOKENS, "skip_special_tokens": False},
            "min_tokens": {**SAMPLING, "stop": [c * 2 for c, _ in doubles.most_common(4)], "min_tokens": MIN_TOKENS},
        }
        exchanges = []
        for name, kwargs in cases.items():
            body = request_body(model_id, prompts, kwargs, MAX_TOKENS)
            exchanges.append({"case": name, "request": body, "response": _post(f"{base}/v1/completions", body)})
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    argv[0], argv[argv.index(str(model_dir))] = "trl", "MODEL"
    out_file.write_text(json.dumps({"server": argv, "exchanges": exchanges}, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    from helpers import free_port

    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else free_port())
