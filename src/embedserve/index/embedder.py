"""The embedder contract: the Embedder protocol, the vector metadata it reports, how it sends
each kind of input, and the EmbedderSpec that `index/embedders.py` builds one from.

Every embedder (in-process engine, `index/engine_embedder.py`; an embedserve server or gateway,
`index/http_embedder.py`) reports the metadata every stored vector carries (model,
model_version, dtype, backend_profile, embedding_schema).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from embedserve.engine.options import EngineOptions
from embedserve.tokenizer import Tokenizer

DOCUMENT_PROMPT, QUERY_PROMPT = "document", "query"


@dataclass(frozen=True)
class Traffic:
    """How one kind of input is sent. Documents are batch-class and never truncated (chunks
    are cut to fit, so a too-long chunk is a bug to surface); queries are online-class and
    cut at the end when longer than the model's limit (their start still says what is asked)."""

    prompt_name: str | None
    priority: str
    truncate: str

    @classmethod
    def documents(cls, prompt_name: str | None) -> Traffic:
        return cls(prompt_name, "batch", "error")

    @classmethod
    def queries(cls, prompt_name: str | None) -> Traffic:
        return cls(prompt_name, "online", "end")


@dataclass(frozen=True)
class VectorMeta:
    model: str
    model_version: str
    dtype: str
    backend_profile: str
    embedding_schema: str

    def fields(self) -> dict[str, str]:
        return asdict(self)


class Embedder(Protocol):
    meta: VectorMeta
    dimension: int
    # The model's tokenizer (chunks are measured in it) and input limit, when known.
    tokenizer: Tokenizer | None
    max_tokens: int | None

    def embed_documents(self, texts: list[str]) -> np.ndarray: ...  # float32 [n, dimension]

    def embed_queries(self, texts: list[str]) -> np.ndarray: ...

    # Late chunking (`index --late-chunking`): `meta` is the late-chunked vectors' schema and
    # `embed_late_documents` answers [chunks, dimension] per (text, chunk spans) window; a
    # window holds the document prompt's `late_prompt_tokens` too (0 where unknown).
    late: bool
    late_prompt_tokens: int

    def embed_late_documents(self, windows: list[tuple[str, list[tuple[int, int]]]]) -> list[np.ndarray]: ...

    def close(self) -> None: ...


def pick_prompt(known: list[str] | dict[str, str], wanted: str, override: str | None) -> str | None:
    """The prompt name to send: an explicit choice, else `wanted` when the model defines it,
    else None (the model's default prompt, if any)."""
    if override is not None:
        return override
    return wanted if wanted in known else None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A model directory's tokenizer.json (or that file itself), for chunking without an engine."""
    from tokenizers import Tokenizer as HFTokenizer

    from embedserve.errors import ModelLoadError

    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise ModelLoadError(f"no tokenizer.json at {p}: pass the model directory or its tokenizer.json")
    backend = HFTokenizer.from_file(str(file))
    return Tokenizer(backend, backend.get_vocab_size(with_added_tokens=True))


@dataclass(frozen=True)
class EmbedderSpec:
    """How to build an embedder (`embedders.build_embedder`): picklable, so Ray actors can build their own."""

    model: str | None = None
    engine: EngineOptions = field(default_factory=EngineOptions)
    name: str | None = None
    model_version: str | None = None
    endpoint: str | None = None
    api_key: str | None = None
    endpoint_model: str | None = None
    tokenizer: str | None = None  # for chunking with an endpoint
    dimensions: int | None = None
    query_prompt_name: str | None = None
    # Compressed vectors (index/quantized.py): the type and int8 / uint8 calibration.
    embedding_type: str = "float"
    int8_calibration: str | None = None
    int8_scale: float = 1.0
    late_chunking: bool = False  # documents' chunks pooled inside their windows (index/late.py)
    sparse: bool = False  # the model is a SPLADE model: a sparse index (index/sparse.py)
    sparse_model: str | None = None  # a SPLADE model beside the dense one: a hybrid index
    multivector: bool = False  # a multi-vector model's token vectors, MaxSim (index/multivector.py)
