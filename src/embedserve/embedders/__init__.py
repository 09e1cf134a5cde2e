"""Vector sources: one protocol (`VectorSource`, embedders/base.py) for everything that turns inputs
into vectors, one spec grammar (embedders/spec.py, docs/specs.md) shared by parity, bench and index,
and `open_source`, the one place that knows every kind of source. Rerank scorers: embedders/scorers.py.

    engine:PATH?opts          EngineSource       our engine in process (embedders/engine.py)
    http(s)://HOST:PORT?opts  HttpSource         any OpenAI-compatible endpoint (embedders/http_source.py)
    sentence-transformers:PATH SentenceTransformersSource (embedders/sentence_transformers.py)
    hf:PATH                   TransformersSource transformers, pooling written out (embedders/transformers.py)
    either reference on a Qwen3-VL directory: VLReferenceSource (embedders/vl.py)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing the grammar (embedders.spec) loads no torch: the sources load it
    from embedserve.embedders.base import VectorSource
    from embedserve.embedders.spec import Spec

__all__ = ["open_source"]


def open_source(spec: Spec, **engine_overrides: Any) -> VectorSource:
    """The source a spec names; `engine_overrides`: engine options the tool sets itself."""
    from embedserve.embedders.modeldir import is_vl_dir

    if spec.kind == "http":
        from embedserve.embedders.http_source import HttpSource

        return HttpSource(spec)
    if spec.kind == "engine":
        from embedserve.embedders.engine import EngineSource

        return EngineSource.open(spec, **engine_overrides)
    if is_vl_dir(Path(spec.location)):
        from embedserve.embedders.vl import VLReferenceSource

        return VLReferenceSource(spec)
    if spec.kind == "sentence-transformers":
        from embedserve.embedders.sentence_transformers import SentenceTransformersSource

        return SentenceTransformersSource(spec)
    from embedserve.embedders.transformers import TransformersSource

    return TransformersSource(spec)
