"""The trainer stand-in of tests/test_vllm_launch.py: a client of the real vLLM server, through TRL's `VLLMClient`.

Usage: vllm_client.py --port P --model DIR --record FILE [--loop] [--retries N] [--netns NAME --veth-ip IP]

Checks `/health`, generates with `VLLMClient.generate` (no weight sync: that needs NCCL and a GPU), scores the
completions with a plain forward of the same checkpoint, resets the prefix cache, and probes which addresses answer
on the server's port: 127.0.0.2 (loopback, another address) and, from a network namespace, the host side of a veth
(another interface of this machine); a listener on 0.0.0.0 is probed the same way as a control. Writes FILE.
With --loop it skips the forward pass, the reset and the probes (what the killed run checks is the client's error),
then generates until a request fails, writes the error to FILE and exits 1. vLLM is hidden while TRL's client
module loads (see `main`): nothing of vLLM runs in this process.

FILE also holds `retry_sleep`: the seconds TRL's client sleeps between its retries of a refused connection before it
raises (urllib3's own backoff of the session's `Retry`; TRL 1.16: 0 + 4 + 8 + 16 + 32). `--retries N` gives the
session N retries without backoff instead, so a stand-in that only has to fail does not wait them out.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import urllib.request

PROBE = (
    "import socket, sys; s = socket.socket(); s.settimeout(5); print(s.connect_ex((sys.argv[1], int(sys.argv[2]))))"
)


def connect_code(host: str, port: int, netns: str | None = None) -> int:
    """`connect_ex` result from this machine (0: accepted, 111: refused), or from inside `netns`."""
    argv = [sys.executable, "-c", PROBE, host, str(port)]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    return int(subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip())


def forward_logps(model_dir: str, prompt: list[int], completions: list[list[int]]) -> list[list[float]]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = []
    with torch.no_grad():
        for completion in completions:
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
            logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(completion)[:, None])
            out.append(logps[:, 0].tolist())
    return out


def retry_sleep(retry) -> float:
    """Seconds urllib3 sleeps between the retries of `retry` (a `urllib3.Retry`) for connections refused until it
    gives up."""
    from urllib3.exceptions import MaxRetryError, NewConnectionError

    total = 0.0
    while True:
        try:
            retry = retry.increment(method="POST", url="/", error=NewConnectionError(None, "refused"))
        except MaxRetryError:
            return total
        total += retry.get_backoff_time()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--retries", type=int)
    parser.add_argument("--netns")
    parser.add_argument("--veth-ip")
    args, _recipe_args = parser.parse_known_args()
    # vLLM hidden while TRL's client module loads: it then skips its imports of vLLM's NCCL weight transfer (this
    # client syncs no weights): this process takes 8-10 CPU s (clean run) and 5 (killed run) so, 18 with vLLM's
    # imports, measured on a 2-core CPU. Shown again before `VLLMClient` checks that vLLM is installed. TRL's
    # `reset_prefix_cache` then takes its other branch, which checks the same thing (status 200) without parsing
    # the answer.
    sys.modules["vllm"] = None
    from trl.generation.vllm_client import VLLMClient

    del sys.modules["vllm"]

    base = f"http://127.0.0.1:{args.port}"
    record: dict = {"pid": os.getpid()}
    with urllib.request.urlopen(f"{base}/health", timeout=10) as resp:
        record["health"] = resp.status
    client = VLLMClient(base_url=base, connection_timeout=10)
    adapter = client.session.get_adapter(base)
    record["retry_sleep"] = retry_sleep(adapter.max_retries)
    if args.retries is not None:
        adapter.max_retries = adapter.max_retries.new(total=args.retries, connect=args.retries, read=args.retries,
                                                      backoff_factor=0)  # fmt: skip
    prompt = [10, 11, 12, 13, 14]
    out = client.generate([prompt], n=2, max_tokens=8, temperature=1.0, logprobs=0)
    record["prompt_ids"] = out["prompt_ids"]
    record["completion_ids"] = out["completion_ids"]
    record["logprobs"] = [[position[0] for position in seq] for seq in out["logprobs"]]
    if args.loop:
        loop(client, prompt, args.record, record)
    record["forward_logprobs"] = forward_logps(args.model, prompt, out["completion_ids"])
    client.reset_prefix_cache()
    with socket.socket() as control:  # a listener on every interface: what the probes see when a port is open
        control.bind(("0.0.0.0", 0))
        control.listen()
        control_port = control.getsockname()[1]
        probes = {"loopback_other": (connect_code("127.0.0.2", args.port), connect_code("127.0.0.2", control_port))}
        if args.netns:
            probes["veth"] = (
                connect_code(args.veth_ip, args.port, args.netns),
                connect_code(args.veth_ip, control_port, args.netns),
            )
    record["probes"] = probes  # name -> (server port, control port)
    write(args.record, record)


def loop(client, prompt: list[int], path: str, record: dict) -> None:
    """Generates until a request fails, then records the error and exits 1."""
    generated = 0
    try:
        while True:
            client.generate([prompt], n=2, max_tokens=8)
            generated += 1
            record["generated_in_loop"] = generated
            write(path, record)
    except Exception as exc:  # what a trainer would see when the server goes away
        record["error"] = f"{type(exc).__name__}: {exc}"
        write(path, record)
        print(f"client: {record['error']}", flush=True)
        sys.exit(1)


def write(path: str, record: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
