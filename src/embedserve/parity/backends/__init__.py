"""Parity's sides are vector sources (embedders/): a spec in the shared grammar (docs/specs.md),
read with parity's keys, opens one. `hf:` is transformers with explicit pooling and
`sentence-transformers:` sentence-transformers (on a Qwen3-VL directory both are transformers'
Qwen3VLModel); `engine:PATH?opts`; `http(s)://HOST:PORT?opts`."""

from __future__ import annotations

from embedserve.embedders import open_source
from embedserve.embedders.base import VectorSource
from embedserve.embedders.spec import parse_spec

Backend = VectorSource

__all__ = ["Backend", "open_backend"]


def open_backend(spec: str) -> Backend:
    return open_source(parse_spec(spec, "parity"))
