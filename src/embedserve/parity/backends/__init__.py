"""Backends: `hf:PATH` / `sentence-transformers:PATH` (on a Qwen3-VL directory: transformers'
Qwen3VLModel), `engine:PATH?opts`, `http(s)://HOST:PORT?opts`."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

from embedserve.errors import ModelLoadError
from embedserve.models.default import resolve_model
from embedserve.parity.backends.base import Backend
from embedserve.parity.backends.modeldir import is_vl_dir
from embedserve.parity.options import Options, ParityError, split_spec

__all__ = ["Backend", "open_backend"]


def open_backend(spec: str) -> Backend:
    head, raw = split_spec(spec)
    opts = Options(head.split(":", 1)[0] if "://" not in head else head, raw)
    if head.startswith(("http://", "https://")):
        from embedserve.parity.backends.http import HttpBackend

        public = {k: v for k, v in raw.items() if k != "api_key"}  # reports never hold secrets
        return HttpBackend(head + ("?" + urlencode(public, safe="/:") if public else ""), head, opts)
    kind, sep, path = head.partition(":")
    if not sep or not path:
        raise ParityError(
            f"backend {spec!r}: expected hf:PATH, sentence-transformers:PATH, engine:PATH or http://HOST:PORT"
        )
    try:  # the default model's name (all-MiniLM-L6-v2) stands for its installed copy
        path = resolve_model(path)
    except ModelLoadError as e:
        raise ParityError(f"backend {spec!r}: {e}") from None
    if kind in ("hf", "sentence-transformers", "st"):
        if is_vl_dir(Path(path)):
            from embedserve.parity.backends.vl_reference import VLReferenceBackend

            # sentence-transformers has no Qwen3-VL pipeline: transformers'
            return VLReferenceBackend(spec, path, opts)
        from embedserve.parity.backends.reference import ReferenceBackend

        return ReferenceBackend(spec, path, opts)
    if kind == "engine":
        from embedserve.parity.backends.engine import EngineBackend

        return EngineBackend(spec, path, opts)
    raise ParityError(f"backend {spec!r}: unknown kind {kind!r}; use hf, sentence-transformers, engine, http")
