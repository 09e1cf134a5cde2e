"""Open a target spec: engine (one per token budget), the library baselines, http peers."""

from __future__ import annotations

from embedserve.bench.target import Session, TargetSpec


def open_target(spec: TargetSpec, token_budget: int | None) -> Session:
    # Imported lazily: the parent process only parses specs; workers load torch and friends.
    if spec.kind == "engine":
        from embedserve.bench.engine_target import open_engine

        return open_engine(spec, token_budget)
    if spec.kind == "http":
        from embedserve.bench.http_target import open_http

        return open_http(spec, token_budget)
    from embedserve.bench.baselines import open_reference

    return open_reference(spec, token_budget)
