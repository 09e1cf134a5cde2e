"""`layer_types` of models that mix sliding-window and full attention layers (Gemma 3, ModernBERT):
the list config.json gives, or the older every-Nth-layer-is-full pattern, as per-layer windows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from embedserve.errors import ModelLoadError

SLIDING, FULL = "sliding_attention", "full_attention"


def layer_windows(
    raw: dict[str, Any], layers: int, band: int, full_at: Callable[[int], bool], family: str
) -> tuple[int, ...]:
    """Per layer: `band` for a sliding layer, 0 for a full one. Without `layer_types`, layer i
    is full where `full_at(i)` (the model's own default pattern)."""
    types = raw.get("layer_types")
    if types is None:
        types = [FULL if full_at(i) else SLIDING for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in (SLIDING, FULL) for t in types):
        raise ModelLoadError(
            f"{family} layer_types must name {layers} layers, each {SLIDING!r} or {FULL!r}: {types!r}"
        )
    if band < 1 and SLIDING in types:
        raise ModelLoadError(f"a {family} config with {SLIDING} layers needs a window")
    return tuple(band if t == SLIDING else 0 for t in types)
