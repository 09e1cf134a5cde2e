"""Open a target spec: the one place that knows every concrete target (engine, baselines, http)."""

from __future__ import annotations

from embedserve.bench.target import Session, TargetSpec


def open_target(spec: TargetSpec, token_budget: int | None) -> Session:
    # Imported lazily: the parent process only parses specs; workers load torch and friends.
    if spec.kind == "engine":
        from embedserve.bench.engine_target import open_engine

        return open_engine(spec, token_budget)
    if spec.kind == "sentence-transformers":
        from embedserve.bench.baselines import open_sentence_transformers

        return open_sentence_transformers(spec, token_budget)
    if spec.kind == "hf":
        from embedserve.bench.baselines import open_hf

        return open_hf(spec, token_budget)
    if spec.kind == "http":
        from embedserve.bench.http_target import open_http

        return open_http(spec, token_budget)
    raise AssertionError(f"parse_target admits no target kind {spec.kind!r}")
