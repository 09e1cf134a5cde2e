"""The in-process engine as a benchmark target: the shared engine source (embedders/engine.py), one
per token budget, driven one input at a time (image-mix inputs as parts)."""

from __future__ import annotations

from embedserve.bench.images import engine_parts
from embedserve.bench.target import BenchInput, Reply, TargetSpec
from embedserve.embedders.engine import EngineSource
from embedserve.engine.ask import Ask, answers_as
from embedserve.engine.outputs import EmbeddingOutput


class EngineSession:
    def __init__(self, source: EngineSource) -> None:
        self.source = source
        self.engine = source.engine
        self.device = self.engine.config.device.type

    async def embed(self, text: BenchInput, priority: str) -> Reply:
        answers = await self.engine.run_async([engine_parts(text)], Ask(priority=priority))
        (out,) = answers_as(answers, EmbeddingOutput)
        return Reply(out.embedding, out.queue_time)

    def counters(self) -> dict[str, int]:
        return {"preemptions": self.engine.stats().get("preemptions", 0)}

    async def aclose(self) -> None:
        self.source.close()


def open_engine(spec: TargetSpec, token_budget: int | None) -> EngineSession:
    if token_budget is None:
        raise ValueError("an engine target needs a token budget")
    # bench's --token-budget axis sets the token budget (a spec's max_num_batched_tokens is refused)
    return EngineSession(EngineSource.open(spec, max_num_batched_tokens=token_budget))
