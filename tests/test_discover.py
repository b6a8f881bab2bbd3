"""`trl-ext discover` end to end: a scripted OpenAI-compatible server over real HTTP on localhost, and a local
tiny transformers model; the files it writes, the feedback it sends back, and its errors on bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trl_ext.discover import FAILURE_PROMPT, SUCCESS_PROMPT, SYSTEM_PROMPT
from trl_ext.rewards.kissing import run_points_program, verify_kissing_configuration
from trl_ext.rewards.kissing_constructions import (
    configuration_program,
    constant_weight_configuration,
    quadruple_packing,
    root_system_dn,
)
from trl_ext.tasks.kissing import ANSWER_FORMAT, kissing_prompt

REPO = Path(__file__).resolve().parents[1]
D11 = configuration_program(root_system_dn(11))
CODE582 = configuration_program(constant_weight_configuration(quadruple_packing(11, 35), 11))
LONG = D11 + "points.append([3] + [0] * 10)\n"
# (3, 0, ..., 0) has norm^2 9 > 2, the roots' minimum distance^2: root 0 = (1, 1, 0, ...) and root 4 = (1, 0, 1, ...)
# are the first pair at distance^2 2 (roots 1-3 are root 0 with signs flipped, at distance^2 4 or 8)
LONG_MESSAGE = (
    "Minimum squared distance 2 < maximum squared norm 9: points 0 and 4 are at squared distance 2, "
    "point 220 has squared norm 9"
)


def _block(program: str) -> str:
    return f"Here is my program.\n```python\n{program}```\n"


# One list of replies per round (n = 2 samples per round).
SCRIPT = [
    [_block(LONG), "I cannot write code today."],  # round 1: an invalid program and no program
    [_block("points = 1 / 0\n"), _block(D11)],  # round 2: a crash and the D11 roots (220)
    [_block(D11), _block(CODE582)],  # round 3: the weight-4 code construction (582)
]


class ScriptedServer:
    """A real HTTP server speaking the OpenAI chat-completions API with scripted replies; records each request."""

    def __init__(self, script: list[list[str]], ignore_n: bool = False) -> None:
        self.script, self.ignore_n, self.requests = script, ignore_n, []
        self.replies = [reply for round_replies in script for reply in round_replies]
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def _send(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "scripted-model", "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(request)
                if self.path != "/v1/chat/completions" or request.get("model") != "scripted-model":
                    self._send(400, {"error": f"bad request to {self.path}"})
                    return
                n = 1 if owner.ignore_n else request["n"]
                taken, owner.replies = owner.replies[:n], owner.replies[n:]
                choices = [
                    {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    for i, text in enumerate(taken)
                ]
                self._send(200, {"id": "x", "object": "chat.completion", "choices": choices})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        # `shutdown()` returns when the serving loop next looks at its stop flag: every 0.5 s by default, which each
        # test using the server waited at its end; every 0.05 s here.
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "trl_ext.cli", "discover", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def test_discover_against_a_scripted_server_over_http(tmp_path):
    out = tmp_path / "run"
    with ScriptedServer(SCRIPT) as server:
        proc = _cli(
            "--base-url", server.url, "--samples", "2", "--rounds", "3", "--workers", "2", "--output-dir", str(out)
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "best |C| = 582; history [0, 220, 582]" in proc.stdout
    assert "round 3/3: sampling 2 program(s) from scripted-model" in proc.stderr  # progress lines
    assert "round 2 sample 2/2: valid, |C| = 220" in proc.stderr

    # The verifier's message of round 1's best attempt (the program that ran) is fed back in round 2.
    assert len(server.requests) == 3 and all(r["n"] == 2 for r in server.requests)
    first, second, third = (r["messages"] for r in server.requests)
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == kissing_prompt(11)
    assert second[-2] == {"role": "assistant", "content": _block(LONG)}
    # round 1's best failed: NLPDL HW3's failure prompt with the verifier's exact message; round 2's was valid: its
    # success prompt with the score
    assert second[-1] == {
        "role": "user",
        "content": f"{FAILURE_PROMPT.format(message=LONG_MESSAGE)}\n\n{ANSWER_FORMAT}",
    }
    assert third[-1] == {"role": "user", "content": f"{SUCCESS_PROMPT.format(score=220)}\n\n{ANSWER_FORMAT}"}

    # program.py is the best valid program; it is valid on its own when run again through sandbox and verifier.
    assert (out / "program.py").read_text() == CODE582
    rerun = run_points_program((out / "program.py").read_text())
    assert verify_kissing_configuration(rerun["points"])["num_points"] == 582

    log = json.loads((out / "conversation_log.json").read_text())
    assert log["history"] == [0, 220, 582] and log["backend"] == f"scripted-model at {server.url}"
    assert log["best"]["round"] == 3 and log["best"]["sample"] == 2 and log["best"]["score"] == 582
    messages = [[a["message"] for a in r["attempts"]] for r in log["rounds"]]
    assert messages[0] == [LONG_MESSAGE, "no ```python code block found in the answer"]
    assert messages[1][0].startswith("the program raised ZeroDivisionError: division by zero")
    assert [r["chosen_sample"] for r in log["rounds"]] == [1, 2, 2]

    report = (out / "report.md").read_text()
    assert "Best |C| after each round: 0, 220, 582" in report
    assert "Best valid configuration: |C| = 582 (round 3, sample 2)" in report
    assert "| 1 | 1 | no | 0 |" in report and "| 3 | 2 | yes | 582 |" in report
    assert re.findall(r"^## (.+)$", report, flags=re.M) == ["Methodology", "Process", "Final Result", "Reflection"]


def test_backend_asks_again_when_the_server_ignores_n(tmp_path):
    from trl_ext.discover import DiscoveryConfig, OpenAIChatBackend, run_discovery
    from trl_ext.discover.backends import NEUTRAL_SAMPLING

    with ScriptedServer([[_block(D11), "no"]], ignore_n=True) as server:
        backend = OpenAIChatBackend(server.url)
        cfg = DiscoveryConfig(samples=2, rounds=1, output_dir=str(tmp_path), workers=1)
        result = run_discovery(backend, cfg, progress=lambda line: None)
    assert [r["n"] for r in server.requests] == [2, 1]  # the second request asks for the missing reply
    # plain sampling at the temperature: nothing left for a vLLM server to fill from the checkpoint
    assert all(r[k] == v for r in server.requests for k, v in NEUTRAL_SAMPLING.items())
    assert result["best_score"] == 220 and result["history"] == [220]


@pytest.mark.slow
def test_discover_with_a_local_tiny_model(tmp_path, char_tokenizer):
    """A tiny model whose vocabulary holds the whole D11 program as one added token, which its weights favour (the
    backend samples the model itself: a checkpoint's generation config does not apply): the local
    backend loads it from disk, samples it, the loop scores it 220.
    (In process: the command line is covered by the HTTP test; a second torch import would cost ~10 s.)"""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_ext.discover import DiscoveryConfig, TransformersChatBackend, run_discovery
    from trl_ext.tiny import build_tiny_qwen3

    model_dir = tmp_path / "tiny"
    char_tokenizer.save_pretrained(model_dir)
    tokenizer = char_tokenizer.__class__.from_pretrained(model_dir)
    token = f"```python\n{D11}```"
    tokenizer.add_tokens([token])
    tied = build_tiny_qwen3(tokenizer, seed=0)
    model = AutoModelForCausalLM.from_config(
        tied.config.__class__(**{**tied.config.to_dict(), "tie_word_embeddings": False})
    )
    with torch.no_grad():  # residual stream = the embedding, whose last coordinate is 1; only the program reads it
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
        model.get_input_embeddings().weight[:, -1] = 1.0
        head = model.get_output_embeddings().weight
        head.zero_()
        # logit 2 x 7.9 (the RMS-normed 1.0 among 63 entries of std 0.02) against 0: nearly every sample
        head[tokenizer.convert_tokens_to_ids(token), -1] = 2.0
    model.generation_config.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    out = tmp_path / "run"
    cfg = DiscoveryConfig(samples=3, rounds=2, max_tokens=6, workers=2, output_dir=str(out))
    lines = []
    result = run_discovery(TransformersChatBackend(str(model_dir)), cfg, progress=lines.append)
    assert lines[0] == f"round 1/2: sampling 3 program(s) from {model_dir}" and len(lines) == 2 * (1 + 3) + 1
    assert result["best_score"] == 220
    log = json.loads((out / "conversation_log.json").read_text())
    attempts = [a for r in log["rounds"] for a in r["attempts"]]
    assert len(attempts) == 6 and log["backend"] == str(model_dir)
    # every attempt is judged by the verifier or the extraction step, never skipped
    assert all(a["message"] for a in attempts)
    valid = [a for a in attempts if a["validity"] == 1.0]
    assert valid and all(a["score"] == 220 for a in valid)
    assert log["history"][-1] == 220 and (out / "program.py").read_text() == D11
    # the second round's prompt carries the first round's feedback
    assert log["rounds"][1]["messages"][-1]["content"].startswith(
        ("Your previous attempt failed", "Your previous set")
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ([], "give exactly one of --base-url URL or --local --model DIR"),
        (["--base-url", "http://127.0.0.1:9/v1", "--local", "--model", "x"], "give exactly one of"),
        (["--local"], "--local needs --model"),
        (["--base-url", "http://127.0.0.1:9/v1", "--samples", "0"], "samples must be an integer >= 1, got 0"),
        (["--base-url", "ftp://x"], "--base-url must start with http:// or https://"),
        (["--base-url", "http://127.0.0.1:9/v1", "--model", "m"], "cannot reach the endpoint"),
        (["--local", "--model", "/no/such/model"], "--model /no/such/model: no such directory"),
        # the endpoint below does not answer: each of these must fail before it is asked
        (["--base-url", "http://127.0.0.1:9/v1", "--system-prompt", "a", "--system-prompt-file", "f"], "not both"),
        (["--base-url", "http://127.0.0.1:9/v1", "--system-prompt-file", "/no/such"], "/no/such: no such file"),
        (["--base-url", "http://127.0.0.1:9/v1", "--system-prompt", " \n"], "--system-prompt is blank"),
        (["--base-url", "http://127.0.0.1:9/v1", "--history-window", "0"], "--history-window must be an integer >= 1"),
        (["--base-url", "http://127.0.0.1:9/v1", "--prompt-file", "/no/such"], "--prompt-file /no/such: no such file"),
    ],
)
def test_bad_input_fails_early_with_a_clear_message(args, error, tmp_path, monkeypatch):
    """In this process (typer's runner on the same app `python -m trl_ext.cli` runs; the subprocess path is the
    scripted-server test's): a new interpreter per case cost its imports seven times over."""
    from typer.testing import CliRunner

    from trl_ext.cli import app

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(app, ["discover", *args, "--output-dir", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert error in " ".join(result.output.split()), result.output
    assert not (tmp_path / "out" / "report.md").exists()


def _run_cli_in_process(*args: str):
    from typer.testing import CliRunner

    from trl_ext.cli import app

    return CliRunner().invoke(app, ["discover", *args])


@pytest.mark.parametrize(
    ("content", "error"),
    [(b" \n\n", "--system-prompt-file {}: the file is empty"), (b"\xff\xfe", "--system-prompt-file {}: not UTF-8")],
)
def test_bad_system_prompt_file_is_named(content, error, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # a short relative path: the error box would wrap a long one
    (tmp_path / "system.txt").write_bytes(content)
    result = _run_cli_in_process("--base-url", "http://127.0.0.1:9/v1", "--system-prompt-file", "system.txt")
    assert result.exit_code != 0 and error.format("system.txt") in " ".join(result.output.split()), result.output
    assert not (tmp_path / "discover_out").exists()


NO_CODE = "no ```python code block found in the answer"
UNCLOSED = "the ```python code block is never closed (cut at the token limit?)"
ONE_POINT = "points = [[1] + [0] * 10]\n"  # one vector: valid, |C| = 1
# samples = 1, four rounds: no program, a valid one, an unclosed block, no program again
HISTORY_SCRIPT = [["I cannot write code today."], [_block(ONE_POINT)], ["```python\npoints = ["], ["Done."]]


def _fenced_blocks(markdown: str) -> list[str]:
    return [m.group(2) for m in re.finditer(r"^(`{3,})text\n(.*?)\n\1$", markdown, flags=re.M | re.S)]


@pytest.mark.parametrize("window", [None, 1, 2])
def test_refinement_sends_the_conversation_history(window, tmp_path):
    """Each refinement request carries the task prompt and the conversation so far (its last `window` exchanges),
    checked against the requests the server received; report.md has the assignment's four sections, the first and
    final score, and its example prompts are the messages actually sent."""
    from trl_ext.discover import DiscoveryConfig, OpenAIChatBackend, run_discovery

    out = tmp_path / "run"
    with ScriptedServer(HISTORY_SCRIPT) as server:
        cfg = DiscoveryConfig(samples=1, rounds=4, workers=1, history_window=window, output_dir=str(out))
        result = run_discovery(OpenAIChatBackend(server.url), cfg, progress=lambda line: None)
    assert result["history"] == [0, 1, 1, 1]

    # by hand: each exchange is the round's reply and the feedback on it
    base = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": kissing_prompt(11)}]
    feedback = [
        FAILURE_PROMPT.format(message=NO_CODE),
        SUCCESS_PROMPT.format(score=1),
        FAILURE_PROMPT.format(message=UNCLOSED),
    ]
    exchanges = [
        [{"role": "assistant", "content": reply}, {"role": "user", "content": f"{text}\n\n{ANSWER_FORMAT}"}]
        for (reply,), text in zip(HISTORY_SCRIPT, feedback, strict=False)
    ]
    kept = {None: [[], [0], [0, 1], [0, 1, 2]], 1: [[], [0], [1], [2]], 2: [[], [0], [0, 1], [1, 2]]}[window]
    expected = [base + [m for i in ids for m in exchanges[i]] for ids in kept]
    sent = [r["messages"] for r in server.requests]
    assert sent == expected
    log = json.loads((out / "conversation_log.json").read_text())
    assert [r["messages"] for r in log["rounds"]] == sent and log["config"]["history_window"] == window

    report = (out / "report.md").read_text()
    assert re.findall(r"^## (.+)$", report, flags=re.M) == ["Methodology", "Process", "Final Result", "Reflection"]
    assert "Initial score (best valid |C| after round 1): 0. Final score (after round 4): 1." in report
    assert f"- System message: `{SYSTEM_PROMPT}`" in report
    stated = {None: "all of it", 1: "the last exchange", 2: "the last 2 exchanges"}[window]
    assert f"- Conversation history sent with each refinement request: {stated}" in report
    # round 1's request (the task prompt) and round 2's, whose reply raised the score from 0 to 1
    assert _fenced_blocks(report) == [sent[0][-1]["content"], sent[1][-1]["content"]]
    assert "Round 2, the request that led to the best score (|C| 0 -> 1)" in report
    assert "Final score: |C| = 1 for d = 11, so tau_11 >= 1." in report
    assert "- Valid programs: 1 of 4 replies (per round: 0/1, 1/1, 0/1, 0/1)." in report
    assert "refinement raised it in round 2 (0 -> 1)." in report


@pytest.mark.parametrize(
    ("args", "system"),
    [
        (["--system-prompt", "Think like a coding theorist."], "Think like a coding theorist."),
        (["--system-prompt", ""], None),  # no system message at all
        (["--system-prompt-file", "{file}"], "You write short programs.\nUse integers only.\n"),
        ([], SYSTEM_PROMPT),
    ],
)
def test_system_message_from_the_command_line(args, system, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "system.txt").write_text("You write short programs.\nUse integers only.\n")
    args = [a.format(file=tmp_path / "system.txt") for a in args]
    out = tmp_path / "run"
    with ScriptedServer([["No program."]]) as server:
        result = _run_cli_in_process(
            "--base-url", server.url, "--samples", "1", "--rounds", "1", "--output-dir", str(out), *args
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    (request,) = server.requests
    user = {"role": "user", "content": kissing_prompt(11)}
    assert request["messages"] == ([] if system is None else [{"role": "system", "content": system}]) + [user]
    stated = "none" if system is None else f"`{' '.join(system.split())}`"
    assert f"- System message: {stated}\n" in (out / "report.md").read_text()
