"""Architecture numbers of a causal LM for the preflight: parameter counts and KV-cache size from its config.

Counts follow the Llama / Qwen2 / Qwen3 decoder layout (what every shipped recipe trains): token embedding `V x H`,
per layer q / k / v / o projections (`H x nh*hd`, `H x nkv*hd` twice, `nh*hd x H`), the SwiGLU MLP (`3 x H x I`),
two RMSNorms (`H` each), Qwen2's q / k / v biases, Qwen3's per-head q / k norms (`hd` each), a final norm, and an
LM head `V x H` unless tied to the embedding. A model whose config lacks these fields gets no estimate (the
preflight says so) rather than a guess.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Architecture fields of the shipped recipes' models, as in their hub `config.json` (Apache-2.0, Qwen), so the
# estimate needs no download. A local folder or the hub cache, when present, wins over this table.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-1.7B": {
        "model_type": "qwen3",
        "hidden_size": 2048,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 6144,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    "Qwen/Qwen3-0.6B": {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    "Qwen/Qwen2.5-Math-1.5B": {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-1.5B-Instruct": {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
}
# NYU Assignment 3's GRPO model: the instruct tuning of Qwen2.5-Math-1.5B, the same architecture.
KNOWN_CONFIGS["Qwen/Qwen2.5-Math-1.5B-Instruct"] = KNOWN_CONFIGS["Qwen/Qwen2.5-Math-1.5B"]
# Config fields that name the routed experts of a mixture-of-experts model (Qwen-MoE, Mixtral, DeepSeek).
_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only LM that memory depends on.

    Attributes:
        name: model id or path (for messages).
        hidden_size (H), num_layers (L), num_heads (nh), num_kv_heads (nkv), head_dim (hd), intermediate_size (I),
        vocab_size (V): the config's architecture fields.
        tied_embeddings: the LM head shares the embedding matrix.
        qkv_bias: q / k / v projections have biases (Qwen2).
        qk_norm: per-head RMSNorm on q and k (Qwen3).
        experts: routed experts of a mixture-of-experts model (0: dense; the parameter count assumes dense).
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str = "model") -> ModelShape:
        """From a `config.json` mapping (a `PretrainedConfig.to_dict()` works too).

        Raises:
            ValueError: a required architecture field is missing, naming it and the model.
        """
        missing = [key for key in _REQUIRED if config.get(key) is None]
        if missing:
            raise ValueError(f"{name}: config.json lacks {missing}; cannot estimate its memory")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        model_type = str(config.get("model_type", ""))
        return cls(
            name=name,
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", True)),
            # Qwen2's attention always has q/k/v biases; Llama-style configs say so in `attention_bias`.
            qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
            qk_norm=model_type.startswith("qwen3"),
            experts=int(next((config[k] for k in _EXPERT_FIELDS if config.get(k)), 0)),
        )

    @property
    def embedding_params(self) -> int:
        """`V x H`."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """`V x H`, or 0 when tied to the embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """`(in_features, out_features)` of each linear layer of one decoder layer (LoRA's targets)."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def layer_linear_params(self) -> int:
        """One decoder layer's seven linear layers, weights and q/k/v biases: what bf16 autocast casts."""
        linear = sum(n_in * n_out for n_in, n_out in self.linear_shapes.values())
        return linear + ((self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0)

    @property
    def layer_params(self) -> int:
        """One decoder layer: the seven linear layers, q/k/v biases, two RMSNorms, q/k norms."""
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return self.layer_linear_params + norms

    @property
    def params(self) -> int:
        """All parameters: embedding + L layers + final norm + untied LM head."""
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + self.lm_head_params

    def lora_params(self, rank: int, targets: tuple[str, ...] | None = None) -> int:
        """Trainable LoRA parameters, `r x (in + out)` per targeted linear layer of every decoder layer."""
        shapes = self.linear_shapes
        names = tuple(shapes) if targets is None else targets
        return self.num_layers * sum(rank * sum(shapes[n]) for n in names if n in shapes)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token takes over all layers: `2 (k, v) x L x nkv x hd x bytes`."""
        return 2 * self.num_layers * self.kv_dim * dtype_bytes


def read_model_config(name_or_path: str) -> tuple[dict[str, Any] | None, str]:
    """A model's `config.json` as a dict without network access, and where it came from.

    Order: a local folder's `config.json`; the Hugging Face hub cache (offline lookup only); `KNOWN_CONFIGS`.
    Returns `(None, reason)` when none has it.
    """
    path = Path(os.path.expanduser(name_or_path))
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            return None, f"{path} has no config.json"
        return json.loads(config_file.read_text()), str(config_file)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, "config.json")
    except Exception:  # an id the hub library refuses to parse is simply not cached
        cached = None
    if isinstance(cached, str) and os.path.isfile(cached):
        return json.loads(Path(cached).read_text()), f"hub cache ({cached})"
    if name_or_path in KNOWN_CONFIGS:
        return dict(KNOWN_CONFIGS[name_or_path]), "trl_ext.preflight.models.KNOWN_CONFIGS"
    return None, f"{name_or_path}: not a local folder, not in the hub cache, not a shipped model"


@dataclass(frozen=True)
class PlannedModel:
    """A model folder that a named step of the run builds before training (the CPU testbed's SFT warm start): until
    it exists, the preflight plans with the config the step will write instead of reading the folder, and the plan
    shows the step.

    Attributes:
        path: the folder (the recipe's `model_name_or_path`).
        config: the model's `config.json` as the step writes it.
        step: what the step does, for the plan.
        built: the folder holds the model already (the step will find it and build nothing).
    """

    path: str
    config: dict[str, Any]
    step: str
    built: bool

    def render(self) -> str:
        if self.built:
            return f"model:   {self.path} (built by an earlier run: {self.step}; reused)"
        return f"model:   {self.path}, built first by this run ({self.step}), then trained"


def load_model_shape(name_or_path: str) -> tuple[ModelShape | None, str]:
    """`ModelShape` of a model id or folder (see `read_model_config`), or `(None, reason)`."""
    config, source = read_model_config(name_or_path)
    if config is None:
        return None, source
    text = config.get("text_config")  # multimodal configs nest the language model's fields
    if isinstance(text, dict) and "hidden_size" not in config:
        config = {**text, "model_type": text.get("model_type", config.get("model_type", ""))}
    try:
        return ModelShape.from_config(config, name=name_or_path), source
    except ValueError as err:
        return None, str(err)
