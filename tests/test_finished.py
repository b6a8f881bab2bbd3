"""trl_ext.grpo.rollouts.finished: a completion that ended at a stop string is finished, not truncated.

TRL 1.16 calls every completion without a final EOS truncated, so with `stop: ["</answer>"]` each answered
completion counted in `completions/clipped_ratio` and `mask_truncated_completions` dropped it from the loss. The
trainer test feeds fixed completions through TRL's own `rollout_func` hook (the rest is TRL's and our code, run for
real) and compares the metrics and masks with values counted by hand. The real vLLM engine's stop strings are
checked in tests/test_vllm_colocate.py.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading

import pytest
from conftest import shared_path
from test_trainer_helpers import COMMON, group_inputs, one_torch_thread, prompt_dataset, tiny_model  # noqa: F401

from trl_ext.grpo.rollouts.finished import finished_completions, stop_strings

STOP = "</answer>"


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_finished_rule_by_table(char_tokenizer):
    tok = char_tokenizer
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows = [
        (_ids(tok, "12" + STOP), [STOP], True),  # stopped at the tag (one added token here)
        (_ids(tok, "12") + [eos], [STOP], True),  # ended with EOS
        (_ids(tok, "12") + [pad], [STOP], True),  # padded after the end (TRL's rule counts pad too)
        (_ids(tok, "1234"), [STOP], False),  # cut at max_completion_length
        (_ids(tok, "x" + STOP + "y"), [STOP], False),  # the tag earlier, not where the completion ended
        (_ids(tok, "ok!?"), ["!?"], True),  # a two-token stop string completed by the last token
        (_ids(tok, "ok!"), ["!?"], False),  # half of it
        (_ids(tok, "ok!?"), [], False),  # no stop strings: TRL's rule
        ([], ["!?"], False),
    ]
    decode = lambda ids: tok.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
    for ids, stops, finished in rows:
        assert finished_completions([ids], [eos, pad], decode, stops) == [finished], (tok.decode(ids), stops)
    assert stop_strings({"stop": STOP}) == (STOP,) and stop_strings({"stop_strings": ["a", ""]}) == ("a",)
    assert stop_strings(None) == () and stop_strings({"min_tokens": 4}) == ()


# Two prompts x 4 completions (max_completion_length 8): lengths and how each ended.
COMPLETIONS = [
    ("7" + STOP, "stop"),  # 2 tokens
    ("1+2" + STOP, "stop"),  # 4
    ("12345678", "cut"),  # 8
    ("3*4", "eos"),  # 3 + EOS = 4
    ("99" + STOP, "stop"),  # 3
    ("abcdefgh", "cut"),  # 8
    ("4-1=3", "eos"),  # 5 + EOS = 6
    ("qwertyui", "cut"),  # 8
]


def _rollout(tokenizer):
    def rollout(prompts, trainer):
        prompt_ids = [_ids(tokenizer, p) for p in prompts]
        completion_ids = [
            _ids(tokenizer, text) + ([tokenizer.eos_token_id] if end == "eos" else []) for text, end in COMPLETIONS
        ]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": [[0.0] * 8] * len(prompts)}

    return rollout


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_stop_string_completions_are_finished_in_metrics_and_masks(char_tokenizer, tmp_path, mask_truncated):
    """By hand: 3 completions stopped at </answer> (2, 4, 3 tokens), 2 ended with EOS (4, 6), 3 were cut at 8.
    clipped_ratio 3/8 (TRL's rule: 6/8); terminated lengths over the 5 finished ones: mean 19/5 = 3.8, min 2,
    max 6 (TRL's: EOS only, mean 5). With mask_truncated_completions only the 3 cut rows lose their loss tokens:
    num_items_in_batch = 2 + 4 + 4 + 3 + 6 = 19 (TRL's: 10)."""
    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer

    config = AblationGRPOConfig(
        **{**COMMON, "output_dir": str(tmp_path)},
        generation_kwargs={"stop": [STOP], "include_stop_str_in_output": True},
        mask_truncated_completions=mask_truncated,
    )
    trainer = AblationGRPOTrainer(
        tiny_model(char_tokenizer),
        lambda completions, **kw: [float(len(c)) for c in completions],
        args=config,
        train_dataset=prompt_dataset(),
        processing_class=char_tokenizer,
        rollout_func=_rollout(char_tokenizer),
    )
    trainer.model.train()
    batch = trainer._generate_and_score_completions(group_inputs())
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("completions/")}
    assert metrics["completions/clipped_ratio"] == pytest.approx(3 / 8)
    assert metrics["completions/mean_terminated_length"] == pytest.approx(19 / 5)
    assert (metrics["completions/min_terminated_length"], metrics["completions/max_terminated_length"]) == (2, 6)
    lengths = [2, 4, 8, 4, 3, 8, 6, 8]
    kept = [n if (not mask_truncated or end != "cut") else 0 for n, (_, end) in zip(lengths, COMPLETIONS, strict=True)]
    assert batch["completion_mask"].sum(dim=1).tolist() == kept
    assert batch["num_items_in_batch"].item() == sum(kept)


@contextlib.contextmanager
def _replay_server(exchanges: list[dict]):
    """A local HTTP server that answers as the recorded `trl vllm-serve` did: `/health`, `/v1/models`, and each
    recorded `/v1/completions` body with the server's recorded answer; any other body gets a 400 naming the fields
    that differ (TRL's client then raises), so the replay only answers what TRL really sends."""
    models = {"object": "list", "data": [{"id": exchanges[0]["request"]["model"], "object": "model"}]}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's name)
            self._send(200, models if self.path == "/v1/models" else {})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            for exchange in exchanges:
                if self.path == "/v1/completions" and body == exchange["request"]:
                    return self._send(200, exchange["response"])
            first = exchanges[0]["request"]
            diff = sorted(k for k in {*body, *first} if body.get(k) != first.get(k))
            return self._send(400, {"error": f"not a recorded request: {self.path}, fields {diff}"})

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # `shutdown()` returns when the serving loop next looks at its stop flag (every 0.5 s by default): 0.05 s here
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_server_answers_finish_reasons_in_the_order_trl_returns_completions(char_tokenizer):
    """Real `/v1/completions` answers of `trl vllm-serve` on vLLM's CPU build (tests/data/vllm, recorded by
    tests/scripts/record_vllm_completions.py: 6 prompts x n=4, sampled) replayed to TRL's own `VLLMClient.generate`
    (through `TrlExtVLLMClient`, whose `_post` records) with the request `VLLMGeneration` sends in server mode: the
    client keeps each choice's `finish_reason` and `stop_reason` beside the completion TRL parsed from the same
    choice (prompt-major, as TRL reads them). With the
    tags special and `skip_special_tokens: false`, vLLM stopped completions at a tag that the token-tail rule decodes
    away: vLLM's word calls them finished, the tail truncated. Catches reasons lost, misordered or misread."""
    from trl_ext.grpo.vllm.client import TrlExtVLLMClient
    from trl_ext.grpo.vllm.finish_reasons import FinishReasons
    from trl_ext.tiny import TAG_TOKENS, build_char_tokenizer

    record = json.loads(shared_path("vllm", "completions_cpu.json").read_text())
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": TAG_TOKENS})  # as the recorded server's
    trl_fields = ("n", "repetition_penalty", "temperature", "top_p", "top_k", "min_p", "max_tokens", "logprobs")
    with _replay_server(record["exchanges"]) as url:
        client = TrlExtVLLMClient(base_url=url)
        for exchange in record["exchanges"]:
            request, choices = exchange["request"], exchange["response"]["choices"]
            kwargs = {k: v for k, v in request.items() if k not in (*trl_fields, "model", "prompt")}
            kwargs = {k: v for k, v in kwargs.items() if not k.startswith("return_")}
            out = client.generate(request["prompt"], **{k: request[k] for k in trl_fields}, generation_kwargs=kwargs)
            assert len(out["completion_ids"]) == len(choices) == 6 * 4
            records = client.last_finish_reasons
            for i, (ids, (reason, stop)) in enumerate(zip(out["completion_ids"], records, strict=True)):
                choice = choices[i]  # the n=4 choices of each prompt in turn (prompt-major)
                assert choice["index"] == i and choice["prompt_token_ids"] == request["prompt"][i // 4]
                assert ids == choice["token_ids"]
                assert (reason, stop) == (choice["finish_reason"], choice["stop_reason"])
            reasons = FinishReasons(out["completion_ids"], *map(list, zip(*records, strict=True)))
            assert reasons.finished() == [c["finish_reason"] == "stop" for c in choices]
            assert {"stop", "length"} == {c["finish_reason"] for c in choices}
            if exchange["case"] == "special_stop":
                decode = lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
                eos_and_pad = [tokenizer.eos_token_id, tokenizer.pad_token_id]
                tail = finished_completions(out["completion_ids"], eos_and_pad, decode, request["stop"])
                at_tag = [i for i, c in enumerate(choices) if c["stop_reason"] in TAG_TOKENS]
                assert len(at_tag) >= 4 and all(reasons.finished()[i] and not tail[i] for i in at_tag)


def test_finish_reasons_are_used_only_for_the_completions_they_came_with():
    """`vllm_finish_reasons` hands the record over only for exactly the ids it was recorded with (TRL's tool loop and
    a rollout_func return other ids: then the tail rule decides), and `share` cuts a process's slice as TRL does
    (`process_index * n_local`, server mode; the TP rank, colocate)."""
    from types import SimpleNamespace

    from trl_ext.grpo.vllm.finish_reasons import FinishReasons, share, vllm_finish_reasons

    record = FinishReasons([[1, 2], [3]], ["stop", "length"], ["x", None])
    generation = SimpleNamespace(finish_reasons=record)
    assert vllm_finish_reasons(generation, [[1, 2], [3]]) is record
    assert vllm_finish_reasons(generation, [(1, 2), (3,)]) is record  # vLLM's own sequences, not lists
    assert vllm_finish_reasons(generation, [[1, 2], [3, 9]]) is None  # a tool turn appended tokens
    assert vllm_finish_reasons(generation, [[1, 2]]) is None
    assert vllm_finish_reasons(SimpleNamespace(finish_reasons=None), [[1, 2], [3]]) is None
    assert vllm_finish_reasons(None, [[1, 2], [3]]) is None  # the transformers backend
    assert record.finished() == [True, False]
    everyone = list("abcdef")  # 3 processes x 2 completions
    assert [share(everyone, 2, i) for i in range(3)] == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert share(everyone, 2, 3) is None and share(None, 2, 0) is None
