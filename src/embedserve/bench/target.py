"""Benchmark targets' contract: what `--target` names (a spec of the shared grammar, embedders/spec.py,
docs/specs.md, read with bench's keys: `parse_target`), the Session protocol that sends it requests and
the Reply it gets. `bench/targets.py` opens a spec.

    engine:PATH?dtype=bfloat16&deterministic=1  in-process Engine (any engine option), one per token budget
    sentence-transformers:PATH?dtype=...&batch_size=32   the library baseline behind a FIFO batcher
    hf:PATH?dtype=...&batch_size=32                 transformers AutoModel, padded batches, the
                                                    directory's pooling written out
    http://127.0.0.1:8000/v1?model=peer&pid=1234    any OpenAI-compatible /embeddings endpoint (vLLM,
                                                    infinity, llama.cpp, embedserve)

Every target accepts `name=` (the label in reports). The token budget belongs to the engine
only; for the others it is an axis that does not apply (reported as n/a).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from embedserve.embedders.spec import Spec, parse_spec

# One benchmark input: a text, or content parts [{"type": "text", ...}, {"type": "image_url", ...}]
# (the image mix, bench/images.py).
BenchInput = str | list[dict[str, Any]]

TargetSpec = Spec


@dataclass(frozen=True)
class Reply:
    vector: np.ndarray  # float32 [dim]
    queue_s: float | None  # time before the first compute step, when the target says


class Session(Protocol):
    """An opened target. `embed` sends one input; it raises on any failure."""

    device: str  # "cpu" / "cuda" / "remote": decides how peak memory is measured

    async def embed(self, text: BenchInput, priority: str) -> Reply: ...

    def counters(self) -> dict[str, int]: ...

    async def aclose(self) -> None: ...


def parse_target(raw: str) -> TargetSpec:
    """A target spec; a bad one raises SpecError (an InvalidInputError) naming the accepted keys."""
    return parse_spec(raw, "bench")
