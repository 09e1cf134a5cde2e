"""Build the embedder an EmbedderSpec names: the one place that knows every kind of embedder."""

from __future__ import annotations

from embedserve.index.embedder import Embedder, EmbedderSpec, load_tokenizer


def build_embedder(spec: EmbedderSpec) -> Embedder:
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


def _float_embedder(spec: EmbedderSpec) -> Embedder:
    if spec.endpoint is not None:
        from embedserve.index.http_embedder import HttpEmbedder

        return HttpEmbedder(
            spec.endpoint,
            api_key=spec.api_key,
            model=spec.endpoint_model,
            dimensions=spec.dimensions,
            tokenizer=load_tokenizer(spec.tokenizer) if spec.tokenizer else None,
            query_prompt_name=spec.query_prompt_name,
        )
    if spec.model is None:
        raise ValueError("an embedder needs a model or an endpoint")
    from embedserve.index.engine_embedder import EngineEmbedder

    return EngineEmbedder.load(
        spec.model,
        spec.engine_kwargs or {},
        spec.name,
        spec.model_version,
        spec.dimensions,
        spec.query_prompt_name,
    )
