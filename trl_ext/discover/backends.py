"""Chat backends of the discovery loop: an OpenAI-compatible HTTP endpoint, or a local transformers model.

Both map `(messages, n)` to n assistant replies. The HTTP client is the standard library's (`urllib`), speaking
`POST {base_url}/chat/completions` as vLLM's server (`trl-ext launch`, `vllm serve`) and OpenAI do.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Protocol

from trl_ext.evaluation.transformers_backend import checkpoint_sampling_off, load_model_and_tokenizer

__all__ = ["BackendError", "ChatBackend", "OpenAIChatBackend", "TransformersChatBackend"]


class BackendError(RuntimeError):
    """The model endpoint or the local model could not answer; the message says which and why."""


class ChatBackend(Protocol):
    name: str

    def chat(self, messages: list[dict], n: int, temperature: float, max_tokens: int, seed: int) -> list[str]: ...


# Every sampling field vLLM's server fills from the model's generation_config when a request leaves it unset
# (`vllm/entrypoints/openai/chat_completion/protocol.py`: `to_sampling_params`, "Priority: user -> server default ->
# OpenAI default", over `_DEFAULT_SAMPLING_PARAMS`), at its neutral value, so the request samples at its temperature
# and nothing else. top_k, min_p and repetition_penalty are vLLM's extensions of the OpenAI API.
NEUTRAL_SAMPLING = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


class OpenAIChatBackend:
    """An OpenAI-compatible chat-completions endpoint, asked for plain sampling at the given temperature
    (`NEUTRAL_SAMPLING`: a vLLM server would otherwise apply the checkpoint's repetition penalty, top-k and top-p).

    Args:
        base_url: the API root, e.g. `http://localhost:8000/v1`.
        model: the served model name; None asks `GET {base_url}/models` and takes the first.
        api_key: sent as a bearer token when set.
        timeout_s: per request.
    """

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 600):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"--base-url must start with http:// or https://, got {base_url!r}")
        self.base_url, self.api_key, self.timeout_s = base_url.rstrip("/"), api_key, timeout_s
        self.model = model or self._first_model()
        self.name = f"{self.model} at {self.base_url}"

    def _request(self, path: str, payload: dict | None = None) -> dict:
        url = self.base_url + path
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            body = err.read().decode("utf-8", errors="replace")[:500]
            raise BackendError(f"{url}: HTTP {err.code}: {body}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            raise BackendError(f"{url}: cannot reach the endpoint: {getattr(err, 'reason', err)}") from None
        except ValueError as err:
            raise BackendError(f"{url}: the answer is not JSON: {err}") from None

    def _first_model(self) -> str:
        models = self._request("/models").get("data") or []
        if not models or not isinstance(models[0], dict) or "id" not in models[0]:
            raise BackendError(f"{self.base_url}/models lists no model; pass --model")
        return models[0]["id"]

    def chat(self, messages: list[dict], n: int, temperature: float, max_tokens: int, seed: int) -> list[str]:
        payload = {
            "model": self.model,
            "messages": messages,
            "n": n,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "seed": seed,
            **NEUTRAL_SAMPLING,
        }
        answer = self._request("/chat/completions", payload)
        replies = [c.get("message", {}).get("content") or "" for c in answer.get("choices", [])]
        # Some servers ignore `n`: ask again, one at a time, for the rest.
        while len(replies) < n:
            more = self._request("/chat/completions", {**payload, "n": 1, "seed": seed + len(replies)})
            if not more.get("choices"):
                raise BackendError(f"{self.base_url}/chat/completions returned no choices")
            replies.extend(c.get("message", {}).get("content") or "" for c in more["choices"])
        return replies[:n]


class TransformersChatBackend:
    """A local causal LM through `transformers` (the tokenizer's chat template when it has one), sampling at the
    given temperature only (the checkpoint's generation config does not apply).

    Args:
        model: a local directory or hub id (offline: a directory).
        dtype: parameter dtype name.
        device: "cpu", "cuda", ...; default cuda when available.
    """

    def __init__(self, model: str, dtype: str = "float32", device: str | None = None) -> None:
        self.name = model
        # Its left padding and EOS pad token change nothing here: one prompt per call, never padded.
        self.model, self.tokenizer = load_model_and_tokenizer(model, dtype, device)
        self.device = self.model.device

    def _prompt(self, messages: list[dict]) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "

    def chat(self, messages: list[dict], n: int, temperature: float, max_tokens: int, seed: int) -> list[str]:
        import torch

        enc = self.tokenizer(self._prompt(messages), return_tensors="pt", add_special_tokens=False).to(self.device)
        torch.manual_seed(seed)
        sample = temperature > 0
        with torch.no_grad(), checkpoint_sampling_off(self.model):
            out = self.model.generate(
                **enc,
                do_sample=sample,
                temperature=temperature if sample else None,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_tokens,
                num_return_sequences=n,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new, skip_special_tokens=True)
