"""The in-process engine as a benchmark target: one Engine per token budget (image-mix inputs as parts)."""

from __future__ import annotations

from typing import Any

from embedserve.bench.images import engine_parts
from embedserve.bench.target import BenchInput, Reply, TargetSpec
from embedserve.engine.engine import Engine


class EngineSession:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.device = engine.config.device.type

    async def embed(self, text: BenchInput, priority: str) -> Reply:
        out = (await self.engine.embed_outputs_async([engine_parts(text)], priority=priority))[0]
        return Reply(out.embedding, out.queue_time)

    def counters(self) -> dict[str, int]:
        return {"preemptions": self.engine.stats().get("preemptions", 0)}

    async def aclose(self) -> None:
        self.engine.close()


def open_engine(spec: TargetSpec, token_budget: int | None) -> EngineSession:
    if token_budget is None:
        raise ValueError("an engine target needs a token budget")
    # parse_target admits only Engine.from_pretrained options for an engine target
    kwargs: dict[str, Any] = spec.typed_options()
    return EngineSession(Engine.from_pretrained(spec.location, max_num_batched_tokens=token_budget, **kwargs))
