"""Build the embedder an EmbedderSpec names: the one place that knows every kind of embedder; what an
`--embedder` spec of the shared grammar names (`source_fields`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from embedserve.embedders.spec import accepted
from embedserve.engine.options import EngineOptions
from embedserve.index.embedder import Embedder, EmbedderSpec, load_tokenizer
from embedserve.index.errors import StoreError
from embedserve.pooling.outputs import Output, multivectors_only


def build_embedder(spec: EmbedderSpec) -> Embedder:
    if spec.multivector:
        return _multivector_embedder(spec)
    if spec.sparse or spec.sparse_model is not None:
        return _sparse_embedder(spec)
    inner = _float_embedder(spec)
    if spec.embedding_type == "float":
        return inner
    from embedserve.api.quantize import Calibration
    from embedserve.index.quantized import QuantizingEmbedder

    try:
        cal = (
            Calibration.load(spec.int8_calibration)
            if spec.int8_calibration
            else Calibration.fixed(spec.int8_scale)
        )
        return QuantizingEmbedder(inner, spec.embedding_type, cal)
    except BaseException:
        inner.close()
        raise


def _multivector_embedder(spec: EmbedderSpec) -> Embedder:
    """--multivector: a multi-vector model in this process (token rows, MaxSim)."""
    from embedserve.index.multivector import MultiVectorEmbedder

    others = {
        "--endpoint": spec.endpoint is not None, "--embedding-type": spec.embedding_type != "float",
        "--late-chunking": spec.late_chunking, "--sparse": spec.sparse or spec.sparse_model is not None,
    }  # fmt: skip
    given = [flag for flag, on in others.items() if on]
    if given:
        raise StoreError(
            f"--multivector stores a --model's float token vectors: {', '.join(given)} does not apply"
        )
    if spec.model is None:
        raise ValueError("an embedder needs a model or an endpoint")
    return MultiVectorEmbedder.load(  # type: ignore[return-value]  # its vectors are lists of rows
        spec.model, spec.engine, spec.name, spec.model_version, spec.dimensions
    )


def _sparse_embedder(spec: EmbedderSpec) -> Embedder:
    """--sparse (the model is a SPLADE model) or a hybrid index (--sparse-model beside it)."""
    from embedserve.index.engine_embedder import EngineEmbedder
    from embedserve.index.sparse import HybridEmbedder, SparseEmbedder

    if spec.embedding_type != "float":
        raise StoreError("--sparse and --sparse-model store float weights: --embedding-type does not apply")
    if spec.sparse and spec.sparse_model is not None:
        raise StoreError("pass --sparse (a SPLADE --model) or --sparse-model (beside a dense one), not both")
    if spec.sparse_model is None:
        inner = _dense_or_splade(spec, sparse=True)
        try:
            return SparseEmbedder(inner)  # type: ignore[return-value]  # its vectors are sparse rows
        except BaseException:
            inner.close()
            raise
    if spec.sparse_model == spec.model and spec.endpoint is None:  # one model giving both (BGE-M3)
        dense = _float_embedder(spec)
        try:
            return HybridEmbedder(dense, SparseEmbedder(dense, owns=False))
        except BaseException:
            dense.close()
            raise
    if is_url(spec.sparse_model):  # a server of the SPLADE model (or the dense endpoint's BGE-M3)
        # another server: the dense side's model name, dimensions and query prompt are not its own
        url_spec = (
            spec
            if spec.sparse_model == spec.endpoint
            else replace(
                spec, endpoint=spec.sparse_model, endpoint_model=None, dimensions=None, query_prompt_name=None
            )
        )
        sparse: Embedder = _dense_or_splade(url_spec, sparse=True)
    else:
        sparse = EngineEmbedder.load(spec.sparse_model, spec.engine)
    try:
        dense = _float_embedder(spec)
    except BaseException:
        sparse.close()
        raise
    try:
        return HybridEmbedder(dense, SparseEmbedder(sparse))
    except BaseException:
        dense.close()
        sparse.close()
        raise


def _float_embedder(spec: EmbedderSpec) -> Embedder:
    """The dense embedder a spec names."""
    inner = _dense_or_splade(spec)
    engine = getattr(inner, "engine", None)
    if engine is not None and Output.SPARSE in engine.outputs:
        inner.close()
        raise StoreError(
            f"{spec.model} is a SPLADE model: its vectors go in a sparse index (--sparse), or beside a "
            "dense model's (--hybrid --sparse-model)"
        )
    if engine is not None and multivectors_only(engine.outputs):
        inner.close()
        raise StoreError(
            f"{spec.model} is a multi-vector (ColBERT) model: index and search it with --multivector"
        )
    return inner


def _dense_or_splade(spec: EmbedderSpec, sparse: bool = False) -> Embedder:
    """The model or endpoint a spec names (`sparse`: an endpoint asked for sparse vectors; a
    SPLADE model in this process gives them as it is)."""
    if spec.endpoint is not None:
        from embedserve.index.http_embedder import HttpEmbedder

        return HttpEmbedder(
            spec.endpoint,
            api_key=spec.api_key,
            model=spec.endpoint_model,
            dimensions=spec.dimensions,
            tokenizer=load_tokenizer(spec.tokenizer) if spec.tokenizer else None,
            query_prompt_name=spec.query_prompt_name,
            late=spec.late_chunking,
            sparse=sparse,
        )
    if spec.model is None:
        raise ValueError("an embedder needs a model or an endpoint")
    from embedserve.index.engine_embedder import EngineEmbedder

    return EngineEmbedder.load(
        spec.model,
        spec.engine,
        spec.name,
        spec.model_version,
        spec.dimensions,
        spec.query_prompt_name,
        spec.late_chunking,
    )


def is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def source_fields(text: str, engine: EngineOptions) -> dict[str, Any]:
    """The EmbedderSpec fields an `--embedder` spec (docs/specs.md, read as "index") names: an
    engine (its options on top of `engine`, the command line's) or an embedserve endpoint."""
    from embedserve.embedders.http import Endpoint
    from embedserve.embedders.spec import parse_spec

    source = parse_spec(text, "index")
    if source.kind == "engine":
        return {"model": source.location, "engine": engine.replace(**source.typed_options())}
    if source.kind != "http":
        raise StoreError(
            f"--embedder {text}: index stores vectors with the metadata an engine or an embedserve endpoint "
            "reports (model_version, embedding_schema): use engine: or http://"
        )
    if source.extra:
        raise StoreError(
            f"--embedder {text}: index sets its requests' fields itself; unknown option(s) "
            f"{', '.join(source.extra)}; accepted: {', '.join(accepted('index', 'http'))}"
        )
    endpoint = Endpoint(source)
    return {
        "endpoint": endpoint.base,
        "api_key": endpoint.api_key,
        "endpoint_model": endpoint.model,
        "tokenizer": source.option("tokenizer"),
    }
