"""Tiny offline models: a character-level tokenizer and a small Qwen3-architecture causal LM built from a config.

Used by the embedded default (`make run`), the tests and the benchmarks, where no hub download is possible.
Nothing here is trained; weights are random until a recipe trains them.
"""

from __future__ import annotations

import string

SPECIAL_TOKENS = ["<pad>", "<eos>"]
# Ordinary added tokens: they survive `decode(skip_special_tokens=True)`, so rewards still see the tags.
TAG_TOKENS = ["<answer>", "</answer>", "<think>", "</think>"]
CHARS = list(string.digits + string.ascii_letters + string.punctuation + " \n")


def build_char_tokenizer(chars: list[str] | None = None, model_max_length: int = 512):
    """A character-level `PreTrainedTokenizerFast`: one token per character, plus the answer/think tags.

    Args:
        chars: the character vocabulary (default: printable ASCII, space and newline).
        model_max_length: recorded on the tokenizer.

    Returns:
        A tokenizer with pad `<pad>`, eos `<eos>`, no bos, left padding (what generation wants).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = CHARS if chars is None else chars
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + TAG_TOKENS + list(dict.fromkeys(chars)) + ["<unk>"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens(TAG_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        bos_token=None,
        padding_side="left",
        model_max_length=model_max_length,
    )


def tiny_qwen3_config(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    dtype: str = "float32",
):
    """The `Qwen3Config` of `build_tiny_qwen3` (tied embeddings, the tokenizer's vocabulary, pad and eos ids)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype=dtype,
    )


def build_tiny_qwen3(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    seed: int = 0,
    dtype: str = "float32",
):
    """A randomly initialised Qwen3-architecture causal LM sized for CPU tests (tied embeddings).

    Args:
        tokenizer: gives the vocabulary size and the pad / eos ids.
        hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size: the architecture.
        max_position_embeddings: longest prompt + completion.
        seed: torch seed for the initialisation (same seed, same weights).
        dtype: parameter dtype name.

    Returns:
        A `Qwen3ForCausalLM` whose generation config stops at the tokenizer's eos and pads with its pad token.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_qwen3_config(
        tokenizer, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, max_position_embeddings, dtype
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    return model


# The testbed's model size (`trl_ext.testbed.TestbedConfig`: head_dim 32, which vLLM's CPU attention accepts) with
# the full character vocabulary: what a recipe with `tiny_model: true` trains (recipes/countdown/cpu_server.yaml).
RECIPE_MODEL = dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=256)


def ensure_tiny_model(path, seed: int = 0) -> bool:
    """Build `RECIPE_MODEL` (character tokenizer, float32, `seed`) and save it to `path`, unless a model is there
    (`build_model_folder`: processes that race, training ranks and the launcher, never read a half-written folder;
    the build is seeded, so whichever wins holds the same model).

    Returns:
        True when this call built it.
    """
    return build_model_folder(path, lambda staging: save_tiny_model(staging, seed=seed, **RECIPE_MODEL))


def build_model_folder(path, build, lock: bool = False) -> bool:
    """Run `build(staging)` in a sibling folder of `path` and rename it into place, unless a model (`config.json`)
    is there already: no reader ever sees a half-written folder. Without `lock` processes that race each build and
    the first rename wins (for builds that cost seconds); with it they take an exclusive file lock beside the folder,
    so one builds and the others wait for its model (for builds that cost minutes).

    Returns:
        True when this call built it.

    Raises:
        FileExistsError: `path` exists but holds no model.
    """
    import contextlib
    import fcntl
    import os
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(path)
    if (path / "config.json").is_file():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") if lock else contextlib.nullcontext() as held:
        if held is not None:
            fcntl.flock(held, fcntl.LOCK_EX)
            if (path / "config.json").is_file():  # built by the process that held the lock before us
                return False
        if path.exists() and not (path / "config.json").is_file():
            raise FileExistsError(f"{path} exists but holds no model (config.json); remove it or choose another")
        staging = tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            build(staging)
            os.rename(staging, path)  # fails if another process put a model (or anything) there first
        except OSError:
            if not (path / "config.json").is_file():
                raise
            return False
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return True


def save_tiny_model(path, tokenizer=None, **model_kwargs) -> str:
    """Build a char tokenizer + tiny Qwen3 and save both to `path` (a directory `from_pretrained` can load)."""
    tokenizer = tokenizer or build_char_tokenizer()
    model = build_tiny_qwen3(tokenizer, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
