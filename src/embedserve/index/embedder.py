"""Embedders: the in-process Engine, or any embedserve endpoint (server or gateway).

Both report the vector metadata every stored vector carries (model, model_version, dtype,
backend_profile, embedding_schema). The in-process embedder computes it with the server's own
function, so a vector indexed in-process and a query embedded by `embedserve serve` over the
same model files share a schema, and any difference in the vector space does not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from embedserve.tokenizer import Tokenizer

if TYPE_CHECKING:  # torch loads only when a model runs here, not for endpoints or the store
    from embedserve.engine.engine import Engine

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

    def close(self) -> None: ...


def pick_prompt(known: list[str] | dict[str, str], wanted: str, override: str | None) -> str | None:
    """The prompt name to send: an explicit choice, else `wanted` when the model defines it,
    else None (the model's default prompt, if any)."""
    if override is not None:
        return override
    return wanted if wanted in known else None


class EngineEmbedder:
    """The engine in this process; documents go in as batch-class traffic."""

    def __init__(
        self,
        engine: Engine,
        name: str,
        model_version: str | None = None,
        dimensions: int | None = None,
        query_prompt_name: str | None = None,
    ) -> None:
        engine.check_dimensions(dimensions)
        self.engine = engine
        from embedserve.schema import ModelMetadata, fingerprint_model_dir

        metadata = ModelMetadata.from_engine_config(
            engine.config, name, model_version, fingerprint_model_dir(engine.config.model_path)
        )
        self.meta = VectorMeta(**metadata.fields(dimensions))
        self.dimension = dimensions or engine.config.model.hidden_size
        self.dimensions = dimensions
        self.tokenizer: Tokenizer | None = engine.tokenizer
        self.max_tokens: int | None = engine.config.scheduler.max_model_len
        prompts = engine.config.prompts
        self._docs = Traffic.documents(pick_prompt(prompts, DOCUMENT_PROMPT, None))
        self._queries = Traffic.queries(pick_prompt(prompts, QUERY_PROMPT, query_prompt_name))
        # The engine validates a prompt name only when it embeds: fail now, not mid-run.
        engine.resolve_prompt(self._queries.prompt_name, None)

    @classmethod
    def load(
        cls,
        model: str | Path,
        engine_kwargs: dict[str, Any],
        name: str | None = None,
        model_version: str | None = None,
        dimensions: int | None = None,
        query_prompt_name: str | None = None,
    ) -> EngineEmbedder:
        from embedserve.engine.engine import Engine

        engine = Engine.from_pretrained(model, **engine_kwargs)
        try:
            return cls(engine, name or Path(model).name, model_version, dimensions, query_prompt_name)
        except BaseException:
            engine.close()
            raise

    def _embed(self, texts: list[str], traffic: Traffic) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return self.engine.embed(
            texts,
            prompt_name=traffic.prompt_name,
            dimensions=self.dimensions,
            priority=traffic.priority,
            truncate=traffic.truncate,
        )

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self._docs)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self._queries)

    def close(self) -> None:
        self.engine.close()


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
    """How to build an embedder: picklable, so Ray actors can build their own."""

    model: str | None = None
    engine_kwargs: dict[str, Any] | None = None
    name: str | None = None
    model_version: str | None = None
    endpoint: str | None = None
    api_key: str | None = None
    endpoint_model: str | None = None
    tokenizer: str | None = None  # for chunking with an endpoint
    dimensions: int | None = None
    query_prompt_name: str | None = None

    def build(self) -> Embedder:
        if self.endpoint is not None:
            from embedserve.index.http_embedder import HttpEmbedder

            return HttpEmbedder(
                self.endpoint,
                api_key=self.api_key,
                model=self.endpoint_model,
                dimensions=self.dimensions,
                tokenizer=load_tokenizer(self.tokenizer) if self.tokenizer else None,
                query_prompt_name=self.query_prompt_name,
            )
        if self.model is None:
            raise ValueError("an embedder needs a model or an endpoint")
        return EngineEmbedder.load(
            self.model,
            self.engine_kwargs or {},
            self.name,
            self.model_version,
            self.dimensions,
            self.query_prompt_name,
        )
