"""Benchmark targets' contract: what `--target` names (TargetSpec, `parse_target`), the Session protocol
that sends it requests and the Reply it gets. `bench/targets.py` opens a spec.

    engine:PATH?dtype=bfloat16&max_num_seqs=64     in-process Engine, one per token budget
    sentence-transformers:PATH?dtype=...&batch_size=32   the library baseline behind a FIFO batcher
    hf:PATH?dtype=...&batch_size=32                 transformers AutoModel, padded batches, same pooling
    http://127.0.0.1:8000/v1?model=peer&pid=1234    any OpenAI-compatible /embeddings endpoint

Every target accepts `name=` (the label in reports). The token budget belongs to the engine
only; for the others it is an axis that does not apply (reported as n/a).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from embedserve.errors import InvalidInputError, ModelLoadError
from embedserve.models.default import resolve_model

_OPTIONS: dict[str, set[str]] = {
    "engine": {
        "dtype",
        "device",
        "max_num_seqs",
        "max_model_len",
        "kv_cache_memory",
        "block_size",
        "batch_tokens_with_online",
        "layer_major_tokens",
        "pooling",
    },
    "sentence-transformers": {"dtype", "device", "batch_size"},
    "hf": {"dtype", "device", "batch_size"},
    "http": {"model", "pid", "priority", "queue_header", "timeout"},
}
_INT_OPTIONS = {
    "max_num_seqs",
    "max_model_len",
    "kv_cache_memory",
    "block_size",
    "batch_tokens_with_online",
    "layer_major_tokens",
    "batch_size",
    "pid",
}


# One benchmark input: a text, or content parts [{"type": "text", ...}, {"type": "image_url", ...}]
# (the image mix, bench/images.py).
BenchInput = str | list[dict[str, Any]]


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


@dataclass(frozen=True)
class TargetSpec:
    raw: str
    kind: str  # engine | sentence-transformers | hf | http
    location: str  # model directory, or the URL without our options
    options: dict[str, str] = field(default_factory=dict)
    name: str = ""

    @property
    def has_budget_axis(self) -> bool:
        return self.kind == "engine"

    @property
    def model_dir(self) -> Path | None:
        return None if self.kind == "http" else Path(self.location)

    def int_option(self, key: str, default: int | None = None) -> int | None:
        return int(self.options[key]) if key in self.options else default

    def typed_options(self) -> dict[str, str | int]:
        """Every option given, integer ones as int (`parse_target` validated both)."""
        return {k: int(v) if k in _INT_OPTIONS else v for k, v in self.options.items()}


def parse_target(raw: str) -> TargetSpec:
    if raw.startswith(("http://", "https://")):
        kind = "http"
        parts = urlsplit(raw)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        ours = {k: v for k, v in query.items() if k in _OPTIONS["http"] or k == "name"}
        rest = {k: v for k, v in query.items() if k not in ours}
        location = urlunsplit(parts._replace(query=urlencode(rest)))
        shown = location
    else:
        kind, sep, rest_s = raw.partition(":")
        if not sep or kind not in _OPTIONS:
            raise InvalidInputError(
                f"target {raw!r}: expected engine:PATH, sentence-transformers:PATH, hf:PATH or http://..."
            )
        location, _, qs = rest_s.partition("?")
        ours = dict(parse_qsl(qs, keep_blank_values=True))
        if not location:
            raise InvalidInputError(f"target {raw!r}: no model directory given")
        shown = location
        try:  # the default model's name (all-MiniLM-L6-v2) stands for its installed copy
            location = resolve_model(location)
        except ModelLoadError as e:
            raise InvalidInputError(f"target {raw!r}: {e}") from None
        if not Path(location).is_dir():
            raise InvalidInputError(f"target {raw!r}: {location} is not a directory")
    name = ours.pop("name", "") or _default_name(kind, shown, ours)
    unknown = set(ours) - _OPTIONS[kind]
    if unknown:
        raise InvalidInputError(
            f"target {raw!r}: unknown option(s) {', '.join(sorted(unknown))}; "
            f"{kind} accepts {', '.join(sorted(_OPTIONS[kind] | {'name'}))}"
        )
    for key in _INT_OPTIONS & set(ours):
        if not ours[key].isdigit():
            raise InvalidInputError(f"target {raw!r}: option {key} must be a positive integer")
    return TargetSpec(raw=raw, kind=kind, location=location, options=ours, name=name)


def _default_name(kind: str, location: str, options: dict[str, str]) -> str:
    short = {"engine": "engine", "sentence-transformers": "st", "hf": "hf", "http": "http"}[kind]
    where = location if kind == "http" else Path(location).name
    label = f"{short}:{where}"
    return f"{label}:{options['dtype']}" if "dtype" in options else label
