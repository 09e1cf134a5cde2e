"""Open any supported model format: its config, pooling, prompts and tokenizer, without weights
(read later by models/build.py). No torch is imported here: the gateway counts tokens with this."""

from __future__ import annotations

from pathlib import Path

from embedserve.models.gguf import read_gguf
from embedserve.models.loader import read_model_dir
from embedserve.models.source import ModelSource


def open_model(path: str | Path, pooling: str | None = None, normalize: bool | None = None) -> ModelSource:
    """A Hugging Face / sentence-transformers directory, or a single `.gguf` file."""
    p = Path(path)
    if p.suffix.lower() == ".gguf" or p.is_file():
        return read_gguf(p, pooling=pooling, normalize=normalize)
    return read_model_dir(p, pooling=pooling, normalize=normalize)
